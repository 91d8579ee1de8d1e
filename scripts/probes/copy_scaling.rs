//! How fast do k threads copy bytes that another core just wrote? (What a same-host lane's
//! receiver does: the sender's core fills the ring, the receiver's copies it out.) The
//! measurement behind the copy engines (crates/softrdma/src/verbs/copy.rs, BENCHMARKS.md
//! "Copy engines"). No dependencies, so it runs on a bare machine:
//!
//!     rustc -O scripts/probes/copy_scaling.rs -o /tmp/copy_scaling && /tmp/copy_scaling
//!
//! Each round: one thread writes a 2 MiB source, then k threads copy one k-th of it each into
//! a 2 MiB destination; prints GB/s of the copy phase (barrier to barrier) for k = 1, 2, 4.
use std::sync::{Arc, Barrier};
use std::time::Instant;

const LEN: usize = 2 << 20;
const ROUNDS: usize = 400;

/// A buffer shared by threads that write disjoint parts of it (or one writes while none read).
struct Shared(Vec<u8>);

impl Shared {
    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }
}

// SAFETY: the barriers order every access: the writer fills `src` while the copiers wait, and
// each copier writes only its own part of `dst`.
unsafe impl Sync for Shared {}

fn main() {
    for k in [1usize, 2, 4] {
        let src = Arc::new(Shared(vec![0u8; LEN]));
        let dst = Arc::new(Shared(vec![0u8; LEN]));
        let bar = Arc::new(Barrier::new(k + 1));
        let copiers: Vec<_> = (0..k)
            .map(|t| {
                let (src, dst, bar) = (src.clone(), dst.clone(), bar.clone());
                std::thread::spawn(move || {
                    let part = LEN / k;
                    for _ in 0..ROUNDS {
                        bar.wait();
                        // SAFETY: this thread's own part of both buffers, in bounds.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src.ptr().add(t * part),
                                dst.ptr().add(t * part),
                                part,
                            )
                        };
                        bar.wait();
                    }
                })
            })
            .collect();
        let mut ns = 0u128;
        for round in 0..ROUNDS {
            // SAFETY: the copiers wait at the barrier meanwhile.
            unsafe { std::ptr::write_bytes(src.ptr(), round as u8, LEN) };
            bar.wait();
            let t0 = Instant::now();
            bar.wait();
            ns += t0.elapsed().as_nanos();
        }
        for c in copiers {
            c.join().unwrap();
        }
        println!("{k} thread(s): {:.1} GB/s", (LEN * ROUNDS) as f64 / ns as f64);
    }
}
