//! The QP, SRQ and CQs of an id: `rdma_create_qp`, `rdma_create_srq`, `rdma_init_qp_attr`,
//! and the QP state changes the connection steps make.

use super::objects::{CmId, IdData};
use super::qp_state::{modify_to, qp_to_err};
use super::registry::device_res;
use super::{CmQpInitAttr, PortSpace, RDMA_UDP_QKEY};
use crate::error::{Error, Result};
use crate::{
    AccessFlags, AhAttr, CompChannel, Cq, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState,
    QpType, Srq, SrqInitAttr,
};
use std::sync::Arc;

impl CmId {
    /// Creates the id's QP (`rdma_create_qp`) with send and receive CQs of its own, each
    /// with a completion channel (cq_context = the id's context). With `pd` None the
    /// device's default PD. See [`CmId::create_qp_ex`].
    ///
    /// Fails like [`CmId::create_qp_ex`].
    pub fn create_qp(&self, pd: Option<&Arc<Pd>>, cap: &mut QpCap) -> Result<Arc<Qp>> {
        let mut a = CmQpInitAttr {
            cap: *cap,
            ..Default::default()
        };
        let qp = self.create_qp_ex(pd, &mut a)?;
        *cap = a.cap;
        Ok(qp)
    }

    /// `rdma_create_qp` with the application's own CQ for both queues: no CQ or channel is
    /// made, so `get_send_comp`/`get_recv_comp` cannot wait on this id.
    ///
    /// Fails like [`CmId::create_qp_ex`].
    pub fn create_qp_with_cq(
        &self,
        pd: Option<&Arc<Pd>>,
        cq: &Arc<Cq>,
        cap: &mut QpCap,
    ) -> Result<Arc<Qp>> {
        let mut a = CmQpInitAttr {
            cap: *cap,
            send_cq: Some(cq.clone()),
            recv_cq: Some(cq.clone()),
            ..Default::default()
        };
        let qp = self.create_qp_ex(pd, &mut a)?;
        *cap = a.cap;
        Ok(qp)
    }

    /// Creates the id's QP (`rdma_create_qp` / `rdma_create_qp_ex`): with `pd` None the
    /// device's default PD (one per device); a missing send or receive CQ is made with its
    /// own completion channel (size `max_send_wr`/`max_recv_wr`, cq_context = the id's
    /// context). An RC or UC QP is left in INIT for connect/accept to move; a UD QP goes
    /// to RTS at once with Q_Key [`RDMA_UDP_QKEY`]. The actual capabilities are written
    /// back into `attr.cap`.
    ///
    /// Fails with `EINVAL` before the id is bound to a device, when it already has a QP, when
    /// the PD, a CQ or the SRQ belongs to another device, or the QP type does not fit the
    /// port space; and like [`Pd::create_qp`].
    pub fn create_qp_ex(&self, pd: Option<&Arc<Pd>>, attr: &mut CmQpInitAttr) -> Result<Arc<Qp>> {
        let mut s = self.inner.lock();
        let Some(ctx) = s.ctx.clone() else {
            return Err(Error::invalid("the id is not bound to a device yet"));
        };
        if s.qp.is_some() {
            return Err(Error::invalid("the id already has a QP"));
        }
        let qp_type = attr.qp_type.unwrap_or(self.inner.qp_type);
        let fits = match self.inner.ps {
            PortSpace::Tcp => matches!(qp_type, QpType::Rc | QpType::Uc),
            PortSpace::Udp | PortSpace::Ipoib => qp_type == QpType::Ud,
            _ => matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud),
        };
        if !fits {
            return Err(Error::invalid(format!(
                "a {qp_type:?} QP does not fit the port space {:?}",
                self.inner.ps
            )));
        }
        let dev_addr = ctx.device().addr();
        let (_, default_pd) = device_res(dev_addr)?;
        let pd = pd.cloned().unwrap_or(default_pd);
        if pd.device().addr() != dev_addr {
            return Err(Error::invalid("the PD belongs to another device"));
        }
        let mk = |depth: u32| -> Result<(Arc<Cq>, Arc<CompChannel>)> {
            let ch = Arc::new(ctx.create_comp_channel()?);
            let cq = Arc::new(ctx.create_cq(depth.max(1), self.inner.context, Some(&ch), 0)?);
            Ok((cq, ch))
        };
        let (scq, sch) = match &attr.send_cq {
            Some(c) => (c.clone(), None),
            None => {
                let (c, ch) = mk(attr.cap.max_send_wr)?;
                (c, Some(ch))
            }
        };
        let (rcq, rch) = match &attr.recv_cq {
            Some(c) => (c.clone(), None),
            None => {
                let (c, ch) = mk(attr.cap.max_recv_wr)?;
                (c, Some(ch))
            }
        };
        let srq = attr.srq.clone().or_else(|| s.srq.clone());
        let mut init = QpInitAttr::new(qp_type, &scq, attr.cap);
        init.recv_cq = &rcq;
        init.srq = srq.as_deref();
        init.qp_context = attr.qp_context;
        init.sq_sig_all = attr.sq_sig_all;
        let qp = Arc::new(pd.create_qp(&mut init)?);
        attr.cap = init.cap;
        attr.qp_type = Some(qp_type);
        s.qp = Some(qp.clone());
        s.pd = Some(pd);
        s.send_cq = Some(scq);
        s.recv_cq = Some(rcq);
        s.send_cq_channel = sch;
        s.recv_cq_channel = rch;
        let r = if qp_type == QpType::Ud {
            modify_to(&qp, self.attr_for(&s, QpState::Init))
                .and_then(|()| modify_to(&qp, self.attr_for(&s, QpState::Rtr)))
                .and_then(|()| modify_to(&qp, self.attr_for(&s, QpState::Rts)))
        } else {
            modify_to(&qp, self.attr_for(&s, QpState::Init))
        };
        if let Err(e) = r {
            Self::clear_qp(&mut s);
            return Err(e);
        }
        Ok(qp)
    }

    pub(super) fn clear_qp(s: &mut IdData) {
        s.qp = None;
        s.send_cq = None;
        s.recv_cq = None;
        s.send_cq_channel = None;
        s.recv_cq_channel = None;
    }

    /// Destroys the id's QP (`rdma_destroy_qp`), leaving the multicast groups it is attached
    /// to, and the CQs and channels `create_qp` made for it. Handles the application still
    /// holds stay valid objects, but the id no longer uses them.
    ///
    /// The id lets go of the QP's PD too (unless its SRQ still uses it), so the teardown
    /// order of librdmacm programs — destroy the QP, then the CQs, then deallocate the PD,
    /// then destroy the id — works: once the application drops its other handles of the QP,
    /// the `Arc<Pd>` it passed to `create_qp` is its only one again.
    pub fn destroy_qp(&self) {
        let mut s = self.inner.lock();
        if let Some(qp) = s.qp.clone() {
            for g in &mut s.mcast {
                if let Some(q) = g.attached.take() {
                    let _ = q.detach_mcast(&g.gid, 0);
                }
            }
            qp_to_err(&qp);
        }
        Self::clear_qp(&mut s);
        if s.srq.is_none() {
            s.pd = None;
        }
    }

    /// Creates a shared receive queue for the id (`rdma_create_srq`): a QP created on the id
    /// afterwards takes its receives from it. With `pd` None the device's default PD.
    ///
    /// Fails with `EINVAL` before the id is bound to a device or when it already has an
    /// SRQ, and like [`Pd::create_srq`].
    pub fn create_srq(&self, pd: Option<&Arc<Pd>>, attr: &mut SrqInitAttr) -> Result<Arc<Srq>> {
        let mut s = self.inner.lock();
        let Some(ctx) = s.ctx.clone() else {
            return Err(Error::invalid("the id is not bound to a device yet"));
        };
        if s.srq.is_some() {
            return Err(Error::invalid("the id already has an SRQ"));
        }
        let (_, default_pd) = device_res(ctx.device().addr())?;
        let pd = pd.cloned().unwrap_or(default_pd);
        let srq = Arc::new(pd.create_srq(attr)?);
        s.srq = Some(srq.clone());
        if s.pd.is_none() {
            s.pd = Some(pd);
        }
        Ok(srq)
    }

    /// Releases the id's SRQ (`rdma_destroy_srq`).
    pub fn destroy_srq(&self) {
        let mut s = self.inner.lock();
        s.srq = None;
        if s.qp.is_none() {
            s.pd = None;
        }
    }

    /// The QP attributes and mask the connection manager uses to move a QP to `state`
    /// (`rdma_init_qp_attr`): INIT (port, P_Key index, access flags or Q_Key), RTR (address
    /// vector, path MTU, remote QPN and PSN, responder resources, minimum RNR timer) and RTS
    /// (send PSN, timeout, retry counts, initiator depth). For ids whose QP the application
    /// owns (connect/accept with no QP).
    ///
    /// Fails with `EINVAL` for another state, before the id is bound (INIT), or before the
    /// peer's parameters are known (RC RTR/RTS: after CONNECT_REQUEST or CONNECT_RESPONSE).
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let s = self.inner.lock();
        if !matches!(state, QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(Error::invalid("rdma_init_qp_attr: INIT, RTR or RTS only"));
        }
        if s.ctx.is_none() {
            return Err(Error::invalid("the id is not bound to a device yet"));
        }
        self.attr_for(&s, state)
    }

    pub(super) fn attr_for(&self, s: &IdData, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let ud = s.qp.as_ref().map_or(self.inner.qp_type == QpType::Ud, |q| {
            q.qp_type() == QpType::Ud
        });
        let mut a = QpAttr {
            qp_state: state,
            ..Default::default()
        };
        let mut m = QpAttrMask::STATE;
        match (state, ud) {
            (QpState::Init, true) => {
                a.port_num = 1;
                a.qkey = RDMA_UDP_QKEY;
                m |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
            }
            (QpState::Init, false) => {
                a.port_num = 1;
                let mut acc = AccessFlags::REMOTE_WRITE;
                if s.neg.is_none_or(|n| n.resp > 0) {
                    acc |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
                }
                a.qp_access_flags = acc.bits();
                m |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
            }
            (QpState::Rtr, true) => {}
            (QpState::Rts, true) => {
                a.sq_psn = 0;
                m |= QpAttrMask::SQ_PSN;
            }
            (QpState::Rtr, false) => {
                let (Some(n), Some(peer)) = (s.neg, s.dst) else {
                    return Err(Error::invalid("the peer's parameters are not known yet"));
                };
                a.ah_attr = AhAttr::for_ip(peer.ip());
                a.ah_attr.grh.traffic_class = s.tos;
                a.path_mtu = n.mtu;
                a.dest_qp_num = n.remote_qpn;
                // Linux's CM (cm.c): the Starting PSN a side puts in its REQ/REP is the one
                // its own QP receives first (`rq_psn`); the peer sends with it.
                a.rq_psn = s.starting_psn;
                a.max_dest_rd_atomic = n.resp;
                a.min_rnr_timer = 0;
                m |= QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER;
            }
            (QpState::Rts, false) => {
                let Some(n) = s.neg else {
                    return Err(Error::invalid("the peer's parameters are not known yet"));
                };
                a.sq_psn = n.remote_psn;
                a.timeout = s.ack_timeout.unwrap_or(n.timeout).clamp(1, 31);
                a.retry_cnt = n.retry.min(7);
                a.rnr_retry = n.rnr.min(7);
                a.max_rd_atomic = n.init;
                m |= QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC;
            }
            _ => unreachable!("checked by the caller"),
        }
        Ok((a, m))
    }

    /// Moves the id's own QP (if any) to RTR and RTS with the negotiated parameters.
    pub(super) fn qp_to_rts(&self, s: &IdData) -> Result<()> {
        let Some(qp) = s.qp.clone() else {
            return Ok(());
        };
        modify_to(&qp, self.attr_for(s, QpState::Rtr))?;
        modify_to(&qp, self.attr_for(s, QpState::Rts))
    }
}
