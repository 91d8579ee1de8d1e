//! The CPU cost of one small message through the whole data path, both ends on one
//! application thread (each device's progress thread exists, idle while that thread polls):
//! two devices of this process joined by a same-host lane (or the wire, with
//! `SOFTRDMA_TRANSPORT=wire`), an RC QP each; one thread posts a batch of 8-byte SENDs on one
//! side, polls the other side's CQ for their receives (reposting each), then polls the send
//! completions. With no second thread the figure is the sum of the sender's and the
//! receiver's work per message, free of scheduling; under `valgrind --tool=callgrind` it is an
//! instruction count that does not move from run to run.
//!
//!     cargo bench -p softrdma --bench msg_cost              # ns per message
//!     MSGS=200000 valgrind --tool=callgrind target/release/deps/msg_cost-*  # instructions
//!
//! (Over the wire give valgrind `--fair-sched=yes`. With its default, unfair lock between
//! threads, a ping-pong ended in `RetryExcErr` after 40-700 round trips, its QP counting
//! local ACK timeouts: the polling thread, running on, starves the device's other threads
//! past the pair's 16.8 ms timeout. Natively, even beside busy loops on its core, it runs.)
//!
//! (`MSGS` sets the number of messages; without `--bench`, as `cargo test --benches` runs
//! it, a few batches only.)
//!
//! With `PINGPONG=1` the thread plays a ping-pong instead: one SEND from the first device,
//! polled in by the second, which reposts its receive and answers with one SEND, polled in by
//! the first; the figure is then per round trip (two messages, each with its ACK), the
//! unbatched work a latency test puts on its critical path.
//!
//! With `PINGPONG=1 EMPTY_POLLS=1` the ping-pong is followed by 50,000 polls of a CQ with
//! nothing to take, its lane up and warm: the cost of one look of a busy-polling thread
//! while lanes carry traffic (the device's socket is then read every 1024th look only), which
//! sets how long after a message lands in the ring the thread sees it (half a look on
//! average). (With the records of the ping-pong in QP pair rings, the device lane may carry
//! nothing for long: the socket is then read at each look, some 0.6 µs here, until lane
//! traffic comes again; in a two-process `perf send --lat` the device lane's traffic keeps it
//! warm: 5,218 `recvmmsg` calls in 400,000 round trips.)
//!
//! Prints the messages, the time and ns per message (or per round trip, or per look).

// The live tests' connected pair: two devices on loopback addresses of this run's own.
#[path = "../tests/common/pair.rs"]
mod pair;

use pair::{pair_on, unique, Opts};
use softrdma::*;
use std::time::Instant;

const BATCH: u64 = 64;

fn main() {
    // `cargo bench` passes `--bench`; run otherwise (`cargo test --benches`), it is a smoke
    // test of a few batches.
    let bench = std::env::args().any(|a| a == "--bench");
    let msgs: u64 = std::env::var("MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 2_000_000 } else { BATCH * 10 });
    let o = Opts {
        mtu: Mtu::Mtu4096,
        ..Opts::default()
    };
    let (a, b) = pair_on(&unique(), &unique(), QpType::Rc, 4096, &o);
    let recv = |wr_id: u64| b.post_recv(wr_id, 64 + (wr_id % BATCH) as usize * 8, 8);
    for i in 0..BATCH * 2 {
        recv(i);
    }
    let mut wc = [WorkCompletion::default(); 64];
    let run = |n: u64, wc: &mut [WorkCompletion]| {
        let mut sent = 0;
        while sent < n {
            let l = [a.sge(0, 8)];
            for i in 0..BATCH {
                let signaled = i == BATCH - 1;
                a.qp.post_send(&[SendWr {
                    wr_id: sent + i,
                    sg_list: &l,
                    send_flags: if signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    },
                    ..Default::default()
                }])
                .unwrap();
            }
            // Both CQs are polled in turn, as a thread driving both devices would: the
            // sender's window moves on only as its device takes the ACKs.
            let (mut got, mut done) = (0, false);
            while got < BATCH || !done {
                let k = b.cq.poll(wc).unwrap();
                for w in &wc[..k] {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    recv(w.wr_id);
                }
                got += k as u64;
                let k = a.cq.poll(wc).unwrap();
                for w in &wc[..k] {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    done = true;
                }
            }
            sent += BATCH;
        }
    };
    if std::env::var("PINGPONG").is_ok_and(|v| v == "1") {
        pingpong(&a, &b, msgs);
        if std::env::var("EMPTY_POLLS").is_ok_and(|v| v == "1") {
            empty_polls(&b, &a, 50_000);
        }
        return;
    }
    run(BATCH * 100, &mut wc); // warm up (and let the lane come)
    let t = Instant::now();
    run(msgs, &mut wc);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{msgs} messages of 8 B, one thread: {:.3} s, {:.1} ns per message ({:.2} M msg/s)",
        secs,
        secs * 1e9 / msgs as f64,
        msgs as f64 / secs / 1e6
    );
}

/// Polls `side`'s CQ until its receive completes (taking the send completions on the way),
/// then reposts that receive.
fn take_one(side: &pair::Side, wc: &mut [WorkCompletion]) {
    loop {
        let k = side.cq.poll(wc).unwrap();
        let mut got = false;
        for w in &wc[..k] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            if w.opcode == WcOpcode::Recv {
                side.post_recv(w.wr_id, 64, 8);
                got = true;
            }
        }
        if got {
            return;
        }
    }
}

/// `n` round trips of one 8-byte SEND each way, one at a time (see the module's text).
fn pingpong(a: &pair::Side, b: &pair::Side, n: u64) {
    let mut wc = [WorkCompletion::default(); 16];
    for side in [a, b] {
        for i in 0..4 {
            side.post_recv(i, 64, 8);
        }
    }
    let send = |side: &pair::Side, wr_id: u64| {
        let l = [side.sge(0, 8)];
        side.qp
            .post_send(&[SendWr {
                wr_id,
                sg_list: &l,
                send_flags: SendFlags::SIGNALED,
                ..Default::default()
            }])
            .unwrap();
    };
    let mut trip = |i: u64| {
        send(a, i);
        take_one(b, &mut wc);
        send(b, i);
        take_one(a, &mut wc);
    };
    for i in 0..1000 {
        trip(i); // warm up (and let the lane come)
    }
    let t = Instant::now();
    for i in 0..n {
        trip(i);
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} round trips of 8 B each way, one thread: {:.3} s, {:.1} ns per round trip",
        secs,
        secs * 1e9 / n as f64
    );
}

/// `n` polls of `side`'s CQ, which has nothing to take (see the module's text); `peer` is the
/// other end of the ping-pong.
fn empty_polls(side: &pair::Side, peer: &pair::Side, n: u64) {
    let mut wc = [WorkCompletion::default(); 16];
    // The completion of its last SEND comes with the peer's acknowledgement, held by the peer
    // for its answer: the peer's empty poll sends it (without it, the peer's progress thread
    // would, up to a few ms later, when the lanes are no longer warm), and it is waited for,
    // as anything that completed during the looks would be counted as found.
    while peer.cq.poll(&mut wc).unwrap() > 0 {}
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let k = side.cq.poll(&mut wc).unwrap();
        if wc[..k].iter().any(|w| w.opcode == WcOpcode::Send) {
            break;
        }
        assert!(Instant::now() < deadline, "the last SEND never completed");
    }
    while side.cq.poll(&mut wc).unwrap() > 0 {}
    let t = Instant::now();
    for _ in 0..n {
        assert_eq!(side.cq.poll(&mut wc).unwrap(), 0, "nothing was sent");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} polls of a CQ with nothing to take: {:.3} s, {:.1} ns per poll",
        secs,
        secs * 1e9 / n as f64
    );
}
