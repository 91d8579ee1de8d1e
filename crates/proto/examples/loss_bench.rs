//! Loss-recovery benchmark over the simulated network of `tests/common/sim_harness.rs`:
//! RC SENDs of one size from QP A to QP B over 2 GB/s links with 10 µs one-way delay, under
//! drop / duplication / reordering / corruption at several rates, in simulated time. Every
//! message is checked at the receiver: received exactly once, in order, byte-exact.
//!
//! `cargo run --release -p softrdma-proto --example loss_bench -- [N] [SIZE] [SEEDS]`
//! (defaults 2000 messages of 65536 bytes, 3 seeds). The QPs have the local ACK timeout
//! rdma_cm gives (19: 2.1 s) and retry_cnt 7, as `softrdma perf` does. For each loss rate it
//! prints the throughput in simulated time (median over the seeds) and its ratio to the
//! lossless run, with the recovery counters of the sender.

#[path = "../tests/common/sim_harness.rs"]
mod harness;

use harness::*;
use softrdma_proto::transport::{RecvRequest, SendOp, SendRequest, Sge, WcStatus};
use softrdma_proto::{Mtu, QpType};
use std::time::Duration;

const SRC_KEY: u32 = 1;
const DST_KEY: u32 = 2;

/// The byte `j` of message `i`.
fn pattern(i: u64, j: usize) -> u8 {
    (i.wrapping_mul(0x9E37_79B9).wrapping_add(j as u64 * 31) >> 3) as u8 ^ (j as u8)
}

struct Run {
    gbps: f64,
    secs: f64,
    probes: u64,
    timeouts: u64,
    retries: u64,
    retrans: u64,
    error: Option<String>,
}

fn run(loss: f64, n: u64, size: usize, seed: u64) -> Run {
    let net = NetCfg {
        loss,
        dup: loss / 4.0,
        reorder: loss / 4.0,
        corrupt: loss / 4.0,
        delay: Duration::from_micros(10),
        jitter: Duration::from_micros(2),
        blackhole: false,
    };
    let mut sim = Sim::new(QpType::Rc, Mtu::Mtu4096, net, seed);
    sim.link_ps_per_byte = 500; // 2 GB/s
    for node in &mut sim.nodes {
        let mut c = *node.qp.config();
        c.timeout = 19;
        c.retry_cnt = 7;
        node.qp.set_config(c);
    }
    let depth: u64 = 64;
    let src = sim.nodes[0]
        .env
        .add_region(SRC_KEY, depth as usize * size, LOCAL_WRITE);
    let dst = sim.nodes[1]
        .env
        .add_region(DST_KEY, depth as usize * size, LOCAL_WRITE);
    let recv = |i: u64| RecvRequest {
        wr_id: i,
        sges: vec![Sge {
            addr: dst + (i % depth) * size as u64,
            length: size as u32,
            lkey: DST_KEY,
        }]
        .into(),
    };
    for i in 0..depth {
        sim.nodes[1].env.rq.push_back(recv(i));
    }
    let t0 = sim.now;
    let (mut posted, mut sent_done, mut received) = (0u64, 0u64, 0u64);
    let mut error = None;
    while received < n {
        while posted < n && posted - sent_done < depth {
            let slot = (posted % depth) as usize * size;
            let buf = sim.nodes[0].env.bytes_mut(SRC_KEY, src + slot as u64, size);
            for (j, b) in buf.iter_mut().enumerate() {
                *b = pattern(posted, j);
            }
            sim.post(
                0,
                SendRequest {
                    wr_id: posted,
                    op: SendOp::Send,
                    sges: vec![Sge {
                        addr: src + slot as u64,
                        length: size as u32,
                        lkey: SRC_KEY,
                    }]
                    .into(),
                    inline: None,
                    signaled: true,
                    solicited: false,
                    fence: false,
                    ud: None,
                },
            );
            posted += 1;
        }
        let limit = (sim.now - sim.base) + Duration::from_secs(60);
        let progressed = sim.run(limit, |s| {
            !s.nodes[0].comps.is_empty() || !s.nodes[1].comps.is_empty()
        });
        if !progressed {
            error = Some(format!("stalled after {received} messages"));
            break;
        }
        for c in std::mem::take(&mut sim.nodes[0].comps) {
            if c.status != WcStatus::Success || c.wr_id != sent_done {
                error = Some(format!("send completion {c:?}, expected wr {sent_done}"));
            }
            sent_done += 1;
        }
        for c in std::mem::take(&mut sim.nodes[1].comps) {
            if c.status != WcStatus::Success || c.wr_id != received || c.byte_len as usize != size {
                error = Some(format!("receive completion {c:?}, expected wr {received}"));
                break;
            }
            let at = dst + (received % depth) * size as u64;
            let got = sim.nodes[1].env.bytes(DST_KEY, at, size);
            if let Some(j) = (0..size).find(|&j| got[j] != pattern(received, j)) {
                error = Some(format!("message {received}: byte {j} differs"));
                break;
            }
            sim.nodes[1].env.rq.push_back(recv(received + depth));
            received += 1;
        }
        if error.is_some() {
            break;
        }
    }
    let secs = (sim.now - t0).as_secs_f64();
    let st = sim.nodes[0].qp.stats();
    Run {
        gbps: received as f64 * size as f64 / secs / 1e9,
        secs,
        probes: st.probes,
        timeouts: st.timeouts,
        retries: st.retries,
        retrans: st.retransmitted_packets,
        error,
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: N SIZE SEEDS"))
        .collect();
    let n = args.first().copied().unwrap_or(2000);
    let size = args.get(1).copied().unwrap_or(65536) as usize;
    let seeds = args.get(2).copied().unwrap_or(3).max(1);
    println!("{n} RC SENDs of {size} B, 2 GB/s links, 10 us delay, timeout 19, retry_cnt 7");
    println!("| loss | GB/s (sim time, median of {seeds}) | of lossless | sim s | probes | timeouts | retries | retransmitted pkts | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut base = None;
    for loss in [0.0, 0.01, 0.05, 0.2] {
        let mut runs: Vec<Run> = (0..seeds).map(|s| run(loss, n, size, s + 1)).collect();
        runs.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
        let errors: Vec<String> = runs.iter().filter_map(|r| r.error.clone()).collect();
        let m = &runs[runs.len() / 2];
        let b = *base.get_or_insert(m.gbps);
        println!(
            "| {}% | {:.3} | {:.1}% | {:.4} | {} | {} | {} | {} | {} |",
            loss * 100.0,
            m.gbps,
            100.0 * m.gbps / b,
            m.secs,
            m.probes,
            m.timeouts,
            m.retries,
            m.retrans,
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join("; ")
            }
        );
    }
}
