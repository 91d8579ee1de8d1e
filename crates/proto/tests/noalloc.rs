//! The data path allocates nothing per message: two RC QPs back to back in memory, SENDs and
//! RDMA WRITEs with one-entry lists or small inline data, heap allocations counted by a global
//! allocator once the queues have grown to their steady size.

use softrdma_proto::transport::{InlineData, Qp, WcStatus};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The system allocator, counting allocations (and reallocations) per thread.
struct Counting;

thread_local! {
    /// Allocations made by this thread (the test harness's own threads do not count).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Counts one allocation of the calling thread.
fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

/// This thread's allocations so far.
fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[path = "common/mem_pair.rs"]
mod mem_pair;
use mem_pair::{config, request, MemEnv, META};

/// Posts `batch` messages of `len` bytes (SEND, or RDMA WRITE when `write`; their data
/// copied at post time, as `IBV_SEND_INLINE` does, when `inline`), moves every packet both
/// ways and reaps every completion, checking they all succeeded.
fn round(
    qps: &mut [(Qp, MemEnv); 2],
    now: &mut Instant,
    buf: &mut [u8],
    (write, len, batch, inline): (bool, u32, u64, bool),
) {
    *now += Duration::from_micros(1);
    let [(a, ea), (b, eb)] = qps;
    for i in 0..batch {
        let mut r = request(i, write, len);
        if inline {
            r.inline = Some(InlineData::zeroed(len as usize));
        }
        assert!(a.post_send(r).is_ok(), "send queue full");
    }
    loop {
        let mut moved = 0;
        while let Some(t) = a.poll_transmit(*now, buf, ea) {
            b.handle_packet(*now, &buf[..t.len], &META, eb);
            moved += 1;
        }
        while let Some(t) = b.poll_transmit(*now, buf, eb) {
            a.handle_packet(*now, &buf[..t.len], &META, ea);
            moved += 1;
        }
        if moved == 0 {
            break;
        }
    }
    let mut done = 0;
    for qp in [a, b] {
        while let Some(c) = qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            done += 1;
        }
    }
    assert_eq!(done, if write { batch } else { 2 * batch });
}

#[test]
fn steady_state_messages_do_not_allocate() {
    let env = MemEnv::new;
    let mut qps = [
        (Qp::new(config(0x11, 0x22)), env()),
        (Qp::new(config(0x22, 0x11)), env()),
    ];
    let mut now = Instant::now();
    let mut buf = vec![0u8; 4096 + 128];
    let cases = [
        (false, 8, 1, false),
        (false, 8, 32, false),
        (false, 8, 32, true),
        (true, 64, 8, true),
        (false, 4096, 32, false),
        (true, 65536, 1, false),
    ];
    // Let every queue grow to the size these rounds need.
    for _ in 0..8 {
        for &case in &cases {
            round(&mut qps, &mut now, &mut buf, case);
        }
    }
    let before = allocs();
    for _ in 0..16 {
        for &case in &cases {
            round(&mut qps, &mut now, &mut buf, case);
        }
    }
    assert_eq!(allocs() - before, 0, "heap allocations");
    // The counter does see this thread's allocations.
    std::hint::black_box(vec![0u8; 16]);
    assert_eq!(allocs() - before, 1);
}
