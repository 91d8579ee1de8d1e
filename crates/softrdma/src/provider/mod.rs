//! The device engine: the UDP socket of a device, its progress thread, and the glue between
//! the sans-IO transport of each QP ([`softrdma_proto::transport::Qp`]) and the verbs objects.
//!
//! # Progress
//! Sends are transmitted by the thread that posts them: `post_send` runs the transport and
//! hands the packets to `sendmmsg` before it returns, with no thread hop. Everything that
//! arrives — ACKs, requests from peers, one-sided RDMA WRITE/READ/atomics that the target
//! program never polls for — and every timer is handled by one progress thread per device,
//! which waits in `poll(2)` on the socket and a wake-up eventfd, receives in batches with
//! `recvmmsg`, and answers in batches with `sendmmsg`. A device with UD QPs attached to
//! multicast groups also has one socket per group, which the progress thread polls too (see
//! the `mcast` submodule); without groups that path costs one atomic load.
//!
//! An application thread that polls a CQ and finds it empty receives what is waiting on the
//! device socket itself ([`Engine::poll_progress`]), so a busy-polling program gets its
//! completions with no thread hop. While such polls of unarmed CQs go on, the progress
//! thread leaves the socket to them: it stops watching the socket for [`POLL_HANDOFF`] at a
//! time, as long as there were polls in the last period, and wakes only for timers and
//! explicit wake-ups. Otherwise both threads would be woken by every packet and, on a machine
//! with few cores, the progress thread would preempt the very pollers it races (that doubled
//! the one-way latency of a ping-pong). Arming a CQ for an event
//! ([`crate::Cq::req_notify_cq`]), which a program does before it sleeps on a completion
//! channel, gives the socket back at once, and polls of an armed CQ (the last look before
//! sleeping) do not count; a program that stops polling without arming a CQ gets it back
//! within two periods.
//!
//! # ICRC
//! Every packet sent carries the ICRC computed over the IP and UDP headers the kernel will
//! put in front of it (IPv4: identification 0 and DF, which `IP_PMTUDISC_DO` guarantees).
//! Every packet received is verified against the headers it must have had: for IPv6 that is
//! exact; for IPv4 the Identification field cannot be read from a UDP socket, so the check
//! assumes 0 — which is what every softrdma peer, and any sender using the same socket
//! recipe, sends, and then the full 32-bit check applies. Other stacks (the Linux kernel's
//! rxe, for one) give their packets varying identifications; for an IPv4 packet that fails
//! the check with identification 0, the receiver solves for the identification that makes
//! the ICRC match ([`softrdma_wire::icrc::ident`]) and accepts the packet if there is one,
//! counting it in `icrc_ident_solved`. Such packets get a 16-bit check: a corrupted packet
//! passes it with probability about 2^-16 (the wire crate documents the details). So a sender
//! whose first packets all verify with identification 0 (64 of them, none solved: a softrdma
//! peer) gets no solving from then on, only the full check: a corrupted packet of a softrdma
//! peer is never accepted. Packets that fail are counted (`icrc_errors`) and dropped.

use crate::error::Result;
use crate::gid::Gid;
use crate::provider::fd::EventFd;
use crate::provider::sock::{UdpSock, ROCE_PORT};
use faults::Faults;
use rx::RxState;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

pub(crate) mod capture;
mod counters;
mod faults;
pub(crate) mod fd;
pub(crate) mod gsi;
mod mcast;
mod progress;
mod rx;
pub(crate) mod share;
pub(crate) mod sock;
mod tx;

pub(crate) use counters::Counters;
pub use counters::{DeviceCounters, PROBE_INTERVAL};
pub use faults::FaultConfig;
pub(crate) use mcast::MULTICAST_QPN;
pub(crate) use progress::holding_acks;
pub(crate) use rx::grh_for;
pub(crate) use tx::{with_tx, TxBatch};

/// Room for one packet: the largest transport packet (4096-byte MTU + headers + ICRC) with
/// headroom.
pub(crate) const PKT_BUF: usize = 4096 + 128;
const BATCH: usize = 64;

/// How long after an application thread last polled an empty CQ of the device the progress
/// thread leaves the device socket to application threads (see the module notes), unless
/// `SOFTRDMA_POLL_HANDOFF_US` says otherwise (0: never; the progress thread always watches).
pub(crate) const POLL_HANDOFF: Duration = Duration::from_micros(500);

/// The engine of one device.
pub(crate) struct Engine {
    sock: UdpSock,
    /// This process's membership of the device, which other processes may share.
    share: share::Share,
    pub(crate) local: SocketAddr,
    qps: RwLock<HashMap<u32, Weak<dyn QpPort>>>,
    timers: Mutex<HashMap<u32, Instant>>,
    wake: EventFd,
    epoch: Instant,
    /// When the progress thread will wake up on its own (nanoseconds since `epoch`).
    sleep_until: AtomicU64,
    pub(crate) counters: Counters,
    faults_on: AtomicBool,
    faults: Mutex<Option<Faults>>,
    delayed: Mutex<Vec<(Instant, Vec<u8>, SocketAddr)>>,
    /// How long the progress thread keeps polling the socket without sleeping after the
    /// last packet (`SOFTRDMA_BUSY_POLL_US`; 0 = always sleep in poll(2)).
    busy_poll: Duration,
    /// The receive buffers, held by the thread that is receiving.
    rx: Mutex<RxState>,
    /// How many times application threads polled an empty, unarmed CQ of this device (the
    /// progress thread compares it with what it saw last time).
    app_polls: AtomicU64,
    /// A CQ of this device was armed for an event after the last such poll: its program is
    /// going to sleep, so the progress thread must watch the socket.
    app_asleep: AtomicBool,
    /// The progress thread is not watching the socket (an application thread polls it).
    standing_down: AtomicBool,
    /// [`POLL_HANDOFF`] or `SOFTRDMA_POLL_HANDOFF_US`.
    handoff: Duration,
    /// QPs whose transport holds a positive ACK back (see [`holding_acks`]), and whether the list
    /// may be non-empty.
    held_acks: Mutex<Vec<u32>>,
    any_held_acks: AtomicBool,
    /// QP 1: the connection manager's MADs.
    pub(crate) gsi: Mutex<crate::provider::gsi::Gsi>,
    /// This engine, for the connection-manager layer's ids.
    me: std::sync::OnceLock<Weak<Engine>>,
    /// Interface index of the device address (IPv6 multicast names interfaces by index).
    ifindex: u32,
    /// The multicast groups the device has joined, their sockets and attached QPs.
    mcast: Mutex<mcast::Table>,
    /// Bumped (under the `mcast` lock) whenever the set of groups or members changes, so that
    /// receivers refresh their snapshot without taking the lock otherwise.
    mcast_gen: AtomicU64,
    /// Number of group sockets open (0: the multicast receive path costs one load).
    mcast_socks: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// A QP as the provider sees it. The verbs layer registers each QP that can receive
/// ([`Engine::register`]) as this trait, and the provider hands it packets, timeouts and held
/// ACKs through it: the provider never names the verbs objects.
pub(crate) trait QpPort: Send + Sync {
    /// Hands a run of good packets, all from `src` to `dst` and for this QP, to its transport
    /// (under the QP's lock), drives the QP and raises the resulting events; says what
    /// became of them.
    #[allow(clippy::too_many_arguments)]
    fn receive(
        self: Arc<Self>,
        engine: &Engine,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Delivery;

    /// The QP's deadline has passed: runs its transport's timers and drives it.
    fn on_timeout(self: Arc<Self>, engine: &Engine, now: Instant, tx: &mut TxBatch);

    /// Sends the positive ACK the QP's transport holds back, if any.
    fn release_held_ack(self: Arc<Self>);
}

/// How a packet reached the device.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via {
    /// On the device socket: an RC or UC QP takes it only from its peer.
    Unicast,
    /// On the socket of this multicast group: the QP takes it only while attached.
    Group(Gid),
}

/// What became of packets handed to a QP ([`QpPort::receive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The transport has them.
    Delivered,
    /// The QP cannot take them: no transport (RESET), or not attached to the group.
    NotReady,
    /// An RC or UC QP, and they did not come from its peer.
    WrongSource,
}

/// The engines of this process, one per address, kept for the life of the process: a device's
/// UDP socket and progress thread are started on first use and stay, as a NIC stays, so that
/// closing and reopening a device never races with its own socket still being closed.
static ENGINES: OnceLock<Mutex<HashMap<IpAddr, Arc<Engine>>>> = OnceLock::new();

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

/// Whether `addr` is the socket of one of this process's device engines.
pub(crate) fn is_local_engine(addr: SocketAddr) -> bool {
    ENGINES.get().is_some_and(|m| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr.ip())
            .is_some_and(|e| e.local == addr)
    })
}

impl Engine {
    /// The engine of the device at `addr` (interface `ifindex`), started on first use; a
    /// new engine is announced to the connection-manager layer (see [`gsi::CmHook`]).
    ///
    /// Fails with `EADDRINUSE` when a socket that does not share it (another user's process,
    /// another program, a kernel RoCE device) holds UDP port 4791 on the address; other
    /// softrdma processes of the same user share the device (see [`share`]).
    pub(crate) fn get_or_start(addr: IpAddr, ifindex: u32) -> Result<Arc<Engine>> {
        let map = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get(&addr) {
            return Ok(e.clone());
        }
        let started = Engine::start(addr, ifindex)?;
        map.insert(addr, started.clone());
        drop(map);
        // Steerable before anything is created on it: until discovery has put this process
        // in the group's program, packets for it are spread by the kernel's hash, and one
        // that lands on a process about to exit is lost with that process's socket.
        started.discover_now();
        gsi::engine_started(&started);
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

    pub(crate) fn start_on_port(addr: IpAddr, port: u16, ifindex: u32) -> Result<Arc<Engine>> {
        crate::log::init_from_env();
        // The slot first, the socket second: a process holds a socket in the group only
        // while it holds a slot, so discovery's count of slots is the group's size.
        let share = share::Share::join(addr)?;
        let slot = share.slot();
        let sock = UdpSock::bind_shared(addr, port)?;
        let local = sock.local_addr()?;
        tracing::debug!(%local, "device engine started");
        // Multicast sends leave from the device socket; a device whose interface cannot do
        // multicast still does unicast (its multicast sends are counted in tx_errors).
        if let Err(err) = sock.set_multicast_tx(addr, ifindex) {
            tracing::debug!(%addr, ifindex, error = %err, "no multicast sending options");
        }
        let e = Arc::new(Engine {
            sock,
            share,
            local,
            qps: RwLock::new(HashMap::new()),
            timers: Mutex::new(HashMap::new()),
            wake: EventFd::new()?,
            epoch: Instant::now(),
            sleep_until: AtomicU64::new(0),
            counters: Counters::default(),
            faults_on: AtomicBool::new(false),
            faults: Mutex::new(None),
            delayed: Mutex::new(Vec::new()),
            rx: Mutex::new(RxState::new()),
            app_polls: AtomicU64::new(0),
            app_asleep: AtomicBool::new(false),
            standing_down: AtomicBool::new(false),
            held_acks: Mutex::new(Vec::new()),
            any_held_acks: AtomicBool::new(false),
            handoff: std::env::var("SOFTRDMA_POLL_HANDOFF_US")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map_or(POLL_HANDOFF, Duration::from_micros),
            me: std::sync::OnceLock::new(),
            ifindex,
            mcast: Mutex::new(mcast::Table::default()),
            mcast_gen: AtomicU64::new(0),
            mcast_socks: std::sync::atomic::AtomicUsize::new(0),
            gsi: Mutex::new(crate::provider::gsi::Gsi::new(
                local.ip(),
                crate::gid::guid_for(&local.ip()),
                slot,
            )),
            busy_poll: Duration::from_micros(
                std::env::var("SOFTRDMA_BUSY_POLL_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            ),
        });
        e.wake.set_nonblocking(true)?;
        // SOFTRDMA_FAULTS: fault injection from the start (see FaultConfig::parse), for
        // programs that have no call for it, such as the examples against another stack.
        if let Some(spec) = std::env::var("SOFTRDMA_FAULTS")
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            let cfg = FaultConfig::parse(&spec)?;
            tracing::info!(?cfg, "SOFTRDMA_FAULTS: injecting faults");
            e.set_faults(Some(cfg));
        }
        let _ = e.me.set(Arc::downgrade(&e));
        let weak = Arc::downgrade(&e);
        std::thread::Builder::new()
            .name(format!("softrdma-{addr}"))
            .spawn(move || progress::progress(weak))
            .map_err(|err| crate::Error::from_io(err, "spawning the progress thread"))?;
        tracing::debug!(%local, "device engine started");
        Ok(e)
    }

    /// This process's slot on the device: the byte in bits 16..23 of its QP numbers and
    /// 24..31 of its CM communication IDs.
    pub(crate) fn slot(&self) -> u8 {
        self.share.slot()
    }

    /// Runs the discovery of the device's group indices in this thread (a few milliseconds;
    /// about a second at worst, when members do not answer) and attaches the steering
    /// program it builds.
    pub(crate) fn discover_now(&self) {
        if std::env::var("SOFTRDMA_STEERING").is_ok_and(|v| v.trim() == "hash") {
            self.rediscover();
            return;
        }
        let dst = SocketAddr::new(self.local.ip(), self.local.port());
        self.share.discover(
            Duration::from_millis(50),
            |m| self.sock.send_one(m, dst),
            |p| self.sock.attach_steering(p),
        );
    }

    /// Runs the discovery of the device's group indices on a thread of its own (unless one
    /// runs; then it runs once more after), and attaches the steering program it builds.
    pub(crate) fn rediscover(&self) {
        let Some(me) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        if self.share.busy() {
            return;
        }
        if std::env::var("SOFTRDMA_STEERING").is_ok_and(|v| v.trim() == "hash") {
            // SOFTRDMA_STEERING=hash: no steering; the kernel spreads datagrams by its hash
            // and every one that reaches the wrong process is forwarded (for tests of the
            // forwarding path, and to measure what steering saves).
            if let Err(err) = self.sock.attach_steering(&share::hash_program()) {
                tracing::warn!(error = %err, "attaching the hash program");
            }
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("softrdma-discovery".into())
            .spawn(move || {
                let dst = SocketAddr::new(me.local.ip(), me.local.port());
                me.share.discover(
                    Duration::from_millis(50),
                    |m| me.sock.send_one(m, dst),
                    |p| me.sock.attach_steering(p),
                );
            });
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "spawning the discovery thread");
        }
    }

    /// Registers the QP `qpn`: packets and timeouts for it go to `qp` from now on.
    pub(crate) fn register(&self, qpn: u32, qp: Weak<dyn QpPort>) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qpn, qp);
    }

    pub(crate) fn unregister(&self, qpn: u32) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
        self.timers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
    }

    fn lookup(&self, qpn: u32) -> Option<Arc<dyn QpPort>> {
        self.qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&qpn)
            .and_then(Weak::upgrade)
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Records the QP's next deadline and wakes the progress thread if it would sleep past it.
    pub(crate) fn set_timer(&self, qpn: u32, deadline: Option<Instant>) {
        let mut t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        match deadline {
            Some(d) => {
                t.insert(qpn, d);
                drop(t);
                if self.nanos(d) < self.sleep_until.load(Ordering::Acquire) {
                    self.wake.signal();
                }
            }
            None => {
                t.remove(&qpn);
            }
        }
    }
}
