//! The engine of one device: the parts the files below it own (the [`Wire`] out, the
//! receive state, the multicast groups, QP 1), composed with the table of QPs and their
//! timers, the held ACKs, and the connection-manager layer's hook. It implements the
//! provider's face to the layers above (`port.rs`: [`Provider`], [`QpPort`], the CM hook).

use super::counters::DeviceCounters;
use super::faults::FaultConfig;
use super::gsi::{self, Gsi};
use super::keymap::QpnMap;
use super::mcast::{Mcast, RxMcast};
use super::port::{cm_hook, Provider, QpPort};
use super::rx::{Delivery, RxSink, RxState, Via};
use super::share::Share;
use super::tx::{with_tx, TxBatch, TxQueue, Wire};
use crate::error::Result;
use crate::gid::Gid;
use softrdma_proto::cm::CmEvent;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

/// How long after an application thread last polled an empty CQ of the device the progress
/// thread leaves the device socket to application threads (see the provider's notes),
/// unless `SOFTRDMA_POLL_HANDOFF_US` says otherwise (0: never; the progress thread always
/// watches).
pub(crate) const POLL_HANDOFF: Duration = Duration::from_micros(500);

/// How long a progress thread polls its same-host lanes after their last packet before it
/// sleeps (polling costs less than a wake-up through the bell while traffic flows), unless
/// `SOFTRDMA_LANE_SPIN_US` says otherwise.
pub(crate) const LANE_SPIN: Duration = Duration::from_micros(50);

/// How long the progress thread holds the positive ACK of a request it took for a program
/// that polls (see `progress`), waiting for the program's answer to carry it, unless
/// `SOFTRDMA_ACK_HOLD_US` says otherwise (0: no ACK is held over the wire, by the progress
/// thread or by a program's poll; each goes at once, as a NIC sends it. A program's poll still
/// holds the ACKs of a same-host lane's packets, whose peer is always softrdma).
pub(crate) const ACK_HOLD: Duration = Duration::from_micros(20);

/// How long a progress thread polls its socket after a lone packet before it sleeps, while
/// that pays (see `progress::PollWindow`), unless `SOFTRDMA_SOCKET_SPIN_US` says otherwise.
pub(crate) const SOCKET_SPIN: Duration = Duration::from_micros(50);

/// What the receiving thread holds: the receive state of the device socket and of the
/// multicast group sockets.
pub(crate) struct Receiving {
    pub(super) rx: RxState,
    pub(super) mcast: RxMcast,
    /// Polls by application threads since one last read the socket (see
    /// [`Engine::poll_progress`]).
    pub(super) socket_skipped: u32,
    /// Polls left before lanes count as idle (see [`Engine::poll_progress`]).
    pub(super) lane_polls: u32,
}

/// The engine of one device.
pub(crate) struct Engine {
    /// The device socket, its wake-up, counters and fault injection.
    pub(super) wire: Wire,
    /// The device socket's address.
    pub(super) local: SocketAddr,
    /// This process's membership of the device, which other processes may share.
    pub(super) share: Share,
    qps: RwLock<QpnMap<Weak<dyn QpPort>>>,
    /// The deadline of each QP (QP 1: the CM's). (A HashMap rather than proto's
    /// `TimerTable`: setting a deadline, once per drive of a QP, costs a third of what a
    /// heap push costs, and the progress thread's scan is of a handful of QPs.)
    pub(super) timers: Mutex<QpnMap<Instant>>,
    /// The earliest deadline set since the timers were last run ([`Engine::nanos`];
    /// `u64::MAX`: none), which may have moved later since: application threads polling the
    /// device run the timers once it has passed (see [`Engine::run_due_timers`]).
    pub(super) earliest: AtomicU64,
    epoch: Instant,
    /// When the progress thread will wake up on its own (nanoseconds since `epoch`).
    pub(super) sleep_until: AtomicU64,
    /// How long the progress thread keeps polling the socket without sleeping after the
    /// last packet (`SOFTRDMA_BUSY_POLL_US`; 0 = always sleep in poll(2)).
    pub(super) busy_poll: Duration,
    /// How long the progress thread polls the same-host lanes after their last packet before
    /// it sleeps (`SOFTRDMA_LANE_SPIN_US`, default [`LANE_SPIN`]).
    pub(super) lane_spin: Duration,
    /// How long the progress thread polls the socket after a lone packet before it sleeps,
    /// while that pays (`SOFTRDMA_SOCKET_SPIN_US`, default [`SOCKET_SPIN`]; 0: never).
    pub(super) socket_spin: Duration,
    /// How long the progress thread holds the ACK of a request it took for a program that
    /// polls (`SOFTRDMA_ACK_HOLD_US`, default [`ACK_HOLD`]; 0: none over the wire).
    pub(super) ack_hold: Duration,
    /// The receive buffers, held by the thread that is receiving.
    pub(super) rx: Mutex<Receiving>,
    /// How many times application threads polled an empty, unarmed CQ of this device (the
    /// progress thread compares it with what it saw last time).
    pub(super) app_polls: AtomicU64,
    /// `app_polls` as the last poll that found nothing (`Engine::poll_progress` with `empty`)
    /// left it: such a poll sends the ACKs held for the program's answer, so the progress
    /// thread leaves held ACKs to the program only while it polls empty now and then.
    pub(super) app_empty_polls: AtomicU64,
    /// A CQ of this device was armed for an event after the last such poll: its program is
    /// going to sleep, so the progress thread must watch the socket.
    pub(super) app_asleep: AtomicBool,
    /// An application thread's poll yielded the CPU, finding the receive side taken many
    /// times in a row (see `progress::BusyReceiver`), and no poll has taken it since: the
    /// progress thread does not stand down for the polls meanwhile (the yielding thread may
    /// be off its core for a time slice, and nobody would receive).
    pub(super) app_yielded: AtomicBool,
    /// The progress thread is not watching the socket (an application thread polls it).
    pub(super) standing_down: AtomicBool,
    /// [`Engine::app_polls`] plus one when a polling program may have begun to spin on
    /// memory (see [`Engine::watch_for_spinner`]); 0: none. The progress thread watches the
    /// device until the count moves past it.
    pub(super) spinner_at: AtomicU64,
    /// Application threads polling this device take packets from its same-host lanes now,
    /// and read the socket only now and then: the progress thread watches the socket for
    /// them while it leaves the device to them.
    pub(super) lanes_hot: AtomicBool,
    /// [`POLL_HANDOFF`] or `SOFTRDMA_POLL_HANDOFF_US`.
    pub(super) handoff: Duration,
    /// QPs whose transport holds a positive ACK back, and whether the list may be non-empty.
    held_acks: Mutex<Vec<u32>>,
    any_held_acks: AtomicBool,
    /// A QP that holds an acknowledgement back, noted without the list (0: none): a
    /// ping-pong notes and forgets one QP every round trip, which the list's lock and search
    /// made some 120 instructions.
    held_ack_one: AtomicU32,
    /// Threads releasing what QPs held back, between taking it off the lists and sending it
    /// (see [`Engine::holds_back`]).
    releasing: AtomicUsize,
    /// UC and UD QPs whose transport holds single posted sends back for one batch (see
    /// [`Engine::note_held_send`]), and whether the list may be non-empty.
    held_sends: Mutex<Vec<u32>>,
    pub(super) any_held_sends: AtomicBool,
    /// Notes made by [`Engine::note_held_send`] (the progress thread watches whether it
    /// changes).
    pub(super) held_notes: AtomicU64,
    /// The progress thread sleeps no longer than [`Engine::handoff`] now, because sends
    /// were held since its last look.
    pub(super) send_cap: AtomicBool,
    /// A held send, or a watch for a program that may spin on memory
    /// ([`Engine::watch_for_spinner`]), woke the progress thread, which has not looked yet.
    pub(super) send_wake_asked: AtomicBool,
    /// QP 1: the connection manager's MADs.
    pub(super) gsi: Mutex<Gsi>,
    /// This engine, for the connection-manager layer's ids.
    me: OnceLock<Weak<Engine>>,
    /// The device's queue 0 when this engine is a further receive queue (see
    /// `devices::open_queue`): its connection manager is the device's.
    pub(super) first: OnceLock<Weak<Engine>>,
    /// The progress thread, once it runs.
    pub(super) progress_thread: OnceLock<std::thread::ThreadId>,
    /// Whether the transmit thread runs (see [`Engine::send`]); unset until a batch wants it.
    tx_thread: OnceLock<bool>,
    /// The multicast groups the device has joined, their sockets and attached QPs.
    pub(super) mcast: Mcast,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// Whether UC/UD sends may be held for a batch (on unless `SOFTRDMA_UNRELIABLE_BATCH=0`; see
/// [`Engine::note_held_send`]).
fn unreliable_batch_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_UNRELIABLE_BATCH").map_or(true, |v| v.trim() != "0"))
}

/// Tells the connection-manager layer, if one registered, that `engine` started; then its
/// CM takes the connection requests that came before ([`Gsi::announced`]).
pub(super) fn engine_started(engine: &Arc<Engine>) {
    if let Some(hook) = cm_hook() {
        let e: Arc<dyn Provider> = engine.clone();
        (hook.engine_started)(&e);
    }
    engine.with_cm(|g, now| g.announced(now));
}

impl Engine {
    /// The engine of the device whose socket is on `wire`, for the process that holds
    /// `share` (its slot on the device); `ifindex` is the interface of the device address.
    /// Starts no thread (see the `devices` module).
    pub(super) fn new(wire: Wire, share: Share, ifindex: u32) -> Arc<Engine> {
        let local = wire.local;
        let slot = share.slot();
        let env_us = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map(Duration::from_micros)
        };
        Arc::new(Engine {
            wire,
            local,
            share,
            qps: RwLock::new(QpnMap::default()),
            timers: Mutex::new(QpnMap::default()),
            earliest: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            sleep_until: AtomicU64::new(0),
            rx: Mutex::new(Receiving {
                rx: RxState::new(),
                mcast: RxMcast::default(),
                socket_skipped: 0,
                lane_polls: 0,
            }),
            app_polls: AtomicU64::new(0),
            app_empty_polls: AtomicU64::new(0),
            app_asleep: AtomicBool::new(false),
            app_yielded: AtomicBool::new(false),
            standing_down: AtomicBool::new(false),
            lanes_hot: AtomicBool::new(false),
            held_acks: Mutex::new(Vec::new()),
            any_held_acks: AtomicBool::new(false),
            held_ack_one: AtomicU32::new(0),
            spinner_at: AtomicU64::new(0),
            releasing: AtomicUsize::new(0),
            held_sends: Mutex::new(Vec::new()),
            any_held_sends: AtomicBool::new(false),
            held_notes: AtomicU64::new(0),
            send_cap: AtomicBool::new(false),
            send_wake_asked: AtomicBool::new(false),
            handoff: env_us("SOFTRDMA_POLL_HANDOFF_US").unwrap_or(POLL_HANDOFF),
            me: OnceLock::new(),
            tx_thread: OnceLock::new(),
            first: OnceLock::new(),
            progress_thread: OnceLock::new(),
            mcast: Mcast::new(ifindex),
            gsi: Mutex::new(Gsi::new(
                local.ip(),
                crate::gid::guid_for(&local.ip()),
                slot,
            )),
            busy_poll: env_us("SOFTRDMA_BUSY_POLL_US").unwrap_or(Duration::ZERO),
            lane_spin: env_us("SOFTRDMA_LANE_SPIN_US").unwrap_or(LANE_SPIN),
            socket_spin: env_us("SOFTRDMA_SOCKET_SPIN_US").unwrap_or(SOCKET_SPIN),
            ack_hold: env_us("SOFTRDMA_ACK_HOLD_US").unwrap_or(ACK_HOLD),
        })
    }

    /// Records the engine's own `Arc` (for the connection-manager layer's ids and the
    /// discovery thread).
    pub(super) fn set_me(self: &Arc<Self>) {
        let _ = self.me.set(Arc::downgrade(self));
    }

    /// This process's slot on the device: the byte in bits 16..23 of its QP numbers and
    /// 24..31 of its CM communication IDs.
    pub(super) fn slot(&self) -> u8 {
        self.share.slot()
    }

    /// Runs the discovery of the device's group indices in this thread (a few milliseconds;
    /// about a second at worst, when members do not answer) and attaches the steering
    /// program it builds. With `SOFTRDMA_STEERING=hash` it attaches the program that steers
    /// nothing instead: the kernel spreads datagrams by its hash and every one that reaches
    /// the wrong process is forwarded (for tests of the forwarding path, and to measure what
    /// steering saves).
    pub(crate) fn discover_now(&self) {
        if steering_off() {
            if let Err(err) = self
                .wire
                .sock
                .attach_steering(&super::steer::hash_program())
            {
                tracing::warn!(error = %err, "attaching the hash program");
            }
            return;
        }
        let dst = SocketAddr::new(self.local.ip(), self.local.port());
        self.share.discover(
            Duration::from_millis(50),
            |m| self.wire.sock.send_one(m, dst),
            |p| self.wire.sock.attach_steering(p),
        );
    }

    /// Runs [`Engine::discover_now`] on a thread of its own (unless a discovery runs; then it
    /// runs once more after). Nothing to learn without steering.
    pub(crate) fn rediscover(&self) {
        let Some(me) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        if steering_off() || self.share.busy() {
            return;
        }
        let spawned =
            super::fd::spawn_quiet("softrdma-discovery".into(), move || me.discover_now());
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "spawning the discovery thread");
        }
    }

    /// Registers the QP `qpn`: packets and timeouts for it go to `qp` from now on.
    pub(super) fn register(&self, qpn: u32, qp: Weak<dyn QpPort>) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qpn, qp);
    }

    /// Forgets the QP `qpn` and its deadline.
    pub(super) fn unregister(&self, qpn: u32) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
        self.timers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
    }

    pub(super) fn lookup(&self, qpn: u32) -> Option<Arc<dyn QpPort>> {
        self.qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&qpn)
            .and_then(Weak::upgrade)
    }

    pub(super) fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Records the QP's next deadline and wakes the progress thread if it would sleep past it,
    /// unless it stands down for application threads that poll the device: they run the
    /// timers then (a wake-up per deadline moved earlier, several thousand a second for the
    /// tail-loss probes of a busy QP, preempted the pollers on a small machine).
    pub(super) fn set_timer(&self, qpn: u32, deadline: Option<Instant>) {
        let mut t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        match deadline {
            Some(d) => {
                t.insert(qpn, d);
                drop(t);
                let n = self.nanos(d);
                // (SeqCst with the progress thread's store of `sleep_until` before it reads
                // `earliest`: either it sees this deadline, or this sees it about to sleep.)
                self.earliest.fetch_min(n, Ordering::SeqCst);
                if n < self.sleep_until.load(Ordering::SeqCst)
                    && !self.standing_down.load(Ordering::SeqCst)
                {
                    self.wire.wake.signal();
                }
            }
            None => {
                t.remove(&qpn);
            }
        }
    }

    /// The earliest deadline of the device's timers, or an earlier instant (`earliest` may
    /// lag behind a deadline moved later): when the progress thread must be awake.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let n = self.earliest.load(Ordering::SeqCst);
        (n != u64::MAX).then(|| self.epoch + Duration::from_nanos(n))
    }

    /// Runs the timers whose deadline has passed by `now` (`due`: a scratch list), and
    /// records the earliest of the others.
    pub(super) fn run_due_timers(&self, now: Instant, tx: &mut TxBatch, due: &mut Vec<u32>) {
        {
            let t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
            let mut next = u64::MAX;
            for (q, d) in t.iter() {
                if *d <= now {
                    due.push(*q);
                } else {
                    next = next.min(self.nanos(*d));
                }
            }
            // (Under the lock: a deadline set meanwhile is in the map after this store, and
            // its `fetch_min` comes after it.)
            self.earliest.store(next, Ordering::Release);
        }
        for qpn in due.drain(..) {
            self.on_timeout(qpn, now, tx);
        }
    }

    /// Runs the timers of QP `qpn` (QP 1: the CM's), whose deadline has passed.
    pub(super) fn on_timeout(&self, qpn: u32, now: Instant, tx: &mut TxBatch) {
        if qpn == softrdma_wire::mad::GSI_QPN {
            let evs = {
                let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
                g.cm.handle_timeout(now);
                self.gsi_drive(&mut g, tx);
                g.take_events()
            };
            self.send(tx);
            self.dispatch(evs);
            return;
        }
        let Some(qp) = self.lookup(qpn) else {
            // The QP is gone (or in RESET): its entry goes, unless the QP came back meanwhile
            // and set a deadline still ahead (which it counts on being held).
            let mut t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
            if t.get(&qpn).is_some_and(|d| *d <= now) {
                t.remove(&qpn);
            }
            return;
        };
        qp.on_timeout(self, now, tx);
    }

    /// A snapshot of the device's packet counters.
    pub(super) fn counters(&self) -> DeviceCounters {
        let mut c = self.wire.counters.snapshot();
        // Records through QP pair rings, counted by each ring's sender.
        let (records, bytes) = self.wire.lanes.pair_sent();
        c.tx_packets += records;
        c.tx_bytes += bytes;
        c.same_host_packets += records;
        c.wr_records += records;
        c.pair_records += records;
        let (records, bytes) = self.wire.lanes.pair_received();
        c.rx_packets += records;
        c.rx_bytes += bytes;
        c
    }

    /// Injects faults with `cfg` into what the device sends from now on (`None`: none).
    pub(super) fn set_faults(&self, cfg: Option<FaultConfig>) {
        self.wire.set_faults(cfg);
    }

    /// Sends a batch of finished packets (see [`Wire::send`]); a full batch of a stream of
    /// large RC requests or READ responses goes to the device's transmit thread instead (see
    /// [`TxQueue`]), started on first use.
    #[inline]
    pub(super) fn send(&self, tx: &mut TxBatch) {
        if self.wire.wants_queue(tx)
            && self.tx_thread()
            && self.wire.txq.claim()
            && self.wire.txq.push(tx)
        {
            return;
        }
        self.wire.send(tx);
    }

    /// Starts the transmit thread of this engine's wire if it does not run yet; whether it
    /// runs.
    #[cold]
    fn tx_thread(&self) -> bool {
        *self.tx_thread.get_or_init(|| {
            let Some(me) = self.me.get().cloned() else {
                return false;
            };
            let q = self.wire.txq.clone();
            let started =
                super::fd::spawn_quiet(format!("softrdma-tx-{}", self.local.ip()), move || {
                    transmit(q, me)
                })
                .is_ok();
            if started {
                self.wire.txq.mark_started();
            }
            started
        })
    }

    /// Attaches QP `qpn` to the multicast group `gid` (see [`Mcast::join`]).
    pub(super) fn mcast_join(&self, gid: &Gid, qpn: u32) -> Result<()> {
        self.mcast.join(&self.wire, gid, qpn)
    }

    /// Detaches QP `qpn` from the multicast group `gid` (see [`Mcast::leave`]).
    pub(super) fn mcast_leave(&self, gid: &Gid, qpn: u32) {
        self.mcast.leave(&self.wire, gid, qpn)
    }

    /// See [`super::Provider::watch_for_spinner`]: the progress thread watches the device
    /// from now until the program's next poll (woken now if it was leaving the device to the
    /// polls).
    pub(super) fn watch_for_spinner(&self) {
        if self.handoff.is_zero() {
            return;
        }
        // (The poll that took the completion counted already: the next one moves past.)
        let polls = self.app_polls.load(Ordering::Relaxed);
        self.spinner_at
            .store(polls.wrapping_add(1), Ordering::SeqCst);
        if self.standing_down.load(Ordering::SeqCst)
            && !self.send_wake_asked.swap(true, Ordering::SeqCst)
        {
            self.wire.wake.signal();
        }
    }

    /// Records that the transport of QP `qpn` holds a positive ACK back.
    pub(super) fn note_held_ack(&self, qpn: u32) {
        let one = self.held_ack_one.load(Ordering::Relaxed);
        if one == qpn
            || (one == 0
                && self
                    .held_ack_one
                    .compare_exchange(0, qpn, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok())
        {
            return;
        }
        let mut l = self.held_acks.lock().unwrap_or_else(|p| p.into_inner());
        if !l.contains(&qpn) {
            l.push(qpn);
        }
        self.any_held_acks.store(true, Ordering::Release);
    }

    /// QP `qpn` holds no ACK back any more (it sent what it held with its own request): no
    /// flush needs to look at it.
    pub(super) fn forget_held_ack(&self, qpn: u32) {
        let _ = self
            .held_ack_one
            .compare_exchange(qpn, 0, Ordering::SeqCst, Ordering::Relaxed);
        if !self.any_held_acks.load(Ordering::SeqCst) {
            return;
        }
        let mut l = self.held_acks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = l.iter().position(|&q| q == qpn) {
            l.swap_remove(i);
            if l.is_empty() {
                self.any_held_acks.store(false, Ordering::SeqCst);
            }
        }
    }

    /// Records that the transport of the UC or UD QP `qpn` holds sends just posted back, to
    /// send them with the ones posted next in one system call; says whether it may (`false`:
    /// the caller sends now): not when the hand-off is off (`SOFTRDMA_POLL_HANDOFF_US=0`) or
    /// the program sleeps on completion events (it armed a CQ and has not polled since: what
    /// it waits for must not wait). What is held goes at the program's next CQ poll of the
    /// device, when it arms a CQ or takes a completion event, from the connection manager's
    /// calls, when the QP changes state, is destroyed or dropped, and otherwise within
    /// [`Engine::handoff`] (0.5 ms): while sends are held the progress thread sleeps no
    /// longer, and sends them when it wakes (a note that finds it asleep for longer wakes it).
    ///
    /// `SOFTRDMA_UNRELIABLE_BATCH=0` turns holding off (every send leaves at once).
    pub(super) fn note_held_send(&self, qpn: u32) -> bool {
        if !unreliable_batch_on()
            || self.handoff.is_zero()
            || self.app_asleep.load(Ordering::Relaxed)
        {
            return false;
        }

        {
            let mut l = self.held_sends.lock().unwrap_or_else(|p| p.into_inner());
            if !l.contains(&qpn) {
                l.push(qpn);
            }
        }
        self.held_notes.fetch_add(1, Ordering::Relaxed);
        // Against the progress thread, which stores `send_cap` before it reads
        // `any_held_sends` to choose how long to sleep: either it sees the note (and sleeps
        // no longer than the hand-off), or this thread sees whether it capped its sleep (if
        // not, it is woken once).
        self.any_held_sends.store(true, Ordering::SeqCst);
        if !self.send_cap.load(Ordering::SeqCst)
            && !self.send_wake_asked.swap(true, Ordering::SeqCst)
        {
            self.wire.wake.signal();
        }
        true
    }

    /// Whether a QP of this engine may hold back an ACK or sends (what
    /// [`Engine::flush_held_acks`] and [`Engine::flush_held_sends`] release), or another
    /// thread is sending what it took off the lists (a process about to exit waits for it:
    /// the lists are emptied before their sends go, and a thread that exits meanwhile kills
    /// that send).
    pub(crate) fn holds_back(&self) -> bool {
        self.releasing.load(Ordering::SeqCst) > 0
            || self.wire.tx_pending() != 0
            || self.holds_acks()
            || self.any_held_sends.load(Ordering::SeqCst)
    }

    /// Whether a QP of this engine may hold back a positive ACK (it may have sent it since
    /// with an answer of its own).
    pub(super) fn holds_acks(&self) -> bool {
        self.held_ack_one.load(Ordering::SeqCst) != 0 || self.any_held_acks.load(Ordering::SeqCst)
    }

    /// Counts the calling thread as releasing held sends or ACKs until the guard drops.
    fn releasing(&self) -> Releasing<'_> {
        // (SeqCst, before the lists are emptied: a thread that finds them empty finds this.)
        self.releasing.fetch_add(1, Ordering::SeqCst);
        Releasing(&self.releasing)
    }

    /// Sends what QPs hold back with [`Engine::note_held_send`] (one atomic load when
    /// nothing is held).
    pub(crate) fn flush_held_sends(&self) {
        let _ = self.release_listed(&self.held_sends, &self.any_held_sends);
    }

    /// Sends the ACKs that QPs hold back (costs one atomic load when there are none);
    /// returns how many QPs still held something and sent it now (a QP noted that sent what
    /// it held with its own answer meanwhile is not counted).
    pub(crate) fn flush_held_acks(&self) -> usize {
        let mut n = 0;
        if self.held_ack_one.load(Ordering::Relaxed) != 0 {
            n += self.release_held_ack_one();
        }
        n + self.release_listed(&self.held_acks, &self.any_held_acks)
    }

    #[inline(never)]
    fn release_held_ack_one(&self) -> usize {
        let _releasing = self.releasing();
        let qpn = self.held_ack_one.swap(0, Ordering::SeqCst);
        if qpn != 0 {
            if let Some(qp) = self.lookup(qpn) {
                return usize::from(qp.release_held_ack());
            }
        }
        0
    }

    /// Releases what the QPs of `list` hold back (`QpPort::release_held_ack`: a held ACK, or
    /// sends held for a batch), when `any` says the list may be non-empty; returns how many
    /// still held something.
    #[inline]
    fn release_listed(&self, list: &Mutex<Vec<u32>>, any: &AtomicBool) -> usize {
        // (Called at every poll, nearly always with nothing listed: the check stays here.)
        if any.load(Ordering::SeqCst) {
            self.release_listed_now(list, any)
        } else {
            0
        }
    }

    #[inline(never)]
    fn release_listed_now(&self, list: &Mutex<Vec<u32>>, any: &AtomicBool) -> usize {
        // Taken out of the lock (releasing locks each QP, and a QP's drive notes into the
        // list under the QP lock), then given back empty so that its room is reused: a
        // ping-pong notes and flushes a held ACK every round trip.
        let _releasing = self.releasing();
        let mut qpns = {
            let mut l = list.lock().unwrap_or_else(|p| p.into_inner());
            any.store(false, Ordering::SeqCst);
            std::mem::take(&mut *l)
        };
        let mut n = 0;
        for qpn in qpns.drain(..) {
            if let Some(qp) = self.lookup(qpn) {
                n += usize::from(qp.release_held_ack());
            }
        }
        let mut l = list.lock().unwrap_or_else(|p| p.into_inner());
        if l.is_empty() {
            *l = qpns;
        }
        n
    }
}

// The engine's side of QP 1: MADs in, listening, ICMP errors, liveness probes, and CM events
// up to the connection-manager layer.
impl Engine {
    /// Makes this device's CM accept requests for the service `sid`, claiming it on the
    /// shared device; says whether this process did not listen on it before.
    ///
    /// Fails with `EADDRINUSE` when another process listens on `sid` on this device.
    pub(super) fn cm_listen(&self, sid: u64) -> Result<bool> {
        let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
        g.listen(&self.share, sid)
    }

    /// Stops accepting requests for `sid` and lets go of its claim.
    pub(super) fn cm_unlisten(&self, sid: u64) {
        self.gsi
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unlisten(sid);
    }

    /// Sends a liveness probe to every peer the CM has a connection with.
    pub(super) fn probe_peers(&self) {
        gsi::probe_peers(&self.gsi, &self.wire);
    }

    /// Hands CM events to the connection-manager layer through its hook (no lock held); the
    /// ones no id handles, all of them while no layer has registered, go back to the queue.
    pub(crate) fn dispatch(&self, evs: Vec<CmEvent>) {
        if evs.is_empty() {
            return;
        }
        let Some(me) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        let me: Arc<dyn Provider> = me;
        let rest: Vec<_> = match cm_hook() {
            Some(hook) => evs
                .into_iter()
                .filter_map(|ev| (hook.dispatch)(&me, ev))
                .collect(),
            None => evs,
        };
        if !rest.is_empty() {
            // Not `with_cm`: what goes back to the queue must not be dispatched again now.
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            g.requeue(Instant::now(), rest);
            self.gsi_drive_and_send(&mut g);
        }
    }

    /// Sends what the CM wants sent, collects its events and records its next deadline
    /// (under the timer key of QP 1). Called with the GSI lock held.
    pub(crate) fn gsi_drive(&self, g: &mut Gsi, tx: &mut TxBatch) {
        let deadline = g.drive(&self.wire, tx);
        self.set_timer(softrdma_wire::mad::GSI_QPN, deadline);
    }

    /// [`Engine::gsi_drive`], then sends at once what it queued (GSI lock held).
    fn gsi_drive_and_send(&self, g: &mut Gsi) {
        with_tx(|tx| {
            self.gsi_drive(g, tx);
            self.send(tx);
        });
    }

    /// Runs `f` on the connection manager of this device, sends what it wants sent, then
    /// dispatches its events.
    pub(super) fn with_cm<R>(&self, f: impl FnOnce(&mut Gsi, Instant) -> R) -> R {
        let (r, evs) = {
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            let r = f(&mut g, Instant::now());
            self.gsi_drive_and_send(&mut g);
            let evs = if self.me.get().is_some() {
                g.take_events()
            } else {
                Vec::new()
            };
            (r, evs)
        };
        self.dispatch(evs);
        r
    }
}

/// The engine takes what its receive side (the device socket, the forwarding socket, the
/// group sockets) found good.
impl RxSink for Engine {
    #[inline]
    fn deliver(
        &self,
        qpn: u32,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Option<Delivery> {
        let qp = self.lookup(qpn)?;
        Some(qp.receive(self, pkts, src, dst, via, now, tx))
    }

    type Port = Arc<dyn QpPort>;

    #[inline]
    fn deliver_to(
        &self,
        qp: Arc<dyn QpPort>,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Delivery {
        qp.receive(self, pkts, src, dst, Via::Unicast, now, tx)
    }

    /// Hands a packet for QP 1 to the CM of the process it is for: this one's, or, on a
    /// shared device, another process's (forwarded; see [`gsi::mad_owner`]). A packet
    /// `forwarded` here by another process is this process's.
    fn mad(&self, pkt: &[u8], src: SocketAddr, now: Instant, tx: &mut TxBatch, forwarded: bool) {
        if !forwarded {
            // On a further receive queue (which the kernel's hash handed QP 1's packet), the
            // owner is decided as queue 0 would decide it, and what is this process's goes to
            // queue 0 here, with no hop (and no second count).
            let first = self.first.get().and_then(Weak::upgrade);
            let cm = first.as_deref().unwrap_or(self);
            if let Some(slot) = gsi::mad_owner(&cm.gsi, &cm.share, pkt) {
                if self.share.forward(slot, src, pkt).is_ok() {
                    self.wire.counters.misrouted.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // The owner is gone: this process's CM answers (it knows no such
                // communication).
            }
            if !std::ptr::eq(cm, self) {
                self.send(tx);
                RxSink::mad(cm, pkt, src, now, tx, true);
                return;
            }
        }
        let evs = {
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            g.receive(now, src.ip(), pkt);
            self.gsi_drive(&mut g, tx);
            g.take_events()
        };
        self.send(tx);
        self.dispatch(evs);
    }

    /// Reads the socket's ICMP errors ([`super::sock::UdpSock::take_icmp_errors`]), counts
    /// them and hands them to the CM ([`Gsi::icmp_errors`]).
    fn icmp_errors(&self, tx: &mut TxBatch) -> usize {
        let mut errs = Vec::new();
        self.wire.sock.take_icmp_errors(&mut errs);
        if errs.is_empty() {
            return 0;
        }
        self.wire
            .counters
            .icmp_errors
            .fetch_add(errs.len() as u64, Ordering::Relaxed);
        // The connections are the device's connection manager's: queue 0's. (A further
        // queue's own CM has none; what it sent draws errors here all the same.)
        self.send(tx);
        let first = self.first.get().and_then(Weak::upgrade);
        let cm = first.as_deref().unwrap_or(self);
        let evs = {
            let mut g = cm.gsi.lock().unwrap_or_else(|p| p.into_inner());
            g.icmp_errors(&errs);
            cm.gsi_drive(&mut g, tx);
            g.take_events()
        };
        cm.send(tx);
        cm.dispatch(evs);
        errs.len()
    }

    fn rediscover(&self) {
        Engine::rediscover(self);
    }

    fn attach_pair(
        &self,
        qpn: u32,
        src: SocketAddr,
        src_qpn: u32,
        p: &std::sync::Arc<super::PairRx>,
    ) -> bool {
        self.lookup(qpn)
            .is_some_and(|qp| qp.attach_pair(self, src, src_qpn, p.clone()))
    }
}

/// Whether `SOFTRDMA_STEERING=hash` turned steering off (read once per process).
fn steering_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("SOFTRDMA_STEERING").is_ok_and(|v| v.trim() == "hash"))
}

/// The transmit thread of a device (see [`TxQueue`]): sends the batches queued, in order,
/// until the device's engine is gone.
fn transmit(q: Arc<TxQueue>, engine: Weak<Engine>) {
    loop {
        match q.next() {
            Some(mut b) => {
                match engine.upgrade() {
                    Some(e) => {
                        // (A panic while sending loses the batch, as a NIC drops what it
                        // cannot send, and keeps the thread: threads waiting for the queue
                        // to empty would otherwise wait forever.)
                        let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            e.wire.send_batch(&mut b)
                        }));
                        if sent.is_err() {
                            b.clear();
                        }
                    }
                    // (The device closed with packets queued: they go nowhere.)
                    None => b.clear(),
                }
                q.sent(b);
            }
            None if engine.strong_count() == 0 => return,
            None => {}
        }
    }
}

/// A thread counted in [`Engine::holds_back`] while it sends what QPs held back.
struct Releasing<'a>(&'a AtomicUsize);

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
