//! The async face (feature `tokio`): connection set-up, completions and work requests as
//! futures, on tokio's [`AsyncFd`] over the real descriptors of event channels and
//! completion channels. Nothing here busy-polls: a task that waits sleeps in the reactor
//! until the descriptor it waits on becomes readable.
//!
//! | blocking | async |
//! |---|---|
//! | [`EventChannel::get_cm_event`] | [`AsyncEventChannel::next_event`] |
//! | `rdma_resolve_addr`/`route`, `rdma_connect` | [`AsyncCmId::resolve`], [`AsyncCmId::connect`], [`AsyncConn::connect`] |
//! | `rdma_get_request`, `rdma_accept` | [`AsyncListener::get_request`], [`AsyncListener::accept`], [`AsyncCmId::accept`] |
//! | `rdma_disconnect` | [`AsyncCmId::disconnect`] |
//! | `ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_poll_cq` | [`AsyncCq::next_completion`] |
//! | `rdma_post_send` + `rdma_get_send_comp`, … | [`AsyncQp::send`], [`AsyncQp::recv`], [`AsyncQp::write`], [`AsyncQp::read`] |
//!
//! The types must be created inside a tokio runtime whose IO driver is enabled
//! (`Runtime::new`, `#[tokio::main]`, or a builder with `enable_io`): outside any runtime
//! they panic, as tokio's `AsyncFd` does; in one without IO they fail. They set
//! `O_NONBLOCK` on the descriptors they wrap.
//!
//! # Connection parameters
//! [`conn_param`] is what the async face connects and accepts with: `rnr_retry_count` 7
//! (retry for ever while the peer has no receive posted — [`ConnParam::default`] has 0,
//! so a SEND that beats the peer's receive fails with `IBV_WC_RNR_RETRY_EXC_ERR`),
//! `retry_count` 7, and the device's maximum of RDMA READs in flight.
//!
//! # Timeouts
//! Bound any of these futures with `tokio::time::timeout` (a connect that gets no answer, a
//! receive that gets no message): the timeout drops the future, which is safe as follows.
//!
//! # Cancellation
//! Every future here may be dropped at any await point (e.g. by `tokio::time::timeout` or
//! `select!`) without losing or misdelivering anything:
//!
//! - Waiting for an event or a completion takes nothing until it returns it: a dropped
//!   [`AsyncEventChannel::next_event`], [`AsyncListener::get_request`] (while it waits for a
//!   request) or [`AsyncCq::next_completion`] leaves the event, request or completion for
//!   the next call.
//! - A work request posted by [`AsyncQp`] cannot be taken back: when its future is dropped
//!   the QP still executes it (a dropped [`AsyncQp::recv`] still consumes the next incoming
//!   message). Its completion is matched by `wr_id` (the async face numbers its own work
//!   requests) and discarded, counted by [`AsyncCq::discarded`]; it is never handed to
//!   another future or to [`AsyncCq::next_completion`].
//! - Memory stays valid for the device whatever is dropped: a region keeps its
//!   [`crate::Buffer`] alive, and the device reaches memory only through the region, whose
//!   deregistration waits for the accesses in progress. The future of a work request
//!   borrows its [`Mr`], so the region cannot be deregistered while the future lives; once
//!   a dropped future has released it, a request that runs after the region was
//!   deregistered fails with a protection error instead of touching the memory. The bytes
//!   a dropped send or write has not yet read may be the buffer's new contents.
//! - A dropped connect, accept or resolve leaves the id part-way: the outcome of a connect
//!   already sent arrives later as an event ([`AsyncCmId::next_event`]); a dropped
//!   [`AsyncListener::accept`] past the request destroys the new id, which rejects or
//!   disconnects the peer.
//!
//! # Errors
//! Calls fail with the errno the blocking call would report: connecting gives
//! `ECONNREFUSED` (REJECTED: nobody listens, or the peer rejected), `ETIMEDOUT`
//! (UNREACHABLE), the status of an ADDR_ERROR, … A work completion that is not successful
//! fails the future of its request with: `ECONNRESET` for `IBV_WC_WR_FLUSH_ERR` (the QP
//! went to the error state: a disconnect, by either side), `ETIMEDOUT` for
//! `IBV_WC_RETRY_EXC_ERR` and `IBV_WC_RNR_RETRY_EXC_ERR`, `EACCES` for
//! `IBV_WC_REM_ACCESS_ERR` and `IBV_WC_LOC_PROT_ERR`, `EIO` for the others; the message
//! names the status.
//!
//! ```
//! use softrdma::tokio::{conn_param, default_cap, AsyncConn, AsyncListener};
//! use softrdma::Buffer;
//! use std::sync::Arc;
//! # let ip = softrdma::testing::unique_loopback_addr();
//! # let cip = softrdma::testing::unique_loopback_addr();
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! rt.block_on(async {
//!     let listener = AsyncListener::bind((ip, 0).into(), 8).unwrap();
//!     let addr = listener.local_addr().unwrap();
//!     let server = async {
//!         let conn = listener.accept().await.unwrap();
//!         let buf = Arc::new(Buffer::new(64));
//!         let mr = conn.id().reg_msgs(&buf).unwrap();
//!         let wc = conn.qp().recv(&mr, 0..64).await.unwrap();
//!         buf.to_vec()[..wc.byte_len as usize].to_vec()
//!     };
//!     let client = async {
//!         // `AsyncConn::connect(addr)` takes the route's source address; here, one of ours.
//!         let src = Some((cip, 0).into());
//!         let conn = AsyncConn::connect_with(src, addr, default_cap(), conn_param());
//!         let conn = conn.await.unwrap();
//!         let buf = Arc::new(Buffer::from_slice(b"hello"));
//!         let mr = conn.id().reg_msgs(&buf).unwrap();
//!         conn.qp().send(&mr, 0..5).await.unwrap();
//!         conn
//!     };
//!     let (got, _conn) = tokio::join!(server, client);
//!     assert_eq!(got, b"hello");
//! });
//! ```

use crate::error::{Error, ErrorKind, Result};
use crate::rdma_cm::{
    event_error, CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace,
    RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES,
};
use crate::{
    CompChannel, Cq, Mr, Qp, QpCap, RecvWr, RemoteMr, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};
use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use ::tokio::sync::Notify;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The connection parameters of the async face: `rnr_retry_count` 7 (infinite RNR
/// retries), `retry_count` 7, and the device's maximum responder resources and initiator
/// depth (RDMA READs in flight).
pub fn conn_param() -> ConnParam {
    ConnParam {
        rnr_retry_count: 7,
        retry_count: 7,
        responder_resources: RDMA_MAX_RESP_RES,
        initiator_depth: RDMA_MAX_INIT_DEPTH,
        ..ConnParam::default()
    }
}

/// The QP capabilities [`AsyncConn::connect`] and [`AsyncListener::accept`] use: 16 send and
/// 16 receive work requests of one scatter/gather entry each.
pub fn default_cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::from_io(e, "waiting in the tokio reactor")
}

struct ChanFd(EventChannel);

impl AsRawFd for ChanFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

/// An event channel whose events are awaited ([`AsyncEventChannel::next_event`]) instead of
/// blocking a thread.
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, EventChannel, PortSpace};
/// use softrdma::tokio::AsyncEventChannel;
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let ch = AsyncEventChannel::new(EventChannel::new().unwrap()).unwrap();
///     let id = CmId::create(Some(ch.channel()), 7, PortSpace::Tcp).unwrap();
///     id.write_cm_event(CmEventType::User, 0, 42).unwrap();
///     let ev = ch.next_event().await.unwrap();
///     assert_eq!((ev.event, ev.arg, ev.id.context()), (CmEventType::User, 42, 7));
///     ev.ack();
///     id.destroy();
/// });
/// ```
pub struct AsyncEventChannel {
    fd: AsyncFd<ChanFd>,
}

impl AsyncEventChannel {
    /// Wraps `channel`, setting `O_NONBLOCK` on its descriptor (a blocking
    /// [`EventChannel::get_cm_event`] on it then fails with `EAGAIN` when no event waits).
    ///
    /// Fails in a tokio runtime without IO, and with the errno of `fcntl` or `epoll_ctl`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(channel: EventChannel) -> Result<Self> {
        channel.set_nonblocking(true)?;
        // SAFETY: the descriptor is the channel's own, and `ChanFd` owns the channel (its
        // `EventFd`, which closes it on drop), so it stays open and the same for the life of
        // the `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(ChanFd(channel), Interest::READABLE) }
            .map_err(|e| Error::from_io(e.into(), "registering the event channel with tokio"))?;
        Ok(AsyncEventChannel { fd })
    }

    /// The channel.
    pub fn channel(&self) -> &EventChannel {
        &self.fd.get_ref().0
    }

    /// Waits for the next event and takes it (`rdma_get_cm_event`). Cancellation-safe: a
    /// dropped future has taken no event.
    ///
    /// Fails with the errno of reading the descriptor or of the reactor.
    pub async fn next_event(&self) -> Result<CmEvent> {
        loop {
            let mut ready = self.fd.readable().await.map_err(io_err)?;
            match self.channel().get_cm_event() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => ready.clear_ready(),
                r => return r,
            }
        }
    }
}

impl std::fmt::Debug for AsyncEventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEventChannel")
            .field("fd", &self.channel().fd())
            .finish()
    }
}

/// An `rdma_cm_id` with an event channel of its own, whose calls that produce an event
/// await it: [`AsyncCmId::resolve`], [`AsyncCmId::connect`], [`AsyncCmId::accept`],
/// [`AsyncCmId::disconnect`]. Every event on its channel is about this id.
///
/// ```
/// use softrdma::rdma_cm::PortSpace;
/// use softrdma::tokio::{conn_param, default_cap, AsyncCmId};
/// # let ip = softrdma::testing::unique_loopback_addr();
/// # let cip = softrdma::testing::unique_loopback_addr();
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     // Nobody listens on that port: the connect is refused.
///     let id = AsyncCmId::new(PortSpace::Tcp, 0).unwrap();
///     id.resolve(Some((cip, 0).into()), (ip, 9).into()).await.unwrap();
///     let _qp = id.create_qp(&mut default_cap()).unwrap();
///     let err = id.connect(conn_param()).await.unwrap_err();
///     assert_eq!(err.errno(), libc::ECONNREFUSED);
/// });
/// ```
pub struct AsyncCmId {
    // (The id goes before its channel.)
    id: CmId,
    events: AsyncEventChannel,
    /// DISCONNECTED was taken from the channel.
    disconnected: AtomicBool,
}

impl AsyncCmId {
    /// Creates an id in port space `ps` with a channel of its own (`rdma_create_id`).
    ///
    /// Fails like [`EventChannel::new`], [`CmId::create`] and [`AsyncEventChannel::new`].
    pub fn new(ps: PortSpace, context: u64) -> Result<Self> {
        let ch = EventChannel::new()?;
        let id = CmId::create(Some(&ch), context, ps)?;
        Self::wrap(id, ch)
    }

    /// Takes `id` into the async face: moves it and its waiting events to a new channel of
    /// its own (`rdma_migrate_id`, which waits until the events taken for it are
    /// acknowledged).
    ///
    /// Fails like [`CmId::migrate_id`] and [`AsyncEventChannel::new`].
    pub fn from_id(id: CmId) -> Result<Self> {
        let ch = EventChannel::new()?;
        id.migrate_id(Some(&ch))?;
        Self::wrap(id, ch)
    }

    fn wrap(id: CmId, ch: EventChannel) -> Result<Self> {
        Ok(AsyncCmId {
            id,
            events: AsyncEventChannel::new(ch)?,
            disconnected: AtomicBool::new(false),
        })
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Waits for the id's next event (e.g. DISCONNECTED when the peer leaves). Cancellation-
    /// safe.
    ///
    /// Fails like [`AsyncEventChannel::next_event`].
    pub async fn next_event(&self) -> Result<CmEvent> {
        let ev = self.events.next_event().await?;
        if ev.event == CmEventType::Disconnected {
            self.disconnected.store(true, Ordering::Release);
        }
        Ok(ev)
    }

    /// Waits for the event `want`; any other event is turned into its error, as a
    /// synchronous id does.
    async fn expect(&self, want: CmEventType) -> Result<()> {
        let ev = self.next_event().await?;
        let info = ev.info();
        ev.ack();
        if info.event == want {
            Ok(())
        } else {
            Err(event_error(&info))
        }
    }

    /// Resolves `dst` (binding to `src` first when given) and the route: `rdma_resolve_addr`
    /// then `rdma_resolve_route`, each awaiting its event.
    ///
    /// Fails like the two calls, and with the errno of ADDR_ERROR or ROUTE_ERROR
    /// (`EADDRNOTAVAIL`: no softrdma device owns the source; `ENETUNREACH`: no route).
    pub async fn resolve(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        self.id.resolve_addr(src, dst, 2000)?;
        self.expect(CmEventType::AddrResolved).await?;
        self.id.resolve_route(2000)?;
        self.expect(CmEventType::RouteResolved).await
    }

    /// Creates the id's QP with send and receive CQs of its own (`rdma_create_qp` on the
    /// device's default PD) and wraps it for async work requests; the actual capabilities
    /// are written back into `cap`.
    ///
    /// Fails like [`CmId::create_qp`] and [`AsyncCq::new`].
    pub fn create_qp(&self, cap: &mut QpCap) -> Result<AsyncQp> {
        let qp = self.id.create_qp(None, cap)?;
        let cq = |cq: Option<Arc<Cq>>, ch: Option<Arc<CompChannel>>| match (cq, ch) {
            (Some(cq), Some(ch)) => AsyncCq::new(cq, ch).map(Arc::new),
            _ => Err(Error::invalid("rdma_create_qp made no CQ with a channel")),
        };
        let send = cq(self.id.send_cq(), self.id.send_cq_channel())?;
        let recv = cq(self.id.recv_cq(), self.id.recv_cq_channel())?;
        Ok(AsyncQp::new(qp, send, recv))
    }

    /// Connects (`rdma_connect`) and waits until the connection is established.
    ///
    /// Fails like [`CmId::connect`], and with `ECONNREFUSED` (REJECTED: nobody listens on
    /// the port, or the peer rejected), `ETIMEDOUT` (UNREACHABLE: no answer) or the
    /// errno of another event. Dropped while waiting, the attempt goes on and its outcome
    /// arrives at [`AsyncCmId::next_event`].
    pub async fn connect(&self, param: ConnParam) -> Result<()> {
        self.id.connect(&param)?;
        self.expect(CmEventType::Established).await
    }

    /// Accepts the connection request this id was made for (`rdma_accept`) and waits until
    /// the connection is established (the peer's RTU).
    ///
    /// Fails like [`CmId::accept`], and with the errno of the event that came instead of
    /// ESTABLISHED (the peer gave up: `ECONNREFUSED`, `ETIMEDOUT`, …).
    pub async fn accept(&self, param: ConnParam) -> Result<()> {
        self.id.accept(&param)?;
        self.expect(CmEventType::Established).await
    }

    /// Disconnects (`rdma_disconnect`: the QP goes to the error state, flushing its work
    /// requests) and waits for DISCONNECTED; returns at once when the peer disconnected
    /// first and its DISCONNECTED was already taken. Other events that arrive meanwhile are
    /// acknowledged and dropped.
    ///
    /// Fails like [`CmId::disconnect`] (`EINVAL` when the id never connected).
    pub async fn disconnect(&self) -> Result<()> {
        if self.disconnected.load(Ordering::Acquire) {
            // The peer went first: stop our QP; the event is already taken.
            return self.id.disconnect();
        }
        self.id.disconnect()?;
        while !self.disconnected.load(Ordering::Acquire) {
            self.next_event().await?.ack();
        }
        Ok(())
    }

    /// Destroys the id (`rdma_destroy_id`, which waits until its taken events are
    /// acknowledged) and its channel.
    pub fn destroy(self) {
        self.id.destroy();
    }
}

impl std::fmt::Debug for AsyncCmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCmId").field("id", &self.id).finish()
    }
}

/// A listening id whose connection requests are awaited: [`AsyncListener::accept`] returns
/// each as a connected [`AsyncConn`]. Several tasks may accept at once; each request goes
/// to one of them.
///
/// ```
/// use softrdma::tokio::{conn_param, default_cap, AsyncConn, AsyncListener};
/// # let ip = softrdma::testing::unique_loopback_addr();
/// # let cip = softrdma::testing::unique_loopback_addr();
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let listener = AsyncListener::bind((ip, 0).into(), 8).unwrap();
///     let addr = listener.local_addr().unwrap();
///     // (`AsyncConn::connect(addr)` takes the route's source address; here, one of ours.)
///     let src = Some((cip, 0).into());
///     let connect = AsyncConn::connect_with(src, addr, default_cap(), conn_param());
///     let (server, client) = tokio::join!(listener.accept(), connect);
///     let (server, client) = (server.unwrap(), client.unwrap());
///     assert_eq!(server.id().peer_addr(), client.id().local_addr());
///     client.disconnect().await.unwrap();
///     server.disconnect().await.unwrap();
/// });
/// ```
pub struct AsyncListener {
    cm: AsyncCmId,
    /// Held from taking an event to moving the new id to its own channel, so that no other
    /// task takes an event of the new id from the listener's channel meanwhile.
    take: Mutex<()>,
}

impl AsyncListener {
    /// Binds an RC (`RDMA_PS_TCP`) id to `addr` (port 0: an ephemeral port) and listens
    /// with `backlog` (`rdma_bind_addr`, `rdma_listen`).
    ///
    /// Fails like [`AsyncCmId::new`], [`CmId::bind_addr`] (`EADDRNOTAVAIL`, `EADDRINUSE`)
    /// and [`CmId::listen`].
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Self> {
        let cm = AsyncCmId::new(PortSpace::Tcp, 0)?;
        cm.id.bind_addr(addr)?;
        cm.id.listen(backlog)?;
        Ok(Self::from_cm(cm))
    }

    fn from_cm(cm: AsyncCmId) -> Self {
        AsyncListener {
            cm,
            take: Mutex::new(()),
        }
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        &self.cm.id
    }

    /// The address and port it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.cm.id.local_addr()
    }

    /// Waits for the next connection request and returns its new id, moved to a channel of
    /// its own, not yet accepted: create its QP ([`AsyncCmId::create_qp`]), post receives,
    /// then [`AsyncCmId::accept`] (or reject it, or drop it, which rejects the peer).
    /// Cancellation-safe: a dropped future has taken no request.
    ///
    /// Fails with the errno of an event about the listener itself (DEVICE_REMOVAL:
    /// `ENODEV`), and like [`AsyncCmId::from_id`].
    pub async fn get_request(&self) -> Result<AsyncCmId> {
        loop {
            let mut ready = self.cm.events.fd.readable().await.map_err(io_err)?;
            match self.take_request() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => ready.clear_ready(),
                Err(e) => return Err(e),
                Ok(Some(cm)) => return Ok(cm),
                Ok(None) => {}
            }
        }
    }

    /// Takes one event from the listener's channel: a connection request becomes an id of
    /// its own; `Ok(None)` for an event nobody waits for here; `EAGAIN` when none waits.
    fn take_request(&self) -> Result<Option<AsyncCmId>> {
        let _l = self.take.lock().unwrap_or_else(|p| p.into_inner());
        let ev = self.cm.events.channel().get_cm_event()?;
        if ev.event == CmEventType::ConnectRequest {
            let id = ev.id.clone();
            ev.ack();
            return match AsyncCmId::from_id(id.clone()) {
                Ok(cm) => Ok(Some(cm)),
                Err(e) => {
                    let _ = id.reject(&[]);
                    id.destroy();
                    Err(e)
                }
            };
        }
        let info = ev.info();
        let mine = ev.id == self.cm.id;
        ev.ack();
        if mine {
            return Err(event_error(&info));
        }
        // (An event of a new id whose request a blocking call took from this channel:
        // nobody waits for it here.)
        Ok(None)
    }

    /// Waits for the next connection request, creates its QP ([`default_cap`]) and accepts
    /// it with [`conn_param`]; returns once the connection is established.
    ///
    /// Fails like [`AsyncListener::accept_with`].
    pub async fn accept(&self) -> Result<AsyncConn> {
        self.accept_with(default_cap(), conn_param()).await
    }

    /// [`AsyncListener::accept`] with the QP capabilities `cap` and the parameters `param`.
    /// Cancellation: dropped while waiting for a request, it took none; dropped later, the
    /// new id is destroyed, which rejects or disconnects the peer.
    ///
    /// Fails like [`AsyncListener::get_request`], [`AsyncCmId::create_qp`] (then the
    /// request is rejected) and [`AsyncCmId::accept`].
    pub async fn accept_with(&self, mut cap: QpCap, param: ConnParam) -> Result<AsyncConn> {
        let cm = self.get_request().await?;
        let qp = match cm.create_qp(&mut cap) {
            Ok(qp) => qp,
            Err(e) => {
                let _ = cm.id.reject(&[]);
                cm.destroy();
                return Err(e);
            }
        };
        cm.accept(param).await?;
        Ok(AsyncConn { cm, qp })
    }
}

impl std::fmt::Debug for AsyncListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncListener")
            .field("id", &self.cm.id)
            .finish()
    }
}

/// A connected RC id with its QP: what [`AsyncConn::connect`] and [`AsyncListener::accept`]
/// return. Work requests go through [`AsyncConn::qp`]; memory is registered on the id's PD
/// ([`CmId::reg_msgs`] and friends, through [`AsyncConn::id`]).
///
/// ```
/// use softrdma::tokio::{conn_param, default_cap, AsyncConn, AsyncListener};
/// # let ip = softrdma::testing::unique_loopback_addr();
/// # let cip = softrdma::testing::unique_loopback_addr();
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let listener = AsyncListener::bind((ip, 0).into(), 8).unwrap();
///     let addr = listener.local_addr().unwrap();
///     // (`AsyncConn::connect(addr)` takes the route's source address; here, one of ours.)
///     let src = Some((cip, 0).into());
///     let connect = AsyncConn::connect_with(src, addr, default_cap(), conn_param());
///     let (server, client) = tokio::join!(listener.accept(), connect);
///     let (server, client) = (server.unwrap(), client.unwrap());
///     // The peer leaves: the server sees DISCONNECTED, and its posted receive is flushed.
///     client.disconnect().await.unwrap();
///     let buf = std::sync::Arc::new(softrdma::Buffer::new(8));
///     let mr = server.id().reg_msgs(&buf).unwrap();
///     let err = server.qp().recv(&mr, 0..8).await.unwrap_err();
///     assert_eq!(err.errno(), libc::ECONNRESET);
///     server.disconnect().await.unwrap();
/// });
/// ```
pub struct AsyncConn {
    cm: AsyncCmId,
    qp: AsyncQp,
}

impl AsyncConn {
    /// Connects an RC id to `dst` with [`default_cap`] and [`conn_param`]: resolves the
    /// address and route, creates the QP, connects, and returns once the connection is
    /// established.
    ///
    /// Fails like [`AsyncConn::connect_with`].
    pub async fn connect(dst: SocketAddr) -> Result<AsyncConn> {
        Self::connect_with(None, dst, default_cap(), conn_param()).await
    }

    /// [`AsyncConn::connect`] from `src` (when given), with the QP capabilities `cap` and the
    /// parameters `param`. Dropped part-way, the id is destroyed (a REQ already sent is
    /// withdrawn).
    ///
    /// Fails like [`AsyncCmId::resolve`], [`AsyncCmId::create_qp`] and
    /// [`AsyncCmId::connect`] (`ECONNREFUSED`, `ETIMEDOUT`).
    pub async fn connect_with(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        mut cap: QpCap,
        param: ConnParam,
    ) -> Result<AsyncConn> {
        let cm = AsyncCmId::new(PortSpace::Tcp, 0)?;
        cm.resolve(src, dst).await?;
        let qp = cm.create_qp(&mut cap)?;
        cm.connect(param).await?;
        Ok(AsyncConn { cm, qp })
    }

    /// Builds a connection from an id and its QP that the program connected itself.
    pub fn from_parts(cm: AsyncCmId, qp: AsyncQp) -> AsyncConn {
        AsyncConn { cm, qp }
    }

    /// The id.
    pub fn id(&self) -> &CmId {
        &self.cm.id
    }

    /// The id's async face (its events).
    pub fn cm(&self) -> &AsyncCmId {
        &self.cm
    }

    /// The QP.
    pub fn qp(&self) -> &AsyncQp {
        &self.qp
    }

    /// Disconnects and waits for DISCONNECTED ([`AsyncCmId::disconnect`]).
    ///
    /// Fails like [`AsyncCmId::disconnect`].
    pub async fn disconnect(&self) -> Result<()> {
        self.cm.disconnect().await
    }

    /// Destroys the id, its QP and CQs.
    pub fn destroy(self) {
        let AsyncConn { cm, qp } = self;
        drop(qp);
        cm.destroy();
    }
}

impl std::fmt::Debug for AsyncConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncConn")
            .field("id", &self.cm.id)
            .field("qp_num", &self.qp.qp.qp_num())
            .finish()
    }
}

struct CompFd(Arc<CompChannel>);

impl AsRawFd for CompFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

enum Slot {
    /// A future waits for this completion.
    Waiting,
    /// It came; the future has not taken it yet.
    Done(WorkCompletion),
    /// The future was dropped: the completion is discarded when it comes.
    Abandoned,
}

#[derive(Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    /// Completions nobody waits for by `wr_id`, for [`AsyncCq::next_completion`].
    unclaimed: VecDeque<WorkCompletion>,
    discarded: u64,
}

impl Table {
    fn route(&mut self, wc: WorkCompletion) {
        match self.slots.get_mut(&wc.wr_id) {
            Some(s @ Slot::Waiting) => *s = Slot::Done(wc),
            Some(Slot::Abandoned) => {
                self.slots.remove(&wc.wr_id);
                self.discarded += 1;
            }
            // (A second completion with the wr_id of a waiting future cannot come: the
            // async face gives every request its own wr_id.)
            Some(Slot::Done(_)) | None => self.unclaimed.push_back(wc),
        }
    }
}

/// A completion queue whose completions are awaited: [`AsyncCq::next_completion`], and the
/// completions of [`AsyncQp`]'s work requests, matched by `wr_id`. It must be the only
/// consumer of the CQ and of its completion channel, which no other CQ may use.
///
/// ```
/// use softrdma::tokio::AsyncCq;
/// use std::sync::Arc;
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let ctx = softrdma::Device::from_addr(softrdma::testing::unique_loopback_addr().into()).unwrap().open().unwrap();
///     let ch = Arc::new(ctx.create_comp_channel().unwrap());
///     let cq = Arc::new(ctx.create_cq(16, 0, Some(&ch), 0).unwrap());
///     let acq = AsyncCq::new(cq, ch).unwrap();
///     // Nothing completes: the wait is still pending when the timeout drops it.
///     let t = tokio::time::timeout(std::time::Duration::from_millis(10), acq.next_completion());
///     assert!(t.await.is_err());
/// });
/// ```
pub struct AsyncCq {
    cq: Arc<Cq>,
    fd: AsyncFd<CompFd>,
    table: Mutex<Table>,
    /// Woken whenever completions were routed into the table.
    routed: Notify,
}

impl AsyncCq {
    /// Wraps `cq` and its completion channel `channel`, setting `O_NONBLOCK` on the channel
    /// (blocking waits on it, such as [`CmId::get_send_comp`], then fail with `EAGAIN`).
    ///
    /// Fails with `EINVAL` when `cq` does not report to `channel`, in a tokio runtime
    /// without IO, and with the errno of `fcntl` or `epoll_ctl`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(cq: Arc<Cq>, channel: Arc<CompChannel>) -> Result<Self> {
        if !cq.uses_channel(&channel) {
            return Err(Error::invalid(
                "the CQ does not report to this completion channel",
            ));
        }
        channel.set_nonblocking(true)?;
        // SAFETY: as in `AsyncEventChannel::new`: `CompFd` owns the channel whose descriptor
        // it names.
        let fd = unsafe { AsyncFd::register_with_interest(CompFd(channel), Interest::READABLE) }
            .map_err(|e| {
                Error::from_io(e.into(), "registering the completion channel with tokio")
            })?;
        Ok(AsyncCq {
            cq,
            fd,
            table: Mutex::new(Table::default()),
            routed: Notify::new(),
        })
    }

    /// The CQ.
    pub fn cq(&self) -> &Arc<Cq> {
        &self.cq
    }

    /// The completion channel.
    pub fn channel(&self) -> &Arc<CompChannel> {
        &self.fd.get_ref().0
    }

    /// How many completions of dropped [`AsyncQp`] futures were discarded.
    pub fn discarded(&self) -> u64 {
        self.table().discarded
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the next completion that no [`AsyncQp`] future waits for (work requests
    /// posted on the CQ's QPs directly, with the program's own `wr_id`s), oldest first.
    /// Cancellation-safe: a dropped future has taken no completion.
    ///
    /// Fails with `EIO` once the CQ overran, and with `EINVAL` when an event of another CQ
    /// comes on the channel.
    pub async fn next_completion(&self) -> Result<WorkCompletion> {
        self.wait(|t| t.unclaimed.pop_front()).await
    }

    /// Reserves the table entry of the work request `wr_id`, before it is posted.
    fn expect(&self, wr_id: u64) -> Pending<'_> {
        self.table().slots.insert(wr_id, Slot::Waiting);
        Pending {
            cq: self,
            wr_id,
            live: true,
        }
    }

    /// Moves the CQ's completions into the table; says whether there were any.
    fn drain(&self) -> Result<bool> {
        let mut wc = [WorkCompletion::default(); 16];
        let mut any = false;
        loop {
            let n = self.cq.poll(&mut wc)?;
            if n == 0 {
                break;
            }
            any = true;
            let mut t = self.table();
            for w in &wc[..n] {
                t.route(*w);
            }
            drop(t);
            if n < wc.len() {
                break;
            }
        }
        if any {
            self.routed.notify_waiters();
        }
        Ok(any)
    }

    /// Takes the completion events waiting on the channel (acknowledging them), until none
    /// is left.
    fn take_events(&self) -> Result<()> {
        loop {
            match self.channel().get_cq_event() {
                Ok(ev) if ev.is_for(&self.cq) => self.cq.ack_cq_events(1),
                Ok(_) => {
                    return Err(Error::invalid(
                        "an event of another CQ came on the completion channel",
                    ))
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until `take` finds what it wants in the table, draining the CQ meanwhile: poll,
    /// arm, poll again (a completion between the first poll and the arming raised no event),
    /// then sleep until the channel's descriptor is readable or another task routed
    /// completions.
    async fn wait<T>(&self, mut take: impl FnMut(&mut Table) -> Option<T>) -> Result<T> {
        loop {
            let routed = self.routed.notified();
            ::tokio::pin!(routed);
            routed.as_mut().enable();
            if let Some(v) = take(&mut self.table()) {
                return Ok(v);
            }
            if self.drain()? {
                continue;
            }
            self.cq.req_notify_cq(false)?;
            if self.drain()? {
                continue;
            }
            ::tokio::select! {
                r = self.fd.readable() => {
                    let mut ready = r.map_err(io_err)?;
                    self.take_events()?;
                    ready.clear_ready();
                }
                () = &mut routed => {}
            }
        }
    }
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq").field("cq", &self.cq).finish()
    }
}

/// The table entry of one posted work request; dropped before its completion came, it
/// marks the entry abandoned.
struct Pending<'a> {
    cq: &'a AsyncCq,
    wr_id: u64,
    live: bool,
}

impl Pending<'_> {
    /// The request was not posted: forget the entry.
    fn unposted(mut self) {
        self.live = false;
        self.cq.table().slots.remove(&self.wr_id);
    }

    async fn wait(mut self) -> Result<WorkCompletion> {
        let wr_id = self.wr_id;
        let wc = self
            .cq
            .wait(|t| match t.slots.get(&wr_id) {
                Some(Slot::Done(_)) => match t.slots.remove(&wr_id) {
                    Some(Slot::Done(wc)) => Some(wc),
                    _ => None,
                },
                _ => None,
            })
            .await?;
        self.live = false;
        wc_result(wc)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let mut t = self.cq.table();
        match t.slots.get_mut(&self.wr_id) {
            Some(s @ Slot::Waiting) => *s = Slot::Abandoned,
            Some(Slot::Done(_)) => {
                t.slots.remove(&self.wr_id);
                t.discarded += 1;
            }
            _ => {}
        }
    }
}

/// A completion's outcome as a result (see the module's Errors).
fn wc_result(wc: WorkCompletion) -> Result<WorkCompletion> {
    let errno = match wc.status {
        WcStatus::Success => return Ok(wc),
        WcStatus::WrFlushErr => libc::ECONNRESET,
        WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr => libc::ETIMEDOUT,
        WcStatus::RemAccessErr | WcStatus::LocProtErr => libc::EACCES,
        _ => libc::EIO,
    };
    Err(Error::new(
        ErrorKind::Os(errno),
        format!(
            "work request {:#x} completed with {:?} (vendor error {:#x})",
            wc.wr_id, wc.status, wc.vendor_err
        ),
    ))
}

/// The `wr_id`s of the async face: a tag in the top byte, then a counter.
const WR_TAG: u64 = 0xa5 << 56;

/// A QP whose work requests are futures that resolve to their own work completion: post,
/// then await the completion with the request's `wr_id`. Every send request is signaled.
///
/// ```
/// use softrdma::tokio::{conn_param, default_cap, AsyncConn, AsyncListener};
/// use softrdma::Buffer;
/// use std::sync::Arc;
/// # let ip = softrdma::testing::unique_loopback_addr();
/// # let cip = softrdma::testing::unique_loopback_addr();
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let listener = AsyncListener::bind((ip, 0).into(), 8).unwrap();
///     let addr = listener.local_addr().unwrap();
///     // (`AsyncConn::connect(addr)` takes the route's source address; here, one of ours.)
///     let src = Some((cip, 0).into());
///     let connect = AsyncConn::connect_with(src, addr, default_cap(), conn_param());
///     let (server, client) = tokio::join!(listener.accept(), connect);
///     let (server, client) = (server.unwrap(), client.unwrap());
///     let target = Arc::new(Buffer::new(8));
///     let tmr = server.id().reg_write(&target).unwrap();
///     let src = Arc::new(Buffer::from_slice(b"written!"));
///     let smr = client.id().reg_msgs(&src).unwrap();
///     let wc = client.qp().write(&smr, 0..8, tmr.remote()).await.unwrap();
///     assert_eq!(wc.byte_len, 8);
///     assert_eq!(target.to_vec(), b"written!");
/// });
/// ```
pub struct AsyncQp {
    qp: Arc<Qp>,
    send_cq: Arc<AsyncCq>,
    recv_cq: Arc<AsyncCq>,
    next: AtomicU64,
}

impl AsyncQp {
    /// Wraps `qp`, whose send and receive CQs are `send_cq` and `recv_cq` (they may be the
    /// same).
    pub fn new(qp: Arc<Qp>, send_cq: Arc<AsyncCq>, recv_cq: Arc<AsyncCq>) -> AsyncQp {
        AsyncQp {
            qp,
            send_cq,
            recv_cq,
            next: AtomicU64::new(0),
        }
    }

    /// The QP.
    pub fn qp(&self) -> &Arc<Qp> {
        &self.qp
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<AsyncCq> {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<AsyncCq> {
        &self.recv_cq
    }

    fn next_wr_id(&self) -> u64 {
        WR_TAG | (self.next.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1))
    }

    /// Posts `wr` (its `wr_id` replaced by one of the async face's, SIGNALED added) and
    /// waits for its completion (`ibv_post_send` then the completion). Cancellation: see the
    /// module's docs.
    ///
    /// Fails like [`Qp::post_send`], and with the errno of an unsuccessful completion (see
    /// the module's Errors).
    pub async fn post_send(&self, mut wr: SendWr<'_>) -> Result<WorkCompletion> {
        wr.wr_id = self.next_wr_id();
        wr.send_flags |= SendFlags::SIGNALED;
        let pending = self.send_cq.expect(wr.wr_id);
        if let Err(e) = self.qp.post_send(&[wr]) {
            pending.unposted();
            return Err(e.into());
        }
        pending.wait().await
    }

    /// Posts a receive into `sg_list` and waits for its completion (`ibv_post_recv`, then
    /// the completion). Cancellation: see the module's docs.
    ///
    /// Fails like [`Qp::post_recv`], and with the errno of an unsuccessful completion.
    pub async fn post_recv(&self, sg_list: &[Sge]) -> Result<WorkCompletion> {
        let wr_id = self.next_wr_id();
        let pending = self.recv_cq.expect(wr_id);
        if let Err(e) = self.qp.post_recv(&[RecvWr { wr_id, sg_list }]) {
            pending.unposted();
            return Err(e.into());
        }
        pending.wait().await
    }

    /// Sends the bytes `range` of `mr` (offsets from the start of the region) and waits for
    /// the send's completion (the peer acknowledged it).
    ///
    /// Fails with `EINVAL` when `range` is not inside `mr`, and like
    /// [`AsyncQp::post_send`]. (Dropped: see the module's Cancellation.)
    pub async fn send(&self, mr: &Mr, range: Range<usize>) -> Result<WorkCompletion> {
        let sge = [sge(mr, range)?];
        self.post_send(SendWr {
            sg_list: &sge,
            opcode: WrOpcode::Send,
            ..Default::default()
        })
        .await
    }

    /// Receives the next message into the bytes `range` of `mr` and returns its completion
    /// (`byte_len` is the message's length).
    ///
    /// Fails with `EINVAL` when `range` is not inside `mr`, like [`AsyncQp::post_recv`], and
    /// with `ECONNRESET` when the QP goes to the error state before a message came (a
    /// disconnect). (Dropped: the receive stays posted and takes the next message, whose
    /// completion is discarded.)
    pub async fn recv(&self, mr: &Mr, range: Range<usize>) -> Result<WorkCompletion> {
        let sge = [sge(mr, range)?];
        self.post_recv(&sge).await
    }

    /// Writes the bytes `range` of `mr` to the start of the peer's region `remote` (RDMA
    /// WRITE; take a sub-range with [`RemoteMr::slice`]) and waits for the completion.
    ///
    /// Fails like [`AsyncQp::send`], with `EINVAL` when the bytes do not fit `remote`, and
    /// with `EACCES` when the peer refused the access.
    pub async fn write(
        &self,
        mr: &Mr,
        range: Range<usize>,
        remote: RemoteMr,
    ) -> Result<WorkCompletion> {
        self.rdma(WrOpcode::RdmaWrite, mr, range, remote).await
    }

    /// Reads the start of the peer's region `remote` into the bytes `range` of `mr` (RDMA
    /// READ) and waits for the completion, after which the bytes are in `mr`.
    ///
    /// Fails like [`AsyncQp::write`].
    pub async fn read(
        &self,
        mr: &Mr,
        range: Range<usize>,
        remote: RemoteMr,
    ) -> Result<WorkCompletion> {
        self.rdma(WrOpcode::RdmaRead, mr, range, remote).await
    }

    /// An RDMA WRITE or READ between `range` of `mr` and the start of `remote`.
    async fn rdma(
        &self,
        opcode: WrOpcode,
        mr: &Mr,
        range: Range<usize>,
        remote: RemoteMr,
    ) -> Result<WorkCompletion> {
        let sge = [sge(mr, range)?];
        let what = if opcode == WrOpcode::RdmaWrite {
            "an RDMA WRITE"
        } else {
            "an RDMA READ"
        };
        remote.check_fits(u64::from(sge[0].length), what)?;
        self.post_send(SendWr {
            sg_list: &sge,
            opcode,
            remote_addr: remote.addr,
            rkey: remote.rkey,
            ..Default::default()
        })
        .await
    }
}

impl std::fmt::Debug for AsyncQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncQp")
            .field("qp_num", &self.qp.qp_num())
            .finish()
    }
}

/// The scatter/gather entry of the bytes `range` of `mr`.
fn sge(mr: &Mr, range: Range<usize>) -> Result<Sge> {
    Ok(mr.slice(range.start as u64..range.end as u64)?.sge())
}
