//! The device engines of this process, one per address, started on first use and kept.

use super::capture;
use super::counters::DeviceCounters;
use super::engine::{engine_started, Engine};
use super::faults::FaultConfig;
use super::fd::EventFd;
use super::gsi::Gsi;
use super::port::{Provider, QpPort};
use super::progress;
use super::share::Share;
use super::sock::{UdpSock, ROCE_PORT};
use super::tx::Wire;
use super::tx::{DirectTx, TxBatch};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Weak;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The engines of this process, one per address, kept for the life of the process: a device's
/// UDP socket and progress thread are started on first use and stay, as a NIC stays, so that
/// closing and reopening a device never races with its own socket still being closed.
static ENGINES: OnceLock<Mutex<HashMap<IpAddr, Arc<Engine>>>> = OnceLock::new();

/// The provider of the device at `addr` (interface `ifindex`), started on first use: the
/// UDP RoCEv2 engine (see [`Engine::get_or_start`], whose errors it returns).
pub(crate) fn open(addr: IpAddr, ifindex: u32) -> Result<Arc<dyn Provider>> {
    Ok(Engine::get_or_start(addr, ifindex)?)
}

/// Receive queue `queue` of the device at `addr` in this process (0: the device itself, as
/// [`open`] gives it), started on first use.
///
/// A device's QPs in one process are spread over its receive queues, as a NIC spreads flows
/// over its queues (RSS): each further queue is a member of the device's reuseport group of
/// its own (a socket, a slot from the upper half of the slots, a progress thread; see
/// `share.rs`), so the steering program
/// sends each packet to the queue whose slot its destination QP number carries, and each
/// queue receives, checks and delivers its QPs' packets on a thread of its own. Queue 0
/// alone holds QP 1 (the connection manager) and the multicast groups; the queues share the
/// device's fault injection (one configuration and count), a pause of its lanes holds for
/// every queue (a queue starts paused when queue 0 is), and the device's counters are the
/// sum of its queues'.
///
/// Fails like [`open`].
pub(crate) fn open_queue(addr: IpAddr, ifindex: u32, queue: u8) -> Result<Arc<dyn Provider>> {
    let first = Engine::get_or_start(addr, ifindex)?;
    if queue == 0 {
        return Ok(first);
    }
    let map = QUEUES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = map.get(&(addr, queue)) {
        return Ok(e.clone());
    }
    let e = Engine::start_member(addr, ROCE_PORT, ifindex, Some(&first))?;
    let _ = e.first.set(Arc::downgrade(&first));
    // (Under the map's lock, as `pause_lanes` reaches the queues: either it sees this one,
    // or this one sees queue 0 paused.)
    if first.wire.lanes.paused() {
        e.wire.lanes.set_paused(true);
    }
    map.insert((addr, queue), e.clone());
    drop(map);
    // In the steering program before the first QP on it exists (see get_or_start); not
    // announced to the connection manager: QP 1 is queue 0's (its own CM keeps nothing).
    e.discover_now();
    e.with_cm(|g, now| g.announced(now));
    Ok(e)
}

/// How many receive queues a device spreads this process's RC and UC QPs over unless a
/// program says otherwise (`Context::set_receive_queues`): `SOFTRDMA_QUEUES` (1 to 16) when
/// set, else one per two CPUs of the machine, at most 8 (one on a machine of up to 3 CPUs,
/// where more threads than cores would cost more than they give).
pub(crate) fn default_queues() -> u8 {
    static N: OnceLock<u8> = OnceLock::new();
    *N.get_or_init(|| {
        if let Some(n) = std::env::var("SOFTRDMA_QUEUES")
            .ok()
            .and_then(|v| v.trim().parse::<u8>().ok())
        {
            return n.clamp(1, MAX_QUEUES);
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / 2).clamp(1, 8) as u8
    })
}

/// The most receive queues a device has in one process.
pub(crate) const MAX_QUEUES: u8 = 16;

/// The further receive queues of the device at `addr` started in this process (not queue 0).
fn queues_of(addr: IpAddr) -> Vec<Arc<Engine>> {
    QUEUES.get().map_or_else(Vec::new, |m| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((a, _), _)| *a == addr)
            .map(|(_, e)| e.clone())
            .collect()
    })
}

/// Engines by device address and receive queue number.
type QueueMap = HashMap<(IpAddr, u8), Arc<Engine>>;

/// The receive queues beyond the first.
static QUEUES: OnceLock<Mutex<QueueMap>> = OnceLock::new();

/// The provider of the device at `addr` if this process started it.
pub(crate) fn if_open(addr: IpAddr) -> Option<Arc<dyn Provider>> {
    Some(Engine::if_started(addr)?)
}

/// Sends now the positive ACKs that QPs of every device of this process hold back for an
/// answer of their program (see `verbs::datapath::drive`). The connection manager calls it
/// at the start of each call that means the program is not answering on a QP now
/// (resolving, connecting, listening, accepting, disconnecting, taking an event): no answer
/// is coming soon, and a peer may
/// be waiting for the completion of what it sent (perftest's rdma_cm handshake: the peer
/// waits for its send completion while this side, which has the message, goes on to
/// resolve and connect its next id; held, the ACK waited for the progress thread, up to the
/// end of the hand-off, 0.5 ms). Sends held for a batch by UC and UD QPs go too, and
/// [`crate::verbs`] calls it before a program blocks for a completion event. Two atomic loads
/// per device when nothing is held. Never fails.
pub(crate) fn release_held_acks() {
    for e in every_queue_engine() {
        e.flush_held_acks();
        e.flush_held_sends();
    }
}

/// Whether a thread waiting for a completion event receives for the devices itself
/// ([`receive_while_waiting`]): yes unless `SOFTRDMA_WAIT_RECEIVES=0` (read once).
pub(crate) fn waiters_receive() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_WAIT_RECEIVES").map_or(true, |v| v != "0"))
}

/// Takes one event from `fd` as [`EventFd::wait`] does (no `deadline`: blocking unless the
/// descriptor is non-blocking) or [`EventFd::wait_deadline`] does, while the calling thread
/// receives for this process's devices itself ([`receive_while_waiting`]): the event it waits
/// for, signalled from what it receives, wakes it once, not after a wake-up of a device's
/// progress thread. With `SOFTRDMA_WAIT_RECEIVES=0`, exactly [`EventFd::wait`] or
/// [`EventFd::wait_deadline`]. Fails as they do.
pub(crate) fn wait_receiving(fd: &EventFd, deadline: Option<std::time::Instant>) -> Result<()> {
    if !waiters_receive() {
        return match deadline {
            None => fd.wait(),
            Some(d) => fd.wait_deadline(d),
        };
    }
    loop {
        if fd.read_nowait()? {
            return Ok(());
        }
        let ms = match deadline {
            None => {
                if fd.is_nonblocking() {
                    return Err(Error::new(ErrorKind::WouldBlock, "no event is waiting"));
                }
                // (A round at most every 100 ms: the devices watched, and the hold on them,
                // are renewed, so a device closed meanwhile is let go.)
                100
            }
            Some(d) => super::fd::ms_until(d)?.min(100),
        };
        if receive_while_waiting(fd.as_raw_fd(), ms) && super::fd::interruption_ends_wait() {
            return Err(super::fd::interrupted());
        }
    }
}

/// Sleeps until `fd` (a completion channel's) is readable, `timeout_ms` passed (-1: never),
/// or a packet waits for one of this process's devices, on its socket or on a same-host lane;
/// receives such packets on the calling thread (after the round of a thread receiving for the
/// device, if one is at it), so that a completion for `fd` is signalled without a hop
/// through the device's progress thread, which watches the same descriptors and takes what
/// this thread leaves. Returns when `fd` may be readable, or early (a signal, a packet for
/// another channel): the caller looks and waits again.
///
/// Returns whether a signal interrupted the sleep.
///
/// The lanes' rings are armed here as the progress thread arms them before it sleeps (their
/// producers then ring the bells); records already waiting are taken instead of sleeping.
/// Either thread may find the flags cleared by the other: the progress thread is then awake
/// and takes the records itself (within the hand-off period, if an application thread polled
/// busy a moment ago), and the completion wakes this one through `fd`.
pub(crate) fn receive_while_waiting(fd: RawFd, timeout_ms: i32) -> bool {
    let engines = every_queue_engine();
    // Records waiting (a new lane's first look leaves them for a second one): taken now.
    let mut waiting = false;
    for e in &engines {
        if !e.wire.lanes.arm() {
            waiting = true;
            e.drain_receive();
        }
    }
    if waiting {
        return false;
    }
    // The devices with something to take (the scratch room is let go before they take it).
    let (ready, interrupted) = WAIT_SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let WaitScratch {
            fds,
            owners,
            bells,
            held,
        } = &mut *scratch;
        fds.clear();
        owners.clear();
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        for (i, e) in engines.iter().enumerate() {
            fds.push(libc::pollfd {
                fd: e.wire.sock.raw(),
                events: libc::POLLIN,
                revents: 0,
            });
            owners.push((i, false));
            e.wire.lanes.bells(bells);
            for b in bells.drain(..).filter(|b| b.inbound) {
                fds.push(libc::pollfd {
                    fd: b.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                owners.push((i, true));
                held.push(b.fd);
            }
        }
        let mut ready = vec![false; engines.len()];
        // SAFETY: polls valid pollfds, whose descriptors `engines` and `held` keep open.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        let interrupted =
            n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
        if n > 0 {
            for (f, &(i, bell)) in fds[1..].iter().zip(owners.iter()) {
                if f.revents & libc::POLLIN != 0 {
                    if bell {
                        super::lanes::drain_bell(f.fd);
                    }
                    ready[i] = true;
                }
            }
        }
        held.clear();
        (ready, interrupted)
    });
    for (e, r) in engines.iter().zip(ready) {
        if r {
            e.drain_receive();
        }
    }
    interrupted
}

/// The room [`receive_while_waiting`] reuses.
#[derive(Default)]
struct WaitScratch {
    fds: Vec<libc::pollfd>,
    /// For each descriptor after the channel's: its engine, and whether it is a lane's bell.
    owners: Vec<(usize, bool)>,
    bells: Vec<super::lanes::Bell>,
    /// The bells polled, kept open while polled.
    held: Vec<Arc<std::os::fd::OwnedFd>>,
}

thread_local! {
    static WAIT_SCRATCH: std::cell::RefCell<WaitScratch> = std::cell::RefCell::new(WaitScratch::default());
}

/// The engines of every device and of each device's further receive queues (a QP on a
/// further queue holds its ACK and its sends in that queue's engine).
fn every_queue_engine() -> Vec<Arc<Engine>> {
    let further = QUEUES.get().map_or_else(Vec::new, |m| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect::<Vec<_>>()
    });
    let mut all = all_engines();
    all.extend(further);
    all
}

/// The providers of every device this process started.
pub(crate) fn all_open() -> Vec<Arc<dyn Provider>> {
    all_engines()
        .into_iter()
        .map(|e| e as Arc<dyn Provider>)
        .collect()
}

/// Once per process, when its first device starts: an `atexit` hook that sends what QPs
/// still hold back (sends held for a batch, held ACKs: [`release_held_acks`]), so that a
/// program that posts and then exits (returns from `main`, calls `exit`) before it polls,
/// arms a CQ or destroys the QP loses nothing, as with a NIC whose doorbell was rung. A
/// process killed by a signal can still take them with it.
fn send_held_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function, which takes only this library's
        // locks, with atexit.
        unsafe {
            libc::atexit(release_held_at_exit);
        }
    });
}

extern "C" fn release_held_at_exit() {
    if !every_queue_engine().iter().any(|e| e.holds_back()) {
        return;
    }
    // On a thread of its own: by now `exit` has destroyed the exiting thread's thread-locals,
    // which the send path uses (its transmit batch and scratch buffers). What another thread
    // (a device's progress thread) took off the lists and is sending now is waited for, a
    // little: the process ending would kill that send (seen under load: a UD send posted
    // just before `exit` lost).
    if let Ok(t) = super::fd::spawn_quiet("softrdma-exit".into(), || {
        release_held_acks();
        let deadline = std::time::Instant::now() + EXIT_RELEASE_WAIT;
        while every_queue_engine().iter().any(|e| e.holds_back())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
            release_held_acks();
        }
    }) {
        let _ = t.join();
    }
}

/// How long a process that exits waits for what other threads are sending of what its QPs
/// held back.
const EXIT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// The engines started in this process.
pub(crate) fn all_engines() -> Vec<Arc<Engine>> {
    ENGINES.get().map_or_else(Vec::new, |m| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    })
}

impl Engine {
    /// The engine of the device at `addr` (interface `ifindex`), started on first use; a
    /// new engine is announced to the connection-manager layer (see [`super::port::CmHook`]).
    ///
    /// Fails with `EADDRINUSE` when a socket that does not share it (another user's process,
    /// another program, a kernel RoCE device) holds UDP port 4791 on the address; other
    /// softrdma processes of the same user share the device (see [`super::share`]).
    pub(crate) fn get_or_start(addr: IpAddr, ifindex: u32) -> Result<Arc<Engine>> {
        let map = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get(&addr) {
            return Ok(e.clone());
        }
        let started = Engine::start(addr, ifindex)?;
        send_held_at_exit();
        map.insert(addr, started.clone());
        drop(map);
        // Steerable before anything is created on it: until discovery has put this process
        // in the group's program, packets for it are spread by the kernel's hash, and one
        // that lands on a process about to exit is lost with that process's socket.
        started.discover_now();
        engine_started(&started);
        Ok(started)
    }

    /// The engine of the device at `addr` if it has started.
    pub(crate) fn if_started(addr: IpAddr) -> Option<Arc<Engine>> {
        ENGINES
            .get()?
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    /// Binds the device socket and starts the progress thread; `ifindex` is the interface
    /// of `addr`, used to send to and join IPv6 multicast groups.
    pub(crate) fn start(addr: IpAddr, ifindex: u32) -> Result<Arc<Engine>> {
        Self::start_on_port(addr, ROCE_PORT, ifindex)
    }

    /// [`Engine::start`] on UDP port `port` (tests).
    pub(crate) fn start_on_port(addr: IpAddr, port: u16, ifindex: u32) -> Result<Arc<Engine>> {
        Self::start_member(addr, port, ifindex, None)
    }

    /// Starts an engine of the device at `addr`: its first one in this process (`first`
    /// `None`), or a further receive queue of the device whose first engine is `first`, which
    /// injects the first's faults (one configuration and count for the device) and takes
    /// its slot from the upper half of the slots only, so that further queues never keep a
    /// process from opening the device.
    fn start_member(
        addr: IpAddr,
        port: u16,
        ifindex: u32,
        first: Option<&Engine>,
    ) -> Result<Arc<Engine>> {
        crate::log::init_from_env();
        // The slot first, the socket second: a process holds a socket in the group only
        // while it holds a slot, so discovery's count of slots is the group's size.
        let share = match first {
            None => Share::join(addr)?,
            Some(_) => Share::join_further(addr)?,
        };
        let sock = UdpSock::bind_shared(addr, port)?;
        let local = sock.local_addr()?;
        tracing::debug!(%local, "device engine started");
        // Multicast sends leave from the device socket; a device whose interface cannot do
        // multicast still does unicast (its multicast sends are counted in tx_errors).
        if let Err(err) = sock.set_multicast_tx(addr, ifindex) {
            tracing::debug!(%addr, ifindex, error = %err, "no multicast sending options");
        }
        let lanes = super::lanes::Lanes::new(local, share.slot());
        let mut wire = Wire::new(sock, local, lanes)?;
        if let Some(first) = first {
            wire.share_faults(&first.wire);
        }
        let e = Engine::new(wire, share, ifindex);
        capture::note_local_device(local);
        // SOFTRDMA_FAULTS: fault injection from the start (see FaultConfig::parse), for
        // programs that have no call for it, such as the examples against another stack.
        if let Some(spec) = std::env::var("SOFTRDMA_FAULTS")
            .ok()
            .filter(|s| !s.trim().is_empty() && first.is_none())
        {
            let cfg = FaultConfig::parse(&spec)?;
            tracing::info!(?cfg, "SOFTRDMA_FAULTS: injecting faults");
            e.set_faults(Some(cfg));
        }
        e.set_me();
        let weak = Arc::downgrade(&e);
        super::fd::spawn_quiet(format!("softrdma-{addr}"), move || progress::progress(weak))
            .map_err(|err| crate::Error::from_io(err, "spawning the progress thread"))?;
        tracing::debug!(%local, "device engine started");
        Ok(e)
    }
}

impl Engine {
    /// The further receive queues of this engine's device when this engine is its queue 0
    /// (empty for a further queue, or a device with one queue).
    fn other_queues(&self) -> Vec<Arc<Engine>> {
        if self.first.get().is_some() {
            return Vec::new();
        }
        queues_of(self.local.ip())
    }
}

impl Provider for Engine {
    fn local(&self) -> SocketAddr {
        self.local
    }
    fn slot(&self) -> u8 {
        Engine::slot(self)
    }
    fn register(&self, qpn: u32, qp: Weak<dyn QpPort>) {
        Engine::register(self, qpn, qp)
    }
    fn unregister(&self, qpn: u32) {
        Engine::unregister(self, qpn)
    }
    #[inline]
    fn set_timer(&self, qpn: u32, deadline: Option<Instant>) {
        Engine::set_timer(self, qpn, deadline)
    }
    #[inline]
    fn send(&self, tx: &mut TxBatch) {
        Engine::send(self, tx)
    }
    #[inline]
    fn lanes_direct(&self) -> bool {
        self.wire.lanes_direct()
    }
    #[inline]
    fn direct_lane(&self, peer: IpAddr, dest_qpn: u32) -> Option<DirectTx<'_>> {
        self.wire.direct_lane(peer, dest_qpn)
    }
    fn watch_for_spinner(&self) {
        Engine::watch_for_spinner(self)
    }
    fn note_held_ack(&self, qpn: u32) {
        Engine::note_held_ack(self, qpn)
    }
    fn forget_held_ack(&self, qpn: u32) {
        Engine::forget_held_ack(self, qpn)
    }
    fn lane_is_up(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        self.wire.lane_is_up(peer, dest_qpn)
    }
    fn may_gather(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        self.wire.may_gather(peer, dest_qpn)
    }
    fn prepare_lane(&self, peer: IpAddr, dest_qpn: u32) {
        self.wire.prepare_lane(peer, dest_qpn)
    }
    fn records_ready(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        self.wire.records_ready(peer, dest_qpn)
    }
    fn offer_pair(&self, peer: IpAddr, dest_qpn: u32, src_qpn: u32) -> Option<super::PairTx> {
        self.wire.offer_pair(peer, dest_qpn, src_qpn)
    }
    #[inline]
    fn take_pair(&self, p: &super::PairRx, qp: Option<Arc<dyn QpPort>>, busy: bool) -> usize {
        Engine::take_pair(self, p, qp, busy)
    }

    #[inline]
    fn records_generation(&self) -> u64 {
        self.wire.records_generation()
    }
    fn note_held_send(&self, qpn: u32) -> bool {
        Engine::note_held_send(self, qpn)
    }
    #[inline]
    fn flush_held_sends(&self) {
        Engine::flush_held_sends(self)
    }
    #[inline]
    fn poll_progress(&self, busy: bool, empty: bool) {
        Engine::poll_progress(self, busy, empty)
    }
    fn app_sleeps(&self) {
        Engine::app_sleeps(self)
    }
    fn drain_receive(&self) {
        Engine::drain_receive(self)
    }
    fn mcast_join(&self, gid: &Gid, qpn: u32) -> Result<()> {
        Engine::mcast_join(self, gid, qpn)
    }
    fn mcast_leave(&self, gid: &Gid, qpn: u32) {
        Engine::mcast_leave(self, gid, qpn)
    }
    fn counters(&self) -> DeviceCounters {
        let mut c = Engine::counters(self);
        for q in self.other_queues() {
            c.add(&q.counters());
        }
        c
    }
    fn pause_lanes(&self, paused: bool) {
        // Queue 0 first: a queue started meanwhile copies its state (see `open_queue`).
        for e in std::iter::once(self).chain(self.other_queues().iter().map(|q| &**q)) {
            e.wire.lanes.set_paused(paused);
            if !paused {
                // What waits in the rings is taken now, not at the progress thread's next
                // wake-up (no producer rang a bell for it).
                e.wire.wake.signal();
            }
        }
    }
    fn set_faults(&self, cfg: Option<FaultConfig>) {
        // One fault injection for all the device's queues (see `start_member`).
        Engine::set_faults(self, cfg);
    }
    fn with_cm_dyn(&self, f: &mut dyn FnMut(&mut Gsi, Instant)) {
        Engine::with_cm(self, f)
    }
    fn cm_stats(&self) -> crate::GsiStats {
        self.gsi.lock().unwrap_or_else(|p| p.into_inner()).stats()
    }
    fn cm_listen(&self, sid: u64) -> Result<bool> {
        Engine::cm_listen(self, sid)
    }
    fn cm_unlisten(&self, sid: u64) {
        Engine::cm_unlisten(self, sid)
    }
}
