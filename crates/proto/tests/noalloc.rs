//! The data path allocates nothing per message: two RC QPs back to back in memory, SENDs and
//! RDMA WRITEs with one-entry lists, heap allocations counted by a global allocator once the
//! queues have grown to their steady size.

use softrdma_proto::transport::{
    AccessError, AtomicOp, Env, Qp, QpConfig, RecvRequest, RxMeta, SendOp, SendRequest, Sge,
    WcStatus,
};
use softrdma_proto::{Mtu, QpType};
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

const KEY: u32 = 1;
const MEM_LEN: usize = 64 * 1024;
const META: RxMeta = RxMeta { grh: [0; 40] };

/// One side's memory (one region, any access) and an endless receive queue.
struct MemEnv {
    mem: Vec<u8>,
    next_recv: u64,
}

impl MemEnv {
    fn at(&mut self, key: u32, addr: u64, len: usize) -> Result<&mut [u8], AccessError> {
        if key != KEY {
            return Err(AccessError::InvalidKey);
        }
        let start = usize::try_from(addr).map_err(|_| AccessError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        self.mem.get_mut(start..end).ok_or(AccessError::OutOfBounds)
    }
}

impl Env for MemEnv {
    fn read_local(&mut self, sge: &Sge, offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(sge.lkey, sge.addr + u64::from(offset), n)?);
        Ok(())
    }
    fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
        self.at(sge.lkey, sge.addr + u64::from(offset), src.len())?
            .copy_from_slice(src);
        Ok(())
    }
    fn check_remote(&mut self, rkey: u32, va: u64, len: u64, _: bool) -> Result<(), AccessError> {
        let len = usize::try_from(len).map_err(|_| AccessError::OutOfBounds)?;
        self.at(rkey, va, len).map(|_| ())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, src: &[u8]) -> Result<(), AccessError> {
        self.at(rkey, va, src.len())?.copy_from_slice(src);
        Ok(())
    }
    fn read_remote(&mut self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(rkey, va, n)?);
        Ok(())
    }
    fn atomic_remote(&mut self, _: u32, _: u64, _: AtomicOp) -> Result<u64, AccessError> {
        Err(AccessError::AccessDenied)
    }
    fn take_recv(&mut self) -> Option<RecvRequest> {
        self.next_recv += 1;
        Some(RecvRequest {
            wr_id: self.next_recv,
            sges: [Sge {
                addr: 0,
                length: 4096,
                lkey: KEY,
            }]
            .into(),
        })
    }
}

fn config(qp_num: u32, dest: u32) -> QpConfig {
    QpConfig {
        qp_type: QpType::Rc,
        qp_num,
        dest_qp_num: dest,
        path_mtu: Mtu::Mtu4096,
        sq_psn: 1000,
        rq_psn: 1000,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        qkey: 0,
        access_flags: 2 | 4 | 8,
        max_send_wr: 256,
    }
}

/// Posts `batch` messages of `len` bytes (SEND, or RDMA WRITE when `write`), moves every
/// packet both ways and reaps every completion, checking they all succeeded.
fn round(
    qps: &mut [(Qp, MemEnv); 2],
    now: &mut Instant,
    buf: &mut [u8],
    write: bool,
    len: u32,
    batch: u64,
) {
    *now += Duration::from_micros(1);
    let [(a, ea), (b, eb)] = qps;
    for i in 0..batch {
        let op = if write {
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: KEY,
            }
        } else {
            SendOp::Send
        };
        let req = SendRequest {
            wr_id: i,
            op,
            sges: [Sge {
                addr: 0,
                length: len,
                lkey: KEY,
            }]
            .into(),
            inline: None,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        };
        assert!(a.post_send(req).is_ok(), "send queue full");
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
    let env = || MemEnv {
        mem: vec![0; MEM_LEN],
        next_recv: 0,
    };
    let mut qps = [
        (Qp::new(config(0x11, 0x22)), env()),
        (Qp::new(config(0x22, 0x11)), env()),
    ];
    let mut now = Instant::now();
    let mut buf = vec![0u8; 4096 + 128];
    let cases = [
        (false, 8, 1),
        (false, 8, 32),
        (false, 4096, 32),
        (true, 65536, 1),
    ];
    // Let every queue grow to the size these rounds need.
    for _ in 0..8 {
        for &(write, len, batch) in &cases {
            round(&mut qps, &mut now, &mut buf, write, len, batch);
        }
    }
    let before = allocs();
    for _ in 0..16 {
        for &(write, len, batch) in &cases {
            round(&mut qps, &mut now, &mut buf, write, len, batch);
        }
    }
    assert_eq!(allocs() - before, 0, "heap allocations");
    // The counter does see this thread's allocations.
    std::hint::black_box(vec![0u8; 16]);
    assert_eq!(allocs() - before, 1);
}
