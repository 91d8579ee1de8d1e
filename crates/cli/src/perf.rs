//! `softrdma perf`: perftest's measurements (ib_write_bw, ib_read_bw, ib_send_bw,
//! ib_atomic_bw, ib_send_lat, ib_write_lat) between two softrdma devices on loopback, both
//! sides in this process.

use softrdma::rdma_cm::{CmId, ConnParam, PortSpace};
use softrdma::*;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfArgs {
    pub op: Op,
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
}

struct End {
    ctx: Arc<Context>,
    _pd: Arc<Pd>,
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
    fn new(id: CmId, buf_len: usize, depth: u32, inline: u32) -> Result<End> {
        let ctx = id
            .verbs()
            .ok_or_else(|| Error::invalid("the id is not bound to a device"))?;
        let pd = Arc::new(ctx.alloc_pd()?);
        let cq = Arc::new(ctx.create_cq(depth * 4, 0, None, 0)?);
        let mut cap = QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
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

    fn post_recvs(&self, n: usize, size: usize) -> Result<()> {
        for i in 0..n {
            let sge = [self.sge(0, size.max(1))];
            self.qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: &sge,
            }])?;
        }
        Ok(())
    }
}

/// Connects a client on `client` to a server on `server` through the connection manager
/// (synchronous ids, as perftest's `-R` does with librdmacm), with the path MTU capped at
/// `mtu`.
fn connect(args: &PerfArgs, buf_len: usize) -> Result<(End, End)> {
    let depth = args.tx_depth as u32;
    let listen = CmId::create(None, 0, PortSpace::Tcp)?;
    listen.bind_addr(SocketAddr::new(args.server, 0))?;
    listen.listen(1)?;
    let port = listen
        .local_addr()
        .map(|a| a.port())
        .ok_or_else(|| Error::invalid("the listener has no port"))?;
    let param = ConnParam {
        responder_resources: 16,
        initiator_depth: 16,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    let (client, server) = std::thread::scope(|scope| -> Result<(End, End)> {
        let srv = scope.spawn(|| -> Result<End> {
            let id = listen.get_request()?;
            let end = End::new(id, buf_len, depth, args.inline)?;
            end.id.accept(&param)?;
            Ok(end)
        });
        let id = CmId::create(None, 0, PortSpace::Tcp)?;
        id.resolve_addr(
            Some(SocketAddr::new(args.client, 0)),
            SocketAddr::new(args.server, port),
            2000,
        )?;
        id.resolve_route(2000)?;
        let client = End::new(id, buf_len, depth, args.inline)?;
        client.id.connect(&param)?;
        let server = srv.join().expect("server thread")?;
        Ok((client, server))
    })?;
    listen.destroy();
    let got = client.qp.query_qp()?.0.path_mtu;
    if got.bytes() > args.mtu.bytes() {
        // The CM negotiated the port's MTU; a smaller one was asked for: apply it to both
        // QPs (RTS→RTS cannot change the path MTU, so this is reported, not forced).
        eprintln!(
            "note: the connection manager negotiated path MTU {} (asked {})",
            got.bytes(),
            args.mtu.bytes()
        );
    }
    Ok((client, server))
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

/// Runs the measurement for every size.
/// Returns the points and the counters of the client and server devices.
pub fn run(
    args: &PerfArgs,
    mut progress: impl FnMut(&Point),
) -> Result<(Vec<Point>, DeviceCounters, DeviceCounters)> {
    let max = *args.sizes.iter().max().unwrap_or(&8);
    let depth = args.tx_depth as u32;
    let (client, server) = connect(args, max.max(64))?;
    let _ = depth;
    let mut out = Vec::new();
    for &size in &args.sizes {
        let p = if args.lat {
            latency(args, &client, &server, size)?
        } else {
            bandwidth(args, &client, &server, size)?
        };
        progress(&p);
        out.push(p);
    }
    Ok((out, client.ctx.counters(), server.ctx.counters()))
}

fn iters_for(args: &PerfArgs, size: usize) -> u64 {
    if args.iters > 0 {
        return args.iters;
    }
    // Enough work for a stable figure without taking long: ~1 GiB or 200k messages.
    ((1usize << 30) / size.max(1)).clamp(2_000, 200_000) as u64
}

fn bandwidth(args: &PerfArgs, c: &End, s: &End, size: usize) -> Result<Point> {
    let op = args.op;
    let size = if op == Op::Atomic { 8 } else { size };
    let iters = iters_for(args, size);
    let depth = args.tx_depth as u64;
    let cq_mod = (depth / 4).max(1);
    // The receiver of SENDs reposts receives from its own thread, as ib_send_bw's server.
    let stop = AtomicBool::new(false);
    if op == Op::Send {
        s.post_recvs(args.tx_depth, size)?;
    }
    std::thread::scope(|scope| {
        let server_thread = if op == Op::Send {
            let stop = &stop;
            let sqp = &s.qp;
            let scq = &s.cq;
            let sge = s.sge(0, size.max(1));
            Some(scope.spawn(move || -> Result<u64> {
                let mut got = 0u64;
                let mut wc = [WorkCompletion::default(); 64];
                while got < iters && !stop.load(Ordering::Relaxed) {
                    let n = scq.poll(&mut wc)?;
                    for w in &wc[..n] {
                        check(w)?;
                        let l = [sge];
                        sqp.post_recv(&[RecvWr {
                            wr_id: w.wr_id,
                            sg_list: &l,
                        }])?;
                    }
                    got += n as u64;
                    if n == 0 {
                        std::hint::spin_loop();
                    }
                }
                Ok(got)
            }))
        } else {
            None
        };
        let inline = size as u32 <= args.inline && matches!(op, Op::Write | Op::Send);
        let t0 = Instant::now();
        let deadline = args.duration.map(|d| t0 + d);
        let mut posted = 0u64;
        let mut completed = 0u64;
        let mut wc = [WorkCompletion::default(); 64];
        let mut limit = iters;
        while completed < limit {
            while posted < limit && posted - completed < depth {
                let sge = [c.sge(0, size)];
                let signaled = (posted + 1) % cq_mod == 0 || posted + 1 == limit;
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
                    remote_addr: s.buf.addr(),
                    rkey: s.mr.rkey(),
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
            if let Some(d) = deadline {
                if limit == iters && Instant::now() >= d {
                    limit = posted;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        if let Some(t) = server_thread {
            t.join().expect("server thread")?;
        }
        let n = completed;
        Ok(Point {
            size,
            iters: n,
            secs,
            bw_gbps: (n as f64 * size as f64) / secs / 1e9,
            msg_rate_mps: n as f64 / secs / 1e6,
            lat_us: Vec::new(),
        })
    })
}

fn latency(args: &PerfArgs, c: &End, s: &End, size: usize) -> Result<Point> {
    let iters = if args.iters > 0 { args.iters } else { 20_000 };
    let size = size.max(1);
    let inline = size as u32 <= args.inline;
    let mut samples = Vec::with_capacity(iters as usize);
    match args.op {
        Op::Send => {
            // ping-pong of SENDs; both sides busy-poll their CQs.
            c.post_recvs(args.tx_depth.min(64), size)?;
            s.post_recvs(args.tx_depth.min(64), size)?;
            let sqp = &s.qp;
            let scq = &s.cq;
            let ssge = s.sge(0, size);
            std::thread::scope(|scope| -> Result<()> {
                let pong = scope.spawn(move || -> Result<()> {
                    let mut wc = [WorkCompletion::default(); 16];
                    let mut done = 0;
                    while done < iters {
                        let n = scq.poll(&mut wc)?;
                        for w in &wc[..n] {
                            check(w)?;
                            if w.opcode == WcOpcode::Recv {
                                let l = [ssge];
                                sqp.post_recv(&[RecvWr {
                                    wr_id: 0,
                                    sg_list: &l,
                                }])?;
                                let mut flags = SendFlags::SIGNALED;
                                if inline {
                                    flags |= SendFlags::INLINE;
                                }
                                sqp.post_send(&[SendWr {
                                    wr_id: 1,
                                    sg_list: &l,
                                    send_flags: flags,
                                    ..Default::default()
                                }])?;
                                done += 1;
                            }
                        }
                    }
                    Ok(())
                });
                let csge = c.sge(0, size);
                let mut wc = [WorkCompletion::default(); 16];
                for _ in 0..iters {
                    let t = Instant::now();
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
                                c.qp.post_recv(&[RecvWr {
                                    wr_id: 0,
                                    sg_list: &l,
                                }])?;
                                break 'wait;
                            }
                        }
                    }
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
                pong.join().expect("pong thread")
            })?;
        }
        _ => {
            // Round trips of one operation: WRITE/READ/atomic latency as the requester sees it
            // (ib_read_lat / ib_atomic_lat style; a full round trip, reported as is).
            let mut wc = [WorkCompletion::default(); 4];
            for i in 0..iters {
                let l = [c.sge(0, if args.op == Op::Atomic { 8 } else { size })];
                let mut wr = SendWr {
                    wr_id: i,
                    sg_list: &l,
                    send_flags: SendFlags::SIGNALED,
                    remote_addr: s.buf.addr(),
                    rkey: s.mr.rkey(),
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
                let t = Instant::now();
                c.qp.post_send(&[wr])?;
                loop {
                    let n = c.cq.poll(&mut wc)?;
                    if n > 0 {
                        check(&wc[0])?;
                        break;
                    }
                }
                samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let total: f64 = samples.iter().sum::<f64>() * 2.0 / 1e6;
    Ok(Point {
        size,
        iters,
        secs: total,
        bw_gbps: 0.0,
        msg_rate_mps: 0.0,
        lat_us: samples,
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
