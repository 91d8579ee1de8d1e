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
use crate::provider::fd::EventFd;
use crate::provider::sock::{RxMsg, UdpSock, ROCE_PORT};
use crate::verbs::cq::WorkCompletion;
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::mr::{AccessError as MrAccessError, AccessFlags, KeyKind};
use crate::verbs::pd::PdInner;
use crate::verbs::qp::{QpInner, QpState_};
use crate::verbs::resources::Resources;
use crate::verbs::srq::SrqInner;
use softrdma_proto::transport::{
    AccessError, AtomicOp, Completion, Env, MwBind, QpEvent, RecvRequest, RxMeta, Sge, WcStatus,
};
use softrdma_wire::icrc::{IcrcPrefix, IdentSolver};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

pub(crate) mod capture;
pub(crate) mod fd;
pub(crate) mod gsi;
mod mcast;
pub(crate) mod sock;

/// Room for one packet: the largest transport packet (4096-byte MTU + headers + ICRC) with
/// headroom.
pub(crate) const PKT_BUF: usize = 4096 + 128;
const BATCH: usize = 64;

/// How long after an application thread last polled an empty CQ of the device the progress
/// thread leaves the device socket to application threads (see the module notes), unless
/// `SOFTRDMA_POLL_HANDOFF_US` says otherwise (0: never; the progress thread always watches).
pub(crate) const POLL_HANDOFF: Duration = Duration::from_micros(500);

/// Per-device packet counters, readable with [`crate::Context::counters`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tx_packets: AtomicU64,
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) tx_errors: AtomicU64,
    pub(crate) rx_packets: AtomicU64,
    pub(crate) rx_bytes: AtomicU64,
    pub(crate) icrc_errors: AtomicU64,
    pub(crate) icrc_ident_solved: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) cnp_received: AtomicU64,
    pub(crate) unknown_qp: AtomicU64,
    pub(crate) wrong_source: AtomicU64,
    pub(crate) fault_drops: AtomicU64,
    pub(crate) fault_dups: AtomicU64,
    pub(crate) fault_corrupts: AtomicU64,
    pub(crate) mcast_tx_packets: AtomicU64,
    pub(crate) mcast_rx_packets: AtomicU64,
    pub(crate) icmp_errors: AtomicU64,
    pub(crate) probes_sent: AtomicU64,
    pub(crate) probes_received: AtomicU64,
}

/// A snapshot of a device's packet counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// Packets handed to the kernel.
    pub tx_packets: u64,
    /// Bytes of those packets (UDP payload).
    pub tx_bytes: u64,
    /// Packets the kernel refused to send.
    pub tx_errors: u64,
    /// Packets received with a good ICRC.
    pub rx_packets: u64,
    /// Bytes of those packets (UDP payload).
    pub rx_bytes: u64,
    /// Packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// IPv4 packets (counted in `rx_packets` too) whose ICRC matched not with
    /// identification 0, as softrdma peers send, but with the identification solved from it:
    /// packets from another stack, such as Linux rxe. They got a 16-bit check instead of a
    /// 32-bit one (see the engine's ICRC notes).
    pub icrc_ident_solved: u64,
    /// Packets dropped as malformed (too short, bad headers, unknown opcode).
    pub malformed: u64,
    /// RoCEv2 Congestion Notification Packets (opcode `0x81`, with a good ICRC) received and
    /// dropped: softrdma does no congestion control (no DCQCN), so they change nothing.
    pub cnp_received: u64,
    /// Packets for a QP that does not exist or is not ready.
    pub unknown_qp: u64,
    /// RC/UC packets dropped because they did not come from the connected peer.
    pub wrong_source: u64,
    /// Packets dropped by fault injection.
    pub fault_drops: u64,
    /// Packets duplicated by fault injection.
    pub fault_dups: u64,
    /// Packets corrupted by fault injection.
    pub fault_corrupts: u64,
    /// UD packets sent to an IP multicast group (also counted in `tx_packets` once sent).
    pub mcast_tx_packets: u64,
    /// Packets received with a good ICRC on the device's multicast group sockets (also
    /// counted in `rx_packets`), whatever number of attached QPs got a copy.
    pub mcast_rx_packets: u64,
    /// ICMP errors the kernel reported for datagrams the device sent (read from the
    /// socket's error queue): port unreachable when no RoCEv2 device listens at a peer,
    /// host or network unreachable. CM requests to a refusing peer end at once.
    pub icmp_errors: u64,
    /// Liveness probes sent: an empty datagram to each peer with an established connection,
    /// every [`PROBE_INTERVAL`], so that a peer whose device went away (its process died
    /// without disconnecting) draws an ICMP port unreachable and its connections end.
    pub probes_sent: u64,
    /// Liveness probes (empty datagrams) received and dropped.
    pub probes_received: u64,
}

/// How often a device probes the peers it has connections with (see
/// [`DeviceCounters::probes_sent`]).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

impl Counters {
    fn snapshot(&self) -> DeviceCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceCounters {
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            tx_errors: g(&self.tx_errors),
            rx_packets: g(&self.rx_packets),
            rx_bytes: g(&self.rx_bytes),
            icrc_errors: g(&self.icrc_errors),
            icrc_ident_solved: g(&self.icrc_ident_solved),
            malformed: g(&self.malformed),
            cnp_received: g(&self.cnp_received),
            unknown_qp: g(&self.unknown_qp),
            wrong_source: g(&self.wrong_source),
            fault_drops: g(&self.fault_drops),
            fault_dups: g(&self.fault_dups),
            fault_corrupts: g(&self.fault_corrupts),
            mcast_tx_packets: g(&self.mcast_tx_packets),
            mcast_rx_packets: g(&self.mcast_rx_packets),
            icmp_errors: g(&self.icmp_errors),
            probes_sent: g(&self.probes_sent),
            probes_received: g(&self.probes_received),
        }
    }
}

/// Faults a device injects into the packets it sends, for tests: each packet is dropped,
/// corrupted, duplicated, delayed or held back behind the next one with the given
/// probabilities, decided by a generator seeded with `seed` (the same seed gives the same
/// decisions for the same sequence of packets).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Seed of the decisions.
    pub seed: u64,
    /// Probability of dropping a packet.
    pub drop: f64,
    /// Probability of sending a packet twice.
    pub duplicate: f64,
    /// Probability of flipping one byte of a packet (after its ICRC was computed, so the
    /// receiver must drop it).
    pub corrupt: f64,
    /// Probability of holding a packet back until after the next one.
    pub reorder: f64,
    /// Probability of delaying a packet by `delay`.
    pub delay_prob: f64,
    /// The delay.
    pub delay: Duration,
    /// Leave the connection manager's packets (QP 1's MADs) alone, so that a lossy data path
    /// does not also wait out the CM's retransmission timeouts (seconds, against Linux).
    pub spare_cm: bool,
    /// Only the first `first` packets the device sends (after `spare_cm`'s are left out) are
    /// exposed to faults; 0 means all of them. A run that must end cleanly needs this: when
    /// the last ACK of an exchange is lost after its QP is destroyed, nothing can ever resend
    /// it, and the peer's last SEND fails with its retry limit (on any RC implementation).
    pub first: u64,
}

impl FaultConfig {
    /// Reads a fault specification as `SOFTRDMA_FAULTS` takes it: comma-separated
    /// `key=value` pairs among `drop`, `dup` (or `duplicate`), `corrupt`, `reorder`,
    /// `delay_prob` (probabilities, 0 to 1), `delay` (milliseconds), `seed` (a number),
    /// `spare_cm` (0 or 1) and `first` (a number of packets); anything not given is zero.
    /// `drop=0.05,seed=7,spare_cm=1,first=1000`.
    ///
    /// Fails with `EINVAL` naming the first key or value it cannot read.
    ///
    /// ```
    /// let f = softrdma::FaultConfig::parse("drop=0.05,seed=7").unwrap();
    /// assert_eq!((f.drop, f.seed, f.spare_cm), (0.05, 7, false));
    /// assert!(softrdma::FaultConfig::parse("drop=2").is_err());
    /// ```
    pub fn parse(spec: &str) -> Result<FaultConfig> {
        let mut f = FaultConfig::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad =
                || crate::Error::invalid(format!("fault specification: cannot read {item:?}"));
            let (k, v) = item.split_once('=').ok_or_else(bad)?;
            let (k, v) = (k.trim(), v.trim());
            let prob = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(bad)
            };
            match k {
                "drop" => f.drop = prob()?,
                "dup" | "duplicate" => f.duplicate = prob()?,
                "corrupt" => f.corrupt = prob()?,
                "reorder" => f.reorder = prob()?,
                "delay_prob" => f.delay_prob = prob()?,
                "delay" => {
                    let ms = v.parse::<f64>().ok().filter(|m| *m >= 0.0 && m.is_finite());
                    f.delay = Duration::from_secs_f64(ms.ok_or_else(bad)? / 1000.0);
                }
                "seed" => f.seed = v.parse().map_err(|_| bad())?,
                "first" => f.first = v.parse().map_err(|_| bad())?,
                "spare_cm" => {
                    f.spare_cm = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(bad()),
                    }
                }
                _ => return Err(bad()),
            }
        }
        Ok(f)
    }
}

/// Whether a RoCEv2 packet (UDP payload) is for QP 1, the connection manager's.
fn is_for_qp1(pkt: &[u8]) -> bool {
    softrdma_wire::bth::Packet::new_checked(pkt)
        .is_ok_and(|b| b.dest_qp() == softrdma_wire::mad::GSI_QPN)
}

struct Faults {
    cfg: FaultConfig,
    state: u64,
    held: Option<(Vec<u8>, SocketAddr)>,
    /// Packets exposed to faults so far (for `FaultConfig::first`).
    seen: u64,
}

impl Faults {
    fn next(&mut self) -> f64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The engine of one device.
pub(crate) struct Engine {
    sock: UdpSock,
    pub(crate) local: SocketAddr,
    qps: RwLock<HashMap<u32, Weak<QpInner>>>,
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
    /// QPs whose transport holds a positive ACK back (see [`drive`]), and whether the list
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

impl Engine {
    /// Binds the device socket and starts the progress thread; `ifindex` is the interface
    /// of `addr`, used to send to and join IPv6 multicast groups.
    pub(crate) fn start(addr: IpAddr, ifindex: u32) -> Result<Arc<Engine>> {
        Self::start_on_port(addr, ROCE_PORT, ifindex)
    }

    pub(crate) fn start_on_port(addr: IpAddr, port: u16, ifindex: u32) -> Result<Arc<Engine>> {
        crate::log::init_from_env();
        let sock = UdpSock::bind(addr, port)?;
        let local = sock.local_addr()?;
        tracing::debug!(%local, "device engine started");
        // Multicast sends leave from the device socket; a device whose interface cannot do
        // multicast still does unicast (its multicast sends are counted in tx_errors).
        if let Err(err) = sock.set_multicast_tx(addr, ifindex) {
            tracing::debug!(%addr, ifindex, error = %err, "no multicast sending options");
        }
        let e = Arc::new(Engine {
            sock,
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
                crate::verbs::device::guid_for(&local.ip()),
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
            .spawn(move || progress(weak))
            .map_err(|err| crate::Error::from_io(err, "spawning the progress thread"))?;
        tracing::debug!(%local, "device engine started");
        Ok(e)
    }

    pub(crate) fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }

    pub(crate) fn set_faults(&self, cfg: Option<FaultConfig>) {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        *f = cfg.map(|cfg| Faults {
            cfg,
            state: cfg.seed,
            held: None,
            seen: 0,
        });
        self.faults_on.store(f.is_some(), Ordering::Release);
    }

    pub(crate) fn register(&self, qp: &Arc<QpInner>) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qp.qp_num, Arc::downgrade(qp));
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

    fn lookup(&self, qpn: u32) -> Option<Arc<QpInner>> {
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

    /// Sends a batch of finished packets, through fault injection when it is on.
    pub(crate) fn send(&self, tx: &mut TxBatch) {
        if tx.count == 0 {
            return;
        }
        if self.faults_on.load(Ordering::Acquire) {
            self.send_with_faults(tx);
        } else {
            let TxBatch {
                bufs, lens, dests, ..
            } = &*tx;
            self.account(tx.count, |i| (&bufs[i][..lens[i]], dests[i]));
        }
        tx.count = 0;
    }

    /// Sends packets `pkt(0..count)` and counts them.
    fn account<'a>(&self, count: usize, pkt: impl Fn(usize) -> (&'a [u8], SocketAddr)) {
        if crate::provider::capture::active() {
            for i in 0..count {
                let (p, dst) = pkt(i);
                crate::provider::capture::record(self.local, dst, p);
            }
        }
        let bytes: usize = (0..count).map(|i| pkt(i).0.len()).sum();
        let (sent, failed) = self.sock.send_batch(count, pkt);
        let c = &self.counters;
        c.tx_packets.fetch_add(sent as u64, Ordering::Relaxed);
        c.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        c.tx_errors.fetch_add(failed as u64, Ordering::Relaxed);
    }

    fn send_with_faults(&self, tx: &TxBatch) {
        let mut out: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(tx.count + 2);
        let mut delayed = Vec::new();
        {
            let mut g = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            let Some(f) = g.as_mut() else {
                return;
            };
            let c = &self.counters;
            for i in 0..tx.count {
                let mut pkt = tx.bufs[i][..tx.lens[i]].to_vec();
                let dst = tx.dests[i];
                let cfg = f.cfg;
                if (cfg.spare_cm && is_for_qp1(&pkt)) || (cfg.first != 0 && f.seen >= cfg.first) {
                    out.push((pkt, dst));
                    if let Some(h) = f.held.take() {
                        out.push(h);
                    }
                    continue;
                }
                f.seen += 1;
                if f.next() < cfg.drop {
                    c.fault_drops.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if f.next() < cfg.corrupt && !pkt.is_empty() {
                    let at = (f.next() * pkt.len() as f64) as usize % pkt.len();
                    pkt[at] ^= 0x5a;
                    c.fault_corrupts.fetch_add(1, Ordering::Relaxed);
                }
                let dup = f.next() < cfg.duplicate;
                if f.next() < cfg.delay_prob {
                    delayed.push((Instant::now() + cfg.delay, pkt.clone(), dst));
                } else if f.next() < cfg.reorder && f.held.is_none() {
                    f.held = Some((pkt.clone(), dst));
                } else {
                    out.push((pkt.clone(), dst));
                    if let Some(h) = f.held.take() {
                        out.push(h);
                    }
                }
                if dup {
                    c.fault_dups.fetch_add(1, Ordering::Relaxed);
                    out.push((pkt, dst));
                }
            }
        }
        if !delayed.is_empty() {
            self.delayed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(delayed);
            self.wake.signal();
        }
        self.account(out.len(), |i| (&out[i].0[..], out[i].1));
    }

    fn release_delayed(&self, now: Instant) -> Option<Instant> {
        let due: Vec<(Vec<u8>, SocketAddr)>;
        let next;
        {
            let mut d = self.delayed.lock().unwrap_or_else(|p| p.into_inner());
            let (ready, wait): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, _, _)| *t <= now);
            *d = wait;
            next = d.iter().map(|(t, _, _)| *t).min();
            due = ready.into_iter().map(|(_, b, a)| (b, a)).collect();
        }
        // A packet held back for reordering is released once nothing follows it.
        let held = self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|f| f.held.take());
        let mut pkts: Vec<(&[u8], SocketAddr)> = due.iter().map(|(b, a)| (&b[..], *a)).collect();
        if let Some((b, a)) = &held {
            pkts.push((&b[..], *a));
        }
        if !pkts.is_empty() {
            self.account(pkts.len(), |i| pkts[i]);
        }
        next
    }
}

/// Packets being prepared for one `sendmmsg`, with their ICRC flows.
pub(crate) struct TxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    dests: Vec<SocketAddr>,
    count: usize,
    prefixes: HashMap<(IpAddr, IpAddr), IcrcPrefix>,
    /// The flow of the last packet committed and its prefix: nearly every packet of a batch
    /// goes on the same flow as the one before, which then costs no hash lookup.
    last: Option<(IpAddr, IpAddr, IcrcPrefix)>,
}

impl TxBatch {
    pub(crate) fn new() -> TxBatch {
        TxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; PKT_BUF]).collect(),
            lens: vec![0; BATCH],
            dests: vec![SocketAddr::from(([0, 0, 0, 0], 0)); BATCH],
            count: 0,
            prefixes: HashMap::new(),
            last: None,
        }
    }

    fn is_full(&self) -> bool {
        self.count == BATCH
    }

    /// The buffer of the next packet.
    fn slot(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// Seals the packet written in the current slot: computes its ICRC for the flow
    /// `src → dst` (both on port 4791) and queues it.
    fn commit(&mut self, len: usize, src: IpAddr, dst: IpAddr) {
        let prefix = match &self.last {
            Some((s, d, p)) if *s == src && *d == dst => p,
            _ => {
                let p = self
                    .prefixes
                    .entry((src, dst))
                    .or_insert_with(|| flow(src, dst))
                    .clone();
                &self.last.insert((src, dst, p)).2
            }
        };
        let buf = &mut self.bufs[self.count];
        if let Ok(crc) = prefix.compute(&buf[..len - 4]) {
            buf[len - 4..len].copy_from_slice(&crc.to_le_bytes());
        }
        self.lens[self.count] = len;
        self.dests[self.count] = SocketAddr::new(dst, ROCE_PORT);
        self.count += 1;
    }
}

fn flow(src: IpAddr, dst: IpAddr) -> IcrcPrefix {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IcrcPrefix::ipv4(s, d, ROCE_PORT, ROCE_PORT),
        (IpAddr::V6(s), IpAddr::V6(d)) => IcrcPrefix::ipv6(s, d, ROCE_PORT, ROCE_PORT),
        (s, d) => {
            // Mixed families cannot happen: address vectors are checked against the device.
            let s6 = match s {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let d6 = match d {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            IcrcPrefix::ipv6(s6, d6, ROCE_PORT, ROCE_PORT)
        }
    }
}

thread_local! {
    static TX: std::cell::RefCell<Option<TxBatch>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's transmit batch.
pub(crate) fn with_tx<R>(f: impl FnOnce(&mut TxBatch) -> R) -> R {
    TX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let tx = slot.get_or_insert_with(TxBatch::new);
        f(tx)
    })
}

/// The memory and receive queue of one QP, as its transport sees them.
pub(crate) struct QpEnv<'a> {
    pub(crate) res: &'a Resources,
    pub(crate) pd: &'a Arc<PdInner>,
    pub(crate) rq: &'a mut VecDeque<crate::verbs::qp::RecvWqe>,
    pub(crate) srq: Option<&'a SrqInner>,
    /// SRQ limit event to raise once the QP lock is released.
    pub(crate) srq_limit_hit: bool,
    /// The QP's cache of memory regions.
    pub(crate) mrs: &'a mut crate::verbs::mr::MrCache,
    /// The QP's `uid` (type 2 memory windows are bound to it).
    pub(crate) qp_uid: u64,
}

fn map_err(e: MrAccessError) -> AccessError {
    match e {
        MrAccessError::InvalidKey | MrAccessError::WrongPd => AccessError::InvalidKey,
        MrAccessError::OutOfBounds => AccessError::OutOfBounds,
        MrAccessError::AccessDenied => AccessError::AccessDenied,
        MrAccessError::Misaligned => AccessError::Misaligned,
    }
}

impl QpEnv<'_> {
    fn lease(
        &mut self,
        key: u32,
        kind: KeyKind,
        va: u64,
        len: usize,
        need: AccessFlags,
        atomic: bool,
    ) -> std::result::Result<crate::verbs::mr::MrLease, AccessError> {
        let r = self
            .res
            .check_access_cached(self.mrs, key, kind, self.pd, va, len as u64, need, atomic);
        match r {
            // Not a region's rkey: perhaps a memory window's (never cached: a window can be
            // rebound or invalidated under the same region).
            Err(MrAccessError::InvalidKey) if kind == KeyKind::Remote => self
                .res
                .check_window(key, self.pd, self.qp_uid, va, len as u64, need, atomic)
                .map_err(map_err),
            r => r.map_err(map_err),
        }
    }
}

impl Env for QpEnv<'_> {
    fn read_local(
        &mut self,
        sge: &Sge,
        offset: u32,
        dst: &mut [u8],
    ) -> std::result::Result<(), AccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let va = sge.addr.wrapping_add(u64::from(offset));
        let l = self.lease(
            sge.lkey,
            KeyKind::Local,
            va,
            dst.len(),
            AccessFlags::empty(),
            false,
        )?;
        l.read(0, dst);
        Ok(())
    }

    fn write_local(
        &mut self,
        sge: &Sge,
        offset: u32,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let va = sge.addr.wrapping_add(u64::from(offset));
        let l = self.lease(
            sge.lkey,
            KeyKind::Local,
            va,
            src.len(),
            AccessFlags::LOCAL_WRITE,
            false,
        )?;
        l.write(0, src);
        Ok(())
    }

    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> std::result::Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        let need = if write {
            AccessFlags::REMOTE_WRITE
        } else {
            AccessFlags::REMOTE_READ
        };
        self.lease(rkey, KeyKind::Remote, va, len as usize, need, false)
            .map(drop)
    }

    fn write_remote(
        &mut self,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let l = self.lease(
            rkey,
            KeyKind::Remote,
            va,
            src.len(),
            AccessFlags::REMOTE_WRITE,
            false,
        )?;
        l.write(0, src);
        Ok(())
    }

    fn read_remote(
        &mut self,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), AccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let l = self.lease(
            rkey,
            KeyKind::Remote,
            va,
            dst.len(),
            AccessFlags::REMOTE_READ,
            false,
        )?;
        l.read(0, dst);
        Ok(())
    }

    fn atomic_remote(
        &mut self,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> std::result::Result<u64, AccessError> {
        let l = self.lease(
            rkey,
            KeyKind::Remote,
            va,
            8,
            AccessFlags::REMOTE_ATOMIC,
            true,
        )?;
        let w = l.atomic_word();
        Ok(match op {
            AtomicOp::CmpAndSwp { compare, swap } => {
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAndAdd { add } => w.fetch_add(add, Ordering::SeqCst),
        })
    }

    fn bind_mw(&mut self, bind: &MwBind) -> std::result::Result<(), WcStatus> {
        self.res.execute_bind(bind, self.pd, self.qp_uid)
    }

    fn local_invalidate(&mut self, rkey: u32) -> std::result::Result<(), WcStatus> {
        self.res
            .invalidate(rkey, self.pd, None)
            .map_err(|()| WcStatus::LocQpOpErr)
    }

    fn remote_invalidate(&mut self, rkey: u32) -> std::result::Result<(), AccessError> {
        self.res
            .invalidate(rkey, self.pd, Some(self.qp_uid))
            .map_err(|()| AccessError::InvalidKey)
    }

    fn take_recv(&mut self) -> Option<RecvRequest> {
        // The queued request is already in the transport's form: a move, no allocation.
        match self.srq {
            Some(srq) => {
                let mut st = srq.state.lock().unwrap_or_else(|p| p.into_inner());
                let w = st.queue.pop_front();
                if w.is_some()
                    && st.attr.srq_limit != 0
                    && (st.queue.len() as u32) < st.attr.srq_limit
                {
                    st.attr.srq_limit = 0;
                    self.srq_limit_hit = true;
                }
                w
            }
            None => self.rq.pop_front(),
        }
    }

    fn recv_available(&self) -> Option<u32> {
        match self.srq {
            Some(_) => None,
            None => Some(self.rq.len().min(u32::MAX as usize) as u32),
        }
    }
}

pub(crate) fn to_wc(c: &Completion, qp_num: u32, ud: bool) -> WorkCompletion {
    use crate::verbs::cq::WcFlags;
    let mut flags = WcFlags::empty();
    if c.imm_data.is_some() {
        flags |= WcFlags::WITH_IMM;
    }
    if c.invalidated_rkey.is_some() {
        flags |= WcFlags::WITH_INV;
    }
    if ud && c.is_recv && c.status == softrdma_proto::transport::WcStatus::Success {
        flags |= WcFlags::GRH;
    }
    WorkCompletion {
        wr_id: c.wr_id,
        status: c.status,
        opcode: c.opcode,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_data: c.imm_data.unwrap_or(0),
        invalidated_rkey: c.invalidated_rkey.unwrap_or(0),
        qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        ..Default::default()
    }
}

thread_local! {
    /// Set while an application thread receives in [`Engine::poll_progress`]: the positive
    /// ACKs of what it receives are held back (see [`drive`]).
    static HOLD_ACKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a QP's transport until it has nothing more to say right now: transmits into `tx`
/// (flushing full batches), delivers completions to the CQs, raises events, and records the
/// next deadline. Called with the QP's lock held, by the posting thread or the progress
/// thread.
pub(crate) fn drive(
    engine: &Engine,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
    now: Instant,
    tx: &mut TxBatch,
) -> Vec<EventType> {
    let mut events = Vec::new();
    let QpState_ {
        transport,
        rq,
        ud_dests,
        attr,
        mrs,
        ..
    } = st;
    let Some(t) = transport.as_mut() else {
        return events;
    };
    let res = &qp.pd.shared().resources;
    let mut env = QpEnv {
        res,
        pd: qp.pd.arc(),
        rq,
        srq: qp.srq.as_deref(),
        srq_limit_hit: false,
        mrs,
        qp_uid: qp.uid,
    };
    let src = engine.local.ip();
    let peer = attr.ah_attr.grh.dgid.to_ip();
    // An application thread receiving for itself holds the ACK of what it received: the
    // program sees the completion, and what it answers on this QP (post_send drives the QP)
    // goes out first with the ACK right behind, in one batch: one system call and one
    // packet less before the peer has its answer. The ACK goes at the latest when the
    // thread next polls an empty CQ, or when the progress thread next wakes
    // (`Engine::flush_held_acks`).
    let hold = HOLD_ACKS.with(std::cell::Cell::get);
    t.set_hold_acks(hold);
    loop {
        if tx.is_full() {
            engine.send(tx);
        }
        let Some(out) = t.poll_transmit(now, tx.slot(), &mut env) else {
            break;
        };
        let dst = match out.ud_dest {
            Some(h) => match ud_dests.remove(&h) {
                Some(ah) => {
                    let d = ah.attr.grh.dgid.to_ip();
                    if d.is_multicast() {
                        engine
                            .counters
                            .mcast_tx_packets
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    d
                }
                None => continue,
            },
            None => peer,
        };
        if out.len < 4 || out.len > PKT_BUF {
            continue;
        }
        tx.commit(out.len, src, dst);
    }
    let srq_limit_hit = env.srq_limit_hit;
    if hold {
        t.set_hold_acks(false);
        if t.has_held_ack() {
            engine.note_held_ack(qp.qp_num);
        }
    }
    // The packets go out before the completions become visible: an application that reacts
    // to a completion (say, disconnects) cannot overtake the ACK of what it received (a
    // held ACK goes before anything else this QP sends, and before the QP leaves RTS).
    if t.has_pending_completion() {
        engine.send(tx);
    }
    while let Some(c) = t.poll_completion() {
        let wc = to_wc(&c, qp.qp_num, qp.qp_type == softrdma_proto::QpType::Ud);
        let cq = if c.is_recv { &qp.recv_cq } else { &qp.send_cq };
        cq.arc().push(wc, c.solicited);
    }
    while let Some(e) = t.poll_event() {
        events.push(match e {
            // The first packet of the connection: "communication established" is the event
            // of a QP that receives while still in RTR (the passive side of a connection
            // before the RTU). A QP already in RTS gets no event.
            QpEvent::CommEst if attr.qp_state != softrdma_proto::QpState::Rtr => continue,
            QpEvent::CommEst => EventType::CommEst,
            QpEvent::Fatal => EventType::QpFatal,
            QpEvent::ReqErr => EventType::QpReqErr,
            QpEvent::AccessErr => EventType::QpAccessErr,
            QpEvent::SqDrained => EventType::SqDrained,
        });
    }
    if t.is_error() && attr.qp_state != softrdma_proto::QpState::Err {
        attr.qp_state = softrdma_proto::QpState::Err;
        attr.cur_qp_state = softrdma_proto::QpState::Err;
        // The transport flushed the send queue; flush our receive queue too.
        for w in rq.drain(..) {
            qp.recv_cq.arc().push(
                WorkCompletion {
                    wr_id: w.wr_id,
                    status: crate::verbs::cq::WcStatus::WrFlushErr,
                    opcode: crate::verbs::cq::WcOpcode::Recv,
                    qp_num: qp.qp_num,
                    ..Default::default()
                },
                false,
            );
        }
    }
    engine.set_timer(qp.qp_num, t.poll_timeout());
    if srq_limit_hit {
        raise_srq_limit(qp);
    }
    events
}

fn grh_for(src: &SocketAddr, dst: &SocketAddr, payload_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            let total = (20 + 8 + payload_len) as u16;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40;
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let mut sum: u32 = 0;
            for i in (0..20).step_by(2) {
                sum += u32::from(u16::from_be_bytes([h[i], h[i + 1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            g[0] = 0x60;
            g[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&to6(s).octets());
            g[24..40].copy_from_slice(&to6(d).octets());
        }
    }
    g
}

/// The ICRC flow of datagrams from `src` to `dst` port 4791.
fn rx_flow(src: SocketAddr, dst: IpAddr) -> IcrcPrefix {
    match (src.ip(), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IcrcPrefix::ipv4(s, d, src.port(), ROCE_PORT),
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            IcrcPrefix::ipv6(to6(s), to6(d), src.port(), ROCE_PORT)
        }
    }
}

/// Checks one received datagram (the UDP payload `pkt`, from `src`, whose ICRC flow is
/// `prefix`): its ICRC and headers.
/// Returns the destination QP number of a good packet; counts and drops a bad one.
fn check_packet(
    engine: &Engine,
    pkt: &[u8],
    src: SocketAddr,
    flow: &mut RxFlow,
    solver: &mut IdentSolver,
) -> Option<u32> {
    let c = &engine.counters;
    let prefix = &flow.prefix;
    // A sender whose packets all verified with identification 0 (a softrdma peer) keeps the
    // full 32-bit check: its packets are never accepted through a solved identification.
    let solve = flow.solved_any || flow.zero_ident < ZERO_IDENT_PEER;
    let Ok(view) = softrdma_wire::roce::Packet::new_checked(pkt) else {
        if is_cnp(pkt) {
            // BTH, 16 reserved bytes, ICRC: counted when the ICRC is good, then dropped.
            let (covered, icrc) = pkt.split_at(pkt.len() - 4);
            let icrc = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
            if check_icrc(c, prefix, solve.then_some(solver), covered, icrc).is_some() {
                c.cnp_received.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let ident = check_icrc(
        c,
        prefix,
        solve.then_some(solver),
        view.icrc_covered(),
        view.icrc(),
    )?;
    if ident == 0 {
        flow.zero_ident = flow.zero_ident.saturating_add(1);
    } else {
        flow.solved_any = true;
    }
    c.rx_packets.fetch_add(1, Ordering::Relaxed);
    c.rx_bytes.fetch_add(pkt.len() as u64, Ordering::Relaxed);
    if crate::provider::capture::active() && !crate::verbs::device::is_local_engine(src) {
        crate::provider::capture::record_ident(src, engine.local, pkt, ident);
    }
    Some(view.bth().dest_qp())
}

/// Verifies the ICRC of a received packet against its flow's prefix (no per-sender
/// history: the multicast path): first as sent with
/// IPv4 identification 0 (softrdma peers; the full 32-bit check, and all the work done when
/// it passes), then, for IPv4, with the identification solved from the ICRC (other stacks).
/// Returns the identification that matched; counts and returns `None` when none does.
pub(crate) fn verify_icrc(
    c: &Counters,
    prefix: &IcrcPrefix,
    solver: &mut IdentSolver,
    view: &softrdma_wire::roce::Packet<&[u8]>,
) -> Option<u16> {
    check_icrc(c, prefix, Some(solver), view.icrc_covered(), view.icrc())
}

/// Packets verified with identification 0, and none through a solved one, after which a
/// sender counts as a softrdma peer whose packets get only the full check (a corrupted
/// packet would otherwise pass the 16-bit check of a solved identification with probability
/// 2^-16: one in about 65,000 corrupted packets). Linux rxe varies the identification per
/// packet, so its flows solve one long before this many zeros.
const ZERO_IDENT_PEER: u32 = 64;

/// What the receive path keeps per sender: its ICRC prefix and how its packets verified.
pub(crate) struct RxFlow {
    prefix: IcrcPrefix,
    /// Packets verified with identification 0 (saturating).
    zero_ident: u32,
    /// Whether a packet ever verified through a solved identification (another stack).
    solved_any: bool,
}

/// Whether a UDP payload is a RoCEv2 CNP: opcode `0x81` in a packet of exactly its size
/// (BTH, 16 reserved bytes, ICRC).
fn is_cnp(pkt: &[u8]) -> bool {
    pkt.len() == softrdma_wire::bth::HEADER_LEN + 16 + 4
        && pkt[0] == softrdma_wire::opcode::Opcode::CNP.0
}

/// [`verify_icrc`] for the bytes the ICRC covers and the ICRC as received.
fn check_icrc(
    c: &Counters,
    prefix: &IcrcPrefix,
    solver: Option<&mut IdentSolver>,
    covered: &[u8],
    icrc: u32,
) -> Option<u16> {
    match prefix.compute(covered) {
        Ok(crc) if crc == icrc => Some(0),
        Ok(crc) => match solver.and_then(|s| prefix.solve_ident(s, covered.len(), crc, icrc)) {
            Some(ident) => {
                c.icrc_ident_solved.fetch_add(1, Ordering::Relaxed);
                Some(ident)
            }
            None => {
                c.icrc_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        },
        Err(_) => {
            c.icrc_errors.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Hands a run of good packets, all for QP `qpn` and from `src`, to that QP's transport
/// under one lock, then drives the QP once.
fn deliver(
    engine: &Engine,
    qpn: u32,
    pkts: &[&[u8]],
    src: SocketAddr,
    now: Instant,
    tx: &mut TxBatch,
) {
    let c = &engine.counters;
    let Some(qp) = engine.lookup(qpn) else {
        c.unknown_qp.fetch_add(pkts.len() as u64, Ordering::Relaxed);
        return;
    };
    let st = qp.lock();
    if st.transport.is_none() {
        c.unknown_qp.fetch_add(pkts.len() as u64, Ordering::Relaxed);
        return;
    }
    if matches!(
        qp.qp_type,
        softrdma_proto::QpType::Rc | softrdma_proto::QpType::Uc
    ) && st.attr.ah_attr.grh.dgid.to_ip() != src.ip()
    {
        c.wrong_source
            .fetch_add(pkts.len() as u64, Ordering::Relaxed);
        return;
    }
    feed(engine, &qp, st, pkts, src, engine.local.ip(), now, tx);
}

/// Hands packets from `src` to `dst` to the transport of `qp` (whose lock `st` is, checked
/// for a transport), drives the QP, releases the lock and raises the resulting events.
#[allow(clippy::too_many_arguments)]
fn feed(
    engine: &Engine,
    qp: &Arc<QpInner>,
    mut st: std::sync::MutexGuard<'_, QpState_>,
    pkts: &[&[u8]],
    src: SocketAddr,
    dst: IpAddr,
    now: Instant,
    tx: &mut TxBatch,
) {
    let srq_limit_hit;
    let events = {
        let dst = SocketAddr::new(dst, ROCE_PORT);
        {
            let QpState_ {
                transport, rq, mrs, ..
            } = &mut *st;
            let mut env = QpEnv {
                res: &qp.pd.shared().resources,
                pd: qp.pd.arc(),
                rq,
                srq: qp.srq.as_deref(),
                srq_limit_hit: false,
                mrs,
                qp_uid: qp.uid,
            };
            if let Some(t) = transport.as_mut() {
                for pkt in pkts {
                    let meta = RxMeta {
                        grh: grh_for(&src, &dst, pkt.len()),
                    };
                    t.handle_packet(now, pkt, &meta, &mut env);
                }
            }
            srq_limit_hit = env.srq_limit_hit;
        }
        let ev = drive(engine, qp, &mut st, now, tx);
        drop(st);
        ev
    };
    if srq_limit_hit {
        raise_srq_limit(qp);
    }
    for e in events {
        qp.raise(e);
    }
}

/// Sends the positive ACK the transport of `qp` holds back, if it holds one (with the QP's
/// lock `st` held); returns the events to raise once the lock is released.
pub(crate) fn send_held_ack(
    engine: &Engine,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
) -> Vec<EventType> {
    if !st.transport.as_ref().is_some_and(|t| t.has_held_ack()) {
        return Vec::new();
    }
    drive_and_send(engine, qp, st)
}

/// Drives the QP (lock `st` held) from the calling thread and sends what it produced now;
/// returns the events to raise once the lock is released.
pub(crate) fn drive_and_send(
    engine: &Engine,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
) -> Vec<EventType> {
    with_tx(|tx| {
        let ev = drive(engine, qp, st, Instant::now(), tx);
        engine.send(tx);
        ev
    })
}

impl QpInner {
    /// Sends the positive ACK this QP's transport holds back, if any (see [`drive`]).
    pub(crate) fn release_held_ack(self: &Arc<Self>) {
        let events = {
            let mut st = self.lock();
            match st.engine.clone() {
                Some(e) => send_held_ack(&e, self, &mut st),
                None => Vec::new(),
            }
        };
        for e in events {
            self.raise(e);
        }
    }
}

/// Raises `IBV_EVENT_SRQ_LIMIT_REACHED` for the QP's SRQ (the limit disarmed itself).
fn raise_srq_limit(qp: &Arc<QpInner>) {
    if let Some(srq) = &qp.srq {
        qp.pd.ctx.async_events.raise(
            EventType::SrqLimitReached,
            AsyncElement::Srq {
                srq_context: srq.srq_context,
            },
            Some(srq.arc().clone() as Arc<dyn EventTarget>),
        );
    }
}

/// The receive side of an engine: buffers and ICRC flows, used by whichever thread receives
/// (the progress thread, or an application thread polling a CQ), one at a time so that
/// packets are processed in the order they arrived.
pub(crate) struct RxState {
    bufs: Vec<Vec<u8>>,
    meta: Vec<RxMsg>,
    prefixes: HashMap<SocketAddr, RxFlow>,
    /// Solves for the IPv4 identification of packets from other stacks.
    ident: IdentSolver,
    /// The multicast side: group snapshot, ICRC flows, and the copy a member receives.
    mcast: mcast::RxMcast,
}

impl RxState {
    pub(crate) fn new() -> RxState {
        RxState {
            bufs: (0..BATCH).map(|_| vec![0u8; 65536]).collect(),
            meta: vec![RxMsg::default(); BATCH],
            prefixes: HashMap::new(),
            ident: IdentSolver::new(),
            mcast: mcast::RxMcast::default(),
        }
    }
}

impl Engine {
    /// The RoCEv2 packets of one received message (one datagram, or a GRO batch of
    /// `segment`-byte datagrams) and their sender; `None` (counted as malformed when empty)
    /// when there is nothing to process.
    pub(crate) fn datagrams<'a>(
        &self,
        buf: &'a [u8],
        m: RxMsg,
    ) -> Option<(SocketAddr, std::slice::Chunks<'a, u8>)> {
        let src = m.src?;
        if m.len == 0 {
            let c = if m.truncated {
                &self.counters.malformed
            } else {
                &self.counters.probes_received
            };
            c.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let seg = if m.segment == 0 { m.len } else { m.segment };
        Some((src, buf[..m.len].chunks(seg)))
    }

    /// Receives and processes what is waiting on the socket, up to `rounds` batches, with the
    /// receive state held. Returns the number of messages received.
    fn receive_rounds(&self, rx: &mut RxState, tx: &mut TxBatch, rounds: usize) -> usize {
        let mut total = 0;
        let RxState {
            bufs,
            meta,
            prefixes,
            ident,
            ..
        } = rx;
        for _ in 0..rounds {
            let n = match self.sock.recv_batch(bufs, meta) {
                Ok(n) => n,
                Err(e) => {
                    // An ICMP error for an earlier datagram is reported here once, and its
                    // details wait in the error queue (which keeps the socket readable
                    // until drained): read them, then go on receiving.
                    let icmp = self.icmp_errors(tx);
                    if icmp == 0 {
                        tracing::warn!(error = %e, "receive failed");
                        0
                    } else {
                        continue;
                    }
                }
            };
            if n == 0 {
                break;
            }
            total += n;
            let now = Instant::now();
            // Runs of packets for the same QP are delivered under one lock (one vector for
            // the round, not one per message).
            let mut run: Vec<&[u8]> = Vec::with_capacity(BATCH);
            for i in 0..n {
                let Some((src, pkts)) = self.datagrams(&bufs[i], meta[i]) else {
                    continue;
                };
                // One flow lookup per message: the datagrams of a GRO batch share a sender.
                let flow = prefixes.entry(src).or_insert_with(|| RxFlow {
                    prefix: rx_flow(src, self.local.ip()),
                    zero_ident: 0,
                    solved_any: false,
                });
                run.clear();
                let mut run_qpn = None;
                for pkt in pkts {
                    let Some(qpn) = check_packet(self, pkt, src, flow, ident) else {
                        continue;
                    };
                    if qpn == softrdma_wire::mad::GSI_QPN {
                        self.gsi_receive(pkt, src, now, tx);
                        continue;
                    }
                    if run_qpn != Some(qpn) {
                        if let Some(q) = run_qpn {
                            deliver(self, q, &run, src, now, tx);
                        }
                        run.clear();
                        run_qpn = Some(qpn);
                    }
                    run.push(pkt);
                }
                if let Some(q) = run_qpn {
                    deliver(self, q, &run, src, now, tx);
                }
            }
            self.send(tx);
            if n < BATCH {
                break;
            }
        }
        total
    }

    fn gsi_receive(&self, pkt: &[u8], src: SocketAddr, now: Instant, tx: &mut TxBatch) {
        let evs = {
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            g.receive(now, src.ip(), pkt);
            self.gsi_drive(&mut g, tx);
            g.take_events()
        };
        self.send(tx);
        self.dispatch(evs);
    }

    /// Reads the socket's ICMP errors ([`UdpSock::take_icmp_errors`]) and counts them; a
    /// port unreachable from a peer's RoCEv2 port ends the CM requests waiting for that peer
    /// at once (`RDMA_CM_EVENT_UNREACHABLE` with status `-ECONNREFUSED`) instead of after
    /// every retry. Returns the number of errors read.
    fn icmp_errors(&self, tx: &mut TxBatch) -> usize {
        let mut errs = Vec::new();
        self.sock.take_icmp_errors(&mut errs);
        if errs.is_empty() {
            return 0;
        }
        self.counters
            .icmp_errors
            .fetch_add(errs.len() as u64, Ordering::Relaxed);
        let mut evs = Vec::new();
        {
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            for (dst, errno) in &errs {
                tracing::debug!(%dst, errno, "ICMP error for a sent datagram");
                if *errno == libc::ECONNREFUSED && dst.port() == softrdma_wire::ROCE_V2_UDP_PORT {
                    g.cm.handle_port_unreachable(Instant::now(), dst.ip());
                }
            }
            self.gsi_drive(&mut g, tx);
            evs.extend(g.take_events());
        }
        self.send(tx);
        self.dispatch(evs);
        errs.len()
    }

    /// Sends a liveness probe to every peer the CM has a connection with.
    fn probe_peers(&self) {
        let peers = self
            .gsi
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cm
            .connected_peers();
        for ip in peers {
            self.sock
                .send_probe(SocketAddr::new(ip, softrdma_wire::ROCE_V2_UDP_PORT));
            self.counters.probes_sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands CM events to the connection-manager layer (no lock held); the ones no id
    /// handles go back to the queue.
    pub(crate) fn dispatch(&self, evs: Vec<softrdma_proto::cm::CmEvent>) {
        if evs.is_empty() {
            return;
        }
        let Some(me) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        let rest: Vec<_> = evs
            .into_iter()
            .filter_map(|ev| crate::rdma_cm::dispatch(&me, ev))
            .collect();
        if !rest.is_empty() {
            self.gsi
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .requeue(rest);
        }
    }

    /// Sends what the CM wants sent, collects its events and records its next deadline
    /// (under the timer key of QP 1). Called with the GSI lock held.
    pub(crate) fn gsi_drive(&self, g: &mut crate::provider::gsi::Gsi, tx: &mut TxBatch) {
        loop {
            if tx.is_full() {
                self.send(tx);
            }
            let Some((len, dst)) = g.poll_transmit(tx.slot()) else {
                break;
            };
            tx.commit(len, self.local.ip(), dst);
        }
        g.collect_events();
        self.set_timer(softrdma_wire::mad::GSI_QPN, g.cm.poll_timeout());
    }

    /// Runs `f` on the connection manager of this device, sends what it wants sent, then
    /// dispatches its events.
    pub(crate) fn with_cm<R>(
        &self,
        f: impl FnOnce(&mut crate::provider::gsi::Gsi, Instant) -> R,
    ) -> R {
        let (r, evs) = {
            let mut g = self.gsi.lock().unwrap_or_else(|p| p.into_inner());
            let r = f(&mut g, Instant::now());
            with_tx(|tx| {
                self.gsi_drive(&mut g, tx);
                self.send(tx);
            });
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

    /// Progress from an application thread that found its CQ empty: if no other thread is
    /// receiving, receive what is waiting now (without blocking) and process it here, so
    /// that a polling application gets its completions without a thread hop.
    ///
    /// `busy` says that the CQ polled is not armed for an event: its program polls rather
    /// than sleeps, and the progress thread leaves the socket to it (see the module notes).
    pub(crate) fn poll_progress(&self, busy: bool) {
        if busy && !self.handoff.is_zero() {
            self.app_polls.fetch_add(1, Ordering::Relaxed);
            if self.app_asleep.load(Ordering::Relaxed) {
                self.app_asleep.store(false, Ordering::Relaxed);
            }
        }
        // The program found nothing to do: the ACKs held since its last receive go now.
        self.flush_held_acks();
        let Ok(mut rx) = self.rx.try_lock() else {
            return;
        };
        with_tx(|tx| {
            HOLD_ACKS.with(|h| h.set(busy && !self.handoff.is_zero()));
            self.receive_rounds(&mut rx, tx, 4);
            if self.mcast_socks.load(Ordering::Acquire) != 0 || rx.mcast.holds_sockets() {
                self.poll_mcast(&mut rx, tx, 4);
            }
            HOLD_ACKS.with(|h| h.set(false));
        });
    }

    /// Records that the transport of QP `qpn` holds a positive ACK back.
    fn note_held_ack(&self, qpn: u32) {
        let mut l = self.held_acks.lock().unwrap_or_else(|p| p.into_inner());
        if !l.contains(&qpn) {
            l.push(qpn);
        }
        self.any_held_acks.store(true, Ordering::Release);
    }

    /// Sends the ACKs that QPs hold back (costs one atomic load when there are none).
    pub(crate) fn flush_held_acks(&self) {
        if !self.any_held_acks.load(Ordering::Acquire) {
            return;
        }
        // Taken out of the lock (releasing locks each QP, and a QP's drive notes into the
        // list under the QP lock), then given back empty so that its room is reused: a
        // ping-pong notes and flushes a held ACK every round trip.
        let mut qpns = {
            let mut l = self.held_acks.lock().unwrap_or_else(|p| p.into_inner());
            self.any_held_acks.store(false, Ordering::Release);
            std::mem::take(&mut *l)
        };
        for qpn in qpns.drain(..) {
            if let Some(qp) = self.lookup(qpn) {
                qp.release_held_ack();
            }
        }
        let mut l = self.held_acks.lock().unwrap_or_else(|p| p.into_inner());
        if l.is_empty() {
            *l = qpns;
        }
    }
}

impl Engine {
    /// An application thread is about to sleep rather than poll (it armed a CQ): the
    /// progress thread takes the socket back now instead of after the hand-off period.
    pub(crate) fn app_sleeps(&self) {
        // With `standing_down` (stored before the progress thread reads `app_asleep`): one of
        // the two threads sees the other's store.
        self.app_asleep.store(true, Ordering::SeqCst);
        if self.standing_down.load(Ordering::SeqCst) {
            self.wake.signal();
        }
    }

    /// Whether application threads polled (busy) since the progress thread last looked
    /// (`seen`), and then until when it leaves the socket to them. Sets `standing_down` when
    /// so.
    fn handoff_until(&self, now: Instant, seen: &mut u64) -> Option<Instant> {
        if self.handoff.is_zero() {
            return None;
        }
        let polls = self.app_polls.load(Ordering::Relaxed);
        if polls == *seen {
            return None;
        }
        *seen = polls;
        self.standing_down.store(true, Ordering::SeqCst);
        if self.app_asleep.load(Ordering::SeqCst) {
            self.standing_down.store(false, Ordering::SeqCst);
            return None;
        }
        Some(now + self.handoff)
    }
}

fn progress(weak: Weak<Engine>) {
    let mut tx = TxBatch::new();
    let mut last_rx = Instant::now();
    let mut next_probe = Instant::now() + PROBE_INTERVAL;
    // The groups polled (the receive state's snapshot, which keeps their sockets open) and
    // its generation.
    let mut groups = Arc::new(mcast::View::default());
    let mut groups_gen = 0;
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(2);
    // The application threads' busy polls counted when last looked at.
    let mut seen_polls = 0u64;
    loop {
        let Some(engine) = weak.upgrade() else {
            return;
        };
        // Sleep until a packet, a wake-up or the next deadline.
        let now = Instant::now();
        let mut next = now + Duration::from_millis(200);
        if let Some(d) = engine
            .timers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .min()
        {
            next = next.min(*d);
        }
        if let Some(d) = engine.release_delayed(now) {
            next = next.min(d);
        }
        let handoff = engine.handoff_until(now, &mut seen_polls);
        engine
            .sleep_until
            .store(engine.nanos(next), Ordering::Release);
        if let Some(h) = handoff {
            next = next.min(h);
        }
        let timeout = next.saturating_duration_since(now);
        let gen = engine.mcast_gen.load(Ordering::Acquire);
        if gen != groups_gen {
            // Refreshing the receive state's snapshot too lets a closed group's socket go.
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            groups = engine.mcast_refresh(&mut rx.mcast);
            groups_gen = gen;
        }
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.clear();
        // (poll(2) ignores a negative descriptor: the socket is left to application threads.)
        fds.push(pollfd(if handoff.is_some() {
            -1
        } else {
            engine.sock.raw()
        }));
        fds.push(pollfd(std::os::fd::AsRawFd::as_raw_fd(&engine.wake)));
        fds.extend(groups.groups.iter().map(|g| pollfd(g.sock.raw())));
        let mut timeout = timeout;
        if handoff.is_none()
            && !engine.busy_poll.is_zero()
            && now.duration_since(last_rx) < engine.busy_poll
        {
            timeout = Duration::ZERO;
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
            while engine.wake.try_wait() {}
        }
        engine.sleep_until.store(0, Ordering::Release);
        engine.standing_down.store(false, Ordering::SeqCst);
        // ACKs an application thread held and has not sent since (it stopped polling).
        engine.flush_held_acks();
        // Receive everything waiting, in batches (unless an application thread is at it).
        if fds[0].revents & libc::POLLERR != 0 {
            // ICMP errors wait in the socket's error queue (IP_RECVERR); it stays POLLERR
            // until they are read.
            engine.icmp_errors(&mut tx);
        }
        if fds[0].revents & libc::POLLIN != 0 {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            if engine.receive_rounds(&mut rx, &mut tx, 64) > 0 {
                last_rx = Instant::now();
            }
        }
        if fds[2..].iter().any(|fd| fd.revents & libc::POLLIN != 0) {
            let mut rx = engine.rx.lock().unwrap_or_else(|p| p.into_inner());
            if engine.poll_mcast(&mut rx, &mut tx, 64) > 0 {
                last_rx = Instant::now();
            }
        }
        // Liveness probes to connected peers (a dead peer's kernel answers ICMP).
        let now = Instant::now();
        if now >= next_probe {
            next_probe = now + PROBE_INTERVAL;
            engine.probe_peers();
        }
        // Timers.
        let due: Vec<u32> = {
            let t = engine.timers.lock().unwrap_or_else(|p| p.into_inner());
            t.iter()
                .filter(|(_, d)| **d <= now)
                .map(|(q, _)| *q)
                .collect()
        };
        for qpn in due {
            if qpn == softrdma_wire::mad::GSI_QPN {
                let evs = {
                    let mut g = engine.gsi.lock().unwrap_or_else(|p| p.into_inner());
                    g.cm.handle_timeout(now);
                    engine.gsi_drive(&mut g, &mut tx);
                    g.take_events()
                };
                engine.send(&mut tx);
                engine.dispatch(evs);
                continue;
            }
            let Some(qp) = engine.lookup(qpn) else {
                engine.set_timer(qpn, None);
                continue;
            };
            let events = {
                let mut st = qp.lock();
                {
                    let QpState_ {
                        transport, rq, mrs, ..
                    } = &mut *st;
                    let mut env = QpEnv {
                        res: &qp.pd.shared().resources,
                        pd: qp.pd.arc(),
                        rq,
                        srq: qp.srq.as_deref(),
                        srq_limit_hit: false,
                        mrs,
                        qp_uid: qp.uid,
                    };
                    if let Some(t) = transport.as_mut() {
                        t.handle_timeout(now, &mut env);
                    }
                    if env.srq_limit_hit {
                        raise_srq_limit(&qp);
                    }
                }
                drive(&engine, &qp, &mut st, now, &mut tx)
            };
            for e in events {
                qp.raise(e);
            }
        }
        engine.send(&mut tx);
    }
}
