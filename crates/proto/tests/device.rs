//! The sans-IO device ([`softrdma_proto::device`]): its ICRC check in the simulated network
//! (corruption caught and recovered), routing by QP number, its timer table, QP 1 framing
//! with two connection managers, the held-ACK policy, and its seals and checks against the
//! golden captures.

#[path = "common/sim_harness.rs"]
mod harness;

use harness::*;
use softrdma_proto::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnectRequest};
use softrdma_proto::device::{
    frame_mad, unframe_mad, Device, DeviceConfig, DropReason, Received, Receiver, Sealer,
    TimerTable, GSI_QPN, MAD_PACKET_LEN,
};
use softrdma_proto::transport::{RecvRequest, SendOp, SendRequest, Sge};
use softrdma_proto::{Mtu, QpType};
use softrdma_wire::cm::TransportServiceType;
use softrdma_wire::cma::{service_id, PortSpace};
use softrdma_wire::opcode::Opcode;
use softrdma_wire::pcap::PcapReader;
use softrdma_wire::{bth, deth, ip, mad, roce};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const ALL_RC: &[OpKind] = &[
    OpKind::Send,
    OpKind::SendImm,
    OpKind::Write,
    OpKind::WriteImm,
    OpKind::Read,
    OpKind::Faa,
    OpKind::Cas,
];

// ------------------------------------------------------------------------------------------
// The ICRC check in the simulated network
// ------------------------------------------------------------------------------------------

#[test]
fn corruption_is_caught_by_the_device_and_recovered_by_retransmission() {
    for seed in [1u64, 2, 3, 4] {
        let net = NetCfg {
            corrupt: 0.1,
            ..NetCfg::perfect()
        };
        let mut sim = Sim::new(QpType::Rc, Mtu::Mtu1024, net, seed);
        let mut rng = Rng(seed);
        let ops = [
            gen_ops(&mut rng, 40, 1024, ALL_RC),
            gen_ops(&mut rng, 40, 1024, ALL_RC),
        ];
        let exp = Expect::setup(&mut sim, &ops, &mut rng);
        assert!(
            sim.run(Duration::from_secs(3600), |s| exp.done(s)),
            "seed {seed}"
        );
        exp.verify(&sim, &format!("seed {seed}"));
        // Let what is still on the wire arrive.
        sim.run(Duration::from_secs(3600), |s| s.inflight() == 0);
        assert!(sim.corrupted > 0, "seed {seed}: nothing corrupted");
        // Every corrupted datagram was dropped by the receiving device (a flipped bit in the
        // headers may make it malformed, anywhere else the ICRC no longer matches), but for
        // a flip in BTH byte 4, which the ICRC leaves out (FECN/BECN are set on the way).
        let dropped: u64 = sim
            .devices
            .iter()
            .map(|d| d.counters().icrc_errors + d.counters().malformed)
            .sum();
        assert_eq!(
            dropped,
            sim.corrupted - sim.corrupted_variant,
            "seed {seed}"
        );
        assert!(sim.corrupted_drops() > 0, "seed {seed}");
        // ... none reached a QP as a packet it could not parse ...
        for n in &sim.nodes {
            assert_eq!(n.qp.stats().malformed, 0, "seed {seed}");
        }
        // ... and the lost packets came again.
        let resent: u64 = sim
            .nodes
            .iter()
            .map(|n| n.qp.stats().retransmitted_packets)
            .sum();
        assert!(resent > 0, "seed {seed}");
        let rx: u64 = sim.devices.iter().map(|d| d.counters().rx_packets).sum();
        let qp_rx: u64 = sim.nodes.iter().map(|n| n.qp.stats().rx_packets).sum();
        assert_eq!(rx, qp_rx, "seed {seed}: every good packet reached its QP");
    }
}

/// An RC SEND_ONLY to `qpn` with `payload`, ICRC not yet computed.
fn send_only(qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    let repr = roce::Repr {
        bth: bth::Repr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: false,
            mig_req: false,
            pad_count: 0,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: qpn,
            ack_req: true,
            psn,
        },
        payload_len: payload.len(),
        ..Default::default()
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce::Packet::new_unchecked(&mut b[..]), payload)
        .unwrap();
    b
}

fn two_devices() -> (Device<u32>, Device<u32>) {
    (
        Device::new(DeviceConfig::new(node_addr(0).ip())),
        Device::new(DeviceConfig::new(node_addr(1).ip())),
    )
}

#[test]
fn unknown_qpn_is_dropped_and_counted() {
    let (mut a, mut b) = two_devices();
    let now = Instant::now();
    let (from, to) = (node_addr(0), node_addr(1).ip());
    let mut p = send_only(0x33, 5, b"hello");
    a.seal(to, &mut p).unwrap();
    assert_eq!(
        b.handle_datagram(now, from, to, &p),
        Received::Dropped(DropReason::UnknownQp)
    );
    let c = *b.counters();
    assert_eq!((c.rx_packets, c.unknown_qp, c.icrc_errors), (1, 1, 0));
    // Registered, the same bytes go to its handle with the GRH of the datagram.
    assert_eq!(b.register(0x33, 7), None);
    match b.handle_datagram(now, from, to, &p) {
        Received::Qp {
            qpn,
            handle,
            packet,
            meta,
        } => {
            assert_eq!((qpn, handle, packet), (0x33, 7, &p[..]));
            assert_eq!(meta.grh[..20], [0; 20]);
            let h = ip::Ipv4Packet::new_unchecked(&meta.grh[20..]);
            assert!(h.verify_checksum());
            assert_eq!(
                (IpAddr::V4(h.src_addr()), IpAddr::V4(h.dst_addr())),
                (from.ip(), to)
            );
            assert_eq!(usize::from(h.total_len()), 20 + 8 + p.len());
        }
        other => panic!("expected the QP, got {other:?}"),
    }
    // A timer of a QP that goes away goes with it.
    b.set_timer(0x33, Some(now));
    assert_eq!(b.unregister(0x33), Some(7));
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(
        b.handle_datagram(now, from, to, &p),
        Received::Dropped(DropReason::UnknownQp)
    );
    // A QP number is 24 bits: one registered with more is registered as its low 24 (0x34);
    // 0x35 stays unknown.
    b.register(0x0100_0034, 1);
    let mut q = send_only(0x35, 6, b"x");
    a.seal(to, &mut q).unwrap();
    assert_eq!(
        b.handle_datagram(now, from, to, &q),
        Received::Dropped(DropReason::UnknownQp)
    );
    let c = *b.counters();
    assert_eq!((c.rx_packets, c.unknown_qp), (4, 3));
    // Sealed for another device, or from another port: the ICRC does not match.
    let mut r = send_only(0x34, 7, b"y");
    a.seal(node_addr(0).ip(), &mut r).unwrap();
    assert_eq!(
        b.handle_datagram(now, from, to, &r),
        Received::Dropped(DropReason::Icrc)
    );
    let other_port = SocketAddr::new(from.ip(), 50000);
    a.seal(to, &mut r).unwrap();
    assert_eq!(
        b.handle_datagram(now, other_port, to, &r),
        Received::Dropped(DropReason::Icrc)
    );
    assert!(matches!(
        b.handle_datagram(now, from, to, &r),
        Received::Qp { qpn: 0x34, .. }
    ));
    // Empty, short, and CNP datagrams.
    assert_eq!(b.handle_datagram(now, from, to, &[]), Received::Probe);
    assert_eq!(
        b.handle_datagram(now, from, to, &r[..10]),
        Received::Dropped(DropReason::Malformed)
    );
    let mut cnp = vec![0u8; 32];
    cnp[0] = Opcode::CNP.0;
    a.seal(to, &mut cnp).unwrap();
    assert_eq!(
        b.handle_datagram(now, from, to, &cnp),
        Received::Dropped(DropReason::Cnp)
    );
    cnp[20] ^= 1;
    assert_eq!(
        b.handle_datagram(now, from, to, &cnp),
        Received::Dropped(DropReason::Icrc)
    );
    let c = *b.counters();
    assert_eq!(
        (
            c.probes_received,
            c.malformed,
            c.cnp_received,
            c.icrc_errors
        ),
        (1, 1, 1, 3)
    );
    assert_eq!(b.last_receive(), Some(now));
    // Sealing refuses what is not a packet.
    assert!(a.seal(to, &mut [0u8; 15]).is_err());
    assert_eq!(a.counters().seal_errors, 1);
}

#[test]
fn ipv6_devices_seal_check_and_build_an_ipv6_grh() {
    let a_ip: IpAddr = "fd00::1".parse().unwrap();
    let b_ip: IpAddr = "fd00::2".parse().unwrap();
    let mut a: Device<u32> = Device::new(DeviceConfig::new(a_ip));
    let mut b: Device<u32> = Device::new(DeviceConfig::new(b_ip));
    b.register(0x22, 5);
    let mut p = send_only(0x22, 9, &[7; 33]);
    a.seal(b_ip, &mut p).unwrap();
    // A sealer of its own (a sending thread's) seals the same bytes.
    let mut q = p.clone();
    let n = q.len();
    q[n - 4..].fill(0);
    Sealer::new(a_ip, 4791, 16).seal(b_ip, &mut q).unwrap();
    assert_eq!(p, q);
    let from = SocketAddr::new(a_ip, 4791);
    match b.handle_datagram(Instant::now(), from, b_ip, &p) {
        Received::Qp { handle, meta, .. } => {
            assert_eq!(handle, 5);
            let h = ip::Ipv6Packet::new_unchecked(&meta.grh[..]);
            assert_eq!(meta.grh[0] >> 4, 6);
            assert_eq!(
                (IpAddr::V6(h.src_addr()), IpAddr::V6(h.dst_addr())),
                (a_ip, b_ip)
            );
            assert_eq!(usize::from(h.payload_len()), 8 + p.len());
        }
        other => panic!("expected the QP, got {other:?}"),
    }
    // Sealed for IPv4 addresses, it fails the IPv6 check.
    let mut v4 = send_only(0x22, 10, b"v4");
    Sealer::new(node_addr(0).ip(), 4791, 16)
        .seal(node_addr(1).ip(), &mut v4)
        .unwrap();
    assert_eq!(
        b.handle_datagram(Instant::now(), from, b_ip, &v4),
        Received::Dropped(DropReason::Icrc)
    );
}

#[test]
fn hostile_datagrams_never_panic_and_are_all_counted() {
    let (mut a, mut b) = two_devices();
    b.register(0x22, 0);
    let now = Instant::now();
    let mut rng = Rng(9);
    let to = node_addr(1).ip();
    let base = send_only(0x22, 1, &[0xab; 100]);
    let n = 20_000u64;
    for round in 0..n {
        let mut p = base.clone();
        for _ in 0..rng.below(4) {
            let i = rng.below(p.len() as u64) as usize;
            p[i] = rng.next_u64() as u8;
        }
        if round % 3 == 0 {
            a.seal(to, &mut p).ok();
        }
        if round % 7 == 0 {
            p.truncate(rng.below(p.len() as u64 + 1) as usize);
        }
        if round % 11 == 0 {
            p = (0..rng.below(80)).map(|_| rng.next_u64() as u8).collect();
        }
        let from = SocketAddr::new(node_addr(0).ip(), 4791 + (round % 5) as u16);
        let _ = b.handle_datagram(now, from, to, &p);
    }
    let c = b.counters();
    assert_eq!(
        c.probes_received + c.malformed + c.icrc_errors + c.cnp_received + c.rx_packets,
        n
    );
    assert!(c.rx_packets > 0 && c.icrc_errors > 0 && c.malformed > 0);
    assert_eq!(b.rx_flow_count(), 5);
}

// ------------------------------------------------------------------------------------------
// Timers
// ------------------------------------------------------------------------------------------

#[test]
fn timers_fire_in_deadline_order() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut d: Device<()> = Device::new(DeviceConfig::new(node_addr(0).ip()));
    d.set_timer(0x10, Some(ms(30)));
    d.set_timer(0x11, Some(ms(10)));
    d.set_timer(GSI_QPN, Some(ms(20)));
    d.set_timer(0x12, Some(ms(5)));
    d.set_timer(0x13, Some(ms(10)));
    // Replaced, and cleared: their old deadlines do not fire.
    d.set_timer(0x12, Some(ms(40)));
    d.set_timer(0x10, None);
    assert_eq!(d.poll_timeout(), Some(ms(10)));
    let mut due = Vec::new();
    assert_eq!(d.handle_timeout(ms(9), &mut due), 0);
    assert_eq!(d.handle_timeout(ms(25), &mut due), 3);
    // Earliest first, equal deadlines by QP number; QP 1 (the CM) among them.
    assert_eq!(due, [0x11, 0x13, GSI_QPN]);
    assert_eq!(d.poll_timeout(), Some(ms(40)));
    // Calling again, early or late, fires nothing twice.
    due.clear();
    assert_eq!(d.handle_timeout(ms(25), &mut due), 0);
    assert_eq!(d.handle_timeout(ms(100), &mut due), 1);
    assert_eq!(due, [0x12]);
    assert_eq!(d.poll_timeout(), None);
    assert!(d.timers().is_empty());
}

#[test]
fn timer_table_matches_a_model_under_random_use() {
    let t0 = Instant::now();
    let mut rng = Rng(4);
    let mut t = TimerTable::new();
    let mut model: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut now = t0;
    let mut due = Vec::new();
    for _ in 0..50_000 {
        let qpn = rng.below(64) as u32;
        match rng.below(10) {
            0..=5 => {
                let d = now + Duration::from_micros(rng.below(1000));
                t.set(qpn, Some(d));
                model.insert(qpn, d);
            }
            6 => {
                t.set(qpn, None);
                model.remove(&qpn);
            }
            _ => {
                now += Duration::from_micros(rng.below(300));
                due.clear();
                t.handle_timeout(now, &mut due);
                let mut want: Vec<(Instant, u32)> = model
                    .iter()
                    .filter(|(_, d)| **d <= now)
                    .map(|(q, d)| (*d, *q))
                    .collect();
                want.sort();
                model.retain(|_, d| *d > now);
                let want: Vec<u32> = want.into_iter().map(|(_, q)| q).collect();
                assert_eq!(due, want);
            }
        }
        assert_eq!(t.poll_timeout(), model.values().min().copied());
        assert_eq!(t.len(), model.len());
        assert_eq!(t.get(qpn), model.get(&qpn).copied());
    }
}

// ------------------------------------------------------------------------------------------
// QP 1
// ------------------------------------------------------------------------------------------

#[test]
fn qp1_framing_round_trip() {
    let (mut a, mut b) = two_devices();
    let now = Instant::now();
    let (from, to) = (node_addr(0), node_addr(1).ip());
    let mut rng = Rng(3);
    let mut m = [0u8; mad::MAD_SIZE];
    rng.fill(&mut m);
    let psn0 = a.gsi_psn();
    let mut buf = [0u8; 600];
    let len = a.frame_mad(to, &m, &mut buf).unwrap();
    assert_eq!(len, MAD_PACKET_LEN);
    assert_eq!(a.gsi_psn(), psn0 + 1);
    // A UD SEND_ONLY from QP 1 to QP 1, default P_Key, Q_Key 0x80010000, the MAD as payload.
    let p = roce::Packet::new_checked(&buf[..len]).unwrap();
    let r = roce::Repr::parse(&p).unwrap();
    assert_eq!(r.bth.opcode, Opcode::UD_SEND_ONLY);
    assert_eq!((r.bth.dest_qp, r.bth.pkey, r.bth.psn), (1, 0xffff, psn0));
    assert_eq!(
        r.deth,
        Some(deth::Repr {
            qkey: 0x8001_0000,
            src_qp: 1
        })
    );
    assert_eq!(p.payload(), &m[..]);
    assert_eq!(unframe_mad(&buf[..len]), Some(&m[..]));
    match b.handle_datagram(now, from, to, &buf[..len]) {
        Received::Mad { src, mad } => assert_eq!((src, mad), (from.ip(), &m[..])),
        other => panic!("expected a MAD, got {other:?}"),
    }
    // What QP 1 does not take: another Q_Key, another partition, an RC SEND, a short MAD.
    let bad = |f: &dyn Fn(&mut [u8])| {
        let mut v = buf[..len].to_vec();
        f(&mut v);
        v
    };
    // The headers of a MAD packet followed by 252 bytes, not 256.
    let short = {
        let mut full = vec![0u8; MAD_PACKET_LEN];
        frame_mad(&mut full, 0, &m).unwrap();
        let mut v = full[..MAD_PACKET_LEN - 4].to_vec();
        v[MAD_PACKET_LEN - 8..].fill(0);
        v
    };
    let mut rc = send_only(GSI_QPN, 1, &m);
    for mut v in [
        bad(&|v| v[15] ^= 1),         // Q_Key
        bad(&|v| v[2..4].fill(0x12)), // P_Key
        std::mem::take(&mut rc),      // RC SEND
        short,                        // 252-byte payload
    ] {
        a.seal(to, &mut v).unwrap();
        assert_eq!(
            b.handle_datagram(now, from, to, &v),
            Received::Dropped(DropReason::BadMad)
        );
    }
    assert_eq!(b.counters().gsi_dropped, 4);
    // Framing refuses what does not fit.
    assert_eq!(a.frame_mad(to, &m[..255], &mut buf), None);
    assert_eq!(a.frame_mad(to, &m, &mut buf[..MAD_PACKET_LEN - 1]), None);
}

fn connect_request(dst: IpAddr) -> ConnectRequest {
    ConnectRequest {
        dst,
        service_id: service_id(PortSpace::Tcp, 7471),
        local_qpn: 0x123,
        starting_psn: 0x456,
        transport: TransportServiceType::Rc,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        path_mtu: 5,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        sl: 0,
        packet_rate: 0,
        private_data: b"hello".to_vec(),
    }
}

/// Moves every MAD each CM wants sent through its device, the wire (as bytes), and the other
/// device into the other CM; returns the packets moved.
fn exchange(devs: &mut [Device<u32>; 2], cms: &mut [Cm; 2], now: Instant) -> usize {
    let mut moved = 0;
    let mut buf = [0u8; 512];
    loop {
        let mut any = false;
        for i in 0..2 {
            while let Some((len, dst)) = devs[i].poll_cm_transmit(&mut cms[i], &mut buf) {
                assert_eq!(dst, devs[1 - i].local());
                let from = SocketAddr::new(devs[i].local(), 4791);
                match devs[1 - i].handle_datagram(now, from, dst, &buf[..len]) {
                    Received::Mad { src, mad } => cms[1 - i].handle_mad(now, src, mad),
                    other => panic!("expected a MAD, got {other:?}"),
                }
                moved += 1;
                any = true;
            }
        }
        if !any {
            return moved;
        }
    }
}

#[test]
fn two_cms_connect_and_disconnect_through_their_devices() {
    let now = Instant::now();
    let ips = [node_addr(0).ip(), node_addr(1).ip()];
    let mut devs = [
        Device::new(DeviceConfig {
            gsi_psn: 0xff_fffe,
            ..DeviceConfig::new(ips[0])
        }),
        Device::new(DeviceConfig::new(ips[1])),
    ];
    let mut cms = [
        Cm::new(CmConfig::new(ips[0], 0x1111, 1)),
        Cm::new(CmConfig::new(ips[1], 0x2222, 2)),
    ];
    cms[1].listen(service_id(PortSpace::Tcp, 7471)).unwrap();
    let id = cms[0].connect(now, connect_request(ips[1])).unwrap();
    // The CM's deadline goes into the device's timer table under QP 1.
    devs[0].set_timer(GSI_QPN, cms[0].poll_timeout());
    assert!(devs[0].poll_timeout().is_some());
    assert_eq!(exchange(&mut devs, &mut cms, now), 1);
    let Some(CmEvent::ReqReceived { id: sid, src, req }) = cms[1].poll_event() else {
        panic!("expected a REQ")
    };
    assert_eq!(
        (src, req.remote_qpn, req.starting_psn),
        (ips[0], 0x123, 0x456)
    );
    cms[1]
        .accept(
            now,
            sid,
            AcceptParams {
                local_qpn: 0x789,
                starting_psn: 0xabc,
                responder_resources: 4,
                initiator_depth: 4,
                rnr_retry_count: 7,
                srq: false,
                flow_control: true,
                private_data: b"welcome".to_vec(),
            },
        )
        .unwrap();
    assert_eq!(exchange(&mut devs, &mut cms, now), 1);
    assert!(matches!(cms[0].poll_event(), Some(CmEvent::RepReceived { id: x, .. }) if x == id));
    cms[0].send_rtu(now, id, &[]).unwrap();
    cms[0].disconnect(now, id, &[]).unwrap();
    assert_eq!(exchange(&mut devs, &mut cms, now), 3);
    assert!(matches!(
        cms[1].poll_event(),
        Some(CmEvent::Established { .. })
    ));
    assert!(matches!(
        cms[1].poll_event(),
        Some(CmEvent::DisconnectRequested { .. })
    ));
    assert!(matches!(cms[0].poll_event(), Some(CmEvent::Disconnected { id: x }) if x == id));
    // QP 1's PSN wrapped at 24 bits; every packet was counted, none dropped.
    assert_eq!(devs[0].gsi_psn(), 1);
    assert_eq!(devs[0].counters().sealed_packets, 3);
    for d in &devs {
        let c = d.counters();
        assert_eq!(
            c.icrc_errors + c.gsi_dropped + c.unknown_qp + c.malformed,
            0
        );
    }
    assert_eq!(devs[1].counters().rx_packets, 3);
    // A buffer too short for a MAD packet leaves the MAD queued and the PSN where it was.
    cms[0].connect(now, connect_request(ips[1])).unwrap();
    let mut short = [0u8; MAD_PACKET_LEN - 1];
    assert_eq!(devs[0].poll_cm_transmit(&mut cms[0], &mut short), None);
    assert_eq!(devs[0].gsi_psn(), 1);
    let mut buf = [0u8; MAD_PACKET_LEN];
    assert_eq!(
        devs[0].poll_cm_transmit(&mut cms[0], &mut buf),
        Some((MAD_PACKET_LEN, ips[1]))
    );
    assert_eq!(devs[0].gsi_psn(), 2);
}

/// Seals `pkt` as sent from `src` to `dst` port 4791 by another stack: an IPv4 header with
/// identification `ident` (softrdma peers send 0).
fn seal_with_ident(pkt: &mut [u8], src: SocketAddr, dst: IpAddr, ident: u16) {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst) else {
        panic!("IPv4 only")
    };
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[4..6].copy_from_slice(&ident.to_be_bytes());
    h[6] = 0x40;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&s.octets());
    h[16..20].copy_from_slice(&d.octets());
    let mut u = [0u8; 8];
    u[..2].copy_from_slice(&src.port().to_be_bytes());
    u[2..4].copy_from_slice(&4791u16.to_be_bytes());
    let prefix = softrdma_wire::icrc::IcrcPrefix::from_headers(&h, &u).unwrap();
    let n = pkt.len();
    let crc = prefix.compute(&pkt[..n - 4]).unwrap();
    pkt[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn another_stacks_identification_is_solved_but_a_softrdma_peers_only_below_gso_numbers() {
    let to = node_addr(1).ip();
    let now = Instant::now();
    let mut b: Device<u32> = Device::new(DeviceConfig::new(to));
    b.register(0x22, 0);
    let rxe = SocketAddr::new(node_addr(0).ip(), 49152);
    let mut p = send_only(0x22, 1, b"from rxe");
    seal_with_ident(&mut p, rxe, to, 0x1234);
    assert!(matches!(
        b.handle_datagram(now, rxe, to, &p),
        Received::Qp { qpn: 0x22, .. }
    ));
    assert_eq!(b.last_ident(), 0x1234);
    assert_eq!(b.counters().icrc_ident_solved, 1);
    // A sender whose first 64 packets all verified with identification 0 is a softrdma
    // peer: from then on its packets get the full 32-bit check, no solving.
    let peer = SocketAddr::new(node_addr(0).ip(), 4791);
    let mut z = send_only(0x22, 2, b"from softrdma");
    seal_with_ident(&mut z, peer, to, 0);
    let mut sealed = z.clone();
    Device::<()>::new(DeviceConfig::new(peer.ip()))
        .seal(to, &mut sealed)
        .unwrap();
    assert_eq!(sealed, z, "a device seals with identification 0");
    for _ in 0..softrdma_proto::device::flows::ZERO_IDENT_PEER {
        assert!(matches!(
            b.handle_datagram(now, peer, to, &z),
            Received::Qp { .. }
        ));
        assert_eq!(b.last_ident(), 0);
    }
    let mut q = send_only(0x22, 3, b"odd one");
    seal_with_ident(&mut q, peer, to, 0x1234);
    assert_eq!(
        b.handle_datagram(now, peer, to, &q),
        Received::Dropped(DropReason::Icrc)
    );
    assert_eq!(b.counters().icrc_ident_solved, 1);
    // ... except for the numbers the kernel gives the datagrams of one UDP GSO message (a
    // softrdma peer's super-datagrams between hosts), which leave it a softrdma peer.
    let gso = softrdma_proto::device::flows::GSO_IDENTS;
    for ident in [1, 2, gso - 1] {
        let mut n = send_only(0x22, 4, b"numbered");
        seal_with_ident(&mut n, peer, to, ident);
        assert!(matches!(
            b.handle_datagram(now, peer, to, &n),
            Received::Qp { .. }
        ));
        assert_eq!(b.last_ident(), ident);
    }
    assert_eq!(b.counters().icrc_ident_solved, 4);
    for ident in [gso, 0x1234] {
        let mut n = send_only(0x22, 5, b"not numbered");
        seal_with_ident(&mut n, peer, to, ident);
        assert_eq!(
            b.handle_datagram(now, peer, to, &n),
            Received::Dropped(DropReason::Icrc)
        );
    }
    assert_eq!(b.counters().icrc_ident_solved, 4);
    // The same packet from a sender not known as a softrdma peer is solved.
    let other = SocketAddr::new(node_addr(0).ip(), 49153);
    seal_with_ident(&mut q, other, to, 0x1234);
    assert!(matches!(
        b.handle_datagram(now, other, to, &q),
        Received::Qp { .. }
    ));
    assert_eq!(b.counters().icrc_ident_solved, 5);
}

// ------------------------------------------------------------------------------------------
// Held ACKs
// ------------------------------------------------------------------------------------------

#[test]
fn held_ack_policy_holds_only_for_a_busy_polling_application_thread() {
    let qp_sim = || {
        let mut sim = Sim::new(QpType::Rc, Mtu::Mtu1024, NetCfg::perfect(), 1);
        let base = sim.nodes[1].env.add_region(RECV, 4096, LOCAL_WRITE);
        sim.nodes[0].env.add_region(SRC, 4096, LOCAL_WRITE);
        sim.nodes[1].env.rq.push_back(RecvRequest {
            wr_id: 1,
            sges: [Sge {
                addr: base,
                length: 4096,
                lkey: RECV,
            }]
            .into(),
        });
        let addr = sim.nodes[0].env.base(SRC);
        sim.post(
            0,
            SendRequest {
                wr_id: 9,
                op: SendOp::Send,
                sges: [Sge {
                    addr,
                    length: 100,
                    lkey: SRC,
                }]
                .into(),
                inline: None,
                signaled: true,
                solicited: false,
                fence: false,
                ud: None,
            },
        );
        // Node 0's SEND, sealed by its device, received through node 1's.
        let now = sim.now;
        let mut buf = vec![0u8; 4200];
        let n = &mut sim.nodes[0];
        let t = n.qp.poll_transmit(now, &mut buf, &mut n.env).unwrap();
        sim.devices[0]
            .seal(node_addr(1).ip(), &mut buf[..t.len])
            .unwrap();
        sim.deliver(1, &buf[..t.len]);
        (sim, buf)
    };
    for (handoff, receiver, held) in [
        (true, Receiver::AppPoll { busy: true }, true),
        (true, Receiver::AppPoll { busy: false }, false),
        (true, Receiver::Progress, false),
        (false, Receiver::AppPoll { busy: true }, false),
    ] {
        let (mut sim, mut buf) = qp_sim();
        let mut dev: Device<usize> = Device::new(DeviceConfig {
            hold_acks: handoff,
            ..DeviceConfig::new(node_addr(1).ip())
        });
        assert_eq!(dev.acks().should_hold(receiver), held);
        let now = sim.now;
        let n = &mut sim.nodes[1];
        let hold = dev.acks().begin_drive(&mut n.qp, receiver);
        let sent = std::iter::from_fn(|| n.qp.poll_transmit(now, &mut buf, &mut n.env)).count();
        assert_eq!(dev.acks_mut().end_drive(0x22, &mut n.qp, hold), held);
        assert_eq!(sent, usize::from(!held), "{handoff} {receiver:?}");
        assert_eq!(dev.acks().any(), held);
        if held {
            // The ACK is still owed: taken at the next empty poll, it goes then.
            assert!(n.qp.has_held_ack());
            let mut qpns = Vec::new();
            assert_eq!(dev.acks_mut().take_all(&mut qpns), 1);
            assert_eq!(qpns, [0x22]);
            assert!(!dev.acks().any());
            let t = n.qp.poll_transmit(now, &mut buf, &mut n.env).unwrap();
            let p = roce::Packet::new_checked(&buf[..t.len]).unwrap();
            assert_eq!(p.opcode(), Opcode::RC_ACKNOWLEDGE);
            // Noted again, a QP's own release (post_send, RESET/ERR, destroy) forgets it.
            dev.acks_mut().note(0x22);
            dev.acks_mut().note(0x22);
            assert!(dev.acks_mut().release(0x22));
            assert!(!dev.acks_mut().release(0x22));
            dev.acks_mut().note(0x22);
            dev.register(0x22, 1);
            dev.unregister(0x22);
            assert!(!dev.acks().any());
        }
    }
}

// ------------------------------------------------------------------------------------------
// Golden captures
// ------------------------------------------------------------------------------------------

fn golden(name: &str) -> Vec<u8> {
    let dir = match std::env::var_os("SOFTRDMA_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    let path = dir.join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "golden capture {} is missing ({e}); set SOFTRDMA_GOLDEN_DIR to the directory \
             holding the shared golden pcaps (normally ../shared/golden from the project root)",
            path.display()
        )
    })
}

/// The UDP datagrams of a capture: (source, destination IP, IPv4 identification, payload).
fn datagrams(name: &str) -> Vec<(SocketAddr, IpAddr, u16, Vec<u8>)> {
    let data = golden(name);
    PcapReader::new(&data)
        .unwrap()
        .records()
        .map(|r| {
            let r = r.unwrap();
            let d = ip::parse_ethernet_udp(r.data).unwrap();
            let ident = match d.src_addr {
                IpAddr::V4(_) => ip::Ipv4Packet::new_unchecked(d.ip_header).ident(),
                IpAddr::V6(_) => 0,
            };
            (
                SocketAddr::new(d.src_addr, d.src_port),
                d.dst_addr,
                ident,
                d.payload.to_vec(),
            )
        })
        .collect()
}

/// A device at `src` (its port as captured) whose first MAD PSN is `gsi_psn`.
fn device_at(src: SocketAddr, gsi_psn: u32) -> Device<()> {
    Device::new(DeviceConfig {
        port: src.port(),
        gsi_psn,
        ..DeviceConfig::new(src.ip())
    })
}

#[test]
fn sealed_packets_match_the_synthetic_capture_byte_for_byte() {
    let frames = datagrams("synthetic_mixed_one_bad_icrc.pcap");
    assert_eq!(frames.len(), 11);
    let (last, good) = frames.split_last().unwrap();
    for (i, (src, dst, ident, pkt)) in good.iter().enumerate() {
        assert_eq!(*ident, 0, "frame {}", i + 1);
        let mut dev = device_at(*src, 0);
        let mut mine = pkt.clone();
        let n = mine.len();
        mine[n - 4..].fill(0);
        dev.seal(*dst, &mut mine).unwrap();
        assert_eq!(&mine, pkt, "frame {}", i + 1);
        // ... and the receiving device takes it.
        let mut rx: Device<()> = Device::new(DeviceConfig::new(*dst));
        let got = rx.handle_datagram(Instant::now(), *src, *dst, pkt);
        assert!(
            matches!(
                got,
                Received::Mad { .. } | Received::Dropped(DropReason::UnknownQp)
            ),
            "frame {}: {got:?}",
            i + 1
        );
    }
    // The last frame's ICRC is wrong on purpose: sealing it changes it, and the receiving
    // device drops it.
    let (src, dst, _, pkt) = last;
    let mut mine = pkt.clone();
    device_at(*src, 0).seal(*dst, &mut mine).unwrap();
    assert_ne!(&mine, pkt);
    let mut rx: Device<()> = Device::new(DeviceConfig::new(*dst));
    assert_eq!(
        rx.handle_datagram(Instant::now(), *src, *dst, pkt),
        Received::Dropped(DropReason::Icrc)
    );
    assert_eq!(rx.counters().icrc_errors, 1);
}

#[test]
fn framed_mads_match_the_synthetic_cm_capture_byte_for_byte() {
    let frames = datagrams("synthetic_cm_messages.pcap");
    assert_eq!(frames.len(), 8);
    for (i, (src, dst, _, pkt)) in frames.iter().enumerate() {
        let psn = roce::Packet::new_checked(&pkt[..]).unwrap().bth().psn();
        let mad = unframe_mad(pkt).unwrap_or_else(|| panic!("frame {}: no MAD", i + 1));
        let mut dev = device_at(*src, psn);
        let mut buf = vec![0u8; MAD_PACKET_LEN];
        let len = dev.frame_mad(*dst, mad, &mut buf).unwrap();
        assert_eq!(&buf[..len], &pkt[..], "frame {}", i + 1);
    }
}

#[test]
fn every_rxe_frame_passes_the_device_check() {
    let frames = datagrams("rxe_two_vm.pcap");
    assert_eq!(frames.len(), 3366);
    let mut devs: BTreeMap<IpAddr, Device<()>> = BTreeMap::new();
    let (mut mads, mut others, mut nonzero_ident) = (0, 0, 0);
    for (i, (src, dst, ident, pkt)) in frames.iter().enumerate() {
        let dev = devs
            .entry(*dst)
            .or_insert_with(|| Device::new(DeviceConfig::new(*dst)));
        match dev.handle_datagram(Instant::now(), *src, *dst, pkt) {
            Received::Mad { .. } => mads += 1,
            Received::Dropped(DropReason::UnknownQp) => others += 1,
            other => panic!("frame {}: {other:?}", i + 1),
        }
        nonzero_ident += usize::from(*ident != 0);
    }
    // 4 × (REQ, REP, RTU, DREQ, DREP) and a SIDR_REQ/SIDR_REP pair.
    assert_eq!(mads, 22);
    assert_eq!(mads + others, frames.len());
    let solved: u64 = devs.values().map(|d| d.counters().icrc_ident_solved).sum();
    assert_eq!(solved as usize, nonzero_ident);
    assert!(solved > 0);
}
