//! QPs, CQs and SRQs made through the connection manager: `rdma_create_qp(_ex)`,
//! `rdma_destroy_qp`, `rdma_create_srq(_ex)`, `rdma_destroy_srq`, `rdma_create_ep`,
//! `rdma_destroy_ep`.

use super::{cid, err, glue, new_cid, refresh, set_sync_event, CId, Res};
use crate::abi::*;
use crate::ffi::{guard, ret_neg1};
use libc::{c_int, c_void};
use softrdma::rdma_cm::{CmId, CmQpInitAttr};
use softrdma::{QpCap, QpType};

/// What `rdma_create_qp` and `rdma_create_qp_ex` have in common.
pub(crate) struct QpAttrs {
    /// The program's `qp->qp_context`.
    pub qp_context: *mut c_void,
    /// The send CQ (NULL: the CM makes one).
    pub send_cq: *mut ibv_cq,
    /// The receive CQ (NULL: the CM makes one).
    pub recv_cq: *mut ibv_cq,
    /// The SRQ (NULL: the id's, if any).
    pub srq: *mut ibv_srq,
    /// Requested capabilities; the actual ones are written back.
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Every send completes signaled.
    pub sq_sig_all: bool,
}

impl QpAttrs {
    /// From a `struct ibv_qp_init_attr`.
    pub fn from_init(a: &ibv_qp_init_attr) -> QpAttrs {
        QpAttrs {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
        }
    }
}

fn qp_type_from_c(t: u32) -> Res<QpType> {
    QpType::ALL
        .iter()
        .copied()
        .find(|q| *q as u32 == t)
        .ok_or(libc::EINVAL)
}

/// Destroys the CQs (and their channels) `rdma_create_qp` made for the id.
unsafe fn destroy_cm_cqs(c: &mut CId) {
    let (s, r) = {
        let mut x = c.extra();
        let v = (x.cm_send_cq, x.cm_recv_cq);
        x.cm_send_cq = false;
        x.cm_recv_cq = false;
        v
    };
    if s && !c.hdr.send_cq.is_null() {
        glue::destroy_cq(c.hdr.send_cq);
        glue::destroy_comp_channel(c.hdr.send_cq_channel);
        c.hdr.send_cq = std::ptr::null_mut();
        c.hdr.send_cq_channel = std::ptr::null_mut();
    }
    if r && !c.hdr.recv_cq.is_null() {
        glue::destroy_cq(c.hdr.recv_cq);
        glue::destroy_comp_channel(c.hdr.recv_cq_channel);
        c.hdr.recv_cq = std::ptr::null_mut();
        c.hdr.recv_cq_channel = std::ptr::null_mut();
    }
}

/// A CQ made by the CM: its own completion channel, `cq_context` = the id.
unsafe fn cm_cq(c: &mut CId, depth: u32) -> Res<(*mut ibv_cq, *mut ibv_comp_channel)> {
    let ch = glue::create_comp_channel(c.hdr.verbs)?;
    match glue::create_cq(
        c.hdr.verbs,
        depth.max(1) as c_int,
        c as *mut CId as *mut c_void,
        ch,
    ) {
        Ok(cq) => Ok((cq, ch)),
        Err(e) => {
            glue::destroy_comp_channel(ch);
            Err(e)
        }
    }
}

/// Creates the id's QP from C attributes: missing CQs are made with their channels, the QP
/// is made by the CM (moved to INIT, or RTS for UD) and wrapped into a C `ibv_qp`; the
/// header's `qp`, `pd`, CQ, channel and SRQ fields are set and the actual capabilities
/// written back to `a.cap`.
pub(crate) unsafe fn create_qp_c(c: &mut CId, pd: *mut ibv_pd, a: &mut QpAttrs) -> Res {
    // `ibv_destroy_qp` on the id's QP lets the id go of it through this hook.
    crate::verbs::qp::set_release_from_id(release_from_id);
    refresh(c);
    if c.hdr.verbs.is_null() || !c.hdr.qp.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if pd.is_null() { c.hdr.pd } else { pd };
    if pd.is_null() || (*pd).context != c.hdr.verbs {
        return Err(libc::EINVAL);
    }
    let qp_type = qp_type_from_c(a.qp_type)?;
    if a.send_cq.is_null() {
        let (cq, ch) = cm_cq(c, a.cap.max_send_wr)?;
        c.hdr.send_cq = cq;
        c.hdr.send_cq_channel = ch;
        c.extra().cm_send_cq = true;
    } else {
        c.hdr.send_cq = a.send_cq;
    }
    if a.recv_cq.is_null() {
        match cm_cq(c, a.cap.max_recv_wr) {
            Ok((cq, ch)) => {
                c.hdr.recv_cq = cq;
                c.hdr.recv_cq_channel = ch;
                c.extra().cm_recv_cq = true;
            }
            Err(e) => {
                destroy_cm_cqs(c);
                return Err(e);
            }
        }
    } else {
        c.hdr.recv_cq = a.recv_cq;
    }
    let srq = if a.srq.is_null() { c.hdr.srq } else { a.srq };
    let r = (|| {
        let mut attr = CmQpInitAttr {
            qp_context: 0,
            send_cq: Some(glue::cq_arc(c.hdr.send_cq)?),
            recv_cq: Some(glue::cq_arc(c.hdr.recv_cq)?),
            srq: if srq.is_null() {
                None
            } else {
                Some(glue::srq_arc(srq)?)
            },
            cap: QpCap {
                max_send_wr: a.cap.max_send_wr,
                max_recv_wr: a.cap.max_recv_wr,
                max_send_sge: a.cap.max_send_sge,
                max_recv_sge: a.cap.max_recv_sge,
                max_inline_data: a.cap.max_inline_data,
            },
            qp_type: Some(qp_type),
            sq_sig_all: a.sq_sig_all,
        };
        let pd_arc = glue::pd_arc(pd)?;
        let id = c.id.clone();
        let (scq, rcq) = (c.hdr.send_cq, c.hdr.recv_cq);
        let qp = crate::verbs::wrap_qp(pd, scq, rcq, srq, a.qp_context, |ctx| {
            attr.qp_context = ctx;
            id.create_qp_ex(Some(&pd_arc), &mut attr)
        })?;
        a.cap = ibv_qp_cap {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline_data: attr.cap.max_inline_data,
        };
        Ok(qp)
    })();
    match r {
        Ok(q) => {
            let _g = c.extra.lock().unwrap_or_else(|p| p.into_inner());
            c.hdr.qp = q;
            c.hdr.pd = pd;
            c.hdr.srq = srq;
            Ok(())
        }
        Err(e) => {
            destroy_cm_cqs(c);
            if !c.extra().cm_send_cq {
                c.hdr.send_cq = std::ptr::null_mut();
            }
            if !c.extra().cm_recv_cq {
                c.hdr.recv_cq = std::ptr::null_mut();
            }
            Err(e)
        }
    }
}

/// `rdma_create_qp`: creates the id's QP on `pd` (NULL: the device's default PD); missing
/// CQs are made with completion channels (`cq_context` = the id).
///
/// Fails with -1 and `EINVAL` (NULL, unbound id, a QP already, PD of another device, bad
/// type), or the errno of the QP's creation.
#[export_name = "softrdma_rdma_create_qp"]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        if qp_init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let mut a = QpAttrs::from_init(&*qp_init_attr);
        create_qp_c(c, pd, &mut a)?;
        (*qp_init_attr).cap = a.cap;
        Ok(())
    })
}

/// `rdma_create_qp_ex`: as `rdma_create_qp`, with the PD from `comp_mask`'s
/// `IBV_QP_INIT_ATTR_PD` (else the id's) and, with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, the
/// `ibv_wr_*` table of `ibv_qp_to_qp_ex`.
///
/// Fails like `rdma_create_qp`; `EOPNOTSUPP` for XRC, TSO, RSS, create flags and send
/// operations the QP type cannot do here.
#[export_name = "softrdma_rdma_create_qp_ex"]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    const IBV_QP_INIT_ATTR_PD: u32 = 1;
    const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
    const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
    ret_neg1(|| {
        let c = cid(id)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let x = &mut *attr;
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if x.comp_mask & !known != 0
            || (x.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && x.create_flags != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        let ops = (x.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(x.send_ops_flags);
        if let Some(ops) = ops {
            crate::verbs::ex::check_send_ops(x.qp_type, ops)?;
        }
        let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            x.pd
        } else {
            std::ptr::null_mut()
        };
        let mut a = QpAttrs {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all != 0,
        };
        create_qp_c(c, pd, &mut a)?;
        if let Some(ops) = ops {
            if let Err(e) = crate::verbs::ex::enable_qp_ex(c.hdr.qp, ops) {
                rdma_destroy_qp(id);
                return Err(e);
            }
        }
        x.cap = a.cap;
        Ok(())
    })
}

/// `rdma_destroy_qp`: destroys the id's QP and the CQs and channels the CM made for it.
#[export_name = "softrdma_rdma_destroy_qp"]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(c) = cid(id) else { return };
        let qp = {
            let _g = c.extra.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut c.hdr.qp, std::ptr::null_mut())
        };
        c.id.destroy_qp();
        glue::destroy_qp(qp);
        destroy_cm_cqs(c);
        let (s, r) = {
            let x = c.extra();
            (x.cm_send_cq, x.cm_recv_cq)
        };
        if !s {
            c.hdr.send_cq = std::ptr::null_mut();
        }
        if !r {
            c.hdr.recv_cq = std::ptr::null_mut();
        }
    })
}

/// `ibv_destroy_qp` of a QP the CM made for an id (perftest tears its control connection
/// down so, without `rdma_destroy_qp`): as in rdma-core, where the kernel frees the QP at
/// once, the id lets go of the QP (and of its PD, so `ibv_dealloc_pd` can follow) and
/// `id->qp` becomes NULL, so the id's later events and calls never reach the freed C QP
/// (rdma-core leaves the pointer dangling). Does nothing when no id uses `arc`.
///
/// # Safety
/// `qp` must be the live C QP wrapping `arc`.
pub(crate) unsafe fn release_from_id(qp: *mut ibv_qp, arc: &std::sync::Arc<softrdma::Qp>) {
    let owner = super::ids().iter().find_map(|(id, p)| {
        id.qp()
            .is_some_and(|q| std::sync::Arc::ptr_eq(&q, arc))
            .then_some(*p as *mut CId)
    });
    let Some(c) = owner else { return };
    // SAFETY: a registered C id is live (the program does not destroy it while it destroys
    // its QP).
    let c = unsafe { &mut *c };
    {
        let _g = c.extra.lock().unwrap_or_else(|p| p.into_inner());
        if c.hdr.qp == qp {
            c.hdr.qp = std::ptr::null_mut();
        }
    }
    c.id.destroy_qp();
}

/// `rdma_get_request`: the next connection request of a synchronous listener, as a new
/// synchronous id (with its QP, if `rdma_create_ep` was given QP attributes).
///
/// Fails with -1 and `EINVAL` (NULL, not a synchronous listener), or the errno of the
/// event that came instead.
#[export_name = "softrdma_rdma_get_request"]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ret_neg1(|| {
        let l = cid(listen)?;
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let new = l.id.get_request().map_err(err)?;
        let c = &mut *new_cid(new, l.hdr.context, std::ptr::null_mut());
        set_sync_event(c);
        let ep = l.extra().ep;
        if let Some((pd, attr)) = ep {
            if let Err(e) = create_qp_c(c, pd, &mut QpAttrs::from_init(&attr)) {
                let _ = c.id.reject(&[]);
                super::rdma_destroy_id(c as *mut CId as *mut rdma_cm_id);
                return Err(e);
            }
        }
        *id = c as *mut CId as *mut rdma_cm_id;
        Ok(())
    })
}

/// `rdma_create_srq`: an SRQ for the id's QP, on `pd` (NULL: the id's PD).
///
/// Fails with -1 and `EINVAL` (NULL, unbound id, an SRQ already), or the errno of the
/// SRQ's creation.
#[export_name = "softrdma_rdma_create_srq"]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        refresh(c);
        if attr.is_null() || c.hdr.verbs.is_null() || !c.hdr.srq.is_null() {
            return Err(libc::EINVAL);
        }
        let pd = if pd.is_null() { c.hdr.pd } else { pd };
        if pd.is_null() || (*pd).context != c.hdr.verbs {
            return Err(libc::EINVAL);
        }
        c.hdr.srq = glue::create_srq(pd, attr)?;
        c.hdr.pd = pd;
        Ok(())
    })
}

/// `rdma_create_srq_ex`: a basic SRQ (`IBV_SRQT_BASIC`) as `rdma_create_srq`.
///
/// Fails like `rdma_create_srq`; `EOPNOTSUPP` for XRC and tag-matching SRQs.
#[export_name = "softrdma_rdma_create_srq_ex"]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1;
    const IBV_SRQ_INIT_ATTR_PD: u32 = 2;
    ret_neg1(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let x = &mut *attr;
        if x.comp_mask & !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD) != 0
            || (x.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && x.srq_type != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if x.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
            x.pd
        } else {
            std::ptr::null_mut()
        };
        let mut basic = ibv_srq_init_attr {
            srq_context: x.srq_context,
            attr: x.attr,
        };
        if rdma_create_srq(id, pd, &mut basic) != 0 {
            return Err(crate::ffi::errno());
        }
        x.attr = basic.attr;
        Ok(())
    })
}

/// `rdma_destroy_srq`: destroys the id's SRQ.
#[export_name = "softrdma_rdma_destroy_srq"]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(c) = cid(id) else { return };
        if !c.hdr.srq.is_null() {
            glue::destroy_srq(c.hdr.srq);
            c.hdr.srq = std::ptr::null_mut();
        }
    })
}

/// `rdma_create_ep`: a synchronous id from an `rdma_getaddrinfo` result. Active: address
/// and route resolved, and the QP made if `qp_init_attr` is given. Passive: bound, and `pd`
/// and `qp_init_attr` kept for `rdma_get_request`.
///
/// Fails with -1 and `EINVAL` (NULL, no address), or the errno of the resolution or the
/// QP's creation.
#[export_name = "softrdma_rdma_create_ep"]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ret_neg1(|| {
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        let ai = super::addrinfo::from_c(&*res)?;
        let new = CmId::create_ep(&ai, None, None).map_err(err)?;
        let c = &mut *new_cid(new, std::ptr::null_mut(), std::ptr::null_mut());
        set_sync_event(c);
        if !qp_init_attr.is_null() {
            (*qp_init_attr).qp_type = ai.ai_qp_type as u32;
            if ai.ai_flags & softrdma::rdma_cm::RAI_PASSIVE != 0 {
                c.extra().ep = Some((pd, *qp_init_attr));
            } else {
                let mut a = QpAttrs::from_init(&*qp_init_attr);
                if let Err(e) = create_qp_c(c, pd, &mut a) {
                    rdma_destroy_ep(c as *mut CId as *mut rdma_cm_id);
                    return Err(e);
                }
                (*qp_init_attr).cap = a.cap;
            }
        } else if !pd.is_null() {
            c.hdr.pd = pd;
        }
        *id = c as *mut CId as *mut rdma_cm_id;
        Ok(())
    })
}

/// `rdma_destroy_ep`: destroys the id's QP (with the CM's CQs), its SRQ and the id.
#[export_name = "softrdma_rdma_destroy_ep"]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        super::rdma_destroy_id(id);
    })
}
