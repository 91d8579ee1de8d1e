//! Queue pairs (`ibv_create_qp`, `ibv_query_qp`, `ibv_destroy_qp`): the QP object, its
//! creation, accessors, query and destruction.
//!
//! The rest of the QP verbs are in the files below, in layers: `attr.rs` (the attribute
//! structs) sits under this object; `modify.rs` (`ibv_modify_qp`), `send.rs`
//! (`ibv_post_send`, `ibv_bind_mw`), `recv.rs` (`ibv_post_recv`) and `mcast.rs`
//! (`ibv_attach_mcast`, `ibv_detach_mcast`) sit above the QP's data path
//! (`verbs/datapath.rs`), which they drive and which sits above this object. This file
//! reaches the data path only through the provider's [`QpPort`], as the engine does.

mod attr;
mod mcast;
mod modify;
pub(crate) mod parked;
pub(crate) mod records;
mod recv;
mod send;

pub use attr::{MigState, QpAttr, QpCap, QpInitAttr, QpInitInfo};

use crate::error::{DestroyError, Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::provider::{Provider, QpPort};
use crate::verbs::ah::AhInner;
use crate::verbs::cq::{CqInner, WcOpcode, WcStatus, WorkCompletion};
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::hold::Hold;
use crate::verbs::mr::MrCache;
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::requests::RecvWqe;
use crate::verbs::resources::{CountGuard, Kind, Resources};
use crate::verbs::srq::SrqInner;
use softrdma_proto::transport as tp;
use softrdma_proto::{QpState, QpType};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A queue pair (`struct ibv_qp`).
///
/// Dropping the handle destroys the QP: queued work requests are discarded without
/// completions, as `ibv_destroy_qp` does.
pub struct Qp {
    pub(crate) inner: Arc<QpInner>,
}

pub(crate) struct QpState_ {
    pub(crate) attr: QpAttr,
    /// The transport, from RTR on (the send queue lives in it).
    pub(crate) transport: Option<tp::Qp>,
    /// The device engine, once the QP has reached RTR.
    pub(crate) engine: Option<Arc<dyn Provider>>,
    pub(crate) rq: VecDeque<RecvWqe>,
    /// Address handles of UD sends not yet transmitted, by the handle given to the transport.
    pub(crate) ud_dests: HashMap<u64, Arc<AhInner>>,
    pub(crate) next_ud_dest: u64,
    pub(crate) mcast: Vec<Gid>,
    /// The last memory regions the data path used.
    pub(crate) mrs: MrCache,
    /// The deadline the engine holds for this QP's timers: what `drive` last gave
    /// `set_timer`, `None` after RESET (which unregisters the QP and so drops its entry). The
    /// engine otherwise drops the entry only once the QP is gone.
    pub(crate) timer_at: Option<std::time::Instant>,
    /// Packets of a UC or UD QP kept while its receive queue was empty.
    pub(crate) parked: parked::Parked,
    /// Short RC requests to and from a QP of this host as work-request records.
    pub(crate) records: records::Records,
    /// The ring of its own through which the connected QP sends this one its records (see
    /// `provider::lanes::pair`), read by this QP's CQs.
    pub(crate) pair_in: Option<Arc<crate::provider::PairRx>>,
    /// The QP went to SQD with `en_sqd_async_notify`: `IBV_EVENT_SQ_DRAINED` is raised once
    /// its send queue has drained ([`QpState_::sq_drained`]).
    pub(crate) sqd_notify: bool,
    /// The packets the transport had sent when its last completion was taken (see `drive`:
    /// a program that sends one WRITE and waits for it, against a stream).
    pub(crate) tx_at_completion: u64,
}

impl QpState_ {
    /// Whether nothing the send queue began is outstanding: no request of the transport's
    /// begun and not completed, no work-request record unanswered (true without a
    /// transport).
    pub(crate) fn sq_idle(&self) -> bool {
        self.records.sent.is_empty() && self.transport.as_ref().is_none_or(|t| t.is_drained())
    }

    /// Whether the send queue of a QP in SQD has just drained and `IBV_EVENT_SQ_DRAINED` is
    /// owed: true once (then `sqd_notify` is off), when it was asked for.
    #[inline]
    pub(crate) fn sq_drained(&mut self) -> bool {
        if self.sqd_notify && self.attr.qp_state == QpState::Sqd && self.sq_idle() {
            self.sqd_notify = false;
            return true;
        }
        false
    }
}

pub(crate) struct QpInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) send_cq: Hold<CqInner>,
    pub(crate) recv_cq: Hold<CqInner>,
    pub(crate) srq: Option<Hold<SrqInner>>,
    pub(crate) qp_num: u32,
    /// The device's receive queue the QP is on (the one whose slot its number carries; see
    /// [`crate::Context::set_receive_queues`]).
    pub(crate) queue: u8,
    /// Never reused: names the QP a type 2 memory window is bound to.
    pub(crate) uid: u64,
    pub(crate) qp_type: QpType,
    pub(crate) qp_context: u64,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: QpCap,
    pub(crate) state: Mutex<QpState_>,
    async_unacked: AtomicUsize,
    _count: CountGuard,
}

impl EventTarget for QpInner {
    fn unacked_events(&self) -> &AtomicUsize {
        &self.async_unacked
    }
}

impl Drop for Qp {
    /// A QP dropped without [`Qp::destroy`] first sends the ACK it may hold back for the
    /// program (see the engine's notes): the peer's SEND was delivered and must complete.
    fn drop(&mut self) {
        QpPort::release_held_ack(self.inner.clone());
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let res = &self.pd.shared().resources;
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        // What the QP's transport counted, for programs that cannot read them (a C program on
        // the drop-in libraries): see crate::log::COUNTERS_TARGET.
        if let Some(t) = st.transport.as_ref() {
            tracing::debug!(
                target: crate::log::COUNTERS_TARGET,
                qp_num = self.qp_num,
                counters = ?t.stats(),
                "QP freed"
            );
        }
        if let Some(e) = st.engine.take() {
            e.unregister(self.qp_num);
        }
        let engine = if st.mcast.is_empty() {
            None
        } else {
            self.pd.shared().engine_if_started()
        };
        for gid in st.mcast.drain(..) {
            res.mcast_detach(gid, self.qp_num);
            if let Some(e) = &engine {
                e.mcast_leave(&gid, self.qp_num);
            }
        }
        res.free_qpn(self.qp_num);
    }
}

static NEXT_QP_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn round_wr(req: u32, max: u32) -> u32 {
    req.max(1).next_power_of_two().min(max)
}

impl Pd {
    /// Creates a queue pair (`ibv_create_qp`) in RESET, writing the actual capabilities
    /// (at least those requested) back into `init_attr.cap`.
    ///
    /// Fails with `EOPNOTSUPP` for RAW_PACKET and XRC QPs; `EINVAL` for an SRQ on a QP that
    /// is not RC or UD, CQs or an SRQ of another device or PD, or a capability above the
    /// device's limits (`max_qp_wr`, `max_sge`, inline data); `ENOMEM` past `max_qp`.
    /// With an SRQ, `max_recv_wr` and `max_recv_sge` are ignored (and written back as 0).
    pub fn create_qp(&self, init_attr: &mut QpInitAttr<'_>) -> Result<Qp> {
        let shared = self.inner.shared().clone();
        let dev = &shared.attr;
        match init_attr.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            other => {
                return Err(Error::not_supported(format!(
                    "QP type {other:?} is not supported by the software device"
                )))
            }
        }
        if let Some(srq) = init_attr.srq {
            if !matches!(init_attr.qp_type, QpType::Rc | QpType::Ud) {
                return Err(Error::invalid(format!(
                    "an SRQ can only be used by RC and UD QPs, not {:?}",
                    init_attr.qp_type
                )));
            }
            if !Arc::ptr_eq(srq.inner.pd.arc(), &self.inner) {
                return Err(Error::invalid("the SRQ belongs to another PD"));
            }
        }
        for cq in [init_attr.send_cq, init_attr.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.ctx.shared, &shared) {
                return Err(Error::invalid("the CQ belongs to another device"));
            }
        }
        let c = init_attr.cap;
        let has_srq = init_attr.srq.is_some();
        let check = |what: &str, v: u32, max: u32| -> Result<()> {
            if v > max {
                Err(Error::invalid(format!(
                    "{what} {v} exceeds the device limit {max}"
                )))
            } else {
                Ok(())
            }
        };
        check("max_send_wr", c.max_send_wr, dev.max_qp_wr)?;
        check("max_send_sge", c.max_send_sge, dev.max_sge)?;
        check("max_inline_data", c.max_inline_data, dev.max_inline_data)?;
        if !has_srq {
            check("max_recv_wr", c.max_recv_wr, dev.max_qp_wr)?;
            check("max_recv_sge", c.max_recv_sge, dev.max_sge)?;
        }
        let cap = QpCap {
            max_send_wr: round_wr(c.max_send_wr, dev.max_qp_wr),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_wr: if has_srq {
                0
            } else {
                round_wr(c.max_recv_wr, dev.max_qp_wr)
            },
            max_recv_sge: if has_srq { 0 } else { c.max_recv_sge.max(1) },
            // In 64-byte steps, and at least one step even when none is asked for: a send
            // queue entry has room for that much, as on rxe and mlx5 (whose programs, e.g.
            // rdma_xclient, post 16-byte IBV_SEND_INLINE sends on QPs made with 0).
            max_inline_data: c
                .max_inline_data
                .max(1)
                .div_ceil(64)
                .saturating_mul(64)
                .min(dev.max_inline_data),
        };
        let count = Resources::acquire(&shared, Kind::Qp)?;
        let mut queue = shared.pick_queue(init_attr.qp_type);
        let engine = match shared.engine_queue(queue) {
            Ok(e) => e,
            // A further queue that cannot start (the upper half of the device's slots taken
            // by other processes' queues, say) leaves the QP, and later ones, on queue 0.
            Err(err) if queue != 0 => {
                tracing::debug!(queue, error = %err, "receive queue not started; QP on queue 0");
                shared.queue_failed(queue);
                queue = 0;
                shared.engine()?
            }
            Err(err) => return Err(err),
        };
        let qp_num = shared.resources.alloc_qpn(engine.slot())?;
        // A program polling these CQs drives this queue (with those of the CQs' other QPs).
        for cq in [init_attr.send_cq, init_attr.recv_cq] {
            cq.inner.add_engine(&engine);
        }
        init_attr.cap = cap;
        let attr = QpAttr {
            cap,
            ..Default::default()
        };
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: Hold::new(&self.inner),
                send_cq: Hold::new(&init_attr.send_cq.inner),
                recv_cq: Hold::new(&init_attr.recv_cq.inner),
                srq: init_attr.srq.map(|s| Hold::new(&s.inner)),
                qp_num,
                queue,
                uid: NEXT_QP_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                qp_type: init_attr.qp_type,
                qp_context: init_attr.qp_context,
                sq_sig_all: init_attr.sq_sig_all,
                cap,
                state: Mutex::new(QpState_ {
                    attr,
                    transport: None,
                    engine: None,
                    rq: VecDeque::new(),
                    ud_dests: HashMap::new(),
                    next_ud_dest: 1,
                    mcast: Vec::new(),
                    mrs: Default::default(),
                    timer_at: None,
                    parked: Default::default(),
                    records: Default::default(),
                    pair_in: None,
                    sqd_notify: false,
                    tx_at_completion: 0,
                }),
                async_unacked: AtomicUsize::new(0),
                _count: count,
            }),
        })
    }
}

impl QpInner {
    /// Takes what waits for this QP on its receive queue of the device when that is not
    /// queue 0 (see `Provider::drain_receive`): the connection manager calls it before a
    /// disconnection moves the QP to ERR.
    pub(crate) fn drain_own_queue(&self) {
        if self.queue == 0 {
            return;
        }
        let engine = self.lock().engine.clone();
        if let Some(e) = engine {
            e.drain_receive();
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QpState_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flush_wc(&self, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode,
            qp_num: self.qp_num,
            ..Default::default()
        }
    }

    pub(crate) fn raise(self: &Arc<Self>, ev: EventType) {
        self.pd.ctx.async_events.raise(
            ev,
            AsyncElement::Qp {
                qp_num: self.qp_num,
                qp_context: self.qp_context,
            },
            Some(self.clone() as Arc<dyn EventTarget>),
        );
    }
}

impl Qp {
    /// The QP number (`qp->qp_num`): 24 bits, unpredictable, unique on the device.
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num
    }

    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The current state (`qp->state`).
    pub fn state(&self) -> QpState {
        self.inner.lock().attr.qp_state
    }

    /// The `qp_context` given at creation.
    pub fn qp_context(&self) -> u64 {
        self.inner.qp_context
    }

    /// The actual capabilities.
    pub fn cap(&self) -> QpCap {
        self.inner.cap
    }

    /// The QP's current attributes and creation attributes (`ibv_query_qp`). The mask of
    /// verbs is only a hint, so every field is filled; values never set read as their
    /// defaults.
    pub fn query_qp(&self) -> Result<(QpAttr, QpInitInfo)> {
        let st = self.inner.lock();
        let i = &self.inner;
        let mut attr = st.attr;
        attr.sq_draining = attr.qp_state == QpState::Sqd && !st.sq_idle();
        Ok((
            attr,
            QpInitInfo {
                qp_context: i.qp_context,
                cap: i.cap,
                qp_type: i.qp_type,
                sq_sig_all: i.sq_sig_all,
                has_srq: i.srq.is_some(),
            },
        ))
    }

    /// The QP's transport counters: packets and bytes each way, retransmitted packets and
    /// go-back-N retries, retransmit timeouts, ACKs, NAKs by kind (PSN sequence, RNR, and
    /// the error NAKs: invalid request, remote access, remote operational), duplicate
    /// requests, READ/atomic replays, out-of-sequence and malformed packets, Q_Key
    /// violations and drops for want of a receive request. See [`crate::QpCounters`] for each.
    ///
    /// They count from the QP's move to RTR (all zero before) and only grow, through ERR
    /// too; a move to RESET starts them again from zero. Packets the device drops before
    /// they reach a QP (bad ICRC, unknown QP, wrong source) are in
    /// [`crate::Context::counters`] instead.
    ///
    /// ```
    /// # use softrdma::*;
    /// // A loopback device address of this run's own (see `softrdma::testing`).
    /// let addr = softrdma::testing::unique_loopback_addr().into();
    /// let ctx = Device::from_addr(addr).unwrap().open().unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let cq = ctx.create_cq(4, 0, None, 0).unwrap();
    /// let qp = pd
    ///     .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, QpCap::default()))
    ///     .unwrap();
    /// assert_eq!(qp.counters(), QpCounters::default());
    /// ```
    pub fn counters(&self) -> crate::QpCounters {
        self.inner
            .lock()
            .transport
            .as_ref()
            .map(|t| *t.stats())
            .unwrap_or_default()
    }

    /// Destroys the QP (`ibv_destroy_qp`); queued work requests are discarded without
    /// completions, and the completions of its receive queue still in its CQs (successful
    /// or flushed) are removed with it. Completions of its sends stay to be polled, and so
    /// do those of receives it took from an SRQ.
    ///
    /// Fails with `EBUSY`, giving the QP back, while it is attached to a multicast group or
    /// an asynchronous event about it is not acknowledged.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<Qp>> {
        let groups = self.inner.lock().mcast.len();
        let events = self.inner.async_unacked.load(Ordering::Acquire);
        let why = if groups != 0 {
            format!("the QP is attached to {groups} multicast group(s)")
        } else if events != 0 {
            format!("{events} asynchronous event(s) about the QP are not acknowledged")
        } else {
            self.inner
                .pd
                .ctx
                .async_events
                .discard(&self.inner.async_unacked);
            // As ibv_destroy_qp returns only once the device is done with the QP: take it off
            // the engine, then wait for the engine thread to let go of a reference it may be
            // using right now (packet or timer processing; never long), so that the QP's
            // hold on its CQs, SRQ and PD is gone when this returns and they can be destroyed.
            // An ACK held back for the program goes first.
            QpPort::release_held_ack(self.inner.clone());
            let (engine, pair_in) = {
                let mut st = self.inner.lock();
                (st.engine.take(), st.pair_in.take())
            };
            if let Some(e) = engine {
                e.unregister(self.inner.qp_num);
            }
            // (Its peer's records go back to the lane, where a QP that is gone refuses them.)
            if let Some(p) = pair_in {
                p.close();
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while Arc::strong_count(&self.inner) > 1 && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            // Nothing completes for the QP any more. The completions of its receive queue
            // that nobody polled leave its CQs with it (the queue and its buffers are gone;
            // a hardware provider cleans its CQs alike): libfabric 1.17's rxm polls its CQ
            // right after it closes an endpoint and would repost a receive buffer it found
            // there into the closed one. Completions of its sends stay, for the program to
            // learn what of them completed (rxm hands them on); so do receives taken from an
            // SRQ, whose buffers are the SRQ owner's.
            if self.inner.srq.is_none() {
                let qpn = self.inner.qp_num;
                self.inner.send_cq.arc().purge_recvs(qpn);
                if !Arc::ptr_eq(self.inner.send_cq.arc(), self.inner.recv_cq.arc()) {
                    self.inner.recv_cq.arc().purge_recvs(qpn);
                }
            }
            return Ok(());
        };
        Err(DestroyError {
            object: self,
            error: Error::new(ErrorKind::Busy, why),
        })
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &format_args!("{:#08x}", self.inner.qp_num))
            .field("qp_type", &self.inner.qp_type)
            .field("state", &self.state())
            .finish()
    }
}
