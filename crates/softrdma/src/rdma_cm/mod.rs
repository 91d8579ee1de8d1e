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
//! // Two loopback addresses no other process uses: the server's and the client's devices.
//! let server_ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
//! let client_ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
//! let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1,
//!                   max_inline_data: 64 };
//! let param = ConnParam { responder_resources: 1, initiator_depth: 1, retry_count: 7,
//!                         rnr_retry_count: 7, ..Default::default() };
//!
//! // The server: a synchronous listener on an ephemeral port.
//! let listener = CmId::create(None, 0, PortSpace::Tcp)?;
//! listener.bind_addr(SocketAddr::new(server_ip, 0))?;
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
//! id.resolve_addr(Some(SocketAddr::new(client_ip, 0)), server_addr, 2000)?;
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
mod connect;
mod dispatch;
mod ep;
mod event;
mod helpers;
mod id;
mod multicast;
mod objects;
mod qp;
mod qp_state;
mod registry;
mod rewake;
mod timeout;

pub use addrinfo::*;
#[cfg(feature = "tokio")]
pub(crate) use connect::event_error;
pub use event::{event_str, CmEventType, ConnParam, EventInfo, UdParam};
pub use objects::{CmEvent, CmId, EventChannel};
pub use registry::{device_context, get_devices, inject_device_removal, start_device};

use crate::{Cq, QpCap, QpType, Srq};

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
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

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
pub const MULTICAST_QPN: u32 = crate::provider::MULTICAST_QPN;

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
/// let ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
/// let id = CmId::create(None, 0, PortSpace::Udp)?;
/// id.bind_addr(SocketAddr::new(ip, 0))?;
/// let group = IpAddr::from(softrdma::testing::unique_multicast_group());
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
/// let ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// id.bind_addr(SocketAddr::new(ip, 0))?;
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

#[cfg(test)]
mod backlog_tests {
    use super::objects::CmId;
    use super::registry::{device_res, registry};
    use super::*;
    use softrdma_proto::cm::ConnId;
    use std::net::SocketAddr;

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
