//! Progress: the device's progress thread, and progress from application threads that
//! poll a CQ (the socket hand-off and held ACKs).

use super::counters::PROBE_INTERVAL;
use super::engine::Engine;
use super::lanes;
use super::mcast;
use super::rx::RxSink;
use super::tx::{with_tx, TxBatch};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

thread_local! {
    /// Whom this thread receives for: [`Receiving::Other`], or a program that polls its CQs
    /// (an application thread in [`Engine::poll_progress`], or the progress thread for a
    /// program that polled lately), holding the positive ACKs of what it receives
    /// ([`Receiving::PollerHolding`]), of what comes over a same-host lane only
    /// ([`Receiving::PollerLanes`]), or none ([`Receiving::Poller`]); see [`holding_acks`].
    static HOLD_ACKS: std::cell::Cell<Receiving> = const { std::cell::Cell::new(Receiving::Other) };
    /// The engine (its address) whose receive state an application thread holds in
    /// [`Engine::poll_progress`] (0: none).
    static RECEIVING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// This application thread's polls in a row that found another thread receiving for the
    /// device (see [`BusyReceiver`]).
    static BUSY_RECEIVER: std::cell::Cell<BusyReceiver> = const { std::cell::Cell::new(BusyReceiver(0)) };
}

/// An application thread's polls in a row that found the device's receive side taken by
/// another thread (the progress thread, or another program thread), and whether the next
/// such poll yields the CPU.
///
/// The progress thread sends a stream's packets while it holds the receive side: an ACK that
/// opens the window is followed by up to a batch of large packets, a `sendmmsg` of several
/// megabytes. A program thread that busy-polls its CQ meanwhile (a SEND receiver between
/// messages, a bandwidth client waiting for its next completion) finds the receive side
/// taken at every poll and spins for nothing, and where it shares a core with the holder (two
/// processes pinned to a core each, or more busy threads than cores) the holder waits for the
/// spinner's time slice to end. From [`BusyReceiver::YIELD_AFTER`] such polls in a row on,
/// each yields the CPU (`sched_yield`): at once back when nothing else waits for the core,
/// and the holder runs when it does. (`softrdma perf send -s 1048576` over the wire, one
/// process, 6 rounds: 2.97 -> 4.01 GB/s median; two processes pinned, 8 rounds: 3.53 -> 3.75;
/// BENCHMARKS.md, "A poll that finds the receive side taken yields the CPU".)
/// A poll that takes the receive side starts the count again, so a ping-pong, whose polls
/// find the progress thread receiving only now and then and briefly, never yields. A poll
/// that yields marks the device (`Engine::app_yielded`) until a poll takes the receive side
/// again, and the progress thread does not stand down for the program's polls meanwhile: the
/// yielding thread may be off its core for a time slice, and with the progress thread
/// standing down nobody would receive (perftest `ib_read_bw`, whose program spins on its CQ
/// without end, dropped hundreds of datagrams a run). The count is the thread's, whatever
/// device its polls looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BusyReceiver(u32);

impl BusyReceiver {
    /// Polls in a row that find the receive side taken before one yields: some 10-30 µs of
    /// polling (a poll that finds it taken costs 50-100 ns), longer than the progress thread
    /// holds it for a packet or a run of short ones, shorter than its send of a stream's
    /// window. (After 16, the few yields of a lane's 8-byte WRITE stream, where the progress
    /// thread polls the lanes in short holds, each gave the core to a polling thread for a
    /// time slice: 7.0 -> 6.1-6.5 M msg/s; after 256 even, and SEND 1 MiB gained as much.)
    const YIELD_AFTER: u32 = 256;

    /// A poll found the receive side taken: whether it yields the CPU now.
    fn taken(&mut self) -> bool {
        self.0 = self.0.saturating_add(1);
        self.0 >= Self::YIELD_AFTER
    }

    /// A poll took the receive side.
    fn took(&mut self) {
        self.0 = 0;
    }
}

/// Whether this thread receives for a polling program and holds the positive ACKs of what
/// comes over the wire (`over_lane` false) or over a same-host lane or QP pair ring (true):
/// the QPs it drives hold the positive ACK of what they received (noted with
/// [`Engine::note_held_ack`]), so that what the program answers goes out first with the ACK
/// right behind, in one batch (an application thread receiving for itself in
/// [`Engine::poll_progress`], or the progress thread for a program that polled lately; see
/// `AckHold`).
#[inline]
pub(crate) fn holding_acks(over_lane: bool) -> bool {
    match HOLD_ACKS.with(std::cell::Cell::get) {
        Receiving::PollerHolding => true,
        Receiving::PollerLanes => over_lane,
        Receiving::Other | Receiving::Poller => false,
    }
}

/// Whether this thread receives for a program that polls its CQs rather than sleeping on
/// completion events, whether or not it holds ACKs: an application thread in
/// [`Engine::poll_progress`] for a busy poll, or the progress thread for a program that polled
/// in the last two hand-off periods. Never with the hand-off off (`SOFTRDMA_POLL_HANDOFF_US=0`).
#[inline]
pub(crate) fn receiving_for_poller() -> bool {
    HOLD_ACKS.with(std::cell::Cell::get) != Receiving::Other
}

/// Whom a thread receives for, and which positive ACKs it holds (see [`holding_acks`] and
/// [`receiving_for_poller`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Receiving {
    /// Not for a polling program (a program asleep on events, the hand-off off, or no
    /// receive at all): no ACK is held.
    Other,
    /// For a polling program; no ACK is held (the progress thread, when holding stopped
    /// paying or `SOFTRDMA_ACK_HOLD_US=0`).
    Poller,
    /// For a polling program, holding the ACKs of what comes over a same-host lane only: an
    /// application thread with `SOFTRDMA_ACK_HOLD_US=0`, which models a wire peer that
    /// acknowledges at once (a lane's peer is always softrdma, whose WRITE-and-spin needs its
    /// ACK behind the answer; see `verbs::datapath`).
    PollerLanes,
    /// For a polling program, holding the positive ACKs of what it receives.
    PollerHolding,
}

/// Sets what [`holding_acks`] and [`receiving_for_poller`] say on this thread.
#[inline]
fn set_receiving(r: Receiving) {
    HOLD_ACKS.with(|h| h.set(r));
}

impl Engine {
    /// What an application thread that polls (`poller`) receives for (a poll that takes a
    /// QP pair ring's records holds their acknowledgements as `poll_progress` does).
    fn app_receiving(&self, poller: bool) -> Receiving {
        if !poller {
            Receiving::Other
        } else if self.ack_hold.is_zero() {
            Receiving::PollerLanes
        } else {
            Receiving::PollerHolding
        }
    }
}

/// When the progress thread polls the same-host lanes (or its socket) rather than sleeping.
///
/// After the lanes bring packets, the thread polls them for `SOFTRDMA_LANE_SPIN_US` (50 µs; a
/// *window*) when that pays: polling costs less than a wake-up through the bell while traffic
/// flows (1 MiB WRITEs: 22-23 GB/s against 15-19 without, this 2-core machine), and a READ
/// target, whose program does not poll, answers without a wake-up. But a program that waits
/// for an RDMA WRITE by spinning on its own memory (ib_write_lat, WRITE-based RPC) leaves every
/// packet to this thread, and where busy threads outnumber cores a polling progress thread
/// takes the core that program spins on: UC `ib_write_lat` over lanes took 42-80 µs one way
/// on 2 cores, against 9-19 over the wire, each packet waiting for the scheduler. So a window
/// is judged: it paid when the next packet came before it ended. After one that did not, a
/// lone packet opens no window (the thread sleeps on the bells), except every
/// [`PollWindow::PROBE_EVERY`]-th, which tries again; a look that finds several packets (a
/// stream) always opens one. The device socket is judged alike, except that a stream opens
/// no window there ([`PollWindow::took_with`]).
struct PollWindow {
    /// The end of the window (in the past: none).
    until: Instant,
    /// Whether a window was opened and not judged yet.
    open: bool,
    /// Whether the last window judged paid.
    pays: bool,
    /// Lone packets that opened no window since the last one.
    lone: u32,
}

impl PollWindow {
    /// How often a lone packet opens a window again while windows do not pay.
    const PROBE_EVERY: u32 = 16;

    fn new(now: Instant) -> PollWindow {
        PollWindow {
            until: now,
            open: false,
            pays: true,
            lone: 0,
        }
    }

    /// A look at `now` took `n` packets (at least one): judges the window open, and opens
    /// one of `spin` when it pays, for a run of packets, or to probe.
    fn took(&mut self, n: usize, now: Instant, spin: Duration) {
        self.took_with(n, now, spin, true);
    }

    /// [`PollWindow::took`], where a run of packets opens a window only if `runs` (the socket
    /// opens none for a stream: see `progress`).
    fn took_with(&mut self, n: usize, now: Instant, spin: Duration, runs: bool) {
        if self.open {
            self.pays = now <= self.until;
        }
        if n > 1 && !runs {
            self.open = false;
            self.until = now;
            return;
        }
        let probe = if n > 1 || self.pays {
            false
        } else {
            self.lone += 1;
            self.lone >= Self::PROBE_EVERY
        };
        if n > 1 || self.pays || probe {
            self.lone = 0;
            self.until = now + spin;
            self.open = true;
        } else {
            self.open = false;
        }
    }

    /// Whether to poll the lanes at `now` instead of sleeping; a window that ended with no
    /// packet did not pay.
    fn polls(&mut self, now: Instant) -> bool {
        if now < self.until {
            return true;
        }
        if self.open {
            self.open = false;
            self.pays = false;
        }
        false
    }

    /// Application threads poll (they take what the lanes bring): the window open is not
    /// judged.
    fn stand_down(&mut self) {
        self.open = false;
    }
}

/// The positive ACKs held for a program's answer, as the progress thread sees them: those it
/// holds itself for what it takes, and those the program's own polls hold.
///
/// A program that takes the completion of an RDMA WRITE (the peer's ACK), then spins on its
/// own memory for the peer's answer (ib_write_lat, WRITE-based RPC) calls no verb while it
/// spins, and the progress thread, which left the device to its polls, takes the answer only
/// when the hand-off ends (up to twice [`Engine::handoff`]). So the peer's ACK must not come
/// before the peer's answer: the ACK of what a program's poll takes waits for that program's
/// answer (see `verbs::datapath::drive`). Two things sent such ACKs alone, and each stall
/// made the next one, on the other side (ib_write_lat over the wire on 2 cores: 40% of the
/// round trips waited 0.1-1.1 ms; the RC requesters' tail-loss probes, each re-acknowledged
/// alone, made more):
/// - the progress thread, taking a request (a stall's answer) for a program that does not
///   poll at the moment, acknowledged it at once. Now, for a program that polled in the last
///   two hand-off periods, it holds the ACK for up to `SOFTRDMA_ACK_HOLD_US`
///   ([`super::engine::ACK_HOLD`], 20 µs): the program, seeing the data, answers on the QP,
///   and the ACK goes right behind the answer (a duplicate of the request meanwhile is
///   acknowledged by the same held ACK). Judged: the hold paid when the program's answer
///   took the ACK; after one that did not (a program that polls for other work and answers
///   nothing here), the thread holds none, except every [`AckHold::PROBE_EVERY`]-th time;
/// - the progress thread, waking at the end of a hand-off period, sent what the program's
///   poll had just held, between the poll and the answer. Now, finding ACKs held by the
///   program, it looks again `SOFTRDMA_ACK_HOLD_US` later, and sends them only if the
///   program has not polled since (a polling program sends what it holds at its next empty
///   poll; one that stopped polling is not answering).
struct AckHold {
    /// When the ACKs this thread held go at the latest (`None`: it holds none).
    until: Option<Instant>,
    /// Whether the last hold judged paid.
    pays: bool,
    /// Takes that held nothing since the last hold, while holds do not pay.
    skipped: u32,
    /// ACKs held by the program's polls, seen at a look: when to look again, and the
    /// program's poll count then.
    program: Option<(Instant, u64)>,
}

/// What the progress thread does with ACKs that the program's polls hold, at a look.
#[derive(Debug, PartialEq, Eq)]
enum ProgramHeld {
    /// Leaves them (looks again at the time [`AckHold::wake_by`] says, or not at all).
    Leave,
    /// Sends them: the program has not polled since the last look.
    Send,
}

impl AckHold {
    /// How often a take holds an ACK again while holds do not pay.
    const PROBE_EVERY: u32 = 16;

    fn new() -> AckHold {
        AckHold {
            until: None,
            pays: true,
            skipped: 0,
            program: None,
        }
    }

    /// Whether the take about to be made holds the ACKs of what it takes (the program
    /// polled lately, `may`).
    fn tries(&mut self, may: bool) -> bool {
        if !may {
            return false;
        }
        if self.pays {
            return true;
        }
        self.skipped += 1;
        if self.skipped >= Self::PROBE_EVERY {
            self.skipped = 0;
            return true;
        }
        false
    }

    /// A take that held ACKs ended at `now` with some held: they go by `now + hold` at the
    /// latest (an earlier hold keeps its end).
    fn held(&mut self, now: Instant, hold: Duration) {
        if self.until.is_none() {
            self.until = Some(now + hold);
        }
    }

    /// Whether the ACKs this thread held wait still at `now` (it woke before their time).
    fn waits(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// Whether this thread holds ACKs of its own (waiting or due).
    fn holds(&self) -> bool {
        self.until.is_some()
    }

    /// When this thread must look at held ACKs next, if at all.
    fn wake_by(&self) -> Option<Instant> {
        match (self.until, self.program) {
            (Some(u), Some((p, _))) => Some(u.min(p)),
            (u, p) => u.or(p.map(|(p, _)| p)),
        }
    }

    /// The held ACKs went: `unanswered` of them by this thread's flush (the program did not
    /// answer in time). Judges this thread's hold, if it held.
    fn released(&mut self, unanswered: usize) {
        self.program = None;
        if self.until.take().is_some() {
            self.pays = unanswered == 0;
        }
    }

    /// A look at `now` found ACKs that the program's polls hold (`polls`: its count of polls
    /// that found nothing): the first look leaves them for `hold`; a look after that sends
    /// them if the program has not polled empty since (and leaves them, forgetting the first
    /// look, if it has: such a poll sends them itself).
    fn program_held(&mut self, now: Instant, polls: u64, hold: Duration) -> ProgramHeld {
        match self.program {
            None => {
                self.program = Some((now + hold, polls));
                ProgramHeld::Leave
            }
            Some((at, _)) if now < at => ProgramHeld::Leave,
            Some((_, seen)) => {
                self.program = None;
                if seen == polls {
                    ProgramHeld::Send
                } else {
                    ProgramHeld::Leave
                }
            }
        }
    }

    /// A look found no ACK held.
    fn none_held(&mut self) {
        self.program = None;
    }
}

/// How often an application thread polling a CQ reads the device socket while the same-host
/// lanes bring packets (every this many polls): the progress thread watches the socket
/// meanwhile (`lanes_hot`), so this is only for a packet that arrived between its looks.
/// (Every 16th poll: a ping-pong over lanes spent about half its polling time in those
/// system calls, and 8-byte latency fell 11% with 1024.)
const SOCKET_EVERY: u32 = 1024;
/// How often (every this many polls) a polling application thread looks whether a timer of
/// the device is due (one clock read).
const TIMER_EVERY: u64 = 4;
/// How many polls after lane traffic the socket is read only every [`SOCKET_EVERY`] polls.
const LANE_POLLS: u32 = 1 << 16;

impl Engine {
    /// Progress from an application thread that polls a CQ: if no other thread is
    /// receiving, receive what is waiting now (without blocking) and process it here, so
    /// that a polling application gets its completions without a thread hop.
    ///
    /// `busy` says that the CQ polled is not armed for an event: its program polls rather
    /// than sleeps, and the progress thread leaves the socket to it (see the module notes).
    /// `empty` says that the poll found the CQ empty: the ACKs held for the program's answer
    /// go first (see [`super::Provider::poll_progress`]).
    pub(super) fn poll_progress(&self, busy: bool, empty: bool) {
        if let Some(polls) = self.note_app_poll(busy) {
            if empty {
                self.app_empty_polls.store(polls, Ordering::Relaxed);
            }
            // The progress thread leaves the timers to the polling threads too.
            if polls % TIMER_EVERY == 0 {
                let earliest = self.earliest.load(Ordering::Acquire);
                if earliest != u64::MAX {
                    let now = Instant::now();
                    if self.nanos(now) >= earliest {
                        with_tx(|tx| {
                            self.run_due_timers(now, tx, &mut Vec::new());
                            self.send(tx);
                        });
                    }
                }
            }
        }
        // The program found nothing to do: the ACKs held since its last receive go now.
        if empty {
            self.flush_held_acks();
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            if BUSY_RECEIVER.with(|b| {
                let mut v = b.get();
                let y = v.taken();
                b.set(v);
                y
            }) {
                // (Stored before the yield: the progress thread, about to stand down for this
                // thread's polls, keeps receiving until a poll takes the receive side again.)
                if !self.app_yielded.load(Ordering::Relaxed) {
                    self.app_yielded.store(true, Ordering::Relaxed);
                }
                // SAFETY: no arguments; it cannot fail on Linux.
                unsafe { libc::sched_yield() };
            }
            return;
        };
        BUSY_RECEIVER.with(|b| {
            let mut v = b.get();
            if v != BusyReceiver::default() {
                v.took();
                b.set(v);
            }
        });
        if self.app_yielded.load(Ordering::Relaxed) {
            self.app_yielded.store(false, Ordering::Relaxed);
        }
        let rx = &mut *rx;
        RECEIVING.with(|r| r.set(self as *const Engine as usize));
        with_tx(|tx| {
            let poller = busy && !self.handoff.is_zero();
            set_receiving(self.app_receiving(poller));
            // While the lanes carry traffic (some came in the last LANE_POLLS polls), the
            // socket (a system call each time, nearly always empty then) is read every
            // SOCKET_EVERY polls only; otherwise every time. (What a peer puts on a lane
            // before a MAD is taken before the MAD.)
            if rx
                .rx
                .receive_lanes(&self.wire, &self.share, self, tx, false)
                > 0
            {
                if rx.lane_polls == 0 {
                    self.lanes_hot.store(true, Ordering::Relaxed);
                }
                rx.lane_polls = LANE_POLLS;
            }
            if rx.lane_polls == 0 || rx.socket_skipped >= SOCKET_EVERY {
                rx.socket_skipped = 0;
                rx.rx
                    .receive_rounds(&self.wire, &self.share, self, tx, 4, true);
            } else {
                rx.socket_skipped += 1;
            }
            if rx.lane_polls == 1 {
                self.lanes_hot.store(false, Ordering::Relaxed);
            }
            rx.lane_polls = rx.lane_polls.saturating_sub(1);
            if self.mcast.any_sockets() || rx.mcast.holds_sockets() {
                self.mcast
                    .poll(&mut rx.rx, &mut rx.mcast, &self.wire, self, tx, 4);
            }
            set_receiving(Receiving::Other);
            // (Sent already, unless a path left something: the batch may be a temporary one.)
            self.send(tx);
        });
        RECEIVING.with(|r| r.set(0));
    }
}

impl Engine {
    /// See [`super::Provider::take_pair`].
    pub(super) fn take_pair(
        &self,
        p: &super::PairRx,
        qp: Option<std::sync::Arc<dyn super::QpPort>>,
        busy: bool,
    ) -> usize {
        if self.wire.lanes.paused() {
            return 0;
        }
        // This thread polls: the progress thread leaves the lanes to it (as after
        // `poll_progress`, which a poll that finds records here does not reach).
        let hold = self.note_app_poll(busy).is_some();
        super::tx::with_tx(|tx| {
            set_receiving(self.app_receiving(hold));
            let n = super::rx::take_pair(&self.wire, self, p, qp, false, tx);
            set_receiving(Receiving::Other);
            self.send(tx);
            n
        })
    }
}

impl Engine {
    /// An application thread polls a CQ (`busy`: not armed for an event): while the hand-off
    /// is on, the progress thread is told (it leaves the lanes and the socket to such
    /// threads). Returns the polls counted before this one, `None` when not counted (the CQ
    /// is armed, or the hand-off is off).
    #[inline]
    fn note_app_poll(&self, busy: bool) -> Option<u64> {
        if !busy || self.handoff.is_zero() {
            return None;
        }
        let polls = self.app_polls.fetch_add(1, Ordering::Relaxed);
        if self.app_asleep.load(Ordering::Relaxed) {
            self.app_asleep.store(false, Ordering::Relaxed);
        }
        Some(polls)
    }
}

/// How long [`Engine::drain_receive`] waits for the thread receiving for the device to
/// finish its round.
const DRAIN_WAIT: Duration = Duration::from_millis(5);

impl Engine {
    /// Receives, on the calling thread, what waits for the device now on its same-host lanes
    /// and its socket (as a polling application thread does), after the thread receiving for
    /// it, if any, has finished its round (waiting at most [`DRAIN_WAIT`]); what that produces
    /// (ACKs) is sent at once. See [`super::port::Provider::drain_receive`].
    pub(super) fn drain_receive(&self) {
        // Called by the thread receiving for this device (a CM message taken here): what came
        // before the message is delivered already.
        if RECEIVING.with(std::cell::Cell::get) == self as *const Engine as usize
            || self.progress_thread.get() == Some(&std::thread::current().id())
        {
            return;
        }
        let deadline = Instant::now() + DRAIN_WAIT;
        let mut rx = loop {
            match self.rx.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    std::thread::yield_now();
                }
            }
        };
        let rx = &mut *rx;
        with_tx(|tx| {
            // (Everything, a new lane's first records too: the caller is about to end a
            // connection.)
            rx.rx.receive_lanes(&self.wire, &self.share, self, tx, true);
            rx.rx
                .receive_rounds(&self.wire, &self.share, self, tx, 4, false);
            self.send(tx);
        });
    }
}

impl Engine {
    /// An application thread is about to sleep rather than poll (it armed a CQ): the
    /// progress thread takes the socket back now instead of after the hand-off period.
    pub(super) fn app_sleeps(&self) {
        // (What it posted and this device holds for a batch goes before it sleeps.)
        self.flush_held_sends();
        // With `standing_down` (stored before the progress thread reads `app_asleep`): one of
        // the two threads sees the other's store.
        self.app_asleep.store(true, Ordering::SeqCst);
        if self.standing_down.load(Ordering::SeqCst) {
            self.wire.wake.signal();
        }
    }

    /// Whether application threads polled (busy) since the progress thread last looked
    /// (`seen`), and then until when it leaves the socket to them. Sets `standing_down` when
    /// so.
    pub(super) fn handoff_until(&self, now: Instant, seen: &mut u64) -> Option<Instant> {
        if self.handoff.is_zero() {
            return None;
        }
        let polls = self.app_polls.load(Ordering::Relaxed);
        if polls == *seen {
            return None;
        }
        *seen = polls;
        if self.app_yielded.load(Ordering::Relaxed) {
            // The polls found the receive side taken and gave the core away: this thread
            // receives on (see `BusyReceiver`).
            return None;
        }
        // (Stored before `app_asleep` and `spinner_at` are read, which their writers store
        // before they read this: one of the two threads sees the other's store, and a
        // writer that sees it wakes this thread.)
        self.standing_down.store(true, Ordering::SeqCst);
        if self.app_asleep.load(Ordering::SeqCst) {
            self.standing_down.store(false, Ordering::SeqCst);
            return None;
        }
        let spinner = self.spinner_at.load(Ordering::SeqCst);
        if spinner != 0 {
            if polls.wrapping_add(1) == spinner {
                // A program may spin on memory (see `Engine::watch_for_spinner`) and has not
                // polled since: this thread watches the device for it (and, while no poll
                // comes, goes on watching: see above).
                self.standing_down.store(false, Ordering::SeqCst);
                return None;
            }
            // It polled again: the watch is over.
            let _ =
                self.spinner_at
                    .compare_exchange(spinner, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
        Some(now + self.handoff)
    }
}

pub(super) fn progress(weak: Weak<Engine>) {
    if let Some(e) = weak.upgrade() {
        let _ = e.progress_thread.set(std::thread::current().id());
    }
    let mut tx = TxBatch::new();
    let mut last_rx = Instant::now();
    let mut next_probe = Instant::now() + PROBE_INTERVAL;
    // The groups polled (the receive state's snapshot, which keeps their sockets open) and
    // its generation.
    let mut groups = Arc::new(mcast::View::default());
    let mut groups_gen = 0;
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(3);
    // The application threads' busy polls counted when last looked at.
    let mut seen_polls = 0u64;
    // The sends held for a batch counted when last looked at.
    let mut seen_notes = 0u64;
    // The QPs whose deadline passed (reused).
    let mut due: Vec<u32> = Vec::new();
    // The bells of the same-host lanes (kept open while polled) and their generation.
    let mut bells: Vec<lanes::Bell> = Vec::new();
    let mut bells_gen = u64::MAX;
    // Whether this thread polls the lanes rather than sleeping on their bells.
    let mut spin = PollWindow::new(Instant::now());
    // Whether this thread polls the socket rather than sleeping on it: after a lone packet
    // (a request it answers for a program that does not poll, an RDMA READ or atomic, or a
    // message for a program asleep on its completion channel) another is likely within a
    // round trip, and polling costs less than a wake-up. Judged as the lanes' windows are;
    // a stream (several datagrams at a look) opens none: the thread has work anyway, and
    // where busy threads outnumber cores its polling took the core from the programs
    // (`ib_send_bw -s 8` over the wire on 2 cores, a fixed 50 µs: 1.17 -> 0.35 M msg/s).
    let mut sock_spin = PollWindow::new(Instant::now());
    // When application threads were last seen polling (busy), and the ACKs this thread holds
    // for them.
    let mut polled_at: Option<Instant> = None;
    let mut acks = AckHold::new();
    loop {
        let Some(engine) = weak.upgrade() else {
            return;
        };
        // Sleep until a packet, a wake-up or the next deadline (while application threads
        // poll the device, they run the timers: until the end of the hand-off then).
        let now = Instant::now();
        let mut next = now + Duration::from_millis(200);
        let handoff = engine.handoff_until(now, &mut seen_polls);
        if handoff.is_some() {
            spin.stand_down();
            sock_spin.stand_down();
            polled_at = Some(now);
        }
        if handoff.is_none() {
            // About to sleep (before the deadline is read: a timer set meanwhile either is
            // seen here or wakes this thread), until the earliest deadline, which the timer
            // run at the end of each round keeps exact (no scan of the timers here).
            engine.sleep_until.store(u64::MAX, Ordering::SeqCst);
            if let Some(d) = engine.next_deadline() {
                next = next.min(d);
            }
        }
        if let Some(d) = engine.wire.release_delayed(now) {
            next = next.min(d);
        }
        // Sends held for a batch (`Engine::note_held_send`) since the last look, or still
        // held: this thread sends them within the hand-off period.
        let notes = engine.held_notes.load(Ordering::Relaxed);
        let cap = notes != seen_notes;
        seen_notes = notes;
        engine.send_cap.store(cap, Ordering::SeqCst);
        if cap || engine.any_held_sends.load(Ordering::SeqCst) {
            next = next.min(now + engine.handoff);
        }
        engine
            .sleep_until
            .store(engine.nanos(next), Ordering::SeqCst);
        if let Some(h) = handoff {
            next = next.min(h);
        }
        // ACKs held for the program's answer are looked at again by the end of their hold,
        // and this thread sleeps meanwhile (polling, it would take the core the program
        // answers on, and look at them too soon).
        let holding = acks.wake_by();
        if let Some(u) = holding {
            next = next.min(u);
        }
        let timeout = next.saturating_duration_since(now);
        let gen = engine.mcast.generation();
        if gen != groups_gen {
            // Refreshing the receive state's snapshot too lets a closed group's socket go.
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            groups = engine.mcast.refresh(&mut rx.mcast);
            groups_gen = gen;
        }
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.clear();
        // (poll(2) ignores a negative descriptor: the socket is left to application threads,
        // unless they are busy with the lanes and read it only now and then.)
        fds.push(pollfd(
            if handoff.is_some() && !engine.lanes_hot.load(Ordering::Relaxed) {
                -1
            } else {
                engine.wire.sock.raw()
            },
        ));
        fds.push(pollfd(std::os::fd::AsRawFd::as_raw_fd(&engine.wire.wake)));
        // What other processes sharing the device forward to this one: always watched.
        fds.push(pollfd(engine.share.raw()));
        fds.extend(groups.groups.iter().map(|g| pollfd(g.sock.raw())));
        let lanes_at = fds.len();
        let lanes = &engine.wire.lanes;
        if lanes.generation() != bells_gen {
            bells_gen = lanes.generation();
            lanes.bells(&mut bells);
        }
        fds.extend(bells.iter().map(|b| libc::pollfd {
            fd: b.fd.as_raw_fd(),
            // An outbound lane's bell is watched for its hang-up only.
            events: if b.inbound { libc::POLLIN } else { 0 },
            revents: 0,
        }));
        let mut timeout = timeout;
        if holding.is_none()
            && handoff.is_none()
            && !engine.busy_poll.is_zero()
            && now.duration_since(last_rx) < engine.busy_poll
        {
            timeout = Duration::ZERO;
        }
        if !timeout.is_zero()
            && holding.is_none()
            && handoff.is_none()
            && !engine.socket_spin.is_zero()
            && sock_spin.polls(now)
        {
            timeout = Duration::ZERO;
        }
        // Asleep, the lanes' producers ring the bells (while application threads poll, they
        // take what the lanes bring).
        if !timeout.is_zero() && handoff.is_none() {
            if holding.is_none() && spin.polls(now) {
                // Lane traffic a moment ago: more is coming; polling the rings costs less
                // than a wake-up through the bell.
                timeout = Duration::ZERO;
                std::hint::spin_loop();
            } else if !lanes.arm() || lanes.generation() != bells_gen {
                // (A lane that came since the poll set was made would ring a bell this
                // sleep does not watch: go round once more.)
                timeout = Duration::ZERO;
            }
        }
        if !timeout.is_zero() {
            // About to sleep: captured packets reach the file now, not at the next traffic.
            crate::provider::capture::flush_idle();
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` holds fds.len() valid pollfds, whose sockets `groups` keeps open; `ts`
        // is a valid timespec; no signal mask is passed.
        unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if fds[1].revents & libc::POLLIN != 0 {
            while engine.wire.wake.try_wait() {}
        }
        engine.sleep_until.store(0, Ordering::Release);
        engine.send_wake_asked.store(false, Ordering::SeqCst);
        engine.standing_down.store(false, Ordering::SeqCst);
        // ACKs an application thread held and has not sent since (it stopped polling), ACKs
        // this thread held whose time is up (those the program's answer did not take), and
        // sends held for a batch (see `Engine::note_held_send`).
        let woke = Instant::now();
        if acks.waits(woke) {
            // (Its own hold goes on; what the program holds is looked at with it.)
        } else if acks.holds()
            || engine.handoff.is_zero()
            || engine.app_asleep.load(Ordering::Relaxed)
        {
            let unanswered = engine.flush_held_acks();
            acks.released(unanswered);
        } else if engine.holds_acks() {
            // (Compared with the polls that found nothing, which send held ACKs themselves:
            // a program whose polls all take something, QP pair ring records one after
            // another, would otherwise keep them held as long as that goes on. With
            // `SOFTRDMA_ACK_HOLD_US=0` the program holds only a lane's ACKs, left as long as
            // by default.)
            let polls = engine.app_empty_polls.load(Ordering::Relaxed);
            let hold = if engine.ack_hold.is_zero() {
                super::engine::ACK_HOLD
            } else {
                engine.ack_hold
            };
            if acks.program_held(woke, polls, hold) == ProgramHeld::Send {
                engine.flush_held_acks();
            }
        } else {
            acks.none_held();
        }
        engine.flush_held_sends();
        // This round's takes hold the ACKs of what they take for a program that polled
        // lately (see `AckHold`).
        let poller = !engine.handoff.is_zero()
            && !engine.app_asleep.load(Ordering::Relaxed)
            && polled_at.is_some_and(|t| woke.duration_since(t) <= 2 * engine.handoff);
        let hold = acks.tries(poller && !engine.ack_hold.is_zero());
        set_receiving(if hold {
            Receiving::PollerHolding
        } else if poller {
            Receiving::Poller
        } else {
            Receiving::Other
        });
        let mut took = 0;
        // Receive everything waiting, in batches (unless an application thread is at it).
        if fds[0].revents & libc::POLLERR != 0 {
            // ICMP errors wait in the socket's error queue (IP_RECVERR); it stays POLLERR
            // until they are read.
            engine.icmp_errors(&mut tx);
        }
        if fds[0].revents & libc::POLLIN != 0 {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            let e = &*engine;
            let n = rx
                .rx
                .receive_rounds(&e.wire, &e.share, e, &mut tx, 64, false);
            took += n;
            if n > 0 {
                last_rx = Instant::now();
                if !e.socket_spin.is_zero() {
                    sock_spin.took_with(n, last_rx, e.socket_spin, false);
                }
            }
        }
        if fds[2].revents & libc::POLLIN != 0 {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            let e = &*engine;
            let n = rx.rx.receive_forwarded(&e.wire, &e.share, e, &mut tx);
            took += n;
            if n > 0 {
                last_rx = Instant::now();
            }
        }
        lanes.disarm();
        let mut hung = false;
        for f in &fds[lanes_at..] {
            if f.revents & libc::POLLIN != 0 {
                lanes::drain_bell(f.fd);
            }
            hung |= f.revents & (libc::POLLHUP | libc::POLLERR) != 0;
        }
        if (handoff.is_none() || hung) && lanes.pending() {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            let e = &*engine;
            // (A producer that hung up leaves no second look: take all it left.)
            let n = rx.rx.receive_lanes(&e.wire, &e.share, e, &mut tx, hung);
            took += n;
            if n > 0 {
                spin.took(n, Instant::now(), engine.lane_spin);
            }
        }
        if hung {
            // What a gone producer left is taken above; then its lane goes.
            for (f, b) in fds[lanes_at..].iter().zip(&bells) {
                if f.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    lanes.hung_up(f.fd, b.inbound);
                }
            }
        }
        if fds[3..lanes_at]
            .iter()
            .any(|fd| fd.revents & libc::POLLIN != 0)
        {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            let rx = &mut *rx;
            let e = &*engine;
            if e.mcast
                .poll(&mut rx.rx, &mut rx.mcast, &e.wire, e, &mut tx, 64)
                > 0
            {
                last_rx = Instant::now();
            }
        }
        set_receiving(Receiving::Other);
        if hold && took > 0 && engine.holds_acks() {
            acks.held(Instant::now(), engine.ack_hold);
        }
        // Liveness probes to connected peers (a dead peer's kernel answers ICMP).
        let now = Instant::now();
        if now >= next_probe {
            next_probe = now + PROBE_INTERVAL;
            engine.probe_peers();
        }
        // Timers.
        engine.run_due_timers(now, &mut tx, &mut due);
        engine.send(&mut tx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poller_yields_only_after_finding_the_receive_side_taken_many_times_in_a_row() {
        let mut b = BusyReceiver::default();
        for _ in 1..BusyReceiver::YIELD_AFTER {
            assert!(!b.taken());
        }
        // From the YIELD_AFTER-th poll in a row on, each yields.
        assert!(b.taken());
        assert!(b.taken());
        // A poll that takes the receive side starts over: a ping-pong's occasional
        // collision with the progress thread never yields.
        b.took();
        for _ in 0..3 {
            for _ in 1..BusyReceiver::YIELD_AFTER {
                assert!(!b.taken());
            }
            b.took();
        }
        assert_eq!(b, BusyReceiver::default());
    }

    #[test]
    fn the_progress_thread_polls_the_lanes_while_it_pays() {
        let us = Duration::from_micros;
        let spin = us(50);
        let t0 = Instant::now();
        let mut l = PollWindow::new(t0);
        // A lone packet opens a window at first; the next within it: it paid, go on.
        l.took(1, t0, spin);
        assert!(l.polls(t0 + us(10)));
        l.took(1, t0 + us(20), spin);
        assert!(l.polls(t0 + us(60)));
        // The window ends with no packet: it did not pay; the next lone packet opens none.
        assert!(!l.polls(t0 + us(71)));
        l.took(1, t0 + us(200), spin);
        assert!(!l.polls(t0 + us(201)));
        // ... until the PROBE_EVERY-th, which tries again.
        let mut t = t0 + us(200);
        for _ in 1..PollWindow::PROBE_EVERY - 1 {
            t += us(100);
            l.took(1, t, spin);
            assert!(!l.polls(t + us(1)));
        }
        t += us(100);
        l.took(1, t, spin);
        assert!(l.polls(t + us(1)));
        // A packet late for that window (the thread was not polling, say it slept): did not
        // pay either.
        t += us(80);
        l.took(1, t, spin);
        assert!(!l.polls(t + us(1)));
        // A run of packets opens a window whatever the last one did.
        t += us(500);
        l.took(5, t, spin);
        assert!(l.polls(t + us(49)));
        // A packet within it: it paid; lone packets open windows again.
        l.took(1, t + us(30), spin);
        assert!(l.polls(t + us(79)));
        // While application threads poll, an open window is not judged.
        l.stand_down();
        assert!(!l.polls(t + us(200)));
        l.took(1, t + us(300), spin);
        assert!(l.polls(t + us(301)), "the last judged window paid");
    }

    #[test]
    fn the_progress_thread_holds_acks_for_a_program_that_answers() {
        let us = Duration::from_micros;
        let hold = us(20);
        let t0 = Instant::now();
        let mut a = AckHold::new();
        // A program that never polled: nothing held.
        assert!(!a.tries(false));
        // One that polls: the first take holds, and the thread waits for the answer.
        assert!(a.tries(true));
        a.held(t0, hold);
        assert!(a.waits(t0 + us(5)));
        // A second take before the end keeps the first end.
        a.held(t0 + us(10), hold);
        assert!(!a.waits(t0 + us(20)));
        // The answer took the ACK: it paid, the next take holds again.
        a.released(0);
        assert!(!a.waits(t0 + us(21)));
        assert!(a.tries(true));
        a.held(t0 + us(100), hold);
        // This time the thread had to send it: the next takes hold nothing ...
        a.released(1);
        for _ in 1..AckHold::PROBE_EVERY {
            assert!(!a.tries(true));
        }
        // ... until the PROBE_EVERY-th, which tries again; paid, holding goes on.
        assert!(a.tries(true));
        a.held(t0 + us(500), hold);
        a.released(0);
        assert!(a.tries(true));
        // A release with nothing held judges nothing.
        a.released(3);
        assert!(a.tries(true));
        assert_eq!(a.wake_by(), None);
    }

    /// The engine of a device of this test's own (kept open by the context returned with it),
    /// its progress thread started.
    fn started_engine() -> (crate::Context, Arc<Engine>) {
        let ctx = crate::Device::from_addr(crate::testing::unique_loopback_addr().into())
            .unwrap()
            .open()
            .unwrap();
        let dev = ctx.inner.shared.device.clone();
        let e = Engine::get_or_start(dev.addr(), dev.ifindex()).unwrap();
        (ctx, e)
    }

    #[test]
    fn a_program_that_may_spin_on_memory_keeps_the_progress_thread_watching_until_it_polls() {
        let (_ctx, e) = started_engine();
        let now = Instant::now();
        let mut seen = e.app_polls.load(Ordering::Relaxed);
        // A program polls: the progress thread leaves the device to it.
        e.note_app_poll(true);
        assert!(e.handoff_until(now, &mut seen).is_some());
        // The poll took the completion of a lone RDMA WRITE acknowledged before any answer:
        // the progress thread watches, look after look, while the program does not poll.
        e.watch_for_spinner();
        assert!(e.handoff_until(now, &mut seen).is_none());
        assert!(e.handoff_until(now, &mut seen).is_none());
        // It polls again: the watch ends, and the device is left to its polls.
        e.note_app_poll(true);
        assert!(e.handoff_until(now, &mut seen).is_some());
        assert_eq!(e.spinner_at.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn polls_that_yield_keep_the_progress_thread_receiving_until_one_takes_the_receive_side() {
        let (_ctx, e) = started_engine();
        let now = Instant::now();
        let mut seen = e.app_polls.load(Ordering::Relaxed);
        {
            // Another thread holds the receive side (as the progress thread does while it
            // sends a stream's window): polls find it taken, and from the 256th in a row on
            // they yield.
            let _held = e.rx.lock().unwrap();
            for _ in 1..BusyReceiver::YIELD_AFTER {
                e.poll_progress(true, true);
            }
            assert!(!e.app_yielded.load(Ordering::Relaxed));
            e.poll_progress(true, true);
            assert!(e.app_yielded.load(Ordering::Relaxed));
            // The program polled, but its thread gave its core away: the progress thread does
            // not stand down for it.
            assert!(e.handoff_until(now, &mut seen).is_none());
        }
        // A poll that takes the receive side (the progress thread may hold it a moment: poll
        // until one does, a bounded number of times, not a time) ends that, and the device is
        // left to the program's polls again.
        for _ in 0..10_000_000 {
            if !e.app_yielded.load(Ordering::Relaxed) {
                break;
            }
            e.poll_progress(true, true);
        }
        assert!(
            !e.app_yielded.load(Ordering::Relaxed),
            "no poll took the receive side"
        );
        assert!(e.handoff_until(now, &mut seen).is_some());
    }

    #[test]
    fn only_a_poll_that_found_nothing_sends_the_acks_held_for_the_programs_answer() {
        let (_ctx, e) = started_engine();
        // (The progress thread also sends held ACKs, at its second look 20 µs after a first
        // one, should this thread not poll empty in between: it sleeps up to 200 ms at a
        // time, so a try it spoils is rare, and five in a row do not happen.)
        let mut kept = false;
        for _ in 0..5 {
            // (A QP number no QP of this device has: releasing it finds nothing to send.)
            e.note_held_ack(0xfe_dcba);
            assert!(e.holds_acks());
            // A poll that took QP pair ring records and looks at the device as well: the
            // program may be about to answer, the ACK stays held.
            e.poll_progress(true, false);
            kept = e.holds_acks();
            // A poll that found nothing: held ACKs go.
            e.poll_progress(true, true);
            assert!(!e.holds_acks());
            if kept {
                break;
            }
        }
        assert!(kept, "a poll that took records sent the held ACK");
    }

    #[test]
    fn with_acks_at_once_a_poll_holds_a_lanes_acks_only_and_still_counts_as_a_poller() {
        // (receiving for, ACKs held over the wire, over a lane, a polling program's thread)
        for (r, wire, lane, poller) in [
            (Receiving::Other, false, false, false),
            (Receiving::Poller, false, false, true),
            // SOFTRDMA_ACK_HOLD_US=0: a lane's WRITE-and-spin still gets its ACK behind the
            // answer, and a lone WRITE's completion still starts the watch for a spinner.
            (Receiving::PollerLanes, false, true, true),
            (Receiving::PollerHolding, true, true, true),
        ] {
            set_receiving(r);
            assert_eq!(holding_acks(false), wire, "{r:?} over the wire");
            assert_eq!(holding_acks(true), lane, "{r:?} over a lane");
            assert_eq!(receiving_for_poller(), poller, "{r:?}");
        }
        set_receiving(Receiving::Other);
    }

    #[test]
    fn acks_the_program_holds_go_only_once_it_stopped_polling() {
        let us = Duration::from_micros;
        let hold = us(20);
        let t0 = Instant::now();
        let mut a = AckHold::new();
        // A look finds ACKs the program's poll held: they stay, and the thread looks again.
        assert_eq!(a.program_held(t0, 100, hold), ProgramHeld::Leave);
        assert_eq!(a.wake_by(), Some(t0 + hold));
        // Woken early: still left.
        assert_eq!(a.program_held(t0 + us(5), 100, hold), ProgramHeld::Leave);
        // The program polled since: it sends them itself; the first look is forgotten.
        assert_eq!(a.program_held(t0 + us(20), 130, hold), ProgramHeld::Leave);
        assert_eq!(a.wake_by(), None);
        // Next look: left again; then, no poll since and the time up: sent.
        assert_eq!(a.program_held(t0 + us(500), 200, hold), ProgramHeld::Leave);
        assert_eq!(a.program_held(t0 + us(521), 200, hold), ProgramHeld::Send);
        assert_eq!(a.wake_by(), None);
        // A look that finds nothing held forgets a first look.
        assert_eq!(a.program_held(t0 + us(600), 300, hold), ProgramHeld::Leave);
        a.none_held();
        assert_eq!(a.wake_by(), None);
        // With a hold of the thread's own, the earlier of the two times.
        assert_eq!(a.program_held(t0 + us(700), 300, hold), ProgramHeld::Leave);
        a.held(t0 + us(710), hold);
        assert_eq!(a.wake_by(), Some(t0 + us(720)));
        assert!(a.holds() && a.waits(t0 + us(715)));
        // Its flush sends both.
        a.released(0);
        assert_eq!(a.wake_by(), None);
    }

    #[test]
    fn the_progress_thread_polls_its_socket_after_lone_packets_only() {
        let us = Duration::from_micros;
        let spin = us(50);
        let t0 = Instant::now();
        let mut s = PollWindow::new(t0);
        // A lone packet (a READ request, say) opens a window; the next within it paid.
        s.took_with(1, t0, spin, false);
        assert!(s.polls(t0 + us(10)));
        s.took_with(1, t0 + us(12), spin, false);
        assert!(s.polls(t0 + us(50)));
        // A stream (several datagrams at a look) closes it and opens none.
        s.took_with(8, t0 + us(55), spin, false);
        assert!(!s.polls(t0 + us(56)));
        // It was not judged a failure: the next lone packet opens a window again.
        s.took_with(1, t0 + us(300), spin, false);
        assert!(s.polls(t0 + us(301)));
        // A window that ends without a packet did not pay: lone packets then open none.
        assert!(!s.polls(t0 + us(360)));
        s.took_with(1, t0 + us(500), spin, false);
        assert!(!s.polls(t0 + us(501)));
    }
}
