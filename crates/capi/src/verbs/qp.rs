//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, and
//! the translation of `struct ibv_qp_attr` + `attr_mask` both ways.

use super::objects::{self, CCq, CPd, CQp, CSrq};
use crate::abi::*;
use crate::ffi::{ret_errno, ret_ptr};
use libc::{c_int, c_void, EINVAL};
use softrdma::{AhAttr, Gid, GlobalRoute, MigState, Mtu, QpAttr, QpAttrMask, QpState};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// An address vector in C form.
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

/// A C address vector in softrdma form. The flow label keeps its low 20 bits, as Linux
/// does: the kernel takes any 32-bit value (UCX passes `~0` on RoCE) where softrdma's
/// own API answers EINVAL.
pub fn ah_attr_from_c(c: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            // SAFETY: every bit pattern of the union is a valid byte array.
            dgid: Gid {
                raw: unsafe { c.grh.dgid.raw },
            },
            flow_label: c.grh.flow_label & 0xf_ffff,
            sgid_index: c.grh.sgid_index,
            hop_limit: c.grh.hop_limit,
            traffic_class: c.grh.traffic_class,
        },
        dlid: c.dlid,
        sl: c.sl,
        src_path_bits: c.src_path_bits,
        static_rate: c.static_rate,
        is_global: c.is_global != 0,
        port_num: c.port_num,
    }
}

fn cap_to_c(c: &softrdma::QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_from_c(c: &ibv_qp_cap) -> softrdma::QpCap {
    softrdma::QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The fields of a C `ibv_qp_attr` that `attr_mask` names, in softrdma form (the others
/// default). Fails with `EINVAL` for a named enum field out of range.
pub fn qp_attr_from_c(c: &ibv_qp_attr, attr_mask: c_int) -> Result<QpAttr, i32> {
    let m = QpAttrMask::from_bits_retain(attr_mask as u32);
    let mut a = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        a.qp_state = QpState::from_raw(c.qp_state).ok_or(EINVAL)?;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        a.cur_qp_state = QpState::from_raw(c.cur_qp_state).ok_or(EINVAL)?;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        a.path_mtu = Mtu::from_raw(c.path_mtu).ok_or(EINVAL)?;
    }
    if m.contains(QpAttrMask::PATH_MIG_STATE) {
        a.path_mig_state = match c.path_mig_state {
            0 => MigState::Migrated,
            1 => MigState::Rearm,
            2 => MigState::Armed,
            _ => return Err(EINVAL),
        };
    }
    a.qkey = c.qkey;
    a.rq_psn = c.rq_psn;
    a.sq_psn = c.sq_psn;
    a.dest_qp_num = c.dest_qp_num;
    a.qp_access_flags = c.qp_access_flags;
    a.cap = cap_from_c(&c.cap);
    a.ah_attr = ah_attr_from_c(&c.ah_attr);
    a.alt_ah_attr = ah_attr_from_c(&c.alt_ah_attr);
    a.pkey_index = c.pkey_index;
    a.alt_pkey_index = c.alt_pkey_index;
    a.en_sqd_async_notify = c.en_sqd_async_notify != 0;
    a.max_rd_atomic = c.max_rd_atomic;
    a.max_dest_rd_atomic = c.max_dest_rd_atomic;
    a.min_rnr_timer = c.min_rnr_timer;
    a.port_num = c.port_num;
    a.timeout = c.timeout;
    a.retry_cnt = c.retry_cnt;
    a.rnr_retry = c.rnr_retry;
    a.alt_port_num = c.alt_port_num;
    a.alt_timeout = c.alt_timeout;
    a.rate_limit = c.rate_limit;
    Ok(a)
}

/// A softrdma `QpAttr` in C form (every field).
pub fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: a.path_mig_state as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: cap_to_c(&a.cap),
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ah_attr_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

/// Completes a QP wrapper from [`objects::alloc_wrapper`] around `qp`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_qp(
    w: *mut MaybeUninit<CQp>,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    qp_context: *mut c_void,
    qp: Arc<softrdma::Qp>,
) -> *mut ibv_qp {
    let mut c: ibv_qp = objects::zeroed();
    c.context = ctx;
    c.qp_context = qp_context;
    c.pd = pd;
    c.send_cq = send_cq;
    c.recv_cq = recv_cq;
    c.srq = srq;
    c.handle = qp.qp_num();
    c.qp_num = qp.qp_num();
    c.state = qp.state() as u32;
    c.qp_type = qp.qp_type() as u32;
    // SAFETY: w is an unfinished wrapper.
    let p = unsafe {
        objects::finish(
            w,
            CQp {
                c,
                ex: Default::default(),
                qp,
            },
        )
    };
    p.cast()
}

/// Creates a QP in `pd` from `attr` (shared by `ibv_create_qp` and the extended API):
/// writes the actual capabilities back. Fails with EINVAL for NULL arguments, CQs or an SRQ
/// of another context, an unknown type; with softrdma's errno otherwise.
///
/// # Safety
/// `pd` and the pointers in `attr` must be NULL or live objects of this library.
pub unsafe fn create_qp(pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, i32> {
    // SAFETY: caller's contract for all the wrappers.
    let (p, scq, rcq) = unsafe {
        (
            objects::wrapper::<_, CPd>(pd).ok_or(EINVAL)?,
            objects::wrapper::<_, CCq>(attr.send_cq).ok_or(EINVAL)?,
            objects::wrapper::<_, CCq>(attr.recv_cq).ok_or(EINVAL)?,
        )
    };
    // SAFETY: as above.
    let srq = unsafe { objects::wrapper::<_, CSrq>(attr.srq) };
    let ctx = p.c.context;
    if scq.c.context != ctx || rcq.c.context != ctx {
        return Err(EINVAL);
    }
    if let Some(s) = srq {
        if s.c.context != ctx {
            return Err(EINVAL);
        }
    }
    let qp_type = softrdma::QpType::from_raw(attr.qp_type).ok_or(EINVAL)?;
    let w = objects::alloc_wrapper::<CQp>();
    let mut init = softrdma::QpInitAttr {
        qp_context: w as u64,
        send_cq: &scq.cq,
        recv_cq: &rcq.cq,
        srq: srq.map(|s| &*s.srq),
        cap: cap_from_c(&attr.cap),
        qp_type,
        sq_sig_all: attr.sq_sig_all != 0,
    };
    match p.pd.create_qp(&mut init) {
        Ok(qp) => {
            attr.cap = cap_to_c(&init.cap);
            Ok(finish_qp(
                w,
                ctx,
                pd,
                attr.send_cq,
                attr.recv_cq,
                attr.srq,
                attr.qp_context,
                Arc::new(qp),
            ))
        }
        Err(e) => {
            // SAFETY: w is unfinished.
            unsafe { objects::abandon(w) };
            Err(e.errno())
        }
    }
}

/// `ibv_create_qp`: a QP in RESET with at least the capabilities asked for (written back);
/// NULL with errno (see [`create_qp`]).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ret_ptr(|| {
        if qp_init_attr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's attr, objects of this library.
        unsafe { create_qp(pd, &mut *qp_init_attr) }
    })
}

/// The highest attribute bit the kernel's uverbs accepts (`IB_USER_LAST_QP_ATTR_MASK`,
/// `IBV_QP_RATE_LIMIT`): masks with higher bits fail with EOPNOTSUPP before any check.
const LAST_QP_ATTR_BIT: u32 = 25;

/// `ibv_modify_qp`: 0, or the errno (EINVAL for NULL, an invalid transition, a missing or
/// forbidden attribute, a value out of range; EOPNOTSUPP for mask bits above
/// `IBV_QP_RATE_LIMIT`, as the kernel answers).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live QP.
        let w = unsafe { objects::wrapper::<_, CQp>(qp) }.ok_or(EINVAL)?;
        if attr.is_null() {
            return Err(EINVAL);
        }
        if (attr_mask as u32) >> (LAST_QP_ATTR_BIT + 1) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: the caller's attr.
        let a = qp_attr_from_c(unsafe { &*attr }, attr_mask)?;
        w.qp.modify_qp(&a, attr_mask as u32)
            .map_err(|e| e.errno())?;
        // SAFETY: qp is live; `state` is the field programs read.
        unsafe { (*qp).state = w.qp.state() as u32 };
        Ok(())
    })
}

/// `ibv_query_qp`: every attribute (the mask is a hint) and the creation attributes; 0, or
/// the errno (EINVAL for NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = attr_mask;
    ret_errno(|| {
        // SAFETY: NULL or a live QP.
        let w = unsafe { objects::wrapper::<_, CQp>(qp) }.ok_or(EINVAL)?;
        if attr.is_null() || init_attr.is_null() {
            return Err(EINVAL);
        }
        let (a, info) = w.qp.query_qp().map_err(|e| e.errno())?;
        // SAFETY: the caller's structs; qp is live.
        unsafe {
            attr.write(qp_attr_to_c(&a));
            init_attr.write(ibv_qp_init_attr {
                qp_context: w.c.qp_context,
                send_cq: w.c.send_cq,
                recv_cq: w.c.recv_cq,
                srq: w.c.srq,
                cap: cap_to_c(&info.cap),
                qp_type: info.qp_type as u32,
                sq_sig_all: c_int::from(info.sq_sig_all),
            });
            (*qp).state = a.qp_state as u32;
        }
        Ok(())
    })
}

/// What `ibv_destroy_qp` calls for a QP that more than the C wrapper holds: the connection
/// manager's side lets an id's QP go (`id->qp` becomes NULL). `qp` is the live C QP
/// wrapping the `Arc`.
pub(crate) type ReleaseFromId = unsafe fn(qp: *mut ibv_qp, arc: &Arc<softrdma::Qp>);

static RELEASE_FROM_ID: std::sync::OnceLock<ReleaseFromId> = std::sync::OnceLock::new();

/// Registers the connection manager's [`ReleaseFromId`] hook (librdmacm's side calls this
/// before it makes a QP for an id, so libibverbs' side never imports it). A second
/// registration keeps the first. Never fails.
pub(crate) fn set_release_from_id(f: ReleaseFromId) {
    let _ = RELEASE_FROM_ID.set(f);
}

/// `ibv_destroy_qp`: 0, or the errno (EINVAL for NULL; EBUSY while attached to multicast
/// groups or with unacknowledged asynchronous events).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ret_errno(|| {
        if qp.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: a live QP wrapper.
        let w = unsafe { &*qp.cast::<CQp>() };
        if Arc::strong_count(&w.qp) > 1 {
            // The QP of a CM id: the id lets go of it, so it is destroyed now.
            if let Some(release) = RELEASE_FROM_ID.get() {
                // SAFETY: qp wraps w.qp.
                unsafe { release(qp, &w.qp) };
            }
        }
        // SAFETY: a live QP wrapper.
        unsafe {
            objects::destroy_arc(
                qp.cast::<CQp>(),
                |w| std::ptr::addr_of_mut!((*w).qp),
                |w| std::ptr::drop_in_place(std::ptr::addr_of_mut!((*w).ex)),
                |q| q.destroy(),
            )
        }
    })
}

/// `ibv_query_qp_data_in_order`: 0 (no in-order guarantee reported).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(qp: *mut ibv_qp, op: u32, flags: u32) -> c_int {
    let _ = (qp, op, flags);
    0
}
