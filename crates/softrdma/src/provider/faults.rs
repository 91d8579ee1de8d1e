//! Fault injection on the send path (`SOFTRDMA_FAULTS`, [`FaultConfig`]).

use super::counters::Counters;
use crate::error::Result;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
pub(super) fn is_for_qp1(pkt: &[u8]) -> bool {
    softrdma_wire::bth::Packet::new_checked(pkt)
        .is_ok_and(|b| b.dest_qp() == softrdma_wire::mad::GSI_QPN)
}

/// The decisions of one fault configuration.
struct Injector {
    cfg: FaultConfig,
    state: u64,
    held: Option<(Vec<u8>, SocketAddr)>,
    /// Packets exposed to faults so far (for `FaultConfig::first`).
    seen: u64,
}

impl Injector {
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

/// Packets to send: bytes and destination.
pub(super) type Out = Vec<(Vec<u8>, SocketAddr)>;

/// The fault injection of a device's send path: off (one atomic load per batch) or a
/// configuration with its generator, the packet held back for reordering and the delayed
/// ones.
pub(crate) struct Faults {
    on: AtomicBool,
    injector: Mutex<Option<Injector>>,
    delayed: Mutex<Vec<(std::time::Instant, Vec<u8>, SocketAddr)>>,
}

impl Faults {
    /// No faults.
    pub(super) fn new() -> Faults {
        Faults {
            on: AtomicBool::new(false),
            injector: Mutex::new(None),
            delayed: Mutex::new(Vec::new()),
        }
    }

    /// Whether faults are injected.
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Injects faults with `cfg` from now on (`None`: none).
    pub(super) fn set(&self, cfg: Option<FaultConfig>) {
        let mut f = self.injector.lock().unwrap_or_else(|p| p.into_inner());
        *f = cfg.map(|cfg| Injector {
            cfg,
            state: cfg.seed,
            held: None,
            seen: 0,
        });
        self.on.store(f.is_some(), Ordering::Release);
    }

    /// Applies the faults to packets `pkt(0..count)`: returns what to send now, and whether
    /// packets were delayed (the caller wakes the progress thread, which sends them when due
    /// through [`Faults::release_delayed`]). Counts what it does in `c`.
    pub(super) fn apply<'a>(
        &self,
        count: usize,
        pkt: impl Fn(usize) -> (&'a [u8], SocketAddr),
        c: &Counters,
    ) -> (Out, bool) {
        let mut out: Out = Vec::with_capacity(count + 2);
        let mut delayed = Vec::new();
        {
            let mut g = self.injector.lock().unwrap_or_else(|p| p.into_inner());
            let Some(f) = g.as_mut() else {
                return (out, false);
            };
            for i in 0..count {
                let (p, dst) = pkt(i);
                let mut pkt = p.to_vec();
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
        let any_delayed = !delayed.is_empty();
        if any_delayed {
            self.delayed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(delayed);
        }
        (out, any_delayed)
    }

    /// The delayed packets due at `now`, and the packet held back for reordering (released
    /// once nothing follows it); with when the next delayed one is due.
    pub(super) fn release_delayed(&self, now: Instant) -> (Out, Option<Instant>) {
        let mut due: Out;
        let next;
        {
            let mut d = self.delayed.lock().unwrap_or_else(|p| p.into_inner());
            let (ready, wait): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, _, _)| *t <= now);
            *d = wait;
            next = d.iter().map(|(t, _, _)| *t).min();
            due = ready.into_iter().map(|(_, b, a)| (b, a)).collect();
        }
        let held = self
            .injector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|f| f.held.take());
        due.extend(held);
        (due, next)
    }
}
