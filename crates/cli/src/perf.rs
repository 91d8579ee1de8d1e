//! `softrdma perf`: perftest's measurements (ib_write_bw, ib_read_bw, ib_send_bw,
//! ib_atomic_bw, ib_send_lat, ib_write_lat) over an RC connection made by the connection
//! manager: both sides in this process over two loopback devices, or a server
//! (`--server [ADDR]`) and a client (`--connect ADDR`) in two processes or on two machines.
//!
//! # What the two sides exchange
//! The client decides everything; the server follows. The client's connection request
//! carries 24 bytes of private data (big-endian): `"SRPF"`, version 1, the operation (0 write,
//! 1 read, 2 send, 3 atomic), flags (bit 0: latency test), 0, the largest message size (u32),
//! the outstanding work requests (u32), the inline size (u32), the number of QPs (u32; 0 means 1).
//! With `-q N` the client makes N such connections, one after the other, all with the same
//! request, and the server accepts that many. For each, the server creates its
//! QP (that many work requests, that inline size) and a buffer of that size, registered for
//! remote write, read and atomics, posts max(512, work requests) receives for SEND tests (perftest's rx_depth),
//! and accepts with 24 bytes of private data: `"SRPF"`, version 1, 0, 0, 0, the buffer's
//! address (u64), its rkey (u32) and its length (u32). Anything else is rejected (server) or
//! refused (client) with a message saying so.
//!
//! The client then measures. For SEND tests the server busy-polls its CQ, reposting each
//! receive and, for latency, answering each message with one of the same length; for the
//! other operations it only waits (its device's progress thread does the work, as a target of
//! one-sided operations should). The client's disconnect ends the test on both sides.

use softrdma::rdma_cm::{CmEventType, CmId, ConnParam, PortSpace};
use softrdma::*;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The port a server listens on unless told otherwise (perftest's).
pub const DEFAULT_PORT: u16 = 18515;

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// RDMA WRITE (ib_write_bw / ib_write_lat).
    Write,
    /// RDMA READ (ib_read_bw / ib_read_lat).
    Read,
    /// SEND / RECV (ib_send_bw / ib_send_lat).
    Send,
    /// FETCH_AND_ADD (ib_atomic_bw).
    Atomic,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Write => 0,
            Op::Read => 1,
            Op::Send => 2,
            Op::Atomic => 3,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        Some(match c {
            0 => Op::Write,
            1 => Op::Read,
            2 => Op::Send,
            3 => Op::Atomic,
            _ => return None,
        })
    }

    /// The lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
}

/// Which sides this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Both, over two devices (`client` and `server` addresses).
    Local,
    /// The server, listening on this device address.
    Server(IpAddr),
    /// The client, connecting to a server at this address.
    Client(IpAddr),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfArgs {
    pub op: Op,
    /// QPs (connections) measured at once, each driven by its own thread (perftest's `-q`).
    pub qps: usize,
    pub sizes: Vec<usize>,
    pub iters: u64,
    pub duration: Option<Duration>,
    pub lat: bool,
    pub inline: u32,
    pub mtu: Mtu,
    pub tx_depth: usize,
    pub client: IpAddr,
    pub server: IpAddr,
    pub json: bool,
    /// Check every message (local SEND bandwidth only): exactly once, in order, byte-exact.
    pub verify: bool,
    pub mode: Mode,
    /// The server's port (0 in local mode: an ephemeral one).
    pub port: u16,
}

/// One measured point.
#[derive(Debug, Clone, Default)]
pub struct Point {
    pub size: usize,
    pub iters: u64,
    pub secs: f64,
    pub bw_gbps: f64,
    pub msg_rate_mps: f64,
    /// One-way latencies in microseconds, sorted.
    pub lat_us: Vec<f64>,
    /// Times this process's threads were preempted (involuntary context switches) while
    /// the point was measured: a busy-polling benchmark that was preempted often measured
    /// the machine's load, not softrdma.
    pub preemptions: u64,
}

/// Involuntary context switches of this process so far (`getrusage`'s `ru_nivcsw`).
pub fn preemptions() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0;
        }
        ru.ru_nivcsw as u64
    }
}

/// The counters of one side at the end of a run.
#[derive(Debug, Clone)]
pub struct SideCounters {
    /// "client" or "server".
    pub who: &'static str,
    /// The device's address.
    pub addr: IpAddr,
    pub device: DeviceCounters,
    /// The QP's counters; with several QPs, their sums.
    pub qp: QpCounters,
    /// How many QPs `qp` sums.
    pub qps: usize,
}

impl SideCounters {
    /// The counters of one side with several QPs: the device's, and the QPs' summed.
    fn of(who: &'static str, ends: &[End]) -> SideCounters {
        let mut side = ends[0].counters(who);
        for e in &ends[1..] {
            side.qp += e.qp.counters();
        }
        side.qps = ends.len();
        side
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub points: Vec<Point>,
    /// The client first, then (local runs) the server.
    pub sides: Vec<SideCounters>,
}

const MAGIC: &[u8; 4] = b"SRPF";
const VERSION: u8 = 1;
const MSG_LEN: usize = 24;
/// The most outstanding work requests a server agrees to.
const MAX_DEPTH: u32 = 16384;
/// The most QPs of one test.
pub const MAX_QPS: usize = 256;

/// Receives the server of a SEND test keeps posted (perftest's default rx_depth), unless the
/// client's send depth is larger: a receiver that reposts as fast as it consumes then never
/// answers RNR to a sender `tx_depth` messages ahead.
const RX_DEPTH: u32 = 512;

/// The client's connection request: what the server must prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub lat: bool,
    pub max_size: u32,
    pub tx_depth: u32,
    pub inline: u32,
    /// Connections (QPs) the client makes for the test.
    pub qps: u32,
}

impl Request {
    fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MSG_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[VERSION, self.op.code(), u8::from(self.lat), 0]);
        b.extend_from_slice(&self.max_size.to_be_bytes());
        b.extend_from_slice(&self.tx_depth.to_be_bytes());
        b.extend_from_slice(&self.inline.to_be_bytes());
        b.extend_from_slice(&self.qps.to_be_bytes());
        b
    }

    fn parse(b: &[u8]) -> Result<Request> {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if b.len() < MSG_LEN || &b[..4] != MAGIC || b[4] != VERSION {
            return Err(Error::invalid(
                "the connection request is not from `softrdma perf --connect` (version 1)",
            ));
        }
        let op = Op::from_code(b[5])
            .ok_or_else(|| Error::invalid(format!("unknown operation {} requested", b[5])))?;
        let r = Request {
            op,
            lat: b[6] & 1 != 0,
            max_size: u32_at(8),
            tx_depth: u32_at(12),
            inline: u32_at(16),
            qps: u32_at(20).max(1),
        };
        if r.qps as usize > MAX_QPS {
            return Err(Error::invalid(format!(
                "the client asked for {} QPs (at most {MAX_QPS})",
                r.qps
            )));
        }
        if r.max_size > 1 << 30 || r.tx_depth == 0 || r.tx_depth > MAX_DEPTH {
            return Err(Error::invalid(format!(
                "the client asked for {} bytes and {} work requests (at most 1 GiB and {MAX_DEPTH})",
                r.max_size, r.tx_depth
            )));
        }
        Ok(r)
    }
}

/// The server's answer: the buffer the client's WRITEs, READs and atomics target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

impl Target {
    fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MSG_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.addr.to_be_bytes());
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b.extend_from_slice(&self.len.to_be_bytes());
        b
    }

    fn parse(b: &[u8]) -> Option<Target> {
        if b.len() < MSG_LEN || &b[..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        Some(Target {
            addr: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[16..20].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[20..24].try_into().expect("4 bytes")),
        })
    }
}

struct End {
    ctx: Arc<Context>,
    _pd: Arc<Pd>,
    /// The CQ's completion channel (non-blocking), on which an idle SEND server sleeps.
    channel: CompChannel,
    cq: Arc<Cq>,
    qp: Arc<Qp>,
    buf: Arc<Buffer>,
    mr: Mr,
    id: CmId,
}

const ACCESS: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits()
    | AccessFlags::REMOTE_ATOMIC.bits();

impl End {
    /// The QP, CQ and buffer of one side, on the device the connection manager bound `id` to.
    fn new(id: CmId, buf_len: usize, depth: u32, recv_depth: u32, inline: u32) -> Result<End> {
        let ctx = id
            .verbs()
            .ok_or_else(|| Error::invalid("the id is not bound to a device"))?;
        let pd = Arc::new(ctx.alloc_pd()?);
        let channel = ctx.create_comp_channel()?;
        channel.set_nonblocking(true)?;
        let cq = Arc::new(ctx.create_cq((depth + recv_depth) * 2, 0, Some(&channel), 0)?);
        let mut cap = QpCap {
            max_send_wr: depth,
            max_recv_wr: recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: inline,
        };
        let qp = id.create_qp_with_cq(Some(&pd), &cq, &mut cap)?;
        let buf = Arc::new(Buffer::new(buf_len));
        let mr = pd.reg_buffer(&buf, ACCESS)?;
        Ok(End {
            ctx,
            _pd: pd,
            channel,
            cq,
            qp,
            buf,
            mr,
            id,
        })
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// A receive of `len` bytes at `off` in the buffer.
    fn post_recv_slot(&self, wr_id: u64, off: usize, len: usize) -> Result<()> {
        let sge = [self.sge(off, len)];
        self.qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: &sge,
        }])?;
        Ok(())
    }

    /// A receive of the whole buffer.
    fn post_recv(&self, wr_id: u64) -> Result<()> {
        let sge = [self.sge(0, self.buf.len())];
        self.qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: &sge,
        }])?;
        Ok(())
    }

    fn counters(&self, who: &'static str) -> SideCounters {
        SideCounters {
            who,
            addr: self.ctx.device().addr(),
            device: self.ctx.counters(),
            qp: self.qp.counters(),
            qps: 1,
        }
    }
}

fn conn_param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 16,
        initiator_depth: 16,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// A synchronous listener on `addr:port` (port 0: an ephemeral one) for `backlog`
/// connection requests.
fn listen(addr: IpAddr, port: u16, backlog: usize) -> Result<CmId> {
    let l = CmId::create(None, 0, PortSpace::Tcp)?;
    l.bind_addr(SocketAddr::new(addr, port)).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "cannot listen on {addr} port {port}: {} (give another address with \
                 --server ADDR, e.g. 127.0.0.2, or another --port)",
                e.message()
            ),
        )
    })?;
    l.listen(backlog.clamp(1, MAX_QPS) as i32)?;
    Ok(l)
}

/// Takes connection requests until one is a valid `softrdma perf` request, prepares the
/// server's side for it and accepts it (synchronously: returns once ESTABLISHED).
///
/// With `verify`, the buffer holds one slot of `max_size` bytes per receive, and receive
/// `i` lands in slot `i` (see [`VerifyRecv`]).
fn accept_one(listener: &CmId, verify: bool) -> Result<(End, Request)> {
    loop {
        let id = listener.get_request()?;
        let data = id.event().map(|e| e.param.private_data).unwrap_or_default();
        let req = match Request::parse(&data) {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "softrdma: rejected a connection request from {}: {}",
                    id.peer_addr().map_or("?".into(), |a| a.to_string()),
                    e.message()
                );
                let _ = id.reject(&[]);
                id.destroy();
                continue;
            }
        };
        // Receives: perftest's rx_depth (512), and never fewer than the client's send depth.
        let recv_depth = req.tx_depth.max(RX_DEPTH);
        let slot = (req.max_size as usize).max(64);
        let slots = if verify { recv_depth as usize } else { 1 };
        let end = End::new(id, slot * slots, req.tx_depth, recv_depth, req.inline)?;
        if req.op == Op::Send {
            for i in 0..recv_depth {
                if verify {
                    end.post_recv_slot(u64::from(i), i as usize * slot, slot)?;
                } else {
                    end.post_recv(u64::from(i))?;
                }
            }
        }
        let t = Target {
            addr: end.buf.addr(),
            rkey: end.mr.rkey(),
            len: end.buf.len() as u32,
        };
        end.id.accept(&conn_param(t.to_bytes()))?;
        return Ok((end, req));
    }
}

/// Accepts the connections of one test: the first valid request says how many (its `qps`);
/// the others must ask for the same test.
fn accept_all(listener: &CmId, verify: bool) -> Result<(Vec<End>, Request)> {
    let (first, req) = accept_one(listener, verify)?;
    let mut ends = vec![first];
    while ends.len() < req.qps as usize {
        let (end, r) = accept_one(listener, verify)?;
        if r != req {
            return Err(Error::invalid(format!(
                "connection {} of the test asked for another test ({r:?}, not {req:?})",
                ends.len() + 1
            )));
        }
        ends.push(end);
    }
    Ok((ends, req))
}

/// The client's side: connects from `args.client` to `server` through the connection
/// manager (synchronous ids, as perftest's `-R` does with librdmacm) and reads the server's
/// buffer from the accept's private data.
fn dial(args: &PerfArgs, server: SocketAddr, max: usize) -> Result<(End, Target)> {
    let id = CmId::create(None, 0, PortSpace::Tcp)?;
    id.resolve_addr(Some(SocketAddr::new(args.client, 0)), server, 2000)?;
    id.resolve_route(2000)?;
    let slots = if args.verify { args.tx_depth } else { 1 };
    let end = End::new(
        id,
        max.max(64) * slots,
        args.tx_depth as u32,
        args.tx_depth as u32,
        args.inline,
    )?;
    if args.op == Op::Send && args.lat {
        for i in 0..args.tx_depth.min(64) {
            end.post_recv(i as u64)?;
        }
    }
    let req = Request {
        op: args.op,
        lat: args.lat,
        max_size: max as u32,
        tx_depth: args.tx_depth as u32,
        inline: args.inline,
        qps: args.qps as u32,
    };
    eprintln!(
        "softrdma: connecting to {server} (waiting for the server's answer; a host with no RDMA device there refuses at once, a silent one times out after about 98 s)"
    );
    end.id.connect(&conn_param(req.to_bytes())).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "connecting from {} to {server}: {} (is `softrdma perf --server {}` running there, on port {}?)",
                args.client,
                e.message(),
                server.ip(),
                server.port()
            ),
        )
    })?;
    let data = end
        .id
        .event()
        .map(|e| e.param.private_data)
        .unwrap_or_default();
    let t = Target::parse(&data).ok_or_else(|| {
        Error::invalid(format!(
            "{server} accepted but is not a `softrdma perf` server (no buffer in its answer)"
        ))
    })?;
    if (t.len as usize) < max {
        return Err(Error::invalid(format!(
            "the server's buffer has {} bytes, {max} are needed",
            t.len
        )));
    }
    let got = end.qp.query_qp()?.0.path_mtu;
    if got.bytes() > args.mtu.bytes() {
        // The CM negotiated the port's MTU; RTS→RTS cannot change the path MTU, so a smaller
        // one asked for is reported, not forced.
        eprintln!(
            "note: the connection manager negotiated path MTU {} (asked {})",
            got.bytes(),
            args.mtu.bytes()
        );
    }
    Ok((end, t))
}

/// The server's part of a SEND test until `stop` is set or the connection ends (its
/// receives are flushed): reposts each receive and, for latency, answers each message with
/// one of the same length.
fn serve_sends(
    end: &End,
    req: &Request,
    stop: &AtomicBool,
    verify: Option<VerifyRecv>,
) -> Result<u64> {
    let mut wc = [WorkCompletion::default(); 64];
    let mut got = 0u64;
    let mut expected = Vec::new();
    let mut idle = Idle::new(req.lat);
    loop {
        if stop.load(Ordering::Relaxed) {
            let Some(v) = &verify else { break };
            let want = v.expect.load(Ordering::Relaxed);
            if got >= want {
                // One more look for a message delivered twice.
                std::thread::sleep(Duration::from_millis(50));
                let n = end.cq.poll(&mut wc)?;
                if wc[..n].iter().any(|w| w.opcode == WcOpcode::Recv) {
                    return Err(Error::invalid(format!(
                        "verify: a receive completed after all {want} messages"
                    )));
                }
                if got != want {
                    return Err(Error::invalid(format!(
                        "verify: {got} messages received, {want} sent"
                    )));
                }
                break;
            }
        }
        let n = end.cq.poll(&mut wc)?;
        for w in &wc[..n] {
            if w.status == WcStatus::WrFlushErr {
                return Ok(got);
            }
            check(w)?;
            if w.opcode != WcOpcode::Recv {
                continue;
            }
            if let Some(v) = &verify {
                v.check(end, w, got, &mut expected)?;
                got += 1;
                end.post_recv_slot(w.wr_id, w.wr_id as usize * v.slot, v.slot)?;
                continue;
            }
            got += 1;
            end.post_recv(w.wr_id)?;
            if req.lat {
                let mut flags = SendFlags::SIGNALED;
                if w.byte_len <= req.inline {
                    flags |= SendFlags::INLINE;
                }
                let l = [end.sge(0, w.byte_len as usize)];
                end.qp.post_send(&[SendWr {
                    wr_id: 1,
                    sg_list: &l,
                    send_flags: flags,
                    ..Default::default()
                }])?;
            }
        }
        if n == 0 {
            idle.wait(end)?;
        } else {
            idle.busy();
        }
    }
    Ok(got)
}

/// How the SEND server (and a bandwidth client) waits when its CQ is empty: it busy-polls
/// for [`Idle::SPIN`], then arms the CQ and sleeps on its completion channel until a
/// completion comes (or 10 ms pass, to look at the stop flag). A thread that only spins is
/// at the mercy of the scheduler on a machine with fewer free cores than running threads:
/// preempted, it leaves its receive queue empty for a whole time slice (the client then
/// waits for credits and the message rate collapses); a thread that sleeps is woken at once
/// when its completion comes.
struct Idle {
    /// Latency tests spin only: a sleep would add the wake-up to every round trip.
    spin_only: bool,
    /// Since when the polls found nothing.
    since: Option<Instant>,
    /// Whether the CQ was armed after the last poll that found something.
    armed: bool,
}

impl Idle {
    /// Busy polling this long with nothing to do before sleeping: well above what a
    /// wake-up through the completion channel costs (some 30 µs on a 2-core VM). At 50 µs
    /// a stream on an idle 2-core machine fell now and then into a mode of its own making:
    /// a gap of the peer's (its thread descheduled for a moment) put one side to sleep, its
    /// wake-up took about as long as the threshold, so the other side slept too, and so on
    /// (`perf send -s 8`: 1.9-2.0 M msg/s in a third of the runs, 5-7 in the others, the
    /// application threads switching out voluntarily some 3,000 times a second). With 1 ms
    /// no run fell into it, and a machine with more busy threads than cores (two CPU
    /// burners beside the run) still gets the sleep's benefit.
    const SPIN: Duration = Duration::from_millis(1);

    fn new(spin_only: bool) -> Idle {
        Idle {
            spin_only,
            since: None,
            armed: false,
        }
    }

    /// A poll found completions.
    fn busy(&mut self) {
        self.since = None;
        self.armed = false;
    }

    /// A poll found none: spin on, or arm the CQ (the caller polls once more, so a
    /// completion that came before the arming is not slept through), or, armed, sleep.
    fn wait(&mut self, end: &End) -> Result<()> {
        if self.spin_only {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < Self::SPIN {
            std::hint::spin_loop();
            return Ok(());
        }
        if !self.armed {
            end.cq.req_notify_cq(false)?;
            self.armed = true;
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: end.channel.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        let mut events = 0;
        while end.channel.get_cq_event().is_ok() {
            events += 1;
        }
        end.cq.ack_cq_events(events);
        self.busy();
        Ok(())
    }
}

/// The receiver's side of `--verify`.
struct VerifyRecv<'a> {
    /// Bytes per receive slot.
    slot: usize,
    /// How many messages the client sent, once it knows (`u64::MAX` before).
    expect: &'a AtomicU64,
}

impl VerifyRecv<'_> {
    /// Checks that the receive `w` holds message number `n`, byte-exact. Receives complete
    /// in the order posted, so a message lost, delivered twice or out of order shows as the
    /// wrong number here.
    fn check(&self, end: &End, w: &WorkCompletion, n: u64, scratch: &mut Vec<u8>) -> Result<()> {
        let at = w.wr_id as usize * self.slot;
        let len = w.byte_len as usize;
        if at + len > end.buf.len() {
            return Err(Error::invalid(format!(
                "verify: message {n}: receive {} of {len} B is outside the buffer",
                w.wr_id
            )));
        }
        scratch.resize(len, 0);
        fill_pattern(n, scratch);
        // SAFETY: in bounds (checked above); the receive that covered these bytes completed
        // and is posted again only after this read, so nothing writes them meanwhile.
        let data =
            unsafe { std::slice::from_raw_parts((end.buf.addr() as usize + at) as *const u8, len) };
        if data != &scratch[..] {
            let first = (0..len).find(|&j| data[j] != scratch[j]).unwrap_or(0);
            let number = (len >= 8).then(|| u64::from_le_bytes(data[..8].try_into().unwrap()));
            let differ = (0..len).filter(|&j| data[j] != scratch[j]).count();
            let end_at = (first + 8).min(len);
            return Err(Error::invalid(format!(
                "verify: message {n} ({len} B) differs in {differ} bytes from byte {first}: \
                 {:02x?} where {:02x?} was sent (its number field reads {number:?})",
                &data[first..end_at],
                &scratch[first..end_at]
            )));
        }
        Ok(())
    }
}

/// Message `i`'s bytes under `--verify`: its number (little-endian) in the first 8, then a
/// pattern that depends on the number and the offset.
fn fill_pattern(i: u64, buf: &mut [u8]) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&i.to_le_bytes()[..n]);
}

/// `softrdma perf --server`: waits for one client, serves its test and returns the
/// server's counters once the client disconnected. `ready` is called with the address
/// listened on before the first request is awaited.
pub fn serve(
    args: &PerfArgs,
    addr: IpAddr,
    ready: impl FnOnce(SocketAddr),
    connected: impl FnOnce(SocketAddr, &Request),
) -> Result<SideCounters> {
    let listener = listen(addr, args.port, MAX_QPS)?;
    let local = listener
        .local_addr()
        .ok_or_else(|| Error::invalid("the listener has no address"))?;
    ready(local);
    let (ends, req) = accept_all(&listener, false)?;
    listener.destroy();
    let peer = ends[0]
        .id
        .peer_addr()
        .unwrap_or_else(|| SocketAddr::new(addr, 0));
    connected(peer, &req);
    std::thread::scope(|scope| -> Result<()> {
        let servers: Vec<_> = ends
            .iter()
            .map(|end| {
                scope.spawn(move || -> Result<()> {
                    if req.op == Op::Send {
                        serve_sends(end, &req, &AtomicBool::new(false), None)?;
                    }
                    wait_disconnect(end)
                })
            })
            .collect();
        for s in servers {
            s.join().expect("server thread")?;
        }
        Ok(())
    })?;
    // The peer's DREQ moved each QP to ERR already; no rdma_disconnect here (on a
    // synchronous id whose DISCONNECTED was taken from its channel it would wait ~2 s for
    // one more event). Dropping the ends destroys the ids.
    Ok(SideCounters::of("server", &ends))
}

/// Waits for the client's disconnect of `end` (a SEND test saw its receives flushed
/// already).
fn wait_disconnect(end: &End) -> Result<()> {
    let ch = end.id.channel();
    loop {
        let ev = ch.get_cm_event()?;
        let kind = ev.event;
        ev.ack();
        if matches!(
            kind,
            CmEventType::Disconnected | CmEventType::DeviceRemoval | CmEventType::TimewaitExit
        ) {
            return Ok(());
        }
    }
}

/// The live progress line of a long run: on stderr, at most once a second from the first
/// second on, only when stderr is a terminal (`SOFTRDMA_PROGRESS=1` or `0` forces it on or
/// off); erased when the size is done, so the table stays clean.
struct Progress {
    on: bool,
    next: Instant,
    printed: bool,
}

impl Progress {
    fn new() -> Progress {
        let on = match std::env::var("SOFTRDMA_PROGRESS").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => std::io::stderr().is_terminal(),
        };
        Progress {
            on,
            next: Instant::now() + Duration::from_secs(1),
            printed: false,
        }
    }

    /// Prints `line()` if a second passed since the last one; cheap otherwise.
    fn tick(&mut self, line: impl FnOnce() -> String) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + Duration::from_secs(1);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{}", line());
        let _ = err.flush();
        self.printed = true;
    }

    fn done(&mut self) {
        if self.printed {
            eprint!("\r\x1b[K");
            self.printed = false;
        }
    }
}

/// "done of total" for the progress line (the total is unknown in duration runs).
fn of(done: u64, total: Option<u64>) -> String {
    match total {
        Some(t) => format!(
            "{done}/{t} ({:.0} %)",
            done as f64 * 100.0 / t.max(1) as f64
        ),
        None => done.to_string(),
    }
}

fn check(wc: &WorkCompletion) -> Result<()> {
    if wc.status != WcStatus::Success {
        return Err(Error::new(
            ErrorKind::Os(libc_eio()),
            format!(
                "work request {} failed: {} ({:?})",
                wc.wr_id,
                wc.status.as_str(),
                wc.opcode
            ),
        ));
    }
    Ok(())
}

fn libc_eio() -> i32 {
    5
}

/// Runs the measurement for every size, both sides in this process ([`Mode::Local`]) or
/// the client against a server process ([`Mode::Client`]).
pub fn run(args: &PerfArgs, mut on_point: impl FnMut(&Point)) -> Result<Outcome> {
    let max = args.sizes.iter().copied().max().unwrap_or(8).max(8);
    if args.qps == 0 || args.qps > MAX_QPS {
        return Err(Error::invalid(format!(
            "{} QPs asked for (1 to {MAX_QPS})",
            args.qps
        )));
    }
    if args.qps > 1 && args.lat {
        return Err(Error::invalid(
            "latency tests use one QP (as perftest's): leave out -q or --lat",
        ));
    }
    // The points, and the messages each QP sent in all.
    let mut measure = |clients: &[(End, Target)]| -> Result<(Vec<Point>, Vec<u64>)> {
        let mut out = Vec::new();
        let mut sent = vec![0u64; clients.len()];
        for &size in &args.sizes {
            let p = if args.lat {
                latency(args, &clients[0].0, &clients[0].1, size)?
            } else if clients.len() == 1 {
                bandwidth(args, &clients[0].0, &clients[0].1, size)?
            } else {
                let each = bandwidth_together(args, clients, size)?;
                for (n, p) in sent.iter_mut().zip(&each) {
                    *n += p.iters;
                }
                aggregate(&each)
            };
            if clients.len() == 1 {
                sent[0] += p.iters;
            }
            on_point(&p);
            out.push(p);
        }
        Ok((out, sent))
    };
    match args.mode {
        Mode::Client(server) => {
            let clients = dial_all(args, SocketAddr::new(server, args.port), max)?;
            let (points, _) = measure(&clients)?;
            // Counters after the disconnect: it sends what the QP still had to say (an ACK
            // held back for the program's answer goes before the QP leaves RTS), so that
            // the client's packets sent match what the server counted.
            for (c, _) in &clients {
                c.id.disconnect()?;
            }
            let ends: Vec<End> = clients.into_iter().map(|(e, _)| e).collect();
            let sides = vec![SideCounters::of("client", &ends)];
            Ok(Outcome { points, sides })
        }
        Mode::Local => {
            let listener = listen(args.server, 0, args.qps)?;
            let port = listener
                .local_addr()
                .map(|a| a.port())
                .ok_or_else(|| Error::invalid("the listener has no port"))?;
            let stop = AtomicBool::new(false);
            let expect: Vec<AtomicU64> = (0..args.qps).map(|_| AtomicU64::new(u64::MAX)).collect();
            let out = std::thread::scope(|scope| -> Result<Outcome> {
                let srv = scope.spawn(|| -> Result<Vec<End>> {
                    let (ends, req) = accept_all(&listener, args.verify)?;
                    if req.op == Op::Send {
                        // A receiver per QP; the connections were made one after the other,
                        // so QP i here is the client's QP i.
                        std::thread::scope(|inner| -> Result<()> {
                            let servers: Vec<_> = ends
                                .iter()
                                .zip(&expect)
                                .map(|(end, expect)| {
                                    let stop = &stop;
                                    inner.spawn(move || -> Result<u64> {
                                        let v = args.verify.then(|| VerifyRecv {
                                            slot: (req.max_size as usize).max(64),
                                            expect,
                                        });
                                        serve_sends(end, &req, stop, v)
                                    })
                                })
                                .collect();
                            for s in servers {
                                s.join().expect("server thread")?;
                            }
                            Ok(())
                        })?;
                    }
                    Ok(ends)
                });
                let clients = match dial_all(args, SocketAddr::new(args.server, port), max) {
                    Ok(c) => c,
                    Err(e) => {
                        // Wake the server thread out of rdma_get_request.
                        let _ = listener.write_cm_event(CmEventType::User, 0, 0);
                        let _ = srv.join();
                        return Err(e);
                    }
                };
                let points = measure(&clients);
                // With --verify each receiver goes on until it has checked every message
                // sent to it.
                let sent = points
                    .as_ref()
                    .map_or_else(|_| vec![0; args.qps], |(_, sent)| sent.clone());
                for (e, n) in expect.iter().zip(sent) {
                    e.store(n, Ordering::Relaxed);
                }
                stop.store(true, Ordering::Relaxed);
                let server = srv.join().expect("server thread");
                if let (Err(pe), Err(se)) = (&points, &server) {
                    // The server's failure is usually the cause of the client's.
                    return Err(Error::new(
                        se.kind(),
                        format!("server: {}; client: {}", se.message(), pe.message()),
                    ));
                }
                let (points, _) = points?;
                let server = server?;
                let ends: Vec<End> = clients.into_iter().map(|(e, _)| e).collect();
                Ok(Outcome {
                    points,
                    sides: vec![
                        SideCounters::of("client", &ends),
                        SideCounters::of("server", &server),
                    ],
                })
            })?;
            listener.destroy();
            Ok(out)
        }
        Mode::Server(_) => Err(Error::invalid("perf::run is for clients; use perf::serve")),
    }
}

/// The client's `args.qps` connections to `server`, made one after the other.
fn dial_all(args: &PerfArgs, server: SocketAddr, max: usize) -> Result<Vec<(End, Target)>> {
    (0..args.qps).map(|_| dial(args, server, max)).collect()
}

/// One size on every QP at once, each QP driven by a thread of its own; they start
/// together. The points of each QP, in order.
fn bandwidth_together(
    args: &PerfArgs,
    clients: &[(End, Target)],
    size: usize,
) -> Result<Vec<Point>> {
    let start = std::sync::Barrier::new(clients.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .map(|(c, t)| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    bandwidth(args, c, t, size)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("client thread"))
            .collect()
    })
}

/// The aggregate of QPs measured together: every message over the time of the slowest.
fn aggregate(each: &[Point]) -> Point {
    let secs = each.iter().map(|p| p.secs).fold(0.0, f64::max);
    let iters: u64 = each.iter().map(|p| p.iters).sum();
    let bytes: f64 = each.iter().map(|p| p.iters as f64 * p.size as f64).sum();
    Point {
        size: each[0].size,
        iters,
        secs,
        bw_gbps: bytes / secs / 1e9,
        msg_rate_mps: iters as f64 / secs / 1e6,
        lat_us: Vec::new(),
        // Each thread counted the whole process's preemptions over its own interval.
        preemptions: each.iter().map(|p| p.preemptions).max().unwrap_or(0),
    }
}

fn iters_for(args: &PerfArgs, size: usize) -> u64 {
    if args.iters > 0 {
        return args.iters;
    }
    // Enough work for a stable figure without taking long: ~1 GiB or 200k messages.
    ((1usize << 30) / size.max(1)).clamp(2_000, 200_000) as u64
}

fn bandwidth(args: &PerfArgs, c: &End, t: &Target, size: usize) -> Result<Point> {
    let op = args.op;
    let size = if op == Op::Atomic { 8 } else { size };
    let iters = iters_for(args, size);
    let depth = args.tx_depth as u64;
    let cq_mod = (depth / 4).max(1);
    let inline = size as u32 <= args.inline && matches!(op, Op::Write | Op::Send);
    let preempted0 = preemptions();
    let t0 = Instant::now();
    let deadline = args.duration.map(|d| t0 + d);
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut wc = [WorkCompletion::default(); 64];
    // With a duration, the run ends at the deadline however many messages that is.
    let mut limit = if deadline.is_some() { u64::MAX } else { iters };
    let mut progress = Progress::new();
    let mut rounds = 0u32;
    let mut idle = Idle::new(false);
    while completed < limit {
        rounds = rounds.wrapping_add(1);
        if rounds.is_multiple_of(1024) {
            progress.tick(|| {
                let secs = t0.elapsed().as_secs_f64();
                format!(
                    "{size} B: {} messages, {:.3} GB/s, {:.3} M/s",
                    of(completed, args.duration.is_none().then_some(iters)),
                    completed as f64 * size as f64 / secs / 1e9,
                    completed as f64 / secs / 1e6
                )
            });
        }
        let posted_before = posted;
        while posted < limit && posted - completed < depth {
            let sge = if args.verify {
                // A slot per outstanding message: slot posted % depth was last used by
                // message posted - depth, which has completed.
                let off = (posted % depth) as usize * size;
                // SAFETY: the slot is inside the buffer (it has tx_depth slots of the
                // largest size) and no posted request reads it any more.
                let slot = unsafe {
                    std::slice::from_raw_parts_mut((c.buf.addr() as usize + off) as *mut u8, size)
                };
                fill_pattern(posted, slot);
                [c.sge(off, size)]
            } else {
                [c.sge(0, size)]
            };
            let signaled = (posted + 1).is_multiple_of(cq_mod) || posted + 1 == limit;
            let mut flags = if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            if inline {
                flags |= SendFlags::INLINE;
            }
            let mut wr = SendWr {
                wr_id: posted,
                sg_list: &sge,
                send_flags: flags,
                remote_addr: t.addr,
                rkey: t.rkey,
                ..Default::default()
            };
            wr.opcode = match op {
                Op::Write => WrOpcode::RdmaWrite,
                Op::Read => WrOpcode::RdmaRead,
                Op::Send => WrOpcode::Send,
                Op::Atomic => {
                    wr.compare_add = 1;
                    WrOpcode::AtomicFetchAndAdd
                }
            };
            c.qp.post_send(&[wr])?;
            posted += 1;
        }
        let n = c.cq.poll(&mut wc)?;
        for w in &wc[..n] {
            check(w)?;
            // Each signaled completion stands for every request since the previous one.
            completed = w.wr_id + 1;
        }
        if n == 0 && posted == posted_before {
            idle.wait(c)?;
        } else {
            idle.busy();
        }

        if let Some(d) = deadline {
            if limit == u64::MAX && Instant::now() >= d {
                limit = posted;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    progress.done();
    let n = completed;
    Ok(Point {
        size,
        iters: n,
        secs,
        bw_gbps: (n as f64 * size as f64) / secs / 1e9,
        msg_rate_mps: n as f64 / secs / 1e6,
        lat_us: Vec::new(),
        preemptions: preemptions() - preempted0,
    })
}

fn latency(args: &PerfArgs, c: &End, t: &Target, size: usize) -> Result<Point> {
    let preempted0 = preemptions();
    // With a duration, round trips go on until the deadline however many that is.
    let deadline = args.duration.map(|d| Instant::now() + d);
    let iters = match (deadline, args.iters) {
        (Some(_), _) => u64::MAX,
        (None, 0) => 20_000,
        (None, n) => n,
    };
    let more = |done: u64| done < iters && deadline.is_none_or(|d| Instant::now() < d);
    let size = size.max(1);
    let inline = size as u32 <= args.inline;
    let mut samples = Vec::with_capacity(iters.min(1 << 20) as usize);
    let mut progress = Progress::new();
    let mut tick = |samples: &Vec<f64>| {
        if samples.len().is_multiple_of(256) {
            progress.tick(|| {
                let last = &samples[samples.len().saturating_sub(256)..];
                let avg = last.iter().sum::<f64>() / last.len().max(1) as f64;
                format!(
                    "{size} B: {} round trips, {avg:.2} us one way (last 256)",
                    of(samples.len() as u64, deadline.is_none().then_some(iters))
                )
            });
        }
    };
    match args.op {
        Op::Send => {
            // Ping-pong of SENDs; both sides busy-poll their CQs. The receives (of the whole
            // buffer) were posted at connection time; each is reposted once consumed.
            let csge = c.sge(0, size);
            let mut wc = [WorkCompletion::default(); 16];
            let mut i = 0u64;
            while more(i) {
                i += 1;
                let started = Instant::now();
                let mut flags = SendFlags::SIGNALED;
                if inline {
                    flags |= SendFlags::INLINE;
                }
                let l = [csge];
                c.qp.post_send(&[SendWr {
                    wr_id: 1,
                    sg_list: &l,
                    send_flags: flags,
                    ..Default::default()
                }])?;
                'wait: loop {
                    let n = c.cq.poll(&mut wc)?;
                    for w in &wc[..n] {
                        check(w)?;
                        if w.opcode == WcOpcode::Recv {
                            c.post_recv(w.wr_id)?;
                            break 'wait;
                        }
                    }
                }
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                tick(&samples);
            }
        }
        _ => {
            // Round trips of one operation: WRITE/READ/atomic latency as the requester sees it
            // (ib_read_lat / ib_atomic_lat style; a full round trip, reported as is).
            let mut wc = [WorkCompletion::default(); 4];
            let mut i = 0u64;
            while more(i) {
                i += 1;
                let l = [c.sge(0, if args.op == Op::Atomic { 8 } else { size })];
                let mut wr = SendWr {
                    wr_id: i,
                    sg_list: &l,
                    send_flags: SendFlags::SIGNALED,
                    remote_addr: t.addr,
                    rkey: t.rkey,
                    ..Default::default()
                };
                wr.opcode = match args.op {
                    Op::Write => WrOpcode::RdmaWrite,
                    Op::Read => WrOpcode::RdmaRead,
                    _ => {
                        wr.compare_add = 1;
                        WrOpcode::AtomicFetchAndAdd
                    }
                };
                let started = Instant::now();
                c.qp.post_send(&[wr])?;
                loop {
                    let n = c.cq.poll(&mut wc)?;
                    if n > 0 {
                        check(&wc[0])?;
                        break;
                    }
                }
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                tick(&samples);
            }
        }
    }
    progress.done();
    samples.sort_by(|a, b| a.total_cmp(b));
    let total: f64 = samples.iter().sum::<f64>() * 2.0 / 1e6;
    Ok(Point {
        size,
        iters: samples.len() as u64,
        secs: total,
        bw_gbps: 0.0,
        msg_rate_mps: 0.0,
        lat_us: samples,
        preemptions: preemptions() - preempted0,
    })
}

/// The value at quantile `q` (0..=1) of sorted samples.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}
