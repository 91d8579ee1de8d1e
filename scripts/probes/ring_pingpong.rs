//! How many cache-line crossings does a one-way message over a same-host lane's ring cost?
//! A ping-pong between two threads over two single-producer single-consumer rings of
//! 64-byte-aligned records, in the layouts a lane could use. No dependencies, so it runs on a
//! bare machine:
//!
//!     rustc -O scripts/probes/ring_pingpong.rs -o /tmp/ring_pingpong && /tmp/ring_pingpong
//!
//! Layouts:
//! - `head`: the producer publishes a `head` word on a line of its own; the consumer spins on
//!   it, then reads the record (a lane's ring up to session 16);
//! - `seq`: each record's header carries the position it was written at, stored last; the
//!   consumer spins on the header of the record at its own position (one line for a small
//!   record) and never reads a `head` word.
//!
//! Each with a ring of 4 MiB (records walk through cold memory) and of 64 KiB, and with and
//! without an extra record (an ACK) before each answer. Prints the median one-way time of 9
//! rounds of 200,000 round trips (ns).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const ROUNDS: usize = 9;
const TRIPS: usize = 200_000;

#[repr(C, align(64))]
struct Line(AtomicU64);

struct Ring {
    head: Line,
    tail: Line,
    data: Vec<AtomicU64>,
    cap: u64,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            head: Line(AtomicU64::new(0)),
            tail: Line(AtomicU64::new(0)),
            data: (0..cap / 8).map(|_| AtomicU64::new(u64::MAX)).collect(),
            cap: cap as u64,
        }
    }
    fn word(&self, pos: u64, i: usize) -> &AtomicU64 {
        &self.data[((pos & (self.cap - 1)) / 8) as usize + i]
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Head,
    Seq,
}

/// One end: produces into `out`, consumes from `inp`.
struct End {
    out: Arc<Ring>,
    inp: Arc<Ring>,
    head: u64,
    tail: u64,
    layout: Layout,
}

impl End {
    fn send(&mut self, v: u64) {
        let r = &self.out;
        let pos = self.head;
        // A 64-byte record: header word, then payload words.
        r.word(pos, 1).store(v, Ordering::Relaxed);
        r.word(pos, 2).store(v, Ordering::Relaxed);
        match self.layout {
            Layout::Head => {
                r.word(pos, 0).store(24, Ordering::Relaxed);
                self.head += 64;
                r.head.0.store(self.head, Ordering::Release);
            }
            Layout::Seq => {
                r.word(pos, 0).store(pos, Ordering::Release);
                self.head += 64;
            }
        }
    }
    fn recv(&mut self) -> u64 {
        let r = &self.inp;
        let pos = self.tail;
        loop {
            let ready = match self.layout {
                Layout::Head => r.head.0.load(Ordering::Acquire) != pos,
                Layout::Seq => r.word(pos, 0).load(Ordering::Acquire) == pos,
            };
            if ready {
                break;
            }
            std::hint::spin_loop();
        }
        let v = r.word(pos, 1).load(Ordering::Relaxed);
        self.tail += 64;
        if self.tail % 4096 == 0 {
            r.tail.0.store(self.tail, Ordering::Release);
        }
        v
    }
}

fn round(layout: Layout, cap: usize, ack: bool) -> f64 {
    let ab = Arc::new(Ring::new(cap));
    let ba = Arc::new(Ring::new(cap));
    let mut a = End { out: ab.clone(), inp: ba.clone(), head: 0, tail: 0, layout };
    let mut b = End { out: ba, inp: ab, head: 0, tail: 0, layout };
    let t = std::thread::spawn(move || {
        for i in 0..TRIPS as u64 {
            let v = b.recv();
            assert_eq!(v, i);
            if ack {
                b.send(u64::MAX - 1);
            }
            b.send(v);
        }
    });
    let start = Instant::now();
    for i in 0..TRIPS as u64 {
        a.send(i);
        if ack {
            a.recv();
        }
        assert_eq!(a.recv(), i);
    }
    let el = start.elapsed();
    t.join().unwrap();
    el.as_nanos() as f64 / TRIPS as f64 / 2.0
}

fn main() {
    println!("layout  ring     ack  one-way ns (median of {ROUNDS})");
    for (layout, name) in [(Layout::Head, "head"), (Layout::Seq, "seq")] {
        for cap in [4usize << 20, 64 << 10] {
            for ack in [false, true] {
                let mut v: Vec<f64> = (0..ROUNDS).map(|_| round(layout, cap, ack)).collect();
                v.sort_by(|x, y| x.partial_cmp(y).unwrap());
                println!(
                    "{name:6}  {:>5}K  {:3}  {:.0} (min {:.0})",
                    cap >> 10,
                    if ack { "yes" } else { "no" },
                    v[ROUNDS / 2],
                    v[0]
                );
            }
        }
    }
}
