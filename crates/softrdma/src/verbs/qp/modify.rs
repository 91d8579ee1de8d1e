//! `ibv_modify_qp`: the checks of the attribute values against the device, and the change
//! applied all at once (the transport built at RTR, the queues flushed in ERR).

use super::{Qp, QpAttr, QpInner, QpState_};
use crate::error::{Error, Result};
use crate::provider::QpPort;
use crate::verbs::cq::WcOpcode;
use crate::verbs::datapath::{drive_and_send, send_held_ack, to_wc};
use crate::verbs::device::PORT_NUM;
use crate::verbs::event::EventType;
use crate::verbs::mr::AccessFlags;
use softrdma_proto::transport as tp;
use softrdma_proto::{check_modify_qp, QpAttrMask, QpState, QpType};
use std::sync::{Arc, Weak};

const QP_ACCESS_BITS: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits()
    | AccessFlags::REMOTE_ATOMIC.bits();

impl QpInner {
    /// Completes every queued work request with `WR_FLUSH_ERR` (the SRQ, shared with other
    /// QPs, is left alone).
    fn flush(&self, st: &mut QpState_) {
        if let Some(t) = st.transport.as_mut() {
            t.set_error();
            while let Some(c) = t.poll_completion() {
                let cq = if c.is_recv {
                    &self.recv_cq
                } else {
                    &self.send_cq
                };
                cq.arc()
                    .push(to_wc(&c, self.qp_num, self.qp_type == QpType::Ud), false);
            }
        }
        crate::verbs::records::flush(self, &mut st.records);
        st.ud_dests.clear();
        st.parked.clear();
        for w in st.rq.drain(..) {
            self.recv_cq
                .arc()
                .push(self.flush_wc(w.wr_id, WcOpcode::Recv), false);
        }
    }

    /// The transport configuration the QP's attributes describe.
    fn transport_config(&self, a: &QpAttr) -> tp::QpConfig {
        let mtu = if self.qp_type == QpType::Ud {
            self.pd.shared().device.active_mtu()
        } else {
            a.path_mtu
        };
        tp::QpConfig {
            qp_type: self.qp_type,
            qp_num: self.qp_num,
            dest_qp_num: a.dest_qp_num,
            path_mtu: mtu,
            sq_psn: a.sq_psn,
            rq_psn: a.rq_psn,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            qkey: a.qkey,
            access_flags: a.qp_access_flags,
            max_send_wr: self.cap.max_send_wr,
        }
    }
}

impl Qp {
    /// Changes the QP's attributes and state (`ibv_modify_qp`), reading only the fields of
    /// `attr` named by `attr_mask` ([`QpAttrMask`] bits). All or nothing: on failure nothing
    /// changes.
    ///
    /// Moving to ERR completes every queued work request with `WR_FLUSH_ERR` (and, for a QP
    /// on an SRQ, raises `IBV_EVENT_QP_LAST_WQE_REACHED`); moving to RESET discards them
    /// without completions and forgets the attributes. In SQD the send queue drains: the
    /// requests that have begun go on to complete, and none posted before or during SQD
    /// begins until the QP is back in RTS; RTS→SQD with `en_sqd_async_notify` raises
    /// `IBV_EVENT_SQ_DRAINED` once nothing begun is outstanding (at once when the queue is
    /// idle), and [`Qp::query_qp`]'s `sq_draining` says whether it is still draining.
    ///
    /// Fails with `EINVAL` for an invalid transition, a missing required or a forbidden
    /// attribute (the message names the transition and the bits), a `cur_qp_state` that is
    /// not the current state (RTS or SQD are accepted for a QP that moved to SQE unseen), or a value outside its range (port, P_Key index, address
    /// vector, RD atomic depths above the device's limits, 3- and 5-bit fields, access
    /// flags, a 24-bit QP number); `EOPNOTSUPP` for changing `cap`.
    pub fn modify_qp(&self, attr: &QpAttr, attr_mask: u32) -> Result<()> {
        let Some(mask) = QpAttrMask::from_bits(attr_mask) else {
            return Err(Error::invalid(format!(
                "unknown QP attribute mask bits {:#x}",
                attr_mask & !QpAttrMask::all().bits()
            )));
        };
        let inner = &self.inner;
        // Sends a UC/UD QP holds for a batch go before any change of state (a program that
        // moves its QP to ERR after posting expects them sent, not flushed).
        if matches!(inner.qp_type, QpType::Uc | QpType::Ud) {
            inner.release_held_ack();
        }
        let shared = inner.pd.shared();
        let dev = &shared.attr;
        let mut st = inner.lock();
        let cur = st.attr.qp_state;
        let next = check_modify_qp(inner.qp_type, cur, mask, attr.qp_state, attr.cur_qp_state)
            .map_err(|e| Error::invalid(e.to_string()))?;

        // Values.
        let bad = |msg: String| Err(Error::invalid(msg));
        if mask.contains(QpAttrMask::PORT) && attr.port_num != PORT_NUM {
            return bad(format!(
                "port {} does not exist (the only port is 1)",
                attr.port_num
            ));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return bad(format!(
                "P_Key index {} is outside the table of 1 entry",
                attr.pkey_index
            ));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) && attr.qp_access_flags & !QP_ACCESS_BITS != 0 {
            return bad(format!(
                "qp_access_flags {:#x} has bits other than LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC",
                attr.qp_access_flags
            ));
        }
        if mask.contains(QpAttrMask::AV) {
            attr.ah_attr.validate(&shared.device)?;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            attr.alt_ah_attr.validate(&shared.device)?;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            let port_max = shared.device.active_mtu();
            if attr.path_mtu.bytes() > port_max.bytes() {
                return bad(format!(
                    "path MTU {} exceeds the port's active MTU {}",
                    attr.path_mtu.bytes(),
                    port_max.bytes()
                ));
            }
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return bad(format!("timeout {} is wider than 5 bits", attr.timeout));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return bad(format!(
                "min_rnr_timer {} is wider than 5 bits",
                attr.min_rnr_timer
            ));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return bad(format!("retry_cnt {} is wider than 3 bits", attr.retry_cnt));
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return bad(format!("rnr_retry {} is wider than 3 bits", attr.rnr_retry));
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && u32::from(attr.max_rd_atomic) > dev.max_qp_init_rd_atom
        {
            return bad(format!(
                "max_rd_atomic {} exceeds the device's max_qp_init_rd_atom {}",
                attr.max_rd_atomic, dev.max_qp_init_rd_atom
            ));
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > dev.max_qp_rd_atom
        {
            return bad(format!(
                "max_dest_rd_atomic {} exceeds the device's max_qp_rd_atom {}",
                attr.max_dest_rd_atomic, dev.max_qp_rd_atom
            ));
        }
        if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num > 0xff_ffff {
            return bad(format!(
                "dest_qp_num {:#x} is wider than 24 bits",
                attr.dest_qp_num
            ));
        }
        if mask.contains(QpAttrMask::CAP) && attr.cap != inner.cap {
            return Err(Error::not_supported(
                "resizing a QP's queues is not supported",
            ));
        }

        // Apply, all at once.
        // The device engine starts when the first QP of the device can receive.
        let engine = if next == QpState::Rtr && st.engine.is_none() {
            Some(shared.engine_queue(inner.queue)?)
        } else {
            None
        };
        // An ACK held back for the program goes before the QP stops answering.
        let mut held_events = Vec::new();
        if matches!(next, QpState::Reset | QpState::Err) && next != cur {
            if let Some(e) = st.engine.clone() {
                held_events = send_held_ack(&*e, inner, &mut st).1;
            }
        }
        if next == QpState::Reset && cur != QpState::Reset {
            if let Some(e) = st.engine.take() {
                e.unregister(inner.qp_num);
            }
            st.transport = None;
            // (`unregister` dropped the engine's timer entry of the QP.)
            st.timer_at = None;
            st.ud_dests.clear();
            st.rq.clear();
            st.parked.clear();
            st.records.reset();
            if let Some(p) = st.pair_in.take() {
                p.close();
            }
            st.sqd_notify = false;
            st.attr = QpAttr {
                cap: inner.cap,
                ..Default::default()
            };
            return Ok(());
        }
        let a = &mut st.attr;
        if mask.contains(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            a.alt_ah_attr = attr.alt_ah_attr;
            a.alt_pkey_index = attr.alt_pkey_index;
            a.alt_port_num = attr.alt_port_num;
            a.alt_timeout = attr.alt_timeout;
        }
        if mask.contains(QpAttrMask::PATH_MIG_STATE) {
            a.path_mig_state = attr.path_mig_state;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xff_ffff;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xff_ffff;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if mask.contains(QpAttrMask::RATE_LIMIT) {
            a.rate_limit = attr.rate_limit;
        }
        a.qp_state = next;
        a.cur_qp_state = next;
        // SQD: the send queue drains (what began completes, nothing new begins) and, when
        // asked, SQ_DRAINED follows once it has (`QpState_::sq_drained`, checked here and
        // whenever the QP is driven or answered); back in RTS what was posted meanwhile
        // begins.
        let entering_sqd = next == QpState::Sqd && cur == QpState::Rts;
        let leaving_sqd = next == QpState::Rts && cur == QpState::Sqd;
        let notify_drained = entering_sqd && a.en_sqd_async_notify;
        let cfg = inner.transport_config(a);
        if let Some(e) = engine {
            let mut t = tp::Qp::new(cfg);
            // Two QPs of one host segment beyond the path MTU (both ends decide alike).
            let same_host = crate::provider::same_host_segment(
                matches!(
                    cfg.qp_type,
                    softrdma_proto::QpType::Rc | softrdma_proto::QpType::Uc
                ),
                a.ah_attr.grh.dgid.to_ip(),
                a.dest_qp_num,
            );
            t.set_segment(same_host);
            // And the lane to the peer's process is asked for now, not at the first packet.
            if same_host.is_some() {
                e.prepare_lane(a.ah_attr.grh.dgid.to_ip(), a.dest_qp_num);
            }
            st.transport = Some(t);
            e.register(inner.qp_num, Arc::downgrade(inner) as Weak<dyn QpPort>);
            st.engine = Some(e);
        } else if let Some(t) = st.transport.as_mut() {
            t.set_config(cfg);
        }
        if entering_sqd || leaving_sqd {
            if let Some(t) = st.transport.as_mut() {
                t.set_draining(entering_sqd);
            }
        }
        if entering_sqd {
            st.sqd_notify = notify_drained;
        } else if next != QpState::Sqd {
            st.sqd_notify = false;
        }
        if next == QpState::Err && cur != QpState::Err {
            inner.flush(&mut st);
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
            if inner.srq.is_some() {
                inner.raise(EventType::QpLastWqeReached);
            }
        } else if entering_sqd && st.sq_drained() {
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
            inner.raise(EventType::SqDrained);
        } else if leaving_sqd {
            // What was posted while draining begins now.
            let events = match st.engine.clone() {
                Some(e) => drive_and_send(&*e, inner, &mut st),
                None => Vec::new(),
            };
            drop(st);
            for e in held_events.into_iter().chain(events) {
                inner.raise(e);
            }
        } else {
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
        }
        Ok(())
    }
}
