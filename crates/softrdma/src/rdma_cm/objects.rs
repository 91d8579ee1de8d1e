//! The connection manager's objects, which hold each other: the id ([`CmId`], its shared
//! [`IdInner`] and its state [`IdData`]), the event channel it reports to
//! ([`EventChannel`]), and the events that name it ([`CmEvent`]). What they do is in the
//! files above: `id.rs` (create, options, bind; an id's drop), `connect.rs`, `qp.rs`,
//! `multicast.rs`, `dispatch.rs`.

use super::addrinfo::AddrInfo;
use super::event::{CmEventType, ConnParam, EventInfo, UdParam};
use super::rewake;
use super::{CmQpInitAttr, PortSpace};
use crate::error::{DestroyError, Error, ErrorKind, Result};
use crate::provider::fd::EventFd;
use crate::provider::Provider;
use crate::verbs::cq::CqInner;
use crate::{CompChannel, Context, Cq, Gid, Mtu, Pd, Qp, QpType, Srq};
use softrdma_proto::cm::{ConnId, ReqInfo};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdState {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    Connect,
    Established,
    Disconnected,
    Gone,
}

/// The connection's negotiated transport parameters, from the REQ (passive) or REP (active).
#[derive(Debug, Clone, Copy)]
pub(super) struct Neg {
    pub(super) remote_qpn: u32,
    pub(super) remote_psn: u32,
    pub(super) mtu: Mtu,
    /// Our max_dest_rd_atomic (RDMA READs/atomics we accept).
    pub(super) resp: u8,
    /// Our max_rd_atomic (RDMA READs/atomics we issue).
    pub(super) init: u8,
    pub(super) timeout: u8,
    pub(super) retry: u8,
    pub(super) rnr: u8,
}

pub(super) struct McGroup {
    pub(super) addr: IpAddr,
    pub(super) gid: Gid,
    pub(super) send_only: bool,
    pub(super) attached: Option<Arc<Qp>>,
    pub(super) count: Arc<GroupCount>,
}

pub(super) struct IdData {
    pub(super) state: IdState,
    pub(super) src: Option<SocketAddr>,
    pub(super) dst: Option<SocketAddr>,
    pub(super) ctx: Option<Arc<Context>>,
    pub(super) engine: Option<Arc<dyn Provider>>,
    pub(super) path_mtu: Mtu,
    pub(super) qp: Option<Arc<Qp>>,
    pub(super) pd: Option<Arc<Pd>>,
    pub(super) srq: Option<Arc<Srq>>,
    pub(super) send_cq: Option<Arc<Cq>>,
    pub(super) recv_cq: Option<Arc<Cq>>,
    pub(super) send_cq_channel: Option<Arc<CompChannel>>,
    pub(super) recv_cq_channel: Option<Arc<CompChannel>>,
    pub(super) conn: Option<ConnId>,
    pub(super) conn_param: ConnParam,
    pub(super) starting_psn: u32,
    /// For a passive id: the REQ it answers.
    pub(super) req: Option<Box<ReqInfo>>,
    pub(super) neg: Option<Neg>,
    pub(super) listening: Option<u64>,
    /// A listener's backlog: most CONNECT_REQUESTs waiting to be taken.
    pub(super) backlog: usize,
    pub(super) tos: u8,
    pub(super) reuseaddr: bool,
    pub(super) afonly: bool,
    pub(super) ack_timeout: Option<u8>,
    /// A local CONNECT_ERROR was reported: a later DISCONNECTED or REJECTED is swallowed.
    pub(super) conn_error: bool,
    pub(super) mcast: Vec<McGroup>,
    /// rdma_create_ep on a passive id: what rdma_get_request creates the new ids' QPs with.
    pub(super) ep_attr: Option<(Option<Arc<Pd>>, CmQpInitAttr)>,
    /// rdma_create_ep: data to put before the private data of rdma_connect (`ai_connect`).
    pub(super) connect_data: Vec<u8>,
}

pub(super) struct ChanRef {
    pub(super) channel: EventChannel,
    pub(super) sync: bool,
}

pub(super) struct IdInner {
    pub(super) ps: PortSpace,
    pub(super) qp_type: QpType,
    pub(super) context: u64,
    pub(super) chan: Mutex<ChanRef>,
    /// The last event of a synchronous id.
    pub(super) last_event: Mutex<Option<EventInfo>>,
    pub(super) state: Mutex<IdData>,
    pub(super) reported: AtomicUsize,
    pub(super) acked: AtomicUsize,
    pub(super) acked_cv: Condvar,
    /// The result of `rdma_resolve_addrinfo`.
    pub(super) addrinfo: Mutex<Option<Vec<AddrInfo>>>,
    /// A listener's CONNECT_REQUEST events not yet taken by the application.
    pub(super) backlog_used: AtomicUsize,
}

impl IdInner {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, IdData> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn chan(&self) -> std::sync::MutexGuard<'_, ChanRef> {
        self.chan.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An `rdma_cm_id`: a communication endpoint of the connection manager. Handles are cheap to
/// clone (events carry one); [`CmId::destroy`] releases the id.
///
/// Created on an [`EventChannel`], an id reports what happens as events there; created with
/// none, it is synchronous: the calls that produce an event block for it and keep it as
/// [`CmId::event`]. The [module documentation](super) connects two ids end to end.
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, PortSpace};
/// use std::net::{IpAddr, SocketAddr};
/// // Two loopback addresses no other process uses (each is a device).
/// let (src, dst): (IpAddr, IpAddr) = (
///     softrdma::testing::unique_loopback_addr().into(),
///     softrdma::testing::unique_loopback_addr().into(),
/// );
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// assert!(id.is_sync());
/// // The source address picks the device (one per local IP address); without it, the
/// // route to a loopback destination would start at 127.0.0.1.
/// id.resolve_addr(Some(SocketAddr::new(src, 0)), SocketAddr::new(dst, 7471), 2000)?;
/// assert_eq!(id.event().unwrap().event, CmEventType::AddrResolved);
/// assert_eq!(id.local_addr().unwrap().ip(), src);
/// assert_eq!(id.verbs().unwrap().device().addr(), src);
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Clone)]
pub struct CmId {
    pub(super) inner: Arc<IdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.lock();
        f.debug_struct("CmId")
            .field("ps", &self.inner.ps)
            .field("state", &s.state)
            .field("src", &s.src)
            .field("dst", &s.dst)
            .finish()
    }
}

impl PartialEq for CmId {
    fn eq(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for CmId {}

/// Hashes the id's identity (consistent with `==`: two handles of one id hash alike), so
/// that ids can key a map — e.g. the C layer's table from ids to its `rdma_cm_id`s.
impl std::hash::Hash for CmId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.inner), state);
    }
}

/// An event channel (`struct rdma_event_channel`): a real file descriptor that is readable
/// while events wait; set `O_NONBLOCK` on it to make [`EventChannel::get_cm_event`] fail
/// with `EAGAIN` instead of blocking.
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, EventChannel, PortSpace};
/// use std::net::{IpAddr, SocketAddr};
/// let ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
/// let ch = EventChannel::new()?;
/// let id = CmId::create(Some(&ch), 42, PortSpace::Tcp)?;
/// id.resolve_addr(Some(SocketAddr::new(ip, 0)), SocketAddr::new(ip, 7471), 2000)?;
/// let ev = ch.get_cm_event()?; // blocks; poll ch.fd() to wait with other things
/// assert_eq!(ev.event, CmEventType::AddrResolved);
/// assert_eq!(ev.id.context(), 42);
/// ev.ack();
/// ch.set_nonblocking(true)?;
/// assert_eq!(ch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Clone)]
pub struct EventChannel {
    pub(super) inner: Arc<ChanInner>,
}

pub(super) struct ChanInner {
    fd: EventFd,
    queue: Mutex<VecDeque<CmEvent>>,
    pub(super) ids: AtomicUsize,
}

impl EventChannel {
    /// Creates an event channel (`rdma_create_event_channel`).
    ///
    /// Fails with the errno of `eventfd` (`EMFILE`, `ENOMEM`).
    pub fn new() -> Result<EventChannel> {
        Ok(EventChannel {
            inner: Arc::new(ChanInner {
                fd: EventFd::new()?,
                queue: Mutex::new(VecDeque::new()),
                ids: AtomicUsize::new(0),
            }),
        })
    }

    /// The channel's descriptor (`channel->fd`): poll it for `POLLIN`, or set `O_NONBLOCK`.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Makes [`EventChannel::get_cm_event`] fail with `EAGAIN` instead of blocking
    /// (`fcntl(channel->fd, F_SETFL, O_NONBLOCK)`), or blocking again.
    ///
    /// Fails with the errno of `fcntl`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.inner.fd.set_nonblocking(nonblocking)
    }

    /// Takes the next event (`rdma_get_cm_event`): blocks until one arrives, unless the
    /// descriptor is non-blocking (then `EAGAIN`). Acknowledge it with [`CmEvent::ack`] (or
    /// drop it): destroying or migrating its id waits for that.
    ///
    /// A DISCONNECTED event caused by the peer waits while the receive CQ of the id's QP
    /// holds completions of the peer's last messages that the program has not polled, as
    /// long as somebody polls that CQ (1 s at most; 50 ms once nobody does): a program that
    /// destroys its QP on the event would lose them (see `RecvHold`). Events of other ids go
    /// meanwhile. On a non-blocking descriptor the call then fails with `EAGAIN` and the
    /// descriptor is not readable until the next poll of that CQ that takes completions, or
    /// 5 ms later (so a program polling the descriptor does not spin).
    ///
    /// While it waits, the calling thread receives what arrives for this process's devices
    /// itself (as [`crate::CompChannel::get_cq_event`] does; `SOFTRDMA_WAIT_RECEIVES=0` leaves
    /// it to their progress threads): the CM message behind the event wakes it once.
    ///
    /// Fails with `EAGAIN` on a non-blocking descriptor with no event that may go.
    pub fn get_cm_event(&self) -> Result<CmEvent> {
        self.take_event(None)
    }

    /// Takes the next event as [`EventChannel::get_cm_event`] does, waiting `timeout` at
    /// most (whatever the descriptor's `O_NONBLOCK`; a zero timeout only looks).
    ///
    /// Fails with `ETIMEDOUT` when no event came in time; nothing is lost: an event that
    /// arrives later is there for the next call.
    ///
    /// ```
    /// use softrdma::rdma_cm::EventChannel;
    /// use std::time::Duration;
    /// let ch = EventChannel::new().unwrap();
    /// let e = ch.get_cm_event_timeout(Duration::from_millis(1)).unwrap_err();
    /// assert_eq!(e.errno(), libc::ETIMEDOUT);
    /// ```
    pub fn get_cm_event_timeout(&self, timeout: std::time::Duration) -> Result<CmEvent> {
        self.take_event(Some(Instant::now() + timeout))
    }

    /// A function that signals the channel's descriptor the first time any clone of it is
    /// called (and does nothing after, nor once the channel is gone): the one count a held
    /// event took, given back exactly once.
    fn give_back_once(&self) -> Arc<dyn Fn() + Send + Sync> {
        let chan = Arc::downgrade(&self.inner);
        let done = AtomicBool::new(false);
        Arc::new(move || {
            if !done.swap(true, Ordering::AcqRel) {
                if let Some(c) = chan.upgrade() {
                    c.fd.signal();
                }
            }
        })
    }

    /// Takes the first event that may go: blocks (unless the descriptor is non-blocking)
    /// until there is one, or until `deadline` when given. An event held back for its QP's
    /// receive completions ([`RecvHold`]) lets those of other ids go first, not those of its
    /// own id.
    fn take_event(&self, deadline: Option<Instant>) -> Result<CmEvent> {
        // The program takes CM events rather than answering on a QP.
        crate::provider::release_held_acks();
        loop {
            crate::provider::wait_receiving(&self.inner.fd, deadline)?;
            let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let mut held: Vec<CmId> = Vec::new();
            let mut pick = None;
            for (i, ev) in q.iter_mut().enumerate() {
                if held.contains(&ev.id) {
                    continue;
                }
                if ev.hold.as_mut().is_some_and(|h| h.waits(now)) {
                    held.push(ev.id.clone());
                    continue;
                }
                if let Some(h) = ev.hold.take().filter(|h| h.waited) {
                    tracing::debug!(
                        qp_num = h.qp_num,
                        held = ?now.duration_since(h.posted),
                        "DISCONNECTED went after its QP's last receive completions were polled \
                         (or the hold ran out)"
                    );
                }
                pick = Some(i);
                break;
            }
            if pick.is_none() && !held.is_empty() {
                // Every waiting event is held: the count taken goes back, and the caller
                // looks again in a moment, or fails with EAGAIN as on an empty channel.
                if deadline.is_none() && self.inner.fd.is_nonblocking() {
                    // Not at once: a descriptor left readable would make a program that
                    // polls it spin until the hold ends. It goes back when a CQ of a held
                    // event next gives up completions (maybe the held ones), or after
                    // REWAKE_AFTER (the hold may have run out, the QP gone).
                    let back = self.give_back_once();
                    for ev in q.iter() {
                        if let Some(h) = &ev.hold {
                            let back = back.clone();
                            h.cq.on_next_take(Box::new(move || back()));
                        }
                    }
                    // Taken meanwhile (before the CQ knew whom to tell)? Then at once.
                    if !q
                        .iter_mut()
                        .filter_map(|ev| ev.hold.as_mut())
                        .all(|h| h.waits(now))
                    {
                        back();
                    }
                    rewake::after(now + REWAKE_AFTER, Box::new(move || back()));
                    return Err(Error::new(
                        ErrorKind::WouldBlock,
                        "the next event waits until its QP's receive completions are polled",
                    ));
                }
                drop(q);
                drop(held);
                self.inner.fd.signal();
                let mut nap = HOLD_NAP;
                if let Some(d) = deadline {
                    let left = d.saturating_duration_since(now);
                    if left.is_zero() {
                        return Err(Error::new(
                            ErrorKind::Os(libc::ETIMEDOUT),
                            "no event came before the timeout",
                        ));
                    }
                    nap = nap.min(left);
                }
                std::thread::sleep(nap);
                continue;
            }
            if let Some(mut ev) = pick.and_then(|i| q.remove(i)) {
                // Counted as reported while the queue is locked, so that destroy (which
                // purges the queue under the same lock) never misses it.
                ev.id.inner.reported.fetch_add(1, Ordering::AcqRel);
                if let Some(g) = &ev.group {
                    g.reported.fetch_add(1, Ordering::AcqRel);
                }
                ev.delivered = true;
                if ev.event == CmEventType::ConnectRequest {
                    if let Some(l) = &ev.listen_id {
                        l.inner.backlog_used.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                return Ok(ev);
            }
        }
    }

    /// Destroys the channel (`rdma_destroy_event_channel`).
    ///
    /// Fails with `EBUSY`, giving it back, while ids use it.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<EventChannel>> {
        let n = self.inner.ids.load(Ordering::Acquire);
        if n != 0 {
            return Err(DestroyError {
                object: self,
                error: Error::busy(format!("{n} rdma_cm id(s) use the channel")),
            });
        }
        Ok(())
    }

    pub(super) fn post(&self, ev: CmEvent) {
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(ev);
        self.inner.fd.signal();
    }

    /// Takes out the queued (not yet delivered) events that `pred` selects.
    pub(super) fn remove_queued(&self, pred: impl Fn(&CmEvent) -> bool) -> Vec<CmEvent> {
        let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(q.len());
        for ev in q.drain(..) {
            if pred(&ev) {
                out.push(ev);
            } else {
                keep.push_back(ev);
            }
        }
        *q = keep;
        drop(q);
        for _ in 0..out.len() {
            self.inner.fd.try_wait();
        }
        out
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// Counts of the events of one multicast group, so that leaving it waits for its events.
#[derive(Default)]
pub(super) struct GroupCount {
    pub(super) reported: AtomicUsize,
    pub(super) acked: AtomicUsize,
}

/// An event (`struct rdma_cm_event`). Acknowledge every event exactly once
/// ([`CmEvent::ack`], or by dropping it): [`CmId::destroy`] waits for the events of its id.
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, EventChannel, PortSpace};
/// let ch = EventChannel::new()?;
/// let id = CmId::create(Some(&ch), 5, PortSpace::Tcp)?;
/// // rdma_write_cm_event: a USER event, say to wake the thread that waits on the channel.
/// id.write_cm_event(CmEventType::User, 0, 77)?;
/// let ev = ch.get_cm_event()?;
/// assert_eq!((ev.event, ev.arg, ev.id.context()), (CmEventType::User, 77, 5));
/// assert!(ev.listen_id.is_none());
/// let info = ev.info(); // the contents without the ids, to keep after the ack
/// ev.ack();
/// assert_eq!(info.arg, 77);
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
pub struct CmEvent {
    /// What happened.
    pub event: CmEventType,
    /// 0, a negative errno, (REJECTED) the IB CM reject reason, or (UNREACHABLE on a UD id)
    /// the SIDR status.
    pub status: i32,
    /// The id the event is about: for CONNECT_REQUEST, a new id for the incoming connection.
    pub id: CmId,
    /// For CONNECT_REQUEST, the listening id.
    pub listen_id: Option<CmId>,
    /// Connection parameters (private data from the peer, the peer's resources and depth as
    /// seen from this side).
    pub param: ConnParam,
    /// Datagram parameters: SIDR (CONNECT_REQUEST and ESTABLISHED on UD ids) and
    /// MULTICAST_JOIN.
    pub ud: Option<UdParam>,
    /// USER: the value given to `write_cm_event`; MULTICAST_JOIN/ERROR: the join context.
    pub arg: u64,
    pub(super) group: Option<Arc<GroupCount>>,
    pub(super) delivered: bool,
    pub(super) acked: bool,
    pub(super) hold: Option<RecvHold>,
}

/// How long a DISCONNECTED event waits at most for its QP's receive completions to be polled.
const HOLD_MAX: Duration = Duration::from_secs(1);
/// How long it waits for them while nobody polls the CQ that holds them.
const HOLD_IDLE: Duration = Duration::from_millis(50);
/// How often a thread waiting for a held event looks again.
const HOLD_NAP: Duration = Duration::from_micros(500);
/// How long a non-blocking channel whose every event is held stays unreadable at most (unless
/// a CQ of a held event gives up completions first).
const REWAKE_AFTER: Duration = Duration::from_millis(5);

/// Holds a DISCONNECTED event back while the receive CQ of its QP has completions of that QP
/// that the program has not polled: the messages the peer sent before it disconnected.
///
/// A program commonly destroys its QP when it learns of the disconnection, and destroying a
/// QP takes its unpolled receive completions out of its CQs (as a hardware provider cleans
/// its CQs). One that polls its CQ and reads its events in turn (libfabric 1.17's rxm) could
/// otherwise read the event in the moment between a poll that found the CQ empty and the
/// arrival of the peer's last message, and lose it. The event waits while the CQ holds such
/// completions and somebody polls it, for [`HOLD_MAX`] at most; when nobody has polled the CQ
/// for [`HOLD_IDLE`] (a program waiting for the event before it polls), it goes.
pub(super) struct RecvHold {
    cq: Arc<CqInner>,
    qp_num: u32,
    posted: Instant,
    polls: u64,
    active: Instant,
    /// Whether it has held the event back at least once.
    waited: bool,
}

impl RecvHold {
    /// A hold for the receive completions of `qp` (none for a QP on an SRQ, whose
    /// completions stay when the QP goes).
    pub(super) fn of(qp: &Qp) -> Option<RecvHold> {
        if qp.inner.srq.is_some() {
            return None;
        }
        let cq = qp.inner.recv_cq.arc().clone();
        let (_, polls) = cq.recvs_unpolled(qp.inner.qp_num);
        let now = Instant::now();
        Some(RecvHold {
            cq,
            qp_num: qp.inner.qp_num,
            posted: now,
            polls,
            active: now,
            waited: false,
        })
    }

    /// Whether the event still waits at `now` (noting whether the CQ was polled since the
    /// last look).
    fn waits(&mut self, now: Instant) -> bool {
        let (unpolled, polls) = self.cq.recvs_unpolled(self.qp_num);
        if !unpolled {
            return false;
        }
        if polls != self.polls {
            self.polls = polls;
            self.active = now;
        }
        let waits = now.duration_since(self.active) < HOLD_IDLE
            && now.duration_since(self.posted) < HOLD_MAX;
        self.waited |= waits;
        waits
    }
}

impl CmEvent {
    pub(super) fn new(
        event: CmEventType,
        status: i32,
        id: CmId,
        listen_id: Option<CmId>,
        param: ConnParam,
    ) -> CmEvent {
        CmEvent {
            event,
            status,
            id,
            listen_id,
            param,
            ud: None,
            arg: 0,
            group: None,
            delivered: false,
            acked: false,
            hold: None,
        }
    }

    /// Acknowledges the event (`rdma_ack_cm_event`).
    pub fn ack(mut self) {
        self.release();
    }

    /// The event's contents, without the ids.
    pub fn info(&self) -> EventInfo {
        EventInfo {
            event: self.event,
            status: self.status,
            param: self.param.clone(),
            ud: self.ud.clone(),
            arg: self.arg,
        }
    }

    fn release(&mut self) {
        if self.acked {
            return;
        }
        self.acked = true;
        if !self.delivered {
            return;
        }
        if let Some(g) = &self.group {
            g.acked.fetch_add(1, Ordering::AcqRel);
        }
        let i: &IdInner = &self.id.inner;
        let _g = i.lock();
        i.acked.fetch_add(1, Ordering::AcqRel);
        i.acked_cv.notify_all();
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("event", &self.event)
            .field("status", &self.status)
            .field("param", &self.param)
            .field("ud", &self.ud)
            .field("arg", &self.arg)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod recv_hold_tests {
    use super::*;
    use crate::verbs::cq::{WcOpcode, WcStatus, WorkCompletion};

    fn recv(qp_num: u32, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            qp_num,
            status,
            opcode: WcOpcode::Recv,
            ..WorkCompletion::default()
        }
    }

    /// The rules of a held DISCONNECTED, on a CQ of a real device and a clock of the test's
    /// own: it waits while the QP's message is unpolled and the CQ is being polled, goes at
    /// once when the message is taken, after HOLD_IDLE without a poll, after HOLD_MAX
    /// whatever; flushed receives and other QPs' messages never hold it.
    #[test]
    fn a_held_disconnected_waits_for_the_qps_unpolled_messages_within_its_bounds() {
        let ip: IpAddr = crate::testing::unique_loopback_addr().into();
        let ctx = super::super::registry::device_context(ip).unwrap();
        let cq = ctx.create_cq(16, 0, None, 0).unwrap();
        let t0 = Instant::now();
        let hold = |cq: &Cq| RecvHold {
            cq: cq.inner.clone(),
            qp_num: 7,
            posted: t0,
            polls: cq.inner.recvs_unpolled(7).1,
            active: t0,
            waited: false,
        };
        let ms = |n: u64| t0 + Duration::from_millis(n);

        // Nothing of QP 7's to poll (a flush, another QP's message): it goes.
        cq.inner.push(recv(7, WcStatus::WrFlushErr), false);
        cq.inner.push(recv(8, WcStatus::Success), false);
        let mut h = hold(&cq);
        assert!(!h.waits(t0));
        assert!(!h.waited);

        // A message of QP 7's: it waits; it goes HOLD_IDLE after the last poll seen.
        cq.inner.push(recv(7, WcStatus::Success), false);
        let mut h = hold(&cq);
        assert!(h.waits(t0) && h.waits(ms(49)));
        assert!(!h.waits(ms(50)), "nobody polls: it goes");
        assert!(h.waited);

        // Polled (taking nothing) at each look: it waits up to HOLD_MAX, then goes.
        let mut h = hold(&cq);
        for t in [10, 300, 600, 999] {
            cq.poll(&mut []).unwrap();
            assert!(h.waits(ms(t)), "polled at {t} ms");
        }
        cq.poll(&mut []).unwrap();
        assert!(!h.waits(ms(1000)), "HOLD_MAX");

        // Taking the message lets it go at once.
        let mut h = hold(&cq);
        assert!(h.waits(ms(1)));
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc).unwrap(), 3);
        assert!(!h.waits(ms(2)));
    }
}
