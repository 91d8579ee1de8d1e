//! Same-host lanes: packets between two softrdma devices of one host (two processes, or two
//! devices in one process) cross a ring in shared memory instead of the kernel's UDP stack.
//!
//! The packets are the same RoCEv2 packets, made and checked by the same transport, so every
//! verbs semantic holds exactly as on the wire (ordering, checks on the target, statuses,
//! retransmission, flush); what a lane saves is the network stack: no system call per batch,
//! no socket buffers, two copies of the payload instead of four.
//!
//! - **Who is local** is never assumed: a packet's destination names a device address and,
//!   in the QP number's slot byte, a process ([`super::share`]). When that process's slot
//!   socket exists on this host under this user's name, the sending device *offers* a lane:
//!   a ring (a memfd, [`ring`]) and one end of a `SOCK_SEQPACKET` pair, the *bell*, passed
//!   with `SCM_RIGHTS` over the slot socket. The owner maps the ring and answers; only then do
//!   packets take it. Until then, and whenever the name does not exist (a remote peer), they
//!   go on the wire. A lane carries one direction; the answers make their own.
//! - **Wake-ups**: the consumer (the receiving device's progress thread, or an application
//!   thread polling a CQ) reads rings without system calls; before its progress thread
//!   sleeps it sets the ring's `sleeping` flag, and a producer that sees the flag writes one
//!   byte to the bell.
//! - **Death**: when either process dies (or drops its device) its end of the bell closes and
//!   the other sees `POLLHUP`: the lane goes, and packets go on the wire again (to whoever
//!   holds the slot then). What was in flight is lost as a dead host's packets are; the
//!   transport's timers and retries decide, as on the wire.
//! - **A full ring** is waited for a moment (the consumer is running), then the packet goes
//!   on the wire: reordered, which the transport repairs, never lost by the lane.
//! - `SOFTRDMA_TRANSPORT=wire` turns lanes off (for packet capture and interop tests);
//!   fault injection sends every packet on the wire.

pub(crate) mod pair;
pub(crate) mod records;
pub(crate) mod ring;
mod setup;

use super::share;
use super::unix_names;
use ring::{ring_bell, Consumer, Corrupt, Producer};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The first byte of a record that is not a RoCE packet but a work request, its
/// acknowledgement or its refusal between two QPs of this host (`verbs::records`): an
/// opcode of the manufacturer-specific range, never sent on a network. Its bytes 5..8 name
/// the destination QP as a BTH does.
pub(crate) const WR_RECORD: u8 = 0xe7;

/// Bytes of records in each ring: a send window of 128 packets of a same-host segment
/// ([`SAME_HOST_SEGMENT_MAX`], nearly 64 KiB) about fills it; an RC QP that finds it full
/// waits for its ACKs (`verbs::datapath::drive`). (With 4 MiB, half a window of such packets,
/// a 1 MiB WRITE over a lane ran at half the speed of 32 KiB segments: the sender kept
/// finding the ring full.)
const RING_CAP: usize = 8 << 20;
/// How long an offer waits for its answer before the destination counts as not local.
const OFFER_WAIT: Duration = Duration::from_secs(1);
/// How long a destination that is not local (or refused) is not offered a lane again.
const NOT_LOCAL_FOR: Duration = Duration::from_secs(2);
/// How long a destination that refused a lane is not offered one again.
const REFUSED_FOR: Duration = Duration::from_secs(60);
/// How long after its lane ended a destination is offered a new one (a new process may hold
/// the slot).
const AFTER_HANGUP: Duration = Duration::from_millis(100);
/// How long a packet waits for room in a full ring before it goes on the wire.
const FULL_WAIT: Duration = Duration::from_millis(1);

/// Whether this process lets same-host lanes carry packets between devices of this host
/// (shared memory instead of UDP, see the README's "Same-host lanes"): `false` when the
/// environment says `SOFTRDMA_TRANSPORT=wire` (read once, when first asked or when the first
/// device opens). Never fails.
pub fn same_host_lanes() -> bool {
    !wire_forced()
}

/// The largest same-host segment, and the default: 65,280 bytes of payload, whose packet
/// with the most headers a segmented request carries (BTH, RETH and immediate data: 32
/// bytes), its pad and its ICRC is 65,319 bytes, within the 65,507 bytes of one UDP datagram
/// over IPv4, so the packets of a lane take the wire as they are (loopback's MTU is 64 KiB).
/// Against 32 KiB, the segment of sessions before, one QP's 1 MiB over the wire (one datagram
/// a packet either way: two 32 KiB packets do not fit one GSO message) went 17-34% faster and
/// a WRITE of 1 MiB over a lane 38%; a round trip of 64-128 KiB over the wire takes 25-40%
/// longer, its two packets no longer pipelined (BENCHMARKS.md, "Same-host segments of nearly
/// 64 KiB").
const SAME_HOST_SEGMENT_MAX: u32 = 65_280;

/// The segment size of RC and UC connections between two QPs of this host (bytes of payload
/// per packet instead of the path MTU): `SOFTRDMA_SAME_HOST_SEGMENT` (bytes, at most
/// [`SAME_HOST_SEGMENT_MAX`]; 0 for the path MTU), [`SAME_HOST_SEGMENT_MAX`] by default. Read
/// once.
fn same_host_segment_size() -> u32 {
    static SEG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SEG.get_or_init(|| {
        std::env::var("SOFTRDMA_SAME_HOST_SEGMENT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(SAME_HOST_SEGMENT_MAX)
    })
}

/// The segment size for an RC or UC QP (`connected`) whose peer is QP `dest_qpn` on the
/// device at `peer`: larger than any path MTU when that device is a softrdma device of this
/// host (a process of this user holds the slot the QP number names), whose packets never
/// cross a network; `None` (the path MTU) otherwise. Both ends decide alike: each sees the
/// other's slot. Never fails.
pub(crate) fn same_host_segment(connected: bool, peer: IpAddr, dest_qpn: u32) -> Option<u32> {
    let slot = share::slot_of_qpn(dest_qpn);
    let seg = same_host_segment_size();
    if !connected || seg == 0 || slot == 0 || slot == 0xff {
        return None;
    }
    unix_names::slot_is_held(peer, slot).then_some(seg.clamp(256, SAME_HOST_SEGMENT_MAX))
}

/// Whether this process moves short RC work requests between two QPs of this host as records
/// in a lane's ring (see `verbs::records`) rather than as packets through the transport:
/// `false` when the environment says `SOFTRDMA_WR_RECORDS=0` (read once). Never fails.
pub(crate) fn wr_records() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_WR_RECORDS").map_or(true, |v| v != "0"))
}

/// Whether `SOFTRDMA_TRANSPORT=wire` forces every packet on the wire (read once).
pub(crate) fn wire_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var("SOFTRDMA_TRANSPORT")
            .map(|v| v.eq_ignore_ascii_case("wire"))
            .unwrap_or(false)
    })
}

/// The lanes of one device: those it sends on, by destination, and those it receives from.
pub(crate) struct Lanes {
    on: bool,
    /// The device's socket address and this process's slot on it (where answers come).
    local: SocketAddr,
    slot: u8,
    out: Mutex<Vec<Out>>,
    inbound: Mutex<Vec<InLane>>,
    /// Whether `inbound` may be non-empty (saves its lock on every poll when it is not).
    any_inbound: AtomicBool,
    /// The senders (device address, slot) of the inbound lanes, under a lock of its own that
    /// is taken with nothing else after it: a sender asks it under its QP's lock, while the
    /// receive side takes QP locks under `inbound`'s.
    inbound_from: Mutex<Vec<(IpAddr, u8)>>,
    /// Changes whenever [`Lanes::records_ready`] may have changed its answer (a lane came
    /// up, brought its first records, or went).
    records_gen: AtomicU64,
    /// Nothing is taken from the inbound lanes while set ([`Lanes::set_paused`]).
    paused: AtomicBool,
    /// Changes whenever the set of bells changes (the progress thread's poll set).
    gen: AtomicU64,
    nonces: AtomicU64,
    /// The index in `out` of the destination last written to (a hint, checked).
    last_out: std::sync::atomic::AtomicUsize,
    /// QP pair rings offered and not answered yet, by nonce ([`pair`]).
    pair_offers: Mutex<Vec<(u64, std::sync::Weak<pair::PairShared>)>>,
    /// QP pair rings this device's QPs write, at most [`MAX_PAIRS`] (a count).
    pairs_out: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// What the QP pair rings written carried ([`Lanes::pair_sent`]), with what those gone
    /// had carried (records, bytes); the same of the rings read ([`Lanes::pair_received`]).
    pair_counts: Mutex<PairTally>,
    pair_rx_counts: Mutex<PairTally>,
}

/// The counts of live QP pair rings, and the sum of those gone (records, bytes).
type PairTally = (Vec<Arc<pair::PairCounts>>, (u64, u64));

/// The records and bytes of `t`'s rings, live and gone (those gone since the last look are
/// folded into the sum).
fn tally(t: &Mutex<PairTally>) -> (u64, u64) {
    let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
    let (counts, gone) = &mut *t;
    counts.retain(|c| {
        if Arc::strong_count(c) > 1 {
            return true;
        }
        let (r, b) = c.get();
        gone.0 += r;
        gone.1 += b;
        false
    });
    counts.iter().fold(*gone, |(r, b), c| {
        let (r2, b2) = c.get();
        (r + r2, b + b2)
    })
}

/// QP pair rings a device's QPs may write at once (each is [`pair::PAIR_CAP`] of memory on
/// both sides); further QPs send their records through the device lane.
const MAX_PAIRS: usize = 1024;

/// A destination (device socket address, slot) and its lane.
struct Out {
    ip: SocketAddr,
    slot: u8,
    state: OutState,
}

enum OutState {
    /// Offered, not answered yet.
    Offered {
        nonce: u64,
        at: Instant,
        lane: OutLane,
    },
    Up(OutLane),
    /// Packets go on the wire, and no lane is offered, until then.
    Wire {
        until: Instant,
    },
}

struct OutLane {
    prod: Producer,
    bell: Arc<OwnedFd>,
    /// Cleared when the lane goes (the QP pair rings beside it stop: see [`pair`]).
    alive: Arc<AtomicBool>,
    /// Pushed to since the last publication.
    dirty: bool,
    /// The receiving process said it takes work-request records ([`WR_RECORD`]).
    records: bool,
}

/// Direct access to the ring of one lane that is up ([`Lanes::writer`]), holding the
/// device's outbound lanes; publishes what was committed, if anything, when dropped.
pub(crate) struct LaneWriter<'a> {
    out: MutexGuard<'a, Vec<Out>>,
    i: usize,
}

impl LaneWriter<'_> {
    #[inline]
    fn lane(&mut self) -> Option<&mut OutLane> {
        match &mut self.out[self.i].state {
            OutState::Up(l) => Some(l),
            _ => None,
        }
    }

    /// Room for a packet of at most `max` bytes at the ring's head ([`Producer::reserve`]);
    /// `None` when the ring is full (or its peer corrupted it).
    #[inline]
    pub(crate) fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        self.lane()?.prod.reserve(max).ok().flatten()
    }

    /// Waits up to `wait` for room for a packet of `max` bytes in a full ring (publishing
    /// what was committed first, so that the receiver can take it), yielding the processor
    /// meanwhile. Returns whether there is room now.
    pub(crate) fn wait_for_room(&mut self, max: usize, wait: Duration) -> bool {
        let Some(l) = self.lane() else {
            return false;
        };
        l.publish();
        l.prod.wait_for_room(max, wait)
    }

    /// Makes what was committed visible now (see [`LaneWriter`]'s drop), if anything was.
    #[inline]
    pub(crate) fn publish(&mut self) {
        if let Some(l) = self.lane().filter(|l| l.dirty) {
            l.publish();
        }
    }

    /// Whether the receiver said it sleeps at its last look (a hint; see
    /// [`Producer::consumer_sleeps`]); `true` for a lane that is not up.
    #[inline]
    pub(crate) fn receiver_sleeps(&mut self) -> bool {
        self.lane().is_none_or(|l| l.prod.consumer_sleeps())
    }

    /// Queues the first `len` bytes of the reserved room as a packet ([`Producer::commit`]).
    #[inline]
    pub(crate) fn commit(&mut self, len: usize) {
        if let Some(l) = self.lane() {
            l.prod.commit(len);
            l.dirty = true;
        }
    }
}

impl Drop for LaneWriter<'_> {
    fn drop(&mut self) {
        // (Nothing committed since the last publication: nothing to show or wake for, and
        // no fence for a QP that found nothing to send.)
        self.publish();
    }
}

impl Drop for OutLane {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
    }
}

impl OutLane {
    /// Makes what was queued visible and wakes the receiver when it sleeps.
    #[inline]
    fn publish(&mut self) {
        self.dirty = false;
        if self.prod.publish() {
            ring_bell(&self.bell);
        }
    }
}

/// A lane this device receives from.
pub(crate) struct InLane {
    /// The sending device (its packets' source, for the checks).
    pub(crate) src: SocketAddr,
    /// The sending process's slot on that device.
    pub(crate) slot: u8,
    pub(crate) cons: Consumer,
    bell: Arc<OwnedFd>,
    /// The producer wrote nonsense: the lane is closed at the next look.
    pub(crate) corrupt: bool,
    /// Nothing was taken from the lane yet (see `rx::take_lanes`: its first records wait one
    /// look, so that what its sender put on the wire before the lane was up goes first).
    pub(crate) fresh: bool,
    /// The QP pair rings from the same process ([`pair`]): drained before the lane hands
    /// their QP anything.
    pub(crate) pairs: Vec<Arc<pair::PairRx>>,
}

impl InLane {
    /// Whether records wait in the lane or in one of its QP pair rings.
    #[inline]
    fn pending(&self) -> bool {
        self.cons.pending() || self.pairs.iter().any(|p| p.pending())
    }

    /// The QP pair ring of QP `qpn` from this lane's process, if any.
    #[inline]
    pub(crate) fn pair_of(&self, qpn: u32) -> Option<&Arc<pair::PairRx>> {
        self.pairs.iter().find(|p| p.qpn == qpn)
    }
}

/// A bell the progress thread watches: an inbound lane's (wake-ups and hang-up) or an
/// outbound one's (hang-up only).
pub(crate) struct Bell {
    pub(crate) fd: Arc<OwnedFd>,
    pub(crate) inbound: bool,
}

impl Lanes {
    /// The lanes of the device at `local`, where this process holds `slot`; off when
    /// `SOFTRDMA_TRANSPORT=wire`.
    pub(crate) fn new(local: SocketAddr, slot: u8) -> Lanes {
        Lanes {
            on: !wire_forced(),
            local,
            slot,
            out: Mutex::new(Vec::new()),
            inbound: Mutex::new(Vec::new()),
            any_inbound: AtomicBool::new(false),
            inbound_from: Mutex::new(Vec::new()),
            records_gen: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            gen: AtomicU64::new(0),
            nonces: AtomicU64::new(u64::from(crate::gid::random_u32()) << 32),
            last_out: std::sync::atomic::AtomicUsize::new(usize::MAX),
            pair_offers: Mutex::new(Vec::new()),
            pairs_out: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            pair_counts: Mutex::new((Vec::new(), (0, 0))),
            pair_rx_counts: Mutex::new((Vec::new(), (0, 0))),
        }
    }

    /// Stops (`true`) or resumes taking packets from the inbound lanes, as a receiver that
    /// falls behind would (their producers find the rings full), for tests of flow control.
    /// While paused, what a lane holds is not taken before a MAD either.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether the lanes are paused ([`Lanes::set_paused`]).
    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Whether lanes may carry packets.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Puts each of the `count` packets `pkt(i)` (the UDP payload and its destination) whose
    /// destination has a lane up into it, and the indices of the others into `keep` (room
    /// for `count`), in order: those go on the wire, as do the packets `wire_only(i)` names.
    /// Returns how many are kept and how many took a lane.
    pub(crate) fn route<'a>(
        &self,
        count: usize,
        pkt: &impl Fn(usize) -> (&'a [u8], SocketAddr),
        wire_only: &impl Fn(usize) -> bool,
        keep: &mut [usize],
    ) -> (usize, usize) {
        debug_assert!(count <= keep.len());
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let (mut kept, mut laned) = (0, 0);
        let mut last = usize::MAX;
        for i in 0..count {
            let (p, dst) = pkt(i);
            // The slot byte of the destination QP (0: QP 1; 255: multicast).
            let slot = if p.len() > 8 { p[5] } else { 0 };
            if slot != 0
                && slot != 0xff
                && !wire_only(i)
                && self.push(&mut out, &mut last, dst, slot, p)
            {
                laned += 1;
            } else {
                keep[kept] = i;
                kept += 1;
            }
        }
        if laned > 0 {
            for o in out.iter_mut() {
                if let OutState::Up(l) = &mut o.state {
                    if l.dirty {
                        l.publish();
                    }
                }
            }
        }
        (kept, laned)
    }

    /// Offers a lane to (`dst`, `slot`) now when none is up or offered (and the wait after a
    /// refusal or a hang-up is over), so that it is up by the time packets go there: a QP
    /// connected to a QP of this host asks at RTR, not at its first packet (which, with the
    /// ones behind it until the answer came, went on the wire). Never fails.
    pub(crate) fn prepare(&self, dst: SocketAddr, slot: u8) {
        if !self.on || slot == 0 || slot == 0xff {
            return;
        }
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = usize::MAX;
        let _ = self.up(&mut out, &mut last, dst, slot);
    }

    /// Whether packets to (`dst`, `slot`) go on the wire for now: lanes are off, or the
    /// destination is not on this host (or refused a lane), as learned from the last offer
    /// (no side effect: nothing is offered). `false` while that is not known yet.
    pub(crate) fn known_remote(&self, dst: SocketAddr, slot: u8) -> bool {
        if !self.on {
            return true;
        }
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.iter()
            .any(|o| o.ip == dst && o.slot == slot && matches!(o.state, OutState::Wire { .. }))
    }

    /// Whether a lane to (`dst`, `slot`) is up now (no side effect: nothing is offered).
    pub(crate) fn is_up(&self, dst: SocketAddr, slot: u8) -> bool {
        if !self.on || slot == 0 || slot == 0xff {
            return false;
        }
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.iter()
            .any(|o| o.ip == dst && o.slot == slot && matches!(o.state, OutState::Up(_)))
    }

    /// Whether work-request records may go to the process holding `slot` of the device at
    /// `dst`: a lane to it is up, it said it takes such records, and a lane from it to this
    /// process is up too (for their acknowledgements). Never fails; offers nothing.
    pub(crate) fn records_ready(&self, dst: SocketAddr, slot: u8) -> bool {
        if !self.on {
            return false;
        }
        let out_ok = {
            let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            out.iter().any(|o| {
                o.ip == dst && o.slot == slot && matches!(&o.state, OutState::Up(l) if l.records)
            })
        };
        out_ok
            && self
                .inbound_from
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(dst.ip(), slot))
    }

    /// Records the senders of the inbound lanes `inb` that brought something (see
    /// `inbound_from`).
    pub(crate) fn note_inbound(&self, inb: &[InLane]) {
        self.records_gen.fetch_add(1, Ordering::Release);
        let mut from = self.inbound_from.lock().unwrap_or_else(|p| p.into_inner());
        from.clear();
        // Only lanes that brought something, or whose producer offered a QP pair ring beside
        // them (it does so only with its lane up): their producer's lane is up on its side,
        // so answers can come back through it. A lane just accepted may still be an offer
        // there, waiting for its answer to be read. (A producer whose records all take pair
        // rings may never write into its lane.)
        from.extend(
            inb.iter()
                .filter(|l| !l.fresh || !l.pairs.is_empty())
                .map(|l| (l.src.ip(), l.slot)),
        );
    }

    /// The ring of the lane to (`dst`, `slot`) when one is up, for a sender that writes its
    /// packets straight into it ([`LaneWriter::reserve`]); what it queued is published
    /// (waking the receiver when it sleeps) when the writer is dropped. Other senders to any
    /// lane of the device wait meanwhile. `None` when no lane is up there; one is offered
    /// then, as [`Lanes::route`] does.
    pub(crate) fn writer(&self, dst: SocketAddr, slot: u8) -> Option<LaneWriter<'_>> {
        if slot == 0 || slot == 0xff {
            return None;
        }
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // Nearly always the destination written to last, up: no search, no state to move.
        let hint = self.last_out.load(Ordering::Relaxed);
        if out
            .get(hint)
            .is_some_and(|o| o.ip == dst && o.slot == slot && matches!(o.state, OutState::Up(_)))
        {
            return Some(LaneWriter { out, i: hint });
        }
        self.writer_slow(out, dst, slot)
    }

    /// [`Lanes::writer`] for a destination other than the last one, or not up.
    #[inline(never)]
    fn writer_slow<'a>(
        &'a self,
        mut out: MutexGuard<'a, Vec<Out>>,
        dst: SocketAddr,
        slot: u8,
    ) -> Option<LaneWriter<'a>> {
        let mut last = usize::MAX;
        let i = self.up(&mut out, &mut last, dst, slot)?;
        if !matches!(out[i].state, OutState::Up(_)) {
            return None;
        }
        self.last_out.store(i, Ordering::Relaxed);
        Some(LaneWriter { out, i })
    }

    /// The index in `out` of the lane to (`ip`, `slot`) when it is up. Otherwise moves the
    /// destination on: offers a lane when none was offered (or the wait after a refusal or a
    /// hang-up is over), gives up an offer not answered in time. `last` is the index of the
    /// destination of the packet before (checked first, then updated).
    fn up(
        &self,
        out: &mut MutexGuard<'_, Vec<Out>>,
        last: &mut usize,
        ip: SocketAddr,
        slot: u8,
    ) -> Option<usize> {
        if !self.on {
            return None;
        }
        let i = match out.get(*last) {
            Some(o) if o.ip == ip && o.slot == slot => *last,
            _ => match out.iter().position(|o| o.ip == ip && o.slot == slot) {
                Some(i) => i,
                None => {
                    let state = self.offer(ip, slot);
                    out.push(Out { ip, slot, state });
                    *last = usize::MAX;
                    return None;
                }
            },
        };
        *last = i;
        let o = &mut out[i];
        match &o.state {
            OutState::Up(_) => return Some(i),
            OutState::Offered { at, .. } => {
                if at.elapsed() > OFFER_WAIT {
                    o.state = OutState::Wire {
                        until: Instant::now() + NOT_LOCAL_FOR,
                    };
                }
            }
            OutState::Wire { until } => {
                if Instant::now() >= *until {
                    o.state = self.offer(ip, slot);
                }
            }
        }
        None
    }

    /// Puts `p` into the lane to (`ip`, `slot`) if one is up (see [`Lanes::up`]); a full
    /// ring is waited for [`FULL_WAIT`] at most. `last` as for [`Lanes::up`].
    fn push(
        &self,
        out: &mut MutexGuard<'_, Vec<Out>>,
        last: &mut usize,
        ip: SocketAddr,
        slot: u8,
        p: &[u8],
    ) -> bool {
        let Some(i) = self.up(out, last, ip, slot) else {
            return false;
        };
        let o = &mut out[i];
        let OutState::Up(l) = &mut o.state else {
            return false;
        };
        match l.prod.push(p) {
            Ok(true) => {
                l.dirty = true;
                true
            }
            Ok(false) => {
                // Full: the consumer runs (or is being woken); wait a moment for room.
                l.publish();
                let end = Instant::now() + FULL_WAIT;
                loop {
                    std::thread::yield_now();
                    match l.prod.push(p) {
                        Ok(true) => {
                            l.dirty = true;
                            return true;
                        }
                        Ok(false) if Instant::now() < end => {}
                        Ok(false) => return false,
                        Err(Corrupt) => break,
                    }
                }
                self.close_out(o, AFTER_HANGUP);
                false
            }
            Err(Corrupt) => {
                tracing::warn!(%ip, slot, "a same-host lane's ring is corrupt: closed");
                self.close_out(o, AFTER_HANGUP);
                false
            }
        }
    }

    fn close_out(&self, o: &mut Out, for_: Duration) {
        o.state = OutState::Wire {
            until: Instant::now() + for_,
        };
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// A number that changes whenever [`Lanes::records_ready`] may have changed its answer.
    #[inline]
    pub(crate) fn records_generation(&self) -> u64 {
        self.records_gen.load(Ordering::Acquire)
    }

    /// The generation of the set of bells (changes when a lane comes or goes).
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// The bells to watch now.
    pub(crate) fn bells(&self, v: &mut Vec<Bell>) {
        v.clear();
        for l in self
            .inbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            v.push(Bell {
                fd: l.bell.clone(),
                inbound: true,
            });
        }
        for o in self.out.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let OutState::Up(l) = &o.state {
                v.push(Bell {
                    fd: l.bell.clone(),
                    inbound: false,
                });
            }
        }
    }

    /// The bell `fd` hung up (its other process is gone or dropped the lane): the lane goes.
    /// An inbound lane's remaining records must have been received before.
    pub(crate) fn hung_up(&self, fd: RawFd, inbound: bool) {
        if inbound {
            let mut inb = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
            for l in inb.iter().filter(|l| l.bell.as_raw_fd() == fd) {
                // (What they held was taken with the lane's rest.)
                l.pairs.iter().for_each(|p| p.close());
            }
            inb.retain(|l| l.bell.as_raw_fd() != fd);
            self.any_inbound.store(!inb.is_empty(), Ordering::Release);
            self.note_inbound(&inb);
        } else {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            for o in out.iter_mut() {
                if matches!(&o.state, OutState::Up(l) if l.bell.as_raw_fd() == fd) {
                    tracing::debug!(ip = %o.ip, slot = o.slot, "a same-host lane's receiver is gone");
                    o.state = OutState::Wire {
                        until: Instant::now() + AFTER_HANGUP,
                    };
                }
            }
            self.records_gen.fetch_add(1, Ordering::Release);
        }
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Runs `f` on the inbound lanes (under their lock) when there are any.
    #[inline]
    pub(crate) fn with_inbound<R>(&self, f: impl FnOnce(&mut Vec<InLane>) -> R) -> Option<R> {
        if !self.any_inbound.load(Ordering::Acquire) || self.paused.load(Ordering::Relaxed) {
            return None;
        }
        let mut inb = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut inb);
        if inb.iter().any(|l| l.corrupt) {
            tracing::warn!("a same-host lane's ring is corrupt: closed");
            for l in inb.iter().filter(|l| l.corrupt) {
                l.pairs.iter().for_each(|p| p.close());
            }
            inb.retain(|l| !l.corrupt);
            self.any_inbound.store(!inb.is_empty(), Ordering::Release);
            self.note_inbound(&inb);
            self.gen.fetch_add(1, Ordering::Release);
        }
        Some(r)
    }

    /// Whether records wait in an inbound lane (or a QP pair ring beside one).
    pub(crate) fn pending(&self) -> bool {
        self.with_inbound(|inb| inb.iter().any(InLane::pending))
            .unwrap_or(false)
    }

    /// The progress thread is about to sleep: asks every inbound lane's producer (and every
    /// QP pair ring's) for a wake-up. Returns `false` (and nothing is armed for sure) when
    /// records wait already.
    pub(crate) fn arm(&self) -> bool {
        self.with_inbound(|inb| {
            inb.iter()
                .all(|l| l.cons.arm() && l.pairs.iter().all(|p| p.arm()))
        })
        .unwrap_or(true)
    }

    /// The progress thread is awake: producers need not ring.
    pub(crate) fn disarm(&self) {
        self.with_inbound(|inb| {
            inb.iter().for_each(|l| {
                l.cons.disarm();
                l.pairs.iter().for_each(|p| p.disarm());
            })
        });
    }

    /// A ring for the records of QP `src_qpn` of this device to QP `dest_qpn` of the process
    /// holding `slot` of the device at `dst`, offered to that process (see [`pair`]); `None`
    /// when no lane to it is up, too many pair rings are out, or the ring could not be made
    /// or offered.
    pub(crate) fn offer_pair(
        &self,
        dst: SocketAddr,
        slot: u8,
        src_qpn: u32,
        dest_qpn: u32,
    ) -> Option<pair::PairTx> {
        if !self.on || !pair::pair_rings() {
            return None;
        }
        let (watch, alive, bell) = {
            let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let o = out.iter().find(|o| o.ip == dst && o.slot == slot)?;
            let OutState::Up(l) = &o.state else {
                return None;
            };
            (l.prod.watch(), l.alive.clone(), l.bell.clone())
        };
        self.make_pair_offer(dst, slot, src_qpn, dest_qpn, watch, alive, bell)
    }

    /// The work-request records sent through this device's QP pair rings so far, and their
    /// bytes (for the device's counters).
    pub(crate) fn pair_sent(&self) -> (u64, u64) {
        tally(&self.pair_counts)
    }

    /// The work-request records taken from the QP pair rings this device reads, and their
    /// bytes (for the device's counters).
    pub(crate) fn pair_received(&self) -> (u64, u64) {
        tally(&self.pair_rx_counts)
    }
}

/// Reads the wake-ups waiting on a bell.
pub(crate) fn drain_bell(fd: RawFd) {
    let mut b = [0u8; 64];
    // SAFETY: reads into a live buffer from a descriptor the caller keeps open.
    while unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) } > 0 {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::{bth, immdt, reth, roce};

    #[test]
    fn a_destination_with_no_device_of_this_host_is_known_remote_once_offered() {
        let at = |ip: std::net::Ipv4Addr| SocketAddr::new(IpAddr::V4(ip), 4791);
        let lanes = Lanes::new(at(crate::testing::unique_loopback_addr()), 1);
        // (No device of this host holds this address.)
        let dst = at(crate::testing::unique_loopback_addr());
        if !lanes.on() {
            assert!(lanes.known_remote(dst, 3), "lanes off: every destination");
            return;
        }
        assert!(!lanes.known_remote(dst, 3), "not known before an offer");
        lanes.prepare(dst, 3);
        assert!(lanes.known_remote(dst, 3), "no device there: the wire");
        assert!(!lanes.is_up(dst, 3));
        assert!(!lanes.known_remote(dst, 4), "another slot: not known yet");
    }

    #[test]
    fn a_packet_of_the_largest_same_host_segment_fits_one_udp_datagram() {
        // The most a segmented RC or UC request packet carries besides its payload: BTH,
        // RETH and immediate data (an RDMA WRITE with immediate in one packet), up to 3 bytes
        // of pad, the ICRC.
        let most = bth::HEADER_LEN + reth::HEADER_LEN + immdt::HEADER_LEN + 3 + roce::ICRC_LEN;
        // A UDP datagram over IPv4 (a 20-byte header, no options) carries at most 65,507
        // bytes; over IPv6, 65,527.
        assert!(SAME_HOST_SEGMENT_MAX as usize + most <= 65_535 - 20 - 8);
        // A whole number of 256-byte blocks (the largest such that fits, see its doc).
        assert_eq!(SAME_HOST_SEGMENT_MAX % 256, 0);
    }
}
