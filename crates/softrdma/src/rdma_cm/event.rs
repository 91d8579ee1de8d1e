//! What events say: their types (`rdma_event_str`), the connection and datagram parameters
//! they carry, and an event's contents as a synchronous id keeps them. The channels and the
//! events themselves (`rdma_create_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`) are in `objects.rs`, with the ids they name.

use crate::AhAttr;

/// `enum rdma_cm_event_type`, with librdmacm's numbering.
///
/// ```
/// use softrdma::rdma_cm::{event_str, CmEventType};
/// assert_eq!(CmEventType::from_u32(9), Some(CmEventType::Established));
/// assert_eq!(CmEventType::Established as u32, 9);
/// assert_eq!(CmEventType::Rejected.as_str(), "RDMA_CM_EVENT_REJECTED");
/// assert_eq!(event_str(99), "UNKNOWN EVENT"); // rdma_event_str
/// ```
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
    /// (call [`CmId::establish`](super::CmId::establish)).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: no answer from the peer, or a SIDR failure.
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
    /// `RDMA_CM_EVENT_ADDRINFO_RESOLVED`.
    AddrinfoResolved = 16,
    /// `RDMA_CM_EVENT_ADDRINFO_ERROR`.
    AddrinfoError = 17,
    /// `RDMA_CM_EVENT_USER`: written by [`CmId::write_cm_event`](super::CmId::write_cm_event).
    User = 18,
}

impl CmEventType {
    /// Every event type, in librdmacm's order.
    pub const ALL: [CmEventType; 19] = [
        CmEventType::AddrResolved,
        CmEventType::AddrError,
        CmEventType::RouteResolved,
        CmEventType::RouteError,
        CmEventType::ConnectRequest,
        CmEventType::ConnectResponse,
        CmEventType::ConnectError,
        CmEventType::Unreachable,
        CmEventType::Rejected,
        CmEventType::Established,
        CmEventType::Disconnected,
        CmEventType::DeviceRemoval,
        CmEventType::MulticastJoin,
        CmEventType::MulticastError,
        CmEventType::AddrChange,
        CmEventType::TimewaitExit,
        CmEventType::AddrinfoResolved,
        CmEventType::AddrinfoError,
        CmEventType::User,
    ];

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
            CmEventType::AddrinfoResolved => "RDMA_CM_EVENT_ADDRINFO_RESOLVED",
            CmEventType::AddrinfoError => "RDMA_CM_EVENT_ADDRINFO_ERROR",
            CmEventType::User => "RDMA_CM_EVENT_USER",
        }
    }

    /// The event type with librdmacm's number `n`, if there is one.
    pub fn from_u32(n: u32) -> Option<CmEventType> {
        CmEventType::ALL.get(n as usize).copied()
    }
}

/// `rdma_event_str`: the name of event number `n`, or `"UNKNOWN EVENT"`.
pub fn event_str(n: u32) -> &'static str {
    CmEventType::from_u32(n).map_or("UNKNOWN EVENT", CmEventType::as_str)
}

/// `struct rdma_conn_param`: what [`CmId::connect`](super::CmId::connect) and
/// [`CmId::accept`](super::CmId::accept) offer.
///
/// **`rnr_retry_count` is 0 in `ConnParam::default()`**, as in a zeroed C struct: the QP
/// then gives up at the first RNR NAK, so a SEND that reaches the peer before the peer has
/// posted its receive completes with `RNR_RETRY_EXC_ERR` and the connection goes to error.
/// Unless that is what you want, set it to 7 (retry for ever, what rping and most
/// librdmacm programs use), and `retry_count` to 7 against packet loss. Responder resources
/// and initiator depth of 0 forbid RDMA READ and atomics; [`super::RDMA_MAX_RESP_RES`] /
/// [`super::RDMA_MAX_INIT_DEPTH`] ask for the device maximum.
///
/// ```
/// use softrdma::rdma_cm::{ConnParam, RDMA_MAX_INIT_DEPTH, RDMA_MAX_RESP_RES};
/// let param = ConnParam {
///     private_data: b"hello".to_vec(), // at most 56 bytes on connect, 196 on accept
///     responder_resources: RDMA_MAX_RESP_RES,
///     initiator_depth: RDMA_MAX_INIT_DEPTH,
///     retry_count: 7,
///     rnr_retry_count: 7,
///     ..Default::default()
/// };
/// assert_eq!(ConnParam::default().rnr_retry_count, 0); // the trap
/// # drop(param);
/// ```
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
    /// RNR retries (3 bits; 7 = infinite). 0 (the default) fails a SEND that finds no
    /// receive posted at once: see the type's documentation.
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ (only for ids without a QP).
    pub srq: bool,
    /// The QP number (only for ids without a QP).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`: what a UD id learns from SIDR or a multicast join.
///
/// ```
/// use softrdma::rdma_cm::*;
/// use softrdma::QpCap;
/// use std::net::{IpAddr, SocketAddr};
/// let ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
/// let id = CmId::create(None, 0, PortSpace::Udp)?;
/// id.bind_addr(SocketAddr::new(ip, 0))?;
/// id.create_qp(None, &mut QpCap { max_send_wr: 4, max_recv_wr: 4, ..Default::default() })?;
/// let group = IpAddr::from(softrdma::testing::unique_multicast_group());
/// id.join_multicast(group, 0)?; // blocks for MULTICAST_JOIN
/// let ud: UdParam = id.event().unwrap().ud.unwrap();
/// assert_eq!((ud.qp_num, ud.qkey), (MULTICAST_QPN, RDMA_UDP_QKEY));
/// // Sends to the group go through an address handle made from the address vector.
/// let ah = id.pd().unwrap().create_ah(&ud.ah_attr)?;
/// # drop(ah);
/// id.leave_multicast(group)?;
/// id.destroy_qp();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UdParam {
    /// Private data from the peer (SIDR REQ or REP).
    pub private_data: Vec<u8>,
    /// Address vector of the peer or group: create an address handle from it.
    pub ah_attr: AhAttr,
    /// The remote QP number (0xFFFFFF for a multicast group).
    pub qp_num: u32,
    /// The remote Q_Key ([`super::RDMA_UDP_QKEY`]).
    pub qkey: u32,
}

/// The contents of an event, as a synchronous id keeps its last one
/// ([`CmId::event`](super::CmId::event)).
///
/// ```
/// use softrdma::rdma_cm::{CmEventType, CmId, PortSpace};
/// use std::net::{IpAddr, SocketAddr};
/// let ip: IpAddr = softrdma::testing::unique_loopback_addr().into();
/// let id = CmId::create(None, 0, PortSpace::Tcp)?;
/// id.resolve_addr(Some(SocketAddr::new(ip, 0)), SocketAddr::new(ip, 7471), 2000)?;
/// let info = id.event().unwrap();
/// assert_eq!((info.event, info.status), (CmEventType::AddrResolved, 0));
/// id.destroy();
/// # Ok::<(), softrdma::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventInfo {
    /// What happened.
    pub event: CmEventType,
    /// 0, a negative errno, or (REJECTED) the IB CM reject reason, (UNREACHABLE on a UD id)
    /// the SIDR status.
    pub status: i32,
    /// Connection parameters (connected port spaces).
    pub param: ConnParam,
    /// Datagram parameters (UD port spaces and multicast).
    pub ud: Option<UdParam>,
    /// USER: the value given to `write_cm_event`; MULTICAST_JOIN/ERROR: the join context.
    pub arg: u64,
}
