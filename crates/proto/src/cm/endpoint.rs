//! The CM state machine: [`Cm`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrdma_wire::bth::DEFAULT_PKEY;
use softrdma_wire::cm::{
    self as wcm, pad_private_data, DrepRepr, DreqRepr, Message, MessageMraed, MessageRejected,
    MraRepr, RejRepr, RejectReason, RepRepr, ReqPath, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr,
    SidrStatus, TransportServiceType,
};
use softrdma_wire::ip::ip_to_gid;
use softrdma_wire::{mad, Error as WireError};

use super::rng::{Permutation, SplitMix64};
use super::types::{
    AcceptParams, CmConfig, CmError, CmEvent, CmStats, CmTransmit, ConnId, ConnectRequest, RepInfo,
    ReqInfo,
};
use crate::timer::cm_timeout_ms_linux;

/// A 256-byte MAD.
type MadBuf = [u8; mad::MAD_SIZE];

/// Transmit-queue bound: MADs beyond it are dropped and counted
/// ([`CmStats::dropped_tx_overflow`]); retransmission timers recover them.
pub const TX_QUEUE_LIMIT: usize = 4096;
/// Event-queue bound: events beyond it are dropped and counted ([`CmStats::dropped_events`]).
/// An owner that polls after every call never reaches it.
pub const EVENT_QUEUE_LIMIT: usize = 4096;

/// Largest 24-bit value (QPN, PSN).
const MAX_24: u32 = 0x00FF_FFFF;
/// The permissive LID rdma_cm puts in REQs whose path is routed (hop limit > 1).
const PERMISSIVE_LID: u16 = 0xFFFF;

/// Linux's `cm_ack_timeout`: the QP local ACK timeout covering the CA's ACK delay plus a
/// round trip of two packet lifetimes, in the 5-bit IBA encoding: the larger of `ack_delay`
/// and `packet_lifetime + 1`, incremented when the other is within a factor of two.
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_lifetime: u8) -> u8 {
    let ack = u16::from(packet_lifetime) + 1;
    let delay = u16::from(ca_ack_delay);
    let t = if ack >= delay {
        ack + u16::from(delay + 1 >= ack)
    } else {
        delay + u16::from(ack + 1 >= delay)
    };
    t.min(31) as u8
}

fn after(now: Instant, ms: u64) -> Instant {
    now.checked_add(Duration::from_millis(ms)).unwrap_or(now)
}

fn encode(tid: u64, msg: &Message) -> MadBuf {
    let mut buf = [0u8; mad::MAD_SIZE];
    // Cannot fail: the buffer is exactly one MAD long.
    let _ = msg.emit_mad(tid, &mut buf);
    buf
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, retransmitting.
    ReqSent,
    /// Active: the peer MRA'd our REQ.
    MraReqRcvd,
    /// Passive: REQ reported, the owner has not answered.
    ReqRcvd,
    /// Passive: as `ReqRcvd`, with an MRA armed for duplicate REQs (`delay_reply`).
    MraReqSent,
    /// Passive: REP sent, retransmitting until RTU.
    RepSent,
    /// Passive: the peer MRA'd our REP.
    MraRepRcvd,
    /// Active: REP reported, the owner must send the RTU (or reject).
    RepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, retransmitting until DREP.
    DreqSent,
    /// Disconnected; the IDs stay reserved until the timer fires.
    Timewait,
    /// Active SIDR: SIDR_REQ sent, retransmitting.
    SidrReqSent,
    /// Passive SIDR: request reported, not answered.
    SidrReqRcvd,
    /// Passive SIDR: answered; the reply is kept to answer retransmitted requests.
    SidrAnswered,
}

/// How many ICMP port unreachables a REQ or SIDR_REQ waiting for its first answer takes
/// before it ends ([`Cm::handle_port_unreachable`]).
pub const REFUSED_RETRIES: u8 = 5;

/// How long after the first ICMP port unreachable a REQ or SIDR_REQ is sent again
/// (doubling after each further one: 10, 20, 40, 80 and 160 ms).
pub const REFUSED_RETRY_MS: u64 = 10;

#[derive(Debug, Clone)]
struct Retx {
    mad: Box<MadBuf>,
    deadline: Instant,
    retries_left: u8,
    timeout_ms: u64,
}

#[derive(Debug, Clone)]
struct Conn {
    state: State,
    /// Where our MADs go; incoming MADs for this communication must come from here.
    peer: IpAddr,
    remote_id: u32,
    remote_guid: u64,
    local_qpn: u32,
    remote_qpn: u32,
    service_id: u64,
    /// TID of the REQ (or SIDR_REQ) this communication started with: REP, RTU, MRA and REJ
    /// reuse it.
    tid: u64,
    /// Per-try timeout of the requests this side sends (REQ/REP/DREQ).
    timeout_ms: u64,
    max_retries: u8,
    /// Linux `av.timeout`: the path's ACK timeout; timewait and MRA use it.
    av_timeout: u8,
    retx: Option<Retx>,
    /// Reply re-sent on duplicates: REP (RepSent), RTU (Established, active), SIDR_REP.
    reply: Option<Box<MadBuf>>,
    /// Service timeout of the armed MRA (MraReqSent).
    mra_service_timeout: u8,
    /// Timewait exit or answered-SIDR expiry.
    expiry: Option<Instant>,
    /// Counted in `Cm::pending`.
    pending: bool,
    /// The owner destroyed it: no more events.
    destroyed: bool,
    /// ICMP port unreachables answered to this REQ or SIDR_REQ so far (each sends it again
    /// sooner: see [`Cm::handle_port_unreachable`]).
    refusals: u8,
    /// The request went again since the last refusal (a refusal before that answers a send
    /// already counted).
    resent: bool,
    /// Key in `Cm::sidr_in`.
    sidr_key: Option<(IpAddr, u32)>,
}

impl Conn {
    fn new(state: State, peer: IpAddr) -> Self {
        Conn {
            state,
            peer,
            remote_id: 0,
            remote_guid: 0,
            local_qpn: 0,
            remote_qpn: 0,
            service_id: 0,
            tid: 0,
            timeout_ms: 0,
            max_retries: 0,
            av_timeout: 0,
            retx: None,
            reply: None,
            mra_service_timeout: 0,
            expiry: None,
            pending: false,
            destroyed: false,
            refusals: 0,
            resent: false,
            sidr_key: None,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match (self.retx.as_ref().map(|r| r.deadline), self.expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The sans-IO InfiniBand connection manager of one device (its GSI endpoint), speaking the
/// CM MADs Linux rdma_cm puts on the wire over RoCE. See the [module docs](super) for the
/// model, the behaviours and the deviations from Linux.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    perm: Permutation,
    hi_tid: u32,
    next_index: u32,
    conns: BTreeMap<u32, Conn>,
    listens: BTreeSet<u64>,
    /// (remote comm ID, remote CA GUID) → local comm ID: duplicate REQ/REP detection.
    remote_ids: BTreeMap<(u32, u64), u32>,
    /// (remote QPN, remote CA GUID) → local comm ID: stale-connection detection.
    remote_qpns: BTreeMap<(u32, u64), u32>,
    /// (source IP, request ID) → local ID of incoming SIDR requests.
    sidr_in: BTreeMap<(IpAddr, u32), u32>,
    pending: usize,
    /// Deadlines (retransmission, expiry) by time, so that the next one is found without a
    /// scan of every communication. Entries may be stale (the communication went, or its
    /// deadline moved): [`Cm::handle_timeout`] checks each against the communication, so a
    /// stale entry costs at most one early wake-up.
    deadlines: BTreeSet<(Instant, u32)>,
    tx: VecDeque<(IpAddr, MadBuf)>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

impl Cm {
    /// Creates the CM. Never fails; a `max_connections` or `max_pending_reqs` of 0 makes it
    /// refuse every communication.
    pub fn new(cfg: CmConfig) -> Cm {
        let mut rng = SplitMix64::new(cfg.seed);
        let perm = Permutation::new(&mut rng);
        let hi_tid = rng.next_u32().max(1);
        let next_index = rng.next_u32();
        Cm {
            cfg,
            perm,
            hi_tid,
            next_index,
            conns: BTreeMap::new(),
            listens: BTreeSet::new(),
            remote_ids: BTreeMap::new(),
            remote_qpns: BTreeMap::new(),
            sidr_in: BTreeMap::new(),
            pending: 0,
            deadlines: BTreeSet::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// Changes [`CmConfig::max_connections`] and [`CmConfig::max_pending_reqs`] from now on.
    /// Records already held stay, whatever the new bounds: a bound below the present
    /// occupancy only refuses new communications (REJ 3 for REQs, `TooManyConnections` for
    /// `connect`) until enough of them have gone. Never fails.
    pub fn set_limits(&mut self, max_connections: usize, max_pending_reqs: usize) {
        self.cfg.max_connections = max_connections;
        self.cfg.max_pending_reqs = max_pending_reqs;
    }

    /// Counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// Communication records held (any state, timewait included). Bounded by
    /// `max_connections`.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Passive requests not answered yet. Bounded by `max_pending_reqs`.
    pub fn pending_count(&self) -> usize {
        self.pending
    }

    /// Whether `id` names a live communication record.
    pub fn contains(&self, id: ConnId) -> bool {
        self.conns.contains_key(&id.0)
    }

    /// The peer IP of a communication.
    pub fn peer(&self, id: ConnId) -> Option<IpAddr> {
        self.conns.get(&id.0).map(|c| c.peer)
    }

    /// The TID Linux's `cm_form_tid` gives requests of communication `local_id`: the MAD
    /// agent's high word, then the comm ID's bytes as a little-endian host reads them.
    fn form_tid(&self, local_id: u32) -> u64 {
        (u64::from(self.hi_tid) << 32) | u64::from(local_id.swap_bytes())
    }

    fn alloc_id(&mut self) -> Option<u32> {
        for _ in 0..64 {
            let mut id = self.perm.apply(self.next_index);
            self.next_index = self.next_index.wrapping_add(1);
            if let Some(tag) = self.cfg.comm_id_tag {
                id = (id & 0x00ff_ffff) | (u32::from(tag) << 24);
            }
            if id != 0 && !self.conns.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    fn push_tx(&mut self, dst: IpAddr, buf: MadBuf) {
        if self.tx.len() >= TX_QUEUE_LIMIT {
            self.stats.dropped_tx_overflow += 1;
            return;
        }
        let attr = u16::from_be_bytes([buf[16], buf[17]]);
        self.stats.sent.bump(attr);
        self.tx.push_back((dst, buf));
    }

    fn send(&mut self, dst: IpAddr, tid: u64, msg: &Message) -> MadBuf {
        let buf = encode(tid, msg);
        self.push_tx(dst, buf);
        buf
    }

    fn event(&mut self, ev: CmEvent) {
        if self.events.len() >= EVENT_QUEUE_LIMIT {
            self.stats.dropped_events += 1;
            return;
        }
        self.events.push_back(ev);
    }

    fn has_room(&self) -> bool {
        self.conns.len() < self.cfg.max_connections
    }

    fn take(&mut self, id: ConnId) -> Result<Conn, CmError> {
        self.unput(id.0).ok_or(CmError::UnknownId)
    }

    /// Takes communication `id` out, with its deadline entry.
    fn unput(&mut self, id: u32) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        if let Some(d) = conn.next_deadline() {
            self.deadlines.remove(&(d, id));
        }
        Some(conn)
    }

    fn put(&mut self, id: u32, conn: Conn) {
        if let Some(d) = conn.next_deadline() {
            self.deadlines.insert((d, id));
        }
        self.conns.insert(id, conn);
    }

    fn unpend(&mut self, conn: &mut Conn) {
        if conn.pending {
            conn.pending = false;
            self.pending = self.pending.saturating_sub(1);
        }
    }

    /// Forgets a communication that was taken out of `conns`: its table entries go too.
    fn forget(&mut self, id: u32, mut conn: Conn) {
        self.unpend(&mut conn);
        let rid = (conn.remote_id, conn.remote_guid);
        if self.remote_ids.get(&rid) == Some(&id) {
            self.remote_ids.remove(&rid);
        }
        let rq = (conn.remote_qpn, conn.remote_guid);
        if self.remote_qpns.get(&rq) == Some(&id) {
            self.remote_qpns.remove(&rq);
        }
        if let Some(k) = conn.sidr_key {
            if self.sidr_in.get(&k) == Some(&id) {
                self.sidr_in.remove(&k);
            }
        }
    }

    fn enter_timewait(&mut self, now: Instant, conn: &mut Conn) {
        self.unpend(conn);
        conn.state = State::Timewait;
        conn.retx = None;
        conn.expiry = Some(after(now, cm_timeout_ms_linux(conn.av_timeout)));
    }

    fn arm(conn: &mut Conn, now: Instant, mad: MadBuf, timeout_ms: u64, retries: u8) {
        conn.retx = Some(Retx {
            mad: Box::new(mad),
            deadline: after(now, timeout_ms),
            retries_left: retries,
            timeout_ms,
        });
    }

    // ------------------------------------------------------------------------------------
    // Active side
    // ------------------------------------------------------------------------------------

    /// Sends a REQ (rdma_connect for RC/UC) and returns the new communication's handle.
    ///
    /// The REQ carries exactly what rdma_cm puts there over RoCE: permissive LIDs (0xFFFF)
    /// unless the hop limit is ≤ 1, v4-mapped GIDs of [`CmConfig::local_addr`] and `req.dst`,
    /// P_Key 0xFFFF, both CM response timeouts = [`CmConfig::cm_response_timeout`], max CM
    /// retries, local ACK timeout = `cm_ack_timeout(local_ack_delay, packet_lifetime)`,
    /// subnet-local = hop limit ≤ 1, zero alternate path, Q_Key 0. Retry and RNR retry counts
    /// are clamped to 7 as rdma_cm does. It is retransmitted (same TID) every
    /// `2 × packet_lifetime + cm_response_timeout` (Linux ms approximation) up to
    /// `max_cm_retries` times, then [`CmEvent::Unreachable`].
    ///
    /// Fails with [`CmError::PrivateDataTooLong`] (> 92 bytes), [`CmError::InvalidParam`]
    /// (transport not RC/UC, QPN/PSN over 24 bits, MTU not 1..=5, SL over 15, flow label over
    /// 20 bits) or [`CmError::TooManyConnections`].
    pub fn connect(&mut self, now: Instant, req: ConnectRequest) -> Result<ConnId, CmError> {
        let private_data = pad_private_data::<{ wcm::REQ_PRIVATE_DATA_LEN }>(&req.private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        if !matches!(
            req.transport,
            TransportServiceType::Rc | TransportServiceType::Uc
        ) {
            return Err(CmError::InvalidParam("transport"));
        }
        if req.local_qpn > MAX_24 {
            return Err(CmError::InvalidParam("local_qpn"));
        }
        if req.starting_psn > MAX_24 {
            return Err(CmError::InvalidParam("starting_psn"));
        }
        if !(1..=5).contains(&req.path_mtu) {
            return Err(CmError::InvalidParam("path_mtu"));
        }
        if req.sl > 15 {
            return Err(CmError::InvalidParam("sl"));
        }
        if req.flow_label > 0x000F_FFFF {
            return Err(CmError::InvalidParam("flow_label"));
        }
        if req.packet_rate > 0x3F {
            return Err(CmError::InvalidParam("packet_rate"));
        }
        if !self.has_room() {
            return Err(CmError::TooManyConnections);
        }
        let id = self.alloc_id().ok_or(CmError::TooManyConnections)?;
        let cfg = &self.cfg;
        let routed = req.hop_limit > 1;
        let lid = if routed { PERMISSIVE_LID } else { 0 };
        let repr = ReqRepr {
            local_comm_id: id,
            vendor_id: 0,
            service_id: req.service_id,
            local_ca_guid: cfg.ca_guid,
            local_qkey: 0,
            local_qpn: req.local_qpn,
            responder_resources: req.responder_resources,
            local_eecn: 0,
            initiator_depth: req.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: cfg.cm_response_timeout.min(31),
            transport_service_type: req.transport,
            end_to_end_flow_control: req.flow_control,
            starting_psn: req.starting_psn,
            local_cm_response_timeout: cfg.cm_response_timeout.min(31),
            retry_count: req.retry_count.min(7),
            partition_key: DEFAULT_PKEY,
            path_mtu: req.path_mtu,
            rdc_exists: false,
            rnr_retry_count: req.rnr_retry_count.min(7),
            max_cm_retries: cfg.max_cm_retries.min(15),
            srq: req.srq,
            extended_transport_type: 0,
            primary_path: ReqPath {
                local_lid: lid,
                remote_lid: lid,
                local_gid: ip_to_gid(cfg.local_addr),
                remote_gid: ip_to_gid(req.dst),
                flow_label: req.flow_label,
                packet_rate: req.packet_rate,
                traffic_class: req.traffic_class,
                hop_limit: req.hop_limit,
                sl: req.sl,
                subnet_local: !routed,
                local_ack_timeout: cm_ack_timeout(cfg.local_ack_delay, cfg.packet_lifetime),
            },
            alternate_path: ReqPath::ZERO,
            sap_supported: false,
            private_data,
        };
        let timeout_ms = 2 * cm_timeout_ms_linux(cfg.packet_lifetime)
            + cm_timeout_ms_linux(cfg.cm_response_timeout);
        let max_retries = cfg.max_cm_retries.min(15);
        let av_timeout = (cfg.packet_lifetime.min(30)) + 1;
        let tid = self.form_tid(id);
        let peer = req.dst.to_canonical();
        let buf = self.send(peer, tid, &Message::Req(repr));
        let mut conn = Conn::new(State::ReqSent, peer);
        conn.local_qpn = req.local_qpn;
        conn.service_id = req.service_id;
        conn.tid = tid;
        conn.timeout_ms = timeout_ms;
        conn.max_retries = max_retries;
        conn.av_timeout = av_timeout;
        Self::arm(&mut conn, now, buf, timeout_ms, max_retries);
        self.put(id, conn);
        Ok(ConnId(id))
    }

    /// Sends the RTU after a [`CmEvent::RepReceived`] (the owner has moved its QP to RTR and
    /// RTS); the communication is then established. Duplicate REPs are answered with this
    /// RTU again. The RTU reuses the REQ's TID.
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::InvalidState`] (no REP pending) or
    /// [`CmError::PrivateDataTooLong`] (> 224 bytes).
    pub fn send_rtu(
        &mut self,
        _now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_private_data::<{ wcm::RTU_PRIVATE_DATA_LEN }>(private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        let conn = self.conns.get(&id.0).ok_or(CmError::UnknownId)?;
        if conn.state != State::RepRcvd {
            return Err(CmError::InvalidState);
        }
        let (peer, tid) = (conn.peer, conn.tid);
        let msg = Message::Rtu(RtuRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            private_data: pd,
        });
        let buf = self.send(peer, tid, &msg);
        if let Some(mut conn) = self.unput(id.0) {
            conn.state = State::Established;
            conn.reply = Some(Box::new(buf));
            self.put(id.0, conn);
        }
        Ok(())
    }

    // ------------------------------------------------------------------------------------
    // Passive side
    // ------------------------------------------------------------------------------------

    /// Accepts REQs and SIDR_REQs for `service_id` (exact match).
    ///
    /// Fails with [`CmError::AlreadyListening`] if somebody already listens on it.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listens.insert(service_id) {
            Ok(())
        } else {
            Err(CmError::AlreadyListening)
        }
    }

    /// Whether REQs and SIDR_REQs for `service_id` are accepted ([`Cm::listen`]).
    pub fn is_listening(&self, service_id: u64) -> bool {
        self.listens.contains(&service_id)
    }

    /// Stops accepting new requests for `service_id`; communications already reported are
    /// not affected. Does nothing if nobody listens on it.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listens.remove(&service_id);
    }

    /// Answers a [`CmEvent::ReqReceived`] with a REP (the owner has moved its QP to RTR and
    /// RTS, as rdma_cm does before sending the REP). The REP reuses the REQ's TID and is
    /// retransmitted every `local CM response timeout` of the REQ, up to the REQ's max CM
    /// retries, until the RTU arrives (→ [`CmEvent::Established`]) or
    /// [`notify_established`](Cm::notify_established) is called; then
    /// [`CmEvent::Unreachable`]. Target ACK delay = [`CmConfig::local_ack_delay`].
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::InvalidState`] (not an unanswered REQ),
    /// [`CmError::PrivateDataTooLong`] (> 196 bytes) or [`CmError::InvalidParam`] (QPN/PSN
    /// over 24 bits).
    pub fn accept(&mut self, now: Instant, id: ConnId, rep: AcceptParams) -> Result<(), CmError> {
        let pd = pad_private_data::<{ wcm::REP_PRIVATE_DATA_LEN }>(&rep.private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        if rep.local_qpn > MAX_24 {
            return Err(CmError::InvalidParam("local_qpn"));
        }
        if rep.starting_psn > MAX_24 {
            return Err(CmError::InvalidParam("starting_psn"));
        }
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state;
        if !matches!(state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState);
        }
        let mut conn = self.take(id)?;
        let msg = Message::Rep(RepRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            local_qkey: 0,
            local_qpn: rep.local_qpn,
            local_eecn: 0,
            starting_psn: rep.starting_psn,
            vendor_id: 0,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            target_ack_delay: self.cfg.local_ack_delay.min(31),
            failover_accepted: 0,
            end_to_end_flow_control: rep.flow_control,
            rnr_retry_count: rep.rnr_retry_count.min(7),
            srq: rep.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: pd,
        });
        let buf = self.send(conn.peer, conn.tid, &msg);
        self.unpend(&mut conn);
        conn.state = State::RepSent;
        conn.local_qpn = rep.local_qpn;
        conn.reply = Some(Box::new(buf));
        let (t, r) = (conn.timeout_ms, conn.max_retries);
        Self::arm(&mut conn, now, buf, t, r);
        self.put(id.0, conn);
        Ok(())
    }

    /// Rejects: a REQ not yet answered (REJ, "message rejected" = REQ; rdma_reject uses
    /// reason [`RejectReason::ConsumerDefined`] 28), a REP we received (REJ, message REP —
    /// e.g. the local QP could not be moved to RTS), or a SIDR request (SIDR_REP with status
    /// [`SidrStatus::Reject`]; `reason` is ignored and private data ≤ 136 bytes). The
    /// communication is then forgotten.
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::InvalidState`] or
    /// [`CmError::PrivateDataTooLong`] (> 148 bytes).
    pub fn reject(
        &mut self,
        _now: Instant,
        id: ConnId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state;
        match state {
            State::SidrReqRcvd => {
                let pd = pad_private_data::<{ wcm::SIDR_REP_PRIVATE_DATA_LEN }>(private_data)
                    .map_err(|_| CmError::PrivateDataTooLong)?;
                let conn = self.take(id)?;
                self.send_sidr_rep(&conn, SidrStatus::Reject, 0, 0, pd);
                self.forget(id.0, conn);
                Ok(())
            }
            State::ReqRcvd | State::MraReqSent | State::RepRcvd => {
                let pd = pad_private_data::<{ wcm::REJ_PRIVATE_DATA_LEN }>(private_data)
                    .map_err(|_| CmError::PrivateDataTooLong)?;
                let conn = self.take(id)?;
                self.send_rej_for(id.0, &conn, reason, &[], pd);
                self.forget(id.0, conn);
                Ok(())
            }
            _ => Err(CmError::InvalidState),
        }
    }

    /// Arms an MRA for a REQ not answered yet, as rdma_cm does after its CONNECT_REQUEST
    /// callback returns (`CMA_CM_MRA_SETTING`, service timeout 24): nothing is sent now, but a
    /// duplicate REQ is answered with an MRA carrying `service_timeout` (5-bit IBA time), which
    /// makes the requester wait that much longer.
    ///
    /// Fails with [`CmError::UnknownId`] or [`CmError::InvalidState`] (not an unanswered REQ,
    /// or already armed).
    pub fn delay_reply(
        &mut self,
        _now: Instant,
        id: ConnId,
        service_timeout: u8,
    ) -> Result<(), CmError> {
        let conn = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId)?;
        if conn.state != State::ReqRcvd {
            return Err(CmError::InvalidState);
        }
        conn.state = State::MraReqSent;
        conn.mra_service_timeout = service_timeout.min(31);
        Ok(())
    }

    /// Passive side: the QP received data before the RTU (`IBV_EVENT_COMM_EST`,
    /// `rdma_notify`): the connection counts as established, REP retransmission stops and
    /// [`CmEvent::Established`] is raised (with empty private data).
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::AlreadyEstablished`] or
    /// [`CmError::InvalidState`] (no REP outstanding).
    pub fn notify_established(&mut self, _now: Instant, id: ConnId) -> Result<(), CmError> {
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state;
        match state {
            State::RepSent | State::MraRepRcvd => {
                let mut conn = self.take(id)?;
                conn.state = State::Established;
                conn.retx = None;
                conn.reply = None;
                self.put(id.0, conn);
                self.event(CmEvent::Established {
                    id,
                    private_data: Vec::new(),
                });
                Ok(())
            }
            State::Established => Err(CmError::AlreadyEstablished),
            _ => Err(CmError::InvalidState),
        }
    }

    // ------------------------------------------------------------------------------------
    // Both sides
    // ------------------------------------------------------------------------------------

    /// Disconnects an established connection: sends a DREQ (fresh TID of this side),
    /// retransmitted until the DREP arrives (→ [`CmEvent::Disconnected`]) or the retries run
    /// out (→ `Disconnected` too); timewait follows. If the peer's DREQ already came (the CM
    /// answered it with a DREP itself) or our DREQ is under way, this does nothing and
    /// succeeds, as `rdma_disconnect` does.
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::InvalidState`] (not established) or
    /// [`CmError::PrivateDataTooLong`] (> 220 bytes).
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_private_data::<{ wcm::DREQ_PRIVATE_DATA_LEN }>(private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state;
        match state {
            State::Established => {
                let mut conn = self.take(id)?;
                self.send_dreq(now, id.0, &mut conn, pd, true);
                self.put(id.0, conn);
                Ok(())
            }
            State::DreqSent | State::Timewait => Ok(()),
            _ => Err(CmError::InvalidState),
        }
    }

    /// Forgets a communication as `rdma_destroy_id` does, telling the peer what Linux's
    /// `ib_destroy_cm_id` tells it in that state:
    /// * REQ sent (or MRA'd): REJ reason 4 (timeout) with our CA GUID as ARI, message "other";
    /// * REQ received, not answered: REJ 28; REP sent: REJ 28 then timewait; REP received:
    ///   REJ 28 (message REP);
    /// * established: one DREQ (not retransmitted), then timewait; DREQ sent: timewait;
    /// * SIDR request received: SIDR_REP status 2 (reject); SIDR request sent: nothing.
    ///
    /// No event is raised for it afterwards (not even `TimewaitExit`), but a record in
    /// timewait keeps its IDs reserved until the timer fires. Unknown IDs are ignored.
    pub fn destroy(&mut self, now: Instant, id: ConnId) {
        let Ok(mut conn) = self.take(id) else {
            return;
        };
        conn.destroyed = true;
        match conn.state {
            State::ReqSent | State::MraReqRcvd => {
                let guid = self.cfg.ca_guid.to_be_bytes();
                self.send_rej_for(
                    id.0,
                    &conn,
                    RejectReason::Timeout,
                    &guid,
                    [0; wcm::REJ_PRIVATE_DATA_LEN],
                );
                self.forget(id.0, conn);
            }
            State::ReqRcvd | State::MraReqSent | State::RepRcvd => {
                self.send_rej_for(
                    id.0,
                    &conn,
                    RejectReason::ConsumerDefined,
                    &[],
                    [0; wcm::REJ_PRIVATE_DATA_LEN],
                );
                self.forget(id.0, conn);
            }
            State::RepSent | State::MraRepRcvd => {
                self.send_rej_for(
                    id.0,
                    &conn,
                    RejectReason::ConsumerDefined,
                    &[],
                    [0; wcm::REJ_PRIVATE_DATA_LEN],
                );
                self.enter_timewait(now, &mut conn);
                self.put(id.0, conn);
            }
            State::Established => {
                self.send_dreq(now, id.0, &mut conn, [0; wcm::DREQ_PRIVATE_DATA_LEN], false);
                self.enter_timewait(now, &mut conn);
                self.put(id.0, conn);
            }
            State::DreqSent => {
                self.enter_timewait(now, &mut conn);
                self.put(id.0, conn);
            }
            State::Timewait | State::SidrAnswered => self.put(id.0, conn),
            State::SidrReqRcvd => {
                self.send_sidr_rep(
                    &conn,
                    SidrStatus::Reject,
                    0,
                    0,
                    [0; wcm::SIDR_REP_PRIVATE_DATA_LEN],
                );
                self.forget(id.0, conn);
            }
            State::SidrReqSent => self.forget(id.0, conn),
        }
    }

    /// Drops communication `id` without a word to the peer, as when the device behind it is
    /// removed: no REJ, DREQ or timewait, and no event. Unknown IDs are ignored.
    pub fn abandon(&mut self, id: ConnId) {
        if let Ok(conn) = self.take(id) {
            self.forget(id.0, conn);
        }
    }

    // ------------------------------------------------------------------------------------
    // SIDR
    // ------------------------------------------------------------------------------------

    /// Sends a SIDR_REQ (rdma_connect on a UD ID): P_Key 0xFFFF, fresh TID, retransmitted
    /// every [`CmConfig::cm_response_timeout`] (Linux ms approximation; rdma_cm: 4096 ms) up
    /// to `max_cm_retries` times, then [`CmEvent::Unreachable`]. The answer is
    /// [`CmEvent::SidrRepReceived`].
    ///
    /// Fails with [`CmError::PrivateDataTooLong`] (> 216 bytes) or
    /// [`CmError::TooManyConnections`].
    pub fn sidr_request(
        &mut self,
        now: Instant,
        dst: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<ConnId, CmError> {
        let pd = pad_private_data::<{ wcm::SIDR_REQ_PRIVATE_DATA_LEN }>(private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        if !self.has_room() {
            return Err(CmError::TooManyConnections);
        }
        let id = self.alloc_id().ok_or(CmError::TooManyConnections)?;
        let tid = self.form_tid(id);
        let peer = dst.to_canonical();
        let msg = Message::SidrReq(SidrReqRepr {
            request_id: id,
            partition_key: DEFAULT_PKEY,
            service_id,
            private_data: pd,
        });
        let buf = self.send(peer, tid, &msg);
        let timeout_ms = cm_timeout_ms_linux(self.cfg.cm_response_timeout);
        let retries = self.cfg.max_cm_retries.min(15);
        let mut conn = Conn::new(State::SidrReqSent, peer);
        conn.service_id = service_id;
        conn.tid = tid;
        conn.timeout_ms = timeout_ms;
        conn.max_retries = retries;
        Self::arm(&mut conn, now, buf, timeout_ms, retries);
        self.put(id, conn);
        Ok(ConnId(id))
    }

    /// Answers a [`CmEvent::SidrReqReceived`] with a SIDR_REP (rdma_accept on a UD ID:
    /// status 0, the QP number and Q_Key `RDMA_UDP_QKEY`). The reply is kept for the
    /// requester's whole retry window and re-sent if the request is retransmitted.
    ///
    /// Fails with [`CmError::UnknownId`], [`CmError::InvalidState`] (not an unanswered SIDR
    /// request), [`CmError::PrivateDataTooLong`] (> 136 bytes) or [`CmError::InvalidParam`]
    /// (QPN over 24 bits).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: ConnId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_private_data::<{ wcm::SIDR_REP_PRIVATE_DATA_LEN }>(private_data)
            .map_err(|_| CmError::PrivateDataTooLong)?;
        if qpn > MAX_24 {
            return Err(CmError::InvalidParam("qpn"));
        }
        let state = self.conns.get(&id.0).ok_or(CmError::UnknownId)?.state;
        if state != State::SidrReqRcvd {
            return Err(CmError::InvalidState);
        }
        let mut conn = self.take(id)?;
        let buf = self.send_sidr_rep(&conn, status, qpn, qkey, pd);
        self.unpend(&mut conn);
        conn.state = State::SidrAnswered;
        conn.reply = Some(Box::new(buf));
        let window = cm_timeout_ms_linux(self.cfg.cm_response_timeout)
            * (u64::from(self.cfg.max_cm_retries.min(15)) + 1);
        conn.expiry = Some(after(now, window));
        self.put(id.0, conn);
        Ok(())
    }

    // ------------------------------------------------------------------------------------
    // Message builders
    // ------------------------------------------------------------------------------------

    /// A REJ for communication `id` in its current state, formatted as Linux's
    /// `cm_format_rej`: local comm ID 0 for an unanswered REQ; message rejected REQ / REP /
    /// other by state.
    fn send_rej_for(
        &mut self,
        id: u32,
        conn: &Conn,
        reason: RejectReason,
        ari: &[u8],
        private_data: [u8; wcm::REJ_PRIVATE_DATA_LEN],
    ) {
        let (local, rejected) = match conn.state {
            State::ReqRcvd => (0, MessageRejected::Req),
            State::MraReqSent => (id, MessageRejected::Req),
            State::RepRcvd => (id, MessageRejected::Rep),
            _ => (id, MessageRejected::Other),
        };
        let mut ari_buf = [0u8; wcm::REJ_ARI_LEN];
        let n = ari.len().min(wcm::REJ_ARI_LEN);
        ari_buf[..n].copy_from_slice(&ari[..n]);
        let msg = Message::Rej(RejRepr {
            local_comm_id: local,
            remote_comm_id: conn.remote_id,
            message_rejected: rejected,
            reject_info_length: n as u8,
            reason,
            ari: ari_buf,
            private_data,
        });
        self.send(conn.peer, conn.tid, &msg);
    }

    /// A REJ answering a received message with no communication (Linux `cm_issue_rej`).
    fn issue_rej(
        &mut self,
        dst: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        rejected: MessageRejected,
        reason: RejectReason,
    ) {
        let msg = Message::Rej(RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: rejected,
            reject_info_length: 0,
            reason,
            ari: [0; wcm::REJ_ARI_LEN],
            private_data: [0; wcm::REJ_PRIVATE_DATA_LEN],
        });
        self.send(dst, tid, &msg);
    }

    fn send_dreq(
        &mut self,
        now: Instant,
        id: u32,
        conn: &mut Conn,
        private_data: [u8; wcm::DREQ_PRIVATE_DATA_LEN],
        retransmit: bool,
    ) {
        let msg = Message::Dreq(DreqRepr {
            local_comm_id: id,
            remote_comm_id: conn.remote_id,
            remote_qpn_eecn: conn.remote_qpn,
            private_data,
        });
        let tid = self.form_tid(id);
        let buf = self.send(conn.peer, tid, &msg);
        conn.reply = None;
        if retransmit {
            conn.state = State::DreqSent;
            let (t, r) = (conn.timeout_ms, conn.max_retries);
            Self::arm(conn, now, buf, t, r);
        }
    }

    fn send_drep(&mut self, dst: IpAddr, tid: u64, local: u32, remote: u32) {
        let msg = Message::Drep(DrepRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; wcm::DREP_PRIVATE_DATA_LEN],
        });
        self.send(dst, tid, &msg);
    }

    fn send_sidr_rep(
        &mut self,
        conn: &Conn,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: [u8; wcm::SIDR_REP_PRIVATE_DATA_LEN],
    ) -> MadBuf {
        let msg = Message::SidrRep(SidrRepRepr {
            request_id: conn.remote_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn,
            service_id: conn.service_id,
            qkey,
            additional_info: [0; wcm::SIDR_REP_ADDITIONAL_INFO_LEN],
            private_data,
        });
        self.send(conn.peer, conn.tid, &msg)
    }

    // ------------------------------------------------------------------------------------
    // I/O
    // ------------------------------------------------------------------------------------

    /// The host `peer` answered that nothing listens on its RoCEv2 port (an ICMP port
    /// unreachable for a datagram sent there, which the I/O layer learns from the socket's
    /// error queue): no device is there any more, or never was, or it is starting. What a
    /// kernel's CM would learn from the DREQ it sends for a dying process, or from its REQ
    /// going unanswered, this CM learns at once:
    /// - a REQ or SIDR_REQ waiting for its first answer (also after an MRA) ends with
    ///   [`CmEvent::Refused`] instead of retrying for the full timeout; toward this host (a
    ///   loopback address or the device's own, where the kernel does not rate-limit its ICMP
    ///   errors) only after it was sent again after [`REFUSED_RETRY_MS`], then twice as long
    ///   after each further refusal of a resend, [`REFUSED_RETRIES`] times (310 ms in all: a
    ///   device that a program starts after it told its peer the port, as qperf's server
    ///   does, is up by then);
    /// - a passive side waiting for the RTU ends with [`CmEvent::Unreachable`];
    /// - an established connection, or one whose DREQ waits for its DREP, enters timewait
    ///   with [`CmEvent::Disconnected`], as if the peer had disconnected.
    ///
    /// Communications waiting for the owner (a reported REQ or REP) are left to it.
    /// Returns how many communications ended.
    pub fn handle_port_unreachable(&mut self, now: Instant, peer: IpAddr) -> usize {
        let ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.peer == peer
                    && matches!(
                        c.state,
                        State::ReqSent
                            | State::SidrReqSent
                            | State::MraReqRcvd
                            | State::RepSent
                            | State::MraRepRcvd
                            | State::Established
                            | State::DreqSent
                    )
            })
            .map(|(&id, _)| id)
            .collect();
        let mut ended = 0;
        for &id in &ids {
            let Some(mut conn) = self.unput(id) else {
                continue;
            };
            if matches!(conn.state, State::ReqSent | State::SidrReqSent)
                && conn.refusals > 0
                && !conn.resent
            {
                // (Answers a send that was counted already: another request's, or a copy.)
                self.put(id, conn);
                continue;
            }
            // Quick resends only toward this host (a peer on a loopback address or this
            // device's own), whose ICMP errors the kernel does not rate-limit: between hosts
            // it answers six in a burst, then one a second, and a request whose resend drew
            // none would wait out its whole timeout.
            let here = peer.is_loopback() || peer == self.cfg.local_addr;
            if here
                && matches!(conn.state, State::ReqSent | State::SidrReqSent)
                && conn.refusals < REFUSED_RETRIES
                && !conn.destroyed
            {
                if let Some(retx) = conn.retx.as_mut() {
                    // Sent again soon, on top of the request's own retries.
                    retx.deadline = after(now, REFUSED_RETRY_MS << conn.refusals);
                    retx.retries_left = retx.retries_left.saturating_add(1);
                    conn.refusals += 1;
                    conn.resent = false;
                    self.put(id, conn);
                    continue;
                }
            }
            ended += 1;
            let destroyed = conn.destroyed;
            let ev = match conn.state {
                State::Established | State::DreqSent => {
                    self.enter_timewait(now, &mut conn);
                    self.put(id, conn);
                    CmEvent::Disconnected { id: ConnId(id) }
                }
                State::RepSent | State::MraRepRcvd => {
                    self.forget(id, conn);
                    CmEvent::Unreachable { id: ConnId(id) }
                }
                _ => {
                    self.forget(id, conn);
                    CmEvent::Refused { id: ConnId(id) }
                }
            };
            if !destroyed {
                self.event(ev);
            }
        }
        ended
    }

    /// The peers this CM has a connection with (established, or disconnecting): where a
    /// liveness probe goes, so that a peer whose device went away (its process died and
    /// sent no DREQ) is noticed through [`Cm::handle_port_unreachable`].
    pub fn connected_peers(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = self
            .conns
            .values()
            .filter(|c| matches!(c.state, State::Established | State::DreqSent))
            .map(|c| c.peer)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Feeds one received MAD (the 256-byte payload of a UD SEND to QP1) from `src`.
    ///
    /// Hostile input is expected: anything that is not a CM message this CM handles, or that
    /// names no communication, or comes in a state where it means nothing, is dropped and
    /// counted in [`CmStats`]; nothing here panics, and memory stays within
    /// `max_connections`/`max_pending_reqs` and the queue bounds. Bytes after the first 256
    /// are ignored.
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        let src = src.to_canonical();
        let packet = match mad::Packet::new_checked(mad) {
            Ok(p) => p,
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return;
            }
        };
        let msg = match Message::parse(&packet) {
            Ok(m) => m,
            Err(WireError::Unsupported) => {
                self.stats.dropped_unsupported += 1;
                return;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return;
            }
        };
        let tid = packet.transaction_id();
        self.stats.received.bump(msg.attribute_id());
        match msg {
            Message::Req(r) => self.on_req(now, src, tid, &r),
            Message::Mra(m) => self.on_mra(now, src, &m),
            Message::Rej(r) => self.on_rej(now, src, &r),
            Message::Rep(r) => self.on_rep(now, src, tid, &r),
            Message::Rtu(r) => self.on_rtu(src, &r),
            Message::Dreq(d) => self.on_dreq(now, src, tid, &d),
            Message::Drep(d) => self.on_drep(now, src, &d),
            Message::SidrReq(s) => self.on_sidr_req(src, tid, &s),
            Message::SidrRep(s) => self.on_sidr_rep(src, &s),
        }
    }

    /// The next MAD to send and its destination IP (to QP1 with Q_Key 0x80010000).
    /// [`Cm::poll_transmit_into`] gives the same MADs in the transport's shape instead.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, [u8; 256])> {
        self.tx.pop_front()
    }

    /// Writes the next MAD to send into `buf[..256]` and returns its length and destination
    /// IP, or returns `None` when there is nothing to send or `buf` is shorter than a MAD
    /// (the MAD then stays queued). The shape of the transport's
    /// [`Qp::poll_transmit`](crate::transport::Qp::poll_transmit): an owner can write the
    /// MAD straight behind the BTH and DETH of the packet it builds. Takes from the same
    /// queue as [`Cm::poll_transmit`].
    pub fn poll_transmit_into(&mut self, buf: &mut [u8]) -> Option<CmTransmit> {
        let (dest, mad) = self.tx.front()?;
        let dst = buf.get_mut(..mad.len())?;
        dst.copy_from_slice(mad);
        let t = CmTransmit {
            len: mad.len(),
            dest: *dest,
        };
        self.tx.pop_front();
        Some(t)
    }

    /// The next event for the owner.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Cm::handle_timeout) should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    /// Runs the timers due at `now`: retransmissions (the identical MAD, same TID), expiry
    /// of retries (REQ/REP/SIDR_REQ → [`CmEvent::Unreachable`]; DREQ →
    /// [`CmEvent::Disconnected`] and timewait), and timewait exits
    /// ([`CmEvent::TimewaitExit`]). Calling it early or twice is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut due: Vec<u32> = Vec::new();
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.pop_first();
            due.push(id);
        }
        due.sort_unstable();
        due.dedup();
        for id in due {
            let Some(mut conn) = self.unput(id) else {
                continue;
            };
            if conn.next_deadline().is_none_or(|d| d > now) {
                // A stale entry: the deadline went or moved (put files the current one).
                self.put(id, conn);
                continue;
            }
            if conn.expiry.is_some_and(|d| d <= now) {
                // Timewait over, or an answered SIDR request no longer remembered.
                let exit = conn.state == State::Timewait && !conn.destroyed;
                self.forget(id, conn);
                if exit {
                    self.event(CmEvent::TimewaitExit { id: ConnId(id) });
                }
                continue;
            }
            let Some(retx) = conn.retx.as_mut() else {
                self.put(id, conn);
                continue;
            };
            if retx.deadline > now {
                self.put(id, conn);
                continue;
            }
            if retx.retries_left > 0 {
                retx.retries_left -= 1;
                retx.deadline = after(now, retx.timeout_ms);
                conn.resent = true;
                let buf = *retx.mad;
                let attr = u16::from_be_bytes([buf[16], buf[17]]);
                self.stats.retransmitted.bump(attr);
                self.push_tx(conn.peer, buf);
                self.put(id, conn);
                continue;
            }
            conn.retx = None;
            match conn.state {
                State::ReqSent
                | State::MraReqRcvd
                | State::RepSent
                | State::MraRepRcvd
                | State::SidrReqSent => {
                    let destroyed = conn.destroyed;
                    self.forget(id, conn);
                    if !destroyed {
                        self.event(CmEvent::Unreachable { id: ConnId(id) });
                    }
                }
                State::DreqSent => {
                    self.enter_timewait(now, &mut conn);
                    let destroyed = conn.destroyed;
                    self.put(id, conn);
                    if !destroyed {
                        self.event(CmEvent::Disconnected { id: ConnId(id) });
                    }
                }
                _ => self.put(id, conn),
            }
        }
    }

    // ------------------------------------------------------------------------------------
    // Receive handlers
    // ------------------------------------------------------------------------------------

    /// The communication `local` if it exists, talks to `src` and (when `remote` is given)
    /// has that remote comm ID.
    fn lookup(&self, src: IpAddr, local: u32, remote: Option<u32>) -> Option<State> {
        let c = self.conns.get(&local)?;
        if c.peer != src || remote.is_some_and(|r| r != c.remote_id) {
            return None;
        }
        Some(c.state)
    }

    fn on_req(&mut self, now: Instant, src: IpAddr, tid: u64, req: &ReqRepr) {
        let _ = now;
        // Duplicate of a REQ we know?
        if let Some(&lid) = self.remote_ids.get(&(req.local_comm_id, req.local_ca_guid)) {
            self.stats.duplicates.req += 1;
            let Some(conn) = self.conns.get(&lid) else {
                return;
            };
            if conn.peer != src {
                self.stats.dropped_unknown_id += 1;
                return;
            }
            match conn.state {
                State::MraReqSent => {
                    let msg = Message::Mra(MraRepr {
                        local_comm_id: lid,
                        remote_comm_id: conn.remote_id,
                        message_mraed: MessageMraed::Req,
                        service_timeout: conn.mra_service_timeout,
                        private_data: [0; wcm::MRA_PRIVATE_DATA_LEN],
                    });
                    let (peer, t) = (conn.peer, conn.tid);
                    self.send(peer, t, &msg);
                }
                State::RepSent | State::MraRepRcvd => {
                    if let Some(rep) = conn.reply.as_deref().copied() {
                        let peer = conn.peer;
                        self.push_tx(peer, rep);
                    }
                }
                State::Timewait => {
                    let (peer, t, rid) = (conn.peer, conn.tid, conn.remote_id);
                    self.stats.stale += 1;
                    self.issue_rej(
                        peer,
                        t,
                        lid,
                        rid,
                        MessageRejected::Other,
                        RejectReason::StaleConn,
                    );
                }
                _ => {}
            }
            return;
        }
        // A new REQ from a QP that still has a connection here: stale. Only the connection's
        // own peer can end it so (as Linux does); a REQ from another address naming that QP
        // and CA GUID is refused and leaves the connection alone.
        if let Some(&old) = self.remote_qpns.get(&(req.local_qpn, req.local_ca_guid)) {
            self.stats.stale += 1;
            self.issue_rej(
                src,
                tid,
                0,
                req.local_comm_id,
                MessageRejected::Req,
                RejectReason::StaleConn,
            );
            if self.conns.get(&old).is_some_and(|c| c.peer == src) {
                self.dreq_stale(now, old);
            }
            return;
        }
        if !self.listens.contains(&req.service_id) {
            self.issue_rej(
                src,
                tid,
                0,
                req.local_comm_id,
                MessageRejected::Req,
                RejectReason::InvalidServiceId,
            );
            return;
        }
        if !matches!(
            req.transport_service_type,
            TransportServiceType::Rc | TransportServiceType::Uc
        ) {
            self.issue_rej(
                src,
                tid,
                0,
                req.local_comm_id,
                MessageRejected::Req,
                RejectReason::InvalidTransportType,
            );
            return;
        }
        if self.pending >= self.cfg.max_pending_reqs || !self.has_room() {
            self.stats.dropped_no_resources += 1;
            self.issue_rej(
                src,
                tid,
                0,
                req.local_comm_id,
                MessageRejected::Req,
                RejectReason::NoResources,
            );
            return;
        }
        let Some(id) = self.alloc_id() else {
            self.stats.dropped_no_resources += 1;
            return;
        };
        let lat = req.primary_path.local_ack_timeout;
        let packet_lifetime = lat.saturating_sub(1);
        let mut conn = Conn::new(State::ReqRcvd, src);
        conn.remote_id = req.local_comm_id;
        conn.remote_guid = req.local_ca_guid;
        conn.remote_qpn = req.local_qpn;
        conn.service_id = req.service_id;
        conn.tid = tid;
        conn.timeout_ms = cm_timeout_ms_linux(req.local_cm_response_timeout);
        conn.max_retries = req.max_cm_retries;
        conn.av_timeout = packet_lifetime + 1;
        conn.pending = true;
        self.pending += 1;
        self.remote_ids
            .insert((req.local_comm_id, req.local_ca_guid), id);
        self.remote_qpns
            .insert((req.local_qpn, req.local_ca_guid), id);
        self.put(id, conn);
        let info = ReqInfo {
            service_id: req.service_id,
            remote_comm_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            remote_qpn: req.local_qpn,
            remote_qkey: req.local_qkey,
            starting_psn: req.starting_psn,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            transport: req.transport_service_type,
            flow_control: req.end_to_end_flow_control,
            path_mtu: req.path_mtu,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            partition_key: req.partition_key,
            local_cm_response_timeout: req.remote_cm_response_timeout,
            remote_cm_response_timeout: req.local_cm_response_timeout,
            max_cm_retries: req.max_cm_retries,
            remote_gid: req.primary_path.local_gid,
            local_gid: req.primary_path.remote_gid,
            flow_label: req.primary_path.flow_label,
            traffic_class: req.primary_path.traffic_class,
            hop_limit: req.primary_path.hop_limit,
            sl: req.primary_path.sl,
            packet_rate: req.primary_path.packet_rate,
            packet_lifetime,
            qp_timeout: packet_lifetime + 1,
            private_data: req.private_data.to_vec(),
        };
        self.event(CmEvent::ReqReceived {
            id: ConnId(id),
            src,
            req: Box::new(info),
        });
    }

    /// Linux sends a DREQ on the old connection when a stale REQ/REP shows up.
    fn dreq_stale(&mut self, now: Instant, old: u32) {
        if self.conns.get(&old).map(|c| c.state) == Some(State::Established) {
            if let Some(mut conn) = self.unput(old) {
                self.send_dreq(now, old, &mut conn, [0; wcm::DREQ_PRIVATE_DATA_LEN], true);
                self.put(old, conn);
            }
        }
    }

    fn on_mra(&mut self, now: Instant, src: IpAddr, mra: &MraRepr) {
        let (remote, want, next) = match mra.message_mraed {
            MessageMraed::Req => (None, State::ReqSent, State::MraReqRcvd),
            MessageMraed::Rep => (Some(mra.local_comm_id), State::RepSent, State::MraRepRcvd),
            MessageMraed::Lap => {
                self.stats.dropped_unsupported += 1;
                return;
            }
        };
        let Some(state) = self.lookup(src, mra.remote_comm_id, remote) else {
            self.stats.dropped_unknown_id += 1;
            return;
        };
        if state == next {
            self.stats.duplicates.mra += 1;
            return;
        }
        if state != want {
            self.stats.dropped_invalid_state += 1;
            return;
        }
        let Some(mut conn) = self.unput(mra.remote_comm_id) else {
            return;
        };
        let timeout =
            cm_timeout_ms_linux(mra.service_timeout) + cm_timeout_ms_linux(conn.av_timeout);
        if let Some(r) = conn.retx.as_mut() {
            r.timeout_ms = timeout;
            r.deadline = after(now, timeout);
        }
        conn.state = next;
        self.put(mra.remote_comm_id, conn);
        self.event(CmEvent::MraReceived {
            id: ConnId(mra.remote_comm_id),
            service_timeout: mra.service_timeout,
        });
    }

    fn on_rej(&mut self, now: Instant, src: IpAddr, rej: &RejRepr) {
        // Find the communication as Linux's cm_acquire_rejected_id does.
        let lid = if rej.reason == RejectReason::Timeout {
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&rej.ari[..8]);
            self.remote_ids
                .get(&(rej.local_comm_id, u64::from_be_bytes(guid)))
                .copied()
                .filter(|id| self.lookup(src, *id, None).is_some())
        } else if rej.message_rejected == MessageRejected::Req {
            Some(rej.remote_comm_id).filter(|id| self.lookup(src, *id, Some(0)).is_some())
        } else {
            Some(rej.remote_comm_id)
                .filter(|id| self.lookup(src, *id, Some(rej.local_comm_id)).is_some())
        };
        let Some(lid) = lid else {
            self.stats.dropped_unknown_id += 1;
            return;
        };
        let Some(mut conn) = self.unput(lid) else {
            return;
        };
        let timewait = match conn.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepSent
            | State::MraRepRcvd
            | State::ReqRcvd
            | State::MraReqSent => rej.reason == RejectReason::StaleConn,
            State::DreqSent | State::RepRcvd | State::Established => true,
            _ => {
                self.stats.dropped_invalid_state += 1;
                self.put(lid, conn);
                return;
            }
        };
        let destroyed = conn.destroyed;
        if timewait {
            self.enter_timewait(now, &mut conn);
            self.put(lid, conn);
        } else {
            self.forget(lid, conn);
        }
        if !destroyed {
            self.event(CmEvent::Rejected {
                id: ConnId(lid),
                reason: rej.reason,
                private_data: rej.private_data.to_vec(),
            });
        }
    }

    fn on_rep(&mut self, now: Instant, src: IpAddr, tid: u64, rep: &RepRepr) {
        let _ = tid;
        let lid = rep.remote_comm_id;
        match self.lookup(src, lid, Some(0)) {
            Some(State::ReqSent | State::MraReqRcvd) => {}
            _ => {
                // Duplicate REP of a connection we already have: answer with the RTU again.
                match self.lookup(src, lid, Some(rep.local_comm_id)) {
                    Some(State::Established) => {
                        self.stats.duplicates.rep += 1;
                        let reply = self
                            .conns
                            .get(&lid)
                            .and_then(|c| c.reply.as_deref().copied());
                        if let Some(rtu) = reply {
                            self.push_tx(src, rtu);
                        }
                    }
                    Some(_) => self.stats.duplicates.rep += 1,
                    None => self.stats.dropped_unknown_id += 1,
                }
                return;
            }
        }
        if self
            .remote_ids
            .contains_key(&(rep.local_comm_id, rep.local_ca_guid))
        {
            self.stats.dropped_invalid_state += 1;
            return;
        }
        if let Some(&old) = self.remote_qpns.get(&(rep.local_qpn, rep.local_ca_guid)) {
            self.stats.stale += 1;
            let t = self.conns.get(&lid).map_or(tid, |c| c.tid);
            self.issue_rej(
                src,
                t,
                lid,
                rep.local_comm_id,
                MessageRejected::Rep,
                RejectReason::StaleConn,
            );
            self.dreq_stale(now, old);
            return;
        }
        let Some(mut conn) = self.unput(lid) else {
            return;
        };
        conn.state = State::RepRcvd;
        conn.retx = None;
        conn.remote_id = rep.local_comm_id;
        conn.remote_guid = rep.local_ca_guid;
        conn.remote_qpn = rep.local_qpn;
        conn.av_timeout = cm_ack_timeout(rep.target_ack_delay, conn.av_timeout.saturating_sub(1));
        self.remote_ids
            .insert((rep.local_comm_id, rep.local_ca_guid), lid);
        self.remote_qpns
            .insert((rep.local_qpn, rep.local_ca_guid), lid);
        let info = RepInfo {
            remote_comm_id: rep.local_comm_id,
            remote_ca_guid: rep.local_ca_guid,
            remote_qpn: rep.local_qpn,
            remote_qkey: rep.local_qkey,
            starting_psn: rep.starting_psn,
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            target_ack_delay: rep.target_ack_delay,
            failover_accepted: rep.failover_accepted,
            flow_control: rep.end_to_end_flow_control,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            qp_timeout: conn.av_timeout,
            private_data: rep.private_data.to_vec(),
        };
        let destroyed = conn.destroyed;
        self.put(lid, conn);
        if !destroyed {
            self.event(CmEvent::RepReceived {
                id: ConnId(lid),
                rep: Box::new(info),
            });
        }
    }

    fn on_rtu(&mut self, src: IpAddr, rtu: &RtuRepr) {
        let lid = rtu.remote_comm_id;
        match self.lookup(src, lid, Some(rtu.local_comm_id)) {
            Some(State::RepSent | State::MraRepRcvd) => {
                if let Some(mut conn) = self.unput(lid) {
                    conn.state = State::Established;
                    conn.retx = None;
                    conn.reply = None;
                    self.put(lid, conn);
                }
                self.event(CmEvent::Established {
                    id: ConnId(lid),
                    private_data: rtu.private_data.to_vec(),
                });
            }
            Some(_) => self.stats.duplicates.rtu += 1,
            None => self.stats.dropped_unknown_id += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, src: IpAddr, tid: u64, dreq: &DreqRepr) {
        let lid = dreq.remote_comm_id;
        let Some(state) = self.lookup(src, lid, Some(dreq.local_comm_id)) else {
            // Linux answers a DREQ for an unknown communication with a DREP anyway.
            self.stats.dropped_unknown_id += 1;
            self.stats.duplicates.dreq += 1;
            self.send_drep(src, tid, lid, dreq.local_comm_id);
            return;
        };
        let Some(mut conn) = self.unput(lid) else {
            return;
        };
        if conn.local_qpn != dreq.remote_qpn_eecn {
            self.stats.dropped_invalid_state += 1;
            self.put(lid, conn);
            return;
        }
        match state {
            State::RepSent | State::MraRepRcvd | State::Established | State::DreqSent => {
                self.send_drep(conn.peer, tid, lid, conn.remote_id);
                self.enter_timewait(now, &mut conn);
                let destroyed = conn.destroyed;
                self.put(lid, conn);
                if !destroyed {
                    self.event(CmEvent::DisconnectRequested {
                        id: ConnId(lid),
                        private_data: dreq.private_data.to_vec(),
                    });
                }
            }
            State::Timewait => {
                self.stats.duplicates.dreq += 1;
                self.send_drep(conn.peer, tid, lid, conn.remote_id);
                self.put(lid, conn);
            }
            _ => {
                self.stats.dropped_invalid_state += 1;
                self.put(lid, conn);
            }
        }
    }

    fn on_drep(&mut self, now: Instant, src: IpAddr, drep: &DrepRepr) {
        let lid = drep.remote_comm_id;
        match self.lookup(src, lid, Some(drep.local_comm_id)) {
            Some(State::DreqSent) => {
                let Some(mut conn) = self.unput(lid) else {
                    return;
                };
                self.enter_timewait(now, &mut conn);
                let destroyed = conn.destroyed;
                self.put(lid, conn);
                if !destroyed {
                    self.event(CmEvent::Disconnected { id: ConnId(lid) });
                }
            }
            Some(_) => self.stats.duplicates.drep += 1,
            None => self.stats.dropped_unknown_id += 1,
        }
    }

    fn on_sidr_req(&mut self, src: IpAddr, tid: u64, req: &SidrReqRepr) {
        let key = (src, req.request_id);
        if let Some(&lid) = self.sidr_in.get(&key) {
            self.stats.duplicates.sidr_req += 1;
            let reply = self
                .conns
                .get(&lid)
                .filter(|c| c.state == State::SidrAnswered)
                .and_then(|c| c.reply.as_deref().copied());
            if let Some(rep) = reply {
                self.push_tx(src, rep);
            }
            return;
        }
        let mut conn = Conn::new(State::SidrReqRcvd, src);
        conn.remote_id = req.request_id;
        conn.service_id = req.service_id;
        conn.tid = tid;
        if !self.listens.contains(&req.service_id) {
            self.send_sidr_rep(
                &conn,
                SidrStatus::Unsupported,
                0,
                0,
                [0; wcm::SIDR_REP_PRIVATE_DATA_LEN],
            );
            return;
        }
        if self.pending >= self.cfg.max_pending_reqs || !self.has_room() {
            self.stats.dropped_no_resources += 1;
            return;
        }
        let Some(id) = self.alloc_id() else {
            self.stats.dropped_no_resources += 1;
            return;
        };
        conn.pending = true;
        conn.sidr_key = Some(key);
        self.pending += 1;
        self.sidr_in.insert(key, id);
        self.put(id, conn);
        self.event(CmEvent::SidrReqReceived {
            id: ConnId(id),
            src,
            service_id: req.service_id,
            partition_key: req.partition_key,
            private_data: req.private_data.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, src: IpAddr, rep: &SidrRepRepr) {
        let lid = rep.request_id;
        match self.lookup(src, lid, None) {
            Some(State::SidrReqSent) => {
                if let Some(conn) = self.unput(lid) {
                    let destroyed = conn.destroyed;
                    self.forget(lid, conn);
                    if !destroyed {
                        self.event(CmEvent::SidrRepReceived {
                            id: ConnId(lid),
                            status: rep.status,
                            qpn: rep.qpn,
                            qkey: rep.qkey,
                            private_data: rep.private_data.to_vec(),
                        });
                    }
                }
            }
            Some(_) => self.stats.dropped_invalid_state += 1,
            None => self.stats.dropped_unknown_id += 1,
        }
    }
}
