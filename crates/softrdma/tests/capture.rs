//! Packet capture: the traffic of every operation and QP type, written to a pcap file, is
//! valid RoCEv2 — it parses with our wire layer, every ICRC verifies over the captured IP
//! and UDP headers, and tshark (when installed; required in CI) decodes every frame as
//! InfiniBand with no malformed packet.

#[path = "common/pair.rs"]
mod pair;

use pair::*;
use softrdma::*;
use softrdma_wire::{icrc, ip, pcap::PcapReader, roce};
use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn every_packet_sent_is_valid_rocev2_with_a_correct_icrc() {
    // Packets of the path MTU, as between two hosts (two devices of one host would otherwise
    // segment at 65,280 bytes: see the README's "Same-host lanes"). This binary's only test, so
    // no other thread reads the environment.
    std::env::set_var("SOFTRDMA_SAME_HOST_SEGMENT", "0");
    let dir = std::env::temp_dir().join(format!("softrdma-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("all.pcap");
    start_capture(&file).unwrap();
    // RC: every operation, several sizes; UC and UD too, on this binary's two devices.
    let (da, db) = pair_addrs();
    let (a, b) = pair_on(da, db, QpType::Rc, 1 << 20, &Opts::default());
    for (i, len) in [1usize, 5000, 70_000].into_iter().enumerate() {
        b.post_recv(i as u64, 0, 1 << 20);
        send(&a, i as u64, WrOpcode::SendWithImm, &[a.sge(0, len)], |w| {
            w.imm_data = 1
        });
        send(&a, 10, WrOpcode::RdmaWrite, &[a.sge(0, len)], |w| {
            w.remote_addr = b.buf.addr();
            w.rkey = b.mr.rkey();
        });
        send(&a, 11, WrOpcode::RdmaRead, &[a.sge(0, len)], |w| {
            w.remote_addr = b.buf.addr();
            w.rkey = b.mr.rkey();
        });
        a.wait(3);
        b.wait(1);
    }
    send(&a, 12, WrOpcode::AtomicFetchAndAdd, &[a.sge(0, 8)], |w| {
        w.remote_addr = b.buf.addr();
        w.rkey = b.mr.rkey();
        w.compare_add = 3;
    });
    send(&a, 13, WrOpcode::AtomicCmpAndSwp, &[a.sge(8, 8)], |w| {
        w.remote_addr = b.buf.addr();
        w.rkey = b.mr.rkey();
    });
    a.wait(2);
    let (u, v) = pair_on(da, db, QpType::Uc, 65536, &Opts::default());
    v.post_recv(1, 0, 65536);
    send(&u, 1, WrOpcode::Send, &[u.sge(0, 3000)], |_| {});
    u.wait(1);
    v.wait(1);
    let (x, y) = pair_on(da, db, QpType::Ud, 65536, &Opts::default());
    let ah = x.pd.create_ah(&AhAttr::for_ip(y.addr)).unwrap();
    y.post_recv(1, 0, 4096);
    send(&x, 1, WrOpcode::Send, &[x.sge(0, 100)], |w| {
        w.ah = Some(&ah);
        w.remote_qpn = y.qp.qp_num();
        w.remote_qkey = 0x1111;
    });
    x.wait(1);
    y.wait(1);
    stop_capture().unwrap();

    let data = std::fs::read(&file).unwrap();
    let r = PcapReader::new(&data).unwrap();
    let mut n = 0;
    let mut opcodes = BTreeSet::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let d = ip::parse_ethernet_udp(rec.data).expect("Ethernet/IP/UDP");
        assert_eq!(d.dst_port, 4791);
        let p = roce::Packet::new_checked(d.payload).expect("a RoCEv2 packet");
        roce::Repr::parse(&p).expect("valid headers");
        opcodes.insert(p.opcode().0);
        let ip_packet = &rec.data[ip::ETHERNET_HEADER_LEN..];
        icrc::verify(ip_packet).expect("ICRC over the captured headers");
        n += 1;
    }
    // SEND_ONLY_IMM, SEND_FIRST/MIDDLE/LAST_IMM, WRITE_ONLY/FIRST/MIDDLE/LAST, READ request and
    // responses, ACK, atomics and their ACK, UC SEND first/middle/last, UD SEND.
    for op in [
        0x05u8, 0x00, 0x01, 0x03, 0x06, 0x07, 0x08, 0x0a, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12,
        0x13, 0x14, 0x20, 0x21, 0x22, 0x64,
    ] {
        assert!(
            opcodes.contains(&op),
            "opcode {op:#04x} missing from {opcodes:x?}"
        );
    }
    assert!(n > 50, "{n} packets");

    match Command::new("tshark").arg("-v").output() {
        Ok(o) if o.status.success() => {
            let out = Command::new("tshark")
                .args(["-r"])
                .arg(&file)
                .args([
                    "-T",
                    "fields",
                    "-e",
                    "frame.number",
                    "-e",
                    "infiniband.bth.opcode",
                    "-e",
                    "_ws.malformed",
                    "-e",
                    "_ws.expert.severity",
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), n, "tshark saw every frame");
            for l in &lines {
                let f: Vec<&str> = l.split('\t').collect();
                assert!(
                    f.len() >= 2 && !f[1].is_empty(),
                    "not decoded as InfiniBand: {l}"
                );
                assert!(f.get(2).is_none_or(|m| m.is_empty()), "malformed: {l}");
            }
        }
        _ if std::env::var_os("CI").is_some() => panic!("tshark is required in CI"),
        _ => eprintln!("tshark not installed: skipped the Wireshark check"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
