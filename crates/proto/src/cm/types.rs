//! Configuration, parameters, events, statistics and errors of the CM.

use core::fmt;
use std::net::{IpAddr, Ipv6Addr};

use softrdma_wire::cm::{RejectReason, SidrStatus, TransportServiceType};
use softrdma_wire::cma;

/// Configuration of one [`Cm`](super::Cm) (one per device / GSI endpoint).
///
/// [`CmConfig::new`] fills in the values Linux rdma_cm uses over RoCE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// The device's IP address: the source GID of emitted REQs (IPv4 as `::ffff:a.b.c.d`).
    pub local_addr: IpAddr,
    /// The local CA (node) GUID, put in REQ/REP and in the ARI of a timeout REJ.
    pub ca_guid: u64,
    /// Seed of the generator behind communication IDs and the TID high word. The owner seeds
    /// it from the OS; tests use fixed seeds for reproducibility.
    pub seed: u64,
    /// Max CM retries of REQs we send, and retries of SIDR_REQs (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// CM response timeout (5-bit IBA time) put in REQs as both local and remote CM response
    /// timeout, and the per-try timeout of SIDR_REQs (rdma_cm: 20 ≈ 4 s).
    pub cm_response_timeout: u8,
    /// Packet lifetime (5-bit IBA time) of the path (rdma_cm over RoCE: 18).
    pub packet_lifetime: u8,
    /// Local CA ACK delay (5-bit IBA time): REP target ACK delay and part of the REQ's local
    /// ACK timeout (rxe: 15).
    pub local_ack_delay: u8,
    /// Most communication records kept at once (connections in any state including timewait,
    /// SIDR requests in flight and answered). Beyond it `connect`/`sidr_request` fail and
    /// incoming REQs are rejected with reason 3 (no resources). Default
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Most passive requests (REQ and SIDR_REQ) the owner has not answered yet. Excess REQs
    /// are rejected with reason 3, excess SIDR_REQs are dropped (the requester retries).
    /// Default [`DEFAULT_MAX_PENDING_REQS`].
    pub max_pending_reqs: usize,
    /// When set, the top byte (bits 24..31) of every local communication ID (and SIDR
    /// request ID) this CM allocates: the owner's slot on a device that several processes
    /// share, so that a MAD addressed to the ID can be routed to its process. The other 24
    /// bits stay unpredictable. `None` (the default): all 32 bits are.
    pub comm_id_tag: Option<u8>,
}

/// Default [`CmConfig::max_connections`]: 262,144 communication records, the order of the
/// connections Linux's CM serves on one host (its comm IDs come from an allocator with no
/// fixed small bound). A record costs a few hundred bytes, so the bound is a guard against
/// runaway state, not a sizing: every record in it is an id the owner made or a request it
/// was handed, or a timewait that ends on its own.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1 << 18;
/// Default [`CmConfig::max_pending_reqs`]: 65,536 requests not answered yet. The owner's
/// own queue (rdma_cm's listen backlog) is meant to be the tighter bound on requests nobody
/// has looked at; this one caps requests handed to the application and left unanswered.
pub const DEFAULT_MAX_PENDING_REQS: usize = 1 << 16;

impl CmConfig {
    /// A configuration with rdma_cm's RoCE values: 15 retries, response timeout 20, packet
    /// lifetime 18, ACK delay 15, [`DEFAULT_MAX_CONNECTIONS`] connections and
    /// [`DEFAULT_MAX_PENDING_REQS`] pending requests.
    pub fn new(local_addr: IpAddr, ca_guid: u64, seed: u64) -> Self {
        CmConfig {
            local_addr,
            ca_guid,
            seed,
            max_cm_retries: cma::CMA_MAX_CM_RETRIES,
            cm_response_timeout: cma::CMA_CM_RESPONSE_TIMEOUT,
            packet_lifetime: cma::CMA_IBOE_PACKET_LIFETIME,
            local_ack_delay: 15,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_pending_reqs: DEFAULT_MAX_PENDING_REQS,
            comm_id_tag: None,
        }
    }
}

/// Handle of one communication: the local communication ID (REQ/REP/RTU/DREQ/DREP/REJ/MRA
/// "local comm ID" of the messages we send, or the SIDR request ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u32);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// Parameters of an outgoing REQ ([`Cm::connect`](super::Cm::connect)): what rdma_cm takes
/// from the QP, `rdma_conn_param` and the resolved route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Destination IP (the remote GID and where the MADs go).
    pub dst: IpAddr,
    /// Service ID (rdma_cm: `(port_space << 16) | port`, see [`cma::service_id`]).
    pub service_id: u64,
    /// Local QP number (24 bits).
    pub local_qpn: u32,
    /// Starting PSN (24 bits; rdma_cm: random): as Linux's CM uses it, the PSN the local QP
    /// receives first (its `rq_psn`), which the peer sends with.
    pub starting_psn: u32,
    /// RC or UC (RD and XRC are refused with [`CmError::InvalidParam`]).
    pub transport: TransportServiceType,
    /// RDMA read/atomic operations we accept as responder (`rdma_conn_param.responder_resources`).
    pub responder_resources: u8,
    /// RDMA read/atomic operations we issue as initiator.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits; rdma_cm clamps to 7).
    pub retry_count: u8,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control (`rdma_conn_param.flow_control`).
    pub flow_control: bool,
    /// Path MTU as the wire enum (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Traffic class (IP TOS) of the path.
    pub traffic_class: u8,
    /// Hop limit (IP TTL) of the path; ≤ 1 means subnet-local (LIDs then 0, not 0xFFFF).
    pub hop_limit: u8,
    /// Flow label of the path (20 bits).
    pub flow_label: u32,
    /// Service level (4 bits; rdma_cm derives it from the TOS, 0 by default).
    pub sl: u8,
    /// Packet rate (`enum ib_rate`, 6 bits; 0 on rxe).
    pub packet_rate: u8,
    /// Private data (≤ 92 bytes; the rdma_cm layer puts its 36-byte `cma_hdr` first).
    pub private_data: Vec<u8>,
}

/// Parameters of a REP ([`Cm::accept`](super::Cm::accept)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Local QP number (24 bits).
    pub local_qpn: u32,
    /// Starting PSN (24 bits): the PSN the local QP receives first (its `rq_psn`), as Linux's
    /// CM uses it.
    pub starting_psn: u32,
    /// Responder resources we grant (≤ the requester's initiator depth, normally).
    pub responder_resources: u8,
    /// Initiator depth we use.
    pub initiator_depth: u8,
    /// RNR retry count the requester should use toward us.
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Private data (≤ 196 bytes).
    pub private_data: Vec<u8>,
}

/// The REQ fields the rdma_cm layer needs, from the recipient's point of view (as Linux's
/// `ib_cm_req_event_param`): responder resources and initiator depth are swapped, and so are
/// the two CM response timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    /// Service ID of the REQ.
    pub service_id: u64,
    /// The requester's communication ID.
    pub remote_comm_id: u32,
    /// The requester's CA GUID.
    pub remote_ca_guid: u64,
    /// The requester's QP number: our QP's destination QPN.
    pub remote_qpn: u32,
    /// The requester's Q_Key field (0 for RC/UC).
    pub remote_qkey: u32,
    /// The requester's starting PSN: what its QP receives first, our `sq_psn` (Linux cm.c).
    pub starting_psn: u32,
    /// Responder resources for us (= the REQ's initiator depth): `max_dest_rd_atomic`.
    pub responder_resources: u8,
    /// Initiator depth for us (= the REQ's responder resources): `max_rd_atomic`.
    pub initiator_depth: u8,
    /// RC or UC (other types are rejected with reason 9 before an event is raised).
    pub transport: TransportServiceType,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Path MTU (wire enum).
    pub path_mtu: u8,
    /// Transport retry count for our QP.
    pub retry_count: u8,
    /// RNR retry count for our QP.
    pub rnr_retry_count: u8,
    /// Whether the requester uses an SRQ.
    pub srq: bool,
    /// P_Key of the REQ.
    pub partition_key: u16,
    /// Our CM response timeout (= the REQ's remote CM response timeout).
    pub local_cm_response_timeout: u8,
    /// The requester's CM response timeout (= the REQ's local CM response timeout): how long
    /// we wait for an RTU per REP retry.
    pub remote_cm_response_timeout: u8,
    /// Max CM retries of our REP.
    pub max_cm_retries: u8,
    /// Requester's GID (primary local port GID of the REQ).
    pub remote_gid: Ipv6Addr,
    /// Our GID as the requester addressed it (primary remote port GID).
    pub local_gid: Ipv6Addr,
    /// Flow label of the path.
    pub flow_label: u32,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
    /// Packet rate.
    pub packet_rate: u8,
    /// Packet lifetime derived as Linux does (REQ local ACK timeout − 1, floored at 0).
    pub packet_lifetime: u8,
    /// The QP local ACK timeout to program at RTS (Linux: the REQ's local ACK timeout, at
    /// least 1).
    pub qp_timeout: u8,
    /// The whole 92-byte private data field (rdma_cm: `cma_hdr` + user data).
    pub private_data: Vec<u8>,
}

/// The REP fields the active side needs, from its point of view (swapped like [`ReqInfo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepInfo {
    /// The responder's communication ID.
    pub remote_comm_id: u32,
    /// The responder's CA GUID.
    pub remote_ca_guid: u64,
    /// The responder's QP number: our destination QPN.
    pub remote_qpn: u32,
    /// The responder's Q_Key field.
    pub remote_qkey: u32,
    /// The responder's starting PSN: what its QP receives first, our `sq_psn` (Linux cm.c).
    pub starting_psn: u32,
    /// Responder resources for us (= REP initiator depth): `max_dest_rd_atomic`.
    pub responder_resources: u8,
    /// Initiator depth for us (= REP responder resources): `max_rd_atomic`.
    pub initiator_depth: u8,
    /// Target ACK delay of the responder.
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count for our QP.
    pub rnr_retry_count: u8,
    /// Whether the responder uses an SRQ.
    pub srq: bool,
    /// The QP local ACK timeout to program at RTS: Linux's
    /// `cm_ack_timeout(target_ack_delay, packet_lifetime)`.
    pub qp_timeout: u8,
    /// The whole 196-byte private data field.
    pub private_data: Vec<u8>,
}

/// Something the owner must know about. Private data is always the whole fixed-size field of
/// the message (the wire carries no length), as the Linux CM reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a new REQ for a listened service ID. Answer with
    /// [`accept`](super::Cm::accept), [`reject`](super::Cm::reject) or
    /// [`delay_reply`](super::Cm::delay_reply) (then one of the first two).
    ReqReceived {
        /// The new communication.
        id: ConnId,
        /// Source IP of the REQ (where replies go).
        src: IpAddr,
        /// The REQ's fields.
        req: Box<ReqInfo>,
    },
    /// Active: the REP arrived. Move the QP to RTR/RTS, then call
    /// [`send_rtu`](super::Cm::send_rtu) (or [`reject`](super::Cm::reject) on failure).
    RepReceived {
        /// The communication.
        id: ConnId,
        /// The REP's fields.
        rep: Box<RepInfo>,
    },
    /// Passive: the connection is established (RTU received, or
    /// [`notify_established`](super::Cm::notify_established) called). Not raised on the
    /// active side: there `send_rtu` returning `Ok` means established.
    Established {
        /// The communication.
        id: ConnId,
        /// The RTU's 224-byte private data (empty when established through
        /// `notify_established`).
        private_data: Vec<u8>,
    },
    /// A REJ arrived for a communication being set up (or established). The communication is
    /// gone (or in timewait, then [`CmEvent::TimewaitExit`] follows).
    Rejected {
        /// The communication.
        id: ConnId,
        /// The REJ reason (8: nobody listens; 28: rdma_reject by the peer).
        reason: RejectReason,
        /// The 148-byte private data.
        private_data: Vec<u8>,
    },
    /// No answer: REQ or REP retries exhausted, or SIDR_REQ retries exhausted. The
    /// communication is gone.
    Unreachable {
        /// The communication.
        id: ConnId,
    },
    /// The peer's host said that nothing listens on its RoCEv2 UDP port (ICMP port
    /// unreachable, see [`Cm::handle_port_unreachable`](super::Cm::handle_port_unreachable))
    /// while a REQ or SIDR_REQ waited for its first answer. The communication is gone.
    Refused {
        /// The communication.
        id: ConnId,
    },
    /// The peer disconnected (DREQ received). The CM has already answered with a DREP and
    /// entered timewait; [`CmEvent::TimewaitExit`] follows.
    DisconnectRequested {
        /// The communication.
        id: ConnId,
        /// The DREQ's 220-byte private data.
        private_data: Vec<u8>,
    },
    /// Our disconnect completed: DREP received, or DREQ retries exhausted. Timewait follows.
    /// Exactly one of `DisconnectRequested` and `Disconnected` is raised per connection.
    Disconnected {
        /// The communication.
        id: ConnId,
    },
    /// Timewait is over: the QP may be reused and the communication ID is free.
    TimewaitExit {
        /// The communication.
        id: ConnId,
    },
    /// Passive: a SIDR_REQ for a listened service ID. Answer with
    /// [`sidr_reply`](super::Cm::sidr_reply) or [`reject`](super::Cm::reject).
    SidrReqReceived {
        /// The new request.
        id: ConnId,
        /// Source IP of the SIDR_REQ.
        src: IpAddr,
        /// Service ID asked for.
        service_id: u64,
        /// P_Key of the request.
        partition_key: u16,
        /// The whole 216-byte private data (rdma_cm: `cma_hdr` + user data).
        private_data: Vec<u8>,
    },
    /// Active: the SIDR_REP arrived. The request is gone.
    SidrRepReceived {
        /// The request.
        id: ConnId,
        /// Status (0 success; 1 nobody listens; 2 rejected).
        status: SidrStatus,
        /// QP number of the service.
        qpn: u32,
        /// Q_Key of the service.
        qkey: u32,
        /// The 136-byte private data.
        private_data: Vec<u8>,
    },
    /// The peer sent an MRA: our REQ or REP timer was extended by its service timeout.
    MraReceived {
        /// The communication.
        id: ConnId,
        /// The MRA's service timeout (5-bit IBA time).
        service_timeout: u8,
    },
}

/// Per-message-type counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgCounts {
    /// REQ.
    pub req: u64,
    /// MRA.
    pub mra: u64,
    /// REJ.
    pub rej: u64,
    /// REP.
    pub rep: u64,
    /// RTU.
    pub rtu: u64,
    /// DREQ.
    pub dreq: u64,
    /// DREP.
    pub drep: u64,
    /// SIDR_REQ.
    pub sidr_req: u64,
    /// SIDR_REP.
    pub sidr_rep: u64,
}

impl MsgCounts {
    /// Sum over all message types.
    pub const fn total(&self) -> u64 {
        self.req
            + self.mra
            + self.rej
            + self.rep
            + self.rtu
            + self.dreq
            + self.drep
            + self.sidr_req
            + self.sidr_rep
    }

    pub(crate) fn bump(&mut self, attribute_id: u16) {
        use softrdma_wire::mad;
        let c = match attribute_id {
            mad::ATTR_CM_REQ => &mut self.req,
            mad::ATTR_CM_MRA => &mut self.mra,
            mad::ATTR_CM_REJ => &mut self.rej,
            mad::ATTR_CM_REP => &mut self.rep,
            mad::ATTR_CM_RTU => &mut self.rtu,
            mad::ATTR_CM_DREQ => &mut self.dreq,
            mad::ATTR_CM_DREP => &mut self.drep,
            mad::ATTR_CM_SIDR_REQ => &mut self.sidr_req,
            mad::ATTR_CM_SIDR_REP => &mut self.sidr_rep,
            _ => return,
        };
        *c += 1;
    }
}

/// A MAD the CM wants sent, as [`Cm::poll_transmit_into`](super::Cm::poll_transmit_into)
/// wrote it into the caller's buffer: the same shape as the transport's
/// [`Transmit`](crate::transport::Transmit) (bytes written, then where they go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmTransmit {
    /// Bytes written at the start of the buffer: one whole MAD (256 bytes), to be sent as a
    /// UD SEND from QP1 to QP1 with Q_Key 0x80010000.
    pub len: usize,
    /// The IP address of the peer's GSI endpoint.
    pub dest: IpAddr,
}

/// Counters of a [`Cm`](super::Cm).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs queued for transmission, retransmissions included.
    pub sent: MsgCounts,
    /// Retransmissions on timeout (a subset of `sent`).
    pub retransmitted: MsgCounts,
    /// MADs received and decoded.
    pub received: MsgCounts,
    /// Duplicates recognised (answered again or ignored).
    pub duplicates: MsgCounts,
    /// Dropped: shorter than 256 bytes or a field with a forbidden value.
    pub dropped_malformed: u64,
    /// Dropped: not a CM MAD this CM handles (base/class version, class, method, or an
    /// attribute such as LAP/APR/ClassPortInfo).
    pub dropped_unsupported: u64,
    /// Dropped: no communication with those IDs (or a different source IP).
    pub dropped_unknown_id: u64,
    /// Dropped: the communication is in a state where the message means nothing.
    pub dropped_invalid_state: u64,
    /// REQs answered with REJ 10 (stale connection) and REPs refused as stale.
    pub stale: u64,
    /// REQs/SIDR_REQs refused because of `max_connections`/`max_pending_reqs` (REJ 3 or
    /// silently dropped).
    pub dropped_no_resources: u64,
    /// MADs not queued because the transmit queue was full (the owner is not polling).
    pub dropped_tx_overflow: u64,
    /// Events dropped because the event queue was full (the owner is not polling).
    pub dropped_events: u64,
}

/// Why an API call failed. No state changes when an error is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No communication with this ID (never existed, or gone after a terminal event).
    UnknownId,
    /// The call makes no sense in the communication's current state (Linux: `EINVAL`).
    InvalidState,
    /// Already established (`notify_established` twice; Linux: `EISCONN`).
    AlreadyEstablished,
    /// Private data longer than the message allows.
    PrivateDataTooLong,
    /// A parameter is out of range (named).
    InvalidParam(&'static str),
    /// `max_connections` reached.
    TooManyConnections,
    /// Somebody already listens on this service ID (Linux: `EBUSY`).
    AlreadyListening,
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::UnknownId => f.write_str("unknown communication ID"),
            CmError::InvalidState => f.write_str("invalid state for this operation"),
            CmError::AlreadyEstablished => f.write_str("already established"),
            CmError::PrivateDataTooLong => f.write_str("private data too long"),
            CmError::InvalidParam(p) => write!(f, "invalid parameter: {p}"),
            CmError::TooManyConnections => f.write_str("too many connections"),
            CmError::AlreadyListening => f.write_str("service ID already listened on"),
        }
    }
}

impl std::error::Error for CmError {}
