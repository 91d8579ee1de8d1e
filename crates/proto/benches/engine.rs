//! Micro-benchmarks of the sans-IO transport engine with no I/O: two RC [`Qp`]s connected back
//! to back in memory, packets handed from one's `poll_transmit` straight to the other's
//! `handle_packet`, a fixed clock advanced by hand. What is measured is the transport alone —
//! segmentation, header emit and parse, PSN/ACK bookkeeping, the payload copies through
//! [`Env`], completions — with no ICRC (the owner computes it), sockets, threads or clock
//! reads.
//!
//! Run with `cargo bench -p softrdma-proto --bench engine` (add `-- --quick` for a short run).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softrdma_proto::transport::{Qp, WcStatus};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "../tests/common/mem_pair.rs"]
mod mem_pair;
use mem_pair::{config, request, MemEnv, META};

/// Room for one packet at MTU 4096 (payload + headers + pad + ICRC).
const BUF_LEN: usize = 4096 + 128;
/// How far the fake clock moves per measured round.
const TICK: Duration = Duration::from_micros(1);

/// What one measured round posts: `batch` requests of `op` with `len` bytes each.
#[derive(Debug, Clone, Copy)]
struct Workload {
    /// SEND when false, RDMA WRITE (to address 0 of the peer) when true.
    write: bool,
    /// Message length in bytes.
    len: u32,
    /// Requests posted before the packets are moved.
    batch: u32,
}

/// Two connected RC QPs (requester `a`, responder `b`), their memory, one packet buffer and
/// the fake clock.
struct Pair {
    a: Qp,
    b: Qp,
    env_a: MemEnv,
    env_b: MemEnv,
    buf: Vec<u8>,
    now: Instant,
    wr_id: u64,
}

impl Pair {
    /// A fresh pair; the only clock read, outside any measured loop.
    fn new() -> Pair {
        Pair {
            a: Qp::new(config(0x11, 0x22)),
            b: Qp::new(config(0x22, 0x11)),
            env_a: MemEnv::new(),
            env_b: MemEnv::new(),
            buf: vec![0; BUF_LEN],
            now: Instant::now(),
            wr_id: 0,
        }
    }

    /// Posts the round's requests on `a`.
    fn post(&mut self, w: Workload) {
        for _ in 0..w.batch {
            self.wr_id += 1;
            if self
                .a
                .post_send(request(self.wr_id, w.write, w.len))
                .is_err()
            {
                panic!("send queue full");
            }
        }
    }

    /// Moves packets both ways until neither side has anything to send; each side drains
    /// everything it has before the other answers (so cumulative ACKs coalesce, as they do
    /// behind a batched socket). Returns the packets moved.
    fn pump(&mut self) -> u64 {
        let mut total = 0;
        loop {
            let there = forward(
                self.now,
                &mut self.buf,
                (&mut self.a, &mut self.env_a),
                (&mut self.b, &mut self.env_b),
            );
            let back = forward(
                self.now,
                &mut self.buf,
                (&mut self.b, &mut self.env_b),
                (&mut self.a, &mut self.env_a),
            );
            if there + back == 0 {
                return total;
            }
            total += there + back;
        }
    }

    /// Takes every completion of both sides; returns (successful, failed).
    fn reap(&mut self) -> (u32, u32) {
        let (mut ok, mut bad) = (0, 0);
        for qp in [&mut self.a, &mut self.b] {
            while let Some(c) = qp.poll_completion() {
                if c.status == WcStatus::Success {
                    ok += 1;
                } else {
                    bad += 1;
                }
            }
        }
        (ok, bad)
    }

    /// One measured round: post, move every packet, reap; returns the packets moved.
    fn round(&mut self, w: Workload) -> u64 {
        self.now += TICK;
        self.post(w);
        let packets = self.pump();
        black_box(self.reap());
        packets
    }

    /// Runs a few rounds outside measurement and returns the packets one round moves,
    /// checking that every round moves the same number and completes every request.
    fn packets_per_round(w: Workload) -> u64 {
        let mut p = Pair::new();
        let mut per_round = None;
        for _ in 0..4 {
            p.now += TICK;
            p.post(w);
            let n = p.pump();
            let (ok, bad) = p.reap();
            let expect = if w.write { w.batch } else { 2 * w.batch };
            assert_eq!((ok, bad), (expect, 0), "{w:?}: completions");
            assert_eq!(*per_round.get_or_insert(n), n, "{w:?}: steady state");
        }
        per_round.unwrap_or(0)
    }
}

/// Hands every packet `from` has to send to `to`, through the one buffer `buf`; returns how
/// many.
fn forward(
    now: Instant,
    buf: &mut [u8],
    (from, from_env): (&mut Qp, &mut MemEnv),
    (to, to_env): (&mut Qp, &mut MemEnv),
) -> u64 {
    let mut n = 0;
    while let Some(t) = from.poll_transmit(now, buf, from_env) {
        to.handle_packet(now, &buf[..t.len], &META, to_env);
        n += 1;
    }
    n
}

/// Packets per second through the engine: per round, `batch` messages posted on one QP,
/// every packet (data and ACKs) moved both ways, all completions polled. The throughput is
/// the packets one round moves (data packets + coalesced ACKs).
fn bench_packets(c: &mut Criterion) {
    let cases = [
        (
            "send_8B_x1",
            Workload {
                write: false,
                len: 8,
                batch: 1,
            },
        ),
        (
            "send_8B_x32",
            Workload {
                write: false,
                len: 8,
                batch: 32,
            },
        ),
        (
            "send_4KiB_x32",
            Workload {
                write: false,
                len: 4096,
                batch: 32,
            },
        ),
        (
            "write_64KiB_x1",
            Workload {
                write: true,
                len: 64 * 1024,
                batch: 1,
            },
        ),
    ];
    let mut g = c.benchmark_group("engine_packets");
    for (name, w) in cases {
        let packets = Pair::packets_per_round(w);
        g.throughput(Throughput::Elements(packets));
        let mut pair = Pair::new();
        g.bench_function(name, |b| b.iter(|| pair.round(w)));
    }
    g.finish();
}

/// Payload bytes per second of 64 KiB RDMA WRITEs (16 packets at MTU 4096 plus one ACK per
/// round): the same round as `engine_packets/write_64KiB_x1`, reported in bytes.
fn bench_bytes(c: &mut Criterion) {
    let w = Workload {
        write: true,
        len: 64 * 1024,
        batch: 1,
    };
    let mut g = c.benchmark_group("engine_bytes");
    g.throughput(Throughput::Bytes(u64::from(w.len * w.batch)));
    let mut pair = Pair::new();
    g.bench_function("write_64KiB_x1", |b| b.iter(|| pair.round(w)));
    g.finish();
}

criterion_group!(benches, bench_packets, bench_bytes);
criterion_main!(benches);
