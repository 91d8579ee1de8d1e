//! Two (or more) `Cm`s wired through a simulated network driven by a seeded PRNG — loss,
//! duplication, reordering (random per-packet delay) — on a virtual clock.
//!
//! Every scenario runs for many seeds and loss rates 0–30 %, checks the outcome, and runs a
//! second time with the same seed to check the whole trace (events with their virtual times,
//! and the counters) is identical.
//!
//! Each node's CM sits behind a sans-IO [`Device`]: its MADs are framed (UD SEND_ONLY to
//! QP 1, Q_Key 0x80010000) and sealed by it, travel as datagram bytes, and reach the other
//! CM through the receiving device's ICRC check and QP 1 unframing; the CM's deadline is
//! kept in the device's timer table under QP 1.

use softrdma_proto::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmStats, ConnId, ConnectRequest, EVENT_QUEUE_LIMIT,
    TX_QUEUE_LIMIT,
};
use softrdma_proto::device::{Device, DeviceConfig, Received, GSI_QPN};
use softrdma_wire::cm::{
    Message, RejectReason, ReqPath, ReqRepr, SidrStatus, TransportServiceType, REQ_PRIVATE_DATA_LEN,
};
use softrdma_wire::cma::{self, PortSpace};
use softrdma_wire::mad;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// Deterministic randomness of the network
// ------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ------------------------------------------------------------------------------------------
// The simulation
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum OnReq {
    Accept,
    Reject,
    /// delay_reply (MRA armed) and accept after this long.
    DelayAccept(Duration),
}

#[derive(Clone, Copy)]
enum Todo {
    Accept(ConnId),
}

struct Node {
    ip: IpAddr,
    cm: Cm,
    /// The device the CM's MADs go through.
    dev: Device<()>,
    on_req: OnReq,
    /// Virtual ms since start, event.
    log: Vec<(u128, CmEvent)>,
    /// Active side: connections whose RTU we sent.
    rtu_sent: Vec<ConnId>,
    todo: Vec<(Instant, Todo)>,
}

/// A MAD on the wire: (delivery time, sequence, destination node, source IP, the datagram:
/// the framed and sealed MAD).
type InFlight = (Instant, u64, usize, IpAddr, Vec<u8>);
/// Per-node event logs, per-node counters, final virtual ms, MADs sent to nobody.
type Trace = (Vec<Vec<(u128, CmEvent)>>, Vec<CmStats>, u128, u64);

struct Sim {
    t0: Instant,
    now: Instant,
    nodes: Vec<Node>,
    rng: Rng,
    loss: f64,
    dup: f64,
    /// (delivery time, sequence, destination node, source IP, MAD).
    wire: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// MADs sent to an IP nobody has.
    blackholed: u64,
}

const SERVICE: u64 = cma::service_id(PortSpace::Tcp, 7471);
const UDP_SERVICE: u64 = cma::service_id(PortSpace::Udp, 7174);

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, n))
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        local_qpn: 0x99,
        starting_psn: 0x12_3456,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        flow_control: false,
        private_data: b"welcome".to_vec(),
    }
}

fn connect_params(dst: IpAddr) -> ConnectRequest {
    ConnectRequest {
        dst,
        service_id: SERVICE,
        local_qpn: 0x42,
        starting_psn: 0x65_4321,
        transport: TransportServiceType::Rc,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: false,
        path_mtu: 3,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0x1234,
        sl: 0,
        packet_rate: 0,
        private_data: b"hello".to_vec(),
    }
}

impl Sim {
    fn new(seed: u64, loss: f64, nodes: usize) -> Sim {
        let t0 = Instant::now();
        let nodes = (0..nodes)
            .map(|i| {
                let ip = ip(2 + i as u8);
                let cfg = CmConfig::new(
                    ip,
                    0x5054_00ff_fe00_0000 | i as u64,
                    seed ^ (i as u64 * 0x1_0001),
                );
                Node {
                    ip,
                    cm: Cm::new(cfg),
                    dev: Device::new(DeviceConfig {
                        gsi_psn: (seed as u32 ^ i as u32) & 0xff_ffff,
                        ..DeviceConfig::new(ip)
                    }),
                    on_req: OnReq::Accept,
                    log: Vec::new(),
                    rtu_sent: Vec::new(),
                    todo: Vec::new(),
                }
            })
            .collect();
        Sim {
            t0,
            now: t0,
            nodes,
            rng: Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xabcdef),
            loss,
            dup: if loss > 0.0 { 0.05 } else { 0.0 },
            wire: BinaryHeap::new(),
            seq: 0,
            blackholed: 0,
        }
    }

    fn ms(&self) -> u128 {
        (self.now - self.t0).as_millis()
    }

    /// Moves queued MADs onto the wire, applying loss, duplication and a random delay
    /// (0.1–20 ms, so packets overtake each other).
    fn flush(&mut self) {
        let mut buf = [0u8; 512];
        for i in 0..self.nodes.len() {
            loop {
                let n = &mut self.nodes[i];
                let Some((len, dst)) = n.dev.poll_cm_transmit(&mut n.cm, &mut buf) else {
                    break;
                };
                let pkt = &buf[..len];
                let Some(j) = self.nodes.iter().position(|n| n.ip == dst) else {
                    self.blackholed += 1;
                    continue;
                };
                let copies = if self.rng.unit() < self.dup { 2 } else { 1 };
                for _ in 0..copies {
                    if self.rng.unit() < self.loss {
                        continue;
                    }
                    let delay = Duration::from_micros(100 + self.rng.below(20_000));
                    self.seq += 1;
                    let src = self.nodes[i].ip;
                    self.wire
                        .push(Reverse((self.now + delay, self.seq, j, src, pkt.to_vec())));
                }
            }
        }
    }

    /// Lets every node's application react to its events (the behaviour of a typical
    /// rdma_cm program).
    fn react(&mut self) {
        let now = self.now;
        let ms = self.ms();
        for n in &mut self.nodes {
            while let Some(ev) = n.cm.poll_event() {
                match &ev {
                    CmEvent::ReqReceived { id, .. } => match n.on_req {
                        OnReq::Accept => n.cm.accept(now, *id, accept_params()).unwrap(),
                        OnReq::Reject => {
                            n.cm.reject(now, *id, RejectReason::ConsumerDefined, b"go away")
                                .unwrap()
                        }
                        OnReq::DelayAccept(d) => {
                            n.cm.delay_reply(now, *id, cma::CMA_CM_MRA_SERVICE_TIMEOUT)
                                .unwrap();
                            n.todo.push((now + d, Todo::Accept(*id)));
                        }
                    },
                    CmEvent::RepReceived { id, rep } => {
                        assert_eq!(rep.remote_qpn, 0x99);
                        assert_eq!(&rep.private_data[..7], b"welcome");
                        n.cm.send_rtu(now, *id, b"rtu").unwrap();
                        n.rtu_sent.push(*id);
                    }
                    CmEvent::SidrReqReceived {
                        id, private_data, ..
                    } => {
                        assert_eq!(&private_data[..5], b"whois");
                        n.cm.sidr_reply(
                            now,
                            *id,
                            SidrStatus::Success,
                            0x77,
                            cma::RDMA_UDP_QKEY,
                            b"ud",
                        )
                        .unwrap();
                    }
                    _ => {}
                }
                n.log.push((ms, ev));
            }
            let due: Vec<Todo> = n
                .todo
                .iter()
                .filter(|(t, _)| *t <= now)
                .map(|&(_, a)| a)
                .collect();
            n.todo.retain(|(t, _)| *t > now);
            for a in due {
                match a {
                    Todo::Accept(id) => {
                        // The requester may have given up meanwhile (then the ID is gone).
                        let _ = n.cm.accept(now, id, accept_params());
                    }
                }
            }
        }
    }

    fn settle(&mut self) {
        for _ in 0..4 {
            self.react();
            self.flush();
        }
    }

    /// Gives each device its CM's deadline (under QP 1).
    fn sync_timers(&mut self) {
        for n in &mut self.nodes {
            n.dev.set_timer(GSI_QPN, n.cm.poll_timeout());
        }
    }

    /// Advances the virtual clock event by event until `done` holds, nothing is left to do,
    /// or `limit` of virtual time has passed. Returns whether `done` held.
    fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.settle();
            if done(self) {
                return true;
            }
            self.sync_timers();
            let mut next = self.wire.peek().map(|Reverse(p)| p.0);
            for n in &self.nodes {
                for t in n
                    .dev
                    .poll_timeout()
                    .into_iter()
                    .chain(n.todo.iter().map(|x| x.0))
                {
                    next = Some(next.map_or(t, |x: Instant| x.min(t)));
                }
            }
            let Some(next) = next else {
                return false;
            };
            if next > end {
                return false;
            }
            self.now = self.now.max(next);
            while self.wire.peek().is_some_and(|Reverse(p)| p.0 <= self.now) {
                let Reverse((_, _, j, src, pkt)) = self.wire.pop().unwrap();
                let now = self.now;
                let n = &mut self.nodes[j];
                let from = SocketAddr::new(src, softrdma_wire::ROCE_V2_UDP_PORT);
                match n.dev.handle_datagram(now, from, n.ip, &pkt) {
                    Received::Mad { src, mad } => n.cm.handle_mad(now, src, mad),
                    other => panic!("a CM datagram came out as {other:?}"),
                }
            }
            self.sync_timers();
            let now = self.now;
            let mut due = Vec::new();
            for n in &mut self.nodes {
                due.clear();
                n.dev.handle_timeout(now, &mut due);
                if due.contains(&GSI_QPN) {
                    n.cm.handle_timeout(now);
                }
            }
        }
    }

    fn run_to_end(&mut self) {
        self.run_until(Duration::from_secs(3600), |_| false);
    }

    fn count(&self, i: usize, f: impl Fn(&CmEvent) -> bool) -> usize {
        self.nodes[i].log.iter().filter(|(_, e)| f(e)).count()
    }

    /// Everything observable, for the determinism check.
    fn trace(&self) -> Trace {
        (
            self.nodes.iter().map(|n| n.log.clone()).collect(),
            self.nodes.iter().map(|n| n.cm.stats()).collect(),
            self.ms(),
            self.blackholed,
        )
    }
}

const LOSSES: [f64; 4] = [0.0, 0.1, 0.2, 0.3];
const SEEDS: u64 = 25;

/// Runs `scenario` for every seed and loss rate, twice each, and checks the traces match.
fn for_all(name: &str, scenario: impl Fn(u64, f64) -> Sim) {
    for &loss in &LOSSES {
        let mut retransmitted = 0;
        let mut duplicates = 0;
        for seed in 0..SEEDS {
            let a = scenario(seed, loss);
            let b = scenario(seed, loss);
            assert!(
                a.trace() == b.trace(),
                "{name}: seed {seed} loss {loss}: not reproducible"
            );
            for n in &a.nodes {
                retransmitted += n.cm.stats().retransmitted.total();
                duplicates += n.cm.stats().duplicates.total();
            }
        }
        if loss >= 0.2 {
            // The lossy network really exercised the recovery paths.
            assert!(
                retransmitted > 0,
                "{name}: loss {loss}: no retransmission at all"
            );
        }
        if std::env::var_os("CM_SIM_VERBOSE").is_some() {
            eprintln!(
                "{name}: loss {loss}: {retransmitted} retransmissions, {duplicates} duplicates"
            );
        }
    }
}

fn is_established(e: &CmEvent) -> bool {
    matches!(e, CmEvent::Established { .. })
}
fn is_disc(e: &CmEvent) -> bool {
    matches!(
        e,
        CmEvent::Disconnected { .. } | CmEvent::DisconnectRequested { .. }
    )
}
fn is_tw_exit(e: &CmEvent) -> bool {
    matches!(e, CmEvent::TimewaitExit { .. })
}

#[derive(Clone, Copy, Debug)]
enum Who {
    Client,
    Server,
    Both,
}

fn handshake_then_disconnect(seed: u64, loss: f64, who: Who) -> Sim {
    let mut s = Sim::new(seed, loss, 2);
    s.nodes[1].cm.listen(SERVICE).unwrap();
    let now = s.now;
    let cid = s.nodes[0].cm.connect(now, connect_params(ip(3))).unwrap();
    let ok = s.run_until(Duration::from_secs(600), |s| {
        !s.nodes[0].rtu_sent.is_empty() && s.count(1, is_established) == 1
    });
    assert!(ok, "seed {seed} loss {loss}: handshake did not complete");
    assert_eq!(s.nodes[0].rtu_sent, vec![cid]);
    let Some(CmEvent::Established {
        id: sid,
        private_data,
    }) = s.nodes[1]
        .log
        .iter()
        .map(|x| &x.1)
        .find(|e| is_established(e))
    else {
        unreachable!()
    };
    assert_eq!(&private_data[..3], b"rtu");
    let sid = *sid;
    // REQ private data and the swapped fields reached the server.
    let Some(CmEvent::ReqReceived { req, src, .. }) = s.nodes[1].log.first().map(|x| &x.1) else {
        panic!("first server event is not ReqReceived")
    };
    assert_eq!(*src, ip(2));
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!((req.remote_qpn, req.starting_psn), (0x42, 0x65_4321));
    let now = s.now;
    match who {
        Who::Client => s.nodes[0].cm.disconnect(now, cid, b"bye").unwrap(),
        Who::Server => s.nodes[1].cm.disconnect(now, sid, b"bye").unwrap(),
        Who::Both => {
            s.nodes[0].cm.disconnect(now, cid, b"bye").unwrap();
            s.nodes[1].cm.disconnect(now, sid, b"bye").unwrap();
        }
    }
    s.run_to_end();
    for i in 0..2 {
        assert_eq!(
            s.count(i, is_disc),
            1,
            "seed {seed} loss {loss} {who:?} node {i}: {:?}",
            s.nodes[i].log
        );
        assert_eq!(
            s.count(i, is_tw_exit),
            1,
            "seed {seed} loss {loss} node {i}"
        );
        assert_eq!(s.nodes[i].cm.connection_count(), 0);
        // Timewait exit is the last event.
        assert!(is_tw_exit(&s.nodes[i].log.last().unwrap().1));
    }
    assert_eq!(s.count(1, is_established), 1);
    // The DREQ's private data arrived when the peer's DREQ is what disconnected a side.
    for i in 0..2 {
        for (_, e) in &s.nodes[i].log {
            if let CmEvent::DisconnectRequested { private_data, .. } = e {
                assert_eq!(&private_data[..3], b"bye");
            }
        }
    }
    if loss == 0.0 {
        assert_eq!(s.nodes[0].cm.stats().sent.req, 1);
        assert_eq!(s.nodes[1].cm.stats().sent.rep, 1);
        assert_eq!(s.nodes[0].cm.stats().sent.rtu, 1);
    }
    s
}

#[test]
fn handshake_and_disconnect_by_client() {
    for_all("client disconnect", |seed, loss| {
        let s = handshake_then_disconnect(seed, loss, Who::Client);
        if loss == 0.0 {
            assert!(matches!(
                s.nodes[0].log.last().map(|x| &x.1),
                Some(CmEvent::TimewaitExit { .. })
            ));
            assert_eq!(s.count(0, |e| matches!(e, CmEvent::Disconnected { .. })), 1);
            assert_eq!(
                s.count(1, |e| matches!(e, CmEvent::DisconnectRequested { .. })),
                1
            );
        }
        s
    });
}

#[test]
fn handshake_and_disconnect_by_server() {
    for_all("server disconnect", |seed, loss| {
        let s = handshake_then_disconnect(seed, loss, Who::Server);
        if loss == 0.0 {
            assert_eq!(s.count(1, |e| matches!(e, CmEvent::Disconnected { .. })), 1);
            assert_eq!(
                s.count(0, |e| matches!(e, CmEvent::DisconnectRequested { .. })),
                1
            );
        }
        s
    });
}

#[test]
fn handshake_and_crossing_dreqs() {
    for_all("crossing disconnect", |seed, loss| {
        let s = handshake_then_disconnect(seed, loss, Who::Both);
        if loss == 0.0 {
            // Both DREQs were sent; each side got the other's before any DREP.
            assert_eq!(s.nodes[0].cm.stats().sent.dreq, 1);
            assert_eq!(s.nodes[1].cm.stats().sent.dreq, 1);
        }
        s
    });
}

#[test]
fn reject_with_private_data() {
    for_all("reject", |seed, loss| {
        let mut s = Sim::new(seed, loss, 2);
        s.nodes[1].on_req = OnReq::Reject;
        s.nodes[1].cm.listen(SERVICE).unwrap();
        let now = s.now;
        let cid = s.nodes[0].cm.connect(now, connect_params(ip(3))).unwrap();
        s.run_to_end();
        let rej: Vec<_> = s.nodes[0].log.iter().map(|x| &x.1).collect();
        let [CmEvent::Rejected {
            id,
            reason,
            private_data,
        }] = &rej[..]
        else {
            panic!("seed {seed} loss {loss}: {rej:?}")
        };
        assert_eq!(*id, cid);
        assert_eq!(*reason, RejectReason::ConsumerDefined);
        assert_eq!(&private_data[..7], b"go away");
        assert!(s.count(1, |e| matches!(e, CmEvent::ReqReceived { .. })) >= 1);
        for n in &s.nodes {
            assert_eq!(n.cm.connection_count(), 0);
        }
        s
    });
}

#[test]
fn no_listener_is_reason_8() {
    for_all("no listener", |seed, loss| {
        let mut s = Sim::new(seed, loss, 2);
        let now = s.now;
        let cid = s.nodes[0].cm.connect(now, connect_params(ip(3))).unwrap();
        s.run_to_end();
        let ev: Vec<_> = s.nodes[0].log.iter().map(|x| &x.1).collect();
        assert!(
            matches!(&ev[..], [CmEvent::Rejected { id, reason: RejectReason::InvalidServiceId, .. }] if *id == cid),
            "seed {seed} loss {loss}: {ev:?}"
        );
        assert!(s.nodes[1].log.is_empty());
        assert_eq!(s.nodes[1].cm.connection_count(), 0);
        s
    });
}

#[test]
fn sidr_success_and_no_listener() {
    for_all("sidr", |seed, loss| {
        let mut s = Sim::new(seed, loss, 3);
        s.nodes[1].cm.listen(UDP_SERVICE).unwrap();
        let now = s.now;
        let ok = s.nodes[0]
            .cm
            .sidr_request(now, ip(3), UDP_SERVICE, b"whois")
            .unwrap();
        let none = s.nodes[0]
            .cm
            .sidr_request(now, ip(4), UDP_SERVICE, b"whois")
            .unwrap();
        s.run_to_end();
        let mut got_ok = false;
        let mut got_none = false;
        for (_, e) in &s.nodes[0].log {
            match e {
                CmEvent::SidrRepReceived {
                    id,
                    status,
                    qpn,
                    qkey,
                    private_data,
                } if *id == ok => {
                    assert_eq!(*status, SidrStatus::Success);
                    assert_eq!((*qpn, *qkey), (0x77, cma::RDMA_UDP_QKEY));
                    assert_eq!(&private_data[..2], b"ud");
                    got_ok = true;
                }
                CmEvent::SidrRepReceived { id, status, .. } if *id == none => {
                    assert_eq!(*status, SidrStatus::Unsupported);
                    got_none = true;
                }
                other => panic!("seed {seed} loss {loss}: unexpected {other:?}"),
            }
        }
        assert!(got_ok && got_none, "seed {seed} loss {loss}");
        // Retransmitted SIDR_REQs were answered from the cache: one request event only.
        assert_eq!(
            s.count(1, |e| matches!(e, CmEvent::SidrReqReceived { .. })),
            1
        );
        for n in &s.nodes {
            assert_eq!(n.cm.connection_count(), 0);
        }
        s
    });
}

#[test]
fn req_to_nobody_is_unreachable_after_max_retries() {
    for_all("unreachable", |seed, loss| {
        let mut s = Sim::new(seed, loss, 1);
        let now = s.now;
        let cid = s.nodes[0].cm.connect(now, connect_params(ip(9))).unwrap();
        s.run_to_end();
        let ev: Vec<_> = s.nodes[0].log.iter().collect();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].1, CmEvent::Unreachable { id: cid });
        // 1 + 15 identical REQs, 6144 ms apart; the last one times out too.
        assert_eq!(ev[0].0, 16 * 6144);
        assert_eq!(s.nodes[0].cm.stats().sent.req, 16);
        assert_eq!(s.nodes[0].cm.stats().retransmitted.req, 15);
        assert_eq!(s.blackholed, 16);
        assert_eq!(s.nodes[0].cm.connection_count(), 0);
        s
    });
}

#[test]
fn slow_acceptor_sends_mra() {
    for_all("mra", |seed, loss| {
        let mut s = Sim::new(seed, loss, 2);
        s.nodes[1].on_req = OnReq::DelayAccept(Duration::from_secs(20));
        s.nodes[1].cm.listen(SERVICE).unwrap();
        let now = s.now;
        let cid = s.nodes[0].cm.connect(now, connect_params(ip(3))).unwrap();
        let ok = s.run_until(Duration::from_secs(900), |s| {
            !s.nodes[0].rtu_sent.is_empty() && s.count(1, is_established) == 1
        });
        assert!(
            ok,
            "seed {seed} loss {loss}: {:?} / {:?}",
            s.nodes[0].log, s.nodes[1].log
        );
        assert_eq!(s.nodes[0].rtu_sent, vec![cid]);
        if loss == 0.0 {
            // REQ at 0 and 6144 ms; the duplicate is MRA'd, then nothing until the REP at 20 s.
            assert_eq!(s.nodes[0].cm.stats().sent.req, 2);
            assert_eq!(s.nodes[1].cm.stats().sent.mra, 1);
            assert_eq!(
                s.count(0, |e| matches!(
                    e,
                    CmEvent::MraReceived {
                        service_timeout: 24,
                        ..
                    }
                )),
                1
            );
        }
        s.run_to_end();
        s
    });
}

// ------------------------------------------------------------------------------------------
// Hostile input
// ------------------------------------------------------------------------------------------

fn req_mad(rng: &mut Rng, comm_id: u32, qpn: u32, service_id: u64) -> [u8; 256] {
    let repr = ReqRepr {
        local_comm_id: comm_id,
        vendor_id: 0,
        service_id,
        local_ca_guid: rng.next(),
        local_qkey: 0,
        local_qpn: qpn & 0xFF_FFFF,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: TransportServiceType::Rc,
        end_to_end_flow_control: false,
        starting_psn: 1,
        local_cm_response_timeout: (rng.below(32)) as u8,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: ReqPath::ZERO,
        alternate_path: ReqPath::ZERO,
        sap_supported: false,
        private_data: [0; REQ_PRIVATE_DATA_LEN],
    };
    let mut buf = [0u8; 256];
    Message::Req(repr).emit_mad(rng.next(), &mut buf).unwrap();
    buf
}

#[test]
fn hostile_mads_never_panic_and_stay_bounded() {
    for seed in 0..4u64 {
        let mut rng = Rng(seed);
        let mut cfg = CmConfig::new(ip(3), 2, seed);
        cfg.max_connections = 64;
        cfg.max_pending_reqs = 16;
        let mut cm = Cm::new(cfg);
        cm.listen(SERVICE).unwrap();
        cm.listen(UDP_SERVICE).unwrap();
        let t0 = Instant::now();
        let mut now = t0;
        let attackers = [ip(66), ip(67)];
        let check = |cm: &mut Cm| {
            assert!(cm.connection_count() <= 64);
            assert!(cm.pending_count() <= 16);
        };
        // 1. Random bytes of random lengths, with and without a valid CM header.
        for i in 0..20_000u32 {
            let len = match i % 4 {
                0 => rng.below(300) as usize,
                _ => 256,
            };
            let mut m: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if i % 2 == 1 && len >= 24 {
                m[..4].copy_from_slice(&[1, 7, 2, 3]);
                m[16] = 0;
                m[17] = 0x0F + (rng.below(14) as u8); // 0x0F..=0x1C: around the CM attributes
            }
            let src = attackers[(i % 2) as usize];
            cm.handle_mad(now, src, &m);
            while cm.poll_transmit().is_some() {}
            while cm.poll_event().is_some() {}
            check(&mut cm);
            if i % 1000 == 0 {
                now += Duration::from_secs(1);
                cm.handle_timeout(now);
            }
        }
        // 2. Valid messages of every kind naming random communication IDs.
        for i in 0..5_000u32 {
            let (c, q) = (rng.next() as u32, rng.next() as u32);
            let m = req_mad(&mut rng, c, q, SERVICE);
            let mut m2 = m;
            // Turn the REQ into another attribute: same bytes, different meaning.
            m2[17] = [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x18][(i % 7) as usize];
            m2[24 + 8] &= 0x3F; // keep "message rejected/MRAed" valid
            cm.handle_mad(now, attackers[0], &m2);
            // Truncated copies.
            cm.handle_mad(now, attackers[1], &m[..rng.below(256) as usize]);
            while cm.poll_transmit().is_some() {}
            while cm.poll_event().is_some() {}
            check(&mut cm);
        }
        // 3. A flood of 10k distinct REQs nobody answers: only `max_pending_reqs` are kept,
        //    the rest get REJ 3.
        let before = cm.stats();
        let mut rejs = 0u64;
        for i in 0..10_000u32 {
            let m = req_mad(&mut rng, 0x1000 + i, 0x2000 + i, SERVICE);
            cm.handle_mad(now, attackers[0], &m);
            while let Some((dst, out)) = cm.poll_transmit() {
                assert_eq!(dst, attackers[0]);
                if u16::from_be_bytes([out[16], out[17]]) == mad::ATTR_CM_REJ {
                    rejs += 1;
                }
            }
            check(&mut cm);
        }
        let after = cm.stats();
        assert_eq!(cm.pending_count(), 16);
        assert!(after.dropped_no_resources - before.dropped_no_resources >= 10_000 - 16);
        assert!(rejs >= 10_000 - 16);
        // Events not polled during the flood are bounded.
        let n_events = std::iter::from_fn(|| cm.poll_event()).count();
        assert!(n_events <= EVENT_QUEUE_LIMIT);
        // 4. An owner that never polls: the transmit queue stays bounded.
        for i in 0..(TX_QUEUE_LIMIT as u32 + 100) {
            let m = req_mad(&mut rng, 0x9000_0000 + i, i, 0xdead);
            cm.handle_mad(now, attackers[1], &m);
        }
        assert!(cm.stats().dropped_tx_overflow >= 100);
        while cm.poll_transmit().is_some() {}
        // Everything expires eventually; memory returns to zero.
        for _ in 0..100 {
            match cm.poll_timeout() {
                Some(t) => {
                    now = now.max(t);
                    cm.handle_timeout(now);
                    while cm.poll_transmit().is_some() {}
                    while cm.poll_event().is_some() {}
                }
                None => break,
            }
        }
        // Pending REQs have no timer (they wait for the owner); everything else expired.
        check(&mut cm);
        assert_eq!(cm.connection_count(), cm.pending_count());
        assert!(now - t0 < Duration::from_secs(86_400 * 30));
    }
}
