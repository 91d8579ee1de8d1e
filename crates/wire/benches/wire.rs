//! Micro-benchmarks of the wire crate's hot pieces: the ICRC per byte (one-shot, through the
//! per-flow [`IcrcPrefix`] of the data path, and the IPv4 identification solver), and header
//! parse/emit per packet (BTH alone; RC WRITE FIRST, SEND ONLY and ACK packets whole).
//!
//! Run with `cargo bench -p softrdma-wire --bench wire` (add `-- --quick` for a short run).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softrdma_wire::icrc::{self, IcrcPrefix, IdentBasis, IdentSolver};
use softrdma_wire::ip::{Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr, IP_PROTOCOL_UDP};
use softrdma_wire::opcode::Opcode;
use softrdma_wire::{aeth, bth, reth, roce, ROCE_V2_UDP_PORT};
use std::hint::black_box;
use std::net::Ipv4Addr;

/// Payload sizes of the ICRC benchmarks: a small message, a 1 KiB MTU, a 4 KiB MTU.
const ICRC_PAYLOADS: [usize; 4] = [8, 64, 1024, 4096];

/// Source address of the benchmark flow.
const SRC: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// Destination address of the benchmark flow.
const DST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// UDP source port of the benchmark flow.
const SPORT: u16 = 0xc123;
/// Bytes of IPv4 and UDP header before the transport packet.
const IP_UDP_LEN: usize = 28;

/// A BTH for QP 0x11 with `opcode` and `psn`, AckReq set.
fn bth_repr(opcode: Opcode, psn: u32) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited_event: false,
        mig_req: false,
        pad_count: 0,
        pkey: bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: 0x11,
        ack_req: true,
        psn,
    }
}

/// An RC SEND ONLY with `payload_len` bytes of payload.
fn send_only(payload_len: usize) -> roce::Repr {
    roce::Repr {
        bth: bth_repr(Opcode::RC_SEND_ONLY, 0x12_3456),
        payload_len,
        ..roce::Repr::default()
    }
}

/// An RC RDMA WRITE FIRST of a 64 KiB write carrying `payload_len` bytes.
fn write_first(payload_len: usize) -> roce::Repr {
    roce::Repr {
        bth: bth_repr(Opcode::RC_RDMA_WRITE_FIRST, 0x12_3456),
        reth: Some(reth::Repr {
            va: 0x7f00_dead_b000,
            rkey: 0x1234,
            dma_len: 65536,
        }),
        payload_len,
        ..roce::Repr::default()
    }
}

/// An RC ACKNOWLEDGE (positive, credit invalid).
fn ack() -> roce::Repr {
    roce::Repr {
        bth: bth::Repr {
            ack_req: false,
            ..bth_repr(Opcode::RC_ACKNOWLEDGE, 0x12_3456)
        },
        aeth: Some(aeth::Repr {
            syndrome: aeth::Syndrome::Ack {
                credit: aeth::CREDIT_INVALID,
            },
            msn: 7,
        }),
        ..roce::Repr::default()
    }
}

/// A deterministic payload of `len` bytes.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// The transport packet (BTH through ICRC, ICRC zero) of `repr` with `payload`.
fn transport(repr: &roce::Repr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce::Packet::new_unchecked(&mut b[..]), payload)
        .expect("consistent repr");
    b
}

/// A whole IPv4 packet carrying an RC SEND ONLY with `payload_len` bytes, IPv4
/// identification `ident`, with its ICRC filled in.
fn ipv4_packet(payload_len: usize, ident: u16) -> Vec<u8> {
    let ib = transport(&send_only(payload_len), &payload(payload_len));
    let udp = UdpRepr {
        src_port: SPORT,
        dst_port: ROCE_V2_UDP_PORT,
        payload_len: ib.len(),
    };
    let ip = Ipv4Repr {
        src_addr: SRC,
        dst_addr: DST,
        protocol: IP_PROTOCOL_UDP,
        payload_len: 8 + ib.len(),
        ttl: 64,
        tos: 0,
        ident,
        dont_frag: true,
    };
    let mut b = vec![0u8; IP_UDP_LEN + ib.len()];
    ip.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]))
        .expect("fits");
    udp.emit(&mut UdpPacket::new_unchecked(&mut b[20..]))
        .expect("fits");
    b[IP_UDP_LEN..].copy_from_slice(&ib);
    let crc = icrc::icrc(&b).expect("well-formed");
    let at = b.len() - roce::ICRC_LEN;
    b[at..].copy_from_slice(&crc.to_le_bytes());
    icrc::verify(&b).expect("verifies");
    b
}

/// ICRC per byte over whole IPv4 RoCEv2 packets (throughput counts the whole IP packet):
/// plain CRC-32 of the same bytes as a floor, the one-shot [`icrc::icrc`] (parses IP and
/// UDP, masks, hashes), and the data path's [`IcrcPrefix`] in one piece and in two pieces
/// (headers, then payload, as the sender gathers them). The prefix is a kept flow's, with
/// the header states of short packets, as the data path's are.
fn bench_icrc(c: &mut Criterion) {
    let prefix = IcrcPrefix::ipv4(SRC, DST, SPORT, ROCE_V2_UDP_PORT).with_short_states();
    let mut g = c.benchmark_group("icrc");
    for size in ICRC_PAYLOADS {
        let pkt = ipv4_packet(size, 0);
        let covered_end = pkt.len() - roce::ICRC_LEN;
        let covered = &pkt[IP_UDP_LEN..covered_end];
        assert_eq!(
            prefix.compute(covered).unwrap(),
            icrc::icrc(&pkt).unwrap(),
            "prefix and one-shot agree"
        );
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_with_input(BenchmarkId::new("crc32_floor", size), &pkt, |b, p| {
            b.iter(|| crc32fast::hash(black_box(p)))
        });
        g.bench_with_input(BenchmarkId::new("oneshot", size), &pkt, |b, p| {
            b.iter(|| icrc::icrc(black_box(p)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("prefix", size), covered, |b, ib| {
            b.iter(|| prefix.compute(black_box(ib)).unwrap())
        });
        let hlen = bth::HEADER_LEN;
        g.bench_with_input(
            BenchmarkId::new("prefix_2_pieces", size),
            covered,
            |b, ib| {
                b.iter(|| {
                    let ib = black_box(ib);
                    let mut h = prefix.start(ib.len()).unwrap();
                    h.update(&ib[..hlen]);
                    h.update(&ib[hlen..]);
                    h.finalize()
                })
            },
        );
    }
    g.finish();
}

/// The IPv4 identification solver, per packet: [`icrc::recover_ident`] on a 1024-byte SEND
/// (a full ICRC pass plus building the basis for its length), building an [`IdentBasis`]
/// alone, and the receiver's path [`IcrcPrefix::solve_ident`] with its [`IdentSolver`]
/// cache warm.
fn bench_ident(c: &mut Criterion) {
    const IDENT: u16 = 0x5cf5;
    let pkt = ipv4_packet(1024, IDENT);
    let ib = &pkt[IP_UDP_LEN..];
    let covered = &ib[..ib.len() - roce::ICRC_LEN];
    let carried = roce::Packet::new_checked(ib).unwrap().icrc();
    let prefix = IcrcPrefix::ipv4(SRC, DST, SPORT, ROCE_V2_UDP_PORT);
    let computed = prefix.compute(covered).unwrap();
    let mut solver = IdentSolver::new();
    assert_eq!(icrc::recover_ident(&pkt), Ok(IDENT));
    assert_eq!(
        prefix.solve_ident(&mut solver, covered.len(), computed, carried),
        Some(IDENT)
    );
    let after = 14 + 8 + covered.len();

    let mut g = c.benchmark_group("ident");
    g.throughput(Throughput::Elements(1));
    g.bench_function("recover_ident_1024B", |b| {
        b.iter(|| icrc::recover_ident(black_box(&pkt)).unwrap())
    });
    g.bench_function("basis_new", |b| {
        b.iter(|| IdentBasis::new(black_box(after)))
    });
    g.bench_function("solve_ident_cached", |b| {
        b.iter(|| {
            prefix.solve_ident(
                &mut solver,
                black_box(covered.len()),
                black_box(computed),
                black_box(carried),
            )
        })
    });
    g.finish();
}

/// The BTH alone, per header: parse (checked view + [`bth::Repr::parse`]) and emit.
fn bench_bth(c: &mut Criterion) {
    let repr = bth_repr(Opcode::RC_SEND_ONLY, 0x12_3456);
    let mut buf = [0u8; bth::HEADER_LEN];
    repr.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));

    let mut g = c.benchmark_group("bth");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse", |b| {
        b.iter(|| {
            let p = bth::Packet::new_checked(black_box(&buf[..])).unwrap();
            bth::Repr::parse(&p).unwrap()
        })
    });
    let mut out = [0u8; bth::HEADER_LEN];
    g.bench_function("emit", |b| {
        b.iter(|| {
            black_box(&repr).emit(&mut bth::Packet::new_unchecked(&mut out[..]));
            black_box(&out);
        })
    });
    g.finish();
}

/// Whole transport packets, per packet: parse (checked view + [`roce::Repr::parse`] + the
/// payload slice), emit of the headers alone ([`roce::Repr::emit_header`], what the
/// transport engine does before gathering the payload) and full emit (headers, payload copy,
/// pad, zero ICRC). Packets: RC RDMA WRITE FIRST (BTH + RETH + 4096-byte payload), RC SEND
/// ONLY (BTH + 64-byte payload), RC ACKNOWLEDGE (BTH + AETH).
fn bench_roce(c: &mut Criterion) {
    let cases = [
        ("write_first_4096B", write_first(4096)),
        ("send_only_64B", send_only(64)),
        ("ack", ack()),
    ];
    let mut g = c.benchmark_group("roce");
    g.throughput(Throughput::Elements(1));
    for (name, repr) in cases {
        let data = payload(repr.payload_len);
        let pkt = transport(&repr, &data);
        assert_eq!(
            roce::Repr::parse(&roce::Packet::new_checked(&pkt[..]).unwrap()),
            Ok(repr)
        );
        g.bench_with_input(BenchmarkId::new("parse", name), &pkt, |b, pkt| {
            b.iter(|| {
                let p = roce::Packet::new_checked(black_box(&pkt[..])).unwrap();
                let r = roce::Repr::parse(&p).unwrap();
                (r, p.payload().len())
            })
        });
        let mut out = vec![0u8; pkt.len()];
        g.bench_with_input(BenchmarkId::new("emit_header", name), &repr, |b, repr| {
            b.iter(|| black_box(repr).emit_header(&mut out).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("emit", name), &repr, |b, repr| {
            b.iter(|| {
                black_box(repr)
                    .emit(&mut roce::Packet::new_unchecked(&mut out[..]), &data)
                    .unwrap();
                black_box(&out);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_icrc, bench_ident, bench_bth, bench_roce);
criterion_main!(benches);
