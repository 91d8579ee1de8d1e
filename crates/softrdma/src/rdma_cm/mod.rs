//! The RDMA connection manager (librdmacm): event channels, `rdma_cm_id`s, address and route
//! resolution, and connection set-up over the IB CM on QP 1, as Linux rdma_cm does it over
//! RoCE.
//!
//! Names follow the man pages: [`EventChannel`] (`rdma_create_event_channel`), [`CmId`]
//! (`rdma_create_id`, `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`,
//! `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_destroy_id`, `rdma_create_qp`, `rdma_migrate_id`, `rdma_set_option`,
//! `rdma_init_qp_attr`, `rdma_join_multicast`, …), [`CmEvent`] (`rdma_get_cm_event`,
//! `rdma_ack_cm_event`), and the `rdma_verbs.h` helpers (`rdma_reg_msgs`, `rdma_post_send`,
//! `rdma_get_send_comp`, …) as methods of [`CmId`].
//!
//! Port spaces: `RDMA_PS_TCP` and `RDMA_PS_IB` ids make RC connections with the IB CM's
//! REQ/REP/RTU; `RDMA_PS_UDP` and `RDMA_PS_IPOIB` ids make UD QPs, find their peer with
//! SIDR_REQ/SIDR_REP and join multicast groups.
//!
//! Synchronous ids (created with no channel) block in the calls that produce an event,
//! keep it as [`CmId::event`], and turn an error event into the errno librdmacm reports
//! (REJECTED → `ECONNREFUSED`, UNREACHABLE → `ETIMEDOUT`, …).
//!
//! # A connection, end to end
//! A server and a client in one process, on two loopback addresses of its own, with
//! synchronous ids: the server exposes a buffer in the private data of its accept (a
//! [`RemoteMr`](crate::RemoteMr), 20 bytes), the client RDMA-WRITEs into it with the typed
//! face ([`CmId::write`]), then SENDs "done".
//!
//! Two things newcomers trip over are shown here:
//! - **the source address**: the route to a loopback destination starts at 127.0.0.1, so a
//!   client that must use another device names its source address in
//!   [`CmId::resolve_addr`] (`rdma_resolve_addr`'s `src_addr`);
//! - **`rnr_retry_count`**: [`ConnParam::default()`] has 0, as the C struct zeroed, so a
//!   SEND that reaches the peer before its receive is posted fails at once with
//!   `RNR_RETRY_EXC_ERR`. Use 7 (retry for ever) unless you want that.
//!
//! ```
//! use softrdma::rdma_cm::{CmId, ConnParam, PortSpace};
//! use softrdma::{Buffer, QpCap, RemoteMr, SendFlags};
//! use std::net::{IpAddr, SocketAddr};
//! use std::sync::Arc;
//! // Addresses of this process's own: 127.77.x.y serves, 127.78.x.y connects.
//! let pid = std::process::id();
//! let ip = |net: u8| IpAddr::from([127, net, (pid >> 8) as u8, pid as u8]);
//! let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1,
//!                   max_inline_data: 64 };
//! let param = ConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7,
//!                         rnr_retry_count: 7, ..Default::default() };
//!
//! // The server: a synchronous listener on an ephemeral port.
//! let listener = CmId::create(None, 0, PortSpace::Tcp)?;
//! listener.bind_addr(SocketAddr::new(ip(77), 0))?;
//! listener.listen(1)?;
//! let server_addr = listener.local_addr().unwrap();
//! let server = std::thread::spawn({
//!     let param = param.clone();
//!     move || -> softrdma::Result<Vec<u8>> {
//!         let id = listener.get_request()?; // blocks for the CONNECT_REQUEST
//!         let mut cap = cap;
//!         id.create_qp(None, &mut cap)?;
//!         let target = Arc::new(Buffer::new(64));
//!         let target_mr = id.reg_write(&target)?; // peers may WRITE it
//!         let msg = Arc::new(Buffer::new(16));
//!         let msg_mr = id.reg_msgs(&msg)?;
//!         id.recv(1, &msg_mr.slice(..)?)?; // before accepting: no RNR
//!         let private_data = target_mr.remote().to_bytes().to_vec();
//!         id.accept(&ConnParam { private_data, ..param })?; // blocks for ESTABLISHED
//!         let wc = id.get_recv_comp()?.ok()?; // "done", after the WRITE
//!         assert_eq!(wc.byte_len, 4);
//!         Ok(target.to_vec())
//!     }
//! });
//!
//! // The client.
//! let id = CmId::create(None, 0, PortSpace::Tcp)?;
//! id.resolve_addr(Some(SocketAddr::new(ip(78), 0)), server_addr, 2000)?;
//! id.resolve_route(2000)?;
//! let mut c = cap;
//! id.create_qp(None, &mut c)?;
//! id.connect(&param)?; // blocks for ESTABLISHED
//! let peer = RemoteMr::from_bytes(&id.event().unwrap().param.private_data)?;
//! let data = Arc::new(Buffer::from_slice(b"written by RDMA"));
//! let mr = id.reg_msgs(&data)?;
//! id.write(1, &mr.slice(..)?, peer.slice(8..)?, SendFlags::SIGNALED)?;
//! id.get_send_comp()?.check()?; // a failed WRITE would be an Err here
//! id.send_inline(2, b"done", SendFlags::SIGNALED)?;
//! id.get_send_comp()?.check()?;
//! let target = server.join().unwrap()?;
//! assert_eq!(&target[8..23], b"written by RDMA");
//! # Ok::<(), softrdma::Error>(())
//! ```
//!
//! Port spaces are [`PortSpace`] values (`PortSpace::Tcp`, `Udp`, `Ib`, `Ipoib`), as
//! `enum rdma_port_space`.

mod addrinfo;
mod dispatch;
mod ep;
mod event;
mod helpers;
mod multicast;
mod timeout;

pub use addrinfo::*;
pub(crate) use dispatch::dispatch;

pub use event::{event_str, CmEvent, CmEventType, ConnParam, EventChannel, EventInfo, UdParam};

use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::{
    AccessFlags, AhAttr, CompChannel, Context, Cq, Device, Gid, Mtu, Pd, Qp, QpAttr, QpAttrMask,
    QpCap, QpInitAttr, QpState, QpType, Srq, SrqInitAttr,
};
use event::GroupCount;
use softrdma_proto::cm::{
    AcceptParams, CmEvent as ProtoEvent, ConnId, ConnectRequest, RepInfo, ReqInfo,
};
use softrdma_wire::cm::{RejectReason, SidrStatus, TransportServiceType};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};

/// The port space of an id chooses its QP type and how it finds its peer: TCP and IB ids
/// connect RC QPs with REQ/REP/RTU, UDP and IPoIB ids make UD QPs and use SIDR.
///
/// ```
/// use softrdma::rdma_cm::{CmId, PortSpace};
/// use softrdma::QpType;
/// let id = CmId::create(None, 0, PortSpace::Udp)?;
/// assert_eq!((id.ps(), id.qp_type()), (PortSpace::Udp, QpType::Ud));
/// assert_eq!(PortSpace::from_u16(0x0106), Some(PortSpace::Tcp)); // RDMA_PS_TCP
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
pub use softrdma_wire::cma::PortSpace;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "use the device maximum".
pub const RDMA_MAX_RESP_RES: u8 = 0xff;
/// `RDMA_MAX_INIT_DEPTH`: "use the device maximum".
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xff;
/// The largest listen backlog, and the one a backlog of 0 or less means, unless
/// `SOFTRDMA_CM_MAX_BACKLOG` says otherwise (Linux's `net.rdma_ucm.max_backlog` default;
/// see [`max_backlog`]).
pub const MAX_BACKLOG: usize = 1024;

/// `SOFTRDMA_CM_MAX_BACKLOG`: this process's largest listen backlog, as Linux's sysctl
/// `net.rdma_ucm.max_backlog`.
const ENV_MAX_BACKLOG: &str = "SOFTRDMA_CM_MAX_BACKLOG";

/// The largest listen backlog of this process, and the one `rdma_listen` with a backlog of
/// 0 or less gets: `SOFTRDMA_CM_MAX_BACKLOG` when it holds a positive number (read once, at
/// the first call), else [`MAX_BACKLOG`]. Never fails: a value that does not parse is
/// ignored with a warning.
pub fn max_backlog() -> usize {
    static M: OnceLock<usize> = OnceLock::new();
    *M.get_or_init(|| max_backlog_from(std::env::var(ENV_MAX_BACKLOG).ok()))
}

fn max_backlog_from(v: Option<String>) -> usize {
    match v.as_deref().map(|s| s.trim().parse::<usize>()) {
        None => MAX_BACKLOG,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            tracing::warn!("{ENV_MAX_BACKLOG}={v:?} is not a positive number; using {MAX_BACKLOG}");
            MAX_BACKLOG
        }
    }
}
/// `RDMA_UDP_QKEY`: the Q_Key of every UD QP and multicast group the CM sets up.
pub use softrdma_wire::cma::RDMA_UDP_QKEY;
/// The QP number that addresses a multicast group.
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// `RDMA_OPTION_ID`: options of the id itself.
pub const RDMA_OPTION_ID: i32 = 0;
/// `RDMA_OPTION_IB`: InfiniBand options.
pub const RDMA_OPTION_IB: i32 = 1;
/// `RDMA_OPTION_ID_TOS` (u8).
pub const RDMA_OPTION_ID_TOS: i32 = 0;
/// `RDMA_OPTION_ID_REUSEADDR` (int).
pub const RDMA_OPTION_ID_REUSEADDR: i32 = 1;
/// `RDMA_OPTION_ID_AFONLY` (int).
pub const RDMA_OPTION_ID_AFONLY: i32 = 2;
/// `RDMA_OPTION_ID_ACK_TIMEOUT` (u8).
pub const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
/// `RDMA_OPTION_IB_PATH` (array of `struct ibv_path_data`).
pub const RDMA_OPTION_IB_PATH: i32 = 1;

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`: `addr` of [`JoinMcAttrEx`] is valid.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`: `join_flags` of [`JoinMcAttrEx`] is valid.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
/// `RDMA_CM_JOIN_MC_ATTR_RESERVED`: the first unknown bit.
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`: send to the group without receiving from it.
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// `RDMA_MC_JOIN_FLAG_RESERVED`: the first unknown flag.
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// An option of [`CmId::set_option`] (`rdma_set_option`).
///
/// ```
/// use softrdma::rdma_cm::{CmId, CmOption, PortSpace};
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// id.set_option(CmOption::ReuseAddr(true))?; // before binding
/// id.set_option(CmOption::Tos(32))?;
/// id.set_option(CmOption::AckTimeout(14))?; // 4.096 µs × 2^14 ≈ 67 ms
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmOption {
    /// `RDMA_OPTION_ID_TOS`: the IP type of service of the connection (REQ traffic class).
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: let other ids with this option bind the same port while
    /// none of them listens. Only before the id is bound.
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: an id bound to the IPv6 wildcard accepts only IPv6. Only
    /// before the id is bound.
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout (4.096 µs × 2^v), instead
    /// of the one derived from the path.
    AckTimeout(u8),
}

/// `struct rdma_cm_join_mc_attr_ex`: what [`CmId::join_multicast_ex`] takes.
///
/// ```
/// use softrdma::rdma_cm::*;
/// use std::net::{IpAddr, SocketAddr};
/// let pid = std::process::id();
/// let (a, b) = ((pid >> 8) as u8, pid as u8);
/// let id = CmId::create(None, 0, PortSpace::Udp)?;
/// id.bind_addr(SocketAddr::new(IpAddr::from([127, 77, a, b]), 0))?;
/// let group = IpAddr::from([239, 77, a, b]);
/// let attr = JoinMcAttrEx {
///     comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
///     join_flags: RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, // send to it, receive nothing
///     addr: Some(group),
/// };
/// id.join_multicast_ex(&attr, 9)?; // a synchronous id: blocks for MULTICAST_JOIN
/// let ev = id.event().unwrap();
/// assert_eq!((ev.event, ev.arg), (CmEventType::MulticastJoin, 9));
/// id.leave_multicast(group)?;
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JoinMcAttrEx {
    /// Which fields are valid (`RDMA_CM_JOIN_MC_ATTR_*`).
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_FULLMEMBER` or `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
    pub join_flags: u32,
    /// The group's IP address.
    pub addr: Option<IpAddr>,
}

/// What `rdma_create_qp` takes (`struct ibv_qp_init_attr`, with optional CQs: a missing one
/// is created by the connection manager with its own completion channel).
///
/// ```
/// use softrdma::rdma_cm::{CmId, CmQpInitAttr, PortSpace};
/// use softrdma::{QpCap, QpState};
/// use std::net::{IpAddr, SocketAddr};
/// use std::sync::Arc;
/// let pid = std::process::id();
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// id.bind_addr(SocketAddr::new(IpAddr::from([127, 77, (pid >> 8) as u8, pid as u8]), 0))?;
/// // One CQ of the application's for both queues (so get_send_comp cannot wait on it).
/// let cq = Arc::new(id.verbs().unwrap().create_cq(32, 0, None, 0)?);
/// let mut attr = CmQpInitAttr {
///     send_cq: Some(cq.clone()),
///     recv_cq: Some(cq),
///     cap: QpCap { max_send_wr: 16, max_recv_wr: 16, ..Default::default() },
///     sq_sig_all: true,
///     ..Default::default()
/// };
/// let qp = id.create_qp_ex(None, &mut attr)?; // the device's default PD
/// assert!(attr.cap.max_send_wr >= 16);
/// assert_eq!(qp.state(), QpState::Init); // connect/accept move it on
/// id.destroy_qp();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct CmQpInitAttr {
    /// Context of the QP's asynchronous events.
    pub qp_context: u64,
    /// The send CQ; `None`: the CM makes one (size `max_send_wr`) with a channel.
    pub send_cq: Option<Arc<Cq>>,
    /// The receive CQ; `None`: the CM makes one (size `max_recv_wr`) with a channel.
    pub recv_cq: Option<Arc<Cq>>,
    /// A shared receive queue (`None`: the id's, from [`CmId::create_srq`], if any).
    pub srq: Option<Arc<Srq>>,
    /// Requested capabilities; the actual ones are written back.
    pub cap: QpCap,
    /// The QP type; `None`: the id's (RC for TCP/IB, UD for UDP/IPoIB).
    pub qp_type: Option<QpType>,
    /// Every send work request completes, signaled or not.
    pub sq_sig_all: bool,
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
    Gone,
}

/// The connection's negotiated transport parameters, from the REQ (passive) or REP (active).
#[derive(Debug, Clone, Copy)]
struct Neg {
    remote_qpn: u32,
    remote_psn: u32,
    mtu: Mtu,
    /// Our max_dest_rd_atomic (RDMA READs/atomics we accept).
    resp: u8,
    /// Our max_rd_atomic (RDMA READs/atomics we issue).
    init: u8,
    timeout: u8,
    retry: u8,
    rnr: u8,
}

struct McGroup {
    addr: IpAddr,
    gid: Gid,
    send_only: bool,
    attached: Option<Arc<Qp>>,
    count: Arc<GroupCount>,
}

struct IdData {
    state: IdState,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    ctx: Option<Arc<Context>>,
    engine: Option<Arc<Engine>>,
    path_mtu: Mtu,
    qp: Option<Arc<Qp>>,
    pd: Option<Arc<Pd>>,
    srq: Option<Arc<Srq>>,
    send_cq: Option<Arc<Cq>>,
    recv_cq: Option<Arc<Cq>>,
    send_cq_channel: Option<Arc<CompChannel>>,
    recv_cq_channel: Option<Arc<CompChannel>>,
    conn: Option<ConnId>,
    conn_param: ConnParam,
    starting_psn: u32,
    /// For a passive id: the REQ it answers.
    req: Option<Box<ReqInfo>>,
    neg: Option<Neg>,
    listening: Option<u64>,
    /// A listener's backlog: most CONNECT_REQUESTs waiting to be taken.
    backlog: usize,
    tos: u8,
    reuseaddr: bool,
    afonly: bool,
    ack_timeout: Option<u8>,
    /// A local CONNECT_ERROR was reported: a later DISCONNECTED or REJECTED is swallowed.
    conn_error: bool,
    mcast: Vec<McGroup>,
    /// rdma_create_ep on a passive id: what rdma_get_request creates the new ids' QPs with.
    ep_attr: Option<(Option<Arc<Pd>>, CmQpInitAttr)>,
    /// rdma_create_ep: data to put before the private data of rdma_connect (`ai_connect`).
    connect_data: Vec<u8>,
}

struct ChanRef {
    channel: EventChannel,
    sync: bool,
}

struct IdInner {
    ps: PortSpace,
    qp_type: QpType,
    context: u64,
    chan: Mutex<ChanRef>,
    /// The last event of a synchronous id.
    last_event: Mutex<Option<EventInfo>>,
    state: Mutex<IdData>,
    reported: AtomicUsize,
    acked: AtomicUsize,
    acked_cv: Condvar,
    /// The result of `rdma_resolve_addrinfo`.
    addrinfo: Mutex<Option<Vec<AddrInfo>>>,
    /// A listener's CONNECT_REQUEST events not yet taken by the application.
    backlog_used: AtomicUsize,
}

impl IdInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdData> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn chan(&self) -> std::sync::MutexGuard<'_, ChanRef> {
        self.chan.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An id dropped without [`CmId::destroy`] (a panicking thread, a forgotten handle) still
/// leaves cleanly: its connection is destroyed in the CM (REJ or DREQ to the peer, so the
/// peer is not left waiting for its retries to run out) and its QP goes to ERR.
impl Drop for IdInner {
    fn drop(&mut self) {
        let me: *const IdInner = self;
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if s.state == IdState::Gone {
            return;
        }
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
        if let (Some(conn), Some(engine)) = (s.conn.take(), s.engine.clone()) {
            engine.with_cm(|g, now| g.cm.destroy(now, conn));
            // Its registry entry goes too. The registry may be locked now (by another
            // thread, or by this one around the drop of a candidate it looked up): then the
            // key waits in the orphan list, which the next lock of the registry clears. A
            // dead entry left in the map would keep this id's allocation (a `Weak` holds it)
            // for good: comm IDs are random, so no later insert replaces it.
            if let Some(src) = s.src {
                let key = (src.ip(), conn.0);
                match registry_mutex().try_lock() {
                    Ok(mut r) => {
                        if r.conns
                            .get(&key)
                            .is_some_and(|w| std::ptr::eq(w.as_ptr(), me))
                        {
                            r.conns.remove(&key);
                        }
                    }
                    Err(_) => orphans()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(key),
                }
            }
        }
        for g in s.mcast.drain(..) {
            if let Some(qp) = &g.attached {
                let _ = qp.detach_mcast(&g.gid, 0);
            }
        }
        let c = self.chan.get_mut().unwrap_or_else(|p| p.into_inner());
        c.channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
        // Out of the port table, so that its weak reference does not keep this allocation
        // (a drop under that lock, say of a handle upgraded there, leaves it to the next
        // reservation of the port, which prunes dead entries).
        if let (Some(src), Ok(mut t)) = (s.src, ports().try_lock()) {
            let key = (self.ps.to_u16(), src.port());
            if let Some(v) = t.get_mut(&key) {
                v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), me));
                if v.is_empty() {
                    t.remove(&key);
                }
            }
        }
    }
}

/// An `rdma_cm_id`: a communication endpoint of the connection manager. Handles are cheap to
/// clone (events carry one); [`CmId::destroy`] releases the id.
///
/// Created on an [`EventChannel`], an id reports what happens as events there; created with
/// none, it is synchronous: the calls that produce an event block for it and keep it as
/// [`CmId::event`]. The [module documentation](self) connects two ids end to end.
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, PortSpace};
/// use std::net::{IpAddr, SocketAddr};
/// let pid = std::process::id();
/// let ip = |net: u8| IpAddr::from([127, net, (pid >> 8) as u8, pid as u8]);
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// assert!(id.is_sync());
/// // The source address picks the device (one per local IP address); without it, the
/// // route to a loopback destination would start at 127.0.0.1.
/// id.resolve_addr(Some(SocketAddr::new(ip(78), 0)), SocketAddr::new(ip(77), 7471), 2000)?;
/// assert_eq!(id.event().unwrap().event, CmEventType::AddrResolved);
/// assert_eq!(id.local_addr().unwrap().ip(), ip(78));
/// assert_eq!(id.verbs().unwrap().device().addr(), ip(78));
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
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

/// The opened contexts of every RDMA device (`rdma_get_devices`); they stay open for the
/// life of the process, as librdmacm keeps them.
///
/// Fails like [`crate::get_device_list`] and [`Device::open`].
pub fn get_devices() -> Result<Vec<Arc<Context>>> {
    crate::get_device_list()?
        .into_iter()
        .map(|d| device_res(d.addr()).map(|(c, _)| c))
        .collect()
}

/// The context the connection manager opened for the device of the local address `addr`
/// (the one ids bound there use; opened on first use and kept for the life of the
/// process, as [`get_devices`] keeps its contexts), for listing a device that
/// [`get_devices`] does not (a loopback alias such as 127.0.0.2).
///
/// Fails like [`Device::from_addr`] (`EADDRNOTAVAIL` for an address of another machine) and
/// [`Device::open`].
pub fn device_context(addr: IpAddr) -> Result<Arc<Context>> {
    device_res(addr).map(|(c, _)| c)
}

/// Bound ports per port space: (port space, port) → the ids bound there.
type PortTable = HashMap<(u16, u16), Vec<Weak<IdInner>>>;

fn ports() -> &'static Mutex<PortTable> {
    static P: OnceLock<Mutex<PortTable>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Every live id, for device-wide events (DEVICE_REMOVAL).
fn all_ids() -> &'static Mutex<Vec<Weak<IdInner>>> {
    static A: OnceLock<Mutex<Vec<Weak<IdInner>>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(Vec::new()))
}

/// Simulates the removal of the device at `addr` (a NIC unplugged, an rxe link deleted),
/// for testing how an application handles it: every rdma_cm id bound to the device gets
/// RDMA_CM_EVENT_DEVICE_REMOVAL (after which it must be destroyed), its connection is
/// dropped without a DREQ and its QP moved to the error state (flushing its work), and every
/// context of the device opened by the connection manager gets `IBV_EVENT_DEVICE_FATAL`.
/// Wildcard listeners are not bound to one device and get nothing, as in Linux. The device
/// itself stays usable for new ids: this is an injected fault, not a real removal. Returns
/// the number of ids notified.
pub fn inject_device_removal(addr: IpAddr) -> usize {
    let ids: Vec<CmId> = {
        let mut a = all_ids().lock().unwrap_or_else(|p| p.into_inner());
        a.retain(|w| w.strong_count() > 0);
        a.iter()
            .filter_map(Weak::upgrade)
            .map(|inner| CmId { inner })
            .collect()
    };
    let mut n = 0;
    for id in ids {
        let (qp, conn, engine) = {
            let mut s = id.inner.lock();
            let bound = s.ctx.as_ref().is_some_and(|c| c.device().addr() == addr);
            if !bound || s.state == IdState::Gone {
                continue;
            }
            s.state = IdState::Disconnected;
            s.conn_error = true;
            (s.qp.clone(), s.conn, s.engine.clone())
        };
        if let Some(qp) = qp {
            qp_to_err(&qp);
        }
        if let (Some(conn), Some(engine)) = (conn, engine) {
            // The device is gone: its CM forgets the connection (no DREQ reaches the peer
            // from a removed device; the peer's QP times out or its CM sees nothing).
            registry().conns.remove(&(addr, conn.0));
            id.inner.lock().conn = None;
            engine.with_cm(|g, _| g.cm.abandon(conn));
        }
        id.post(CmEventType::DeviceRemoval, 0, ConnParam::default(), None);
        n += 1;
    }
    if let Ok((ctx, _)) = device_res(addr) {
        ctx.inner.async_events.raise(
            crate::EventType::DeviceFatal,
            crate::AsyncElement::Device,
            None,
        );
    }
    n
}

/// Wildcard listeners by service ID: engines started after `rdma_listen` listen for them too.
type Wildcards = Mutex<Vec<(u64, Weak<IdInner>)>>;

fn wildcards() -> &'static Wildcards {
    static W: OnceLock<Wildcards> = OnceLock::new();
    W.get_or_init(|| Mutex::new(Vec::new()))
}

/// A device engine has started: it listens for the wildcard listeners of its family.
pub(crate) fn engine_started(engine: &Arc<Engine>) {
    let ip = engine.local.ip();
    let live: Vec<(u64, Arc<IdInner>)> = {
        let mut w = wildcards().lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|(_, l)| l.strong_count() > 0);
        w.iter()
            .filter_map(|(sid, l)| l.upgrade().map(|l| (*sid, l)))
            .collect()
    };
    for (sid, l) in live {
        let fits = {
            let s = l.lock();
            s.state == IdState::Listen
                && s.src
                    .is_some_and(|a| a.is_ipv4() == ip.is_ipv4() || !s.afonly)
        };
        if !fits {
            continue;
        }
        let mut r = registry();
        let list = r.listeners.entry((ip, sid)).or_default();
        list.retain(|w| w.strong_count() > 0);
        if list
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&l)))
        {
            continue;
        }
        let first = list.is_empty();
        list.push(Arc::downgrade(&l));
        drop(r);
        if first {
            let _ = engine.with_cm(|g, _| g.cm.listen(sid));
        }
    }
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

fn registry_mutex() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default()))
}

/// Registry keys of ids dropped while the registry was locked (see `IdInner::drop`).
fn orphans() -> &'static Mutex<Vec<(IpAddr, u32)>> {
    static O: OnceLock<Mutex<Vec<(IpAddr, u32)>>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(Vec::new()))
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    let mut r = registry_mutex().lock().unwrap_or_else(|p| p.into_inner());
    let keys = std::mem::take(&mut *orphans().lock().unwrap_or_else(|p| p.into_inner()));
    for key in keys {
        // Only a dead entry: the key may name a newer id by now.
        if r.conns.get(&key).is_some_and(|w| w.strong_count() == 0) {
            r.conns.remove(&key);
        }
    }
    r
}

fn random_psn() -> u32 {
    crate::resources::random_u32() & 0xff_ffff
}

fn resources(p: u8, max: u32) -> u8 {
    if p == RDMA_MAX_RESP_RES {
        max.min(255) as u8
    } else {
        p
    }
}

fn errno_err(errno: i32, msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::Os(errno), msg)
}

impl CmId {
    /// Creates an id in the port space `ps` whose events go to `channel`
    /// (`rdma_create_id`). `context` is returned in every event's id. With no channel the id
    /// is synchronous: the calls that produce an event block until it arrives, keep it as
    /// [`CmId::event`], and fail when it reports an error. TCP and IB ids make RC QPs, UDP
    /// and IPoIB ids UD QPs.
    ///
    /// Fails with the errno of `eventfd` when a synchronous id cannot get its channel.
    pub fn create(channel: Option<&EventChannel>, context: u64, ps: PortSpace) -> Result<CmId> {
        let qp_type = match ps {
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
            _ => QpType::Rc,
        };
        Self::create_typed(channel, context, ps, qp_type)
    }

    fn create_typed(
        channel: Option<&EventChannel>,
        context: u64,
        ps: PortSpace,
        qp_type: QpType,
    ) -> Result<CmId> {
        let sync = channel.is_none();
        let channel = match channel {
            Some(c) => c.clone(),
            None => EventChannel::new()?,
        };
        channel.inner.ids.fetch_add(1, Ordering::AcqRel);
        let id = CmId {
            inner: Arc::new(IdInner {
                ps,
                qp_type,
                context,
                chan: Mutex::new(ChanRef { channel, sync }),
                last_event: Mutex::new(None),
                state: Mutex::new(IdData {
                    state: IdState::Idle,
                    src: None,
                    dst: None,
                    ctx: None,
                    engine: None,
                    path_mtu: Mtu::Mtu1024,
                    qp: None,
                    pd: None,
                    srq: None,
                    send_cq: None,
                    recv_cq: None,
                    send_cq_channel: None,
                    recv_cq_channel: None,
                    conn: None,
                    conn_param: ConnParam::default(),
                    starting_psn: random_psn(),
                    req: None,
                    neg: None,
                    listening: None,
                    backlog: max_backlog(),
                    tos: 0,
                    reuseaddr: false,
                    afonly: false,
                    ack_timeout: None,
                    conn_error: false,
                    mcast: Vec::new(),
                    ep_attr: None,
                    connect_data: Vec::new(),
                }),
                reported: AtomicUsize::new(0),
                acked: AtomicUsize::new(0),
                acked_cv: Condvar::new(),
                addrinfo: Mutex::new(None),
                backlog_used: AtomicUsize::new(0),
            }),
        };
        let mut a = all_ids().lock().unwrap_or_else(|p| p.into_inner());
        if a.len() >= 64 && a.len().is_power_of_two() {
            // Amortized: the entries of dropped ids go before the list doubles.
            a.retain(|w| w.strong_count() > 0);
        }
        a.push(Arc::downgrade(&id.inner));
        drop(a);
        Ok(id)
    }

    /// The context given at creation (`id->context`).
    pub fn context(&self) -> u64 {
        self.inner.context
    }

    /// The port space (`id->ps`).
    pub fn ps(&self) -> PortSpace {
        self.inner.ps
    }

    /// The QP type the id makes (`id->qp_type`).
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The channel the id's events go to (`id->channel`; a synchronous id's private one).
    pub fn channel(&self) -> EventChannel {
        self.inner.chan().channel.clone()
    }

    /// The device context the id is bound to, once bound (`id->verbs`).
    pub fn verbs(&self) -> Option<Arc<Context>> {
        self.inner.lock().ctx.clone()
    }

    /// The port the id is bound to (`id->port_num`): 1 once bound to a device, else 0.
    pub fn port_num(&self) -> u8 {
        u8::from(self.inner.lock().ctx.is_some())
    }

    /// The id's QP, once created (`id->qp`).
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.inner.lock().qp.clone()
    }

    /// The PD of the id's QP: the one given to `create_qp`, or the device's default PD
    /// (`id->pd`).
    pub fn pd(&self) -> Option<Arc<Pd>> {
        self.inner.lock().pd.clone()
    }

    /// The id's shared receive queue (`id->srq`).
    pub fn srq(&self) -> Option<Arc<Srq>> {
        self.inner.lock().srq.clone()
    }

    /// The send CQ of the id's QP (`id->send_cq`).
    pub fn send_cq(&self) -> Option<Arc<Cq>> {
        self.inner.lock().send_cq.clone()
    }

    /// The receive CQ of the id's QP (`id->recv_cq`).
    pub fn recv_cq(&self) -> Option<Arc<Cq>> {
        self.inner.lock().recv_cq.clone()
    }

    /// The completion channel of the send CQ the CM made (`id->send_cq_channel`); `None`
    /// when the application gave its own send CQ.
    pub fn send_cq_channel(&self) -> Option<Arc<CompChannel>> {
        self.inner.lock().send_cq_channel.clone()
    }

    /// The completion channel of the receive CQ the CM made (`id->recv_cq_channel`).
    pub fn recv_cq_channel(&self) -> Option<Arc<CompChannel>> {
        self.inner.lock().recv_cq_channel.clone()
    }

    /// The local address (`rdma_get_local_addr`); `None` while unbound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().src
    }

    /// The peer's address (`rdma_get_peer_addr`); `None` until resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().dst
    }

    /// The local port (`rdma_get_src_port`, here in host byte order); 0 while unbound.
    pub fn src_port(&self) -> u16 {
        self.local_addr().map_or(0, |a| a.port())
    }

    /// The peer's port (`rdma_get_dst_port`, here in host byte order); 0 while unknown.
    pub fn dst_port(&self) -> u16 {
        self.peer_addr().map_or(0, |a| a.port())
    }

    /// Whether the id is synchronous (created with no channel, or migrated to none).
    pub fn is_sync(&self) -> bool {
        self.inner.chan().sync
    }

    /// The last event of a synchronous id (`id->event`).
    pub fn event(&self) -> Option<EventInfo> {
        self.inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_last_event(&self, info: EventInfo) {
        *self
            .inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(info);
    }

    /// For a synchronous id: waits for the event its last call produces, keeps it, and
    /// turns an error event into the errno librdmacm reports.
    fn complete(&self, want: CmEventType) -> Result<()> {
        self.complete_until(want, None)
    }

    /// [`CmId::complete`], waiting until `deadline` at most (then `ETIMEDOUT`, and the event
    /// stays on the id's channel for the next taker).
    fn complete_until(
        &self,
        want: CmEventType,
        deadline: Option<std::time::Instant>,
    ) -> Result<()> {
        let ch = {
            let c = self.inner.chan();
            if !c.sync {
                return Ok(());
            }
            c.channel.clone()
        };
        let ev = match deadline {
            None => ch.get_cm_event()?,
            Some(d) => {
                ch.get_cm_event_timeout(d.saturating_duration_since(std::time::Instant::now()))?
            }
        };
        let info = ev.info();
        ev.ack();
        self.set_last_event(info.clone());
        if info.event == want {
            return Ok(());
        }
        Err(event_error(&info))
    }

    /// Takes the next connection request of a synchronous listener (`rdma_get_request`):
    /// blocks until one arrives and returns its new (synchronous) id, whose
    /// [`CmId::event`] holds the request's parameters. If the listener was made by
    /// [`CmId::create_ep`] with QP attributes, the new id gets its QP (on the listener's PD).
    ///
    /// Fails with `EINVAL` on an asynchronous id or one that is not listening, with the
    /// event's error when something else than a connection request arrives, and like
    /// [`CmId::create_qp_ex`].
    pub fn get_request(&self) -> Result<CmId> {
        self.get_request_until(None)
    }

    fn get_request_until(&self, deadline: Option<std::time::Instant>) -> Result<CmId> {
        // (The channel lock is never held while the state lock is taken: the event path
        // takes them the other way round.)
        let listening = self.inner.lock().state == IdState::Listen;
        let ch = {
            let c = self.inner.chan();
            if !c.sync || !listening {
                return Err(Error::invalid(
                    "rdma_get_request needs a synchronous, listening id",
                ));
            }
            c.channel.clone()
        };
        let ev = match deadline {
            None => ch.get_cm_event()?,
            Some(d) => {
                ch.get_cm_event_timeout(d.saturating_duration_since(std::time::Instant::now()))?
            }
        };
        let info = ev.info();
        if info.event != CmEventType::ConnectRequest {
            ev.ack();
            return Err(event_error(&info));
        }
        let id = ev.id.clone();
        id.set_last_event(info);
        ev.ack();
        let ep = self.inner.lock().ep_attr.clone();
        if let Some((pd, mut attr)) = ep {
            if let Err(e) = id.create_qp_ex(pd.as_ref(), &mut attr) {
                let _ = id.reject(&[]);
                id.destroy();
                return Err(e);
            }
        }
        Ok(id)
    }

    fn post_ev(&self, mut ev: CmEvent, listen: Option<&CmId>) {
        let ch = match listen {
            Some(l) => l.channel(),
            None => self.channel(),
        };
        ev.listen_id = listen.cloned();
        ch.post(ev);
    }

    fn post(&self, event: CmEventType, status: i32, param: ConnParam, listen: Option<CmId>) {
        self.post_ev(
            CmEvent::new(event, status, self.clone(), None, param),
            listen.as_ref(),
        );
    }

    fn post_ud(&self, event: CmEventType, status: i32, ud: UdParam, listen: Option<&CmId>) {
        let mut ev = CmEvent::new(event, status, self.clone(), None, ConnParam::default());
        ev.ud = Some(ud);
        self.post_ev(ev, listen);
    }

    /// Writes an event of type USER with `status` and `arg` to the id's channel
    /// (`rdma_write_cm_event`), e.g. to wake a thread waiting in
    /// [`EventChannel::get_cm_event`].
    ///
    /// Fails with `EINVAL` for any other event type.
    pub fn write_cm_event(&self, event: CmEventType, status: i32, arg: u64) -> Result<()> {
        if event != CmEventType::User {
            return Err(Error::invalid(
                "rdma_write_cm_event writes USER events only",
            ));
        }
        let mut ev = CmEvent::new(event, status, self.clone(), None, ConnParam::default());
        ev.arg = arg;
        self.post_ev(ev, None);
        Ok(())
    }

    /// Sets an option (`rdma_set_option`).
    ///
    /// Fails with `EINVAL` for `ReuseAddr`/`AfOnly` once the id is bound.
    pub fn set_option(&self, opt: CmOption) -> Result<()> {
        let mut s = self.inner.lock();
        match opt {
            CmOption::Tos(t) => s.tos = t,
            CmOption::AckTimeout(t) => s.ack_timeout = Some(t.min(31)),
            CmOption::ReuseAddr(v) | CmOption::AfOnly(v) => {
                if s.state != IdState::Idle {
                    return Err(Error::invalid(
                        "REUSEADDR and AFONLY must be set before the id is bound",
                    ));
                }
                if matches!(opt, CmOption::ReuseAddr(_)) {
                    s.reuseaddr = v;
                } else {
                    s.afonly = v;
                }
            }
        }
        Ok(())
    }

    /// `rdma_set_option` with C's arguments: `level`, `optname` and the option's bytes in
    /// native byte order (u8 for TOS and ACK_TIMEOUT, a C int for REUSEADDR and AFONLY).
    ///
    /// Fails with `EINVAL` when the length does not fit the option (or as
    /// [`CmId::set_option`]), `ENOSYS` for an unknown option, and `EOPNOTSUPP` for
    /// `RDMA_OPTION_IB_PATH` (RoCE paths come from the local route table).
    pub fn set_option_raw(&self, level: i32, optname: i32, optval: &[u8]) -> Result<()> {
        let int = |v: &[u8]| -> Result<bool> {
            let b: [u8; 4] = v
                .try_into()
                .map_err(|_| Error::invalid("the option takes a C int (4 bytes)"))?;
            Ok(i32::from_ne_bytes(b) != 0)
        };
        let byte = |v: &[u8]| -> Result<u8> {
            match v {
                [b] => Ok(*b),
                _ => Err(Error::invalid("the option takes one byte")),
            }
        };
        let opt = match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => CmOption::Tos(byte(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => CmOption::ReuseAddr(int(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => CmOption::AfOnly(int(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => CmOption::AckTimeout(byte(optval)?),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                return Err(Error::not_supported(
                    "RDMA_OPTION_IB_PATH: on RoCE the path comes from the local route",
                ))
            }
            _ => {
                return Err(errno_err(
                    libc::ENOSYS,
                    format!("unknown option level {level} name {optname}"),
                ))
            }
        };
        self.set_option(opt)
    }

    /// Moves the id and its waiting events to another channel, or (`None`) makes it
    /// synchronous (`rdma_migrate_id`). Waits until every event already taken for the id is
    /// acknowledged.
    ///
    /// Fails with `EINVAL` when a synchronous id is migrated to `None`, and with the errno
    /// of `eventfd` when a private channel cannot be made.
    pub fn migrate_id(&self, channel: Option<&EventChannel>) -> Result<()> {
        if self.is_sync() && channel.is_none() {
            return Err(Error::invalid("the id is already synchronous"));
        }
        let new = match channel {
            Some(ch) => ch.clone(),
            None => EventChannel::new()?,
        };
        // Before the channel lock: the event path takes the state lock, then the channel's.
        self.wait_acked();
        let mut c = self.inner.chan();
        let me = self.clone();
        let moved = c.channel.remove_queued(|ev| ev.id == me);
        for ev in moved {
            new.post(ev);
        }
        new.inner.ids.fetch_add(1, Ordering::AcqRel);
        c.channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
        c.channel = new;
        c.sync = channel.is_none();
        Ok(())
    }

    fn wait_acked(&self) {
        let i = &self.inner;
        let mut g = i.lock();
        while i.acked.load(Ordering::Acquire) < i.reported.load(Ordering::Acquire) {
            g = i.acked_cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
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
            let engine = ctx.inner.shared.engine()?;
            let port = self.reserve_port(&s, addr.ip(), addr.port())?;
            s.engine = Some(engine);
            s.ctx = Some(ctx);
            s.src = Some(SocketAddr::new(addr.ip(), port));
        } else {
            let port = self.reserve_port(&s, addr.ip(), addr.port())?;
            s.src = Some(SocketAddr::new(addr.ip(), port));
        }
        s.state = IdState::AddrBound;
        Ok(())
    }

    fn reserve_port(&self, me: &IdData, ip: IpAddr, port: u16) -> Result<u16> {
        let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
        let ps = self.inner.ps.to_u16();
        let my_reuse = me.reuseaddr;
        let clash = |t: &PortTable, port: u16| {
            t.get(&(ps, port)).is_some_and(|v| {
                v.iter().filter_map(Weak::upgrade).any(|o| {
                    if Arc::ptr_eq(&o, &self.inner) {
                        return false;
                    }
                    let s = o.lock();
                    let Some(a) = s.src else { return false };
                    let overlap = a.ip() == ip
                        || (a.ip().is_unspecified() && (a.is_ipv4() == ip.is_ipv4() || !s.afonly))
                        || (ip.is_unspecified() && (a.is_ipv4() == ip.is_ipv4() || !me.afonly));
                    let shared = my_reuse && s.reuseaddr && s.state != IdState::Listen;
                    overlap && !shared
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
        let v = t.entry((ps, port)).or_default();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(&self.inner));
        Ok(port)
    }

    /// Resolves the destination and binds the id to the device of the local address that
    /// reaches it (`rdma_resolve_addr`); `src`, when given, binds the id first as
    /// [`CmId::bind_addr`] does. ADDR_RESOLVED (or ADDR_ERROR) follows on the channel.
    ///
    /// Fails with `EINVAL` in the wrong state or for a destination of another family than
    /// the source, like [`CmId::bind_addr`] for `src`; the resolution's own failure arrives
    /// as ADDR_ERROR with a negative errno (`-EADDRNOTAVAIL`: no softrdma device owns the
    /// source address; `-ENETUNREACH`: no route).
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
            if let Some(a) = s.src {
                if !a.ip().is_unspecified() && a.is_ipv4() != dst.is_ipv4() {
                    return Err(Error::invalid(
                        "the destination's family differs from the bound address",
                    ));
                }
            }
        }
        if let Some(src) = src {
            if self.inner.lock().state == IdState::Idle {
                self.bind_addr(src)?;
            }
        }
        self.inner.lock().dst = Some(dst);
        let local = match self.inner.lock().src {
            Some(a) if !a.ip().is_unspecified() => Ok(a.ip()),
            _ => route_source(dst.ip()),
        };
        let res = local.and_then(|ip| {
            let (ctx, _) = device_res(ip)?;
            let engine = ctx.inner.shared.engine()?;
            Ok((ip, ctx, engine))
        });
        let res = res.and_then(|(ip, ctx, engine)| {
            let mut s = self.inner.lock();
            let port = if s.state == IdState::Idle {
                self.reserve_port(&s, ip, 0)?
            } else {
                s.src.map_or(0, |a| a.port())
            };
            s.src = Some(SocketAddr::new(ip, port));
            s.ctx = Some(ctx);
            s.engine = Some(engine);
            s.state = IdState::AddrResolved;
            Ok(())
        });
        match res {
            Ok(()) => self.post(CmEventType::AddrResolved, 0, ConnParam::default(), None),
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

    fn clear_qp(s: &mut IdData) {
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

    fn attr_for(&self, s: &IdData, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
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
    fn qp_to_rts(&self, s: &IdData) -> Result<()> {
        let Some(qp) = s.qp.clone() else {
            return Ok(());
        };
        modify_to(&qp, self.attr_for(s, QpState::Rtr))?;
        modify_to(&qp, self.attr_for(s, QpState::Rts))
    }

    /// Listens for connection requests (`rdma_listen`); CONNECT_REQUEST events follow, each
    /// with a new id. At most `backlog` requests (0 or less, or above [`max_backlog`]: that
    /// maximum, 1024 unless `SOFTRDMA_CM_MAX_BACKLOG` sets it) wait to be taken with
    /// [`EventChannel::get_cm_event`]; one beyond is dropped unanswered and forgotten, as
    /// Linux drops it, so that the peer's CM retries it later (its REQ timer, about 4 s a
    /// try): the memory a flood of requests takes is bounded by the backlog, whether or not
    /// the application ever takes them. An id bound to a specific address listens on that device, one bound to
    /// the wildcard on every device (including those started later by this process, once
    /// they exist when the request arrives).
    ///
    /// Fails with `EINVAL` in the wrong state (an unbound id is bound to the wildcard address
    /// and an ephemeral port first, as the kernel does) and `EADDRINUSE` when another id
    /// listens on the same address and port.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        if self.inner.lock().state == IdState::Idle {
            self.bind_addr(SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let mut s = self.inner.lock();
        if s.state != IdState::AddrBound {
            return Err(Error::invalid("rdma_listen in the wrong state"));
        }
        let src = s.src.expect("bound");
        let sid = cma::service_id(self.inner.ps, src.port());
        let wildcard = s.engine.is_none();
        if wildcard {
            // Every device of this machine listens, as the kernel's wildcard listen does:
            // start the engines of the local addresses (one owned by another process is
            // left to it), and remember the service ID for engines started later.
            drop(s);
            wildcards()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((sid, Arc::downgrade(&self.inner)));
            for d in crate::get_device_list().unwrap_or_default() {
                if d.addr().is_ipv4() == src.is_ipv4() || !self.inner.lock().afonly {
                    if let Err(e) = device_res(d.addr()).and_then(|(c, _)| c.inner.shared.engine())
                    {
                        tracing::debug!(addr = %d.addr(), error = %e, "wildcard listen skips a device");
                    }
                }
            }
            s = self.inner.lock();
        }
        let engines: Vec<Arc<Engine>> = match &s.engine {
            Some(e) => vec![e.clone()],
            None => crate::device::all_engines(),
        };
        {
            let t = ports().lock().unwrap_or_else(|p| p.into_inner());
            let busy = t
                .get(&(self.inner.ps.to_u16(), src.port()))
                .is_some_and(|v| {
                    v.iter().filter_map(Weak::upgrade).any(|o| {
                        !Arc::ptr_eq(&o, &self.inner) && {
                            let os = o.lock();
                            os.state == IdState::Listen
                                && os.src.is_some_and(|a| {
                                    a.ip() == src.ip()
                                        || a.ip().is_unspecified()
                                        || src.ip().is_unspecified()
                                })
                        }
                    })
                });
            if busy {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("something already listens on {src}"),
                ));
            }
        }
        let mut r = registry();
        for e in &engines {
            let list = r.listeners.entry((e.local.ip(), sid)).or_default();
            list.retain(|w| w.strong_count() > 0);
            if list.is_empty() {
                // Another id may have made the CM listen and gone; listening twice is fine.
                let _ = e.with_cm(|g, _| g.cm.listen(sid));
            }
            list.push(Arc::downgrade(&self.inner));
        }
        drop(r);
        s.listening = Some(sid);
        let max = max_backlog();
        s.backlog = match usize::try_from(backlog) {
            Ok(b) if b > 0 && b <= max => b,
            _ => max,
        };
        s.state = IdState::Listen;
        Ok(())
    }

    /// Connects to the resolved peer (`rdma_connect`). RC: sends the IB CM REQ with the
    /// rdma_cm header; ESTABLISHED follows (the QP then in RTS), or CONNECT_RESPONSE when the
    /// id has no QP (then call [`CmId::establish`]), REJECTED or UNREACHABLE. UD: sends a
    /// SIDR_REQ; ESTABLISHED carries the peer's QPN and Q_Key in [`CmEvent::ud`], or
    /// UNREACHABLE (status: the SIDR status, or `-ETIMEDOUT`). On a synchronous id it
    /// returns once that event came, failing with `ECONNREFUSED` (REJECTED), `ETIMEDOUT`
    /// (UNREACHABLE) or the event's errno.
    ///
    /// Fails with `EINVAL` unless the route is resolved, when an RC id has neither a QP nor
    /// `param.qp_num`, when the private data exceeds 56 bytes (UD: 180), or when the
    /// resources exceed the device's limits.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        self.connect_until(param, None)
    }

    fn connect_until(&self, param: &ConnParam, deadline: Option<std::time::Instant>) -> Result<()> {
        let mut s = self.inner.lock();
        if s.state != IdState::RouteResolved {
            return Err(Error::invalid("rdma_connect before ROUTE_RESOLVED"));
        }
        let ud = self.inner.qp_type == QpType::Ud
            || s.qp.as_ref().is_some_and(|q| q.qp_type() == QpType::Ud);
        let mut user = s.connect_data.clone();
        user.extend_from_slice(&param.private_data);
        let max = if ud {
            cma::MAX_PRIVATE_DATA_SIDR_REQ
        } else {
            cma::MAX_PRIVATE_DATA_REQ
        };
        if user.len() > max {
            return Err(Error::invalid(format!(
                "{} bytes of private data exceed {max}",
                user.len()
            )));
        }
        let (qpn, srq, uc) = match &s.qp {
            Some(qp) => (qp.qp_num(), s.srq.is_some(), qp.qp_type() == QpType::Uc),
            None if ud => (0, false, false),
            None if param.qp_num != 0 => (param.qp_num, param.srq, false),
            None => {
                return Err(Error::invalid(
                    "rdma_connect needs a QP (rdma_create_qp) or param.qp_num",
                ))
            }
        };
        let ctx = s.ctx.clone().expect("resolved");
        let dev = ctx.query_device()?;
        for (v, lim, what) in [
            (
                param.responder_resources,
                dev.max_qp_rd_atom,
                "responder_resources",
            ),
            (
                param.initiator_depth,
                dev.max_qp_init_rd_atom,
                "initiator_depth",
            ),
        ] {
            if v != RDMA_MAX_RESP_RES && u32::from(v) > lim {
                return Err(Error::invalid(format!(
                    "{what} {v} exceeds the device's {lim}"
                )));
            }
        }
        let (src, dst) = (s.src.expect("resolved"), s.dst.expect("resolved"));
        let mut pd = vec![0u8; cma::CMA_HDR_LEN];
        CmaHeaderRepr::new(src.ip(), src.port(), dst.ip())
            .emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
        pd.extend_from_slice(&user);
        let service_id = cma::service_id(self.inner.ps, dst.port());
        let engine = s.engine.clone().expect("resolved");
        let me = Arc::downgrade(&self.inner);
        let register = |id: ConnId| {
            registry().conns.insert((src.ip(), id.0), me.clone());
        };
        let id = if ud {
            engine.with_cm(|g, now| {
                let id = g.cm.sidr_request(now, dst.ip(), service_id, &pd)?;
                register(id);
                Ok::<_, softrdma_proto::cm::CmError>(id)
            })
        } else {
            let req = ConnectRequest {
                dst: dst.ip(),
                service_id,
                local_qpn: qpn,
                starting_psn: s.starting_psn,
                transport: if uc {
                    TransportServiceType::Uc
                } else {
                    TransportServiceType::Rc
                },
                responder_resources: resources(param.responder_resources, dev.max_qp_rd_atom),
                initiator_depth: resources(param.initiator_depth, dev.max_qp_init_rd_atom),
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                srq,
                flow_control: param.flow_control,
                path_mtu: s.path_mtu as u8,
                traffic_class: s.tos,
                hop_limit: 64,
                flow_label: 0,
                sl: 0,
                packet_rate: 0,
                private_data: pd,
            };
            // Register the communication while the CM is locked, so that a REP processed
            // on another thread finds this id.
            engine.with_cm(|g, now| {
                let id = g.cm.connect(now, req)?;
                register(id);
                Ok::<_, softrdma_proto::cm::CmError>(id)
            })
        }
        .map_err(|e| cm_error("connect", e))?;
        s.conn = Some(id);
        s.conn_param = param.clone();
        s.state = IdState::Connect;
        drop(s);
        self.complete_until(CmEventType::Established, deadline)
    }

    /// Completes a connection whose id has no QP (`rdma_establish`), after CONNECT_RESPONSE:
    /// sends the RTU (the passive side then gets ESTABLISHED). Move the QP to RTR and RTS
    /// first with [`CmId::init_qp_attr`].
    ///
    /// Fails with `EINVAL` when the id has a QP or no connection response is pending.
    pub fn establish(&self) -> Result<()> {
        let mut s = self.inner.lock();
        if s.qp.is_some() {
            return Err(Error::invalid("rdma_establish is for ids without a QP"));
        }
        let (Some(conn), Some(engine), IdState::Connect, Some(_)) =
            (s.conn, s.engine.clone(), s.state, s.neg)
        else {
            return Err(Error::invalid("no connection response is pending"));
        };
        engine
            .with_cm(|g, now| g.cm.send_rtu(now, conn, &[]))
            .map_err(|e| cm_error("establish", e))?;
        s.state = IdState::Established;
        Ok(())
    }

    /// Accepts the connection request this id was created for (`rdma_accept`). RC: moves
    /// the QP to RTR and RTS (an id without a QP uses `param.qp_num`; the application moves
    /// its QP) and sends the REP; ESTABLISHED follows when the RTU arrives (a synchronous id
    /// waits for it). UD: answers the SIDR_REQ with the QP number and [`RDMA_UDP_QKEY`]; no
    /// event follows. Responder resources and initiator depth of 0xFF mean the device
    /// maximum; both are clipped to what the requester offered.
    ///
    /// Fails with `EINVAL` for an id that is not a pending request, has no QP and no
    /// `param.qp_num`, private data above 196 bytes (UD: 136), or resources above the
    /// device's limits.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut s = self.inner.lock();
        let (Some(conn), Some(engine)) = (s.conn, s.engine.clone()) else {
            return Err(Error::invalid(
                "rdma_accept needs an id from CONNECT_REQUEST",
            ));
        };
        if s.state != IdState::Connect || s.listening.is_some() {
            return Err(Error::invalid("rdma_accept in the wrong state"));
        }
        if self.inner.qp_type == QpType::Ud {
            if param.private_data.len() > cma::MAX_PRIVATE_DATA_SIDR_REP {
                return Err(Error::invalid("private data exceeds 136 bytes"));
            }
            let qpn = s.qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
            engine
                .with_cm(|g, now| {
                    g.cm.sidr_reply(
                        now,
                        conn,
                        SidrStatus::Success,
                        qpn,
                        RDMA_UDP_QKEY,
                        &param.private_data,
                    )
                })
                .map_err(|e| cm_error("accept", e))?;
            s.state = IdState::Established;
            return Ok(());
        }
        let Some(req) = s.req.clone() else {
            return Err(Error::invalid("rdma_accept without a request"));
        };
        let qpn = match &s.qp {
            Some(q) => q.qp_num(),
            None if param.qp_num != 0 => param.qp_num,
            None => {
                return Err(Error::invalid(
                    "rdma_accept needs a QP (rdma_create_qp) or param.qp_num",
                ))
            }
        };
        if param.private_data.len() > cma::MAX_PRIVATE_DATA_REP {
            return Err(Error::invalid("private data exceeds 196 bytes"));
        }
        let ctx = s.ctx.clone().expect("bound");
        let dev = ctx.query_device()?;
        for (v, lim, what) in [
            (
                param.responder_resources,
                dev.max_qp_rd_atom,
                "responder_resources",
            ),
            (
                param.initiator_depth,
                dev.max_qp_init_rd_atom,
                "initiator_depth",
            ),
        ] {
            if v != RDMA_MAX_RESP_RES && u32::from(v) > lim {
                return Err(Error::invalid(format!(
                    "{what} {v} exceeds the device's {lim}"
                )));
            }
        }
        // The request's values are already from our point of view (swapped).
        let resp =
            resources(param.responder_resources, dev.max_qp_rd_atom).min(req.responder_resources);
        let init =
            resources(param.initiator_depth, dev.max_qp_init_rd_atom).min(req.initiator_depth);
        if let Some(n) = s.neg.as_mut() {
            n.resp = resp;
            n.init = init;
            n.rnr = req.rnr_retry_count;
        }
        if let Err(e) = self.qp_to_rts(&s) {
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            return Err(e);
        }
        let params = AcceptParams {
            local_qpn: qpn,
            starting_psn: s.starting_psn,
            responder_resources: resp,
            initiator_depth: init,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: s.srq.is_some() || (s.qp.is_none() && param.srq),
            flow_control: param.flow_control,
            private_data: param.private_data.clone(),
        };
        if let Err(e) = engine.with_cm(|g, now| g.cm.accept(now, conn, params)) {
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            return Err(Error::invalid(format!("accept: {e:?}")));
        }
        drop(s);
        self.complete(CmEventType::Established)
    }

    /// Rejects the connection request this id was created for (`rdma_reject`): the peer gets
    /// REJECTED with status 28 and the private data (UD: a SIDR_REP with status 2, which the
    /// peer sees as UNREACHABLE with status 2).
    ///
    /// Fails with `EINVAL` for an id that is not a pending request, or private data above
    /// 148 bytes (UD: 136).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::ConsumerDefined, private_data)
    }

    /// Rejects with reason 35, "vendor option not supported" (`rdma_reject_ece`).
    ///
    /// Fails like [`CmId::reject`].
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::from_u16(35), private_data)
    }

    fn reject_with(&self, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        let mut s = self.inner.lock();
        let (Some(conn), Some(engine), IdState::Connect, None) =
            (s.conn, s.engine.clone(), s.state, s.listening)
        else {
            return Err(Error::invalid(
                "rdma_reject needs an id from CONNECT_REQUEST",
            ));
        };
        let r = if self.inner.qp_type == QpType::Ud {
            if private_data.len() > cma::MAX_PRIVATE_DATA_SIDR_REP {
                return Err(Error::invalid("private data exceeds 136 bytes"));
            }
            engine.with_cm(|g, now| {
                g.cm.sidr_reply(now, conn, SidrStatus::Reject, 0, 0, private_data)
            })
        } else {
            if private_data.len() > cma::MAX_PRIVATE_DATA_REJ {
                return Err(Error::invalid("private data exceeds 148 bytes"));
            }
            engine.with_cm(|g, now| g.cm.reject(now, conn, reason, private_data))
        };
        r.map_err(|e| cm_error("reject", e))?;
        s.state = IdState::Disconnected;
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR (flushing its work), a DREQ goes
    /// out, and both sides get DISCONNECTED. On a synchronous id it returns once
    /// DISCONNECTED arrived — at once if the peer disconnected first.
    ///
    /// Fails with `EINVAL` when the id never connected (UD ids never do).
    pub fn disconnect(&self) -> Result<()> {
        let mut s = self.inner.lock();
        if self.inner.qp_type == QpType::Ud {
            return Err(Error::invalid("rdma_disconnect on a UD id"));
        }
        if s.state == IdState::Disconnected && s.conn.is_some() {
            // The peer disconnected first (its DREQ was answered by the CM): our side only
            // has to stop its QP, as the kernel's rdma_disconnect answering a DREQ does. A
            // synchronous id keeps the DISCONNECTED that is queued for it as its event (the
            // application may also have taken it from the id's channel already).
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            drop(s);
            if self.is_sync() {
                let me = self.clone();
                let queued = self
                    .channel()
                    .remove_queued(|ev| ev.id == me && ev.event == CmEventType::Disconnected);
                if let Some(ev) = queued.first() {
                    self.set_last_event(ev.info());
                }
            }
            return Ok(());
        }
        let (Some(conn), Some(engine), IdState::Established) = (s.conn, s.engine.clone(), s.state)
        else {
            return Err(Error::invalid(
                "rdma_disconnect on an id that is not connected",
            ));
        };
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
        engine
            .with_cm(|g, now| g.cm.disconnect(now, conn, &[]))
            .map_err(|e| cm_error("disconnect", e))?;
        s.state = IdState::Disconnected;
        drop(s);
        self.complete(CmEventType::Disconnected)
    }

    /// Tells the connection manager about a QP event (`rdma_notify`): with
    /// `IBV_EVENT_COMM_EST` (data arrived on the passive side's QP before the RTU), the
    /// connection is established at once and ESTABLISHED follows. Other events are ignored,
    /// as in librdmacm.
    ///
    /// Fails with `EISCONN` when the connection is already established, `EINVAL` when the
    /// id is not a passive connection waiting for its RTU.
    pub fn notify(&self, event: crate::EventType) -> Result<()> {
        if event != crate::EventType::CommEst {
            return Ok(());
        }
        let (conn, engine, state) = {
            let s = self.inner.lock();
            (s.conn, s.engine.clone(), s.state)
        };
        if state == IdState::Established {
            return Err(errno_err(libc::EISCONN, "the connection is established"));
        }
        let (Some(conn), Some(engine), IdState::Connect) = (conn, engine, state) else {
            return Err(Error::invalid(
                "rdma_notify on an id that is not connecting",
            ));
        };
        engine
            .with_cm(|g, now| g.cm.notify_established(now, conn))
            .map_err(|e| match e {
                softrdma_proto::cm::CmError::AlreadyEstablished => {
                    errno_err(libc::EISCONN, "the connection is established")
                }
                e => Error::invalid(format!("rdma_notify: {e:?}")),
            })
    }

    /// Destroys the id (`rdma_destroy_id`): drops its events still queued (a listener's
    /// pending requests are rejected), waits until every event taken for it is
    /// acknowledged, leaves its multicast groups, and releases its port, its connection (an
    /// established one is disconnected with a DREQ) and its QP, if it still has one.
    pub fn destroy(self) {
        let me = self.clone();
        let ch = self.channel();
        let queued = ch.remove_queued(|ev| ev.id == me || ev.listen_id.as_ref() == Some(&me));
        for ev in queued {
            if ev.event == CmEventType::ConnectRequest {
                if let Some(l) = &ev.listen_id {
                    l.inner.backlog_used.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if ev.listen_id.as_ref() == Some(&me) && ev.event == CmEventType::ConnectRequest {
                let child = ev.id.clone();
                drop(ev);
                let _ = child.reject(&[]);
                child.destroy();
            }
        }
        self.wait_acked();
        let groups: Vec<McGroup> = std::mem::take(&mut self.inner.lock().mcast);
        for g in groups {
            self.drop_group(g);
        }
        let i = &self.inner;
        let mut g = i.lock();
        if let (Some(conn), Some(engine)) = (g.conn.take(), g.engine.clone()) {
            if let Some(src) = g.src {
                let mut r = registry();
                let mine = r
                    .conns
                    .get(&(src.ip(), conn.0))
                    .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(i)));
                if mine {
                    r.conns.remove(&(src.ip(), conn.0));
                }
            }
            if let Some(qp) = &g.qp {
                qp_to_err(qp);
            }
            engine.with_cm(|gsi, now| gsi.cm.destroy(now, conn));
        }
        if let Some(src) = g.src {
            let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = t.get_mut(&(i.ps.to_u16(), src.port())) {
                v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(i)));
            }
        }
        if let Some(sid) = g.listening.take() {
            wildcards()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(_, w)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(i)));
            let mut r = registry();
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
        g.state = IdState::Gone;
        g.qp = None;
        g.pd = None;
        g.srq = None;
        Self::clear_qp(&mut g);
        drop(g);
        i.chan().channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The errno of a failure of the device's CM, as the kernel's rdma_cm would report it.
fn cm_error(call: &str, e: softrdma_proto::cm::CmError) -> Error {
    use softrdma_proto::cm::CmError as E;
    let errno = match e {
        E::TooManyConnections => libc::ENOMEM,
        E::AlreadyEstablished => libc::EISCONN,
        E::AlreadyListening => libc::EADDRINUSE,
        E::UnknownId | E::InvalidState | E::PrivateDataTooLong | E::InvalidParam(_) => libc::EINVAL,
    };
    errno_err(errno, format!("rdma_{call}: {e:?}"))
}

/// The errno librdmacm reports for an event a synchronous call did not want.
pub(crate) fn event_error(info: &EventInfo) -> Error {
    let errno = match info.event {
        CmEventType::Rejected => libc::ECONNREFUSED,
        CmEventType::Unreachable if info.status > 0 => libc::ECONNREFUSED,
        CmEventType::Unreachable if info.status == -libc::ECONNREFUSED => libc::ECONNREFUSED,
        CmEventType::Unreachable => libc::ETIMEDOUT,
        _ if info.status < 0 => -info.status,
        _ => libc::EINVAL,
    };
    errno_err(
        errno,
        format!("{} (status {})", info.event.as_str(), info.status),
    )
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

fn mtu_min(a: Mtu, b: Mtu) -> Mtu {
    if a.bytes() <= b.bytes() {
        a
    } else {
        b
    }
}

fn modify_to(qp: &Qp, am: Result<(QpAttr, QpAttrMask)>) -> Result<()> {
    let (a, m) = am?;
    qp.modify_qp(&a, m.bits())
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

#[cfg(test)]
mod backlog_tests {
    use super::*;

    /// An id with a connection dropped while the registry is locked (here by this thread,
    /// as around the drop of a looked-up candidate; in a flood, by the device's thread
    /// dispatching the next request) leaves no entry behind once the registry is next used:
    /// a dead entry would keep the id's memory for good (issue 13's flood growth).
    #[test]
    fn an_id_dropped_while_the_registry_is_locked_leaves_no_entry_behind() {
        let ip: IpAddr = crate::testing::unique_loopback_addr().into();
        let (ctx, _) = device_res(ip).unwrap();
        let engine = ctx.inner.shared.engine().unwrap();
        let conn = ConnId(0x5eed_0001);
        let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
        {
            let mut s = id.inner.lock();
            s.src = Some(SocketAddr::new(ip, 7130));
            s.engine = Some(engine);
            s.conn = Some(conn);
        }
        registry()
            .conns
            .insert((ip, conn.0), Arc::downgrade(&id.inner));
        {
            let r = registry();
            assert!(r.conns.contains_key(&(ip, conn.0)));
            drop(id);
            assert!(
                r.conns
                    .get(&(ip, conn.0))
                    .is_some_and(|w| w.strong_count() == 0),
                "still there while the registry is locked"
            );
        }
        assert!(!registry().conns.contains_key(&(ip, conn.0)));
    }

    #[test]
    fn the_largest_backlog_comes_from_the_environment_or_is_1024() {
        assert_eq!(max_backlog_from(None), MAX_BACKLOG);
        assert_eq!(max_backlog_from(Some("20000".into())), 20_000);
        assert_eq!(max_backlog_from(Some(" 7\n".into())), 7);
        for bad in ["0", "-3", "many", ""] {
            assert_eq!(max_backlog_from(Some(bad.into())), MAX_BACKLOG, "{bad:?}");
        }
    }
}
