//! The C verbs layer as the connection manager uses it: the C context and default PD of a
//! device the CM opened, the objects behind C pointers, and the C objects the CM creates
//! for an id (made through the `ibv_*` entry points, so they are ordinary C objects).

use super::Res;
use crate::abi::*;
use crate::verbs::objects::{self, CCq, CPd, CQp, CSrq};
use libc::{c_int, c_void};
use softrdma::{AhAttr, Cq, Pd, Qp, QpAttr, Srq};
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

/// The C context of a context the CM opened (NULL if its descriptor cannot be made).
pub fn context_of(ctx: &Arc<softrdma::Context>) -> *mut ibv_context {
    objects::cm_context(ctx).unwrap_or(std::ptr::null_mut())
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
    objects::wrapper::<_, CCq>(cq)
        .map(|w| w.cq.clone())
        .ok_or(libc::EINVAL)
}

/// The softrdma SRQ behind a C SRQ. Fails with `EINVAL` for NULL.
pub unsafe fn srq_arc(srq: *mut ibv_srq) -> Res<Arc<Srq>> {
    objects::wrapper::<_, CSrq>(srq)
        .map(|w| w.srq.clone())
        .ok_or(libc::EINVAL)
}

/// The softrdma PD behind a C PD. Fails with `EINVAL` for NULL.
pub unsafe fn pd_arc(pd: *mut ibv_pd) -> Res<Arc<Pd>> {
    objects::wrapper::<_, CPd>(pd)
        .map(|w| w.pd.clone())
        .ok_or(libc::EINVAL)
}

/// Room for the C QP of a QP the CM is about to create: its address is the softrdma QP's
/// `qp_context`, as for every QP of the C layer.
pub fn qp_wrapper() -> *mut MaybeUninit<CQp> {
    objects::alloc_wrapper::<CQp>()
}

/// Frees a wrapper from [`qp_wrapper`] whose QP was not created.
pub unsafe fn abandon_qp(w: *mut MaybeUninit<CQp>) {
    objects::abandon(w)
}

/// Completes the C QP for `qp` (made by the CM with `w`'s address as its context).
pub unsafe fn finish_qp(
    w: *mut MaybeUninit<CQp>,
    qp: Arc<Qp>,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_context: *mut c_void,
) -> *mut ibv_qp {
    let mut c: ibv_qp = objects::zeroed();
    c.context = (*pd).context;
    c.qp_context = qp_context;
    c.pd = pd;
    c.send_cq = send_cq;
    c.recv_cq = recv_cq;
    c.srq = srq;
    c.handle = qp.qp_num();
    c.qp_num = qp.qp_num();
    c.state = qp.state() as u32;
    c.qp_type = qp.qp_type() as u32;
    let p = objects::finish(
        w,
        CQp {
            c,
            ex: Default::default(),
            qp,
        },
    );
    p.cast()
}

/// The C form of an address vector.
pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid {
                raw: a.grh.dgid.raw,
            },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// Writes QP attributes in C form (every field; the mask says which mean something).
pub unsafe fn qp_attr_to_c(a: &QpAttr, out: *mut ibv_qp_attr) {
    let o = &mut *out;
    o.qp_state = a.qp_state as u32;
    o.cur_qp_state = a.cur_qp_state as u32;
    o.path_mtu = a.path_mtu as u32;
    o.path_mig_state = a.path_mig_state as u32;
    o.qkey = a.qkey;
    o.rq_psn = a.rq_psn;
    o.sq_psn = a.sq_psn;
    o.dest_qp_num = a.dest_qp_num;
    o.qp_access_flags = a.qp_access_flags;
    o.cap = ibv_qp_cap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    o.ah_attr = ah_attr_to_c(&a.ah_attr);
    o.alt_ah_attr = ah_attr_to_c(&a.alt_ah_attr);
    o.pkey_index = a.pkey_index;
    o.alt_pkey_index = a.alt_pkey_index;
    o.en_sqd_async_notify = u8::from(a.en_sqd_async_notify);
    o.sq_draining = u8::from(a.sq_draining);
    o.max_rd_atomic = a.max_rd_atomic;
    o.max_dest_rd_atomic = a.max_dest_rd_atomic;
    o.min_rnr_timer = a.min_rnr_timer;
    o.port_num = a.port_num;
    o.timeout = a.timeout;
    o.retry_cnt = a.retry_cnt;
    o.rnr_retry = a.rnr_retry;
    o.alt_port_num = a.alt_port_num;
    o.alt_timeout = a.alt_timeout;
    o.rate_limit = a.rate_limit;
}
