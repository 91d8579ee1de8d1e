//! Completion queues, completion channels and work completions (`ibv_create_cq`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_create_comp_channel`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`).

use crate::error::{DestroyError, Error, ErrorKind, Result};
use crate::provider::fd::EventFd;
use crate::verbs::context::{Context, ContextInner};
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::hold::{users_of, Counted, Hold};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use softrdma_proto::transport::{WcOpcode, WcStatus};

bitflags::bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of a UD receive buffer hold the GRH.
        const GRH = 1 << 0;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`.
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// A work completion (`struct ibv_wc`).
///
/// When `status` is not [`WcStatus::Success`], only `wr_id`, `status`, `qp_num` and
/// `vendor_err` are meaningful, as in verbs. A completion is the only news of a failed
/// operation, so it is `#[must_use]`: check `status`, or turn a failure into an [`Error`]
/// with [`WorkCompletion::ok`] (which gives the completion back on success) or
/// [`WorkCompletion::check`].
///
/// ```
/// use softrdma::{ErrorKind, WcStatus, WorkCompletion};
/// let wc = WorkCompletion { wr_id: 7, status: WcStatus::RnrRetryExcErr, ..Default::default() };
/// let e = wc.ok().unwrap_err();
/// assert_eq!(e.wc_status(), Some(WcStatus::RnrRetryExcErr));
/// assert_eq!(e.kind(), ErrorKind::Completion(WcStatus::RnrRetryExcErr));
/// assert_eq!(e.errno(), libc::EIO);
/// let fine = WorkCompletion { wr_id: 8, ..Default::default() };
/// assert_eq!(fine.ok().unwrap().wr_id, 8);
/// assert!(fine.check().is_ok() && wc.check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use = "a work completion may report a failed operation: check `status` or call `ok()`"]
pub struct WorkCompletion {
    /// The `wr_id` of the work request that completed.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// A device-specific detail of an error (0 on success).
    pub vendor_err: u32,
    /// Bytes transferred: received (UD: including the 40-byte GRH area), read, or written.
    pub byte_len: u32,
    /// The immediate data, when `wc_flags` has WITH_IMM, as the value the sender put in its
    /// work request (not byte-swapped: softrdma's work requests carry host-order values).
    pub imm_data: u32,
    /// The rkey invalidated, when `wc_flags` has WITH_INV.
    pub invalidated_rkey: u32,
    /// The local QP the request belonged to.
    pub qp_num: u32,
    /// UD receives: the sender's QP number.
    pub src_qp: u32,
    /// Which optional fields are valid.
    pub wc_flags: WcFlags,
    /// Index of the P_Key the packet carried (always 0).
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// The completion itself when its status is [`WcStatus::Success`]; otherwise an
    /// [`Error`] of kind [`ErrorKind::Completion`] carrying the status (errno `EIO`), whose
    /// message names the status (as `ibv_wc_status_str` does), the opcode and the `wr_id`.
    pub fn ok(self) -> Result<WorkCompletion> {
        if self.status == WcStatus::Success {
            return Ok(self);
        }
        Err(Error::new(
            ErrorKind::Completion(self.status),
            format!(
                "work request {:#x} ({:?}) completed with status {} (vendor_err {:#x})",
                self.wr_id,
                self.opcode,
                self.status.as_str(),
                self.vendor_err
            ),
        ))
    }

    /// `Ok(())` when the status is [`WcStatus::Success`], else the error of
    /// [`WorkCompletion::ok`]: for completions whose fields are not needed
    /// (`id.get_send_comp()?.check()?`).
    pub fn check(self) -> Result<()> {
        self.ok().map(drop)
    }

    /// Whether the status is [`WcStatus::Success`].
    pub fn is_success(&self) -> bool {
        self.status == WcStatus::Success
    }
}

/// A completion channel (`struct ibv_comp_channel`): a real file descriptor that becomes
/// readable when a CQ attached to it has a completion event. Poll it with poll/epoll/tokio;
/// set `O_NONBLOCK` on it to make [`CompChannel::get_cq_event`] fail with `EAGAIN`
/// instead of blocking.
pub struct CompChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

pub(crate) struct ChannelInner {
    ctx: Arc<ContextInner>,
    fd: EventFd,
    queue: Mutex<VecDeque<Arc<CqInner>>>,
    users: AtomicUsize,
}

impl Counted for ChannelInner {
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

impl ChannelInner {
    fn post(&self, cq: Arc<CqInner>) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(cq);
        self.fd.signal();
    }
}

impl Context {
    /// Creates a completion channel (`ibv_create_comp_channel`).
    ///
    /// Fails with the errno of `eventfd` (`EMFILE`, `ENFILE`, `ENOMEM`).
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                ctx: self.inner.clone(),
                fd: EventFd::new()?,
                queue: Mutex::new(VecDeque::new()),
                users: AtomicUsize::new(0),
            }),
        })
    }
}

/// A completion event (from `ibv_get_cq_event`): which CQ has completions.
///
/// Acknowledge it with [`Cq::ack_cq_events`] on that CQ (events may be acknowledged in
/// batches); a CQ with unacknowledged events cannot be destroyed.
#[derive(Clone)]
pub struct CqEvent {
    cq: Arc<CqInner>,
}

impl CqEvent {
    /// The `cq_context` the CQ was created with.
    pub fn cq_context(&self) -> u64 {
        self.cq.cq_context
    }

    /// Whether the event is about `cq`.
    pub fn is_for(&self, cq: &Cq) -> bool {
        Arc::ptr_eq(&self.cq, &cq.inner)
    }
}

impl std::fmt::Debug for CqEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqEvent")
            .field("cq_context", &self.cq.cq_context)
            .finish()
    }
}

impl CompChannel {
    /// The channel's file descriptor (`channel->fd`).
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Sets or clears `O_NONBLOCK` on [`CompChannel::fd`] (the same as `fcntl`).
    ///
    /// Fails with the errno of `fcntl`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.inner.fd.set_nonblocking(nonblocking)
    }

    /// Takes the next completion event (`ibv_get_cq_event`): blocks until a CQ attached to
    /// this channel, armed with [`Cq::req_notify_cq`], gets a completion; fails with `EAGAIN`
    /// when the descriptor is non-blocking and no event is waiting.
    ///
    /// While it waits, the calling thread receives what arrives for this process's devices
    /// (their sockets and same-host lanes) itself, beside their progress threads, so that the
    /// completion it waits for wakes it once, not after a wake-up of the progress thread
    /// (`ib_send_lat -e` 1.5x faster on 2 cores); `SOFTRDMA_WAIT_RECEIVES=0` leaves receiving
    /// to the progress threads. A program that polls [`CompChannel::fd`] itself is served by
    /// the progress threads as before.
    pub fn get_cq_event(&self) -> Result<CqEvent> {
        self.take_event(|| crate::provider::wait_receiving(&self.inner.fd, None))
    }

    /// Takes the next completion event as [`CompChannel::get_cq_event`] does, waiting
    /// `timeout` at most (whatever the descriptor's `O_NONBLOCK`; a zero timeout only looks).
    ///
    /// Fails with `ETIMEDOUT` when no event came in time; nothing is lost: an event that
    /// arrives later is there for the next call.
    ///
    /// ```
    /// # let ctx = softrdma::Device::from_addr(softrdma::testing::unique_loopback_addr().into()).unwrap().open().unwrap();
    /// use std::time::Duration;
    /// let ch = ctx.create_comp_channel().unwrap();
    /// let e = ch.get_cq_event_timeout(Duration::from_millis(1)).unwrap_err();
    /// assert_eq!(e.errno(), libc::ETIMEDOUT);
    /// ```
    pub fn get_cq_event_timeout(&self, timeout: std::time::Duration) -> Result<CqEvent> {
        let deadline = std::time::Instant::now() + timeout;
        self.take_event(|| crate::provider::wait_receiving(&self.inner.fd, Some(deadline)))
    }

    fn take_event(&self, wait: impl Fn() -> Result<()>) -> Result<CqEvent> {
        // About to wait: what the devices hold back (a held ACK, sends held for a batch) goes
        // first.
        crate::provider::release_held_acks();
        loop {
            wait()?;
            let cq = self
                .inner
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            if let Some(cq) = cq {
                cq.events_reported.fetch_add(1, Ordering::AcqRel);
                return Ok(CqEvent { cq });
            }
        }
    }

    /// How many CQs use the channel (made with it and not destroyed yet): while any do,
    /// [`CompChannel::destroy`] fails with `EBUSY`.
    pub fn cqs(&self) -> usize {
        users_of(&*self.inner)
    }

    /// Destroys the channel (`ibv_destroy_comp_channel`).
    ///
    /// Fails with `EBUSY`, giving the channel back, while a CQ uses it.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<CompChannel>> {
        let n = users_of(&*self.inner);
        if n != 0 {
            return Err(DestroyError {
                object: self,
                error: Error::busy(format!("the completion channel is used by {n} CQ(s)")),
            });
        }
        Ok(())
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// The QP pair rings a CQ looks at, each with the engine that carries its records out.
type PairList = Vec<(
    Arc<dyn crate::provider::Provider>,
    Arc<crate::provider::PairRx>,
    std::sync::Weak<dyn crate::provider::QpPort>,
)>;

/// A completion queue (`struct ibv_cq`).
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    No,
    Any,
    Solicited,
}

struct CqState {
    entries: VecDeque<WorkCompletion>,
    armed: Armed,
    overrun: bool,
}

impl CqState {
    /// What [`CqInner::quick`] mirrors: the completions waiting, one more once overrun.
    fn quick(&self) -> usize {
        self.entries.len() + usize::from(self.overrun)
    }
}

pub(crate) struct CqInner {
    pub(crate) ctx: Arc<ContextInner>,
    channel: Option<Hold<ChannelInner>>,
    cqe: u32,
    cq_context: u64,
    comp_vector: u32,
    state: Mutex<CqState>,
    /// A copy of `state`'s [`CqState::quick`], stored under its lock after each change, so
    /// that a poll of an empty CQ (most polls of a program that busy-polls) returns without
    /// the lock (0: nothing waits, not overrun).
    quick: AtomicUsize,
    /// Whether the CQ is armed for an event (a copy of `state.armed != No`, as `quick`).
    armed: std::sync::atomic::AtomicBool,
    /// Calls of `poll` so far (wrapping; an increment racing another poll's may be lost,
    /// which is all right: it tells whether a program is polling the CQ at all, for
    /// [`CqInner::recvs_unpolled`]).
    polls: AtomicU64,
    /// QPs that use the CQ.
    users: AtomicUsize,
    events_reported: AtomicU64,
    events_acked: AtomicU64,
    async_unacked: AtomicUsize,
    /// The device engine that `poll` drives, once known: the receive queue of the first QP
    /// that uses the CQ (the device's queue 0 when the CQ is polled before any).
    engine: std::sync::OnceLock<Arc<dyn crate::provider::Provider>>,
    /// The receive queues of later QPs on other queues than `engine`'s, which `poll` drives
    /// too (a CQ shared by QPs of several queues gets every queue's completions without a
    /// thread hop); `has_more` says whether there are any, so that the common CQ of one queue
    /// takes no lock for them.
    more_engines: Mutex<Vec<Arc<dyn crate::provider::Provider>>>,
    has_more: std::sync::atomic::AtomicBool,
    /// Run once by the next poll that takes completions ([`CqInner::on_next_take`]);
    /// `has_wakers` says whether there are any, so that a poll takes no lock for them.
    wakers: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    has_wakers: std::sync::atomic::AtomicBool,
    /// The rings of their own through which the peers of QPs that use the CQ send them
    /// work-request records (see `provider::lanes::pair`), with the engines that carry them
    /// out: `poll` looks at them first (one load each when empty). `has_pairs` says whether
    /// there are any, so that a CQ without takes no lock for them.
    pairs: Mutex<PairList>,
    has_pairs: std::sync::atomic::AtomicBool,
    /// Polls that found records in the pair rings (wrapping; plain loads and stores: see
    /// `Cq::poll`).
    pair_hits: std::sync::atomic::AtomicU32,
    _count: CountGuard,
}

impl Counted for CqInner {
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

impl EventTarget for CqInner {
    fn unacked_events(&self) -> &AtomicUsize {
        &self.async_unacked
    }
}

impl Context {
    /// Creates a completion queue with room for at least `cqe` completions
    /// (`ibv_create_cq`); the actual size is [`Cq::cqe`]. With a `channel`, completion events
    /// of the CQ go to that channel once armed with [`Cq::req_notify_cq`].
    ///
    /// Fails with `EINVAL` when `cqe` is 0 or above the device's `max_cqe`, when
    /// `comp_vector` is not below [`Context::num_comp_vectors`], or when the channel belongs
    /// to another context; `ENOMEM` past `max_cq`.
    pub fn create_cq(
        &self,
        cqe: u32,
        cq_context: u64,
        channel: Option<&CompChannel>,
        comp_vector: u32,
    ) -> Result<Cq> {
        let max = self.inner.shared.attr.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::invalid(format!(
                "cqe {cqe} is outside 1..={max} (the device's max_cqe)"
            )));
        }
        if comp_vector >= self.num_comp_vectors() {
            return Err(Error::invalid(format!(
                "comp_vector {comp_vector} is not below num_comp_vectors {}",
                self.num_comp_vectors()
            )));
        }
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.inner.ctx, &self.inner) {
                return Err(Error::invalid(
                    "the completion channel belongs to another context",
                ));
            }
        }
        // Round up to 2^k - 1 entries (at least what was asked, at most max_cqe).
        let actual = ((u64::from(cqe) + 1).next_power_of_two() - 1).min(u64::from(max)) as u32;
        let count = Resources::acquire(&self.inner.shared, Kind::Cq)?;
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: self.inner.clone(),
                channel: channel.map(|c| Hold::new(&c.inner)),
                cqe: actual,
                cq_context,
                comp_vector,
                state: Mutex::new(CqState {
                    // Room grows with use up to `actual` (a CQ sized for a large
                    // universe of peers, say 4M entries, costs nothing until it fills).
                    entries: VecDeque::with_capacity((actual as usize).min(INITIAL_ROOM)),
                    armed: Armed::No,
                    overrun: false,
                }),
                quick: AtomicUsize::new(0),
                armed: std::sync::atomic::AtomicBool::new(false),
                polls: AtomicU64::new(0),
                users: AtomicUsize::new(0),
                events_reported: AtomicU64::new(0),
                events_acked: AtomicU64::new(0),
                async_unacked: AtomicUsize::new(0),
                engine: std::sync::OnceLock::new(),
                more_engines: Mutex::new(Vec::new()),
                has_more: std::sync::atomic::AtomicBool::new(false),
                wakers: Mutex::new(Vec::new()),
                has_wakers: std::sync::atomic::AtomicBool::new(false),
                pairs: Mutex::new(Vec::new()),
                has_pairs: std::sync::atomic::AtomicBool::new(false),
                pair_hits: std::sync::atomic::AtomicU32::new(0),
                _count: count,
            }),
        })
    }
}

/// Completions a new CQ has room for before its queue first grows (at most its `cqe`).
const INITIAL_ROOM: usize = 4096;

impl CqInner {
    /// Records that a QP using this CQ receives on the device engine (receive queue) `e`, so
    /// that polling the CQ drives it.
    pub(crate) fn add_engine(&self, e: &Arc<dyn crate::provider::Provider>) {
        let same = |a: &Arc<dyn crate::provider::Provider>| {
            std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(e))
        };
        if same(self.engine.get_or_init(|| e.clone())) {
            return;
        }
        let mut more = self.more_engines.lock().unwrap_or_else(|p| p.into_inner());
        if !more.iter().any(same) {
            more.push(e.clone());
            self.has_more.store(true, Ordering::Release);
        }
    }

    /// Lists the QP pair ring `p` of the QP `qp`, carried out by `engine`, for `poll` to look
    /// at (rings closed since are dropped from the list here and at polls).
    pub(crate) fn add_pair(
        &self,
        engine: &Arc<dyn crate::provider::Provider>,
        p: &Arc<crate::provider::PairRx>,
        qp: std::sync::Weak<dyn crate::provider::QpPort>,
    ) {
        let mut v = self.pairs.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|(_, q, _)| !q.is_closed());
        v.push((engine.clone(), p.clone(), qp));
        self.has_pairs.store(true, Ordering::Release);
    }

    /// Adds a completion, signalling the channel if the CQ is armed for it. Returns `false`
    /// (and raises `IBV_EVENT_CQ_ERR`, leaving the CQ in error) when the CQ is full.
    pub(crate) fn push(self: &Arc<Self>, wc: WorkCompletion, solicited: bool) -> bool {
        let notify = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.overrun {
                return false;
            }
            if st.entries.len() >= self.cqe as usize {
                st.overrun = true;
                self.quick.store(st.quick(), Ordering::Release);
                drop(st);
                self.ctx.async_events.raise(
                    EventType::CqErr,
                    AsyncElement::Cq {
                        cq_context: self.cq_context,
                    },
                    Some(self.clone() as Arc<dyn EventTarget>),
                );
                return false;
            }
            st.entries.push_back(wc);
            let fire = match st.armed {
                Armed::No => false,
                Armed::Any => true,
                Armed::Solicited => solicited || wc.status != WcStatus::Success,
            };
            if fire {
                st.armed = Armed::No;
                self.armed.store(false, Ordering::Relaxed);
            }
            self.quick.store(st.quick(), Ordering::Release);
            fire
        };
        if notify {
            if let Some(ch) = &self.channel {
                ch.post(self.clone());
            }
        }
        true
    }
}

impl CqInner {
    /// Takes the receive completions (successful or flushed) of the destroyed QP `qp_num`
    /// out of the CQ (see [`crate::Qp::destroy`]); its send completions stay. Never fails;
    /// a CQ that overran stays in error.
    pub(crate) fn purge_recvs(&self, qp_num: u32) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.entries.retain(|wc| !is_recv_of(wc, qp_num));
        self.quick.store(st.quick(), Ordering::Release);
    }

    /// Whether the CQ holds a receive completion of QP `qp_num` that is not a flush (a
    /// message the program has not seen yet), and how many times the CQ has been polled so
    /// far (see `Cq::poll`; it wraps). Never fails.
    pub(crate) fn recvs_unpolled(&self, qp_num: u32) -> (bool, u64) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let held = st
            .entries
            .iter()
            .any(|wc| is_recv_of(wc, qp_num) && wc.status != WcStatus::WrFlushErr);
        (held, self.polls.load(Ordering::Relaxed))
    }

    /// Runs `f` once, on the thread of the next poll of the CQ that takes completions (after
    /// it has taken them): how a held CM event learns that its QP's messages may have been
    /// taken. Never fails; `f` is dropped unrun with the CQ.
    pub(crate) fn on_next_take(&self, f: Box<dyn FnOnce() + Send>) {
        let mut w = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        w.push(f);
        self.has_wakers.store(true, Ordering::Release);
    }

    /// Runs (and forgets) the functions given to [`CqInner::on_next_take`].
    fn run_wakers(&self) {
        let taken = {
            let mut w = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
            self.has_wakers.store(false, Ordering::Release);
            std::mem::take(&mut *w)
        };
        for f in taken {
            f();
        }
    }
}

/// Whether `wc` is a receive completion (successful or not) of QP `qp_num`.
fn is_recv_of(wc: &WorkCompletion, qp_num: u32) -> bool {
    wc.qp_num == qp_num && matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

impl Cq {
    /// The number of completions the CQ holds (`cq->cqe`), at least what was asked for.
    pub fn cqe(&self) -> u32 {
        self.inner.cqe
    }

    /// The `cq_context` given at creation (`cq->cq_context`).
    pub fn cq_context(&self) -> u64 {
        self.inner.cq_context
    }

    /// The completion vector given at creation.
    pub fn comp_vector(&self) -> u32 {
        self.inner.comp_vector
    }

    /// Moves up to `wc.len()` completions, oldest first, into `wc` (`ibv_poll_cq`) and
    /// returns how many.
    ///
    /// Fails with `EIO` once the CQ has overrun (completions were lost; an
    /// `IBV_EVENT_CQ_ERR` was raised) — the CQ is then unusable, as in verbs.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        // Sends that UC/UD QPs of the device hold for a batch go now (`post_send`): their
        // program is looking for completions.
        self.for_each_engine(false, |e| e.flush_held_sends());
        let (n, armed) = self.poll_entries(wc)?;
        if n > 0 || wc.is_empty() {
            return Ok(n);
        }
        // Records of a QP's peer in the ring of its own: carried out here, without the
        // device's receive path.
        if self.inner.has_pairs.load(Ordering::Acquire) && self.take_pairs(!armed) {
            // (Every 256th such poll goes on to the device's receive path too: a program whose
            // polls all find records there still has its lanes from other processes, the
            // socket and the timers looked at, as the progress thread leaves them to it. Not
            // more often: with nothing on the lanes that path reads the socket, a system call,
            // and every 16th poll cost a one-thread ping-pong 7%.)
            let hits = self.inner.pair_hits.load(Ordering::Relaxed).wrapping_add(1);
            self.inner.pair_hits.store(hits, Ordering::Relaxed);
            let (n, _) = self.poll_entries(wc)?;
            if n > 0 && !hits.is_multiple_of(256) {
                return Ok(n);
            }
            // (Not the empty poll's flush of held ACKs: this poll took records, and the
            // program may be about to answer them; before, a program that spins on memory for
            // the answer once its WRITE completes, perftest `ib_write_lat`, waited for the
            // hand-off at every 256th such poll, 0.5% of its round trips. Records that gave no
            // completion, an RDMA WRITE's, are the same: the device is looked at, and the ACK
            // held for them goes at the next poll that finds nothing.)
            let looked = self.for_each_engine(false, |e| e.poll_progress(!armed, false));
            if n > 0 || !looked {
                return Ok(n);
            }
            return Ok(self.poll_entries(wc)?.0);
        }
        // Nothing yet: receive what the device has waiting, here, then look again.
        if self.for_each_engine(false, |e| e.poll_progress(!armed, true)) {
            return Ok(self.poll_entries(wc)?.0);
        }
        Ok(0)
    }

    /// Carries out what the QP pair rings listed hold (see [`CqInner::add_pair`]); whether
    /// anything was. `busy`: the CQ is not armed (its program polls).
    fn take_pairs(&self, busy: bool) -> bool {
        // (Another thread polling this CQ is at them: its look serves both.)
        let Ok(mut v) = self.inner.pairs.try_lock() else {
            return false;
        };
        let mut took = false;
        let mut closed = false;
        for (e, p, qp) in v.iter() {
            if p.pending() {
                // (Handed the ring's QP, found without the device's table of QPs; a QP that
                // is gone leaves it to that table, which knows it is.)
                took |= e.take_pair(p, qp.upgrade(), busy) > 0;
            } else if p.is_closed() {
                closed = true;
            }
        }
        if closed {
            v.retain(|(_, p, _)| !p.is_closed());
            self.inner.has_pairs.store(!v.is_empty(), Ordering::Release);
        }
        took
    }

    /// Runs `f` on every receive queue the CQ's QPs use: the first, then the others
    /// (`more_engines`), which are skipped while another thread polling this CQ goes through
    /// them, unless `wait`. Returns whether there was one (the device has started).
    fn for_each_engine(&self, wait: bool, f: impl Fn(&Arc<dyn crate::provider::Provider>)) -> bool {
        let Some(first) = self.engine() else {
            return false;
        };
        f(first);
        if self.inner.has_more.load(Ordering::Acquire) {
            let more = if wait {
                Some(
                    self.inner
                        .more_engines
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()),
                )
            } else {
                self.inner.more_engines.try_lock().ok()
            };
            if let Some(more) = more {
                more.iter().for_each(&f);
            }
        }
        true
    }

    /// The engine of the CQ's device, once it is started.
    fn engine(&self) -> Option<&Arc<dyn crate::provider::Provider>> {
        match self.inner.engine.get() {
            Some(e) => Some(e),
            None => self
                .inner
                .ctx
                .shared
                .engine_if_started()
                .map(|e| self.inner.engine.get_or_init(|| e)),
        }
    }

    /// Whether the CQ reports its completion events to `channel`.
    #[cfg(feature = "tokio")]
    pub(crate) fn uses_channel(&self, channel: &CompChannel) -> bool {
        self.inner
            .channel
            .as_ref()
            .is_some_and(|h| Arc::ptr_eq(h.arc(), &channel.inner))
    }

    /// Moves completions into `wc`; also says whether the CQ is armed for an event.
    fn poll_entries(&self, wc: &mut [WorkCompletion]) -> Result<(usize, bool)> {
        let inner = &*self.inner;
        // (A plain load and store: see `CqInner::polls`.)
        let polls = inner.polls.load(Ordering::Relaxed);
        inner.polls.store(polls.wrapping_add(1), Ordering::Relaxed);
        if inner.quick.load(Ordering::Acquire) == 0 {
            // Nothing waits (a completion being pushed now is taken by the next poll).
            return Ok((0, inner.armed.load(Ordering::Relaxed)));
        }
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.overrun {
            return Err(Error::new(
                ErrorKind::Os(libc::EIO),
                "the CQ overran and lost completions",
            ));
        }
        let n = wc.len().min(st.entries.len());
        for (slot, e) in wc.iter_mut().zip(st.entries.drain(..n)) {
            *slot = e;
        }
        inner.quick.store(st.quick(), Ordering::Release);
        let armed = st.armed != Armed::No;
        drop(st);
        if n > 0 && self.inner.has_wakers.load(Ordering::Acquire) {
            self.inner.run_wakers();
        }
        Ok((n, armed))
    }

    /// Arms the CQ for one completion event on its channel (`ibv_req_notify_cq`): the next
    /// completion (with `solicited_only`, the next solicited or unsuccessful one) puts one
    /// event on the channel, after which the CQ must be armed again.
    ///
    /// Fails with `EINVAL` when the CQ has no completion channel.
    pub fn req_notify_cq(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(Error::invalid("the CQ has no completion channel to notify"));
        }
        {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            st.armed = match (solicited_only, st.armed) {
                (false, _) => Armed::Any,
                (true, Armed::Any) => Armed::Any,
                (true, _) => Armed::Solicited,
            };
            self.inner.armed.store(true, Ordering::Relaxed);
        }
        // The program is about to sleep on the channel: the device's progress thread, which
        // leaves the socket to threads that poll, must take it back now.
        self.for_each_engine(true, |e| e.app_sleeps());
        Ok(())
    }

    /// Acknowledges `nevents` completion events of this CQ (`ibv_ack_cq_events`).
    pub fn ack_cq_events(&self, nevents: u32) {
        self.inner
            .events_acked
            .fetch_add(u64::from(nevents), Ordering::AcqRel);
    }

    /// Waits, as rdma-core's `ibv_destroy_cq` does before it destroys, until every completion
    /// event returned by [`CompChannel::get_cq_event`] and every asynchronous event about the
    /// CQ is acknowledged — unless a QP uses the CQ, when it returns at once (the destroy then
    /// fails with `EBUSY` without waiting, as the kernel's does). A program that never
    /// acknowledges waits for ever, as with rdma-core. The C library calls it before
    /// [`Cq::destroy`].
    pub fn wait_events_acked(&self) {
        loop {
            let (unacked, async_unacked) = self.unacked_events();
            if users_of(&*self.inner) != 0 || (unacked <= 0 && async_unacked == 0) {
                return;
            }
            // Teardown is not the hot path: a short sleep between looks is enough.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The completion events taken from the channel and not acknowledged, and the
    /// asynchronous events about the CQ not acknowledged.
    fn unacked_events(&self) -> (i64, usize) {
        let i = &self.inner;
        let unacked = i.events_reported.load(Ordering::Acquire) as i64
            - i.events_acked.load(Ordering::Acquire) as i64;
        (unacked, i.async_unacked.load(Ordering::Acquire))
    }

    /// Destroys the CQ (`ibv_destroy_cq`).
    ///
    /// Fails with `EBUSY`, giving the CQ back, while a QP uses it, while completion events
    /// returned by [`CompChannel::get_cq_event`] are not all acknowledged (rdma-core blocks
    /// here until they are: [`Cq::wait_events_acked`] does that; `destroy` itself reports it so
    /// that a single-threaded Rust program cannot deadlock), or while an asynchronous event
    /// about it is not acknowledged.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<Cq>> {
        let i = &self.inner;
        let users = users_of(&**i);
        let (unacked, async_unacked) = self.unacked_events();
        let why = if users != 0 {
            format!("the CQ is used by {users} QP(s)")
        } else if unacked > 0 {
            format!("{unacked} completion event(s) of the CQ are not acknowledged")
        } else if async_unacked != 0 {
            format!("{async_unacked} asynchronous event(s) about the CQ are not acknowledged")
        } else {
            self.purge_channel();
            i.ctx.async_events.discard(&i.async_unacked);
            return Ok(());
        };
        Err(DestroyError {
            object: self,
            error: Error::busy(why),
        })
    }

    fn purge_channel(&self) {
        if let Some(ch) = &self.inner.channel {
            let mut q = ch.queue.lock().unwrap_or_else(|p| p.into_inner());
            let before = q.len();
            q.retain(|c| !Arc::ptr_eq(c, &self.inner));
            for _ in q.len()..before {
                ch.fd.try_wait();
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.purge_channel();
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("cqe", &self.inner.cqe)
            .field("cq_context", &self.inner.cq_context)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// A context on a device of this run's own address.
    fn open_ctx() -> Context {
        Device::from_addr(crate::testing::unique_loopback_addr().into())
            .unwrap()
            .open()
            .unwrap()
    }

    fn ok_wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            ..Default::default()
        }
    }

    #[test]
    fn solicited_only_fires_on_solicited_or_error_completions() {
        let ctx = open_ctx();
        let ch = ctx.create_comp_channel().unwrap();
        ch.set_nonblocking(true).unwrap();
        let cq = ctx.create_cq(16, 1, Some(&ch), 0).unwrap();
        cq.req_notify_cq(true).unwrap();
        cq.inner.push(ok_wc(1), false);
        assert_eq!(ch.get_cq_event().unwrap_err().errno(), libc::EAGAIN);
        cq.inner.push(ok_wc(2), true);
        ch.get_cq_event().unwrap();
        cq.req_notify_cq(true).unwrap();
        let err = WorkCompletion {
            status: WcStatus::RemAccessErr,
            ..ok_wc(3)
        };
        cq.inner.push(err, false);
        ch.get_cq_event().unwrap();
        // Any overrides solicited-only; solicited-only does not downgrade Any.
        cq.req_notify_cq(false).unwrap();
        cq.req_notify_cq(true).unwrap();
        cq.inner.push(ok_wc(4), false);
        ch.get_cq_event().unwrap();
        // Not armed: nothing.
        cq.inner.push(ok_wc(5), true);
        assert_eq!(ch.get_cq_event().unwrap_err().errno(), libc::EAGAIN);
        cq.ack_cq_events(3);
        let mut wc = [WorkCompletion::default(); 8];
        assert_eq!(cq.poll(&mut wc).unwrap(), 5);
        assert_eq!(wc.map(|w| w.wr_id)[..5], [1, 2, 3, 4, 5]);
    }

    /// A poll of an empty CQ takes no lock: it reads `quick`, which must follow every change
    /// of the queue (push, poll, purge, overrun) or a completion would be missed or an
    /// overrun hidden; and `armed`, which follows `req_notify_cq` and the event it fires.
    #[test]
    fn an_empty_poll_sees_every_change_of_the_queue() {
        let ctx = open_ctx();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(4, 0, Some(&ch), 0).unwrap();
        let mut wc = [WorkCompletion::default(); 1];
        assert_eq!(cq.poll_entries(&mut wc).unwrap(), (0, false));
        cq.req_notify_cq(false).unwrap();
        assert_eq!(cq.poll_entries(&mut wc).unwrap(), (0, true));
        // Two completions (the first fires the event and disarms), taken one at a time.
        assert!(cq.inner.push(ok_wc(1), false));
        assert!(cq.inner.push(ok_wc(2), false));
        assert_eq!(cq.poll_entries(&mut wc).unwrap(), (1, false));
        assert_eq!(wc[0].wr_id, 1);
        assert_eq!(cq.poll_entries(&mut wc).unwrap(), (1, false));
        assert_eq!(wc[0].wr_id, 2);
        assert_eq!(cq.poll_entries(&mut wc).unwrap(), (0, false));
        // A receive of a destroyed QP taken out again: empty.
        let recv = WorkCompletion {
            wr_id: 3,
            qp_num: 7,
            opcode: WcOpcode::Recv,
            ..Default::default()
        };
        assert!(cq.inner.push(recv, false));
        cq.inner.purge_recvs(7);
        assert_eq!(cq.poll_entries(&mut wc).unwrap().0, 0);
        // Overrun: polls fail from then on, even once nothing is left to take.
        for i in 0..u64::from(cq.cqe()) {
            assert!(cq.inner.push(ok_wc(i), false));
        }
        assert!(!cq.inner.push(ok_wc(99), false));
        for _ in 0..2 {
            assert_eq!(cq.poll(&mut wc).unwrap_err().errno(), libc::EIO);
        }
        let polls = cq.inner.polls.load(Ordering::Relaxed);
        assert_eq!(polls, 8, "every poll counts");
    }

    /// A CQ takes room as it fills: one of the device's largest size starts small, and one
    /// past its first room still holds exactly `cqe` completions, in order, then overruns.
    #[test]
    fn a_large_cq_grows_as_it_fills_and_overruns_at_its_size() {
        let ctx = open_ctx();
        let max = ctx.query_device().unwrap().max_cqe;
        let huge = ctx.create_cq(max, 0, None, 0).unwrap();
        assert_eq!(huge.cqe(), max);
        let room = |cq: &Cq| cq.inner.state.lock().unwrap().entries.capacity();
        assert!(room(&huge) < 2 * INITIAL_ROOM, "{}", room(&huge));
        let cq = ctx.create_cq(3 * INITIAL_ROOM as u32, 0, None, 0).unwrap();
        let n = cq.cqe() as u64;
        assert!(n > INITIAL_ROOM as u64);
        for i in 0..n {
            assert!(cq.inner.push(ok_wc(i), false), "completion {i} of {n}");
        }
        let mut wc = vec![WorkCompletion::default(); 1000];
        let mut next = 0;
        loop {
            let got = cq.poll(&mut wc).unwrap();
            if got == 0 {
                break;
            }
            for w in &wc[..got] {
                assert_eq!(w.wr_id, next);
                next += 1;
            }
        }
        assert_eq!(next, n);
        for i in 0..n {
            assert!(
                cq.inner.push(ok_wc(i), false),
                "again: completion {i} of {n}"
            );
        }
        assert!(!cq.inner.push(ok_wc(n), false), "one past cqe overruns");
        assert_eq!(cq.poll(&mut wc).unwrap_err().errno(), libc::EIO);
    }

    /// A CQ shared by RC QPs of three receive queues drives all three from `poll`, each
    /// once, whichever queue its first QP had; a CQ of one queue keeps no list.
    #[test]
    fn polling_a_cq_drives_the_receive_queue_of_every_qp_that_uses_it() {
        use crate::{QpCap, QpInitAttr, QpType};
        let ctx = open_ctx();
        ctx.set_receive_queues(3).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let shared = ctx.create_cq(64, 0, None, 0).unwrap();
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qps: Vec<_> = (0..6)
            .map(|_| {
                pd.create_qp(&mut QpInitAttr::new(QpType::Rc, &shared, cap))
                    .unwrap()
            })
            .collect();
        let slots: std::collections::HashSet<u32> = qps.iter().map(|q| q.qp_num() >> 16).collect();
        assert_eq!(slots.len(), 3, "QPs on three queues");
        let more = shared.inner.more_engines.lock().unwrap().len();
        assert!(shared.inner.engine.get().is_some());
        assert_eq!(more, 2, "the first QP's queue and two more");
        assert!(shared.inner.has_more.load(Ordering::Acquire));
        // A CQ whose QPs all receive on one queue (UD QPs stay on queue 0).
        let single = ctx.create_cq(64, 0, None, 0).unwrap();
        let _ud: Vec<_> = (0..3)
            .map(|_| {
                pd.create_qp(&mut QpInitAttr::new(QpType::Ud, &single, cap))
                    .unwrap()
            })
            .collect();
        assert!(single.inner.engine.get().is_some());
        assert!(!single.inner.has_more.load(Ordering::Acquire));
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(shared.poll(&mut wc).unwrap(), 0);
        assert_eq!(single.poll(&mut wc).unwrap(), 0);
    }

    #[test]
    fn destroying_a_cq_removes_its_pending_events_from_the_channel() {
        let ctx = open_ctx();
        let ch = ctx.create_comp_channel().unwrap();
        ch.set_nonblocking(true).unwrap();
        let cq = ctx.create_cq(4, 0, Some(&ch), 0).unwrap();
        cq.req_notify_cq(false).unwrap();
        cq.inner.push(ok_wc(1), false);
        cq.destroy().unwrap();
        assert_eq!(ch.get_cq_event().unwrap_err().errno(), libc::EAGAIN);
        ch.destroy().unwrap();
    }
}
