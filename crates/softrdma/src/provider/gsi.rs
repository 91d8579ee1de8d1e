//! The general services interface (QP1) of a device: IB CM MADs in and out, as UD SENDs with
//! Q_Key 0x80010000 from QP 1 to QP 1 — exactly what Linux rdma_cm puts on the wire over
//! RoCE — around the sans-IO connection manager [`softrdma_proto::cm::Cm`].
//!
//! The engine hands every packet for QP 1 to [`Gsi::receive`], sends what the CM wants sent,
//! runs its timers, and queues its events for the connection-manager layer, which takes them
//! with [`Gsi::take_events`].

use super::share::{slot_of_comm_id, ServiceClaim, Share, FIRST_SLOT, LAST_SLOT};
use super::tx::{TxBatch, Wire};
use crate::error::Result;
use softrdma_proto::cm::{Cm, CmConfig, CmEvent, CmStats};
use softrdma_proto::device;
use softrdma_wire::cm::{RejectReason, SidrStatus};
use softrdma_wire::{mad, roce};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

/// Counters of the GSI path, beyond the CM's own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GsiCounters {
    /// MAD packets dropped before the CM saw them (wrong opcode, Q_Key or length).
    pub(crate) dropped: u64,
    /// See [`GsiStats::refused_unclaimed`].
    pub(crate) refused_unclaimed: u64,
}

/// A snapshot of a device's general services interface (QP 1) and its connection manager,
/// read with [`crate::Context::cm_stats`]: what hostile or broken CM traffic did to it, and
/// how much state it holds against its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GsiStats {
    /// The connection manager's counters (MADs sent, received, and dropped by cause).
    pub cm: CmStats,
    /// Packets to QP 1 dropped before the connection manager saw them: not a UD SEND_ONLY
    /// (e.g. an RC or UC SEND to QP 1, no DETH), a P_Key of another partition than the
    /// default one (`0xffff`, or `0x7fff` for a limited member), a Q_Key other than 0x80010000, headers
    /// that do not parse, or a payload shorter than a 256-byte MAD. (Packets too short for
    /// their opcode's headers, or with a bad ICRC, are dropped earlier and counted in
    /// [`crate::DeviceCounters`].)
    pub dropped: u64,
    /// Communication records the connection manager holds now (any state, timewait
    /// included); never more than `max_connections`.
    pub connections: usize,
    /// Passive requests (REQ, SIDR_REQ) not answered yet; never more than
    /// `max_pending_reqs`.
    pub pending_reqs: usize,
    /// The bound on `connections`: beyond it incoming REQs are rejected (reason 3).
    pub max_connections: usize,
    /// The bound on `pending_reqs`: beyond it incoming REQs are rejected (reason 3) and
    /// SIDR_REQs dropped.
    pub max_pending_reqs: usize,
    /// Connection requests (REQ, SIDR_REQ) that the CM took for a service listened on but
    /// that found no listening id when handed up, because the listener was destroyed
    /// meanwhile: refused as if nobody listened (REJ reason 8, SIDR status unsupported).
    pub refused_unclaimed: u64,
}

/// `SOFTRDMA_CM_MAX_CONNECTIONS`: the default [`GsiStats::max_connections`] of every device
/// this process opens.
pub(crate) const ENV_MAX_CONNECTIONS: &str = "SOFTRDMA_CM_MAX_CONNECTIONS";
/// `SOFTRDMA_CM_MAX_PENDING_REQS`: the default [`GsiStats::max_pending_reqs`] of every device
/// this process opens.
pub(crate) const ENV_MAX_PENDING_REQS: &str = "SOFTRDMA_CM_MAX_PENDING_REQS";

/// The CM bounds `(max_connections, max_pending_reqs)` a new device takes: the proto
/// defaults, each replaced by its variable (read through `var`) when that holds a decimal
/// number; a value that does not parse is ignored with a warning.
pub(crate) fn limits_from(var: impl Fn(&str) -> Option<String>) -> (usize, usize) {
    let get = |k: &str, d: usize| match var(k) {
        None => d,
        Some(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!("{k}={v:?} is not a number; using {d}");
            d
        }),
    };
    (
        get(
            ENV_MAX_CONNECTIONS,
            softrdma_proto::cm::DEFAULT_MAX_CONNECTIONS,
        ),
        get(
            ENV_MAX_PENDING_REQS,
            softrdma_proto::cm::DEFAULT_MAX_PENDING_REQS,
        ),
    )
}

/// QP 1 of one device.
pub(crate) struct Gsi {
    pub(crate) cm: Cm,
    /// Keep events no rdma_cm id handles, for code that drives the CM directly (tests).
    pub(crate) keep_unhandled: bool,
    psn: u32,
    events: VecDeque<CmEvent>,
    pub(crate) counters: GsiCounters,
    /// The services this process listens on, claimed on the shared device.
    claims: HashMap<u64, ServiceClaim>,
    /// Connection requests (REQ, SIDR_REQ) that came before the device was announced to the
    /// connection-manager layer ([`Gsi::announced`]), kept for then: its wildcard listeners
    /// listen on the device only from then on, and its CM would refuse them meanwhile (the
    /// device's socket takes packets from the moment it is bound, milliseconds before).
    /// `None` once announced.
    early: Option<Vec<(IpAddr, Vec<u8>)>>,
}

/// The most connection requests a starting device keeps for its announcement (the rest are
/// taken at once: refused, or retried by the peer).
const EARLY_MAX: usize = 64;

impl Gsi {
    /// QP 1 of the device at `local`, for the process in `slot` (the tag of its CM's
    /// communication IDs).
    pub(crate) fn new(local: IpAddr, guid: u64, slot: u8) -> Gsi {
        let seed =
            (u64::from(crate::gid::random_u32()) << 32) | u64::from(crate::gid::random_u32());
        let mut cfg = CmConfig::new(local, guid, seed);
        cfg.comm_id_tag = Some(slot);
        (cfg.max_connections, cfg.max_pending_reqs) = limits_from(|k| std::env::var(k).ok());
        Gsi {
            cm: Cm::new(cfg),
            keep_unhandled: false,
            psn: crate::gid::random_u32() & 0xff_ffff,
            events: VecDeque::new(),
            counters: GsiCounters::default(),
            claims: HashMap::new(),
            early: Some(Vec::new()),
        }
    }

    /// The counters and occupancy of QP 1 and its CM.
    pub(crate) fn stats(&self) -> GsiStats {
        let cfg = self.cm.config();
        GsiStats {
            cm: self.cm.stats(),
            dropped: self.counters.dropped,
            refused_unclaimed: self.counters.refused_unclaimed,
            connections: self.cm.connection_count(),
            pending_reqs: self.cm.pending_count(),
            max_connections: cfg.max_connections,
            max_pending_reqs: cfg.max_pending_reqs,
        }
    }

    /// Takes the queued CM events.
    pub(crate) fn take_events(&mut self) -> Vec<CmEvent> {
        self.events.drain(..).collect()
    }

    /// Puts back events nobody handled (no rdma_cm id is behind their communication) when
    /// the CM is driven directly ([`Gsi::keep_unhandled`]); otherwise they are dropped (an
    /// event for an id destroyed meanwhile), except a connection request (REQ or SIDR REQ)
    /// whose listener went between the CM taking it and now: it is refused as one nobody
    /// listens for (REJ reason 8, invalid service ID; SIDR status 1, unsupported), as the
    /// kernel does. Dropped, it stayed half-taken and the peer's retransmits were ignored
    /// as duplicates until its CM gave up.
    pub(crate) fn requeue(&mut self, now: Instant, evs: Vec<CmEvent>) {
        if !self.keep_unhandled {
            for e in evs {
                match e {
                    CmEvent::ReqReceived { id, .. } => {
                        self.counters.refused_unclaimed += 1;
                        let _ = self.cm.reject(now, id, RejectReason::InvalidServiceId, &[]);
                    }
                    CmEvent::SidrReqReceived { id, .. } => {
                        self.counters.refused_unclaimed += 1;
                        let _ = self
                            .cm
                            .sidr_reply(now, id, SidrStatus::Unsupported, 0, 0, &[]);
                    }
                    _ => {}
                }
            }
            return;
        }
        for e in evs.into_iter().rev() {
            self.events.push_front(e);
        }
    }

    /// Hands a received QP1 packet (BTH through ICRC, ICRC already verified) to the CM: the
    /// MAD it carries when it is one as QP 1 takes it ([`device::unframe_mad`]); counts it
    /// as dropped otherwise.
    pub(crate) fn receive(&mut self, now: Instant, src: IpAddr, pkt: &[u8]) {
        match device::unframe_mad(pkt) {
            Some(m) => {
                trace_mad("received", src, m);
                if let Some(early) = self.early.as_mut().filter(|e| e.len() < EARLY_MAX) {
                    let attr = mad::Packet::new_checked(m).map(|p| p.attribute_id());
                    if matches!(attr, Ok(mad::ATTR_CM_REQ | mad::ATTR_CM_SIDR_REQ)) {
                        early.push((src, m.to_vec()));
                        return;
                    }
                }
                self.cm.handle_mad(now, src, m)
            }
            None => self.counters.dropped += 1,
        }
    }

    /// The device was announced to the connection-manager layer (its wildcard listeners
    /// listen on it now): the connection requests kept until then go to the CM, in order.
    pub(crate) fn announced(&mut self, now: Instant) {
        for (src, m) in self.early.take().unwrap_or_default() {
            self.cm.handle_mad(now, src, &m);
        }
    }

    /// Collects the CM's events after an input.
    pub(crate) fn collect_events(&mut self) {
        while let Some(e) = self.cm.poll_event() {
            self.events.push_back(e);
        }
    }

    /// Writes the next MAD to send as a complete RoCEv2 packet (ICRC bytes reserved) into
    /// `buf`, the MAD in place behind the headers; returns its length and destination.
    pub(crate) fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<(usize, IpAddr)> {
        let len = device::gsi::frame_headers(buf, self.psn)?;
        let at = device::gsi::MAD_AT;
        let t = self
            .cm
            .poll_transmit_into(&mut buf[at..len - roce::ICRC_LEN])?;
        self.psn = (self.psn + 1) & 0xff_ffff;
        trace_mad("sent", t.dest, &buf[at..len - roce::ICRC_LEN]);
        Some((len, t.dest))
    }
}

/// Logs a MAD at debug level (`SOFTRDMA_LOG=softrdma::provider::gsi=debug`): the attribute
/// (REQ, REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR, SIDR_REQ, SIDR_REP or the number), the
/// transaction ID and the peer, to follow a connection that does not come up.
fn trace_mad(what: &str, peer: IpAddr, m: &[u8]) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let Ok(p) = mad::Packet::new_checked(m) else {
        tracing::debug!(%peer, len = m.len(), "CM: {what} a short MAD");
        return;
    };
    let attr = p.attribute_id();
    let name = match attr {
        mad::ATTR_CM_REQ => "REQ",
        mad::ATTR_CM_MRA => "MRA",
        mad::ATTR_CM_REJ => "REJ",
        mad::ATTR_CM_REP => "REP",
        mad::ATTR_CM_RTU => "RTU",
        mad::ATTR_CM_DREQ => "DREQ",
        mad::ATTR_CM_DREP => "DREP",
        mad::ATTR_CM_SIDR_REQ => "SIDR_REQ",
        mad::ATTR_CM_SIDR_REP => "SIDR_REP",
        mad::ATTR_CM_LAP => "LAP",
        mad::ATTR_CM_APR => "APR",
        _ => "",
    };
    tracing::debug!(
        %peer,
        tid = format_args!("{:#x}", p.transaction_id()),
        "CM: {what} {name} (attribute {attr:#06x})"
    );
}

impl Gsi {
    /// Sends what the CM wants sent through `wire`, collects its events and returns its next
    /// deadline (for the timer of QP 1).
    pub(crate) fn drive(&mut self, wire: &Wire, tx: &mut TxBatch) -> Option<Instant> {
        loop {
            if tx.is_full() {
                wire.send(tx);
            }
            let Some((len, dst)) = self.poll_transmit(tx.slot()) else {
                break;
            };
            tx.commit(len, wire.local.ip(), dst);
        }
        self.collect_events();
        self.cm.poll_timeout()
    }

    /// Makes the CM accept requests for the service `sid`, claiming it on the shared device
    /// `share`; says whether this process did not listen on it before.
    ///
    /// Fails with `EADDRINUSE` when another process listens on `sid` on this device.
    pub(crate) fn listen(&mut self, share: &Share, sid: u64) -> Result<bool> {
        if self.claims.contains_key(&sid) {
            let _ = self.cm.listen(sid);
            return Ok(false);
        }
        let claim = share.claim_service(sid)?;
        self.claims.insert(sid, claim);
        let _ = self.cm.listen(sid);
        Ok(true)
    }

    /// Stops accepting requests for `sid` and lets go of its claim.
    pub(crate) fn unlisten(&mut self, sid: u64) {
        self.cm.unlisten(sid);
        self.claims.remove(&sid);
    }

    /// Takes the ICMP errors read from the device socket: a port unreachable from a peer's
    /// RoCEv2 port ends the CM requests waiting for that peer at once
    /// (`RDMA_CM_EVENT_UNREACHABLE` with status `-ECONNREFUSED`) instead of after every retry.
    pub(crate) fn icmp_errors(&mut self, errs: &[(SocketAddr, i32)]) {
        for (dst, errno) in errs {
            tracing::debug!(%dst, errno, "ICMP error for a sent datagram");
            if *errno == libc::ECONNREFUSED && dst.port() == softrdma_wire::ROCE_V2_UDP_PORT {
                self.cm.handle_port_unreachable(Instant::now(), dst.ip());
            }
        }
    }
}

/// The slot of the other process sharing the device (`share`) that a CM MAD (`pkt`, BTH to
/// ICRC) is for, if it is not for this one: a REQ or SIDR_REQ goes to the process that
/// listens on its service ID (not this one's QP 1, `gsi`), a SIDR_REP to the owner of its
/// request ID, every other CM message to the owner of the communication ID it names as the
/// receiver's.
pub(crate) fn mad_owner(gsi: &Mutex<Gsi>, share: &Share, pkt: &[u8]) -> Option<u8> {
    // BTH (12) and DETH (8), then the MAD: class at 1, attribute at 16, then the CM data.
    let mad = pkt.get(20..20 + mad::MAD_SIZE)?;
    if mad[1] != mad::MGMT_CLASS_CM {
        return None;
    }
    let be32 = |at: usize| u32::from_be_bytes([mad[at], mad[at + 1], mad[at + 2], mad[at + 3]]);
    let slot = match u16::from_be_bytes([mad[16], mad[17]]) {
        mad::ATTR_CM_REQ | mad::ATTR_CM_SIDR_REQ => {
            let sid = (u64::from(be32(32)) << 32) | u64::from(be32(36));
            let local = gsi
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cm
                .is_listening(sid);
            if local {
                return None;
            }
            share.service_owner(sid)?
        }
        mad::ATTR_CM_SIDR_REP => slot_of_comm_id(be32(24)),
        _ => slot_of_comm_id(be32(28)),
    };
    (slot != share.slot() && (FIRST_SLOT..=LAST_SLOT).contains(&slot)).then_some(slot)
}

/// Sends a liveness probe through `wire` to every peer the CM of `gsi` has a connection
/// with.
pub(crate) fn probe_peers(gsi: &Mutex<Gsi>, wire: &Wire) {
    let peers = gsi
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .cm
        .connected_peers();
    for ip in peers {
        wire.sock
            .send_probe(SocketAddr::new(ip, softrdma_wire::ROCE_V2_UDP_PORT));
        wire.counters.probes_sent.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Gsi;
    use crate::provider::engine::Engine;
    use crate::Device;
    use softrdma_proto::cm::{AcceptParams, CmEvent, ConnectRequest};
    use softrdma_wire::cm::{RejectReason, TransportServiceType};
    use softrdma_wire::cma::{service_id, PortSpace};
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A device address of this run's own, as text.
    fn unique() -> String {
        crate::testing::unique_loopback_addr().to_string()
    }

    /// The engine of a device opened at `addr`, which hands unclaimed requests up to the test.
    fn engine(addr: &str) -> (crate::Context, Arc<Engine>) {
        let (ctx, e) = start(addr);
        e.with_cm(|g, _| g.keep_unhandled = true);
        (ctx, e)
    }

    /// The engine of a device opened at `addr`, as rdma_cm finds it.
    fn start(addr: &str) -> (crate::Context, Arc<Engine>) {
        let ctx = Device::from_addr(addr.parse().unwrap())
            .unwrap()
            .open()
            .unwrap();
        let dev = ctx.inner.shared.device.clone();
        let e = Engine::get_or_start(dev.addr(), dev.ifindex()).unwrap();
        (ctx, e)
    }

    fn next_event(e: &Engine) -> CmEvent {
        let t = Instant::now();
        loop {
            if let Some(ev) = e.with_cm(|g, _| g.take_events().into_iter().next()) {
                return ev;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "no CM event");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sends a request from `client` to port `port` of the device at `sa` and expects REJ 8.
    fn connect_is_rejected_with_reason_8(client: &Engine, sa: &str, port: u16) {
        let id = client
            .with_cm(|g, now| g.cm.connect(now, request(sa, port)))
            .unwrap();
        match next_event(client) {
            CmEvent::Rejected { id: x, reason, .. } => {
                assert_eq!(x, id);
                assert_eq!(reason, RejectReason::InvalidServiceId);
            }
            other => panic!("expected REJ 8, got {other:?}"),
        }
    }

    fn request(dst: &str, port: u16) -> ConnectRequest {
        ConnectRequest {
            dst: dst.parse().unwrap(),
            service_id: service_id(PortSpace::Tcp, port),
            local_qpn: 0x123,
            starting_psn: 0x456,
            transport: TransportServiceType::Rc,
            responder_resources: 4,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            flow_control: true,
            path_mtu: 5,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            sl: 0,
            packet_rate: 0,
            private_data: b"hello".to_vec(),
        }
    }

    #[test]
    fn two_devices_connect_and_disconnect_over_qp1() {
        let pcap = std::env::temp_dir().join(format!("softrdma-cm-{}.pcap", std::process::id()));
        crate::start_capture(&pcap).unwrap();
        let (ca, sa) = (unique(), unique());
        let (_c1, client) = engine(&ca);
        let (_c2, server) = engine(&sa);
        server
            .with_cm(|g, _| g.cm.listen(service_id(PortSpace::Tcp, 7471)))
            .unwrap();
        let id = client
            .with_cm(|g, now| g.cm.connect(now, request(&sa, 7471)))
            .unwrap();
        let CmEvent::ReqReceived { id: sid, src, req } = next_event(&server) else {
            panic!("expected a REQ")
        };
        assert_eq!(src, ca.parse::<std::net::IpAddr>().unwrap());
        assert_eq!((req.remote_qpn, req.starting_psn), (0x123, 0x456));
        assert_eq!(&req.private_data[..5], b"hello");
        server
            .with_cm(|g, now| {
                g.cm.accept(
                    now,
                    sid,
                    AcceptParams {
                        local_qpn: 0x789,
                        starting_psn: 0xabc,
                        responder_resources: 4,
                        initiator_depth: 4,
                        rnr_retry_count: 7,
                        srq: false,
                        flow_control: true,
                        private_data: b"welcome".to_vec(),
                    },
                )
            })
            .unwrap();
        let CmEvent::RepReceived { id: cid, rep } = next_event(&client) else {
            panic!("expected a REP")
        };
        assert_eq!(cid, id);
        assert_eq!((rep.remote_qpn, rep.starting_psn), (0x789, 0xabc));
        client
            .with_cm(|g, now| g.cm.send_rtu(now, id, &[]))
            .unwrap();
        assert!(matches!(next_event(&server), CmEvent::Established { id, .. } if id == sid));
        client
            .with_cm(|g, now| g.cm.disconnect(now, id, &[]))
            .unwrap();
        assert!(
            matches!(next_event(&server), CmEvent::DisconnectRequested { id, .. } if id == sid)
        );
        assert!(matches!(next_event(&client), CmEvent::Disconnected { id: x } if x == id));
        assert!(client.counters().rx_packets >= 2 && server.counters().rx_packets >= 3);
        crate::stop_capture().unwrap();
        // Every MAD on the wire is a valid RoCEv2 UD packet to QP 1 with a good ICRC, and the
        // CM messages are the ones rdma_cm sends.
        let data = std::fs::read(&pcap).unwrap();
        let mut attrs = std::collections::BTreeSet::new();
        for rec in softrdma_wire::pcap::PcapReader::new(&data)
            .unwrap()
            .records()
        {
            let rec = rec.unwrap();
            let d = softrdma_wire::ip::parse_ethernet_udp(rec.data).unwrap();
            softrdma_wire::icrc::verify(&rec.data[14..]).unwrap();
            let p = softrdma_wire::roce::Packet::new_checked(d.payload).unwrap();
            if p.bth().dest_qp() == 1 {
                let m = softrdma_wire::mad::Packet::new_checked(p.payload()).unwrap();
                attrs.insert(m.attribute_id());
            }
        }
        let _ = std::fs::remove_file(&pcap);
        for a in [0x10u16, 0x13, 0x14, 0x15, 0x16] {
            assert!(
                attrs.contains(&a),
                "CM attribute {a:#x} missing from {attrs:x?}"
            );
        }
    }

    #[test]
    fn limits_come_from_the_environment_or_the_defaults() {
        use super::{limits_from, ENV_MAX_CONNECTIONS, ENV_MAX_PENDING_REQS};
        use softrdma_proto::cm::{DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING_REQS};
        let none = |_: &str| None;
        assert_eq!(
            limits_from(none),
            (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING_REQS)
        );
        let set = |k: &str| match k {
            ENV_MAX_CONNECTIONS => Some("500000".to_string()),
            ENV_MAX_PENDING_REQS => Some(" 12 ".to_string()),
            _ => None,
        };
        assert_eq!(limits_from(set), (500_000, 12));
        let bad = |k: &str| (k == ENV_MAX_PENDING_REQS).then(|| "lots".to_string());
        assert_eq!(
            limits_from(bad),
            (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING_REQS)
        );
    }

    /// A request that the CM takes for a service it listens on but that no rdma_cm id
    /// claims when handed up (its listener went in between, or, here, none was ever made)
    /// is refused at once with REJ reason 8. Dropped, it stayed half-taken and the peer's
    /// retransmits were ignored as duplicates: perftest's rdma_cm client hung.
    #[test]
    fn a_request_taken_but_claimed_by_no_listener_is_refused_with_reason_8() {
        let (ca, sa) = (unique(), unique());
        let (_c1, client) = engine(&ca);
        let (_c2, server) = start(&sa);
        assert!(server.cm_listen(service_id(PortSpace::Tcp, 9998)).unwrap());
        connect_is_rejected_with_reason_8(&client, &sa, 9998);
        let stats = server.with_cm(|g, _| g.stats());
        assert_eq!(stats.refused_unclaimed, 1);
        assert_eq!(stats.pending_reqs, 0);
    }

    /// Connection requests that reach a device before it is announced to the connection
    /// manager (its socket is up; a wildcard listener attaches at the announcement) wait
    /// for it, in order, instead of being refused: then one for a service listened on by
    /// then is reported, one for no service is refused (REJ 8). Other MADs are not kept.
    #[test]
    fn requests_before_the_announcement_wait_for_it() {
        let (a_ip, b_ip): (IpAddr, IpAddr) =
            ("198.18.7.1".parse().unwrap(), "198.18.7.2".parse().unwrap());
        let now = Instant::now();
        let mut a = Gsi::new(a_ip, 1, 5);
        a.announced(now);
        let mut b = Gsi::new(b_ip, 2, 6);
        let mut buf = vec![0u8; 512];
        let mut send = |from: &mut Gsi, src: IpAddr, to: &mut Gsi| {
            let mut n = 0;
            while let Some((len, _)) = from.poll_transmit(&mut buf) {
                to.receive(now, src, &buf[..len]);
                n += 1;
            }
            n
        };
        let listened = service_id(PortSpace::Tcp, 7001);
        let r1 = a.cm.connect(now, request("198.18.7.2", 7001)).unwrap();
        // (Each from a QP of its own: a second REQ from one QP is a stale one.)
        let mut q2 = request("198.18.7.2", 7002);
        q2.local_qpn += 1;
        let r2 = a.cm.connect(now, q2).unwrap();
        assert_eq!(send(&mut a, a_ip, &mut b), 2);
        // Kept: nothing answered, nothing reported.
        b.collect_events();
        assert!(b.take_events().is_empty());
        assert_eq!(send(&mut b, b_ip, &mut a), 0);
        // Listened on by the announcement (as a wildcard listener attaches then).
        b.cm.listen(listened).unwrap();
        b.announced(now);
        b.collect_events();
        let evs = b.take_events();
        assert!(
            matches!(&evs[..], [CmEvent::ReqReceived { req, .. }] if req.service_id == listened),
            "{evs:?}"
        );
        // The other is refused with reason 8.
        assert_eq!(send(&mut b, b_ip, &mut a), 1);
        a.collect_events();
        let evs = a.take_events();
        match &evs[..] {
            [CmEvent::Rejected { id, reason, .. }] => {
                assert_eq!((id, reason), (&r2, &RejectReason::InvalidServiceId));
            }
            other => panic!("{other:?}"),
        }
        let _ = r1;
        // Once announced, nothing is kept: a request is answered at once.
        let mut q3 = request("198.18.7.2", 7003);
        q3.local_qpn += 2;
        a.cm.connect(now, q3).unwrap();
        assert_eq!(send(&mut a, a_ip, &mut b), 1);
        assert_eq!(send(&mut b, b_ip, &mut a), 1, "REJ at once");
    }

    #[test]
    fn a_request_nobody_listens_for_is_rejected_with_reason_8() {
        let (ca, sa) = (unique(), unique());
        let (_c1, client) = engine(&ca);
        let (_c2, _server) = engine(&sa);
        connect_is_rejected_with_reason_8(&client, &sa, 9999);
    }
}
