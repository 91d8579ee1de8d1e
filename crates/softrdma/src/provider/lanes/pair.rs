//! A QP pair's own ring: the work-request records (`verbs::records`) of one RC QP to its peer
//! on this host, beside the device's lane to that process, so that the peer's CQ poll finds
//! them with one look at a ring of its own (no lanes' lock, no walk over the lanes, no QP
//! lookup) and the sender writes them under its QP's lock only.
//!
//! **Order.** The QP's packets still take the device's lane; its records take the pair's
//! ring only while that lane holds nothing unread ([`PairTx::writable`]: everything the
//! device published there has been taken, so nothing of this QP written before is still in
//! it), and the reader drains the pair's ring before it hands the QP anything from the lane
//! (`rx::take_lanes`: whatever was written to the ring before a later lane item is published
//! before it, so it is seen). The two channels then read as one, in the order written. A
//! record that finds the lane busy goes through the lane, as before pair rings.
//!
//! **Set-up.** The sender makes the ring (a memfd, [`PAIR_CAP`] bytes) and offers it over the
//! owner's slot socket with the two QP numbers; the owner maps it and hands it to the QP
//! (which takes it only if it is an RC QP connected to that QP of that device), then answers.
//! Records take the ring once the answer says yes. Wake-ups go through the device lane's
//! bell (the reader's progress thread watches it already).
//!
//! **End.** The reader closes the ring when its QP leaves the connection (RESET, destroy):
//! the sender sees it and goes back to the lane (whose records to a QP that is gone are
//! refused, as before). The sender drops its end when its QP resets or the lane to that
//! process goes (the process died, or the lane was closed): the reader's progress thread
//! drops a dead lane's pair rings with it.

use super::ring::{ring_bell, Consumer, Peek, Producer, Watch};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Bytes of records in a pair's ring: a request of up to 4 KiB with its answers, many times
/// over (records go one request at a time).
pub(crate) const PAIR_CAP: usize = 1 << 16;

/// Whether this process gives QP pairs rings of their own: yes unless the environment says
/// `SOFTRDMA_PAIR_RINGS=0` (read once). Never fails.
///
/// Off by default until 2026-11-28: a program that takes the completion of its RDMA WRITE
/// and then spins on memory for the peer's answer (perftest `ib_write_lat`) waited for the
/// progress thread's hand-off at one round trip in 200 (99.9th percentile 510-530 µs on 2
/// cores): every 256th CQ poll that took records also looked at the device, and that look
/// sent the ACK held for the program's answer ahead of it. Without that (BENCHMARKS.md, "On
/// 16 cores"), perftest on the drop-in libraries, 16 cores, rings on against off: `ib_write_lat`
/// t_avg 1.21-1.24 against 1.55-1.80 µs pinned, 99th percentile 1.2-2.0 against 5.4-6.6
/// unpinned; `ib_send_lat` 99th percentile 1.8-2.0 against 3.7-3.8 unpinned; `softrdma perf
/// send --lat` one way 0.99 against 1.27 µs, two processes pinned.
pub(crate) fn pair_rings() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_PAIR_RINGS").map_or(true, |v| v.trim() != "0"))
}

/// Offered, not answered yet.
const OFFERED: u8 = 0;
/// Accepted: records may take the ring.
const UP: u8 = 1;
/// Refused, or the offer could not be answered.
const DEAD: u8 = 2;

/// What the offer's answer sets (shared with the device's table of offers).
pub(crate) struct PairShared {
    state: AtomicU8,
}

impl PairShared {
    pub(super) fn new() -> PairShared {
        PairShared {
            state: AtomicU8::new(OFFERED),
        }
    }

    /// The answer came: accepted or not.
    pub(crate) fn answered(&self, accepted: bool) {
        self.state
            .store(if accepted { UP } else { DEAD }, Ordering::Release);
    }
}

/// How long an offer may wait for its answer before the ring is given up.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The sending end of a QP pair's ring, held by the QP (under its lock).
pub(crate) struct PairTx {
    prod: Producer,
    shared: Arc<PairShared>,
    offered_at: Instant,
    /// The device lane to the same process: records take the pair's ring only while it holds
    /// nothing unread.
    lane: Watch,
    /// Cleared when that lane goes (`OutLane`'s drop).
    lane_alive: Arc<AtomicBool>,
    /// That lane's bell (the reader's progress thread watches it); not kept open by this
    /// ring: when the lane goes, its bell closes and the reader sees it hang up.
    bell: Weak<OwnedFd>,
    dirty: bool,
    /// What this ring carried, for the device's counters (which add it up when read).
    counts: Arc<PairCounts>,
    /// The device's count of pair rings out (one less when this one goes).
    count: Arc<AtomicUsize>,
}

impl Drop for PairTx {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PairTx {
    /// (`count` already counts this ring.)
    pub(super) fn new(
        prod: Producer,
        shared: Arc<PairShared>,
        lane: Watch,
        lane_alive: Arc<AtomicBool>,
        bell: Arc<OwnedFd>,
        count: Arc<AtomicUsize>,
        counts: Arc<PairCounts>,
    ) -> PairTx {
        PairTx {
            count,
            counts,
            prod,
            shared,
            offered_at: Instant::now(),
            lane,
            lane_alive,
            bell: Arc::downgrade(&bell),
            dirty: false,
        }
    }

    /// Whether records may take the ring now: accepted, the reader still reads it, the
    /// device lane is up and holds nothing unread (see the module's notes on order).
    #[inline]
    pub(crate) fn writable(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == UP
            && self.lane_alive.load(Ordering::Relaxed)
            && !self.prod.closed()
            && self.lane.consumed()
    }

    /// Whether the ring can never be written again (refused, unanswered for too long, closed
    /// by its reader, or its lane gone): the QP drops it.
    pub(crate) fn dead(&self) -> bool {
        match self.shared.state.load(Ordering::Acquire) {
            DEAD => true,
            OFFERED => self.offered_at.elapsed() > ANSWER_WAIT,
            _ => !self.lane_alive.load(Ordering::Relaxed) || self.prod.closed(),
        }
    }

    /// Room for a record of up to `max` bytes (`None`: the ring is full, or its reader wrote
    /// nonsense).
    #[inline]
    pub(crate) fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        self.prod.reserve(max).ok().flatten()
    }

    /// Queues the record written into the room reserved last, `len` bytes.
    #[inline]
    pub(crate) fn commit_record(&mut self, len: usize) {
        self.prod.commit(len);
        self.dirty = true;
        self.counts.add(len as u64);
    }

    /// Waits up to `wait` for room for `max` bytes (publishing first); whether there is.
    pub(crate) fn wait_for_room(&mut self, max: usize, wait: Duration) -> bool {
        self.publish();
        self.prod.wait_for_room(max, wait)
    }

    /// Makes what was committed visible, and wakes the reader's progress thread when it
    /// sleeps.
    #[inline]
    pub(crate) fn publish(&mut self) {
        if std::mem::take(&mut self.dirty) && self.prod.publish() {
            if let Some(b) = self.bell.upgrade() {
                ring_bell(&b);
            }
        }
    }
}

/// The records a QP pair ring carried and their bytes: written by its one sender (under its
/// QP's lock: plain loads and stores, no locked instruction per record), read by whoever
/// reads the device's counters.
#[derive(Default)]
pub(crate) struct PairCounts {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl PairCounts {
    #[inline]
    fn add(&self, bytes: u64) {
        let r = &self.records;
        r.store(r.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let b = &self.bytes;
        b.store(b.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
    }

    /// Records and bytes so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.records.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// The reading end of a QP pair's ring, shared by the QP's CQs (their polls read it) and the
/// device's lane from the same process (its reader drains it before it hands the QP
/// anything).
pub(crate) struct PairRx {
    /// The QP the records are for.
    pub(crate) qpn: u32,
    /// The sending device.
    pub(crate) src: SocketAddr,
    cons: Mutex<Consumer>,
    peek: Peek,
    /// The consumer's position (a copy, stored under `cons`'s lock).
    next: AtomicU64,
    closed: AtomicBool,
    /// What was taken (written under `cons`'s lock), for the device's counters.
    counts: Arc<PairCounts>,
}

/// Records taken from a pair's ring per look at most.
const RUN: usize = 16;

impl PairRx {
    pub(super) fn new(
        qpn: u32,
        src: SocketAddr,
        cons: Consumer,
        counts: Arc<PairCounts>,
    ) -> PairRx {
        PairRx {
            counts,
            qpn,
            src,
            peek: cons.peek(),
            next: AtomicU64::new(cons.tail()),
            cons: Mutex::new(cons),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether a published record waits (one load when none does).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.peek.published(self.next.load(Ordering::Acquire))
            && !self.closed.load(Ordering::Relaxed)
    }

    /// Takes what the ring holds, in runs of at most 16 records, each handed to `f` (which
    /// carries them out) before the next is read; returns how many. With `wait`, waits for
    /// another reader to finish its look first; otherwise a look already under way is left
    /// to finish alone (0). Records a peer made nonsense of close the ring.
    pub(crate) fn take(&self, wait: bool, mut f: impl FnMut(&[&[u8]])) -> usize {
        if self.closed.load(Ordering::Relaxed) {
            return 0;
        }
        let mut c = if wait {
            self.cons.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            match self.cons.try_lock() {
                Ok(c) => c,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return 0,
            }
        };
        let mut total = 0;
        loop {
            let mut pos = c.tail();
            let mut run: [&[u8]; RUN] = [&[]; RUN];
            let mut n = 0;
            let mut corrupt = false;
            while n < RUN {
                match c.record_at(pos) {
                    Ok(Some((r, next))) => {
                        run[n] = r;
                        n += 1;
                        pos = next;
                    }
                    Ok(None) => break,
                    Err(super::ring::Corrupt) => {
                        corrupt = true;
                        break;
                    }
                }
            }
            if n > 0 {
                for r in &run[..n] {
                    self.counts.add(r.len() as u64);
                }
                // (What came before the nonsense is carried out.) A panic while they are
                // carried out still releases them: never carried out twice.
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    f(&run[..n]);
                }));
                total += n;
                c.release(pos);
                self.next.store(pos, Ordering::Release);
                if let Err(p) = done {
                    drop(c);
                    std::panic::resume_unwind(p);
                }
            }
            if corrupt {
                tracing::warn!(qpn = self.qpn, "a QP pair's ring is corrupt: closed");
                self.closed.store(true, Ordering::Relaxed);
                c.close();
                return total;
            }
            if n < RUN {
                return total;
            }
        }
    }

    /// Reads no more: the sender is told (it goes back to the lane). Takes no lock (its QP's
    /// lock may be held); the CQs and the lane that list the ring drop it at their next look.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.peek.close();
    }

    /// Whether the ring was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// About to sleep: asks the sender for a wake-up; `false` when records wait already.
    pub(super) fn arm(&self) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return true;
        }
        self.cons.lock().unwrap_or_else(|p| p.into_inner()).arm()
    }

    /// Awake: no wake-up needed.
    pub(super) fn disarm(&self) {
        if let Ok(c) = self.cons.try_lock() {
            c.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (PairTx, PairRx, Producer, Consumer) {
        let (prod, fd) = Producer::create(PAIR_CAP).unwrap();
        let cons = Consumer::open(&fd).unwrap();
        // A device lane beside it.
        let (lane_p, lane_fd) = Producer::create(1 << 16).unwrap();
        let lane_c = Consumer::open(&lane_fd).unwrap();
        // (A bell that is not a socket: a wake-up rung into it goes nowhere.)
        let a: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let shared = Arc::new(PairShared::new());
        let tx = PairTx::new(
            prod,
            shared,
            lane_p.watch(),
            Arc::new(AtomicBool::new(true)),
            Arc::new(a),
            Arc::new(AtomicUsize::new(1)),
            Arc::new(PairCounts::default()),
        );
        let rx = PairRx::new(
            7,
            "127.0.0.1:4791".parse().unwrap(),
            cons,
            Arc::new(PairCounts::default()),
        );
        (tx, rx, lane_p, lane_c)
    }

    fn write(tx: &mut PairTx, b: &[u8]) {
        let buf = tx.reserve(b.len()).expect("room");
        buf.copy_from_slice(b);
        tx.commit_record(b.len());
        tx.publish();
    }

    #[test]
    fn records_take_the_ring_only_once_accepted_and_while_the_lane_is_read() {
        let (mut tx, rx, mut lane_p, mut lane_c) = pair();
        assert!(!tx.writable(), "offered, not answered");
        assert!(!tx.dead());
        tx.shared.answered(true);
        assert!(tx.writable());
        // Something unread in the device lane: not writable until it is taken.
        assert!(lane_p.push(b"packet").unwrap());
        lane_p.publish();
        assert!(!tx.writable());
        let (_, next) = lane_c.record_at(lane_c.tail()).unwrap().unwrap();
        lane_c.release(next);
        assert!(tx.writable());
        // Records cross in order, in runs.
        for i in 0..40u8 {
            write(&mut tx, &[i; 3]);
        }
        assert!(rx.pending());
        let mut got = Vec::new();
        let mut runs = 0;
        assert_eq!(
            rx.take(false, |run| {
                runs += 1;
                got.extend(run.iter().map(|r| r.to_vec()));
            }),
            40
        );
        assert_eq!(runs, 3, "16, 16 and 8");
        assert!(got.iter().enumerate().all(|(i, r)| r == &[i as u8; 3]));
        assert!(!rx.pending());
        assert_eq!(tx.counts.get(), (40, 120));
    }

    #[test]
    fn records_whose_handling_panicked_are_not_carried_out_again() {
        let (mut tx, rx, _lp, _lc) = pair();
        tx.shared.answered(true);
        write(&mut tx, b"first");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rx.take(false, |_| panic!("carrying it out failed"));
        }));
        assert!(r.is_err());
        write(&mut tx, b"second");
        let mut got = Vec::new();
        assert_eq!(
            rx.take(false, |run| got.extend(run.iter().map(|r| r.to_vec()))),
            1
        );
        assert_eq!(got, vec![b"second".to_vec()]);
    }

    #[test]
    fn a_closed_ring_is_dead_to_its_sender_and_a_refused_one_too() {
        let (mut tx, rx, _lp, _lc) = pair();
        tx.shared.answered(true);
        write(&mut tx, b"x");
        rx.close();
        assert!(rx.is_closed());
        assert!(!rx.pending(), "a closed ring is not read");
        assert_eq!(rx.take(true, |_| panic!("nothing is taken")), 0);
        assert!(!tx.writable());
        assert!(tx.dead());
        let (tx, _rx, _lp, _lc) = pair();
        tx.shared.answered(false);
        assert!(tx.dead() && !tx.writable());
        let (tx, _rx, _lp, _lc) = pair();
        tx.shared.answered(true);
        tx.lane_alive.store(false, Ordering::Relaxed);
        assert!(tx.dead() && !tx.writable(), "its lane went");
    }

    #[test]
    fn a_reader_that_finds_nonsense_closes_the_ring() {
        let (mut tx, rx, _lp, _lc) = pair();
        tx.shared.answered(true);
        write(&mut tx, b"fine");
        // A length past the ring's quarter in the next record, published.
        let buf = tx.reserve(8).unwrap();
        buf.copy_from_slice(b"12345678");
        tx.commit_record(8);
        tx.prod.corrupt_last_length_for_test(u32::MAX - 1);
        tx.publish();
        let mut got = 0;
        rx.take(false, |run| got += run.len());
        assert_eq!(got, 1, "the good record only");
        assert!(rx.is_closed());
        assert!(tx.dead(), "the sender sees it closed");
    }
}
