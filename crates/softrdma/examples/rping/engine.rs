//! rping's engine (see `main.rs` for what rping does): the connection-manager and CQ
//! threads, the connection's verbs resources, and the server and client sessions.
//!
//! `softrdma ping` (crates/cli) runs this same file as its engine (`#[path]` module), so it
//! depends on `softrdma` and `libc` only and is driven through [`Opts`], [`run_server`] and
//! [`run_client`].

use softrdma::rdma_cm::{self, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::{
    AccessFlags, Buffer, CompChannel, Context, Cq, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// `RPING_BUFSIZE`: sizes must stay below it.
pub const RPING_BUFSIZE: usize = 64 * 1024;
/// `RPING_MIN_BUFSIZE` as rdma-core's rping is built: `sizeof(stringify(INT_MAX))` +
/// `sizeof "rdma-ping-%d: "`, where rping.c does not include <limits.h>, so INT_MAX is
/// stringified as the 7 letters "INT_MAX" (8 with the NUL): 23, the minimum Debian's rping
/// accepts. Shorter than "rdma-ping-N: " for large N; the pattern is then truncated, as
/// rping's snprintf truncates it.
pub const RPING_MIN_BUFSIZE: usize = 8 + 15;
/// `RPING_SQ_DEPTH`.
const RPING_SQ_DEPTH: u32 = 16;
/// `sizeof(struct rping_rdma_info)`.
const INFO_LEN: usize = 16;
pub const DEFAULT_PORT: u16 = 7174;

pub static DEBUG: AtomicBool = AtomicBool::new(false);

macro_rules! debug_log {
    ($($t:tt)*) => {
        if DEBUG.load(Ordering::Relaxed) {
            println!($($t)*);
        }
    };
}

/// What to run: rping's command line.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    pub server: bool,
    pub addr: Option<IpAddr>,
    pub src: Option<IpAddr>,
    pub port: u16,
    /// 0: ping until the peer goes away.
    pub count: u32,
    pub size: usize,
    pub verbose: bool,
    pub validate: bool,
    pub persistent: bool,
    pub self_create_qp: bool,
    /// When set, each connection's QP counters are added here as it ends.
    pub qp_counters: Option<Arc<Mutex<Vec<softrdma::QpCounters>>>>,
}

impl Opts {
    fn record_counters(&self, qp: &Qp) {
        if let Some(v) = &self.qp_counters {
            v.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(qp.counters());
        }
    }
}

/// `struct rping_rdma_info`: a buffer the peer may access (big-endian on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RdmaInfo {
    buf: u64,
    rkey: u32,
    size: u32,
}

impl RdmaInfo {
    fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    fn from_bytes(b: &[u8; INFO_LEN]) -> RdmaInfo {
        RdmaInfo {
            buf: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            size: u32::from_be_bytes(b[12..].try_into().expect("4 bytes")),
        }
    }
}

/// What the connection-manager and CQ threads tell the thread running a connection.
enum Ev {
    /// A connection-manager event about an id.
    Cm {
        kind: CmEventType,
        status: i32,
        id: CmId,
    },
    /// A receive completed: the peer's buffer advertisement or go-ahead.
    Recv(RdmaInfo),
    /// An RDMA READ completed.
    ReadDone,
    /// An RDMA WRITE completed.
    WriteDone,
    /// A completion failed (other than a flush).
    CqError(String),
}

type Routes = Arc<Mutex<HashMap<SocketAddr, Sender<Ev>>>>;

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

/// The connection-manager thread (rping's `cm_thread`): takes every event of the channel,
/// acknowledges it, and hands it to the thread that runs its connection (by peer address),
/// else to the main thread.
fn cm_thread(
    ch: EventChannel,
    routes: Routes,
    main: Sender<Ev>,
    accepting: Arc<AtomicBool>,
    server: bool,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        if !readable(ch.fd(), 100) {
            continue;
        }
        let ev = match ch.get_cm_event() {
            Ok(ev) => ev,
            Err(e) => {
                eprintln!("rdma_get_cm_event: {e}");
                std::process::exit(255);
            }
        };
        let (kind, status, id) = (ev.event, ev.status, ev.id.clone());
        debug_log!(
            "cma_event type {} cma_id {} (peer {})",
            kind.as_str(),
            if ev.listen_id.is_some() {
                "child of the listener"
            } else {
                "connection"
            },
            fmt_peer(id.peer_addr())
        );
        match kind {
            CmEventType::AddrError
            | CmEventType::RouteError
            | CmEventType::ConnectError
            | CmEventType::Unreachable
            | CmEventType::Rejected => {
                eprintln!("cma event {}, error {status}", kind.as_str());
            }
            CmEventType::Disconnected => {
                eprintln!(
                    "{} DISCONNECT EVENT...",
                    if server { "server" } else { "client" }
                );
            }
            CmEventType::DeviceRemoval => eprintln!("cma detected device removal!!!!"),
            _ => {}
        }
        if kind == CmEventType::ConnectRequest && !accepting.load(Ordering::Acquire) {
            // A one-shot server already has its client: turn the others away.
            debug_log!("rejecting connection request from {:?}", id.peer_addr());
            let _ = id.reject(&[]);
            ev.ack();
            id.destroy();
            continue;
        }
        let tx = id
            .peer_addr()
            .and_then(|a| {
                routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&a)
                    .cloned()
            })
            .unwrap_or_else(|| main.clone());
        let _ = tx.send(Ev::Cm { kind, status, id });
        ev.ack();
    }
}

/// The CQ thread (rping's `cq_thread`): waits on the completion channel, re-arms the CQ,
/// and reports each completion; receives are re-posted once their message is read.
struct CqThread {
    cq: Arc<Cq>,
    ch: Arc<CompChannel>,
    qp: Arc<Qp>,
    recv_buf: Arc<Buffer>,
    recv_lkey: u32,
    tx: Sender<Ev>,
    stop: Arc<AtomicBool>,
}

impl CqThread {
    fn run(self) {
        let mut wc = [WorkCompletion::default(); 1];
        while !self.stop.load(Ordering::Acquire) {
            if !readable(self.ch.fd(), 100) {
                continue;
            }
            let ev = match self.ch.get_cq_event() {
                Ok(ev) => ev,
                Err(e) => {
                    let _ = self
                        .tx
                        .send(Ev::CqError(format!("Failed to get cq event! ({e})")));
                    return;
                }
            };
            if !ev.is_for(&self.cq) {
                let _ = self.tx.send(Ev::CqError("Unknown CQ!".into()));
                return;
            }
            if let Err(e) = self.cq.req_notify_cq(false) {
                let _ = self
                    .tx
                    .send(Ev::CqError(format!("Failed to set notify! ({e})")));
                return;
            }
            loop {
                match self.cq.poll(&mut wc) {
                    Ok(1) => {
                        if let Err(msg) = self.handle(&wc[0]) {
                            let _ = self.tx.send(Ev::CqError(msg));
                            self.cq.ack_cq_events(1);
                            return;
                        }
                    }
                    Ok(_) => break,
                    Err(e) => {
                        let _ = self.tx.send(Ev::CqError(format!("poll error {e}")));
                        self.cq.ack_cq_events(1);
                        return;
                    }
                }
            }
            self.cq.ack_cq_events(1);
        }
    }

    fn handle(&self, wc: &WorkCompletion) -> Result<(), String> {
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushErr {
                debug_log!("flushed completion");
                return Ok(());
            }
            return Err(format!(
                "cq completion failed status {} ({:?})",
                wc.status as u32, wc.status
            ));
        }
        match wc.opcode {
            WcOpcode::Send => debug_log!("send completion"),
            WcOpcode::RdmaWrite => {
                debug_log!("rdma write completion");
                let _ = self.tx.send(Ev::WriteDone);
            }
            WcOpcode::RdmaRead => {
                debug_log!("rdma read completion");
                let _ = self.tx.send(Ev::ReadDone);
            }
            WcOpcode::Recv => {
                debug_log!("recv completion");
                if wc.byte_len as usize != INFO_LEN {
                    return Err(format!("Received bogus data, size {}", wc.byte_len));
                }
                let mut b = [0u8; INFO_LEN];
                self.recv_buf
                    .read(0, &mut b)
                    .map_err(|e| format!("reading the receive buffer: {e}"))?;
                post_recv(&self.qp, &self.recv_buf, self.recv_lkey)?;
                let _ = self.tx.send(Ev::Recv(RdmaInfo::from_bytes(&b)));
            }
            other => return Err(format!("unknown completion {other:?}")),
        }
        Ok(())
    }
}

fn post_recv(qp: &Qp, buf: &Buffer, lkey: u32) -> Result<(), String> {
    let sge = [Sge {
        addr: buf.addr(),
        length: INFO_LEN as u32,
        lkey,
    }];
    qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: &sge,
    }])
    .map_err(|e| format!("post recv error: {e:?}"))
}

/// rping_create_qp with `-q`: an RC QP of our own on the connection's PD and CQ
/// (`ibv_create_qp`), moved to INIT by hand on the id's port with no remote access yet
/// (rping_self_modify_qp sets the access flags later).
fn self_created_qp(id: &CmId, pd: &Pd, cq: &Cq, cap: QpCap) -> Result<Arc<Qp>, String> {
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, cq, cap))
        .map_err(|e| format!("ibv_create_qp: {e}"))?;
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: id.port_num(),
        qp_access_flags: 0,
        ..Default::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    qp.modify_qp(&attr, mask.bits())
        .map_err(|e| format!("ibv_modify_qp: {e}"))?;
    Ok(Arc::new(qp))
}

/// The verbs resources of one connection (rping's control block without the CM part).
struct Conn {
    id: CmId,
    qp: Arc<Qp>,
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
    _ch: Arc<CompChannel>,
    _recv_buf: Arc<Buffer>,
    _recv_mr: Mr,
    send_buf: Arc<Buffer>,
    send_mr: Mr,
    /// The server's read/write buffer; the client's sink.
    rdma_buf: Arc<Buffer>,
    rdma_mr: Mr,
    /// The client's source.
    start: Option<(Arc<Buffer>, Mr)>,
    rx: Receiver<Ev>,
    /// Completions that arrived before ESTABLISHED.
    pending: std::collections::VecDeque<Ev>,
    stop: Arc<AtomicBool>,
    cq_thread: Option<JoinHandle<()>>,
    established: bool,
    /// `-q`: the QP is ours, not the id's.
    self_create_qp: bool,
    /// `-q` client: CONNECT_RESPONSE arrived.
    responded: bool,
}

/// What ended a wait.
enum Stop {
    /// The peer disconnected.
    Disconnected,
    /// Something failed.
    Failed(String),
}

impl From<String> for Stop {
    fn from(s: String) -> Stop {
        Stop::Failed(s)
    }
}

impl Conn {
    /// rping_setup_qp + rping_setup_buffers: a PD, a completion channel and one CQ of the
    /// id's device, an RC QP through rdma_create_qp using that CQ for both queues, the
    /// message buffers and the RDMA buffer(s), a receive posted, and the CQ thread started.
    fn setup(
        id: CmId,
        size: usize,
        client: bool,
        self_create_qp: bool,
        rx: Receiver<Ev>,
        tx: Sender<Ev>,
    ) -> Result<Conn, String> {
        let ctx: Arc<Context> = id.verbs().ok_or("the id is not bound to a device")?;
        let pd = Arc::new(
            ctx.alloc_pd()
                .map_err(|e| format!("ibv_alloc_pd failed: {e}"))?,
        );
        debug_log!("created pd");
        let ch = Arc::new(
            ctx.create_comp_channel()
                .map_err(|e| format!("ibv_create_comp_channel failed: {e}"))?,
        );
        let cq = Arc::new(
            ctx.create_cq(RPING_SQ_DEPTH * 2, 0, Some(&ch), 0)
                .map_err(|e| format!("ibv_create_cq failed: {e}"))?,
        );
        cq.req_notify_cq(false)
            .map_err(|e| format!("ibv_req_notify_cq failed: {e}"))?;
        let mut cap = QpCap {
            max_send_wr: RPING_SQ_DEPTH,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = if self_create_qp {
            self_created_qp(&id, &pd, &cq, cap)?
        } else {
            id.create_qp_with_cq(Some(&pd), &cq, &mut cap)
                .map_err(|e| format!("rdma_create_qp: {e}"))?
        };
        debug_log!("created qp {}", qp.qp_num());

        let reg = |buf: &Arc<Buffer>, access: AccessFlags, what: &str| {
            pd.reg_buffer(buf, access.bits())
                .map_err(|e| format!("{what} reg_mr failed: {e}"))
        };
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let recv_buf = Arc::new(Buffer::new(INFO_LEN));
        let recv_mr = reg(&recv_buf, AccessFlags::LOCAL_WRITE, "recv_buf")?;
        let send_buf = Arc::new(Buffer::new(INFO_LEN));
        let send_mr = reg(&send_buf, AccessFlags::empty(), "send_buf")?;
        let rdma_buf = Arc::new(Buffer::new(size));
        let rdma_mr = reg(&rdma_buf, rw, "rdma_buf")?;
        let start = if client {
            let b = Arc::new(Buffer::new(size));
            let mr = reg(&b, rw, "start_buf")?;
            Some((b, mr))
        } else {
            None
        };
        debug_log!("allocated & registered buffers...");
        post_recv(&qp, &recv_buf, recv_mr.lkey())
            .map_err(|e| format!("ibv_post_recv failed: {e}"))?;

        let stop = Arc::new(AtomicBool::new(false));
        let t = CqThread {
            cq: cq.clone(),
            ch: ch.clone(),
            qp: qp.clone(),
            recv_buf: recv_buf.clone(),
            recv_lkey: recv_mr.lkey(),
            tx,
            stop: stop.clone(),
        };
        debug_log!("cq_thread started.");
        let cq_thread = std::thread::Builder::new()
            .name("rping-cq".into())
            .spawn(move || t.run())
            .map_err(|e| format!("pthread_create: {e}"))?;
        Ok(Conn {
            id,
            qp,
            _pd: pd,
            _cq: cq,
            _ch: ch,
            _recv_buf: recv_buf,
            _recv_mr: recv_mr,
            send_buf,
            send_mr,
            rdma_buf,
            rdma_mr,
            start,
            rx,
            pending: Default::default(),
            stop,
            cq_thread: Some(cq_thread),
            established: false,
            self_create_qp,
            responded: false,
        })
    }

    /// rping_self_modify_qp (`-q`): the QP through INIT, RTR and RTS with the attributes the
    /// connection manager gives for this id.
    fn self_modify_qp(&self) -> Result<(), String> {
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let (attr, mask) = self
                .id
                .init_qp_attr(state)
                .map_err(|e| format!("rdma_init_qp_attr({state:?}): {e}"))?;
            self.qp
                .modify_qp(&attr, mask.bits())
                .map_err(|e| format!("ibv_modify_qp({state:?}): {e}"))?;
        }
        debug_log!("qp {} moved to RTS", self.qp.qp_num());
        Ok(())
    }

    /// rping_disconnect: with `-q` our QP goes to ERR first (the connection manager does
    /// not know it), then rdma_disconnect.
    fn disconnect(&self) -> Result<(), String> {
        if self.self_create_qp {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            self.qp
                .modify_qp(&attr, QpAttrMask::STATE.bits())
                .map_err(|e| format!("ibv_modify_qp(ERR): {e}"))?;
        }
        self.id
            .disconnect()
            .map_err(|e| format!("rdma_disconnect: {e}"))
    }

    /// The `-q` client's wait for CONNECT_RESPONSE (the server accepted).
    fn wait_connect_response(&mut self) -> Result<(), Stop> {
        while !self.responded {
            if let Some(ev) = self.take_one()? {
                self.pending.push_back(ev);
            }
        }
        Ok(())
    }

    /// Takes one event: Ok(Some) for a completion, Ok(None) for ESTABLISHED (noted) and
    /// events of no interest; DISCONNECTED and failures end the wait.
    fn take_one(&mut self) -> Result<Option<Ev>, Stop> {
        let ev = self
            .rx
            .recv()
            .map_err(|_| Stop::Failed("the event threads are gone".into()))?;
        match ev {
            Ev::Cm {
                kind: CmEventType::Established,
                ..
            } => {
                debug_log!("ESTABLISHED");
                self.established = true;
                Ok(None)
            }
            Ev::Cm {
                kind: CmEventType::ConnectResponse,
                ..
            } if self.self_create_qp => {
                debug_log!("CONNECT_RESPONSE");
                self.responded = true;
                Ok(None)
            }
            Ev::Cm {
                kind: CmEventType::Disconnected,
                ..
            } => Err(Stop::Disconnected),
            Ev::Cm {
                kind: CmEventType::TimewaitExit | CmEventType::AddrChange,
                ..
            } => Ok(None),
            Ev::Cm { kind, status, .. } => {
                Err(Stop::Failed(cm_failure(kind, status, self.id.peer_addr())))
            }
            Ev::CqError(msg) => Err(Stop::Failed(msg)),
            other => Ok(Some(other)),
        }
    }

    /// The next completion (those kept while waiting for ESTABLISHED first).
    fn next(&mut self) -> Result<Ev, Stop> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(ev);
        }
        loop {
            if let Some(ev) = self.take_one()? {
                return Ok(ev);
            }
        }
    }

    fn wait_established(&mut self) -> Result<(), Stop> {
        // A completion may overtake ESTABLISHED (the peer's first SEND can arrive before
        // the RTU is processed): keep it for later.
        while !self.established {
            if let Some(ev) = self.take_one()? {
                self.pending.push_back(ev);
            }
        }
        Ok(())
    }

    fn wait_recv(&mut self, state: &str) -> Result<RdmaInfo, Stop> {
        match self.next()? {
            Ev::Recv(info) => Ok(info),
            _ => Err(Stop::Failed(format!(
                "wait for {state} state: unexpected completion"
            ))),
        }
    }

    fn wait_done(&mut self, read: bool) -> Result<(), Stop> {
        match (self.next()?, read) {
            (Ev::ReadDone, true) | (Ev::WriteDone, false) => Ok(()),
            _ => Err(Stop::Failed(format!(
                "wait for {} state: unexpected completion",
                if read {
                    "RDMA_READ_COMPLETE"
                } else {
                    "RDMA_WRITE_COMPLETE"
                }
            ))),
        }
    }

    fn post(&self, wr: SendWr<'_>) -> Result<(), String> {
        self.qp
            .post_send(&[wr])
            .map_err(|e| format!("post send error {e:?}"))
    }

    /// SENDs the 16-byte message in the send buffer (an advertisement or a go-ahead).
    fn post_send_msg(&self) -> Result<(), String> {
        let sge = [Sge {
            addr: self.send_buf.addr(),
            length: INFO_LEN as u32,
            lkey: self.send_mr.lkey(),
        }];
        self.post(SendWr {
            wr_id: 1,
            sg_list: &sge,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        })
    }

    /// rping_format_send: advertises the buffer at `addr` (under `rkey`) to the peer.
    fn format_send(&self, addr: u64, rkey: u32, size: usize) -> Result<(), String> {
        let info = RdmaInfo {
            buf: addr,
            rkey,
            size: size as u32,
        };
        debug_log!(
            "RDMA addr {:x} rkey {:x} len {}",
            info.buf,
            info.rkey,
            info.size
        );
        self.send_buf
            .write(0, &info.to_bytes())
            .map_err(|e| format!("writing the send buffer: {e}"))
    }

    /// An RDMA READ or WRITE between the RDMA buffer and the peer's advertised buffer.
    fn post_rdma(&self, opcode: WrOpcode, len: usize, remote: RdmaInfo) -> Result<(), String> {
        let sge = [Sge {
            addr: self.rdma_buf.addr(),
            length: len as u32,
            lkey: self.rdma_mr.lkey(),
        }];
        self.post(SendWr {
            wr_id: 2,
            sg_list: &sge,
            opcode,
            send_flags: SendFlags::SIGNALED,
            remote_addr: remote.buf,
            rkey: remote.rkey,
            ..Default::default()
        })
    }

    /// Stops the CQ thread; the verbs resources drop with `self` (the caller destroys the
    /// id).
    fn teardown(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.cq_thread.take() {
            let _ = t.join();
        }
    }
}

/// A connection-manager failure event, explained.
fn cm_failure(kind: CmEventType, status: i32, peer: Option<SocketAddr>) -> String {
    let peer = peer.map_or_else(|| "the peer".to_string(), |p| p.to_string());
    let why = match (kind, status) {
        (CmEventType::Rejected, 8) => format!(
            "connection to {peer} rejected: nobody listens there (IB CM reject reason 8, invalid service ID)"
        ),
        (CmEventType::Rejected, 28) => {
            format!("connection to {peer} rejected by the server (reject reason 28, consumer defined)")
        }
        (CmEventType::Rejected, r) => format!("connection to {peer} rejected (reason {r})"),
        (CmEventType::Unreachable, s) if s == -libc::ECONNREFUSED => format!(
            "{peer} refused the connection: no RDMA device answers at that address (ICMP port unreachable for RoCEv2's UDP port 4791)"
        ),
        (CmEventType::Unreachable, _) => format!("{peer} is unreachable: no answer to the connection request"),
        (CmEventType::AddrError, s) => format!(
            "cannot resolve the address of {peer}: {}",
            std::io::Error::from_raw_os_error(-s)
        ),
        (CmEventType::RouteError, s) => format!(
            "cannot resolve the route to {peer}: {}",
            std::io::Error::from_raw_os_error(-s)
        ),
        (CmEventType::ConnectError, s) => format!("connecting to {peer} failed (status {s})"),
        (CmEventType::DeviceRemoval, _) => "the RDMA device went away".to_string(),
        (k, s) => format!("unexpected event {} (status {s})", k.as_str()),
    };
    format!("{} ({}, status {status})", why, kind.as_str())
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// rping_test_server: serves pings until the client disconnects.
fn test_server(c: &mut Conn, size: usize, verbose: bool) -> Result<(), Stop> {
    loop {
        // The client's source buffer.
        let src = c.wait_recv("RDMA_READ_ADV")?;
        debug_log!(
            "Received rkey {:x} addr {:x} len {} from peer",
            src.rkey,
            src.buf,
            src.size
        );
        debug_log!("server received sink adv");
        if src.size as usize > size {
            return Err(Stop::Failed(format!(
                "the client's buffer ({} bytes) is larger than the server's ({size} bytes): start the server with -S {} or more",
                src.size, src.size
            )));
        }
        c.post_rdma(WrOpcode::RdmaRead, src.size as usize, src)?;
        debug_log!("server posted rdma read req ");
        c.wait_done(true)?;
        debug_log!("server received read complete");
        let data = c.rdma_buf.to_vec();
        if verbose {
            println!("server ping data: {}", c_string(&data));
        }
        // Go ahead (the send buffer of the server carries nothing).
        c.post_send_msg()?;
        debug_log!("server posted go ahead");

        // The client's sink buffer.
        let sink = c.wait_recv("RDMA_WRITE_ADV")?;
        debug_log!(
            "Received rkey {:x} addr {:x} len {} from peer",
            sink.rkey,
            sink.buf,
            sink.size
        );
        debug_log!("server received sink adv");
        let len = (data.iter().position(|&b| b == 0).unwrap_or(size - 1) + 1).min(size);
        if len > sink.size as usize {
            return Err(Stop::Failed(format!(
                "the client's sink ({} bytes) is smaller than the data ({len} bytes)",
                sink.size
            )));
        }
        debug_log!(
            "rdma write from lkey {:x} laddr {:x} len {}",
            c.rdma_mr.lkey(),
            c.rdma_buf.addr(),
            len
        );
        c.post_rdma(WrOpcode::RdmaWrite, len, sink)?;
        c.wait_done(false)?;
        debug_log!("server rdma write complete ");
        c.post_send_msg()?;
        debug_log!("server posted go ahead");
    }
}

/// Runs one accepted connection on the server: QP, buffers, accept, pings, disconnect.
fn serve(child: CmId, o: &Opts, rx: Receiver<Ev>, tx: Sender<Ev>) -> Result<(), String> {
    let peer = child.peer_addr();
    let mut c = match Conn::setup(child.clone(), o.size, false, o.self_create_qp, rx, tx) {
        Ok(c) => c,
        Err(e) => {
            let _ = child.reject(&[]);
            child.destroy();
            return Err(format!("setup_qp failed: {e}"));
        }
    };
    debug_log!("accepting client connection request");
    let accept = ConnParam {
        responder_resources: rdma_cm::RDMA_MAX_RESP_RES,
        initiator_depth: rdma_cm::RDMA_MAX_RESP_RES,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    let accepted = if o.self_create_qp {
        // rping_accept with -q: our QP to RTS first, its number in the accept.
        c.self_modify_qp().and_then(|()| {
            c.id.accept(&ConnParam {
                qp_num: c.qp.qp_num(),
                ..client_param()
            })
            .map_err(|e| format!("rdma_accept: {e}"))
        })
    } else {
        c.id.accept(&accept)
            .map_err(|e| format!("rdma_accept: {e}"))
    };
    let r = match accepted {
        Err(e) => Err(e),
        Ok(()) => match c
            .wait_established()
            .and_then(|()| test_server(&mut c, o.size, o.verbose))
        {
            Ok(()) | Err(Stop::Disconnected) => Ok(()),
            Err(Stop::Failed(e)) => Err(format!("server failed: {e}")),
        },
    };
    // rping_disconnect: the client usually went first, then this fails harmlessly.
    if let Err(e) = c.disconnect() {
        debug_log!("{e}");
    }
    o.record_counters(&c.qp);
    c.teardown();
    child.destroy();
    debug_log!("connection from {peer:?} done");
    r
}

/// Opens every device so that a wildcard listener hears on all of them (softrdma devices
/// only listen once the process opened them).
fn open_all_devices() -> Vec<Context> {
    let mut v = Vec::new();
    for d in softrdma::get_device_list().unwrap_or_default() {
        match d.open().and_then(|c| c.local_udp_addr().map(|_| c)) {
            Ok(c) => v.push(c),
            Err(e) => debug_log!("device {} ({}) not opened: {e}", d.name(), d.addr()),
        }
    }
    v
}

struct CmRuntime {
    ch: EventChannel,
    routes: Routes,
    accepting: Arc<AtomicBool>,
    main_rx: Receiver<Ev>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CmRuntime {
    fn start(server: bool) -> Result<CmRuntime, String> {
        let ch = EventChannel::new().map_err(|e| format!("rdma_create_event_channel: {e}"))?;
        let routes: Routes = Arc::default();
        let accepting = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, main_rx) = channel();
        let (c, r, a, s) = (ch.clone(), routes.clone(), accepting.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("rping-cm".into())
            .spawn(move || cm_thread(c, r, tx, a, server, s))
            .map_err(|e| format!("pthread_create: {e}"))?;
        Ok(CmRuntime {
            ch,
            routes,
            accepting,
            main_rx,
            stop,
            thread: Some(thread),
        })
    }

    /// A channel for the events of the connection with `peer`.
    fn route(&self, peer: Option<SocketAddr>) -> (Sender<Ev>, Receiver<Ev>) {
        let (tx, rx) = channel();
        if let Some(p) = peer {
            self.routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(p, tx.clone());
        }
        (tx, rx)
    }

    fn unroute(routes: &Routes, peer: Option<SocketAddr>) {
        if let Some(p) = peer {
            routes.lock().unwrap_or_else(|p| p.into_inner()).remove(&p);
        }
    }

    fn shutdown(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = self.ch.destroy();
    }
}

pub fn run_server(o: &Opts) -> Result<(), String> {
    let rt = CmRuntime::start(true)?;
    let listen = CmId::create(Some(&rt.ch), 0, PortSpace::Tcp)
        .map_err(|e| format!("rdma_create_id: {e}"))?;
    let ip = o.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let _devices = if ip.is_unspecified() {
        open_all_devices()
    } else {
        Vec::new()
    };
    let r = (|| {
        listen
            .bind_addr(SocketAddr::new(ip, o.port))
            .map_err(|e| format!("rdma_bind_addr: {e}"))?;
        debug_log!("rdma_bind_addr successful");
        spawn_stats_printer(listen.verbs().into_iter().collect());
        debug_log!("rdma_listen");
        listen.listen(3).map_err(|e| format!("rdma_listen: {e}"))?;
        debug_log!("rdma_listen successful");
        let mut workers: Vec<JoinHandle<()>> = Vec::new();
        loop {
            let child = match rt.main_rx.recv() {
                Ok(Ev::Cm {
                    kind: CmEventType::ConnectRequest,
                    id,
                    ..
                }) => id,
                Ok(Ev::Cm { kind, status, .. }) => {
                    return Err(format!(
                        "wait for CONNECT_REQUEST state: got {} (status {status})",
                        kind.as_str()
                    ))
                }
                Ok(_) => continue,
                Err(_) => return Err("the connection manager thread is gone".into()),
            };
            let peer = child.peer_addr();
            debug_log!("child cma {peer:?}");
            let (tx, rx) = rt.route(peer);
            if !o.persistent {
                rt.accepting.store(false, Ordering::Release);
                let r = serve(child, o, rx, tx);
                CmRuntime::unroute(&rt.routes, peer);
                return r;
            }
            let (opts, routes) = (o.clone(), rt.routes.clone());
            workers.retain(|w| !w.is_finished());
            workers.push(std::thread::spawn(move || {
                if let Err(e) = serve(child, &opts, rx, tx) {
                    eprintln!("rping: connection from {}: {e}", fmt_peer(peer));
                }
                CmRuntime::unroute(&routes, peer);
            }));
        }
    })();
    debug_log!("destroy cm_id");
    listen.destroy();
    rt.shutdown();
    r
}

fn fmt_peer(p: Option<SocketAddr>) -> String {
    p.map_or_else(|| "?".into(), |p| p.to_string())
}

/// rping_test_client: `count` pings (0: until the server goes away).
fn test_client(c: &mut Conn, o: &Opts) -> Result<(), Stop> {
    let size = o.size;
    let (start_buf, start_rkey) = c
        .start
        .as_ref()
        .map(|(b, m)| (b.clone(), m.rkey()))
        .expect("client buffers");
    let mut start: u8 = 65;
    let mut ping: i32 = 0;
    let mut pattern = vec![0u8; size];
    while o.count == 0 || (ping as u32) < o.count {
        // The ping data: "rdma-ping-N: " then letters from `start`, 'A'..='z' rotating.
        let head = format!("rdma-ping-{ping}: ");
        let cc = head.len().min(size - 1);
        pattern[..cc].copy_from_slice(&head.as_bytes()[..cc]);
        let mut ch = start;
        for b in &mut pattern[cc..] {
            *b = ch;
            ch += 1;
            if ch > 122 {
                ch = 65;
            }
        }
        start += 1;
        if start > 122 {
            start = 65;
        }
        pattern[size - 1] = 0;
        start_buf
            .write(0, &pattern)
            .map_err(|e| format!("writing the source buffer: {e}"))?;

        c.format_send(start_buf.addr(), start_rkey, size)?;
        c.post_send_msg()?;
        // The server read the source and says go ahead.
        c.wait_recv("RDMA_WRITE_ADV")?;

        c.format_send(c.rdma_buf.addr(), c.rdma_mr.rkey(), size)?;
        c.post_send_msg()?;
        // The server wrote the sink and says go ahead.
        c.wait_recv("RDMA_WRITE_COMPLETE")?;

        let got = c.rdma_buf.to_vec();
        if o.validate && got != pattern {
            return Err(Stop::Failed(format!("data mismatch! (ping {ping})")));
        }
        if o.verbose {
            println!("ping data: {}", c_string(&got));
        }
        ping = ping.wrapping_add(1);
    }
    Ok(())
}

/// rping_init_conn_param: one READ each way, retries 7 (the QP number is added with -q).
fn client_param() -> ConnParam {
    ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

pub fn run_client(o: &Opts) -> Result<(), String> {
    let rt = CmRuntime::start(false)?;
    let id = CmId::create(Some(&rt.ch), 0, PortSpace::Tcp)
        .map_err(|e| format!("rdma_create_id: {e}"))?;
    let dst = SocketAddr::new(o.addr.expect("checked by parse_args"), o.port);
    let r = client_session(o, &rt, &id, dst);
    debug_log!("destroy cm_id");
    id.destroy();
    rt.shutdown();
    r
}

fn client_session(o: &Opts, rt: &CmRuntime, id: &CmId, dst: SocketAddr) -> Result<(), String> {
    let wait_cm = |want: CmEventType| -> Result<(), String> {
        match rt.main_rx.recv() {
            Ok(Ev::Cm { kind, .. }) if kind == want => Ok(()),
            Ok(Ev::Cm { kind, status, .. }) => Err(cm_failure(kind, status, Some(dst))),
            Ok(_) => Err(format!(
                "waiting for {}: unexpected completion",
                want.as_str()
            )),
            Err(_) => Err("the connection manager thread is gone".into()),
        }
    };
    id.resolve_addr(o.src.map(|s| SocketAddr::new(s, 0)), dst, 2000)
        .map_err(|e| format!("rdma_resolve_addr: {e}"))?;
    wait_cm(CmEventType::AddrResolved)?;
    id.resolve_route(2000)
        .map_err(|e| format!("rdma_resolve_route: {e}"))?;
    wait_cm(CmEventType::RouteResolved)?;
    debug_log!("rdma_resolve_addr - rdma_resolve_route successful");
    spawn_stats_printer(id.verbs().into_iter().collect());

    // From here on the id's events go to the connection's queue.
    let (tx, rx) = rt.route(Some(dst));
    let mut c = Conn::setup(id.clone(), o.size, true, o.self_create_qp, rx, tx)
        .map_err(|e| format!("setup_qp failed: {e}"))?;
    let param = ConnParam {
        qp_num: if o.self_create_qp { c.qp.qp_num() } else { 0 },
        ..client_param()
    };
    let r = (|| {
        c.id.connect(&param)
            .map_err(|e| Stop::Failed(format!("rdma_connect: {e}")))?;
        if o.self_create_qp {
            // The server accepted: our QP to RTS, then the RTU (rdma_establish).
            c.wait_connect_response()?;
            c.self_modify_qp()
                .map_err(|e| Stop::Failed(format!("rping_modify_qp: {e}")))?;
            c.id.establish()
                .map_err(|e| Stop::Failed(format!("rdma_establish: {e}")))?;
            c.established = true;
        } else {
            c.wait_established()?;
        }
        debug_log!("rdma_connect successful");
        test_client(&mut c, o)
    })();
    let r = match r {
        Ok(()) => {
            // rping_disconnect, then the DISCONNECTED that follows.
            if let Err(e) = c.disconnect() {
                debug_log!("{e}");
            }
            loop {
                match c.rx.recv_timeout(Duration::from_secs(30)) {
                    Ok(Ev::Cm {
                        kind: CmEventType::Disconnected,
                        ..
                    })
                    | Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    Ok(_) => {}
                }
            }
            Ok(())
        }
        // The server went away: rping counts that as the end when pinging forever.
        Err(Stop::Disconnected) if o.count == 0 => Ok(()),
        Err(Stop::Disconnected) => {
            Err("client failed: the server disconnected before the last ping".to_string())
        }
        Err(Stop::Failed(e)) => {
            if c.established {
                let _ = c.disconnect();
            }
            Err(format!("client failed: {e}"))
        }
    };
    CmRuntime::unroute(&rt.routes, Some(dst));
    o.record_counters(&c.qp);
    c.teardown();
    r
}

/// With `-d`: every two seconds, the packet counters and CM statistics of every device that
/// carried traffic (ICRC errors, packets from other stacks verified by solving for their IPv4
/// identification, messages the CM dropped), to see why a peer gets no answer.
fn spawn_stats_printer(devices: Vec<Arc<Context>>) {
    if !DEBUG.load(Ordering::Relaxed) {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("rping-stats".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(2));
            for c in &devices {
                let n = c.counters();
                if n.rx_packets + n.tx_packets + n.icrc_errors + n.malformed == 0 {
                    continue;
                }
                println!("stats {}: {n:?}", c.device().name());
                println!("stats {}: {:?}", c.device().name(), c.cm_stats());
            }
        });
}
