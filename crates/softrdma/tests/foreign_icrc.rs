//! Receive-side ICRC for peers whose IPv4 identification the receiver cannot see (the Linux
//! kernel's rxe gives its packets varying identifications; softrdma sends 0): UD SENDs from a
//! plain UDP socket, sealed as if sent with a nonzero identification, are delivered and
//! counted in `icrc_ident_solved`; with identification 0 they pass the full check and are not
//! counted there; corrupted ones are dropped as ICRC errors either way.
//!
//! Its device and sender addresses are loopback addresses of this run's own (see
//! `softrdma::testing`).

mod common;

use common::*;
use softrdma::*;
use softrdma_wire::icrc::IcrcPrefix;
use softrdma_wire::opcode::Opcode;
use softrdma_wire::{bth, deth, ip, roce};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

const QKEY: u32 = 0x1111_2222;

/// A UD SEND_ONLY to `dest_qp` with `payload`, its ICRC computed with IPv4 identification
/// `ident` in the header (as a sender that does not use 0 would send it).
fn ud_send(
    src: (Ipv4Addr, u16),
    dst: Ipv4Addr,
    dest_qp: u32,
    ident: u16,
    payload: &[u8],
) -> Vec<u8> {
    let repr = roce::Repr {
        bth: bth::Repr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited_event: false,
            mig_req: false,
            pad_count: ((4 - payload.len() % 4) % 4) as u8,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn: 1,
        },
        deth: Some(deth::Repr {
            qkey: QKEY,
            src_qp: 0x42,
        }),
        payload_len: payload.len(),
        ..Default::default()
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce::Packet::new_unchecked(&mut buf[..]), payload)
        .unwrap();
    let mut h = [0u8; ip::IPV4_HEADER_LEN];
    h[0] = 0x45;
    h[4..6].copy_from_slice(&ident.to_be_bytes());
    h[6] = 0x40;
    h[9] = ip::IP_PROTOCOL_UDP;
    h[12..16].copy_from_slice(&src.0.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let mut u = [0u8; ip::UDP_HEADER_LEN];
    u[0..2].copy_from_slice(&src.1.to_be_bytes());
    u[2..4].copy_from_slice(&4791u16.to_be_bytes());
    IcrcPrefix::from_headers(&h, &u)
        .unwrap()
        .fill(&mut roce::Packet::new_unchecked(&mut buf[..]))
        .unwrap();
    buf
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > Duration::from_secs(60) {
            // A hang guard, not a speed check: only something that never happens trips it.
            panic!("timed out: {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn packets_with_an_unseen_ident_are_verified_by_solving_for_it() {
    let dev: Ipv4Addr = softrdma::testing::unique_loopback_addr();
    let me: Ipv4Addr = softrdma::testing::unique_loopback_addr();
    let ctx = Device::from_addr(IpAddr::V4(dev)).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Ud, &cq, caps(32, 1)))
        .unwrap();
    ud_to_rts(&qp, QKEY);
    let (b, mr) = buffer_mr(&pd, 32 * 256);
    for i in 0..32u64 {
        let sge = [Sge {
            addr: b.addr() + i * 256,
            length: 256,
            lkey: mr.lkey(),
        }];
        qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &sge,
        }])
        .unwrap();
    }
    // A source port like rxe's (0xc000 | hash), not 4791.
    let sock = UdpSocket::bind((me, 0xc123)).unwrap();
    let send = |p: &[u8]| {
        sock.send_to(p, (dev, 4791)).unwrap();
    };
    let c0 = ctx.counters();
    let payload: Vec<u8> = (0..100u8).collect();
    let idents = [0u16, 0x5cf5, 1, 0x8000, 0xffff];
    for &id in &idents {
        send(&ud_send((me, 0xc123), dev, qp.qp_num(), id, &payload));
    }
    let mut wcs = Vec::new();
    wait_for("the good packets", || {
        wcs.extend(poll_all(&cq));
        wcs.len() >= idents.len()
    });
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len as usize, 40 + payload.len());
    }
    let c1 = ctx.counters();
    assert_eq!(c1.rx_packets - c0.rx_packets, idents.len() as u64);
    assert_eq!(
        c1.icrc_ident_solved - c0.icrc_ident_solved,
        4,
        "all but ident 0"
    );
    assert_eq!(c1.icrc_errors, c0.icrc_errors);

    // Corrupted: one payload byte, a DETH byte, the QP number; with identification 0 (a
    // softrdma peer: 32-bit check) and with others (16-bit check; these corruptions are not
    // among the few the documented 2^-16 rate lets through).
    let mut bad = Vec::new();
    for &id in &idents {
        for (at, x) in [
            (12 + 8 + 7, 0x01u8),
            (12 + 1, 0x80),
            (7, 0x80),
            (12 + 8 + 50, 0x5a),
        ] {
            let mut p = ud_send((me, 0xc123), dev, qp.qp_num(), id, &payload);
            p[at] ^= x;
            bad.push(p);
        }
    }
    for p in &bad {
        send(p);
    }
    // Then a good one, which arrives after them.
    send(&ud_send((me, 0xc123), dev, qp.qp_num(), 0x1234, &payload));
    wait_for("the last good packet", || !poll_all(&cq).is_empty());
    let c2 = ctx.counters();
    assert_eq!(c2.icrc_errors - c1.icrc_errors, bad.len() as u64);
    assert_eq!(c2.rx_packets - c1.rx_packets, 1);
    assert_eq!(c2.icrc_ident_solved - c1.icrc_ident_solved, 1);
}
