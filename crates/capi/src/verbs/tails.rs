//! The state after the C header of every QP and CQ wrapper: the rest of `struct ibv_qp_ex` /
//! `struct ibv_cq_ex` and the builders' and pollers' state that [`super::ex`] drives. It sits
//! under [`super::objects`] so the wrappers can hold it without the objects importing the
//! extended verbs.

use crate::abi::*;
use libc::c_int;
use softrdma::{SendFlags, Sge, WorkCompletion, WrOpcode};
use std::cell::UnsafeCell;
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) const QP_TAIL: usize = size_of::<ibv_qp_ex>() - size_of::<ibv_qp>();
pub(crate) const CQ_TAIL: usize = size_of::<ibv_cq_ex>() - size_of::<ibv_cq>();

/// The room after `struct ibv_qp` in every QP wrapper: the rest of `struct ibv_qp_ex`
/// (rdma-core HEAD's 360 bytes), then the batch of an extended QP.
#[repr(C)]
pub struct QpExTail {
    /// `comp_mask` … `wr_flush` of `struct ibv_qp_ex`, zero for a plain QP.
    pub(crate) raw: [u64; QP_TAIL / 8],
    /// The builders' state, for a QP with the extended table.
    pub(crate) batch: Option<Box<WrBatch>>,
}

impl Default for QpExTail {
    fn default() -> Self {
        QpExTail {
            raw: [0; QP_TAIL / 8],
            batch: None,
        }
    }
}

/// The room after `struct ibv_cq` in every CQ wrapper: the rest of `struct ibv_cq_ex`,
/// then the polling state of a CQ made by `create_cq_ex`.
#[repr(C)]
pub struct CqExTail {
    /// `comp_mask` … `read_completion_wallclock_ns` of `struct ibv_cq_ex`.
    pub(crate) raw: [u64; CQ_TAIL / 8],
    /// The current completion, for a CQ with the polling table.
    pub(crate) poll: Option<Box<CqPoll>>,
}

impl Default for CqExTail {
    fn default() -> Self {
        CqExTail {
            raw: [0; CQ_TAIL / 8],
            poll: None,
        }
    }
}

/// A lock held from `ibv_wr_start` to `ibv_wr_complete`/`ibv_wr_abort` (or from a
/// successful `ibv_start_poll` to `ibv_end_poll`): calls in C, so no guard object.
pub(crate) struct SpinLock(pub(crate) AtomicBool);

impl SpinLock {
    pub(crate) fn lock(&self) {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    pub(crate) fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One built request: a flattened `SendWr` whose entries are a range of the batch's pool
/// (or of its inline bytes) and whose address handle is a raw pointer, so it is `Copy` and
/// lives in a vector sized at creation.
#[derive(Clone, Copy)]
pub(crate) struct Built {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) imm_data: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) ah: *const softrdma::Ah,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
    /// BIND_MW: the window (its C header) and the binding.
    pub(crate) mw: *mut ibv_mw,
    pub(crate) bind: ibv_mw_bind_info,
    /// Entries `sges[sge_at .. sge_at + sge_n]`, or with `inline` the bytes
    /// `inline[sge_at .. sge_at + sge_n]`.
    pub(crate) sge_at: u32,
    pub(crate) sge_n: u32,
    pub(crate) inline: bool,
}

/// The requests built since `ibv_wr_start`.
pub(crate) struct Batch {
    pub(crate) wrs: Vec<Built>,
    pub(crate) sges: Vec<Sge>,
    pub(crate) inline: Vec<u8>,
    /// The first error a builder met (0: none); `ibv_wr_complete` returns it.
    pub(crate) err: c_int,
}

impl Batch {
    pub(crate) fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
        self.err = 0;
    }

    pub(crate) fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }

    /// The request the setters apply to (the last one built).
    pub(crate) fn last(&mut self) -> Option<&mut Built> {
        if self.err != 0 {
            return None;
        }
        let r = self.wrs.last_mut();
        if r.is_none() {
            self.err = libc::EINVAL;
        }
        r
    }
}

/// The builders' state of an extended QP.
pub struct WrBatch {
    pub(crate) lock: SpinLock,
    pub(crate) max_send_wr: usize,
    pub(crate) max_send_sge: u32,
    pub(crate) max_inline_data: u32,
    pub(crate) b: UnsafeCell<Batch>,
}

// SAFETY: `b` is only touched by the thread holding `lock` (the wr_start..complete critical
// section the API defines).
unsafe impl Sync for WrBatch {}
// SAFETY: as above; the raw Ah pointers in `Built` are only dereferenced while the
// program's address handles are live (its contract until the post).
unsafe impl Send for WrBatch {}

/// The polling state of a CQ made by `create_cq_ex`.
pub struct CqPoll {
    pub(crate) lock: SpinLock,
    pub(crate) cur: UnsafeCell<WorkCompletion>,
}

// SAFETY: `cur` is only touched between a successful start_poll and end_poll, by the one
// thread holding `lock`.
unsafe impl Sync for CqPoll {}
