//! The RDMA connection manager (librdmacm): event channels, `rdma_cm_id`s, address and route
//! resolution, and connection set-up over the IB CM on QP 1, as Linux rdma_cm does it over
//! RoCE.
//!
//! Names follow the man pages: [`EventChannel`] (`rdma_create_event_channel`), [`CmId`]
//! (`rdma_create_id`, `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`,
//! `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_destroy_id`, `rdma_create_qp`), [`CmEvent`] (`rdma_get_cm_event`,
//! `rdma_ack_cm_event`).
//!
//! This is the first part of the layer: asynchronous ids (with an event channel) for RC in the
//! TCP port space. Synchronous ids, UD (SIDR), multicast, `rdma_create_ep` and the
//! `rdma_verbs.h` helpers build on it.

use crate::engine::Engine;
use crate::error::{DestroyError, Error, ErrorKind, Result};
use crate::fd::EventFd;
use crate::{
    AccessFlags, AhAttr, CompChannel, Context, Cq, Device, Mtu, Pd, Qp, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType,
};
use softrdma_proto::cm::{AcceptParams, CmEvent as ProtoEvent, ConnId, ConnectRequest};
use softrdma_wire::cm::{RejectReason, TransportServiceType};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};

pub use softrdma_wire::cma::PortSpace;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// `enum rdma_cm_event_type`, with librdmacm's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventType {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a new id for an incoming connection.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted; the id has no QP
    /// (call `establish`).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: no answer from the peer.
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`: status is the IB CM reject reason (8: nobody listens,
    /// 28: rejected by the application).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit = 15,
}

impl CmEventType {
    /// The event's name (`rdma_event_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            CmEventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// `struct rdma_conn_param`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// Private data (connect: at most 56 bytes; accept: 196; reject: 148).
    pub private_data: Vec<u8>,
    /// RDMA READ/atomic requests we accept as target (0xFF: the device maximum).
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we issue (0xFF: the device maximum).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (3 bits; ignored on accept).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ (only for ids without a QP).
    pub srq: bool,
    /// The QP number (only for ids without a QP).
    pub qp_num: u32,
}

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "use the device maximum".
pub const RDMA_MAX_RESP_RES: u8 = 0xff;

/// An event channel (`struct rdma_event_channel`): a real file descriptor that is readable
/// while events wait; set `O_NONBLOCK` on it to make [`EventChannel::get_cm_event`] fail
/// with `EAGAIN` instead of blocking.
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChanInner>,
}

struct ChanInner {
    fd: EventFd,
    queue: Mutex<VecDeque<CmEvent>>,
    ids: AtomicUsize,
}

impl EventChannel {
    /// Creates an event channel (`rdma_create_event_channel`).
    ///
    /// Fails with the errno of `eventfd`.
    pub fn new() -> Result<EventChannel> {
        Ok(EventChannel {
            inner: Arc::new(ChanInner {
                fd: EventFd::new()?,
                queue: Mutex::new(VecDeque::new()),
                ids: AtomicUsize::new(0),
            }),
        })
    }

    /// The channel's descriptor (`channel->fd`).
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// Takes the next event (`rdma_get_cm_event`): blocks until one arrives, unless the
    /// descriptor is non-blocking (then `EAGAIN`). Acknowledge it with [`CmEvent::ack`].
    pub fn get_cm_event(&self) -> Result<CmEvent> {
        loop {
            self.inner.fd.wait()?;
            let ev = self
                .inner
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            if let Some(ev) = ev {
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

    fn post(&self, ev: CmEvent) {
        ev.id.inner.reported.fetch_add(1, Ordering::AcqRel);
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(ev);
        self.inner.fd.signal();
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// An event (`struct rdma_cm_event`). Acknowledge every event exactly once
/// ([`CmEvent::ack`], or by dropping it): [`CmId::destroy`] waits for the events of its id.
pub struct CmEvent {
    /// What happened.
    pub event: CmEventType,
    /// 0, a negative errno, or (REJECTED) the IB CM reject reason.
    pub status: i32,
    /// The id the event is about: for CONNECT_REQUEST, a new id for the incoming connection.
    pub id: CmId,
    /// For CONNECT_REQUEST, the listening id.
    pub listen_id: Option<CmId>,
    /// Connection parameters (private data from the peer, the peer's resources and depth as
    /// seen from this side).
    pub param: ConnParam,
    acked: bool,
}

impl CmEvent {
    /// Acknowledges the event (`rdma_ack_cm_event`).
    pub fn ack(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if !self.acked {
            self.acked = true;
            let i = &self.id.inner;
            let _g = i.lock();
            i.acked.fetch_add(1, Ordering::AcqRel);
            i.acked_cv.notify_all();
        }
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
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdState {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    Connect,
    Established,
    Disconnected,
}

struct IdState_ {
    state: IdState,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    ctx: Option<Arc<Context>>,
    engine: Option<Arc<Engine>>,
    path_mtu: Mtu,
    qp: Option<Arc<Qp>>,
    pd: Option<Arc<Pd>>,
    /// The send and receive CQs (with their channels) `create_qp` made.
    cqs: Option<[(Arc<Cq>, Arc<CompChannel>); 2]>,
    conn: Option<ConnId>,
    conn_param: ConnParam,
    starting_psn: u32,
    /// For a passive id: the REQ it answers.
    req: Option<Box<softrdma_proto::cm::ReqInfo>>,
    listening: Option<u64>,
}

struct IdInner {
    ps: PortSpace,
    context: u64,
    /// Synchronous id: its channel is private and its calls wait for their events.
    sync: bool,
    /// The last event of a synchronous id.
    last_event: Mutex<Option<(CmEventType, i32, ConnParam)>>,
    channel: EventChannel,
    state: Mutex<IdState_>,
    reported: AtomicUsize,
    acked: AtomicUsize,
    acked_cv: Condvar,
}

impl IdInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdState_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An `rdma_cm_id`: a communication endpoint of the connection manager. Handles are cheap to
/// clone (events carry one); [`CmId::destroy`] releases the id.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
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

/// Contexts and default PDs of the devices the connection manager uses, one per device
/// (`rdma_get_devices`; `rdma_create_qp` with no PD uses the device's default PD).
struct DeviceRes {
    ctx: Arc<Context>,
    pd: Arc<Pd>,
}

fn device_res(addr: IpAddr) -> Result<(Arc<Context>, Arc<Pd>)> {
    static DEVS: OnceLock<Mutex<HashMap<IpAddr, DeviceRes>>> = OnceLock::new();
    let mut m = DEVS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = m.get(&addr) {
        return Ok((d.ctx.clone(), d.pd.clone()));
    }
    let ctx = Arc::new(Device::from_addr(addr)?.open()?);
    let pd = Arc::new(ctx.alloc_pd()?);
    m.insert(
        addr,
        DeviceRes {
            ctx: ctx.clone(),
            pd: pd.clone(),
        },
    );
    Ok((ctx, pd))
}

/// Bound ports per port space: (port space, port) → the ids bound there, with their address.
type PortTable = HashMap<(u16, u16), Vec<(IpAddr, Weak<IdInner>)>>;

fn ports() -> &'static Mutex<PortTable> {
    static P: OnceLock<Mutex<PortTable>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Connection-manager ids by (device address, communication ID), and listeners by
/// (device address, service ID).
#[derive(Default)]
struct Registry {
    conns: HashMap<(IpAddr, u32), Weak<IdInner>>,
    /// Listening ids by (device address, service ID): the device's CM listens on the service
    /// ID while this list is not empty.
    listeners: HashMap<(IpAddr, u64), Vec<Weak<IdInner>>>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default()))
}

fn random_psn() -> u32 {
    crate::resources::random_u32() & 0xff_ffff
}

impl CmId {
    /// Creates an id in the port space `ps` whose events go to `channel`
    /// (`rdma_create_id`). `context` is returned in every event's id. With no channel the id
    /// is synchronous: the calls that produce an event block until it arrives, keep it as
    /// [`CmId::event`], and fail when it reports an error.
    ///
    /// Fails with `EOPNOTSUPP` for port spaces other than TCP (RC) in this version.
    pub fn create(channel: Option<&EventChannel>, context: u64, ps: PortSpace) -> Result<CmId> {
        if ps != PortSpace::Tcp {
            return Err(Error::not_supported(format!(
                "port space {ps:?} is not supported yet (only RDMA_PS_TCP)"
            )));
        }
        let sync = channel.is_none();
        let channel = match channel {
            Some(c) => c.clone(),
            None => EventChannel::new()?,
        };
        channel.inner.ids.fetch_add(1, Ordering::AcqRel);
        Ok(CmId {
            inner: Arc::new(IdInner {
                ps,
                context,
                sync,
                last_event: Mutex::new(None),
                channel,
                state: Mutex::new(IdState_ {
                    state: IdState::Idle,
                    src: None,
                    dst: None,
                    ctx: None,
                    engine: None,
                    path_mtu: Mtu::Mtu1024,
                    qp: None,
                    pd: None,
                    cqs: None,
                    conn: None,
                    conn_param: ConnParam::default(),
                    starting_psn: random_psn(),
                    req: None,
                    listening: None,
                }),
                reported: AtomicUsize::new(0),
                acked: AtomicUsize::new(0),
                acked_cv: Condvar::new(),
            }),
        })
    }

    /// The context given at creation.
    pub fn context(&self) -> u64 {
        self.inner.context
    }

    /// The device context the id is bound to, once bound (`id->verbs`).
    pub fn verbs(&self) -> Option<Arc<Context>> {
        self.inner.lock().ctx.clone()
    }

    /// The id's QP, once created (`id->qp`).
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.inner.lock().qp.clone()
    }

    /// The PD of the id's QP: the one given to `create_qp`, or the device's default PD.
    pub fn pd(&self) -> Option<Arc<Pd>> {
        let s = self.inner.lock();
        s.pd.clone()
    }

    /// The send CQ and its completion channel `create_qp` made (`id->send_cq`,
    /// `id->send_cq_channel`).
    pub fn send_cq(&self) -> Option<(Arc<Cq>, Arc<CompChannel>)> {
        self.inner.lock().cqs.as_ref().map(|c| c[0].clone())
    }

    /// The receive CQ and its completion channel `create_qp` made (`id->recv_cq`,
    /// `id->recv_cq_channel`).
    pub fn recv_cq(&self) -> Option<(Arc<Cq>, Arc<CompChannel>)> {
        self.inner.lock().cqs.as_ref().map(|c| c[1].clone())
    }

    /// The local address (`rdma_get_local_addr`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().src
    }

    /// The peer's address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().dst
    }

    /// Whether the id is synchronous (created with no channel).
    pub fn is_sync(&self) -> bool {
        self.inner.sync
    }

    /// The last event of a synchronous id (`id->event`): type, status and parameters.
    pub fn event(&self) -> Option<(CmEventType, i32, ConnParam)> {
        self.inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// For a synchronous id: waits for the event its last call produces, keeps it, and
    /// turns an error event into the errno librdmacm reports.
    fn complete(&self, want: CmEventType) -> Result<()> {
        if !self.inner.sync {
            return Ok(());
        }
        let ev = self.inner.channel.get_cm_event()?;
        let (t, status, param) = (ev.event, ev.status, ev.param.clone());
        ev.ack();
        *self
            .inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((t, status, param));
        if t == want {
            return Ok(());
        }
        let errno = match t {
            CmEventType::Rejected => libc::ECONNREFUSED,
            CmEventType::Unreachable => libc::ETIMEDOUT,
            _ if status < 0 => -status,
            _ => libc::EINVAL,
        };
        Err(Error::new(
            ErrorKind::Os(errno),
            format!("{} (status {status})", t.as_str()),
        ))
    }

    /// Takes the next connection request of a synchronous listener (`rdma_get_request`):
    /// blocks until one arrives and returns its new (synchronous) id; its request parameters
    /// are [`CmId::event`] of the new id.
    ///
    /// Fails with `EINVAL` on an asynchronous id or one that is not listening.
    pub fn get_request(&self) -> Result<CmId> {
        if !self.inner.sync || self.inner.lock().state != IdState::Listen {
            return Err(Error::invalid(
                "rdma_get_request needs a synchronous, listening id",
            ));
        }
        loop {
            let ev = self.inner.channel.get_cm_event()?;
            if ev.event == CmEventType::ConnectRequest {
                let id = ev.id.clone();
                *id.inner
                    .last_event
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) =
                    Some((ev.event, ev.status, ev.param.clone()));
                ev.ack();
                return Ok(id);
            }
            ev.ack();
        }
    }

    fn post(&self, event: CmEventType, status: i32, param: ConnParam, listen: Option<CmId>) {
        let ch = match &listen {
            Some(l) => l.inner.channel.clone(),
            None => self.inner.channel.clone(),
        };
        ch.post(CmEvent {
            event,
            status,
            id: self.clone(),
            listen_id: listen,
            param,
            acked: false,
        });
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`); port 0 picks an
    /// ephemeral port, the unspecified address binds every device.
    ///
    /// Fails with `EINVAL` when the id is already bound, `EADDRNOTAVAIL` when the address
    /// is not an address of this machine, `EADDRINUSE` when the port is taken.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut s = self.inner.lock();
        if s.state != IdState::Idle {
            return Err(Error::invalid("the id is already bound"));
        }
        if !addr.ip().is_unspecified() {
            let (ctx, _) = device_res(addr.ip())?;
            s.engine = Some(ctx.inner.shared.engine()?);
            s.ctx = Some(ctx);
        }
        let port = self.reserve_port(addr.ip(), addr.port())?;
        s.src = Some(SocketAddr::new(addr.ip(), port));
        s.state = IdState::AddrBound;
        Ok(())
    }

    fn reserve_port(&self, ip: IpAddr, port: u16) -> Result<u16> {
        let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
        let ps = self.inner.ps.to_u16();
        let clash = |t: &PortTable, port: u16| {
            t.get(&(ps, port)).is_some_and(|v| {
                v.iter().any(|(a, w)| {
                    w.strong_count() > 0 && (a == &ip || a.is_unspecified() || ip.is_unspecified())
                })
            })
        };
        let port = if port == 0 {
            let mut p = 0;
            for _ in 0..1000 {
                let cand = 32768 + (crate::resources::random_u32() % 28000) as u16;
                if !clash(&t, cand) {
                    p = cand;
                    break;
                }
            }
            if p == 0 {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    "no ephemeral port is free",
                ));
            }
            p
        } else {
            if clash(&t, port) {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("port {port} is already bound in this port space"),
                ));
            }
            port
        };
        t.entry((ps, port))
            .or_default()
            .push((ip, Arc::downgrade(&self.inner)));
        Ok(port)
    }

    /// Resolves the destination and binds the id to the device of the local address that
    /// reaches it (`rdma_resolve_addr`); ADDR_RESOLVED (or ADDR_ERROR) follows on the
    /// channel.
    ///
    /// Fails with `EINVAL` in the wrong state; the resolution's own failure arrives as
    /// ADDR_ERROR with a negative errno.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout_ms: u32,
    ) -> Result<()> {
        {
            let s = self.inner.lock();
            if !matches!(s.state, IdState::Idle | IdState::AddrBound) {
                return Err(Error::invalid("rdma_resolve_addr in the wrong state"));
            }
        }
        if let Some(src) = src {
            if self.inner.lock().state == IdState::Idle {
                self.bind_addr(src)?;
            }
        }
        let local = match self.inner.lock().src {
            Some(a) if !a.ip().is_unspecified() => Ok(a.ip()),
            _ => route_source(dst.ip()),
        };
        let res = local.and_then(|ip| {
            let (ctx, _) = device_res(ip)?;
            let engine = ctx.inner.shared.engine()?;
            Ok((ip, ctx, engine))
        });
        match res {
            Ok((ip, ctx, engine)) => {
                let unbound = self.inner.lock().state == IdState::Idle;
                let port = if unbound {
                    self.reserve_port(ip, 0)?
                } else {
                    self.inner.lock().src.map_or(0, |a| a.port())
                };
                let mut s = self.inner.lock();
                s.src = Some(SocketAddr::new(ip, port));
                s.dst = Some(dst);
                s.ctx = Some(ctx);
                s.engine = Some(engine);
                s.state = IdState::AddrResolved;
                drop(s);
                self.post(CmEventType::AddrResolved, 0, ConnParam::default(), None);
            }
            Err(e) => self.post(
                CmEventType::AddrError,
                -e.errno(),
                ConnParam::default(),
                None,
            ),
        }
        self.complete(CmEventType::AddrResolved)
    }

    /// Resolves the route (`rdma_resolve_route`): on RoCE a local computation (path MTU from
    /// the interface MTU); ROUTE_RESOLVED follows.
    ///
    /// Fails with `EINVAL` unless the address is resolved.
    pub fn resolve_route(&self, _timeout_ms: u32) -> Result<()> {
        let mut s = self.inner.lock();
        if s.state != IdState::AddrResolved {
            return Err(Error::invalid("rdma_resolve_route before ADDR_RESOLVED"));
        }
        let dev = s.ctx.as_ref().expect("resolved").device().clone();
        s.path_mtu = Mtu::for_link_mtu(dev.netdev_mtu()).unwrap_or(Mtu::Mtu1024);
        s.state = IdState::RouteResolved;
        drop(s);
        self.post(CmEventType::RouteResolved, 0, ConnParam::default(), None);
        self.complete(CmEventType::RouteResolved)
    }

    /// Creates the id's RC QP (`rdma_create_qp`): with `pd` None the device's default PD;
    /// a send CQ and a receive CQ, each with its own completion channel (cq_context = the
    /// id's context), as `rdma_create_qp` makes when none are given. The QP is left in INIT;
    /// connect/accept move it.
    ///
    /// Fails with `EINVAL` before the id is bound to a device or when it already has a QP,
    /// and like [`Pd::create_qp`].
    pub fn create_qp(&self, pd: Option<&Arc<Pd>>, cap: &mut QpCap) -> Result<Arc<Qp>> {
        self.create_qp_with_cqs(pd, None, cap)
    }

    /// `rdma_create_qp` with the application's own CQ for both queues (`send_cq` and
    /// `recv_cq` set in `qp_init_attr`): no CQ or channel is made, and the
    /// `get_send_comp`/`get_recv_comp` helpers, which need the CM's CQs, are not available.
    ///
    /// Fails like [`CmId::create_qp`], and with `EINVAL` when the CQ belongs to another
    /// device.
    pub fn create_qp_with_cq(
        &self,
        pd: Option<&Arc<Pd>>,
        cq: &Arc<Cq>,
        cap: &mut QpCap,
    ) -> Result<Arc<Qp>> {
        self.create_qp_with_cqs(pd, Some(cq), cap)
    }

    fn create_qp_with_cqs(
        &self,
        pd: Option<&Arc<Pd>>,
        own_cq: Option<&Arc<Cq>>,
        cap: &mut QpCap,
    ) -> Result<Arc<Qp>> {
        let mut s = self.inner.lock();
        let Some(ctx) = s.ctx.clone() else {
            return Err(Error::invalid("the id is not bound to a device yet"));
        };
        if s.qp.is_some() {
            return Err(Error::invalid("the id already has a QP"));
        }
        let (_, default_pd) = device_res(ctx.device().addr())?;
        let pd = pd.cloned().unwrap_or(default_pd);
        let mut made = Vec::with_capacity(2);
        if own_cq.is_none() {
            for depth in [cap.max_send_wr, cap.max_recv_wr] {
                let ch = Arc::new(ctx.create_comp_channel()?);
                let cq = Arc::new(ctx.create_cq(depth.max(1), self.inner.context, Some(&ch), 0)?);
                made.push((cq, ch));
            }
        }
        let cqs: Option<[(Arc<Cq>, Arc<CompChannel>); 2]> =
            (made.len() == 2).then(|| [made[0].clone(), made[1].clone()]);
        let (scq, rcq) = match (&cqs, own_cq) {
            (Some(c), _) => (&c[0].0, &c[1].0),
            (None, Some(cq)) => (cq, cq),
            (None, None) => unreachable!("CQs were made above"),
        };
        let mut init = QpInitAttr::new(QpType::Rc, scq, *cap);
        init.recv_cq = rcq;
        init.qp_context = self.inner.context;
        let qp = Arc::new(pd.create_qp(&mut init)?);
        *cap = init.cap;
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE.bits(),
            ..Default::default()
        };
        qp.modify_qp(
            &a,
            (QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS)
                .bits(),
        )?;
        s.qp = Some(qp.clone());
        s.pd = Some(pd);
        s.cqs = cqs;
        Ok(qp)
    }

    /// Listens for connection requests (`rdma_listen`); CONNECT_REQUEST events follow, each
    /// with a new id.
    ///
    /// Fails with `EINVAL` unless the id is bound (an unbound id is bound to the wildcard
    /// address and an ephemeral port first, as the kernel does).
    pub fn listen(&self, _backlog: i32) -> Result<()> {
        if self.inner.lock().state == IdState::Idle {
            self.bind_addr(SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let mut s = self.inner.lock();
        if s.state != IdState::AddrBound {
            return Err(Error::invalid("rdma_listen in the wrong state"));
        }
        let src = s.src.expect("bound");
        let sid = cma::service_id(self.inner.ps, src.port());
        let engines: Vec<Arc<Engine>> = match &s.engine {
            Some(e) => vec![e.clone()],
            None => crate::device::all_engines(),
        };
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        for e in &engines {
            let list = r.listeners.entry((e.local.ip(), sid)).or_default();
            list.retain(|w| w.strong_count() > 0);
            if list.iter().any(|w| {
                w.upgrade()
                    .is_some_and(|l| l.lock().src.map(|a| a.ip()) == Some(src.ip()))
            }) {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("something already listens on {src}"),
                ));
            }
            if list.is_empty() {
                // Another id may have made the CM listen and gone; listening twice is fine.
                let _ = e.with_cm(|g, _| g.cm.listen(sid));
            }
            list.push(Arc::downgrade(&self.inner));
        }
        drop(r);
        s.listening = Some(sid);
        s.state = IdState::Listen;
        Ok(())
    }

    fn resources(p: u8, max: u32) -> u8 {
        if p == RDMA_MAX_RESP_RES {
            max.min(255) as u8
        } else {
            p
        }
    }

    /// Connects to the resolved peer (`rdma_connect`): sends the IB CM REQ with the rdma_cm
    /// header; ESTABLISHED (the QP then in RTS), REJECTED or UNREACHABLE follows.
    ///
    /// Fails with `EINVAL` unless the route is resolved and the id has a QP, or when the
    /// private data exceeds 56 bytes or the resources exceed the device's limits.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut s = self.inner.lock();
        if s.state != IdState::RouteResolved {
            return Err(Error::invalid("rdma_connect before ROUTE_RESOLVED"));
        }
        let Some(qp) = s.qp.clone() else {
            return Err(Error::invalid("rdma_connect needs a QP (rdma_create_qp)"));
        };
        if param.private_data.len() > cma::MAX_PRIVATE_DATA_REQ {
            return Err(Error::invalid(format!(
                "{} bytes of private data exceed 56",
                param.private_data.len()
            )));
        }
        let ctx = s.ctx.clone().expect("resolved");
        let dev = ctx.query_device()?;
        let (src, dst) = (s.src.expect("resolved"), s.dst.expect("resolved"));
        let mut pd = vec![0u8; cma::CMA_HDR_LEN];
        CmaHeaderRepr::new(src.ip(), src.port(), dst.ip())
            .emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
        pd.extend_from_slice(&param.private_data);
        let req = ConnectRequest {
            dst: dst.ip(),
            service_id: cma::service_id(self.inner.ps, dst.port()),
            local_qpn: qp.qp_num(),
            starting_psn: s.starting_psn,
            transport: TransportServiceType::Rc,
            responder_resources: Self::resources(param.responder_resources, dev.max_qp_rd_atom),
            initiator_depth: Self::resources(param.initiator_depth, dev.max_qp_init_rd_atom),
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            flow_control: param.flow_control,
            path_mtu: s.path_mtu as u8,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            sl: 0,
            packet_rate: 0,
            private_data: pd,
        };
        let engine = s.engine.clone().expect("resolved");
        // Register the communication while the CM is locked, so that a REP processed on
        // another thread finds this id.
        let me = Arc::downgrade(&self.inner);
        let id = engine
            .with_cm(|g, now| {
                let id = g.cm.connect(now, req)?;
                registry()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .conns
                    .insert((src.ip(), id.0), me);
                Ok::<_, softrdma_proto::cm::CmError>(id)
            })
            .map_err(|e| Error::invalid(format!("connect: {e:?}")))?;
        s.conn = Some(id);
        s.conn_param = param.clone();
        s.state = IdState::Connect;
        drop(s);
        self.complete(CmEventType::Established)
    }

    /// Accepts the connection request this id was created for (`rdma_accept`): moves the QP
    /// to RTR and RTS and sends the REP; ESTABLISHED follows when the RTU arrives.
    ///
    /// Fails with `EINVAL` for an id that is not a pending request or has no QP, or private
    /// data above 196 bytes.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let s = self.inner.lock();
        let (Some(req), Some(qp), Some(conn)) = (s.req.clone(), s.qp.clone(), s.conn) else {
            return Err(Error::invalid(
                "rdma_accept needs an id from CONNECT_REQUEST with a QP",
            ));
        };
        if s.state != IdState::Connect {
            return Err(Error::invalid("rdma_accept in the wrong state"));
        }
        if param.private_data.len() > cma::MAX_PRIVATE_DATA_REP {
            return Err(Error::invalid("private data exceeds 196 bytes"));
        }
        let ctx = s.ctx.clone().expect("bound");
        let dev = ctx.query_device()?;
        let peer = s.dst.expect("set from the REQ");
        let resp = Self::resources(param.responder_resources, dev.max_qp_rd_atom)
            .min(req.responder_resources.max(1));
        let init = Self::resources(param.initiator_depth, dev.max_qp_init_rd_atom)
            .min(req.initiator_depth);
        let mtu = Mtu::from_raw(u32::from(req.path_mtu))
            .unwrap_or(Mtu::Mtu1024)
            .min_with(s.path_mtu);
        to_rtr_rts(
            &qp,
            peer.ip(),
            mtu,
            req.remote_qpn,
            req.starting_psn,
            resp,
            s.starting_psn,
            req.qp_timeout,
            req.retry_count,
            req.rnr_retry_count,
            init,
        )?;
        let engine = s.engine.clone().expect("bound");
        let params = AcceptParams {
            local_qpn: qp.qp_num(),
            starting_psn: s.starting_psn,
            responder_resources: resp,
            initiator_depth: init,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            flow_control: param.flow_control,
            private_data: param.private_data.clone(),
        };
        engine
            .with_cm(|g, now| g.cm.accept(now, conn, params))
            .map_err(|e| Error::invalid(format!("accept: {e:?}")))?;
        drop(s);
        self.complete(CmEventType::Established)
    }

    /// Rejects the connection request this id was created for (`rdma_reject`): the peer gets
    /// REJECTED with status 28 and the private data.
    ///
    /// Fails with `EINVAL` for an id that is not a pending request, or private data above
    /// 148 bytes.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let mut s = self.inner.lock();
        let (Some(conn), Some(engine)) = (s.conn, s.engine.clone()) else {
            return Err(Error::invalid(
                "rdma_reject needs an id from CONNECT_REQUEST",
            ));
        };
        if private_data.len() > cma::MAX_PRIVATE_DATA_REJ {
            return Err(Error::invalid("private data exceeds 148 bytes"));
        }
        engine
            .with_cm(|g, now| {
                g.cm.reject(now, conn, RejectReason::ConsumerDefined, private_data)
            })
            .map_err(|e| Error::invalid(format!("reject: {e:?}")))?;
        s.state = IdState::Disconnected;
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR (flushing its work), a DREQ goes
    /// out, and both sides get DISCONNECTED. On a synchronous id it returns once
    /// DISCONNECTED arrived — at once if the peer disconnected first.
    ///
    /// Fails with `EINVAL` when the id is not connected.
    pub fn disconnect(&self) -> Result<()> {
        let mut s = self.inner.lock();
        if self.inner.sync && s.state == IdState::Disconnected && s.conn.is_some() {
            // The peer disconnected first: its DISCONNECTED event is (or will be) ours.
            drop(s);
            return self.complete(CmEventType::Disconnected);
        }
        let (Some(conn), Some(engine)) = (s.conn, s.engine.clone()) else {
            return Err(Error::invalid(
                "rdma_disconnect on an id that is not connected",
            ));
        };
        if s.state != IdState::Established {
            return Err(Error::invalid(
                "rdma_disconnect on an id that is not connected",
            ));
        }
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
        engine
            .with_cm(|g, now| g.cm.disconnect(now, conn, &[]))
            .map_err(|e| Error::invalid(format!("disconnect: {e:?}")))?;
        s.state = IdState::Disconnected;
        drop(s);
        self.complete(CmEventType::Disconnected)
    }

    /// Destroys the id (`rdma_destroy_id`): waits until every event reported for it is
    /// acknowledged, then releases its port, its connection and its QP (if `create_qp` made
    /// it, with its CQ and channel).
    pub fn destroy(self) {
        let i = &self.inner;
        let mut g = i.lock();
        while i.acked.load(Ordering::Acquire) < i.reported.load(Ordering::Acquire) {
            g = i.acked_cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if let (Some(conn), Some(engine)) = (g.conn.take(), g.engine.clone()) {
            if let Some(src) = g.src {
                registry()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .conns
                    .remove(&(src.ip(), conn.0));
            }
            engine.with_cm(|gsi, now| gsi.cm.destroy(now, conn));
        }
        if let Some(src) = g.src {
            let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = t.get_mut(&(i.ps.to_u16(), src.port())) {
                v.retain(|(_, w)| {
                    w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(i))
                });
            }
        }
        if let Some(sid) = g.listening.take() {
            let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
            let mut idle = Vec::new();
            for ((ip, s2), v) in r.listeners.iter_mut() {
                if *s2 != sid {
                    continue;
                }
                v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(i)));
                if v.is_empty() {
                    idle.push(*ip);
                }
            }
            for ip in &idle {
                r.listeners.remove(&(*ip, sid));
            }
            drop(r);
            for e in crate::device::all_engines() {
                if idle.contains(&e.local.ip()) {
                    e.with_cm(|gsi, _| gsi.cm.unlisten(sid));
                }
            }
        }
        g.qp = None;
        g.pd = None;
        g.cqs = None;
        drop(g);
        i.channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The `rdma_verbs.h` helpers: memory registration on the id's PD, one-buffer posts and
/// blocking completion waits on the CQs `create_qp` made.
impl CmId {
    fn need<T: Clone>(&self, f: impl Fn(&IdState_) -> Option<T>, what: &str) -> Result<T> {
        f(&self.inner.lock()).ok_or_else(|| Error::invalid(format!("the id has no {what}")))
    }

    fn reg(&self, buf: &Arc<crate::Buffer>, access: AccessFlags) -> Result<crate::Mr> {
        self.need(|s| s.pd.clone(), "PD (rdma_create_qp first)")?
            .reg_buffer(buf, access.bits())
    }

    /// Registers `buf` for sends and receives (`rdma_reg_msgs`: LOCAL_WRITE) on the id's PD.
    ///
    /// Fails with `EINVAL` when the id has no QP yet, and like [`Pd::reg_buffer`].
    pub fn reg_msgs(&self, buf: &Arc<crate::Buffer>) -> Result<crate::Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE)
    }

    /// Registers `buf` as the target of the peer's RDMA READs (`rdma_reg_read`).
    ///
    /// Fails like [`CmId::reg_msgs`].
    pub fn reg_read(&self, buf: &Arc<crate::Buffer>) -> Result<crate::Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
    }

    /// Registers `buf` as the target of the peer's RDMA WRITEs (`rdma_reg_write`).
    ///
    /// Fails like [`CmId::reg_msgs`].
    pub fn reg_write(&self, buf: &Arc<crate::Buffer>) -> Result<crate::Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
    }

    fn sge(addr: u64, length: usize, mr: &crate::Mr) -> Result<crate::Sge> {
        let end = addr.checked_add(length as u64);
        if addr < mr.iova() || end.is_none_or(|e| e > mr.iova() + mr.length()) {
            return Err(Error::invalid("the buffer is not inside the memory region"));
        }
        Ok(crate::Sge {
            addr,
            length: length as u32,
            lkey: mr.lkey(),
        })
    }

    /// Posts one receive of `length` bytes at `addr` in `mr` (`rdma_post_recv`); `context`
    /// comes back as the completion's wr_id.
    ///
    /// Fails with `EINVAL` when the buffer is not inside `mr` or the id has no QP, and like
    /// [`Qp::post_recv`].
    pub fn post_recv(&self, context: u64, addr: u64, length: usize, mr: &crate::Mr) -> Result<()> {
        let sge = [Self::sge(addr, length, mr)?];
        self.need(|s| s.qp.clone(), "QP")?
            .post_recv(&[crate::RecvWr {
                wr_id: context,
                sg_list: &sge,
            }])
            .map_err(Error::from)
    }

    fn post_one(&self, wr: crate::SendWr<'_>) -> Result<()> {
        self.need(|s| s.qp.clone(), "QP")?
            .post_send(&[wr])
            .map_err(Error::from)
    }

    /// Sends `length` bytes at `addr` (`rdma_post_send`); with `mr` None the data go inline.
    ///
    /// Fails like [`CmId::post_recv`] and [`Qp::post_send`].
    pub fn post_send(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: Option<&crate::Mr>,
        flags: crate::SendFlags,
    ) -> Result<()> {
        let (sge, flags) = match mr {
            Some(mr) => (Self::sge(addr, length, mr)?, flags),
            None => {
                return Err(Error::invalid(
                    "inline sends need the buffer's region on softrdma (pass the MR)",
                ))
            }
        };
        let sg = [sge];
        self.post_one(crate::SendWr {
            wr_id: context,
            sg_list: &sg,
            opcode: crate::WrOpcode::Send,
            send_flags: flags,
            ..Default::default()
        })
    }

    /// RDMA-reads `length` bytes from the peer's `remote_addr` under `rkey` into `addr`
    /// (`rdma_post_read`).
    ///
    /// Fails like [`CmId::post_send`].
    #[allow(clippy::too_many_arguments)]
    pub fn post_read(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: &crate::Mr,
        flags: crate::SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let sg = [Self::sge(addr, length, mr)?];
        self.post_one(crate::SendWr {
            wr_id: context,
            sg_list: &sg,
            opcode: crate::WrOpcode::RdmaRead,
            send_flags: flags,
            remote_addr,
            rkey,
            ..Default::default()
        })
    }

    /// RDMA-writes `length` bytes at `addr` to the peer's `remote_addr` under `rkey`
    /// (`rdma_post_write`).
    ///
    /// Fails like [`CmId::post_send`].
    #[allow(clippy::too_many_arguments)]
    pub fn post_write(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: &crate::Mr,
        flags: crate::SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let sg = [Self::sge(addr, length, mr)?];
        self.post_one(crate::SendWr {
            wr_id: context,
            sg_list: &sg,
            opcode: crate::WrOpcode::RdmaWrite,
            send_flags: flags,
            remote_addr,
            rkey,
            ..Default::default()
        })
    }

    fn get_comp(&self, which: usize) -> Result<crate::WorkCompletion> {
        let (cq, ch) = self.need(|s| s.cqs.as_ref().map(|c| c[which].clone()), "CQs")?;
        let mut wc = [crate::WorkCompletion::default(); 1];
        loop {
            if cq.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            cq.req_notify_cq(false)?;
            if cq.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            let ev = ch.get_cq_event()?;
            debug_assert!(ev.is_for(&cq));
            cq.ack_cq_events(1);
        }
    }

    /// Waits for the next send completion (`rdma_get_send_comp`), sleeping on the send CQ's
    /// channel.
    ///
    /// Fails with `EINVAL` when `create_qp` made no CQs for the id.
    pub fn get_send_comp(&self) -> Result<crate::WorkCompletion> {
        self.get_comp(0)
    }

    /// Waits for the next receive completion (`rdma_get_recv_comp`).
    ///
    /// Fails like [`CmId::get_send_comp`].
    pub fn get_recv_comp(&self) -> Result<crate::WorkCompletion> {
        self.get_comp(1)
    }
}

/// The source address the kernel would use to reach `dst` (no packet is sent).
fn route_source(dst: IpAddr) -> Result<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let s = std::net::UdpSocket::bind(any).map_err(|e| Error::from_io(e, "route lookup"))?;
    s.connect(SocketAddr::new(dst, 4791))
        .map_err(|e| Error::from_io(e, format!("no route to {dst}")))?;
    Ok(s.local_addr()
        .map_err(|e| Error::from_io(e, "route lookup"))?
        .ip())
}

trait MtuMin {
    fn min_with(self, other: Mtu) -> Mtu;
}

impl MtuMin for Mtu {
    fn min_with(self, other: Mtu) -> Mtu {
        if self.bytes() <= other.bytes() {
            self
        } else {
            other
        }
    }
}

fn qp_to_err(qp: &Qp) {
    let _ = qp.modify_qp(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        QpAttrMask::STATE.bits(),
    );
}

/// Moves an RC QP from INIT to RTR and RTS with the attributes the CM negotiated.
#[allow(clippy::too_many_arguments)]
fn to_rtr_rts(
    qp: &Qp,
    peer: IpAddr,
    mtu: Mtu,
    dest_qpn: u32,
    rq_psn: u32,
    max_dest_rd_atomic: u8,
    sq_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
) -> Result<()> {
    let mut access = AccessFlags::REMOTE_WRITE;
    if max_dest_rd_atomic > 0 {
        access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    let a = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::for_ip(peer),
        path_mtu: mtu,
        dest_qp_num: dest_qpn,
        rq_psn,
        max_dest_rd_atomic,
        min_rnr_timer: 0,
        qp_access_flags: access.bits(),
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER
            | QpAttrMask::ACCESS_FLAGS)
            .bits(),
    )?;
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        timeout: timeout.clamp(1, 31),
        retry_cnt: retry_cnt.min(7),
        rnr_retry: rnr_retry.min(7),
        max_rd_atomic,
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC)
            .bits(),
    )
}

fn param_from(
    private_data: &[u8],
    resp: u8,
    init: u8,
    retry: u8,
    rnr: u8,
    srq: bool,
    qpn: u32,
) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources: resp,
        initiator_depth: init,
        flow_control: false,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq,
        qp_num: qpn,
    }
}

/// Hands the events of a device's CM to the ids they concern (called by the engine with no
/// lock held). Returns the event when no rdma_cm id is behind it (the CM is driven directly).
pub(crate) fn dispatch(engine: &Arc<Engine>, ev: ProtoEvent) -> Option<ProtoEvent> {
    let local = engine.local.ip();
    let find = |id: ConnId| -> Option<CmId> {
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .conns
            .get(&(local, id.0))
            .and_then(Weak::upgrade)
            .map(|inner| CmId { inner })
    };
    let ours = match &ev {
        ProtoEvent::ReqReceived { req, .. } => registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .listeners
            .contains_key(&(local, req.service_id)),
        ProtoEvent::RepReceived { id, .. }
        | ProtoEvent::Established { id, .. }
        | ProtoEvent::Rejected { id, .. }
        | ProtoEvent::Unreachable { id }
        | ProtoEvent::DisconnectRequested { id, .. }
        | ProtoEvent::Disconnected { id }
        | ProtoEvent::TimewaitExit { id } => find(*id).is_some(),
        _ => false,
    };
    if !ours {
        return Some(ev);
    }
    match ev {
        ProtoEvent::ReqReceived { id, src, req } => {
            let Ok((hdr, user)) = CmaHeaderRepr::parse_private_data(&req.private_data) else {
                engine.with_cm(|g, now| {
                    let _ = g.cm.reject(now, id, RejectReason::InvalidServiceId, &[]);
                });
                return None;
            };
            let listener = registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .listeners
                .get(&(local, req.service_id))
                .and_then(|v| {
                    v.iter().filter_map(Weak::upgrade).find(|l| {
                        l.lock()
                            .src
                            .is_some_and(|a| a.ip().is_unspecified() || a.ip() == hdr.dst_addr)
                    })
                })
                .map(|inner| CmId { inner });
            let Some(listener) = listener else {
                engine.with_cm(|g, now| {
                    let _ = g.cm.reject(now, id, RejectReason::InvalidServiceId, &[]);
                });
                return None;
            };
            // The new id of a synchronous listener is synchronous too.
            let chan = (!listener.inner.sync).then(|| listener.inner.channel.clone());
            let Ok(child) = CmId::create(chan.as_ref(), listener.inner.context, listener.inner.ps)
            else {
                return None;
            };
            let Ok((ctx, _)) = device_res(local) else {
                return None;
            };
            let port = listener.local_addr().map_or(0, |a| a.port());
            {
                let mut s = child.inner.lock();
                s.src = Some(SocketAddr::new(local, port));
                s.dst = Some(SocketAddr::new(src, hdr.src_port));
                s.path_mtu = Mtu::for_link_mtu(ctx.device().netdev_mtu()).unwrap_or(Mtu::Mtu1024);
                s.ctx = Some(ctx);
                s.engine = Some(engine.clone());
                s.conn = Some(id);
                s.state = IdState::Connect;
                s.req = Some(req.clone());
            }
            registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .conns
                .insert((local, id.0), Arc::downgrade(&child.inner));
            let p = param_from(
                user,
                req.responder_resources,
                req.initiator_depth,
                req.retry_count,
                req.rnr_retry_count,
                req.srq,
                req.remote_qpn,
            );
            child.post(CmEventType::ConnectRequest, 0, p, Some(listener));
        }
        ProtoEvent::RepReceived { id, rep } => {
            let cid = find(id)?;
            let (qp, peer, mtu, psn, retry) = {
                let s = cid.inner.lock();
                (
                    s.qp.clone(),
                    s.dst,
                    s.path_mtu,
                    s.starting_psn,
                    s.conn_param.retry_count,
                )
            };
            let (Some(qp), Some(peer)) = (qp, peer) else {
                return None;
            };
            let r = to_rtr_rts(
                &qp,
                peer.ip(),
                mtu,
                rep.remote_qpn,
                rep.starting_psn,
                rep.responder_resources,
                psn,
                rep.qp_timeout,
                retry,
                rep.rnr_retry_count,
                rep.initiator_depth,
            );
            let p = param_from(
                &rep.private_data,
                rep.responder_resources,
                rep.initiator_depth,
                retry,
                rep.rnr_retry_count,
                rep.srq,
                rep.remote_qpn,
            );
            match r.and_then(|()| {
                engine
                    .with_cm(|g, now| g.cm.send_rtu(now, id, &[]))
                    .map_err(|e| Error::invalid(format!("{e:?}")))
            }) {
                Ok(()) => {
                    cid.inner.lock().state = IdState::Established;
                    cid.post(CmEventType::Established, 0, p, None);
                }
                Err(e) => {
                    engine.with_cm(|g, now| {
                        let _ = g.cm.reject(now, id, RejectReason::ConsumerDefined, &[]);
                    });
                    qp_to_err(&qp);
                    cid.post(CmEventType::ConnectError, -e.errno(), p, None);
                }
            }
        }
        ProtoEvent::Established { id, private_data } => {
            if let Some(cid) = find(id) {
                cid.inner.lock().state = IdState::Established;
                let p = param_from(&private_data, 0, 0, 0, 0, false, 0);
                cid.post(CmEventType::Established, 0, p, None);
            }
        }
        ProtoEvent::Rejected {
            id,
            reason,
            private_data,
        } => {
            if let Some(cid) = find(id) {
                let qp = {
                    let mut s = cid.inner.lock();
                    s.state = IdState::Disconnected;
                    s.qp.clone()
                };
                if let Some(qp) = qp {
                    qp_to_err(&qp);
                }
                let p = param_from(&private_data, 0, 0, 0, 0, false, 0);
                cid.post(CmEventType::Rejected, i32::from(reason.to_u16()), p, None);
            }
        }
        ProtoEvent::Unreachable { id } => {
            if let Some(cid) = find(id) {
                cid.inner.lock().state = IdState::Disconnected;
                cid.post(
                    CmEventType::Unreachable,
                    -libc::ETIMEDOUT,
                    ConnParam::default(),
                    None,
                );
            }
        }
        ProtoEvent::DisconnectRequested { id, .. } | ProtoEvent::Disconnected { id } => {
            if let Some(cid) = find(id) {
                let qp = {
                    let mut s = cid.inner.lock();
                    s.state = IdState::Disconnected;
                    s.qp.clone()
                };
                if let Some(qp) = qp {
                    qp_to_err(&qp);
                }
                cid.post(CmEventType::Disconnected, 0, ConnParam::default(), None);
            }
        }
        ProtoEvent::TimewaitExit { id } => {
            if let Some(cid) = find(id) {
                cid.post(CmEventType::TimewaitExit, 0, ConnParam::default(), None);
            }
        }
        ProtoEvent::SidrReqReceived { .. }
        | ProtoEvent::SidrRepReceived { .. }
        | ProtoEvent::MraReceived { .. } => {}
    }
    None
}
