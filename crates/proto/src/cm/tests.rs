//! Unit tests: byte-exact comparison with the golden Linux captures, timer arithmetic, and
//! the state machine driven by hand.

use super::*;
use softrdma_wire::cm::{Message, MessageRejected, RejectReason, SidrStatus, TransportServiceType};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};
use softrdma_wire::mad;
use softrdma_wire::pcap::PcapReader;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const RXE: &str = "rxe_two_vm.pcap";
const NOLISTEN: &str = "rxe_cm_req_no_listener.pcap";

fn golden_dir() -> PathBuf {
    let dir = match std::env::var_os("SOFTRDMA_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    assert!(
        dir.join(RXE).is_file(),
        "golden captures not found in {} (set SOFTRDMA_GOLDEN_DIR)",
        dir.display()
    );
    dir
}

/// The MAD of pcap frame `frame` (1-based) of `file`: Ethernet + IPv4 + UDP + BTH + DETH.
fn golden_mad(file: &str, frame: usize) -> [u8; 256] {
    let bytes = std::fs::read(golden_dir().join(file)).unwrap();
    let reader = PcapReader::new(&bytes).unwrap();
    let rec = reader.records().nth(frame - 1).unwrap().unwrap();
    let d = rec.data;
    assert_eq!(&d[12..14], &[0x08, 0x00], "IPv4 frame");
    let ihl = usize::from(d[14] & 0x0f) * 4;
    let at = 14 + ihl + 8 + 12 + 8;
    let mut m = [0u8; 256];
    m.copy_from_slice(&d[at..at + 256]);
    m
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn cm(addr: IpAddr, guid: u64, seed: u64) -> Cm {
    Cm::new(CmConfig::new(addr, guid, seed))
}

fn drain(cm: &mut Cm) -> Vec<(IpAddr, [u8; 256])> {
    std::iter::from_fn(|| cm.poll_transmit()).collect()
}

fn events(cm: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

fn tid_of(m: &[u8; 256]) -> u64 {
    u64::from_be_bytes(m[8..16].try_into().unwrap())
}

/// The REQ of rxe_two_vm.pcap frame 361, field values as `golden_cm.rs` decodes them.
fn frame361_request() -> ConnectRequest {
    let mut pd = vec![0u8; cma::CMA_HDR_LEN];
    CmaHeaderRepr::new(v4(198, 18, 0, 3), 0xa8d7, v4(198, 18, 0, 2))
        .emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
    ConnectRequest {
        dst: v4(198, 18, 0, 2),
        service_id: 0x0000_0000_0106_1c06,
        local_qpn: 0x24,
        starting_psn: 0x72_e4d5,
        transport: TransportServiceType::Rc,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: false,
        path_mtu: 3,
        traffic_class: 0,
        hop_limit: 0x40,
        flow_label: 0x48e0f,
        sl: 0,
        packet_rate: 0,
        private_data: pd,
    }
}

#[test]
fn ack_timeout_and_gid() {
    assert_eq!(cm_ack_timeout(15, 18), 19);
    assert_eq!(cm_ack_timeout(15, 16), 17);
    assert_eq!(cm_ack_timeout(20, 10), 20);
    assert_eq!(cm_ack_timeout(12, 10), 13);
    assert_eq!(cm_ack_timeout(0, 31), 31);
    assert_eq!(
        ip_to_gid(v4(198, 18, 0, 3)).segments(),
        [0, 0, 0, 0, 0, 0xffff, 0xc612, 0x0003]
    );
}

/// An emitted REQ equals rxe's frame 361 except for the random comm ID and the TID.
#[test]
fn golden_req_matches_rxe_frame_361() {
    let golden = golden_mad(RXE, 361);
    let mut a = cm(v4(198, 18, 0, 3), 0x5054_00ff_fe00_0003, 7);
    let now = Instant::now();
    let id = a.connect(now, frame361_request()).unwrap();
    let out = drain(&mut a);
    assert_eq!(out.len(), 1);
    let (dst, ours) = out[0];
    assert_eq!(dst, v4(198, 18, 0, 2));
    // TID = hi << 32 | bswap(comm ID), like 0x00000002_fc9f3356 for comm ID 0x56339ffc.
    assert_eq!(tid_of(&ours) as u32, id.0.swap_bytes());
    assert_eq!(tid_of(&golden) as u32, 0x5633_9ffcu32.swap_bytes());
    let mut expect = golden;
    expect[8..16].copy_from_slice(&ours[8..16]);
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    for (i, (x, y)) in ours.iter().zip(expect.iter()).enumerate() {
        assert_eq!(x, y, "byte {i} of the MAD differs");
    }
}

#[test]
fn poll_transmit_into_gives_the_same_mads_into_the_callers_buffer() {
    // Two CMs with the same seed and inputs queue the same MADs: one is drained the old
    // way, the other into a buffer.
    let now = Instant::now();
    let mut second = frame361_request();
    second.dst = v4(198, 18, 0, 9);
    second.local_qpn = 0x25;
    let mut old = cm(v4(198, 18, 0, 3), 0x5054_00ff_fe00_0003, 7);
    let mut new = cm(v4(198, 18, 0, 3), 0x5054_00ff_fe00_0003, 7);
    for c in [&mut old, &mut new] {
        c.connect(now, frame361_request()).unwrap();
        c.connect(now, second.clone()).unwrap();
    }
    let expect = drain(&mut old);
    assert_eq!(expect.len(), 2);
    // A buffer shorter than a MAD gets nothing and leaves the MAD queued.
    let mut short = [0u8; 255];
    assert_eq!(new.poll_transmit_into(&mut short), None);
    let mut buf = [0xeeu8; 300];
    for (dst, mad) in &expect {
        let t = new.poll_transmit_into(&mut buf).unwrap();
        assert_eq!(
            t,
            CmTransmit {
                len: 256,
                dest: *dst
            }
        );
        assert_eq!(&buf[..256], &mad[..]);
        assert!(buf[256..].iter().all(|&b| b == 0xee), "wrote past the MAD");
    }
    assert_eq!(new.poll_transmit_into(&mut buf), None);
    assert_eq!(new.poll_transmit(), None);
}

/// The no-listener capture: the REQ (frame 1) and the REJ reason 4 that the kernel sends when
/// the requester is destroyed with the REQ still outstanding (frame 4).
#[test]
fn golden_req_and_destroy_rej_match_no_listener_capture() {
    let req = golden_mad(NOLISTEN, 1);
    let rej = golden_mad(NOLISTEN, 4);
    let Ok(Message::Req(r)) = Message::parse(&mad::Packet::new_checked(&req[..]).unwrap()) else {
        panic!("frame 1 is a REQ")
    };
    let mut a = cm(v4(198, 18, 0, 2), r.local_ca_guid, 99);
    let now = Instant::now();
    let mut params = frame361_request();
    params.dst = v4(198, 18, 0, 1);
    params.service_id = r.service_id;
    params.local_qpn = r.local_qpn;
    params.starting_psn = r.starting_psn;
    params.responder_resources = r.responder_resources;
    params.initiator_depth = r.initiator_depth;
    params.retry_count = r.retry_count;
    params.rnr_retry_count = r.rnr_retry_count;
    params.path_mtu = r.path_mtu;
    params.hop_limit = r.primary_path.hop_limit;
    params.flow_label = r.primary_path.flow_label;
    params.traffic_class = r.primary_path.traffic_class;
    params.private_data = r.private_data.to_vec();
    let id = a.connect(now, params).unwrap();
    let (_, ours) = drain(&mut a)[0];
    let mut expect = req;
    expect[8..16].copy_from_slice(&ours[8..16]);
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(ours.to_vec(), expect.to_vec(), "REQ of frame 1");

    a.destroy(now, id);
    let out = drain(&mut a);
    assert_eq!(out.len(), 1);
    let (dst, ours) = out[0];
    assert_eq!(dst, v4(198, 18, 0, 1));
    let mut expect = rej;
    expect[8..16].copy_from_slice(&ours[8..16]);
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(ours.to_vec(), expect.to_vec(), "REJ of frame 4");
    assert!(events(&mut a).is_empty());
    assert_eq!(a.connection_count(), 0);
}

/// Feed rxe's REQ (frame 361) to a passive CM, accept with the values of rxe's REP (frame
/// 362): the REP is identical but for our comm ID — TID included.
#[test]
fn golden_rep_answers_rxe_req() {
    let req = golden_mad(RXE, 361);
    let rep = golden_mad(RXE, 362);
    let mut b = cm(v4(198, 18, 0, 2), 0x5054_00ff_fe00_0002, 3);
    b.listen(0x0106_1c06).unwrap();
    let now = Instant::now();
    b.handle_mad(now, v4(198, 18, 0, 3), &req);
    let ev = events(&mut b);
    let [CmEvent::ReqReceived { id, src, req: info }] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(*src, v4(198, 18, 0, 3));
    assert_eq!(info.remote_comm_id, 0x5633_9ffc);
    assert_eq!(info.remote_qpn, 0x24);
    assert_eq!(info.starting_psn, 0x72_e4d5);
    assert_eq!(info.path_mtu, 3);
    assert_eq!((info.retry_count, info.rnr_retry_count), (7, 7));
    assert_eq!(info.packet_lifetime, 18);
    assert_eq!(info.qp_timeout, 19);
    assert_eq!(info.max_cm_retries, 15);
    assert_eq!(info.remote_gid, ip_to_gid(v4(198, 18, 0, 3)));
    let (hdr, _) = CmaHeaderRepr::parse_private_data(&info.private_data).unwrap();
    assert_eq!(hdr.src_port, 0xa8d7);
    let id = *id;
    b.accept(
        now,
        id,
        AcceptParams {
            local_qpn: 0x24,
            starting_psn: 0x7e_2e65,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            flow_control: false,
            private_data: vec![],
        },
    )
    .unwrap();
    let (dst, ours) = drain(&mut b)[0];
    assert_eq!(dst, v4(198, 18, 0, 3));
    let mut expect = rep;
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(ours.to_vec(), expect.to_vec(), "REP of frame 362");
    // The RTU of frame 363, with its remote comm ID pointed at our ID, establishes.
    let mut rtu = golden_mad(RXE, 363);
    rtu[28..32].copy_from_slice(&id.0.to_be_bytes());
    b.handle_mad(now, v4(198, 18, 0, 3), &rtu);
    assert!(matches!(&events(&mut b)[..], [CmEvent::Established { id: e, .. }] if *e == id));
    // rxe's DREQ (frame 484) likewise: DREP with the DREQ's TID, then timewait.
    let mut dreq = golden_mad(RXE, 484);
    dreq[28..32].copy_from_slice(&id.0.to_be_bytes());
    b.handle_mad(now, v4(198, 18, 0, 3), &dreq);
    let (_, drep) = drain(&mut b)[0];
    let mut expect = golden_mad(RXE, 485);
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(drep.to_vec(), expect.to_vec(), "DREP of frame 485");
    assert!(matches!(
        &events(&mut b)[..],
        [CmEvent::DisconnectRequested { .. }]
    ));
    // Timewait: ms(19) = 2048 ms.
    assert_eq!(b.poll_timeout(), Some(now + Duration::from_millis(2048)));
    b.handle_timeout(now + Duration::from_millis(2048));
    assert!(matches!(&events(&mut b)[..], [CmEvent::TimewaitExit { id: e }] if *e == id));
    assert_eq!(b.connection_count(), 0);
}

/// A connected peer whose device went away (its process died, no DREQ came): the port
/// unreachable a liveness probe draws ends the connection as a DREQ would.
#[test]
fn port_unreachable_from_a_connected_peer_disconnects() {
    let mut b = cm(v4(198, 18, 0, 2), 0x5054_00ff_fe00_0002, 3);
    b.listen(0x0106_1c06).unwrap();
    let now = Instant::now();
    b.handle_mad(now, v4(198, 18, 0, 3), &golden_mad(RXE, 361));
    let id = match &events(&mut b)[..] {
        [CmEvent::ReqReceived { id, .. }] => *id,
        ev => panic!("{ev:?}"),
    };
    b.accept(
        now,
        id,
        AcceptParams {
            local_qpn: 0x24,
            starting_psn: 1,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            flow_control: false,
            private_data: vec![],
        },
    )
    .unwrap();
    drain(&mut b);
    assert!(b.connected_peers().is_empty(), "not before the RTU");
    let mut rtu = golden_mad(RXE, 363);
    rtu[28..32].copy_from_slice(&id.0.to_be_bytes());
    b.handle_mad(now, v4(198, 18, 0, 3), &rtu);
    assert!(matches!(&events(&mut b)[..], [CmEvent::Established { .. }]));
    assert_eq!(b.connected_peers(), vec![v4(198, 18, 0, 3)]);
    assert_eq!(b.handle_port_unreachable(now, v4(198, 18, 0, 3)), 1);
    assert_eq!(events(&mut b), vec![CmEvent::Disconnected { id }]);
    assert!(b.connected_peers().is_empty());
    assert!(drain(&mut b).is_empty(), "no DREQ to a peer that is gone");
    b.handle_timeout(now + Duration::from_millis(2048));
    assert_eq!(events(&mut b), vec![CmEvent::TimewaitExit { id }]);
}

/// SIDR_REQ as in frame 531 (but for the request ID) and SIDR_REP as in frame 532.
#[test]
fn golden_sidr() {
    let golden_req = golden_mad(RXE, 531);
    let golden_rep = golden_mad(RXE, 532);
    let Ok(Message::SidrReq(r)) =
        Message::parse(&mad::Packet::new_checked(&golden_req[..]).unwrap())
    else {
        panic!()
    };
    let mut a = cm(v4(198, 18, 0, 3), 0x5054_00ff_fe00_0003, 5);
    let now = Instant::now();
    let id = a
        .sidr_request(now, v4(198, 18, 0, 2), r.service_id, &r.private_data)
        .unwrap();
    let (_, ours) = drain(&mut a)[0];
    let mut expect = golden_req;
    expect[8..16].copy_from_slice(&ours[8..16]);
    expect[24..28].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(ours.to_vec(), expect.to_vec());

    let mut b = cm(v4(198, 18, 0, 2), 0x5054_00ff_fe00_0002, 6);
    b.listen(r.service_id).unwrap();
    b.handle_mad(now, v4(198, 18, 0, 3), &golden_req);
    let ev = events(&mut b);
    let [CmEvent::SidrReqReceived {
        id: bid,
        service_id,
        ..
    }] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(*service_id, r.service_id);
    b.sidr_reply(
        now,
        *bid,
        SidrStatus::Success,
        0x26,
        cma::RDMA_UDP_QKEY,
        &[],
    )
    .unwrap();
    let (_, rep) = drain(&mut b)[0];
    assert_eq!(rep.to_vec(), golden_rep.to_vec(), "SIDR_REP of frame 532");
    // A retransmitted SIDR_REQ gets the same reply and no new event.
    b.handle_mad(now, v4(198, 18, 0, 3), &golden_req);
    assert_eq!(drain(&mut b)[0].1.to_vec(), golden_rep.to_vec());
    assert!(events(&mut b).is_empty());
}

#[test]
fn req_retransmits_16_times_then_unreachable() {
    let mut a = cm(v4(10, 0, 0, 1), 1, 1);
    let t0 = Instant::now();
    let mut p = frame361_request();
    p.dst = v4(10, 0, 0, 2);
    let id = a.connect(t0, p).unwrap();
    let first = drain(&mut a);
    let mut sent = first.len();
    let mut now = t0;
    while let Some(t) = a.poll_timeout() {
        now = t;
        a.handle_timeout(now);
        for (_, m) in drain(&mut a) {
            assert_eq!(m.to_vec(), first[0].1.to_vec(), "identical retransmission");
            sent += 1;
        }
    }
    assert_eq!(sent, 16);
    assert_eq!(now - t0, Duration::from_millis(16 * 6144));
    assert_eq!(events(&mut a), vec![CmEvent::Unreachable { id }]);
    assert_eq!(a.stats().sent.req, 16);
    assert_eq!(a.stats().retransmitted.req, 15);
    assert_eq!(a.connection_count(), 0);
}

#[test]
fn port_unreachable_ends_a_waiting_req_at_once_and_only_that_peer() {
    let mut a = cm(v4(10, 0, 0, 1), 1, 1);
    let t0 = Instant::now();
    let mut p = frame361_request();
    p.dst = v4(10, 0, 0, 2);
    let id = a.connect(t0, p.clone()).unwrap();
    let mut q = frame361_request();
    q.dst = v4(10, 0, 0, 3);
    let other = a.connect(t0, q).unwrap();
    assert_eq!(drain(&mut a).len(), 2);
    // Another host's ICMP says nothing of this peer.
    assert_eq!(a.handle_port_unreachable(t0, v4(10, 0, 0, 9)), 0);
    // Another host's refusal ends the request at once (its kernel rate-limits ICMP errors:
    // resends could draw none and wait out the whole timeout).
    assert_eq!(a.handle_port_unreachable(t0, v4(10, 0, 0, 2)), 1);
    assert_eq!(events(&mut a), vec![CmEvent::Refused { id }]);
    assert_eq!(a.connection_count(), 1);
    // The other REQ still retries and ends as before; the refused one never resends.
    let mut now = t0;
    while let Some(t) = a.poll_timeout() {
        now = t;
        a.handle_timeout(now);
        for (dst, _) in drain(&mut a) {
            assert_eq!(dst, v4(10, 0, 0, 3));
        }
    }
    assert_eq!(events(&mut a), vec![CmEvent::Unreachable { id: other }]);
    // Once a peer has answered (here: a REJ), an ICMP error no longer ends anything.
    let mut b = cm(v4(10, 0, 0, 2), 2, 2);
    let id = a.connect(now, p).unwrap();
    let (_, req) = drain(&mut a)[0];
    b.handle_mad(now, v4(10, 0, 0, 1), &req);
    for (_, m) in drain(&mut b) {
        a.handle_mad(now, v4(10, 0, 0, 2), &m);
    }
    assert_eq!(a.handle_port_unreachable(t0, v4(10, 0, 0, 2)), 0);
    assert!(matches!(events(&mut a)[..], [CmEvent::Rejected { id: r, .. }] if r == id));
}

/// Toward this host (a loopback peer) a refused REQ is sent again, sooner than its own timer
/// would (10, 20, 40, 80 and 160 ms after each refusal: the peer's device may be starting);
/// the refusal of the last resend ends it. A refusal that comes before the resend it would
/// answer (a second error for one send) counts nothing.
#[test]
fn port_unreachable_from_this_host_sends_a_req_again_quickly_first() {
    let here = v4(127, 0, 0, 1);
    let peer = v4(127, 9, 0, 2);
    let mut a = cm(here, 1, 1);
    let t0 = Instant::now();
    let mut p = frame361_request();
    p.dst = peer;
    let id = a.connect(t0, p).unwrap();
    let first = drain(&mut a);
    assert_eq!(first.len(), 1);
    let mut now = t0;
    for k in 0..REFUSED_RETRIES {
        assert_eq!(a.handle_port_unreachable(now, peer), 0);
        // A second error before the resend: nothing more.
        assert_eq!(a.handle_port_unreachable(now, peer), 0);
        assert!(events(&mut a).is_empty());
        let t = a.poll_timeout().unwrap();
        assert_eq!(t - now, Duration::from_millis(REFUSED_RETRY_MS << k));
        now = t;
        a.handle_timeout(now);
        let again = drain(&mut a);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].0, peer);
        assert_eq!(again[0].1.to_vec(), first[0].1.to_vec(), "the same REQ");
    }
    assert_eq!(now - t0, Duration::from_millis(310));
    assert_eq!(a.handle_port_unreachable(now, peer), 1);
    assert_eq!(events(&mut a), vec![CmEvent::Refused { id }]);
    assert_eq!(a.connection_count(), 0);
    assert_eq!(a.stats().retransmitted.req, u64::from(REFUSED_RETRIES));
}

#[test]
fn no_listener_rej_8_and_mra_on_duplicate() {
    let (ia, ib) = (v4(10, 0, 0, 1), v4(10, 0, 0, 2));
    let mut a = cm(ia, 1, 1);
    let mut b = cm(ib, 2, 2);
    let now = Instant::now();
    let mut p = frame361_request();
    p.dst = ib;
    let id = a.connect(now, p.clone()).unwrap();
    let (_, req) = drain(&mut a)[0];
    b.handle_mad(now, ia, &req);
    let (_, rej) = drain(&mut b)[0];
    assert_eq!(tid_of(&rej), tid_of(&req));
    let Ok(Message::Rej(r)) = Message::parse(&mad::Packet::new_checked(&rej[..]).unwrap()) else {
        panic!()
    };
    assert_eq!(r.reason, RejectReason::InvalidServiceId);
    assert_eq!(r.message_rejected, MessageRejected::Req);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, id.0));
    a.handle_mad(now, ib, &rej);
    assert!(matches!(
        &events(&mut a)[..],
        [CmEvent::Rejected {
            reason: RejectReason::InvalidServiceId,
            ..
        }]
    ));

    // With a listener that delays: the duplicate REQ gets an MRA, which stretches the timer.
    b.listen(p.service_id).unwrap();
    let id = a.connect(now, p).unwrap();
    let (_, req) = drain(&mut a)[0];
    b.handle_mad(now, ia, &req);
    let ev = events(&mut b);
    let [CmEvent::ReqReceived { id: bid, .. }] = &ev[..] else {
        panic!()
    };
    b.delay_reply(now, *bid, cma::CMA_CM_MRA_SERVICE_TIMEOUT)
        .unwrap();
    assert!(drain(&mut b).is_empty());
    b.handle_mad(now, ia, &req);
    let (_, mra) = drain(&mut b)[0];
    assert_eq!(u16::from_be_bytes([mra[16], mra[17]]), mad::ATTR_CM_MRA);
    assert_eq!(b.stats().duplicates.req, 1);
    a.handle_mad(now, ib, &mra);
    assert_eq!(
        events(&mut a),
        vec![CmEvent::MraReceived {
            id,
            service_timeout: 24
        }]
    );
    // ms(24) + ms(19) = 65536 + 2048.
    assert_eq!(
        a.poll_timeout(),
        Some(now + Duration::from_millis(65536 + 2048))
    );
}

#[test]
fn hostile_inputs_are_counted() {
    let mut b = cm(v4(10, 0, 0, 2), 2, 2);
    let now = Instant::now();
    let src = v4(10, 0, 0, 9);
    b.handle_mad(now, src, &[1, 7, 2, 3]);
    let mut m = [0u8; 256];
    b.handle_mad(now, src, &m);
    m[..4].copy_from_slice(&[1, 7, 2, 3]);
    m[16..18].copy_from_slice(&mad::ATTR_CM_LAP.to_be_bytes());
    b.handle_mad(now, src, &m);
    m[16..18].copy_from_slice(&mad::ATTR_CM_RTU.to_be_bytes());
    b.handle_mad(now, src, &m);
    m[16..18].copy_from_slice(&mad::ATTR_CM_REJ.to_be_bytes());
    m[24 + 8] = 0xC0; // message rejected = 3 (reserved)
    b.handle_mad(now, src, &m);
    let s = b.stats();
    assert_eq!(s.dropped_malformed, 2);
    assert_eq!(s.dropped_unsupported, 2);
    assert_eq!(s.dropped_unknown_id, 1);
    assert!(drain(&mut b).is_empty());
    assert!(events(&mut b).is_empty());
}

#[test]
fn api_errors() {
    let mut a = cm(v4(10, 0, 0, 1), 1, 1);
    let now = Instant::now();
    let mut p = frame361_request();
    p.private_data = vec![0; 93];
    assert_eq!(a.connect(now, p.clone()), Err(CmError::PrivateDataTooLong));
    p.private_data.clear();
    p.transport = TransportServiceType::Rd;
    assert_eq!(
        a.connect(now, p.clone()),
        Err(CmError::InvalidParam("transport"))
    );
    p.transport = TransportServiceType::Rc;
    p.path_mtu = 6;
    assert!(matches!(
        a.connect(now, p.clone()),
        Err(CmError::InvalidParam(_))
    ));
    p.path_mtu = 5;
    let id = a.connect(now, p).unwrap();
    assert_eq!(a.send_rtu(now, id, &[]), Err(CmError::InvalidState));
    assert_eq!(a.disconnect(now, id, &[]), Err(CmError::InvalidState));
    assert_eq!(a.notify_established(now, id), Err(CmError::InvalidState));
    assert_eq!(a.send_rtu(now, ConnId(12345), &[]), Err(CmError::UnknownId));
    a.listen(5).unwrap();
    assert_eq!(a.listen(5), Err(CmError::AlreadyListening));
    a.unlisten(5);
    a.listen(5).unwrap();
    a.destroy(now, ConnId(12345));
}

/// The default bounds are the documented ones, far above a few thousand connections, and
/// `set_limits` changes them at once: a REQ beyond `max_pending_reqs` gets REJ 3 and a
/// `connect` beyond `max_connections` fails, while the records already held stay; raising the
/// bounds again lets the next ones in.
#[test]
fn limits_are_large_by_default_and_set_limits_changes_them() {
    let (ia, ib) = (v4(10, 0, 0, 1), v4(10, 0, 0, 2));
    let mut a = cm(ia, 1, 1);
    let mut b = cm(ib, 2, 2);
    assert_eq!(
        (b.config().max_connections, b.config().max_pending_reqs),
        (
            super::DEFAULT_MAX_CONNECTIONS,
            super::DEFAULT_MAX_PENDING_REQS
        )
    );
    const { assert!(super::DEFAULT_MAX_CONNECTIONS >= 100_000) };
    let now = Instant::now();
    let mut p = frame361_request();
    p.dst = ib;
    b.listen(p.service_id).unwrap();
    b.set_limits(10, 2);
    let mut reasons = Vec::new();
    for i in 0..3u32 {
        let mut q = p.clone();
        q.local_qpn = 0x100 + i;
        a.connect(now, q).unwrap();
        for (_, m) in drain(&mut a) {
            b.handle_mad(now, ia, &m);
        }
        for (_, m) in drain(&mut b) {
            let Ok(Message::Rej(r)) = Message::parse(&mad::Packet::new_checked(&m[..]).unwrap())
            else {
                panic!("expected only REJs")
            };
            reasons.push(r.reason);
        }
    }
    assert_eq!(reasons, vec![RejectReason::NoResources]);
    assert_eq!((b.pending_count(), b.connection_count()), (2, 2));
    // Below the occupancy: nothing held goes, nothing new comes.
    a.set_limits(2, 2);
    let mut q = p.clone();
    q.local_qpn = 0x200;
    assert_eq!(a.connect(now, q.clone()), Err(CmError::TooManyConnections));
    assert_eq!(a.connection_count(), 3);
    a.set_limits(4, 2);
    assert!(a.connect(now, q).is_ok());
}

/// With `comm_id_tag`, every local communication ID (and SIDR request ID) carries the tag in
/// its top byte, on the wire too, and the rest stays distinct; without it the top byte varies.
#[test]
fn comm_id_tag_is_the_top_byte_of_every_local_id() {
    let now = Instant::now();
    let mut cfg = CmConfig::new(v4(198, 18, 0, 3), 0x1122, 7);
    cfg.comm_id_tag = Some(0x5a);
    let mut a = Cm::new(cfg);
    let mut ids = std::collections::HashSet::new();
    for _ in 0..200 {
        let id = a.connect(now, frame361_request()).unwrap();
        assert_eq!(id.0 >> 24, 0x5a);
        let (_, req) = drain(&mut a)[0];
        assert_eq!(req[24..28], id.0.to_be_bytes());
        assert!(ids.insert(id.0));
    }
    let sidr = a
        .sidr_request(now, v4(198, 18, 0, 2), 0x0106_1c06, &[])
        .unwrap();
    assert_eq!(sidr.0 >> 24, 0x5a);
    let mut b = cm(v4(198, 18, 0, 3), 0x1122, 7);
    let tops: std::collections::HashSet<u32> = (0..50)
        .map(|_| b.connect(now, frame361_request()).unwrap().0 >> 24)
        .collect();
    assert!(tops.len() > 1, "untagged IDs all share a top byte");
}
