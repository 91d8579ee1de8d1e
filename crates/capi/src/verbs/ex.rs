//! The extended verbs: the `verbs_context` slots `create_qp_ex`, `create_cq_ex` and
//! `query_device_ex` (filled by [`install`] for every context), `ibv_qp_to_qp_ex`, the
//! `struct ibv_qp_ex` work request builders (`ibv_wr_*`) and the `struct ibv_cq_ex` polling
//! functions (`ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`).
//!
//! # Layout
//! Every QP and CQ wrapper ([`CQp`], [`CCq`]) has room after its C header for the rest of
//! `struct ibv_qp_ex` / `struct ibv_cq_ex` ([`QpExTail`], [`CqExTail`]), so the extended
//! object starts at the same address as the base one, as in rdma-core. A QP made by
//! `create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (or enabled with
//! [`enable_qp_ex`]) gets its builder table and a [`WrBatch`]; a CQ made by `create_cq_ex`
//! gets its polling table and a [`CqPoll`]. Other QPs have none: `ibv_qp_to_qp_ex` gives
//! NULL for them, as rdma-core's providers do.
//!
//! # Posting
//! `ibv_wr_start` takes the QP's batch (a spin lock: the critical section of the man page);
//! each builder appends a request to the batch's vectors, which are sized at creation for
//! `max_send_wr` requests of `max_send_sge` entries and `max_inline_data` bytes, so no
//! request allocates; the inline setters copy the data at once, as the API promises.
//! `ibv_wr_complete` hands the batch to softrdma's `Qp::post_send_raw_inline` in chunks of
//! [`CHUNK`] requests built on the stack, then releases the batch; `ibv_wr_abort` drops it.
//! A builder that cannot take its arguments marks the batch, and `ibv_wr_complete` then
//! posts nothing and returns that errno (the man page's "the entire posting will be
//! aborted").

use super::objects::{CAh, CCq, CQp};
use super::tails::{Batch, Built, CqPoll, SpinLock, WrBatch, CQ_TAIL, QP_TAIL};
pub use super::tails::{CqExTail, QpExTail};
use crate::abi::*;
use crate::ffi::{guard, set_errno};
use libc::{c_int, c_uint, c_void, size_t};
use softrdma::{QpType, SendFlags, SendWr, Sge, WcFlags, WorkCompletion, WrOpcode};
use std::cell::UnsafeCell;
use std::mem::{offset_of, size_of};
use std::ptr;
use std::sync::atomic::AtomicBool;

/// How many built requests `ibv_wr_complete` hands to softrdma per call (a stack array).
pub const CHUNK: usize = 32;

const _: () = {
    assert!(offset_of!(CQp, ex) == size_of::<ibv_qp>());
    assert!(offset_of!(CCq, ex) == size_of::<ibv_cq>());
    assert!(QP_TAIL.is_multiple_of(8) && CQ_TAIL.is_multiple_of(8));
    assert!(size_of::<Sge>() == size_of::<ibv_sge>());
    assert!(offset_of!(Sge, addr) == offset_of!(ibv_sge, addr));
    assert!(offset_of!(Sge, length) == offset_of!(ibv_sge, length));
    assert!(offset_of!(Sge, lkey) == offset_of!(ibv_sge, lkey));
};

/// Send operations softrdma offers on a QP type (`enum ibv_qp_create_send_ops_flags`).
fn supported_send_ops(qp_type: QpType) -> u64 {
    match qp_type {
        QpType::Rc => {
            IBV_QP_EX_WITH_RDMA_WRITE
                | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                | IBV_QP_EX_WITH_SEND
                | IBV_QP_EX_WITH_SEND_WITH_IMM
                | IBV_QP_EX_WITH_RDMA_READ
                | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                | IBV_QP_EX_WITH_SEND_WITH_INV
                | IBV_QP_EX_WITH_LOCAL_INV
                | IBV_QP_EX_WITH_BIND_MW
        }
        QpType::Uc => {
            IBV_QP_EX_WITH_RDMA_WRITE
                | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                | IBV_QP_EX_WITH_SEND
                | IBV_QP_EX_WITH_SEND_WITH_IMM
                | IBV_QP_EX_WITH_LOCAL_INV
                | IBV_QP_EX_WITH_BIND_MW
        }
        QpType::Ud => IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
        _ => 0,
    }
}

/// Whether a QP of C type `qp_type` can have the `ibv_wr_*` operations `send_ops_flags`
/// (`enum ibv_qp_create_send_ops_flags`) here: `EOPNOTSUPP` if not (another QP type than
/// RC/UC/UD, or TSO, ATOMIC_WRITE, FLUSH, or an operation the type lacks).
pub fn check_send_ops(qp_type: u32, send_ops_flags: u64) -> Result<(), i32> {
    let t = qp_type_of(qp_type).ok_or(libc::EOPNOTSUPP)?;
    if send_ops_flags & !supported_send_ops(t) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

fn qp_type_of(t: u32) -> Option<QpType> {
    match t {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        _ => None,
    }
}

/// Fills the extended slots of a new context's `verbs_context`: `create_qp_ex`,
/// `create_cq_ex`, `query_device_ex`, `advise_mr`.
pub fn install(vctx: &mut verbs_context) {
    vctx.create_qp_ex = Some(create_qp_ex);
    vctx.create_cq_ex = Some(create_cq_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.advise_mr = Some(super::resources::advise_mr);
}

/// `ibv_qp_to_qp_ex`: the `struct ibv_qp_ex` of a QP made with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (the same address), NULL for any other QP or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(ptr::null_mut(), || {
        if qp.is_null() {
            return ptr::null_mut();
        }
        let w = qp.cast::<CQp>();
        // SAFETY: qp is a live QP of this library (the caller's contract), so a CQp.
        let has = unsafe { (*ptr::addr_of!((*w).ex.batch)).is_some() };
        if has {
            qp.cast()
        } else {
            ptr::null_mut()
        }
    })
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex` with more than the PD in `comp_mask`):
/// a QP as `ibv_create_qp` makes it, plus the `ibv_wr_*` table when `send_ops_flags` is
/// given. Fails (NULL, errno) with `EINVAL` for a NULL argument, an unknown `comp_mask`
/// bit or no PD; `EOPNOTSUPP` for XRC, TSO, RSS, create flags, or a send operation the QP
/// type cannot do here (TSO, ATOMIC_WRITE, FLUSH, or one its type lacks); otherwise as
/// `ibv_create_qp`.
unsafe extern "C" fn create_qp_ex(context: *mut ibv_context, attr: *mut c_void) -> *mut ibv_qp {
    crate::ffi::ret_ptr(|| {
        let attr = attr.cast::<ibv_qp_init_attr_ex>();
        if context.is_null() || attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes its ibv_qp_init_attr_ex.
        let a = unsafe { &*attr };
        const KNOWN: u32 = IBV_QP_INIT_ATTR_PD
            | IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_CREATE_FLAGS
            | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
            | IBV_QP_INIT_ATTR_IND_TABLE
            | IBV_QP_INIT_ATTR_RX_HASH
            | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !KNOWN != 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask
            & (IBV_QP_INIT_ATTR_XRCD
                | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
                | IBV_QP_INIT_ATTR_IND_TABLE
                | IBV_QP_INIT_ATTR_RX_HASH)
            != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live PD of this library (the program's contract).
        if unsafe { (*a.pd).context } != context {
            return Err(libc::EINVAL);
        }
        let ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if let Some(ops) = ops {
            check_send_ops(a.qp_type, ops)?;
        }
        // The leading fields of ibv_qp_init_attr_ex are an ibv_qp_init_attr (rdma-core's
        // own shortcut passes it so); caps are written back there.
        // SAFETY: as above.
        let qp = unsafe { super::ibv_create_qp(a.pd, attr.cast::<ibv_qp_init_attr>()) };
        if qp.is_null() {
            return Err(crate::ffi::errno());
        }
        if let Some(ops) = ops {
            // SAFETY: qp was just made by this library.
            if let Err(e) = unsafe { enable_qp_ex(qp, ops) } {
                // SAFETY: as above; nobody else knows it yet.
                unsafe { super::ibv_destroy_qp(qp) };
                return Err(e);
            }
        }
        Ok(qp)
    })
}

/// Gives a QP of this library its `struct ibv_qp_ex` builder table and batch, as
/// `create_qp_ex` does for `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (for `rdma_create_qp_ex`).
/// Fails with `EINVAL` for NULL and `EOPNOTSUPP` for send operations the QP's type cannot
/// do here.
///
/// # Safety
/// `qp` must be NULL or a live QP of this library that no other thread uses yet.
pub unsafe fn enable_qp_ex(qp: *mut ibv_qp, send_ops_flags: u64) -> Result<(), i32> {
    if qp.is_null() {
        return Err(libc::EINVAL);
    }
    let w = qp.cast::<CQp>();
    // SAFETY: the caller's contract: a live CQp nobody else touches now.
    let w = unsafe { &mut *w };
    let t = w.qp.qp_type();
    if send_ops_flags & !supported_send_ops(t) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let cap = w.qp.cap();
    let n = cap.max_send_wr.max(1) as usize;
    // The pool holds every entry of a full batch (sge lists), capped so a QP with a deep
    // queue does not reserve megabytes up front; past that it grows once and is kept.
    let sges = (n * cap.max_send_sge.max(1) as usize).min(1 << 16);
    let inline = (n * cap.max_inline_data as usize).min(1 << 20);
    w.ex.batch = Some(Box::new(WrBatch {
        lock: SpinLock(AtomicBool::new(false)),
        max_send_wr: n,
        max_send_sge: cap.max_send_sge,
        max_inline_data: cap.max_inline_data,
        b: UnsafeCell::new(Batch {
            wrs: Vec::with_capacity(n),
            sges: Vec::with_capacity(sges),
            inline: Vec::with_capacity(inline),
            err: 0,
        }),
    }));
    let x = (w as *mut CQp).cast::<ibv_qp_ex>();
    // SAFETY: x is the ibv_qp_ex view of this CQp (header then tail, asserted above).
    let x = unsafe { &mut *x };
    x.comp_mask = 0;
    x.wr_id = 0;
    x.wr_flags = 0;
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_bind_mw = Some(wr_bind_mw);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_send_tso = Some(wr_send_tso);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_atomic_write = Some(wr_atomic_write);
    x.wr_flush = Some(wr_flush);
    Ok(())
}

/// The batch of an extended QP.
///
/// # Safety
/// `qx` must be an `ibv_qp_ex` from `ibv_qp_to_qp_ex`.
unsafe fn batch_of<'a>(qx: *mut ibv_qp_ex) -> Option<&'a WrBatch> {
    let w = qx.cast::<CQp>();
    // SAFETY: the caller's contract; only the batch field is borrowed.
    unsafe { (*ptr::addr_of!((*w).ex.batch)).as_deref() }
}

/// Runs `f` on the batch of `qx` (inside the program's critical section), catching panics.
#[inline]
fn with_batch(qx: *mut ibv_qp_ex, f: impl FnOnce(&WrBatch, &mut Batch)) {
    guard((), || {
        if qx.is_null() {
            return;
        }
        // SAFETY: qx comes from ibv_qp_to_qp_ex (the API's contract).
        if let Some(wb) = unsafe { batch_of(qx) } {
            // SAFETY: the calling thread is inside wr_start..wr_complete, which owns `b`.
            f(wb, unsafe { &mut *wb.b.get() });
        }
    })
}

/// Starts a request of `opcode` with the `wr_id` and `wr_flags` the program set in `qx`.
#[inline]
fn build(qx: *mut ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut Built)) {
    with_batch(qx, |wb, b| {
        if b.err != 0 {
            return;
        }
        if b.wrs.len() >= wb.max_send_wr {
            // More than the send queue holds: the post could not take it either.
            b.fail(libc::ENOMEM);
            return;
        }
        // SAFETY: qx is live (checked non-NULL by with_batch); plain field reads.
        let (wr_id, flags) = unsafe { ((*qx).wr_id, (*qx).wr_flags) };
        let mut r = Built {
            wr_id,
            opcode,
            flags: SendFlags::from_bits_truncate(flags),
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ah: ptr::null(),
            remote_qpn: 0,
            remote_qkey: 0,
            mw: ptr::null_mut(),
            bind: ibv_mw_bind_info {
                mr: ptr::null_mut(),
                addr: 0,
                length: 0,
                mw_access_flags: 0,
            },
            sge_at: 0,
            sge_n: 0,
            inline: false,
        };
        // Only the flags the builders define: INLINE is the inline setters' business.
        r.flags.remove(SendFlags::INLINE);
        fill(&mut r);
        b.wrs.push(r);
    })
}

/// A builder softrdma cannot honour: the batch fails with `EOPNOTSUPP`.
fn unsupported(qx: *mut ibv_qp_ex) {
    with_batch(qx, |_, b| b.fail(libc::EOPNOTSUPP));
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    build(qx, WrOpcode::AtomicCmpAndSwp, |r| {
        r.rkey = rkey;
        r.remote_addr = remote_addr;
        r.compare_add = compare;
        r.swap = swap;
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    build(qx, WrOpcode::AtomicFetchAndAdd, |r| {
        r.rkey = rkey;
        r.remote_addr = remote_addr;
        r.compare_add = add;
    })
}

unsafe extern "C" fn wr_bind_mw(
    qx: *mut ibv_qp_ex,
    mw: *mut c_void,
    rkey: u32,
    info: *const c_void,
) {
    if mw.is_null() || info.is_null() {
        with_batch(qx, |_, b| b.fail(libc::EINVAL));
        return;
    }
    // SAFETY: the program's `struct ibv_mw_bind_info`, read at once (verbs' contract).
    let bind = unsafe { *info.cast::<ibv_mw_bind_info>() };
    build(qx, WrOpcode::BindMw, |r| {
        r.mw = mw.cast();
        r.rkey = rkey;
        r.bind = bind;
    })
}

unsafe extern "C" fn wr_local_inv(qx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    build(qx, WrOpcode::LocalInv, |r| r.imm_data = invalidate_rkey)
}

unsafe extern "C" fn wr_rdma_read(qx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(qx, WrOpcode::RdmaRead, |r| {
        r.rkey = rkey;
        r.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_rdma_write(qx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    build(qx, WrOpcode::RdmaWrite, |r| {
        r.rkey = rkey;
        r.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_rdma_write_imm(qx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    build(qx, WrOpcode::RdmaWriteWithImm, |r| {
        r.rkey = rkey;
        r.remote_addr = remote_addr;
        r.imm_data = u32::from_be(imm);
    })
}

unsafe extern "C" fn wr_send(qx: *mut ibv_qp_ex) {
    build(qx, WrOpcode::Send, |_| {})
}

unsafe extern "C" fn wr_send_imm(qx: *mut ibv_qp_ex, imm: u32) {
    build(qx, WrOpcode::SendWithImm, |r| {
        r.imm_data = u32::from_be(imm)
    })
}

unsafe extern "C" fn wr_send_inv(qx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    build(qx, WrOpcode::SendWithInv, |r| r.imm_data = invalidate_rkey)
}

unsafe extern "C" fn wr_send_tso(qx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    unsupported(qx)
}

unsafe extern "C" fn wr_set_ud_addr(
    qx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    with_batch(qx, |_, b| {
        if ah.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        // SAFETY: a live address handle of this library (the program's contract).
        let a: *const softrdma::Ah = unsafe { ptr::addr_of!((*ah.cast::<CAh>()).ah) };
        if let Some(r) = b.last() {
            r.ah = a;
            r.remote_qpn = remote_qpn;
            r.remote_qkey = remote_qkey;
        }
    })
}

unsafe extern "C" fn wr_set_xrc_srqn(qx: *mut ibv_qp_ex, _srqn: u32) {
    unsupported(qx)
}

unsafe extern "C" fn wr_set_inline_data(qx: *mut ibv_qp_ex, addr: *mut c_void, length: size_t) {
    let one = ibv_data_buf { addr, length };
    // SAFETY: forwards the program's arguments.
    unsafe { wr_set_inline_data_list(qx, 1, &one) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qx: *mut ibv_qp_ex,
    num_buf: size_t,
    list: *const ibv_data_buf,
) {
    with_batch(qx, |wb, b| {
        if num_buf > 0 && list.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        let bufs = if num_buf == 0 {
            &[][..]
        } else {
            // SAFETY: the program's array of num_buf buffers.
            unsafe { std::slice::from_raw_parts(list, num_buf) }
        };
        let total: usize = bufs.iter().map(|d| d.length).sum();
        if total > wb.max_inline_data as usize {
            b.fail(libc::EINVAL);
            return;
        }
        if b.last().is_none() {
            return;
        }
        let at = b.inline.len();
        for d in bufs {
            if d.length > 0 {
                // SAFETY: the program names d.length readable bytes at d.addr; the setter
                // copies them now, as the API says.
                b.inline.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(d.addr as *const u8, d.length)
                });
            }
        }
        let r = b.wrs.last_mut().expect("checked by last()");
        r.inline = true;
        r.flags.insert(SendFlags::INLINE);
        r.sge_at = at as u32;
        r.sge_n = total as u32;
    })
}

unsafe extern "C" fn wr_set_sge(qx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_batch(qx, |_, b| {
        if b.last().is_none() {
            return;
        }
        let at = b.sges.len() as u32;
        b.sges.push(Sge { addr, length, lkey });
        let r = b.wrs.last_mut().expect("checked by last()");
        r.inline = false;
        r.sge_at = at;
        r.sge_n = 1;
    })
}

unsafe extern "C" fn wr_set_sge_list(qx: *mut ibv_qp_ex, num_sge: size_t, list: *const ibv_sge) {
    with_batch(qx, |wb, b| {
        if num_sge > wb.max_send_sge as usize || (num_sge > 0 && list.is_null()) {
            b.fail(libc::EINVAL);
            return;
        }
        if b.last().is_none() {
            return;
        }
        let at = b.sges.len() as u32;
        if num_sge > 0 {
            // SAFETY: the program's array of num_sge entries; Sge has ibv_sge's layout
            // (asserted above).
            b.sges.extend_from_slice(unsafe {
                std::slice::from_raw_parts(list.cast::<Sge>(), num_sge)
            });
        }
        let r = b.wrs.last_mut().expect("checked by last()");
        r.inline = false;
        r.sge_at = at;
        r.sge_n = num_sge as u32;
    })
}

unsafe extern "C" fn wr_start(qx: *mut ibv_qp_ex) {
    guard((), || {
        if qx.is_null() {
            return;
        }
        // SAFETY: qx comes from ibv_qp_to_qp_ex.
        if let Some(wb) = unsafe { batch_of(qx) } {
            wb.lock.lock();
            // SAFETY: the lock is ours now.
            unsafe { &mut *wb.b.get() }.clear();
        }
    })
}

unsafe extern "C" fn wr_abort(qx: *mut ibv_qp_ex) {
    guard((), || {
        if qx.is_null() {
            return;
        }
        // SAFETY: qx comes from ibv_qp_to_qp_ex.
        if let Some(wb) = unsafe { batch_of(qx) } {
            // SAFETY: the caller holds the lock since wr_start.
            unsafe { &mut *wb.b.get() }.clear();
            wb.lock.unlock();
        }
    })
}

/// `ibv_wr_complete`: posts the batch, in order, through `Qp::post_send_raw_inline`; 0, or
/// the errno of the first builder that failed (nothing posted) or of the post (the
/// requests before the one refused are posted).
unsafe extern "C" fn wr_complete(qx: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        if qx.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: qx comes from ibv_qp_to_qp_ex.
        let Some(wb) = (unsafe { batch_of(qx) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller holds the lock since wr_start.
        let b = unsafe { &mut *wb.b.get() };
        let ret = if b.err != 0 { b.err } else { post_batch(qx, b) };
        b.clear();
        wb.lock.unlock();
        if ret != 0 {
            set_errno(ret);
        }
        ret
    })
}

/// Hands the built requests to softrdma, [`CHUNK`] at a time.
fn post_batch(qx: *mut ibv_qp_ex, b: &Batch) -> c_int {
    // SAFETY: qx is the ibv_qp_ex of a live CQp.
    let qp = unsafe { &(*qx.cast::<CQp>()).qp };
    let base = b.inline.as_ptr() as u64;
    for chunk in b.wrs.chunks(CHUNK) {
        let mut inl = [Sge::default(); CHUNK];
        for (i, r) in chunk.iter().enumerate() {
            if r.inline {
                inl[i] = Sge {
                    addr: base + u64::from(r.sge_at),
                    length: r.sge_n,
                    lkey: 0,
                };
            }
        }
        let mut wrs = [SendWr::default(); CHUNK];
        for (i, r) in chunk.iter().enumerate() {
            let sg_list = if r.inline {
                std::slice::from_ref(&inl[i])
            } else {
                &b.sges[r.sge_at as usize..(r.sge_at + r.sge_n) as usize]
            };
            wrs[i] = SendWr {
                wr_id: r.wr_id,
                sg_list,
                opcode: r.opcode,
                send_flags: r.flags,
                imm_data: r.imm_data,
                remote_addr: r.remote_addr,
                rkey: r.rkey,
                compare_add: r.compare_add,
                swap: r.swap,
                // SAFETY: set from a live address handle of the program, which must stay
                // alive until the post (verbs' contract).
                ah: unsafe { r.ah.as_ref() },
                remote_qpn: r.remote_qpn,
                remote_qkey: r.remote_qkey,
                bind_mw: (!r.mw.is_null()).then(|| softrdma::BindMwWr {
                    // SAFETY: a live window of the program's (verbs' contract until the
                    // post); only its softrdma field is borrowed.
                    mw: unsafe { &*ptr::addr_of!((*r.mw.cast::<super::objects::CMw>()).mw) },
                    rkey: r.rkey,
                    // SAFETY: the region pointer is NULL or live (same contract).
                    bind_info: unsafe { super::resources::bind_info(&r.bind) },
                }),
            };
        }
        let n = chunk.len();
        // SAFETY: inline entries point into b.inline, alive and unchanged during the call.
        let r = unsafe { qp.post_send_raw_inline(&wrs[..n]) };
        let posted = r.as_ref().map_or_else(|e| e.bad_wr, |()| n);
        for (w, r) in wrs[..posted].iter().zip(chunk) {
            if let Some(b) = &w.bind_mw {
                // SAFETY: the window's C header (only its rkey), as `post_send` does.
                unsafe { ptr::addr_of_mut!((*r.mw).rkey).write(b.mw.rkey()) };
            }
        }
        if let Err(e) = r {
            return e.errno();
        }
    }
    0
}

unsafe extern "C" fn wr_atomic_write(
    qx: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _wr: *const c_void,
) {
    unsupported(qx)
}

unsafe extern "C" fn wr_flush(
    qx: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _len: size_t,
    _t: u8,
    _l: u8,
) {
    unsupported(qx)
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex`): a CQ as `ibv_create_cq` makes it,
/// with the `ibv_cq_ex` polling table. Fails (NULL, errno) with `EINVAL` for a NULL
/// argument or unknown `comp_mask`/`flags` bits; `EOPNOTSUPP` for `wc_flags` beyond
/// `IBV_WC_STANDARD_FLAGS` (timestamps, CVLAN, flow tag, tag matching), a parent domain or
/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`; otherwise as `ibv_create_cq`.
unsafe extern "C" fn create_cq_ex(context: *mut ibv_context, attr: *mut c_void) -> *mut c_void {
    crate::ffi::ret_ptr(|| {
        let attr = attr.cast::<ibv_cq_init_attr_ex>();
        if context.is_null() || attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's ibv_cq_init_attr_ex.
        let a = unsafe { *attr };
        if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
            if a.flags & !(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)
                != 0
            {
                return Err(libc::EINVAL);
            }
            if a.flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0 {
                return Err(libc::EOPNOTSUPP);
            }
        }
        if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let vector = c_int::try_from(a.comp_vector).map_err(|_| libc::EINVAL)?;
        // SAFETY: the program's context and channel.
        let cq = unsafe { super::ibv_create_cq(context, cqe, a.cq_context, a.channel, vector) };
        if cq.is_null() {
            return Err(crate::ffi::errno());
        }
        // SAFETY: cq was just made by this library; nobody else knows it yet.
        let w = unsafe { &mut *cq.cast::<CCq>() };
        w.ex.poll = Some(Box::new(CqPoll {
            lock: SpinLock(AtomicBool::new(false)),
            cur: UnsafeCell::new(WorkCompletion::default()),
        }));
        // SAFETY: the ibv_cq_ex view of this CCq (asserted layout).
        let x = unsafe { &mut *cq.cast::<ibv_cq_ex>() };
        x.comp_mask = 0;
        x.status = 0;
        x.wr_id = 0;
        x.start_poll = Some(start_poll);
        x.next_poll = Some(next_poll);
        x.end_poll = Some(end_poll);
        x.read_opcode = Some(read_opcode);
        x.read_vendor_err = Some(read_vendor_err);
        x.read_byte_len = Some(read_byte_len);
        x.read_imm_data = Some(read_imm_data);
        x.read_qp_num = Some(read_qp_num);
        x.read_src_qp = Some(read_src_qp);
        x.read_wc_flags = Some(read_wc_flags);
        x.read_slid = Some(read_slid);
        x.read_sl = Some(read_sl);
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
        x.read_completion_ts = Some(read_zero_u64);
        x.read_cvlan = Some(read_cvlan);
        x.read_flow_tag = Some(read_flow_tag);
        x.read_tm_info = Some(read_tm_info);
        x.read_completion_wallclock_ns = Some(read_zero_u64);
        Ok(cq.cast())
    })
}

/// The polling state of an extended CQ.
///
/// # Safety
/// `cq` must be NULL or an `ibv_cq_ex` of this library.
unsafe fn poll_of<'a>(cq: *mut ibv_cq_ex) -> Option<&'a CqPoll> {
    if cq.is_null() {
        return None;
    }
    let w = cq.cast::<CCq>();
    // SAFETY: the caller's contract; only the poll field is borrowed.
    unsafe { (*ptr::addr_of!((*w).ex.poll)).as_deref() }
}

/// Moves the CQ's next completion into the current one; 0, ENOENT when there is none, or
/// the errno of a CQ that overran.
fn advance(cq: *mut ibv_cq_ex, p: &CqPoll) -> c_int {
    // SAFETY: cq is a CCq of this library (poll_of found its state).
    let q = unsafe { &(*cq.cast::<CCq>()).cq };
    // SAFETY: the calling thread holds p.lock.
    let cur = unsafe { &mut *p.cur.get() };
    match q.poll(std::slice::from_mut(cur)) {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            // SAFETY: plain field writes of the program-visible header.
            unsafe {
                (*cq).status = cur.status as u32;
                (*cq).wr_id = cur.wr_id;
            }
            0
        }
        Err(e) => e.errno(),
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's CQ and attributes.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        // SAFETY: the program's extended CQ.
        let Some(p) = (unsafe { poll_of(cq) }) else {
            return libc::EINVAL;
        };
        p.lock.lock();
        let r = advance(cq, p);
        if r != 0 {
            // No completion: end_poll is not called (the API's rule), so release here.
            p.lock.unlock();
        }
        r
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's extended CQ, inside start_poll..end_poll.
        match unsafe { poll_of(cq) } {
            Some(p) => advance(cq, p),
            None => libc::EINVAL,
        }
    })
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: the program's extended CQ, after a successful start_poll.
        if let Some(p) = unsafe { poll_of(cq) } {
            p.lock.unlock();
        }
    })
}

/// The current completion of an extended CQ (a default one if `cq` is not extended).
#[inline]
fn cur(cq: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: the program's extended CQ, inside start_poll..end_poll.
    match unsafe { poll_of(cq) } {
        // SAFETY: the calling thread holds the poll lock.
        Some(p) => unsafe { *p.cur.get() },
        None => WorkCompletion::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cur(cq).opcode as u32)
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cur(cq).vendor_err)
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cur(cq).byte_len)
}

/// The immediate data in network order, as `struct ibv_wc` holds it.
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || {
        let c = cur(cq);
        if c.wc_flags.contains(WcFlags::WITH_INV) {
            c.invalidated_rkey
        } else {
            c.imm_data.to_be()
        }
    })
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cur(cq).qp_num)
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cur(cq).src_qp)
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    guard(0, || cur(cq).wc_flags.bits())
}

unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || u32::from(cur(cq).slid))
}

unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    guard(0, || cur(cq).sl)
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    guard(0, || cur(cq).dlid_path_bits)
}

/// Timestamps are not offered (`create_cq_ex` refuses the flags): 0.
unsafe extern "C" fn read_zero_u64(_cq: *mut ibv_cq_ex) -> u64 {
    0
}

/// CVLAN is not offered: 0.
unsafe extern "C" fn read_cvlan(_cq: *mut ibv_cq_ex) -> u16 {
    0
}

/// Flow tags are not offered: 0.
unsafe extern "C" fn read_flow_tag(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// Tag matching is not offered: zeroes.
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    if !info.is_null() {
        // SAFETY: the program's out-parameter.
        unsafe { info.write(ibv_wc_tm_info { tag: 0, priv_: 0 }) };
    }
}

/// `verbs_context.query_device_ex` (`ibv_query_device_ex`): `ibv_query_device`'s answer in
/// `orig_attr`, the on-demand paging capabilities in `odp_caps` (`softrdma::OdpCaps`), no
/// other extended capabilities (no timestamps, TSO, RSS, pacing, tag matching, device memory,
/// XRC), `device_cap_flags_ex` = the basic flags, `phys_port_cnt_ex` = the port count;
/// writes at most `attr_size` bytes. Returns 0, `EINVAL` for NULL
/// arguments, an input `comp_mask` or a size below `struct ibv_device_attr`, or
/// `ibv_query_device`'s error.
unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: size_t,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the program's input.
        if context.is_null()
            || attr.is_null()
            || (!input.is_null() && unsafe { (*input).comp_mask } != 0)
        {
            return libc::EINVAL;
        }
        if attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let mut full: ibv_device_attr_ex = super::objects::zeroed();
        // SAFETY: the program's context; full.orig_attr is ours.
        let r = unsafe { super::ibv_query_device(context, &mut full.orig_attr) };
        if r != 0 {
            return r;
        }
        full.device_cap_flags_ex = u64::from(full.orig_attr.device_cap_flags);
        // SAFETY: NULL or a live context (checked above; ibv_query_device accepted it).
        let odp = match unsafe { super::device::ctx(context) }
            .and_then(|c| c.query_device().map_err(|e| e.errno()))
        {
            Ok(a) => a.odp_caps,
            Err(e) => return e,
        };
        full.odp_caps = ibv_odp_caps {
            general_caps: odp.general_caps.bits(),
            per_transport_caps: ibv_odp_caps_per_transport {
                rc_odp_caps: odp.rc_odp_caps.bits(),
                uc_odp_caps: odp.uc_odp_caps.bits(),
                ud_odp_caps: odp.ud_odp_caps.bits(),
            },
        };
        full.phys_port_cnt_ex = u32::from(full.orig_attr.phys_port_cnt);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the program gave attr_size writable bytes at attr; n <= both sizes.
        unsafe {
            ptr::copy_nonoverlapping(
                (&full as *const ibv_device_attr_ex).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            )
        };
        0
    })
}
