//! Hostile input to QP 1, end to end: crafted RoCEv2 packets sent from a plain UDP socket to
//! a softrdma device's port 4791 — malformed packets, MADs that are not CM messages, CM
//! messages for communications that do not exist, a REQ flood, REQs with a garbage rdma_cm
//! header — are each dropped (or answered as the CM documents) and counted, raise no event in
//! the application, and leave the device able to set up a real rdma_cm connection.
//!
//! Nothing here asserts on time: "nothing happened" is shown by a probe (a SIDR_REQ for a
//! service nobody listens on, which the CM answers at once) sent after the hostile packets
//! from the same socket. The device handles one sender's datagrams in order and dispatches
//! the CM events of each before it reads the next, so when the probe's answer arrives every
//! earlier packet has been handled, counted, and had its events (if any) queued.
//!
//! Each test takes loopback addresses of its own (see `softrdma::testing`): a device under
//! attack, the attacker's socket (bound to port 4791, where the device sends its answers) and
//! a client device for the final connection.

use softrdma::rdma_cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::*;
use softrdma_wire::cm::{
    DrepRepr, DreqRepr, Message, MessageMraed, MessageRejected, MraPacket, MraRepr, RejPacket,
    RejRepr, RejectReason, RepRepr, ReqPath, ReqRepr, RtuRepr, SidrRepPacket, SidrRepRepr,
    SidrReqRepr, SidrStatus, TransportServiceType,
};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};
use softrdma_wire::icrc::IcrcPrefix;
use softrdma_wire::opcode::{ExtHeader, Opcode};
use softrdma_wire::{bth, deth, immdt, mad, roce};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text: a device address of the test's own.
fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

const ROCE_PORT: u16 = 4791;
/// The attacker's CA GUID in the REQs it sends.
const ATTACKER_GUID: u64 = 0x0bad_0bad_0bad_0bad;
/// A service ID nobody listens on: the probe's SIDR_REQ asks for it.
const PROBE_SERVICE_ID: u64 = 0x1234_5678_9abc_def0;

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn setsockopt(fd: i32, level: i32, name: i32, v: i32) {
    // SAFETY: a valid socket and a pointer to an int of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt {level}/{name}");
}

/// A tiny deterministic generator for "random" IDs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn id(&mut self) -> u32 {
        (self.next() as u32).max(1)
    }
}

/// A plain UDP socket speaking (or mangling) RoCEv2 to one device's QP 1.
struct Attacker {
    sock: UdpSocket,
    me: Ipv4Addr,
    dev: Ipv4Addr,
    /// ICRC flow attacker → device (IPv4 identification 0 and DF, as the engine assumes).
    to_dev: IcrcPrefix,
    /// ICRC flow device → attacker.
    from_dev: IcrcPrefix,
    psn: u32,
    tid: u64,
    probes: u32,
}

impl Attacker {
    fn new(me: &str, dev: &str) -> Attacker {
        let (me, dev) = (ip4(me), ip4(dev));
        // Port 4791: where a RoCEv2 device sends its answers.
        let sock = UdpSocket::bind((me, ROCE_PORT)).unwrap();
        let fd = sock.as_raw_fd();
        // As the engine's sockets: DF and IP identification 0 on every datagram.
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
        // Room for the device's answers to a burst (REJs of a flood).
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Attacker {
            sock,
            me,
            dev,
            to_dev: IcrcPrefix::ipv4(me, dev, ROCE_PORT, ROCE_PORT),
            from_dev: IcrcPrefix::ipv4(dev, me, ROCE_PORT, ROCE_PORT),
            psn: 0x10,
            tid: 0x0bad_0000_0000_0000,
            probes: 0,
        }
    }

    fn next_tid(&mut self) -> u64 {
        self.tid += 1;
        self.tid
    }

    /// A transport packet to `dest_qp` with a correct ICRC.
    fn packet(
        &mut self,
        opcode: Opcode,
        dest_qp: u32,
        deth: Option<deth::Repr>,
        payload: &[u8],
    ) -> Vec<u8> {
        let info = opcode.lookup().unwrap();
        let repr = roce::Repr {
            bth: bth::Repr {
                opcode,
                solicited_event: false,
                mig_req: false,
                pad_count: 0,
                pkey: bth::DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp,
                ack_req: false,
                psn: self.psn,
            },
            deth,
            immdt: info
                .has_header(ExtHeader::ImmDt)
                .then_some(immdt::Repr { imm_data: 7 }),
            payload_len: payload.len(),
            ..Default::default()
        };
        self.psn = (self.psn + 1) & 0xff_ffff;
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut roce::Packet::new_unchecked(&mut buf[..]), payload)
            .unwrap();
        self.seal(&mut buf);
        buf
    }

    /// (Re)computes the ICRC of a packet built or modified by hand.
    fn seal(&self, pkt: &mut [u8]) {
        self.to_dev
            .fill(&mut roce::Packet::new_unchecked(pkt))
            .unwrap();
    }

    /// A MAD as the GSI expects it: a UD SEND_ONLY from QP 1 to QP 1 with the GSI Q_Key.
    fn mad_packet(&mut self, mad: &[u8]) -> Vec<u8> {
        let d = deth::Repr {
            qkey: mad::GSI_QKEY,
            src_qp: mad::GSI_QPN,
        };
        self.packet(Opcode::UD_SEND_ONLY, mad::GSI_QPN, Some(d), mad)
    }

    fn send(&self, pkt: &[u8]) {
        let n = self.sock.send_to(pkt, (self.dev, ROCE_PORT)).unwrap();
        assert_eq!(n, pkt.len());
    }

    fn send_mad(&mut self, mad: &[u8]) {
        let p = self.mad_packet(mad);
        self.send(&p);
    }

    fn mad_of(tid: u64, msg: &Message) -> [u8; mad::MAD_SIZE] {
        let mut m = [0u8; mad::MAD_SIZE];
        msg.emit_mad(tid, &mut m).unwrap();
        m
    }

    fn send_msg(&mut self, tid: u64, msg: &Message) {
        self.send_mad(&Self::mad_of(tid, msg));
    }

    /// The next MAD the device sends us (checked: ICRC, a UD SEND from QP 1 to QP 1 with the
    /// GSI Q_Key), as TID and message. Panics after 30 s without one.
    fn recv(&self) -> (u64, Message) {
        let mut buf = [0u8; 4096];
        let (n, from) = self
            .sock
            .recv_from(&mut buf)
            .expect("an answer from the device within 30 s");
        assert_eq!(from, SocketAddr::from((self.dev, ROCE_PORT)));
        let p = roce::Packet::new_checked(&buf[..n]).unwrap();
        assert_eq!(
            self.from_dev.compute(p.icrc_covered()).unwrap(),
            p.icrc(),
            "ICRC of the device's answer"
        );
        let r = roce::Repr::parse(&p).unwrap();
        assert_eq!((r.bth.opcode, r.bth.dest_qp), (Opcode::UD_SEND_ONLY, 1));
        assert_eq!(r.deth.map(|d| (d.qkey, d.src_qp)), Some((mad::GSI_QKEY, 1)));
        let m = mad::Packet::new_checked(p.payload()).unwrap();
        (m.transaction_id(), Message::parse(&m).unwrap())
    }

    /// A synchronous round trip (see the module docs): a SIDR_REQ for a service nobody
    /// listens on, answered with SIDR_REP status 1. Returns the other MADs received before
    /// the answer, in order.
    fn probe(&mut self) -> Vec<(u64, Message)> {
        self.probes += 1;
        let id = 0x7000_0000 | self.probes;
        let tid = self.next_tid();
        self.send_msg(
            tid,
            &Message::SidrReq(SidrReqRepr {
                request_id: id,
                partition_key: 0xffff,
                service_id: PROBE_SERVICE_ID,
                private_data: [0; 216],
            }),
        );
        let mut other = Vec::new();
        loop {
            match self.recv() {
                (t, Message::SidrRep(r)) if r.request_id == id => {
                    assert_eq!((t, r.status), (tid, SidrStatus::Unsupported));
                    return other;
                }
                m => other.push(m),
            }
        }
    }

    /// rdma_cm private data: a valid `cma_hdr` from us (port `src_port`) to the device.
    fn cma_private_data(&self, src_port: u16) -> [u8; 92] {
        let mut pd = [0u8; 92];
        CmaHeaderRepr::new(IpAddr::V4(self.me), src_port, IpAddr::V4(self.dev))
            .emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
        pd
    }

    /// rdma_cm private-data headers the device's rdma_cm cannot take: cma_version 1, IP
    /// version 5, all zero, and a valid one naming another destination address.
    fn garbage_cma_headers(&self) -> [[u8; 92]; 4] {
        let good = self.cma_private_data(5555);
        let mut bad_version = good;
        CmaHeader::new_unchecked(&mut bad_version[..]).set_cma_version(1);
        let mut bad_ip = good;
        CmaHeader::new_unchecked(&mut bad_ip[..]).set_ip_version(5);
        let mut other_dst = [0u8; 92];
        let elsewhere = Ipv4Addr::from(u32::from(self.dev) ^ 0xff);
        CmaHeaderRepr::new(IpAddr::V4(self.me), 5555, IpAddr::V4(elsewhere))
            .emit(&mut CmaHeader::new_unchecked(&mut other_dst[..]));
        [bad_version, bad_ip, [0u8; 92], other_dst]
    }

    /// A REQ as rdma_cm sends it over RoCE, from QP `qpn` of communication `comm_id`.
    fn req(&self, comm_id: u32, qpn: u32, service_id: u64, private_data: [u8; 92]) -> Message {
        Message::Req(ReqRepr {
            local_comm_id: comm_id,
            vendor_id: 0,
            service_id,
            local_ca_guid: ATTACKER_GUID,
            local_qkey: 0,
            local_qpn: qpn,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: TransportServiceType::Rc,
            end_to_end_flow_control: true,
            starting_psn: 0x1234,
            local_cm_response_timeout: 20,
            retry_count: 7,
            partition_key: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path: ReqPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: self.me.to_ipv6_mapped(),
                remote_gid: self.dev.to_ipv6_mapped(),
                flow_label: 0,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 19,
            },
            alternate_path: ReqPath::ZERO,
            sap_supported: false,
            private_data,
        })
    }
}

/// A device with an rdma_cm listener (TCP port space) on a non-blocking event channel.
struct Target {
    ctx: Context,
    ch: EventChannel,
    listener: CmId,
    addr: SocketAddr,
}

impl Target {
    fn new(ip: &str, port: u16) -> Target {
        Target::with_backlog(ip, port, 0)
    }

    /// A target whose listener has `backlog` (0: the largest).
    fn with_backlog(ip: &str, port: u16, backlog: i32) -> Target {
        let ctx = Device::from_addr(ip.parse().unwrap())
            .unwrap()
            .open()
            .unwrap();
        ctx.local_udp_addr().unwrap();
        let ch = EventChannel::new().unwrap();
        ch.set_nonblocking(true).unwrap();
        let addr = SocketAddr::new(ip.parse().unwrap(), port);
        let listener = CmId::create(Some(&ch), 1, PortSpace::Tcp).unwrap();
        listener.bind_addr(addr).unwrap();
        // By default the largest backlog: the flood meets the device's own bound, not the
        // listener's.
        listener.listen(backlog).unwrap();
        Target {
            ctx,
            ch,
            listener,
            addr,
        }
    }

    fn service_id(&self) -> u64 {
        cma::service_id(cma::PortSpace::Tcp, self.addr.port())
    }

    /// The application has no event waiting: `get_cm_event` fails with EAGAIN.
    fn assert_no_event(&self) {
        match self.ch.get_cm_event() {
            Err(e) => assert_eq!(e.errno(), libc::EAGAIN),
            Ok(ev) => panic!("unexpected event {:?} (status {})", ev.event, ev.status),
        }
    }

    /// A real rdma_cm connection from a second device at `client_ip`: connect, accept,
    /// ESTABLISHED on both sides, disconnect, DISCONNECTED on both sides.
    fn connects_normally(&self, client_ip: &str) {
        let cch = EventChannel::new().unwrap();
        cch.set_nonblocking(true).unwrap();
        let c = CmId::create(Some(&cch), 7, PortSpace::Tcp).unwrap();
        let src = SocketAddr::new(client_ip.parse().unwrap(), 0);
        c.resolve_addr(Some(src), self.addr, 2000).unwrap();
        expect(&cch, CmEventType::AddrResolved).ack();
        c.resolve_route(2000).unwrap();
        expect(&cch, CmEventType::RouteResolved).ack();
        c.create_qp(None, &mut cap()).unwrap();
        c.connect(&ConnParam {
            private_data: b"after the storm".to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        })
        .unwrap();
        let req = expect(&self.ch, CmEventType::ConnectRequest);
        assert_eq!(&req.param.private_data[..15], b"after the storm");
        let s = req.id.clone();
        req.ack();
        assert_eq!(s.peer_addr().unwrap().ip(), src.ip());
        s.create_qp(None, &mut cap()).unwrap();
        s.accept(&ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            ..Default::default()
        })
        .unwrap();
        expect(&cch, CmEventType::Established).ack();
        expect(&self.ch, CmEventType::Established).ack();
        assert_eq!(c.qp().unwrap().state(), QpState::Rts);
        assert_eq!(s.qp().unwrap().state(), QpState::Rts);
        c.disconnect().unwrap();
        expect(&cch, CmEventType::Disconnected).ack();
        expect(&self.ch, CmEventType::Disconnected).ack();
        c.destroy();
        s.destroy();
    }
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// The next event on a non-blocking channel (waiting up to 30 s for one), which must be `want`.
fn expect(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let t = Instant::now();
    loop {
        match ch.get_cm_event() {
            Ok(ev) => {
                assert_eq!(ev.event, want, "status {}", ev.status);
                return ev;
            }
            Err(e) if e.errno() == libc::EAGAIN => {
                if t.elapsed() > Duration::from_secs(60) {
                    // A hang guard, not a speed check: only something that never happens trips it.
                    panic!("no {want:?} event");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("get_cm_event: {e}"),
        }
    }
}

/// Malformed packets to QP 1 — too short for a BTH or for their headers, an unknown opcode,
/// a bad pad count, a bad ICRC, the wrong opcode (RC, UC, UD with immediate, ACK, CNP), the
/// wrong Q_Key, a wrong transport version, a MAD shorter than 256 bytes — are dropped, each
/// counted exactly where the device documents it, and reach neither the CM nor the
/// application.
#[test]
fn malformed_packets_to_qp1_are_dropped_and_counted() {
    let ip_100 = unique();
    let ip_101 = unique();
    let ip_102 = unique();
    let t = Target::new(&ip_100, 7100);
    let mut a = Attacker::new(&ip_101, &ip_100);
    assert!(a.probe().is_empty());
    let (c0, g0) = (t.ctx.counters(), t.ctx.cm_stats());
    assert_eq!(g0.cm.received.total(), 1, "the probe");

    let gsi_qkey = deth::Repr {
        qkey: mad::GSI_QKEY,
        src_qp: 1,
    };
    let dreq = Attacker::mad_of(
        a.next_tid(),
        &Message::Dreq(DreqRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn_eecn: 3,
            private_data: [0; 220],
        }),
    );

    // Counted as malformed by the engine (before the ICRC check can even run). (An empty
    // datagram is a liveness probe, counted as such: below.)
    let mut malformed = Vec::new();
    malformed.push(vec![0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0]); // shorter than a BTH
                                                                 // A UD SEND_ONLY to QP 1 cut after the BTH: no DETH, no MAD.
    let mut p = a.mad_packet(&dreq);
    p.truncate(bth::HEADER_LEN);
    p.extend_from_slice(&[0; 4]);
    a.seal(&mut p);
    malformed.push(p);
    // An RDMA WRITE_ONLY to QP 1 whose RETH is cut short.
    let mut p = a.packet(Opcode::RC_SEND_ONLY, 1, None, &[0; 8]);
    bth::Packet::new_unchecked(&mut p[..]).set_opcode(Opcode::RC_RDMA_WRITE_ONLY);
    a.seal(&mut p);
    malformed.push(p);
    // An opcode the transport does not define.
    assert!(Opcode(0x1f).lookup().is_err());
    let mut p = a.mad_packet(&dreq);
    bth::Packet::new_unchecked(&mut p[..]).set_opcode(Opcode(0x1f));
    a.seal(&mut p);
    malformed.push(p);
    // A CNP one byte too long (BTH + 17 bytes): the transport has no such opcode.
    let mut p = a.packet(Opcode::RC_SEND_ONLY, 1, None, &[0; 17]);
    bth::Packet::new_unchecked(&mut p[..]).set_opcode(Opcode::CNP);
    a.seal(&mut p);
    malformed.push(p);
    // A pad count larger than the bytes between headers and ICRC.
    let mut p = a.packet(Opcode::UD_SEND_ONLY, 1, Some(gsi_qkey), &[]);
    bth::Packet::new_unchecked(&mut p[..]).set_pad_count(3);
    a.seal(&mut p);
    malformed.push(p);

    // RoCEv2 CNPs to QP 1 (BTH + 16 reserved bytes): counted as such and dropped; one
    // with a bad ICRC is an ICRC error.
    let mut cnp = Vec::new();
    for _ in 0..2 {
        let mut p = a.packet(Opcode::RC_SEND_ONLY, 1, None, &[0; 16]);
        bth::Packet::new_unchecked(&mut p[..]).set_opcode(Opcode::CNP);
        a.seal(&mut p);
        cnp.push(p);
    }

    // Bad ICRCs: flipped, payload changed after sealing, and sealed for another source, and
    // a CNP whose ICRC is flipped.
    let mut icrc_bad = Vec::new();
    let mut p = cnp[0].clone();
    let n = p.len();
    p[n - 2] ^= 4;
    icrc_bad.push(p);
    let mut p = a.mad_packet(&dreq);
    let n = p.len();
    p[n - 1] ^= 1;
    icrc_bad.push(p);
    let mut p = a.mad_packet(&dreq);
    p[40] ^= 0x80;
    icrc_bad.push(p);
    let mut p = a.mad_packet(&dreq);
    IcrcPrefix::ipv4(ip4("127.0.0.250"), a.dev, ROCE_PORT, ROCE_PORT)
        .fill(&mut roce::Packet::new_unchecked(&mut p[..]))
        .unwrap();
    icrc_bad.push(p);

    // Good ICRC, but not a MAD the GSI takes: counted as GSI drops.
    let mut gsi_bad = Vec::new();
    gsi_bad.push(a.packet(Opcode::RC_SEND_ONLY, 1, None, &dreq)); // RC to QP 1, no DETH
    gsi_bad.push(a.packet(Opcode::UC_SEND_ONLY, 1, None, &dreq));
    gsi_bad.push(a.packet(
        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        1,
        Some(gsi_qkey),
        &dreq,
    ));
    // An RC ACK to QP 1 (BTH + AETH).
    let mut p = a.packet(Opcode::RC_SEND_ONLY, 1, None, &[0; 4]);
    bth::Packet::new_unchecked(&mut p[..]).set_opcode(Opcode::RC_ACKNOWLEDGE);
    a.seal(&mut p);
    gsi_bad.push(p);
    let wrong_qkey = deth::Repr {
        qkey: 0x1111_1111,
        src_qp: 1,
    };
    gsi_bad.push(a.packet(Opcode::UD_SEND_ONLY, 1, Some(wrong_qkey), &dreq));
    gsi_bad.push(a.packet(Opcode::UD_SEND_ONLY, 1, Some(gsi_qkey), &dreq[..98])); // short MAD
    gsi_bad.push(a.packet(Opcode::UD_SEND_ONLY, 1, Some(gsi_qkey), &[])); // no MAD at all
                                                                          // Pad count 2 on a 256-byte payload: the MAD is read as 254 bytes.
    let mut p = a.mad_packet(&dreq);
    bth::Packet::new_unchecked(&mut p[..]).set_pad_count(2);
    a.seal(&mut p);
    gsi_bad.push(p);
    // A P_Key of another partition (the port's table holds the default one only).
    let mut p = a.mad_packet(&dreq);
    bth::Packet::new_unchecked(&mut p[..]).set_pkey(0x8001);
    a.seal(&mut p);
    gsi_bad.push(p);
    // Transport header version 1.
    let mut p = a.mad_packet(&dreq);
    bth::Packet::new_unchecked(&mut p[..]).set_tver(1);
    a.seal(&mut p);
    gsi_bad.push(p);

    let empty = vec![Vec::new()];
    for p in malformed
        .iter()
        .chain(&empty)
        .chain(&cnp)
        .chain(&icrc_bad)
        .chain(&gsi_bad)
    {
        a.send(p);
    }
    // Nothing was answered (a DREQ that reached the CM would have been, with a DREP).
    assert!(a.probe().is_empty(), "the device answered a dropped packet");
    let (c1, g1) = (t.ctx.counters(), t.ctx.cm_stats());
    assert_eq!(c1.malformed - c0.malformed, malformed.len() as u64);
    assert_eq!(
        c1.probes_received - c0.probes_received,
        1,
        "the empty datagram"
    );
    assert_eq!(c1.cnp_received - c0.cnp_received, cnp.len() as u64);
    assert_eq!(c1.icrc_errors - c0.icrc_errors, icrc_bad.len() as u64);
    assert_eq!(g1.dropped - g0.dropped, gsi_bad.len() as u64);
    // The CM saw the probe only.
    assert_eq!(g1.cm.received.total() - g0.cm.received.total(), 1);
    assert_eq!(g1.cm.dropped_malformed, g0.cm.dropped_malformed);
    assert_eq!(g1.cm.dropped_unsupported, g0.cm.dropped_unsupported);
    assert_eq!((g1.connections, g1.pending_reqs), (0, 0));
    t.assert_no_event();

    t.connects_normally(&ip_102);
    t.assert_no_event();
    t.listener.destroy();
}

/// MADs of other management classes, methods, attribute IDs, base and class versions — each
/// a REQ that would otherwise reach the listener — are dropped as unsupported; CM messages
/// with forbidden field values are dropped as malformed. No event, no answer; the same REQ
/// unmangled does reach the application.
#[test]
fn mads_that_are_not_cm_messages_we_handle_are_dropped_and_counted() {
    let ip_103 = unique();
    let ip_104 = unique();
    let ip_105 = unique();
    let t = Target::new(&ip_103, 7103);
    let mut a = Attacker::new(&ip_104, &ip_103);
    assert!(a.probe().is_empty());
    let g0 = t.ctx.cm_stats();
    let sid = t.service_id();
    let mut n = 0u32;
    let mut req = |a: &mut Attacker| {
        n += 1;
        let pd = a.cma_private_data(40_000 + n as u16);
        Attacker::mad_of(a.next_tid(), &a.req(n, 0x100 + n, sid, pd))
    };

    let mut unsupported = 0;
    let mut mangled = |a: &mut Attacker, f: &dyn Fn(&mut mad::Packet<&mut [u8]>)| {
        let mut m = req(a);
        f(&mut mad::Packet::new_unchecked(&mut m[..]));
        a.send_mad(&m);
        unsupported += 1;
    };
    for v in [0u8, 2, 0x81] {
        mangled(&mut a, &|m| m.set_base_version(v));
    }
    // Subnet management (LID routed and directed route), subnet administration,
    // performance management, device management.
    for c in [0x01u8, 0x81, 0x03, 0x04, 0x06] {
        mangled(&mut a, &|m| m.set_mgmt_class(c));
    }
    for v in [0u8, 1, 3] {
        mangled(&mut a, &|m| m.set_class_version(v));
    }
    for method in [
        mad::METHOD_GET,
        mad::METHOD_SET,
        mad::METHOD_GET_RESP,
        mad::METHOD_TRAP,
        mad::METHOD_REPORT,
        mad::METHOD_REPORT_RESP,
        mad::METHOD_TRAP_REPRESS,
        0x83,
    ] {
        mangled(&mut a, &|m| m.set_method(method));
    }
    for attr in [
        mad::ATTR_CLASS_PORT_INFO,
        mad::ATTR_CM_LAP,
        mad::ATTR_CM_APR,
        0x0000,
        0x001b,
        0x00ff,
        0xffff,
    ] {
        mangled(&mut a, &|m| m.set_attribute_id(attr));
    }

    // Forbidden field values: REJ "message rejected" 3 and ARI length 73, MRA "message
    // MRAed" 3, SIDR_REP additional information length 73.
    let rej = Attacker::mad_of(
        1,
        &Message::Rej(RejRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            message_rejected: MessageRejected::Req,
            reject_info_length: 0,
            reason: RejectReason::ConsumerDefined,
            ari: [0; 72],
            private_data: [0; 148],
        }),
    );
    let mut m = rej;
    RejPacket::new_unchecked(&mut m[mad::MAD_HEADER_LEN..]).set_message_rejected(3);
    a.send_mad(&m);
    let mut m = rej;
    RejPacket::new_unchecked(&mut m[mad::MAD_HEADER_LEN..]).set_reject_info_length(73);
    a.send_mad(&m);
    let mut m = Attacker::mad_of(
        2,
        &Message::Mra(MraRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            message_mraed: MessageMraed::Req,
            service_timeout: 10,
            private_data: [0; 222],
        }),
    );
    MraPacket::new_unchecked(&mut m[mad::MAD_HEADER_LEN..]).set_message_mraed(3);
    a.send_mad(&m);
    let mut m = Attacker::mad_of(
        3,
        &Message::SidrRep(SidrRepRepr {
            request_id: 5,
            status: SidrStatus::Success,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 9,
            service_id: sid,
            qkey: 0,
            additional_info: [0; 72],
            private_data: [0; 136],
        }),
    );
    SidrRepPacket::new_unchecked(&mut m[mad::MAD_HEADER_LEN..]).set_additional_info_length(73);
    a.send_mad(&m);
    let malformed = 4;

    assert!(a.probe().is_empty(), "the device answered a dropped MAD");
    let g1 = t.ctx.cm_stats();
    assert_eq!(
        g1.cm.dropped_unsupported - g0.cm.dropped_unsupported,
        unsupported
    );
    assert_eq!(g1.cm.dropped_malformed - g0.cm.dropped_malformed, malformed);
    assert_eq!(
        g1.cm.received.total() - g0.cm.received.total(),
        1,
        "the probe"
    );
    assert_eq!(g1.dropped, g0.dropped, "all were valid MAD packets");
    assert_eq!((g1.connections, g1.pending_reqs), (0, 0));
    t.assert_no_event();

    // The control: the same REQ, unmangled, reaches the application.
    let m = req(&mut a);
    a.send_mad(&m);
    assert!(a.probe().is_empty());
    let ev = expect(&t.ch, CmEventType::ConnectRequest);
    assert_eq!(ev.id.peer_addr().unwrap().ip(), IpAddr::V4(a.me));
    ev.id.reject(b"go away").unwrap();
    let child = ev.id.clone();
    ev.ack();
    child.destroy();
    match &a.probe()[..] {
        [(_, Message::Rej(r))] => assert_eq!(r.reason, RejectReason::ConsumerDefined),
        other => panic!("expected one REJ 28, got {other:?}"),
    }
    t.assert_no_event();

    t.connects_normally(&ip_105);
    t.listener.destroy();
}

/// REP, RTU, DREQ, DREP, REJ (of a REQ, of a REP, other, timeout), MRA (of a REQ, of a REP)
/// and SIDR_REP naming communications that do not exist are dropped and counted as unknown
/// (an MRA of a LAP as unsupported); a DREQ is answered with a DREP, as Linux does. No event
/// reaches the application.
#[test]
fn cm_messages_for_unknown_communications_are_dropped_without_events() {
    let ip_106 = unique();
    let ip_107 = unique();
    let ip_108 = unique();
    let t = Target::new(&ip_106, 7106);
    let mut a = Attacker::new(&ip_107, &ip_106);
    assert!(a.probe().is_empty());
    let g0 = t.ctx.cm_stats();
    let mut rng = Rng(0x5eed);
    const ROUNDS: u64 = 25;
    let mut dreqs = Vec::new();
    for _ in 0..ROUNDS {
        let (x, y) = (rng.id(), rng.id());
        let tid = a.next_tid();
        a.send_msg(
            tid,
            &Message::Rep(RepRepr {
                local_comm_id: x,
                remote_comm_id: y,
                local_qkey: 0,
                local_qpn: rng.id() & 0xff_ffff,
                local_eecn: 0,
                starting_psn: 1,
                vendor_id: 0,
                responder_resources: 1,
                initiator_depth: 1,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: true,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: rng.next(),
                private_data: [0; 196],
            }),
        );
        a.send_msg(
            tid,
            &Message::Rtu(RtuRepr {
                local_comm_id: x,
                remote_comm_id: y,
                private_data: [0; 224],
            }),
        );
        let dtid = a.next_tid();
        a.send_msg(
            dtid,
            &Message::Dreq(DreqRepr {
                local_comm_id: x,
                remote_comm_id: y,
                remote_qpn_eecn: rng.id() & 0xff_ffff,
                private_data: [0; 220],
            }),
        );
        dreqs.push((dtid, x, y));
        a.send_msg(
            tid,
            &Message::Drep(DrepRepr {
                local_comm_id: x,
                remote_comm_id: y,
                private_data: [0; 224],
            }),
        );
        for (rejected, reason) in [
            (MessageRejected::Req, RejectReason::ConsumerDefined),
            (MessageRejected::Rep, RejectReason::InvalidServiceId),
            (MessageRejected::Other, RejectReason::StaleConn),
            (MessageRejected::Req, RejectReason::Timeout),
        ] {
            let mut ari = [0u8; 72];
            ari[..8].copy_from_slice(&rng.next().to_be_bytes());
            a.send_msg(
                tid,
                &Message::Rej(RejRepr {
                    local_comm_id: x,
                    remote_comm_id: y,
                    message_rejected: rejected,
                    reject_info_length: if reason == RejectReason::Timeout {
                        8
                    } else {
                        0
                    },
                    reason,
                    ari,
                    private_data: [0; 148],
                }),
            );
        }
        for mraed in [MessageMraed::Req, MessageMraed::Rep, MessageMraed::Lap] {
            a.send_msg(
                tid,
                &Message::Mra(MraRepr {
                    local_comm_id: x,
                    remote_comm_id: y,
                    message_mraed: mraed,
                    service_timeout: 31,
                    private_data: [0; 222],
                }),
            );
        }
        a.send_msg(
            tid,
            &Message::SidrRep(SidrRepRepr {
                request_id: y,
                status: SidrStatus::Success,
                additional_info_length: 0,
                vendor_id: 0,
                qpn: rng.id() & 0xff_ffff,
                service_id: t.service_id(),
                qkey: cma::RDMA_UDP_QKEY,
                additional_info: [0; 72],
                private_data: [0; 136],
            }),
        );
    }
    // The only answers: a DREP per DREQ, in order, naming the DREQ's IDs the other way round.
    let answers = a.probe();
    assert_eq!(answers.len(), dreqs.len(), "{answers:?}");
    for ((tid, m), (dtid, x, y)) in answers.iter().zip(&dreqs) {
        match m {
            Message::Drep(d) => {
                assert_eq!((*tid, d.local_comm_id, d.remote_comm_id), (*dtid, *y, *x))
            }
            other => panic!("expected a DREP, got {other:?}"),
        }
    }
    let g1 = t.ctx.cm_stats();
    let d = |f: fn(&softrdma_proto::cm::MsgCounts) -> u64| f(&g1.cm.received) - f(&g0.cm.received);
    assert_eq!(
        [
            d(|c| c.rep),
            d(|c| c.rtu),
            d(|c| c.dreq),
            d(|c| c.drep),
            d(|c| c.rej),
            d(|c| c.mra),
            d(|c| c.sidr_rep),
            d(|c| c.sidr_req),
            d(|c| c.req),
        ],
        [
            ROUNDS,
            ROUNDS,
            ROUNDS,
            ROUNDS,
            4 * ROUNDS,
            3 * ROUNDS,
            ROUNDS,
            1,
            0
        ]
    );
    // REP, RTU, DREQ, DREP, 4 REJ, 2 MRA, SIDR_REP per round: unknown; the MRA of a LAP:
    // unsupported.
    assert_eq!(
        g1.cm.dropped_unknown_id - g0.cm.dropped_unknown_id,
        11 * ROUNDS
    );
    assert_eq!(
        g1.cm.dropped_unsupported - g0.cm.dropped_unsupported,
        ROUNDS
    );
    assert_eq!(g1.cm.sent.drep - g0.cm.sent.drep, ROUNDS);
    assert_eq!(g1.cm.dropped_invalid_state, g0.cm.dropped_invalid_state);
    assert_eq!((g1.connections, g1.pending_reqs), (0, 0));
    t.assert_no_event();

    t.connects_normally(&ip_108);
    t.assert_no_event();
    t.listener.destroy();
}

/// 5,000 REQs with distinct communication IDs, TIDs and QPNs to a listened service on a
/// device whose CM bounds are set to 4096 connections and 1024 pending requests
/// ([`Context::set_cm_limits`]): the CM
/// holds at most `max_pending_reqs` (1024) unanswered requests and answers every REQ beyond
/// them with REJ 3 (no resources), keeping nothing for them; the application gets exactly
/// one CONNECT_REQUEST per request held. While the application sits on them, a real client
/// is refused with REJ 3 too (the bound is the device's; the listener's backlog is the
/// largest, so it does not drop them first); once
/// it answers them, the device connects normally.
#[test]
fn a_req_flood_is_bounded_by_max_pending_reqs_and_answered_with_rej_3() {
    let ip_109 = unique();
    let ip_110 = unique();
    let ip_111 = unique();
    let t = Target::new(&ip_109, 7109);
    let mut a = Attacker::new(&ip_110, &ip_109);
    assert!(a.probe().is_empty());
    t.ctx.set_cm_limits(4096, 1024).unwrap();
    let g0 = t.ctx.cm_stats();
    assert_eq!((g0.max_pending_reqs, g0.max_connections), (1024, 4096));
    const FLOOD: u32 = 5000;
    const BATCH: u32 = 250;
    let sid = t.service_id();
    let mut rejected = Vec::new();
    let mut peak = (0, 0);
    for start in (1..=FLOOD).step_by(BATCH as usize) {
        for id in start..start + BATCH {
            let pd = a.cma_private_data(id as u16);
            let tid = a.next_tid();
            let m = a.req(id, 0x1000 + id, sid, pd);
            a.send_msg(tid, &m);
        }
        for (_, m) in a.probe() {
            match m {
                Message::Rej(r) => {
                    assert_eq!(r.reason, RejectReason::NoResources);
                    assert_eq!(r.message_rejected, MessageRejected::Req);
                    rejected.push(r.remote_comm_id);
                }
                other => panic!("expected only REJs, got {other:?}"),
            }
        }
        let g = t.ctx.cm_stats();
        assert!(g.pending_reqs <= g.max_pending_reqs, "{g:?}");
        assert!(g.connections <= g.max_connections, "{g:?}");
        peak = (peak.0.max(g.pending_reqs), peak.1.max(g.connections));
    }
    let g1 = t.ctx.cm_stats();
    let held = g1.max_pending_reqs as u32;
    assert_eq!(peak, (held as usize, held as usize));
    assert_eq!(g1.cm.received.req - g0.cm.received.req, u64::from(FLOOD));
    // The first 1024 are held; every later one was refused, in order.
    assert_eq!(rejected, (held + 1..=FLOOD).collect::<Vec<_>>());
    assert_eq!(
        g1.cm.dropped_no_resources - g0.cm.dropped_no_resources,
        u64::from(FLOOD - held)
    );
    assert_eq!(g1.cm.sent.rej - g0.cm.sent.rej, u64::from(FLOOD - held));

    // The application sees one CONNECT_REQUEST per request held, no more.
    let mut requests = Vec::new();
    loop {
        match t.ch.get_cm_event() {
            Ok(ev) => {
                assert_eq!(ev.event, CmEventType::ConnectRequest);
                requests.push(ev);
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::EAGAIN);
                break;
            }
        }
    }
    assert_eq!(requests.len(), held as usize);
    let ports: Vec<u16> = requests
        .iter()
        .map(|ev| ev.id.peer_addr().unwrap().port())
        .collect();
    assert_eq!(ports, (1..=held as u16).collect::<Vec<_>>());

    // Saturated: a real client is refused with REJ 3 as well.
    let cch = EventChannel::new().unwrap();
    cch.set_nonblocking(true).unwrap();
    let c = CmId::create(Some(&cch), 9, PortSpace::Tcp).unwrap();
    c.resolve_addr(
        Some(SocketAddr::new(ip_111.parse().unwrap(), 0)),
        t.addr,
        2000,
    )
    .unwrap();
    expect(&cch, CmEventType::AddrResolved).ack();
    c.resolve_route(2000).unwrap();
    expect(&cch, CmEventType::RouteResolved).ack();
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let ev = expect(&cch, CmEventType::Rejected);
    assert_eq!(ev.status, 3);
    ev.ack();
    c.destroy();

    // The application refuses the flood's requests (REJ 28 each); the CM frees everything.
    let mut answered = 0;
    for chunk in requests.chunks_mut(128) {
        for ev in chunk.iter() {
            ev.id.reject(&[]).unwrap();
        }
        for (_, m) in a.probe() {
            match m {
                Message::Rej(r) => {
                    assert_eq!(r.reason, RejectReason::ConsumerDefined);
                    answered += 1;
                }
                other => panic!("expected REJ 28, got {other:?}"),
            }
        }
    }
    assert_eq!(answered, held);
    for ev in requests {
        let id = ev.id.clone();
        ev.ack();
        id.destroy();
    }
    let g2 = t.ctx.cm_stats();
    assert_eq!((g2.connections, g2.pending_reqs), (0, 0));
    t.assert_no_event();

    t.connects_normally(&ip_111);
    t.assert_no_event();
    t.listener.destroy();
}

/// With the device's default bounds (far above the flood), the listen backlog is what bounds
/// a flood: 5,000 REQs with distinct communication IDs and QPNs to a listener with backlog
/// 16 whose application takes nothing leave the CM holding 16 requests (and rdma_cm 16 new
/// ids); every REQ beyond is dropped unanswered and forgotten, as Linux drops it, so the
/// peer's CM retries it. Once the application has taken and refused those 16, a
/// retransmission of a dropped REQ is handed to it as a new CONNECT_REQUEST, and a real client
/// connects. (`req_flood_memory_probe` measures the process's memory under such a flood.)
#[test]
fn a_req_flood_beyond_the_listen_backlog_is_dropped_and_the_state_stays_bounded() {
    let ip_13_0_3 = unique();
    let ip_13_0_4 = unique();
    let ip_13_0_5 = unique();
    const BACKLOG: u32 = 16;
    let t = Target::with_backlog(&ip_13_0_3, 7133, BACKLOG as i32);
    let mut a = Attacker::new(&ip_13_0_4, &ip_13_0_3);
    assert!(a.probe().is_empty());
    let g0 = t.ctx.cm_stats();
    assert_eq!(
        (g0.max_connections, g0.max_pending_reqs),
        (262_144, 65_536),
        "the defaults (SOFTRDMA_CM_MAX_* unset)"
    );
    const FLOOD: u32 = 5000;
    let sid = t.service_id();
    let mut tids = Vec::new();
    for start in (1..=FLOOD).step_by(250) {
        for id in start..start + 250 {
            let pd = a.cma_private_data(id as u16);
            let tid = a.next_tid();
            tids.push(tid);
            let m = a.req(id, 0x1000 + id, sid, pd);
            a.send_msg(tid, &m);
        }
        // Dropped, not refused: no answer at all.
        assert_eq!(a.probe().len(), 0);
        let g = t.ctx.cm_stats();
        assert!(g.connections <= BACKLOG as usize, "{g:?}");
        assert!(g.pending_reqs <= BACKLOG as usize, "{g:?}");
    }
    let g1 = t.ctx.cm_stats();
    assert_eq!(g1.cm.received.req - g0.cm.received.req, u64::from(FLOOD));
    assert_eq!(g1.cm.sent.rej, g0.cm.sent.rej);
    assert_eq!((g1.connections, g1.pending_reqs), (16, 16));

    // The application takes the 16 held (the first 16 REQs) and refuses them.
    let mut held = Vec::new();
    while let Ok(ev) = t.ch.get_cm_event() {
        assert_eq!(ev.event, CmEventType::ConnectRequest);
        held.push(ev.id.peer_addr().unwrap().port());
        let id = ev.id.clone();
        ev.ack();
        id.reject(&[]).unwrap();
        id.destroy();
    }
    assert_eq!(held, (1..=BACKLOG as u16).collect::<Vec<_>>());
    let refused = a.probe();
    assert_eq!(refused.len(), BACKLOG as usize);
    let g2 = t.ctx.cm_stats();
    assert_eq!((g2.connections, g2.pending_reqs), (0, 0));

    // The peer's retransmission of a dropped REQ (same TID, same IDs) now gets through.
    let id = 4242;
    let pd = a.cma_private_data(id as u16);
    let m = a.req(id, 0x1000 + id, sid, pd);
    a.send_msg(tids[id as usize - 1], &m);
    assert!(a.probe().is_empty());
    let ev = expect(&t.ch, CmEventType::ConnectRequest);
    assert_eq!(ev.id.peer_addr().unwrap().port(), id as u16);
    let child = ev.id.clone();
    ev.ack();
    child.reject(&[]).unwrap();
    child.destroy();
    assert_eq!(a.probe().len(), 1);
    t.assert_no_event();

    t.connects_normally(&ip_13_0_5);
    t.assert_no_event();
    t.listener.destroy();
}

/// A device at its own `max_connections` ([`Context::set_cm_limits`]) refuses a new
/// `rdma_connect` at once with `ENOMEM` and sends nothing (the server sees no request, so
/// nobody waits on it); raising the bound lets the same id connect.
#[test]
fn connect_beyond_the_device_bound_fails_with_enomem_and_raising_it_lets_it_through() {
    let ip_13_0_7 = unique();
    let ip_13_0_6 = unique();
    let t = Target::new(&ip_13_0_7, 7137);
    let cctx = Device::from_addr(ip_13_0_6.parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    cctx.set_cm_limits(1, 1).unwrap();
    let g = cctx.cm_stats();
    assert_eq!((g.max_connections, g.max_pending_reqs), (1, 1));
    let cch = EventChannel::new().unwrap();
    cch.set_nonblocking(true).unwrap();
    let src = SocketAddr::new(ip_13_0_6.parse().unwrap(), 0);
    let ids: Vec<CmId> = (0..2)
        .map(|i| {
            let c = CmId::create(Some(&cch), i, PortSpace::Tcp).unwrap();
            c.resolve_addr(Some(src), t.addr, 2000).unwrap();
            expect(&cch, CmEventType::AddrResolved).ack();
            c.resolve_route(2000).unwrap();
            expect(&cch, CmEventType::RouteResolved).ack();
            c
        })
        .collect();
    // No QPs: made-up QP numbers, as cmtime's second round announces.
    let param = |qpn| ConnParam {
        qp_num: qpn,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    ids[0].connect(&param(0x4242)).unwrap();
    let first = expect(&t.ch, CmEventType::ConnectRequest);
    let e = ids[1].connect(&param(0x4243)).unwrap_err();
    assert_eq!(e.errno(), libc::ENOMEM);
    t.assert_no_event();
    cctx.set_cm_limits(2, 1).unwrap();
    ids[1].connect(&param(0x4243)).unwrap();
    let second = expect(&t.ch, CmEventType::ConnectRequest);
    for ev in [first, second] {
        let id = ev.id.clone();
        ev.ack();
        id.reject(&[]).unwrap();
        id.destroy();
    }
    for _ in 0..2 {
        let ev = expect(&cch, CmEventType::Rejected);
        assert_eq!(ev.status, 28);
        ev.ack();
    }
    for c in ids {
        c.destroy();
    }
    t.listener.destroy();
}

/// REQs to a listened service whose rdma_cm private-data header is garbage — cma_version 1,
/// IP version 5, all zero — or names another destination address are rejected with REJ 28
/// (consumer defined) and never reach the application; the CM keeps nothing for them. That
/// is what Linux's rdma_cm answers when its IB CM listens on the service but rdma_cm cannot
/// take the request (the same four REQs sent to the kernel's `rping -s` in the interop VM);
/// a service nobody listens on gets REJ 8.
#[test]
fn a_req_with_a_garbage_cma_header_is_rejected_with_reason_28() {
    let ip_112 = unique();
    let ip_113 = unique();
    let ip_114 = unique();
    let t = Target::new(&ip_112, 7112);
    let mut a = Attacker::new(&ip_113, &ip_112);
    assert!(a.probe().is_empty());
    let g0 = t.ctx.cm_stats();
    let cases = a.garbage_cma_headers();
    let [bad_version, _, _, other_dst] = cases;
    let mut sent = Vec::new();
    for (i, pd) in cases.into_iter().enumerate() {
        let id = 0x100 + i as u32;
        let tid = a.next_tid();
        let m = a.req(id, 0x200 + i as u32, t.service_id(), pd);
        a.send_msg(tid, &m);
        sent.push((tid, id));
    }
    let answers = a.probe();
    assert_eq!(answers.len(), cases.len(), "{answers:?}");
    for ((tid, m), (want_tid, id)) in answers.iter().zip(&sent) {
        match m {
            Message::Rej(r) => {
                assert_eq!(*tid, *want_tid);
                assert_eq!(r.remote_comm_id, *id);
                assert_eq!(r.message_rejected, MessageRejected::Req);
                assert_eq!(r.reason, RejectReason::ConsumerDefined);
            }
            other => panic!("expected REJ 28, got {other:?}"),
        }
    }
    let g1 = t.ctx.cm_stats();
    assert_eq!(g1.cm.received.req - g0.cm.received.req, cases.len() as u64);
    assert_eq!(g1.cm.sent.rej - g0.cm.sent.rej, cases.len() as u64);
    assert_eq!((g1.connections, g1.pending_reqs), (0, 0));
    t.assert_no_event();

    // SIDR_REQs to a listened UDP-port-space service with such headers: SIDR_REP status 2
    // (rejected), as the kernel answers them; a service nobody listens on gets status 1
    // (every probe checks that).
    let ud = CmId::create(Some(&t.ch), 2, PortSpace::Udp).unwrap();
    ud.bind_addr(t.addr).unwrap();
    ud.listen(0).unwrap();
    let usid = cma::service_id(cma::PortSpace::Udp, t.addr.port());
    let mut sent = Vec::new();
    for (i, head) in [bad_version, other_dst].into_iter().enumerate() {
        let mut pd = [0u8; 216];
        pd[..92].copy_from_slice(&head);
        let id = 0x300 + i as u32;
        let tid = a.next_tid();
        a.send_msg(
            tid,
            &Message::SidrReq(SidrReqRepr {
                request_id: id,
                partition_key: 0xffff,
                service_id: usid,
                private_data: pd,
            }),
        );
        sent.push((tid, id));
    }
    let answers = a.probe();
    assert_eq!(answers.len(), sent.len(), "{answers:?}");
    for ((tid, m), (want_tid, id)) in answers.iter().zip(&sent) {
        match m {
            Message::SidrRep(r) => {
                assert_eq!((*tid, r.request_id), (*want_tid, *id));
                assert_eq!(r.status, SidrStatus::Reject);
            }
            other => panic!("expected SIDR_REP status 2, got {other:?}"),
        }
    }
    t.assert_no_event();
    ud.destroy();

    t.connects_normally(&ip_114);
    t.assert_no_event();
    t.listener.destroy();
}

/// A REQ that names an established connection's remote QPN and CA GUID is stale: the CM
/// answers it with REJ 10. Linux's `cm_match_req` also sends a DREQ on the established
/// connection whoever sent the REQ, so a host that guesses a QPN (random, 24 bits) and a CA
/// GUID (softrdma derives it from the IP address) could tear connections down; softrdma does
/// that only for a REQ from the connection's own peer, and this one comes from elsewhere.
#[test]
fn a_stale_req_from_a_stranger_is_refused_and_the_connection_stays() {
    let ip_115 = unique();
    let ip_117 = unique();
    let ip_116 = unique();
    let ip_118 = unique();
    let t = Target::new(&ip_115, 7115);
    let mut a = Attacker::new(&ip_117, &ip_115);
    let client_ip = &ip_116;
    let cch = EventChannel::new().unwrap();
    cch.set_nonblocking(true).unwrap();
    let c = CmId::create(Some(&cch), 7, PortSpace::Tcp).unwrap();
    c.resolve_addr(
        Some(SocketAddr::new(client_ip.parse().unwrap(), 0)),
        t.addr,
        2000,
    )
    .unwrap();
    expect(&cch, CmEventType::AddrResolved).ack();
    c.resolve_route(2000).unwrap();
    expect(&cch, CmEventType::RouteResolved).ack();
    let cqp = c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let req = expect(&t.ch, CmEventType::ConnectRequest);
    let s = req.id.clone();
    req.ack();
    s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established).ack();
    expect(&t.ch, CmEventType::Established).ack();

    // The attacker's REQ: its own comm ID and source, the client's QPN and CA GUID.
    let guid = Device::from_addr(client_ip.parse().unwrap())
        .unwrap()
        .guid();
    let pd = a.cma_private_data(1);
    let mut m = a.req(0x4242, cqp.qp_num(), t.service_id(), pd);
    if let Message::Req(r) = &mut m {
        r.local_ca_guid = guid;
    }
    let tid = a.next_tid();
    a.send_msg(tid, &m);
    match &a.probe()[..] {
        [(got, Message::Rej(r))] => {
            assert_eq!(
                (*got, r.reason, r.remote_comm_id),
                (tid, RejectReason::StaleConn, 0x4242)
            )
        }
        other => panic!("expected REJ 10, got {other:?}"),
    }
    assert_eq!(t.ctx.cm_stats().cm.stale, 1);
    // The REQ came from another address than the connection's peer: the connection stays
    // (Linux would send a DREQ on it whoever asked; the peer check keeps a stranger from
    // tearing down connections by guessing a QPN).
    t.assert_no_event();
    assert_eq!(cch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    assert_eq!(cqp.query_qp().unwrap().0.qp_state, QpState::Rts);
    c.disconnect().unwrap();
    cch.set_nonblocking(false).unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    t.ch.set_nonblocking(false).unwrap();
    expect(&t.ch, CmEventType::Disconnected).ack();
    t.ch.set_nonblocking(true).unwrap();
    c.destroy();
    s.destroy();

    t.connects_normally(&ip_118);
    t.listener.destroy();
}

/// The same requests sent to Linux's rdma_cm get the answers softrdma gives (the two tests
/// above): REJ 28 for each garbage or misdirected REQ to a listened TCP-port-space service,
/// REJ 8 for a service nobody listens on, SIDR_REP status 2 and 1 likewise. Needs a Linux
/// peer with `rping -s` and `udaddy` listening on port PROBE_PORT at PROBE_PEER, and this
/// host's address toward it in PROBE_SELF (port 4791 free there): `scripts/interop.sh` runs
/// it against the kernel in its VM.
#[test]
#[ignore]
fn a_linux_peer_answers_garbage_requests_as_softrdma_does() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let port: u16 = var("PROBE_PORT").parse().unwrap();
    let mut a = Attacker::new(&var("PROBE_SELF"), &var("PROBE_PEER"));
    // The peer's packets carry IPv4 identifications a UDP socket does not show, so their
    // ICRC is not checked here; scripts/interop.sh checks every frame on the bridge.
    let answer = |a: &Attacker| -> Message {
        let mut buf = [0u8; 4096];
        let (n, _) = a.sock.recv_from(&mut buf).expect("an answer within 30 s");
        let p = roce::Packet::new_checked(&buf[..n]).unwrap();
        Message::parse(&mad::Packet::new_checked(p.payload()).unwrap()).unwrap()
    };
    let tcp = |p| cma::service_id(cma::PortSpace::Tcp, p);
    let udp = |p| cma::service_id(cma::PortSpace::Udp, p);
    let heads = a.garbage_cma_headers();
    let good = a.cma_private_data(5555);
    let reqs = heads
        .iter()
        .map(|h| (*h, tcp(port), RejectReason::ConsumerDefined));
    for (i, (pd, sid, want)) in reqs
        .chain([(good, tcp(port + 1), RejectReason::InvalidServiceId)])
        .enumerate()
    {
        let tid = a.next_tid();
        let m = a.req(0x100 + i as u32, 0x200 + i as u32, sid, pd);
        a.send_msg(tid, &m);
        match answer(&a) {
            Message::Rej(r) => assert_eq!(r.reason, want, "REQ {i}"),
            other => panic!("REQ {i}: expected a REJ, got {other:?}"),
        }
    }
    let sidrs = [heads[0], heads[3]]
        .into_iter()
        .map(|h| (h, udp(port), SidrStatus::Reject))
        .chain([(good, udp(port + 1), SidrStatus::Unsupported)]);
    for (i, (head, sid, want)) in sidrs.enumerate() {
        let mut pd = [0u8; 216];
        pd[..92].copy_from_slice(&head);
        let tid = a.next_tid();
        a.send_msg(
            tid,
            &Message::SidrReq(SidrReqRepr {
                request_id: 0x300 + i as u32,
                partition_key: 0xffff,
                service_id: sid,
                private_data: pd,
            }),
        );
        match answer(&a) {
            Message::SidrRep(r) => assert_eq!(r.status, want, "SIDR_REQ {i}"),
            other => panic!("SIDR_REQ {i}: expected a SIDR_REP, got {other:?}"),
        }
    }
}

/// The resident set of this process, in KiB (`VmRSS` of `/proc/self/status`).
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A measurement, not a check: `FLOOD_REQS` (default 250,000) REQs with distinct
/// communication IDs and QPNs to a listener with backlog `FLOOD_BACKLOG` (default 0: the
/// largest) whose application never takes an event, printing the process's RSS every 50,000
/// and the device's CM occupancy. Run with
/// `cargo test --release -p softrdma --test cm_hostile -- --ignored --nocapture req_flood_memory`.
#[test]
#[ignore]
fn req_flood_memory_probe() {
    let ip_13_0_1 = unique();
    let ip_13_0_2 = unique();
    let var = |k: &str, d: u64| std::env::var(k).map_or(d, |v| v.parse().unwrap());
    let n = var("FLOOD_REQS", 250_000) as u32;
    let backlog = var("FLOOD_BACKLOG", 0) as i32;
    // What the application does with each CONNECT_REQUEST: 0 nothing (never takes one),
    // 1 takes and keeps it, 2 rejects and destroys its id, 3 destroys its id, 4 accepts it
    // (the flood never answers the REP), 5 drops its id (no rdma_destroy_id); 6 below.
    let app = var("FLOOD_APP", 0);
    let mut kept = Vec::new();
    let t = Target::with_backlog(&ip_13_0_1, 7131, backlog);
    let mut a = Attacker::new(&ip_13_0_2, &ip_13_0_1);
    assert!(a.probe().is_empty());
    let sid = t.service_id();
    // 6: another thread takes each request while the flood goes on and drops its id (no
    // rdma_destroy_id), racing the device's thread for the rdma_cm registry.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taker = (app == 6).then(|| {
        let (ch, stop) = (t.ch.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                match ch.get_cm_event() {
                    Ok(ev) => drop(ev.id.clone()),
                    Err(_) => std::thread::yield_now(),
                }
            }
        })
    });
    let rss0 = rss_kib();
    println!("before: RSS {rss0} KiB");
    let mut answers = std::collections::BTreeMap::<String, u64>::new();
    for start in (1..=n).step_by(250) {
        for id in start..(start + 250).min(n + 1) {
            let pd = a.cma_private_data(id as u16);
            let tid = a.next_tid();
            let m = a.req(id, 0x1000 + id, sid, pd);
            a.send_msg(tid, &m);
        }
        for (_, m) in a.probe() {
            let k = match m {
                Message::Rej(r) => format!("REJ {}", r.reason.to_u16()),
                other => format!("{:?}", other.attribute_id()),
            };
            *answers.entry(k).or_default() += 1;
        }
        while let Some(ev) = (app != 0 && app != 6)
            .then(|| t.ch.get_cm_event().ok())
            .flatten()
        {
            let id = ev.id.clone();
            ev.ack();
            match app {
                1 => kept.push(id),
                2 => {
                    let _ = id.reject(&[]);
                    id.destroy();
                }
                4 => {
                    let qpn = 0x10_0000 + kept.len() as u32;
                    id.accept(&ConnParam {
                        qp_num: qpn,
                        responder_resources: 1,
                        initiator_depth: 1,
                        ..Default::default()
                    })
                    .unwrap();
                    kept.push(id);
                }
                5 => drop(id),
                _ => id.destroy(),
            }
        }
        let sent = (start + 249).min(n);
        if sent % 50_000 == 0 || sent == n {
            let g = t.ctx.cm_stats();
            println!(
                "{sent} REQs: RSS {} KiB, CM connections {} pending {}, answers {answers:?}",
                rss_kib(),
                g.connections,
                g.pending_reqs
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    if let Some(h) = taker {
        h.join().unwrap();
    }
}

/// `pkt` (sealed as the attacker's) re-sealed with the ICRC it has when its IPv4 header
/// carries identification `ident`, as a kernel stack (rxe) sends it.
fn seal_with_ident(a: &Attacker, pkt: &mut [u8], ident: u16) {
    use softrdma_wire::ip::{Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr, IP_PROTOCOL_UDP};
    let mut iph = [0u8; 20];
    Ipv4Repr {
        src_addr: a.me,
        dst_addr: a.dev,
        protocol: IP_PROTOCOL_UDP,
        payload_len: 8 + pkt.len(),
        ttl: 64,
        tos: 0,
        ident,
        dont_frag: true,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut iph[..]))
    .unwrap();
    let mut udph = [0u8; 8];
    UdpRepr {
        src_port: ROCE_PORT,
        dst_port: ROCE_PORT,
        payload_len: pkt.len(),
    }
    .emit(&mut UdpPacket::new_unchecked(&mut udph[..]))
    .unwrap();
    let n = pkt.len() - 4;
    let crc = softrdma_wire::icrc::icrc_ipv4(&iph, &udph, &pkt[..n]);
    pkt[n..].copy_from_slice(&crc.to_le_bytes());
}

/// A packet from a new sender whose ICRC matches only with a nonzero IPv4 identification is
/// accepted through the solved identification (Linux rxe sends such packets); once a sender
/// has sent enough packets that verified with identification 0 (a softrdma peer), a packet of
/// its that matches only that way is an ICRC error: softrdma peers keep the full 32-bit check.
#[test]
fn solved_identifications_only_for_senders_that_are_not_softrdma_peers() {
    let ip_13_5_1 = unique();
    let ip_13_5_2 = unique();
    let ip_13_5_3 = unique();
    let t = Target::new(&ip_13_5_1, 7101);
    let mut fresh = Attacker::new(&ip_13_5_2, &ip_13_5_1);
    let mut peer = Attacker::new(&ip_13_5_3, &ip_13_5_1);
    let c0 = t.ctx.counters();
    // A fresh sender: accepted through the solved identification (then dropped: no such QP).
    let mut p = fresh.packet(Opcode::RC_SEND_ONLY, 0x00ab_cdef, None, &[7; 16]);
    seal_with_ident(&fresh, &mut p, 0x1234);
    fresh.send(&p);
    // The softrdma-like sender: 80 packets verified with identification 0 first.
    for _ in 0..80 {
        let mut p = peer.packet(Opcode::RC_SEND_ONLY, 0x00ab_cdef, None, &[7; 16]);
        peer.seal(&mut p);
        peer.send(&p);
    }
    let mut p = peer.packet(Opcode::RC_SEND_ONLY, 0x00ab_cdef, None, &[7; 16]);
    seal_with_ident(&peer, &mut p, 0x1234);
    peer.send(&p);
    // Until the device has read all 82 (a hang guard, not a speed check).
    let t0 = Instant::now();
    let c1 = loop {
        let c = t.ctx.counters();
        if c.unknown_qp + c.icrc_errors - c0.unknown_qp - c0.icrc_errors >= 82 {
            break c;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{c:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        c1.icrc_ident_solved - c0.icrc_ident_solved,
        1,
        "the fresh sender's"
    );
    assert_eq!(c1.unknown_qp - c0.unknown_qp, 81);
    assert_eq!(
        c1.icrc_errors - c0.icrc_errors,
        1,
        "the peer's packet with a solved identification"
    );
}
