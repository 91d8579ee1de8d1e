//! The C verbs layer as the connection manager uses it: the C context and default PD of a
//! device the CM opened, the objects behind C pointers, and the C objects the CM creates
//! for an id (made through the `ibv_*` entry points, so they are ordinary C objects).

use super::Res;
use crate::abi::*;
use crate::verbs::objects;
use libc::{c_int, c_void};
use softrdma::{AhAttr, Cq, Pd, QpAttr, Srq};
use std::sync::{Arc, Mutex};

/// The C context of a context the CM opened (NULL if its descriptor cannot be made).
pub fn context_of(ctx: &Arc<softrdma::Context>) -> *mut ibv_context {
    crate::verbs::cm_context(ctx).unwrap_or(std::ptr::null_mut())
}

/// The CM's default PD of the C context `ctx` (`id->pd` once the id is bound): one per
/// device, never freed (NULL if it cannot be allocated).
pub fn default_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    static PDS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut l = PDS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = l.iter().find(|(c, _)| *c == ctx as usize) {
        return *p as *mut ibv_pd;
    }
    // SAFETY: ctx is a live C context made by objects::cm_context.
    let Some(c) = (unsafe { objects::context_of(ctx) }) else {
        return std::ptr::null_mut();
    };
    let Ok(pd) = c.ctx.alloc_pd() else {
        return std::ptr::null_mut();
    };
    let p = objects::new_pd(ctx, Arc::new(pd), true);
    l.push((ctx as usize, p as usize));
    p
}

fn errno_or(e: i32) -> i32 {
    match crate::ffi::errno() {
        0 => e,
        x => x,
    }
}

/// `ibv_create_comp_channel`. Fails with its errno.
pub unsafe fn create_comp_channel(ctx: *mut ibv_context) -> Res<*mut ibv_comp_channel> {
    let p = crate::verbs::ibv_create_comp_channel(ctx);
    if p.is_null() {
        Err(errno_or(libc::ENOMEM))
    } else {
        Ok(p)
    }
}

/// `ibv_create_cq` with a completion channel. Fails with its errno.
pub unsafe fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
) -> Res<*mut ibv_cq> {
    let p = crate::verbs::ibv_create_cq(ctx, cqe, cq_context, ch, 0);
    if p.is_null() {
        Err(errno_or(libc::ENOMEM))
    } else {
        Ok(p)
    }
}

/// `ibv_destroy_cq` (a failure is ignored: librdmacm's teardown does not report it).
pub unsafe fn destroy_cq(cq: *mut ibv_cq) {
    if !cq.is_null() {
        crate::verbs::ibv_destroy_cq(cq);
    }
}

/// `ibv_destroy_comp_channel` (failures ignored, as above).
pub unsafe fn destroy_comp_channel(ch: *mut ibv_comp_channel) {
    if !ch.is_null() {
        crate::verbs::ibv_destroy_comp_channel(ch);
    }
}

/// `ibv_destroy_qp` (failures ignored, as above).
pub unsafe fn destroy_qp(qp: *mut ibv_qp) {
    if !qp.is_null() {
        crate::verbs::ibv_destroy_qp(qp);
    }
}

/// `ibv_create_srq`. Fails with its errno.
pub unsafe fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> Res<*mut ibv_srq> {
    let p = crate::verbs::ibv_create_srq(pd, attr);
    if p.is_null() {
        Err(errno_or(libc::ENOMEM))
    } else {
        Ok(p)
    }
}

/// `ibv_destroy_srq` (failures ignored, as above).
pub unsafe fn destroy_srq(srq: *mut ibv_srq) {
    if !srq.is_null() {
        crate::verbs::ibv_destroy_srq(srq);
    }
}

/// The softrdma CQ behind a C CQ. Fails with `EINVAL` for NULL.
pub unsafe fn cq_arc(cq: *mut ibv_cq) -> Res<Arc<Cq>> {
    crate::verbs::cq_arc(cq).cloned().ok_or(libc::EINVAL)
}

/// The softrdma SRQ behind a C SRQ. Fails with `EINVAL` for NULL.
pub unsafe fn srq_arc(srq: *mut ibv_srq) -> Res<Arc<Srq>> {
    crate::verbs::srq_arc(srq).cloned().ok_or(libc::EINVAL)
}

/// The softrdma PD behind a C PD. Fails with `EINVAL` for NULL.
pub unsafe fn pd_arc(pd: *mut ibv_pd) -> Res<Arc<Pd>> {
    crate::verbs::pd_arc(pd).cloned().ok_or(libc::EINVAL)
}

/// The C form of an address vector.
pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    crate::verbs::ah_attr_to_c(a)
}

/// Writes QP attributes in C form (every field; the mask says which mean something).
pub unsafe fn qp_attr_to_c(a: &QpAttr, out: *mut ibv_qp_attr) {
    out.write(crate::verbs::qp_attr_to_c(a));
}
