//! Every frame of the golden captures (real Linux rxe traffic and synthetic frames built from
//! the IBTA layouts): parse, re-emit byte for byte, recompute the ICRC, and compare selected
//! fields with what `tshark -V` decodes.

use softrdma_wire::aeth::{NakCode, Syndrome};
use softrdma_wire::opcode::Opcode;
use softrdma_wire::pcap::{PcapReader, LINKTYPE_ETHERNET};
use softrdma_wire::{icrc, ip, roce, Error, ROCE_V2_UDP_PORT};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

const FILES: [&str; 4] = [
    "rxe_cm_req_no_listener.pcap",
    "rxe_two_vm.pcap",
    "synthetic_cm_messages.pcap",
    "synthetic_mixed_one_bad_icrc.pcap",
];

fn golden_dir() -> PathBuf {
    match std::env::var_os("SOFTRDMA_GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    }
}

fn read_capture(name: &str) -> Vec<u8> {
    let path = golden_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "golden capture {} is missing ({e}); set SOFTRDMA_GOLDEN_DIR to the directory \
             holding the shared golden pcaps (normally ../shared/golden from the project root)",
            path.display()
        )
    })
}

/// One decoded frame.
struct Decoded {
    repr: roce::Repr,
    payload: Vec<u8>,
    wire_icrc: u32,
    icrc_ok: Result<(), Error>,
    ip_ident: Option<u16>,
}

/// Decodes every frame of a capture, checking the invariants that hold for every frame.
fn decode_all(name: &str) -> Vec<Decoded> {
    let data = read_capture(name);
    let reader = PcapReader::new(&data).unwrap_or_else(|e| panic!("{name}: bad pcap: {e}"));
    assert_eq!(reader.link_type(), LINKTYPE_ETHERNET, "{name}");
    let mut out = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let frame_no = i + 1;
        let ctx = format!("{name} frame {frame_no}");
        let rec = rec.unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let frame = rec.data;
        let d = ip::parse_ethernet_udp(frame).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(d.dst_port, ROCE_V2_UDP_PORT, "{ctx}");

        let packet = roce::Packet::new_checked(d.payload).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let repr = roce::Repr::parse(&packet).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(repr.buffer_len(), d.payload.len(), "{ctx}");
        assert_eq!(repr.header_len(), packet.header_len(), "{ctx}");

        // Re-emit from the Repr and the captured payload: BTH..pad must be identical.
        let mut buf = vec![0u8; repr.buffer_len()];
        let mut emitted = roce::Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut emitted, packet.payload())
            .unwrap_or_else(|e| panic!("{ctx}: emit: {e}"));
        assert_eq!(emitted.icrc_covered(), packet.icrc_covered(), "{ctx}");

        // ICRC three ways: over the whole IP packet, over the re-emitted bytes, and with the
        // per-flow prefix of the data path.
        let ip_packet = &frame[ip::ETHERNET_HEADER_LEN..];
        let computed = icrc::icrc(ip_packet).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let from_emitted = match d.src_addr {
            IpAddr::V4(_) => icrc::icrc_ipv4(d.ip_header, d.udp_header, emitted.icrc_covered()),
            IpAddr::V6(_) => icrc::icrc_ipv6(d.ip_header, d.udp_header, emitted.icrc_covered()),
        };
        assert_eq!(computed, from_emitted, "{ctx}");
        let prefix = icrc::IcrcPrefix::from_headers(d.ip_header, d.udp_header).unwrap();
        let mut hasher = prefix.start(packet.icrc_covered().len()).unwrap();
        hasher.update(&packet.icrc_covered()[..roce::MIN_LEN - 4]);
        hasher.update(&packet.icrc_covered()[roce::MIN_LEN - 4..]);
        assert_eq!(hasher.finalize(), computed, "{ctx}: prefix");
        emitted.set_icrc(computed);

        let icrc_ok = icrc::verify(ip_packet);
        assert_eq!(icrc_ok.is_ok(), computed == packet.icrc(), "{ctx}");
        if icrc_ok.is_ok() {
            assert_eq!(&buf[..], d.payload, "{ctx}: re-emitted packet with ICRC");
        }
        let ip_ident = match d.src_addr {
            IpAddr::V4(_) => Some(ip::Ipv4Packet::new_checked(ip_packet).unwrap().ident()),
            IpAddr::V6(_) => None,
        };
        // A receiver that cannot see the identification finds it from the ICRC: every good
        // frame yields exactly the identification in its header, and the solver reached
        // through the data path's prefix (built with identification 0) agrees.
        if let (Some(id), Ok(())) = (ip_ident, icrc_ok) {
            assert_eq!(
                icrc::recover_ident(ip_packet),
                Ok(id),
                "{ctx}: recovered ident"
            );
            let mut h0 = d.ip_header.to_vec();
            h0[4..6].fill(0);
            let p0 = icrc::IcrcPrefix::from_headers(&h0, d.udp_header).unwrap();
            let covered = packet.icrc_covered();
            let crc0 = p0.compute(covered).unwrap();
            let mut solver = icrc::IdentSolver::new();
            assert_eq!(
                p0.solve_ident(&mut solver, covered.len(), crc0, packet.icrc()),
                Some(id),
                "{ctx}: solved ident"
            );
        }
        out.push(Decoded {
            repr,
            payload: packet.payload().to_vec(),
            wire_icrc: packet.icrc(),
            icrc_ok,
            ip_ident,
        });
    }
    out
}

fn opcode_counts(frames: &[Decoded]) -> BTreeMap<u8, usize> {
    let mut m = BTreeMap::new();
    for f in frames {
        *m.entry(f.repr.bth.opcode.0).or_insert(0) += 1;
    }
    m
}

#[test]
fn directory_holds_the_four_captures() {
    let dir = golden_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "golden directory {} is missing ({e}); set SOFTRDMA_GOLDEN_DIR",
            dir.display()
        )
    });
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    names.sort();
    assert_eq!(names, FILES);
}

#[test]
fn only_the_last_synthetic_frame_has_a_bad_icrc() {
    for name in FILES {
        let frames = decode_all(name);
        let bad: Vec<usize> = frames
            .iter()
            .enumerate()
            .filter(|(_, f)| f.icrc_ok.is_err())
            .map(|(i, _)| i)
            .collect();
        for f in &frames {
            if let Err(e) = f.icrc_ok {
                assert_eq!(e, Error::BadIcrc);
            }
        }
        if name == "synthetic_mixed_one_bad_icrc.pcap" {
            assert_eq!(bad, [frames.len() - 1], "{name}");
        } else {
            assert!(bad.is_empty(), "{name}: bad ICRC in frames {bad:?}");
        }
    }
}

#[test]
fn rxe_two_vm() {
    let frames = decode_all("rxe_two_vm.pcap");
    assert_eq!(frames.len(), 3366);
    assert!(frames.iter().all(|f| f.icrc_ok.is_ok()));

    // Opcode histogram, as `tshark -T fields -e infiniband.bth.opcode | sort | uniq -c`.
    let expected: BTreeMap<u8, usize> = [
        (0x00, 152), // RC SEND first
        (0x01, 304), // RC SEND middle
        (0x02, 152), // RC SEND last
        (0x04, 92),  // RC SEND only
        (0x06, 300), // RC WRITE first
        (0x07, 600), // RC WRITE middle
        (0x08, 300), // RC WRITE last
        (0x0a, 10),  // RC WRITE only
        (0x0c, 110), // RC READ request
        (0x0d, 100), // RC READ response first
        (0x0e, 200), // RC READ response middle
        (0x0f, 100), // RC READ response last
        (0x10, 10),  // RC READ response only
        (0x11, 554), // RC ACK
        (0x12, 100), // RC ATOMIC ACK
        (0x14, 100), // RC FETCH_ADD
        (0x20, 20),  // UC SEND first
        (0x21, 40),  // UC SEND middle
        (0x22, 20),  // UC SEND last
        (0x64, 82),  // UD SEND only (incl. 22 CM MADs on QP1)
        (0x65, 20),  // UD SEND only with immediate
    ]
    .into_iter()
    .collect();
    assert_eq!(opcode_counts(&frames), expected);
    // The README says "UC SEND/WRITE", but the capture holds no UC RDMA WRITE opcode.
    assert!(frames
        .iter()
        .all(|f| !(0x26..=0x2b).contains(&f.repr.bth.opcode.0)));

    // Every AETH is a plain ACK with rxe's "unlimited" credit code.
    for f in &frames {
        if let Some(a) = f.repr.aeth {
            assert_eq!(a.syndrome, Syndrome::Ack { credit: 31 });
        }
    }
    // CM MADs on QP1 are 256-byte payloads with the GSI Q_Key.
    let gsi: Vec<&Decoded> = frames.iter().filter(|f| f.repr.bth.dest_qp == 1).collect();
    assert_eq!(gsi.len(), 22);
    for f in gsi {
        assert_eq!(f.repr.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!(f.repr.deth.unwrap().qkey, 0x8001_0000);
        assert_eq!(f.payload.len(), 256);
    }

    // Frame 1: RC SEND first, QP 0x11, PSN 0x4f0ab7, IP ID 0xdef1 (`tshark -x`).
    let f = &frames[0];
    assert_eq!(f.repr.bth.opcode, Opcode::RC_SEND_FIRST);
    assert_eq!(f.repr.bth.dest_qp, 0x11);
    assert_eq!(f.repr.bth.psn, 0x4f_0ab7);
    assert!(!f.repr.bth.ack_req);
    assert_eq!(f.ip_ident, Some(0xdef1));
    assert_eq!(f.payload.len(), 1024);

    // Frame 366: RDMA READ Request (tshark: QP 0x24, PSN 7529685, VA 0x000055ab4718a5c0,
    // R_Key 0x000009b4, DMA Length 64, Invariant CRC 0x5e002b28 shown byte-reversed).
    let f = &frames[365];
    assert_eq!(f.repr.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(f.repr.bth.dest_qp, 0x24);
    assert_eq!(f.repr.bth.psn, 7_529_685);
    assert!(f.repr.bth.ack_req);
    let reth = f.repr.reth.unwrap();
    assert_eq!(reth.va, 0x0000_55ab_4718_a5c0);
    assert_eq!(reth.rkey, 0x9b4);
    assert_eq!(reth.dma_len, 64);
    assert_eq!(f.repr.payload_len, 0);
    assert_eq!(f.wire_icrc.to_le_bytes(), [0x5e, 0x00, 0x2b, 0x28]);

    // Frame 2553: FetchAdd (QP 0x2a, PSN 13130606, VA 0x0000561ddaa82000, R_Key 0xe52,
    // Swap (Or Add) Data 1, Compare Data 0, Invariant CRC 0xaaacce53).
    let f = &frames[2552];
    assert_eq!(f.repr.bth.opcode, Opcode::RC_FETCH_ADD);
    assert_eq!(f.repr.bth.dest_qp, 0x2a);
    assert_eq!(f.repr.bth.psn, 13_130_606);
    let at = f.repr.atomic_eth.unwrap();
    assert_eq!(at.va, 0x0000_561d_daa8_2000);
    assert_eq!(at.rkey, 0xe52);
    assert_eq!(at.swap_add, 1);
    assert_eq!(at.compare, 0);
    assert_eq!(f.wire_icrc.to_le_bytes(), [0xaa, 0xac, 0xce, 0x53]);

    // Frame 2612: its ATOMIC Acknowledge (syndrome 31, MSN 1, original data
    // 6439575689357800953).
    let f = &frames[2611];
    assert_eq!(f.repr.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(f.repr.bth.psn, 13_130_606);
    let aeth = f.repr.aeth.unwrap();
    assert_eq!(aeth.syndrome, Syndrome::Ack { credit: 31 });
    assert_eq!(aeth.msn, 1);
    assert_eq!(
        f.repr.atomic_ack_eth.unwrap().orig_data,
        6_439_575_689_357_800_953
    );
    assert_eq!(f.ip_ident, Some(0x373b));
    assert_eq!(f.wire_icrc.to_le_bytes(), [0x5c, 0x4b, 0x57, 0x90]);

    // Frame 533: UD SEND only with Immediate (QP 0x26, PSN 0, Q_Key 0x01234567, SrcQP 0x26,
    // Immediate Data 00000026, 100 bytes of zeros, Invariant CRC 0x273530e8).
    let f = &frames[532];
    assert_eq!(f.repr.bth.opcode, Opcode::UD_SEND_ONLY_WITH_IMMEDIATE);
    assert_eq!(f.repr.bth.dest_qp, 0x26);
    assert_eq!(f.repr.bth.psn, 0);
    let deth = f.repr.deth.unwrap();
    assert_eq!(deth.qkey, 0x0123_4567);
    assert_eq!(deth.src_qp, 0x26);
    assert_eq!(f.repr.immdt.unwrap().imm_data, 0x26);
    assert_eq!(f.payload, vec![0u8; 100]);
    assert_eq!(f.wire_icrc.to_le_bytes(), [0x27, 0x35, 0x30, 0xe8]);

    // Frames 2768 and 2770: the only padded packets, RC SEND only with 2 bytes + 2 pad.
    for (i, qp, psn) in [(2767, 0x2b, 2_013_908), (2769, 0x2b, 8_147_992)] {
        let f = &frames[i];
        assert_eq!(f.repr.bth.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!((f.repr.bth.dest_qp, f.repr.bth.psn), (qp, psn));
        assert_eq!(f.repr.bth.pad_count, 2);
        assert_eq!(f.repr.payload_len, 2);
    }
    let padded = frames.iter().filter(|f| f.repr.bth.pad_count != 0).count();
    assert_eq!(padded, 2);
}

#[test]
fn synthetic_mixed_one_bad_icrc() {
    let frames = decode_all("synthetic_mixed_one_bad_icrc.pcap");
    assert_eq!(frames.len(), 11);
    let ops: Vec<Opcode> = frames.iter().map(|f| f.repr.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RC_SEND_ONLY,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::RC_RDMA_WRITE_ONLY,
            Opcode::RC_RDMA_READ_REQUEST,
            Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::RC_COMPARE_SWAP,
            Opcode::RC_ATOMIC_ACKNOWLEDGE,
            Opcode::UD_SEND_ONLY,
            Opcode::RC_SEND_ONLY,
        ]
    );
    assert!(frames.iter().all(|f| f.ip_ident == Some(0)));

    // Frame 1 is the notes' §7 vector.
    let f = &frames[0];
    assert_eq!(f.payload, b"hello, rxe!!\n");
    assert_eq!((f.repr.bth.dest_qp, f.repr.bth.psn), (0x11, 1_193_046));
    assert_eq!(f.repr.bth.pad_count, 3);
    assert_eq!(f.wire_icrc.to_le_bytes(), [0x42, 0x1d, 0x77, 0x25]);
    // Frame 2: ACK, credit 31, MSN 1.
    let aeth = frames[1].repr.aeth.unwrap();
    assert_eq!(aeth.syndrome, Syndrome::Ack { credit: 31 });
    assert_eq!(aeth.msn, 1);
    // Frame 3: WRITE only, VA 0x00007f0000001000, R_Key 0x1234, 16 bytes.
    let reth = frames[2].repr.reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x7f00_0000_1000, 0x1234, 16)
    );
    assert_eq!(frames[2].repr.payload_len, 16);
    // Frame 4: READ request, VA 0x00007f0000002000, R_Key 0x1234, 8 bytes.
    let reth = frames[3].repr.reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x7f00_0000_2000, 0x1234, 8)
    );
    // Frame 5: READ response only, MSN 3, 8 bytes.
    assert_eq!(frames[4].repr.aeth.unwrap().msn, 3);
    assert_eq!(frames[4].repr.payload_len, 8);
    // Frame 6: RNR NAK (syndrome 46 = 0x2e, timer 14), PSN 1193049.
    assert_eq!(
        frames[5].repr.aeth.unwrap().syndrome,
        Syndrome::RnrNak { timer: 14 }
    );
    assert_eq!(frames[5].repr.bth.psn, 1_193_049);
    // Frame 7: NAK, PSN Sequence Error (syndrome 96), PSN 1193050, MSN 3, QP 0x12.
    let f = &frames[6];
    let aeth = f.repr.aeth.unwrap();
    assert_eq!(aeth.syndrome, Syndrome::Nak(NakCode::PsnSequenceError));
    assert_eq!(aeth.msn, 3);
    assert_eq!((f.repr.bth.dest_qp, f.repr.bth.psn), (0x12, 1_193_050));
    // Frame 8: CmpSwap, VA 0x00007f0000003000, R_Key 0x1234, swap 2, compare 1.
    let at = frames[7].repr.atomic_eth.unwrap();
    assert_eq!(
        (at.va, at.rkey, at.swap_add, at.compare),
        (0x7f00_0000_3000, 0x1234, 2, 1)
    );
    // Frame 9: ATOMIC ACK, MSN 4, original data 1.
    assert_eq!(frames[8].repr.aeth.unwrap().msn, 4);
    assert_eq!(frames[8].repr.atomic_ack_eth.unwrap().orig_data, 1);
    // Frame 10: a CM MAD to QP1 (Q_Key 0x80010000, SrcQP 1).
    let deth = frames[9].repr.deth.unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, 1));
    assert_eq!(frames[9].repr.bth.dest_qp, 1);
    assert_eq!(frames[9].payload.len(), 256);
    // Frame 11: frame 1 again with the first ICRC byte off by one (tshark: 0x431d7725).
    let f = &frames[10];
    assert_eq!(f.icrc_ok, Err(Error::BadIcrc));
    assert_eq!(f.repr, frames[0].repr);
    assert_eq!(f.wire_icrc.to_le_bytes(), [0x43, 0x1d, 0x77, 0x25]);
}

#[test]
fn cm_captures() {
    for (name, count) in [
        ("rxe_cm_req_no_listener.pcap", 4),
        ("synthetic_cm_messages.pcap", 8),
    ] {
        let frames = decode_all(name);
        assert_eq!(frames.len(), count, "{name}");
        for f in &frames {
            assert!(f.icrc_ok.is_ok(), "{name}");
            assert_eq!(f.repr.bth.opcode, Opcode::UD_SEND_ONLY, "{name}");
            assert_eq!(f.repr.bth.dest_qp, 1, "{name}");
            let deth = f.repr.deth.unwrap();
            assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, 1), "{name}");
            assert_eq!(f.payload.len(), 256, "{name}");
            // MAD header: base version 1, management class 7 (CM), class version 2.
            assert_eq!(&f.payload[..3], &[1, 7, 2], "{name}");
        }
    }
}
