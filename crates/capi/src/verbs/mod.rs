//! libibverbs: the `ibv_*` functions and the objects behind the pointers they hand out.
//!
//! # Object model ([`objects`])
//! Every C object is a `#[repr(C)]` header (`struct ibv_context`, `ibv_pd`, `ibv_cq`, …)
//! embedded first in a private wrapper ([`objects::CContext`], [`objects::CPd`],
//! [`objects::CCq`], [`objects::CChannel`], [`objects::CQp`], [`objects::CSrq`],
//! [`objects::CMr`], [`objects::CAh`]) that holds the softrdma object (`Arc<T>` for those the
//! connection manager shares). The softrdma CQ/QP/SRQ carry the wrapper's address as their
//! `cq_context`/`qp_context`/`srq_context`, so completion events, asynchronous events and
//! work completions name the C object without a lookup. The `ibv_context` lives at the end
//! of rdma-core HEAD's 696-byte `verbs_context` (`abi_compat = UINTPTR_MAX`, `sz` set).
//!
//! # Helpers for the librdmacm layer (crate-internal)
//! - [`cm_context`]`(&Arc<softrdma::Context>)`: the C `ibv_context` of a context rdma_cm
//!   opened; cached, so the same Rust context always gives the same pointer (kept for the
//!   process; `ibv_close_device` on it is a no-op).
//! - [`cm_pd`]`(ctx, &Arc<softrdma::Pd>)`: the C `ibv_pd` of the CM's default PD; cached the
//!   same way (`ibv_dealloc_pd` on it is a no-op).
//! - [`context_arc`], [`pd_arc`], [`cq_arc`], [`srq_arc`], [`qp_arc`]: the `Arc` behind a C
//!   pointer (`None` for NULL); [`objects::comp_channel`] for a completion channel.
//! - [`wrap_qp`]: makes the C `ibv_qp` for a QP the CM creates: the wrapper is allocated
//!   first and its address handed to the creating closure, which must use it as the
//!   softrdma QP's `qp_context`; the given PD/CQ/SRQ pointers fill the header.
//!   [`unwrap_qp`] frees that wrapper again (for `rdma_destroy_qp`), giving the `Arc` back.
//! - CQs and completion channels for the CM: call [`ibv_create_comp_channel`] /
//!   [`ibv_create_cq`] (plain Rust functions too) and take the `Arc` with [`cq_arc`], so the
//!   CQ's `cq_context` is its wrapper as everywhere else.
//!
//! # The extended API
//! [`ex`] (branch capi-ex) fills the `verbs_context` slots `create_qp_ex`,
//! `query_device_ex`, `create_cq_ex` through [`ex::install`], called for every new context,
//! and exports `ibv_qp_to_qp_ex`.

pub mod datapath;
pub mod device;
pub mod ex;
pub mod misc;
pub mod objects;
pub mod qp;
pub mod resources;
pub mod tails;

pub use device::*;
pub use misc::*;
pub use qp::*;
pub use resources::*;

use crate::abi::*;
pub use objects::cm_pd;
use objects::{CCq, CPd, CQp, CSrq};
use std::sync::Arc;

/// Fills the function slots of a new context: the `ops` table of the inline data-path
/// calls, the size-aware `query_port`, and (through [`ex::install`]) the extended verbs.
pub(crate) fn fill_context(v: &mut verbs_context) {
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(datapath::poll_cq);
    ops.req_notify_cq = Some(datapath::req_notify_cq);
    ops.post_send = Some(datapath::post_send);
    ops.post_recv = Some(datapath::post_recv);
    ops.post_srq_recv = Some(datapath::post_srq_recv);
    ops.alloc_mw = Some(resources::alloc_mw);
    ops.bind_mw = Some(resources::bind_mw);
    ops.dealloc_mw = Some(resources::dealloc_mw);
    v.query_port = Some(device::query_port_sized);
    ex::install(v);
}

/// `ibv_open_device`: a new context; NULL with errno (EINVAL for NULL, eventfd's errno).
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    crate::ffi::ret_ptr(|| {
        // SAFETY: NULL or a device of this library.
        let d = unsafe { objects::device_of(device) }.ok_or(libc::EINVAL)?;
        let ctx = d.dev.open().map_err(|e| e.errno())?;
        objects::new_context(device, Arc::new(ctx), false, fill_context)
    })
}

/// The C context of a softrdma context the connection manager opened: the same pointer for
/// the same `Arc`, made on first use and kept for the process (`ibv_close_device` on it does
/// nothing). Fails with the errno of `eventfd`.
pub fn cm_context(ctx: &Arc<softrdma::Context>) -> Result<*mut ibv_context, i32> {
    objects::cm_context(ctx, fill_context)
}

/// The softrdma context behind a C context (`None` for NULL).
///
/// # Safety
/// `p` must be NULL or a live context of this library.
pub unsafe fn context_arc<'a>(p: *mut ibv_context) -> Option<&'a Arc<softrdma::Context>> {
    // SAFETY: caller's contract.
    unsafe { objects::context_of(p) }.map(|c| &c.ctx)
}

/// The softrdma PD behind a C PD (`None` for NULL).
///
/// # Safety
/// `p` must be NULL or a live PD of this library.
pub unsafe fn pd_arc<'a>(p: *mut ibv_pd) -> Option<&'a Arc<softrdma::Pd>> {
    // SAFETY: caller's contract.
    unsafe { objects::wrapper::<_, CPd>(p) }.map(|w| &w.pd)
}

/// The softrdma CQ behind a C CQ (`None` for NULL).
///
/// # Safety
/// `p` must be NULL or a live CQ of this library.
pub unsafe fn cq_arc<'a>(p: *mut ibv_cq) -> Option<&'a Arc<softrdma::Cq>> {
    // SAFETY: caller's contract.
    unsafe { objects::wrapper::<_, CCq>(p) }.map(|w| &w.cq)
}

/// The softrdma SRQ behind a C SRQ (`None` for NULL).
///
/// # Safety
/// `p` must be NULL or a live SRQ of this library.
pub unsafe fn srq_arc<'a>(p: *mut ibv_srq) -> Option<&'a Arc<softrdma::Srq>> {
    // SAFETY: caller's contract.
    unsafe { objects::wrapper::<_, CSrq>(p) }.map(|w| &w.srq)
}

/// The softrdma QP behind a C QP (`None` for NULL).
///
/// # Safety
/// `p` must be NULL or a live QP of this library.
pub unsafe fn qp_arc<'a>(p: *mut ibv_qp) -> Option<&'a Arc<softrdma::Qp>> {
    // SAFETY: caller's contract.
    unsafe { objects::wrapper::<_, CQp>(p) }.map(|w| &w.qp)
}

/// Makes the C `ibv_qp` of a QP created elsewhere (the CM): allocates the wrapper, calls
/// `create` with the wrapper's address (to be the softrdma QP's `qp_context`), and fills
/// the header from the QP and the given pointers (`qp_context` is the program's value that
/// `qp->qp_context` shows). Fails with the errno of `create`'s error, freeing the wrapper.
///
/// # Safety
/// `pd`, `send_cq`, `recv_cq` and `srq` must be NULL or live objects of this library; `pd`
/// non-NULL (its context becomes `qp->context`).
pub unsafe fn wrap_qp(
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_context: *mut libc::c_void,
    create: impl FnOnce(u64) -> softrdma::Result<Arc<softrdma::Qp>>,
) -> Result<*mut ibv_qp, i32> {
    if pd.is_null() {
        return Err(libc::EINVAL);
    }
    let w = objects::alloc_wrapper::<CQp>();
    let qp = match create(w as u64) {
        Ok(q) => q,
        Err(e) => {
            // SAFETY: w is unfinished.
            unsafe { objects::abandon(w) };
            return Err(e.errno());
        }
    };
    // SAFETY: pd is live (contract).
    let ctx = unsafe { (*pd).context };
    let p = qp::finish_qp(w, ctx, pd, send_cq, recv_cq, srq, qp_context, qp);
    Ok(p)
}

/// Frees the C wrapper of a QP made by [`wrap_qp`] without destroying the QP, giving its
/// `Arc` back (for `rdma_destroy_qp`, where the CM destroys it). `None` for NULL.
///
/// # Safety
/// `p` must be NULL or a live QP of this library; it is invalid afterwards.
pub unsafe fn unwrap_qp(p: *mut ibv_qp) -> Option<Arc<softrdma::Qp>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller's contract; CQp was boxed.
    let b = unsafe { Box::from_raw(p.cast::<CQp>()) };
    Some(b.qp)
}
