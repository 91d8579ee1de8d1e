//! cmtime: librdmacm's connection set-up timing test, on softrdma.
//!
//! ```text
//! cmtime [-s server_address] [-b bind_address] [-c connections] [-p port_number]
//!        [-q base_qpn] [-r retries] [-t timeout_ms]
//! ```
//!
//! Run the server first (no `-s`; it listens on `-b`, or on every device, port `-p`, default
//! 7471), then the client with `-s`; both with the same `-c` (default 100). On one machine
//! give each its own `-b` address (e.g. 127.0.0.90 and .91): a softrdma device address is
//! one process's, and a server without `-b` opens them all. As rdma-core's
//! `cmtime` (the two-process form with these flags), each side runs three rounds: a warm-up
//! with one connection, `-c` connections with RC QPs, and `-c` connections without QPs (the
//! QP numbers `base_qpn`, `base_qpn + 1`, … are announced but no QP exists). In each round
//! the client creates its ids and binds them one after the other, then resolves every
//! address, every route and connects every connection concurrently over one asynchronous
//! event channel; the QPs are the application's own (`ibv_create_qp`), moved with
//! `rdma_init_qp_attr` and completed with `rdma_establish` on CONNECT_RESPONSE; then it
//! disconnects them all and destroys QPs and ids. The server accepts every request in a
//! worker thread (QP to INIT, RTR, RTS, then `rdma_accept` with the QP number) and answers
//! each DISCONNECTED with `rdma_disconnect` in another.
//!
//! After each measured round both print cmtime's table: per step, the average per connection
//! (`us/conn`), the sum over connections, the slowest and fastest connection, the wall time
//! of the step for all connections together (`total`) and that divided by the connections
//! (`avg/iter`), all in microseconds; 0 where a side does not time a step.
//!
//! softrdma additions, printed after the table and labeled as such: connections established
//! and torn down per second (the number of connections divided by the wall time of the
//! `cm connect` and `disconnect` steps), and memory per connected RC QP (the process's
//! VmRSS with every connection of the QP round established, minus VmRSS before the round
//! created anything, divided by the connections). A line of the device's connection-manager
//! counters over the run (MADs sent and retransmitted, REJ 3 refusals, drops) shows whether a
//! round waited on a retransmission timer (a REQ dropped by a full listen backlog or a full
//! UDP receive buffer is retried about 6 s later). The last line is machine-readable:
//! `cmtime-json {"role":…,"connections":…,"connect_per_sec":…,"disconnect_per_sec":…,
//! "rss_per_qp_bytes":…,…}`.
//!
//! One deviation: where cmtime spins in `sched_yield` until a step's events have arrived, this
//! port sleeps on a condition variable, so that the waiting thread does not take a core from
//! the device's progress thread and the event thread (the machine this runs on may have two).

use softrdma::rdma_cm::{self, CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::{Context, Cq, Pd, Qp, QpCap, QpInitAttr, QpState, QpType};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

const STEP_FULL_CONNECT: usize = 0;
const STEP_CREATE_ID: usize = 1;
const STEP_BIND: usize = 2;
const STEP_RESOLVE_ADDR: usize = 3;
const STEP_RESOLVE_ROUTE: usize = 4;
const STEP_CREATE_QP: usize = 5;
const STEP_INIT_QP_ATTR: usize = 6;
const STEP_INIT_QP: usize = 7;
const STEP_RTR_QP_ATTR: usize = 8;
const STEP_RTS_QP_ATTR: usize = 10;
const STEP_CONNECT: usize = 12;
const STEP_ESTABLISH: usize = 13;
const STEP_DISCONNECT: usize = 14;
const STEP_DESTROY_ID: usize = 15;
const STEP_DESTROY_QP: usize = 16;
const STEP_CNT: usize = 17;

/// The names of the steps, in cmtime's order (each `*_qp_attr` step is followed by the
/// modify step it feeds).
const STEP_NAMES: [&str; STEP_CNT] = [
    "full connect",
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "init qp attr",
    "init qp",
    "rtr qp attr",
    "rtr qp",
    "rts qp attr",
    "rts qp",
    "cm connect",
    "establish",
    "disconnect",
    "destroy id",
    "destroy qp",
];

/// Context of the listening id (its connection requests' ids inherit it).
const LISTEN_CONTEXT: u64 = u64::MAX;

/// Microseconds on a monotonic clock, never 0 (0 means "not measured").
fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// The process's resident set size (VmRSS of /proc/self/status), in bytes.
fn vm_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The command line.
#[derive(Debug, Clone)]
struct Opts {
    dst: Option<IpAddr>,
    src: Option<IpAddr>,
    connections: u32,
    port: u16,
    base_qpn: u32,
    retries: i32,
    timeout_ms: u32,
}

fn usage() {
    println!("usage: cmtime");
    println!("\t[-s server_address]");
    println!("\t[-b bind_address]");
    println!("\t[-c connections]");
    println!("\t[-p port_number]");
    println!("\t[-q base_qpn]");
    println!("\t[-r retries]");
    println!("\t[-t timeout_ms]");
}

/// A host name or address, resolved with rdma_getaddrinfo.
fn get_addr(s: &str) -> Result<IpAddr, String> {
    match rdma_cm::getaddrinfo(Some(s), None, None) {
        Ok(v) => v
            .first()
            .and_then(|a| a.ai_dst_addr)
            .map(|a| a.ip())
            .ok_or_else(|| format!("getaddrinfo gave no address for {s}")),
        Err(e) => Err(format!("getaddrinfo {s}: {e}")),
    }
}

/// getopt("s:b:c:p:q:r:t:"): values attached (`-c100`) or separate (`-c 100`).
fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        dst: None,
        src: None,
        connections: 100,
        port: 7471,
        base_qpn: 1000,
        retries: 2,
        timeout_ms: 2000,
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let mut chars = arg.chars();
        let (Some('-'), Some(c)) = (chars.next(), chars.next()) else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        if !"sbcpqrt".contains(c) {
            return Err(format!("unknown option -{c}"));
        }
        let rest: String = chars.collect();
        let v = if !rest.is_empty() {
            rest
        } else if i < args.len() {
            i += 1;
            args[i - 1].clone()
        } else {
            return Err(format!("option -{c} needs a value"));
        };
        let num = |what: &str| -> Result<i64, String> {
            v.parse::<i64>()
                .map_err(|_| format!("invalid {what} {v:?}"))
        };
        match c {
            's' => o.dst = Some(get_addr(&v)?),
            'b' => o.src = Some(get_addr(&v)?),
            'c' => {
                let n = num("connection count")?;
                if !(1..=i64::from(u32::MAX)).contains(&n) {
                    return Err(format!("invalid connection count {n}"));
                }
                o.connections = n as u32;
            }
            'p' => o.port = v.parse().map_err(|_| format!("invalid port {v:?}"))?,
            'q' => o.base_qpn = num("base QPN")? as u32 & 0xff_ffff,
            'r' => o.retries = num("retry count")? as i32,
            't' => o.timeout_ms = num("timeout")?.max(0) as u32,
            _ => return Err(format!("unknown option -{c}")),
        }
    }
    if o.base_qpn == 0 {
        return Err("the base QPN must not be 0".into());
    }
    Ok(o)
}

/// One connection (cmtime's `struct node`).
#[derive(Default)]
struct Node {
    id: Option<CmId>,
    qp: Option<Qp>,
    times: [[u64; 2]; STEP_CNT],
    retries: i32,
}

impl Node {
    fn start(&mut self, step: usize) {
        self.times[step][0] = now_us();
    }

    fn end(&mut self, step: usize) {
        self.times[step][1] = now_us();
    }
}

/// The PD and the one CQ all QPs use (cmtime's `open_verbs`, on the first id's device).
struct Verbs {
    _ctx: Arc<Context>,
    pd: Pd,
    cq: Cq,
}

/// One round of the test (`reset_test`): its connections, step times and counters.
struct Test {
    round: u32,
    connections: u32,
    nodes: Vec<Mutex<Node>>,
    times: Mutex<[[u64; 2]; STEP_CNT]>,
    started: [AtomicU32; STEP_CNT],
    completed: [AtomicU32; STEP_CNT],
    disc_events: AtomicU32,
    established: AtomicU32,
    /// Server: the next node for a connection request.
    node_index: AtomicU32,
    /// Server: node by the peer's address.
    by_peer: Mutex<HashMap<SocketAddr, usize>>,
    /// Round without QPs: the next QP number to announce.
    use_qpn: Option<AtomicU32>,
    rss_before: AtomicU64,
    rss_after: AtomicU64,
    wake: (Mutex<()>, Condvar),
}

impl Test {
    fn new(round: u32, connections: u32, base_qpn: Option<u32>) -> Test {
        Test {
            round,
            connections,
            nodes: (0..connections).map(|_| Mutex::default()).collect(),
            times: Mutex::new([[0; 2]; STEP_CNT]),
            started: std::array::from_fn(|_| AtomicU32::new(0)),
            completed: std::array::from_fn(|_| AtomicU32::new(0)),
            disc_events: AtomicU32::new(0),
            established: AtomicU32::new(0),
            node_index: AtomicU32::new(0),
            by_peer: Mutex::default(),
            use_qpn: base_qpn.map(AtomicU32::new),
            rss_before: AtomicU64::new(0),
            rss_after: AtomicU64::new(0),
            wake: (Mutex::new(()), Condvar::new()),
        }
    }

    fn node(&self, i: usize) -> std::sync::MutexGuard<'_, Node> {
        self.nodes[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start_time(&self, step: usize) {
        self.times.lock().unwrap_or_else(|p| p.into_inner())[step][0] = now_us();
    }

    fn end_time(&self, step: usize) {
        self.times.lock().unwrap_or_else(|p| p.into_inner())[step][1] = now_us();
    }

    fn total_us(&self, step: usize) -> u64 {
        let t = self.times.lock().unwrap_or_else(|p| p.into_inner())[step];
        t[1].saturating_sub(t[0])
    }

    /// Counts a completion of `step` and wakes the waiting thread.
    fn complete(&self, step: usize) -> u32 {
        let n = self.completed[step].fetch_add(1, Ordering::AcqRel) + 1;
        let _g = self.wake.0.lock().unwrap_or_else(|p| p.into_inner());
        self.wake.1.notify_all();
        n
    }

    /// Sleeps until the step's started operations all completed.
    fn wait_step(&self, step: usize) {
        self.wait_until(|| {
            self.completed[step].load(Ordering::Acquire)
                >= self.started[step].load(Ordering::Acquire)
        });
    }

    fn wait_until(&self, done: impl Fn() -> bool) {
        let mut g = self.wake.0.lock().unwrap_or_else(|p| p.into_inner());
        while !done() {
            g = self
                .wake
                .1
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The id context of node `i` of this round (client ids).
    fn context(&self, i: usize) -> u64 {
        (u64::from(self.round) << 32) | i as u64
    }

    /// The next made-up QP number of a round without QPs, skipping the numbers of real QPs
    /// this process had: their connections may still be in timewait at the peer, whose CM
    /// would reject a REQ or REP from the same QP number as stale (reason 10), as Linux's
    /// does. (softrdma's QP numbers are random, so `base_qpn..` may meet one.)
    fn next_qpn(&self, used: &HashSet<u32>) -> Option<u32> {
        let q = self.use_qpn.as_ref()?;
        loop {
            let n = q.fetch_add(1, Ordering::AcqRel) & 0xff_ffff;
            if n != 0 && !used.contains(&n) {
                return Some(n);
            }
        }
    }
}

/// What both sides share across rounds.
struct Shared {
    opts: Opts,
    channel: EventChannel,
    verbs: Mutex<Option<Arc<Verbs>>>,
    /// The numbers of every QP this process created.
    used_qpns: Mutex<HashSet<u32>>,
}

impl Shared {
    /// The PD and CQ, made on the first use from `id`'s device.
    fn verbs(&self, id: &CmId) -> Result<Arc<Verbs>, String> {
        let mut v = self.verbs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = &*v {
            return Ok(v.clone());
        }
        println!("\tAllocating verbs resources");
        let ctx = id.verbs().ok_or("the id is not bound to a device")?;
        let pd = ctx.alloc_pd().map_err(|e| format!("ibv_alloc_pd: {e}"))?;
        let cq = ctx
            .create_cq(1, 0, None, 0)
            .map_err(|e| format!("ibv_create_cq: {e}"))?;
        let made = Arc::new(Verbs { _ctx: ctx, pd, cq });
        *v = Some(made.clone());
        Ok(made)
    }
}

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("cmtime: {msg}");
    std::process::exit(1);
}

/// cmtime's `create_qp`: an RC QP of one work request each way on the shared CQ (nothing in
/// a round without QPs).
fn create_qp(sh: &Shared, t: &Test, i: usize) -> Result<(), String> {
    let id = t.node(i).id.clone().ok_or("no id")?;
    let v = sh.verbs(&id)?;
    let mut n = t.node(i);
    n.start(STEP_CREATE_QP);
    if t.use_qpn.is_none() {
        let mut attr = QpInitAttr {
            qp_context: i as u64,
            send_cq: &v.cq,
            recv_cq: &v.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let qp =
            v.pd.create_qp(&mut attr)
                .map_err(|e| format!("ibv_create_qp: {e}"))?;
        sh.used_qpns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qp.qp_num());
        n.qp = Some(qp);
    }
    n.end(STEP_CREATE_QP);
    Ok(())
}

/// cmtime's `modify_qp`: `rdma_init_qp_attr` for `state` (timed as `attr_step`), then
/// `ibv_modify_qp` (timed as the step after it; skipped without a QP).
fn modify_qp(t: &Test, i: usize, state: QpState, attr_step: usize) -> Result<(), String> {
    let mut n = t.node(i);
    let id = n.id.clone().ok_or("no id")?;
    n.start(attr_step);
    let (attr, mask) = id
        .init_qp_attr(state)
        .map_err(|e| format!("rdma_init_qp_attr({state:?}): {e}"))?;
    n.end(attr_step);
    n.start(attr_step + 1);
    if let Some(qp) = &n.qp {
        qp.modify_qp(&attr, mask.bits())
            .map_err(|e| format!("ibv_modify_qp({state:?}): {e}"))?;
    }
    n.end(attr_step + 1);
    Ok(())
}

/// cmtime's `init_conn_param`: one READ each way, no retries, the QP's number (or the next
/// made-up one).
fn conn_param(sh: &Shared, t: &Test, i: usize) -> ConnParam {
    let qp_num = match &t.node(i).qp {
        Some(qp) => qp.qp_num(),
        None => t
            .next_qpn(&sh.used_qpns.lock().unwrap_or_else(|p| p.into_inner()))
            .unwrap_or(0),
    };
    ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 0,
        rnr_retry_count: 0,
        qp_num,
        ..Default::default()
    }
}

/// The node an event is about: client ids carry (round, index) as their context, the
/// server's are found by their peer's address.
fn node_of(t: &Test, ev: &CmEvent) -> Option<usize> {
    let ctx = ev.id.context();
    if ctx != LISTEN_CONTEXT {
        return ((ctx >> 32) as u32 == t.round)
            .then_some((ctx & 0xffff_ffff) as usize)
            .filter(|&i| i < t.nodes.len());
    }
    let peer = ev.id.peer_addr()?;
    t.by_peer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&peer)
        .copied()
}

/// The server's two work queues, as cmtime has them: connection requests to accept and
/// DISCONNECTED events to answer (node indices).
struct WorkQueues {
    req: Sender<usize>,
    disc: Sender<usize>,
}

/// cmtime's `cma_handler`: one event of the round `t`.
fn cma_handler(sh: &Shared, t: &Arc<Test>, ev: CmEvent, work: Option<&WorkQueues>) {
    let o = &sh.opts;
    if ev.event == CmEventType::ConnectRequest {
        let idx = t.node_index.fetch_add(1, Ordering::AcqRel) as usize;
        if idx >= t.nodes.len() {
            eprintln!("cmtime: more connection requests than -c {}", t.connections);
            let id = ev.id.clone();
            ev.ack();
            let _ = id.reject(&[]);
            id.destroy();
            return;
        }
        if idx == 0 {
            println!("\tAccepting");
            t.start_time(STEP_CONNECT);
            t.start_time(STEP_FULL_CONNECT);
        }
        let id = ev.id.clone();
        if let Some(p) = id.peer_addr() {
            t.by_peer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(p, idx);
        }
        {
            let mut n = t.node(idx);
            n.start(STEP_FULL_CONNECT);
            n.id = Some(id);
        }
        ev.ack();
        if let Some(w) = work {
            let _ = w.req.send(idx);
        }
        return;
    }
    let Some(i) = node_of(t, &ev) else {
        // An event of an id of an earlier round (e.g. TIMEWAIT_EXIT): nothing to do.
        ev.ack();
        return;
    };
    match ev.event {
        CmEventType::AddrResolved => {
            t.node(i).end(STEP_RESOLVE_ADDR);
            t.complete(STEP_RESOLVE_ADDR);
        }
        CmEventType::RouteResolved => {
            t.node(i).end(STEP_RESOLVE_ROUTE);
            t.complete(STEP_RESOLVE_ROUTE);
        }
        CmEventType::ConnectResponse => {
            // conn_handler: our own QP to RTR and RTS, then rdma_establish.
            let r = modify_qp(t, i, QpState::Rtr, STEP_RTR_QP_ATTR)
                .and_then(|()| modify_qp(t, i, QpState::Rts, STEP_RTS_QP_ATTR))
                .and_then(|()| {
                    let mut n = t.node(i);
                    let id = n.id.clone().ok_or("no id")?;
                    n.start(STEP_ESTABLISH);
                    id.establish().map_err(|e| format!("rdma_establish: {e}"))?;
                    n.end(STEP_ESTABLISH);
                    n.end(STEP_CONNECT);
                    n.end(STEP_FULL_CONNECT);
                    Ok(())
                });
            if let Err(e) = r {
                die(e);
            }
            t.complete(STEP_CONNECT);
        }
        CmEventType::Established if work.is_some() => {
            // Server: the RTU arrived.
            let n = t.established.fetch_add(1, Ordering::AcqRel) + 1;
            t.node(i).end(STEP_FULL_CONNECT);
            if n == t.connections {
                t.end_time(STEP_CONNECT);
                t.end_time(STEP_FULL_CONNECT);
                t.rss_after.store(vm_rss_bytes(), Ordering::Release);
            }
        }
        CmEventType::AddrError => {
            let retry = {
                let mut n = t.node(i);
                n.retries -= 1;
                n.retries >= 0
            };
            let id = t.node(i).id.clone();
            if retry {
                if let Some(id) = id {
                    let src = o.src.map(|a| SocketAddr::new(a, 0));
                    let dst =
                        SocketAddr::new(o.dst.unwrap_or(Ipv4Addr::UNSPECIFIED.into()), o.port);
                    if id.resolve_addr(src, dst, o.timeout_ms).is_ok() {
                        ev.ack();
                        return;
                    }
                }
            }
            die(format!("RDMA_CM_EVENT_ADDR_ERROR, error: {}", ev.status));
        }
        CmEventType::RouteError => {
            let retry = {
                let mut n = t.node(i);
                n.retries -= 1;
                n.retries >= 0
            };
            let id = t.node(i).id.clone();
            if retry {
                if let Some(id) = id {
                    if id.resolve_route(o.timeout_ms).is_ok() {
                        ev.ack();
                        return;
                    }
                }
            }
            die(format!("RDMA_CM_EVENT_ROUTE_ERROR, error: {}", ev.status));
        }
        CmEventType::ConnectError | CmEventType::Unreachable | CmEventType::Rejected => {
            die(format!(
                "event: {}, error: {}",
                ev.event.as_str(),
                ev.status
            ));
        }
        CmEventType::Disconnected => {
            let d = t.disc_events.fetch_add(1, Ordering::AcqRel) + 1;
            match work {
                None => {
                    // Client: the peer answered our DREQ.
                    t.node(i).end(STEP_DISCONNECT);
                    t.complete(STEP_DISCONNECT);
                }
                Some(w) => {
                    if d == 1 {
                        println!("\tDisconnecting");
                        t.start_time(STEP_DISCONNECT);
                    }
                    let _ = w.disc.send(i);
                }
            }
        }
        CmEventType::DeviceRemoval | CmEventType::TimewaitExit => {}
        other => println!("Unhandled event: {} ({})", other as u32, other.as_str()),
    }
    ev.ack();
}

/// Waits up to `ms` for `fd` to become readable.
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// cmtime's `process_events`: handles events until every connection of the round was
/// disconnected.
fn process_events(sh: &Shared, t: &Arc<Test>, work: Option<&WorkQueues>) {
    while t.disc_events.load(Ordering::Acquire) < t.connections {
        if !readable(sh.channel.fd(), 100) {
            continue;
        }
        match sh.channel.get_cm_event() {
            Ok(ev) => cma_handler(sh, t, ev, work),
            Err(e) => die(format!("rdma_get_cm_event: {e}")),
        }
    }
}

fn destroy_qps(t: &Test) {
    t.start_time(STEP_DESTROY_QP);
    for i in 0..t.nodes.len() {
        let mut n = t.node(i);
        n.start(STEP_DESTROY_QP);
        if let Some(qp) = n.qp.take() {
            if let Err(e) = qp.destroy() {
                eprintln!("cmtime: ibv_destroy_qp: {}", e.error);
            }
        }
        n.end(STEP_DESTROY_QP);
    }
    t.end_time(STEP_DESTROY_QP);
}

fn destroy_ids(t: &Test) {
    t.start_time(STEP_DESTROY_ID);
    for i in 0..t.nodes.len() {
        let mut n = t.node(i);
        n.start(STEP_DESTROY_ID);
        if let Some(id) = n.id.take() {
            id.destroy();
        }
        n.end(STEP_DESTROY_ID);
    }
    t.end_time(STEP_DESTROY_ID);
}

/// cmtime's `show_perf`.
fn show_perf(t: &Test) {
    let conns = u64::from(t.connections.max(1));
    println!(
        "{:<13}  {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "step", "us/conn", "sum(us)", "max(us)", "min(us)", "total(us)", "avg/iter"
    );
    let times = *t.times.lock().unwrap_or_else(|p| p.into_inner());
    for (s, name) in STEP_NAMES.iter().enumerate() {
        let (mut sum, mut max, mut min) = (0u64, 0u64, u64::MAX);
        for n in &t.nodes {
            let n = n.lock().unwrap_or_else(|p| p.into_inner());
            let [a, b] = n.times[s];
            if a != 0 && b != 0 {
                let d = b.saturating_sub(a);
                sum += d;
                max = max.max(d);
                min = min.min(d);
            }
        }
        if min == u64::MAX {
            min = 0;
        }
        // The sum of the full connect is meaningless (connections overlap).
        if s == STEP_FULL_CONNECT {
            sum = 0;
        }
        let total = if times[s][0] != 0 && times[s][1] != 0 {
            times[s][1].saturating_sub(times[s][0])
        } else {
            0
        };
        println!(
            "{name:<13}: {:>10} {sum:>10} {max:>10} {min:>10} {total:>10} {:>10}",
            sum / conns,
            total / conns
        );
    }
}

/// What a round measured, for the softrdma additions.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    connect_per_sec: f64,
    disconnect_per_sec: f64,
    full_connect_per_sec: f64,
    rss_before: u64,
    rss_after: u64,
}

impl Figures {
    fn of(t: &Test) -> Figures {
        let rate = |us: u64| {
            if us == 0 {
                0.0
            } else {
                f64::from(t.connections) * 1e6 / us as f64
            }
        };
        Figures {
            connect_per_sec: rate(t.total_us(STEP_CONNECT)),
            disconnect_per_sec: rate(t.total_us(STEP_DISCONNECT)),
            full_connect_per_sec: rate(t.total_us(STEP_FULL_CONNECT)),
            rss_before: t.rss_before.load(Ordering::Acquire),
            rss_after: t.rss_after.load(Ordering::Acquire),
        }
    }

    fn rss_per_qp(&self, connections: u32) -> i64 {
        (self.rss_after as i64 - self.rss_before as i64) / i64::from(connections.max(1))
    }
}

/// The connection manager's counters of the device at `ip` over the whole run: retries and
/// drops show where a round waited on a retransmission timer (about 6 s for a REQ).
fn cm_counters(ip: Option<IpAddr>) -> Option<String> {
    let ctx = softrdma::Device::from_addr(ip?).ok()?.open().ok()?;
    let g = ctx.cm_stats();
    Some(format!(
        "  connection manager: {} MADs sent, {} retransmitted, {} refused for no resources \
         (REJ 3), {} dropped at the transmit-queue bound, {} events dropped",
        g.cm.sent.total(),
        g.cm.retransmitted.total(),
        g.cm.dropped_no_resources,
        g.cm.dropped_tx_overflow,
        g.cm.dropped_events
    ))
}

fn print_additions(
    role: &str,
    ip: Option<IpAddr>,
    connections: u32,
    qp: &Figures,
    no_qp: &Figures,
) {
    println!("softrdma additions (not part of rdma-core's cmtime output), {role}:");
    if let Some(line) = cm_counters(ip) {
        println!("{line}");
    }
    println!(
        "  connections established per second:  {:>10.0} with QPs, {:>10.0} without",
        qp.connect_per_sec, no_qp.connect_per_sec
    );
    println!(
        "  connections torn down per second:    {:>10.0} with QPs, {:>10.0} without",
        qp.disconnect_per_sec, no_qp.disconnect_per_sec
    );
    println!(
        "  full set-up (create id .. established) per second: {:.0} with QPs",
        qp.full_connect_per_sec
    );
    println!(
        "  memory per connected RC QP: {} bytes (VmRSS {} KiB with {connections} connections \
         established - {} KiB before the round)",
        qp.rss_per_qp(connections),
        qp.rss_after / 1024,
        qp.rss_before / 1024
    );
    println!(
        "cmtime-json {{\"role\":\"{role}\",\"connections\":{connections},\
         \"connect_per_sec\":{:.1},\"disconnect_per_sec\":{:.1},\"full_connect_per_sec\":{:.1},\
         \"rss_per_qp_bytes\":{},\"rss_before_bytes\":{},\"rss_after_bytes\":{},\
         \"noqp_connect_per_sec\":{:.1},\"noqp_disconnect_per_sec\":{:.1}}}",
        qp.connect_per_sec,
        qp.disconnect_per_sec,
        qp.full_connect_per_sec,
        qp.rss_per_qp(connections),
        qp.rss_before,
        qp.rss_after,
        no_qp.connect_per_sec,
        no_qp.disconnect_per_sec
    );
}

/// cmtime's `client_connect`: one round of `connections`.
fn client_connect(sh: &Arc<Shared>, round: u32, connections: u32, no_qp: bool) -> Arc<Test> {
    let o = &sh.opts;
    let t = Arc::new(Test::new(round, connections, no_qp.then_some(o.base_qpn)));
    let events = {
        let (sh, t) = (sh.clone(), t.clone());
        std::thread::Builder::new()
            .name("cmtime-events".into())
            .spawn(move || process_events(&sh, &t, None))
            .unwrap_or_else(|e| die(format!("pthread_create: {e}")))
    };
    let n = connections as usize;
    let dst = SocketAddr::new(o.dst.expect("client"), o.port);
    let src = o.src.map(|a| SocketAddr::new(a, 0));

    t.rss_before.store(vm_rss_bytes(), Ordering::Release);
    t.start_time(STEP_FULL_CONNECT);
    println!("\tCreating IDs");
    t.start_time(STEP_CREATE_ID);
    for i in 0..n {
        let mut node = t.node(i);
        node.start(STEP_FULL_CONNECT);
        node.start(STEP_CREATE_ID);
        let id = CmId::create(Some(&sh.channel), t.context(i), PortSpace::Tcp)
            .unwrap_or_else(|e| die(format!("rdma_create_id: {e}")));
        node.id = Some(id);
        node.end(STEP_CREATE_ID);
    }
    t.end_time(STEP_CREATE_ID);

    if let Some(src) = src {
        println!("\tBinding addresses");
        t.start_time(STEP_BIND);
        for i in 0..n {
            let mut node = t.node(i);
            node.start(STEP_BIND);
            let id = node.id.clone().expect("created");
            id.bind_addr(src)
                .unwrap_or_else(|e| die(format!("rdma_bind_addr: {e}")));
            node.end(STEP_BIND);
        }
        t.end_time(STEP_BIND);
    }

    println!("\tResolving addresses");
    t.start_time(STEP_RESOLVE_ADDR);
    for i in 0..n {
        let id = {
            let mut node = t.node(i);
            node.retries = o.retries;
            node.start(STEP_RESOLVE_ADDR);
            node.id.clone().expect("created")
        };
        t.started[STEP_RESOLVE_ADDR].fetch_add(1, Ordering::AcqRel);
        id.resolve_addr(src, dst, o.timeout_ms)
            .unwrap_or_else(|e| die(format!("rdma_resolve_addr: {e}")));
    }
    t.wait_step(STEP_RESOLVE_ADDR);
    t.end_time(STEP_RESOLVE_ADDR);

    println!("\tResolving routes");
    t.start_time(STEP_RESOLVE_ROUTE);
    for i in 0..n {
        let id = {
            let mut node = t.node(i);
            node.retries = o.retries;
            node.start(STEP_RESOLVE_ROUTE);
            node.id.clone().expect("created")
        };
        t.started[STEP_RESOLVE_ROUTE].fetch_add(1, Ordering::AcqRel);
        id.resolve_route(o.timeout_ms)
            .unwrap_or_else(|e| die(format!("rdma_resolve_route: {e}")));
    }
    t.wait_step(STEP_RESOLVE_ROUTE);
    t.end_time(STEP_RESOLVE_ROUTE);

    println!("\tCreating QPs");
    t.start_time(STEP_CREATE_QP);
    for i in 0..n {
        create_qp(sh, &t, i).unwrap_or_else(|e| die(e));
    }
    t.end_time(STEP_CREATE_QP);

    println!("\tModify QPs to INIT");
    t.start_time(STEP_INIT_QP);
    for i in 0..n {
        modify_qp(&t, i, QpState::Init, STEP_INIT_QP_ATTR).unwrap_or_else(|e| die(e));
    }
    t.end_time(STEP_INIT_QP);

    println!("\tConnecting");
    t.start_time(STEP_CONNECT);
    for i in 0..n {
        let param = conn_param(sh, &t, i);
        let id = {
            let mut node = t.node(i);
            node.start(STEP_CONNECT);
            node.id.clone().expect("created")
        };
        t.started[STEP_CONNECT].fetch_add(1, Ordering::AcqRel);
        id.connect(&param)
            .unwrap_or_else(|e| die(format!("rdma_connect: {e}")));
    }
    t.wait_step(STEP_CONNECT);
    t.end_time(STEP_CONNECT);
    t.end_time(STEP_FULL_CONNECT);
    t.rss_after.store(vm_rss_bytes(), Ordering::Release);

    println!("\tDisconnecting");
    t.start_time(STEP_DISCONNECT);
    for i in 0..n {
        let id = {
            let mut node = t.node(i);
            node.start(STEP_DISCONNECT);
            node.id.clone().expect("created")
        };
        t.started[STEP_DISCONNECT].fetch_add(1, Ordering::AcqRel);
        if let Err(e) = id.disconnect() {
            die(format!("rdma_disconnect: {e}"));
        }
    }
    t.wait_step(STEP_DISCONNECT);
    t.end_time(STEP_DISCONNECT);
    let _ = events.join();

    println!("\tDestroying QPs");
    destroy_qps(&t);
    println!("\tDestroying IDs");
    destroy_ids(&t);
    t
}

fn run_client(sh: &Arc<Shared>) {
    let c = sh.opts.connections;
    println!("Client warmup");
    client_connect(sh, 0, 1, false);
    println!("Connect ({c}) QPs test");
    let with = client_connect(sh, 1, c, false);
    show_perf(&with);
    println!("Connect ({c}) test - no QPs");
    let without = client_connect(sh, 2, c, true);
    show_perf(&without);
    print_additions(
        "client",
        sh.opts.src,
        c,
        &Figures::of(&with),
        &Figures::of(&without),
    );
}

/// The server's accept work (cmtime's `req_work_handler`): our own QP to INIT, RTR, RTS,
/// then rdma_accept with its number.
fn accept_one(sh: &Shared, t: &Test, i: usize) -> Result<(), String> {
    create_qp(sh, t, i)?;
    modify_qp(t, i, QpState::Init, STEP_INIT_QP_ATTR)?;
    modify_qp(t, i, QpState::Rtr, STEP_RTR_QP_ATTR)?;
    modify_qp(t, i, QpState::Rts, STEP_RTS_QP_ATTR)?;
    let param = conn_param(sh, t, i);
    let id = t.node(i).id.clone().ok_or("no id")?;
    id.accept(&param)
        .map_err(|e| format!("failure accepting: {e}"))
}

/// cmtime's `server_connect`: one round of `connections`.
fn server_connect(sh: &Arc<Shared>, round: u32, connections: u32, no_qp: bool) -> Arc<Test> {
    let t = Arc::new(Test::new(
        round,
        connections,
        no_qp.then_some(sh.opts.base_qpn),
    ));
    t.rss_before.store(vm_rss_bytes(), Ordering::Release);
    // Two work queues as cmtime has: requests and disconnects.
    let (req_tx, req_rx) = channel::<usize>();
    let (disc_tx, disc_rx) = channel::<usize>();
    let req_worker = {
        let (sh, t) = (sh.clone(), t.clone());
        std::thread::spawn(move || {
            for i in req_rx {
                if let Err(e) = accept_one(&sh, &t, i) {
                    eprintln!("cmtime: {e}");
                    println!("failing connection request");
                    let id = t.node(i).id.clone();
                    if let Some(id) = id {
                        let _ = id.reject(&[]);
                    }
                }
            }
        })
    };
    let disc_worker = {
        let t = t.clone();
        std::thread::spawn(move || {
            for i in disc_rx {
                let id = {
                    let mut n = t.node(i);
                    n.start(STEP_DISCONNECT);
                    n.id.clone()
                };
                if let Some(id) = id {
                    // The client disconnected first: this fails harmlessly, as in cmtime.
                    let _ = id.disconnect();
                }
                t.node(i).end(STEP_DISCONNECT);
                if t.complete(STEP_DISCONNECT) >= t.connections {
                    t.end_time(STEP_DISCONNECT);
                }
            }
        })
    };
    let queues = WorkQueues {
        req: req_tx,
        disc: disc_tx,
    };
    process_events(sh, &t, Some(&queues));
    drop(queues);
    let _ = req_worker.join();
    let _ = disc_worker.join();
    destroy_qps(&t);
    destroy_ids(&t);
    t
}

/// Opens every device so that a wildcard listener hears on all of them (softrdma devices
/// only listen once the process opened them).
fn open_all_devices() -> Vec<Context> {
    softrdma::get_device_list()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|d| d.open().ok().filter(|c| c.local_udp_addr().is_ok()))
        .collect()
}

fn run_server(sh: &Arc<Shared>) {
    let o = &sh.opts;
    let ip = o.src.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let _devices = if ip.is_unspecified() {
        open_all_devices()
    } else {
        Vec::new()
    };
    let listen = CmId::create(Some(&sh.channel), LISTEN_CONTEXT, PortSpace::Tcp)
        .unwrap_or_else(|e| die(format!("listen request failed: {e}")));
    listen
        .bind_addr(SocketAddr::new(ip, o.port))
        .unwrap_or_else(|e| die(format!("bind address failed: {e}")));
    listen
        .listen(0)
        .unwrap_or_else(|e| die(format!("failure trying to listen: {e}")));
    let c = o.connections;
    println!("Server warmup");
    server_connect(sh, 0, 1, false);
    println!("Accept ({c}) QPs test");
    let with = server_connect(sh, 1, c, false);
    show_perf(&with);
    println!("Accept ({c}) test - no QPs");
    let without = server_connect(sh, 2, c, true);
    show_perf(&without);
    listen.destroy();
    print_additions(
        "server",
        o.src,
        c,
        &Figures::of(&with),
        &Figures::of(&without),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cmtime: {e}");
            usage();
            std::process::exit(1);
        }
    };
    let channel =
        EventChannel::new().unwrap_or_else(|e| die(format!("rdma_create_event_channel: {e}")));
    let sh = Arc::new(Shared {
        opts,
        channel,
        verbs: Mutex::new(None),
        used_qpns: Mutex::default(),
    });
    now_us();
    if sh.opts.dst.is_some() {
        run_client(&sh);
    } else {
        run_server(&sh);
    }
}
