//! The transmit side: batches of packets for one `sendmmsg`, with their ICRC, and the
//! device's [`Wire`]: its socket, wake-up eventfd, counters and fault injection, through
//! which every other part of the engine sends.

use super::counters::Counters;
use super::faults::{FaultConfig, Faults};
use super::fd::EventFd;
use super::lanes::{LaneWriter, Lanes};
use super::memory::Hold;
use super::sock::{Gap, UdpSock, ROCE_PORT};
use softrdma_proto::device::Sealer;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Room for one packet: the largest transport packet (4096-byte MTU + headers + ICRC) with
/// headroom.
pub(crate) const PKT_BUF: usize = 4096 + 128;
/// Datagrams per `sendmmsg` or `recvmmsg`.
pub(crate) const BATCH: usize = 64;

/// The most destinations whose ICRC prefixes a transmit batch keeps per source address.
const MAX_TX_FLOWS: usize = 4096;

/// The most gaps a packet may have ([`PacketGaps`]); further pieces of its payload are copied.
pub(crate) const MAX_GAPS: usize = 4;

/// The gaps of the packet being built into a [`TxBatch`]'s slot: pieces of its payload left
/// in the program's registered memory (offsets in the slot), each with the [`Hold`] that keeps
/// that memory valid. Handed to the batch with the packet ([`TxBatch::commit_gapped`]).
#[derive(Default)]
pub(crate) struct PacketGaps {
    gaps: [Option<(Gap, Hold)>; MAX_GAPS],
    n: usize,
}

impl PacketGaps {
    /// Whether another gap fits.
    #[inline]
    pub(crate) fn has_room(&self) -> bool {
        self.n < MAX_GAPS
    }

    /// Adds a gap: `len` bytes at `src` (memory `hold` keeps valid) stand at offset `at` of
    /// the packet, after the gaps added before. Ignored (the hold released) when none fits.
    #[inline]
    pub(crate) fn push(&mut self, at: usize, src: *const u8, len: usize, hold: Hold) {
        if self.n < MAX_GAPS {
            self.gaps[self.n] = Some((Gap { at, src, len }, hold));
            self.n += 1;
        }
    }

    /// Forgets every gap (the packet was not sent), releasing their holds.
    #[inline]
    pub(crate) fn clear(&mut self) {
        for g in &mut self.gaps[..self.n] {
            *g = None;
        }
        self.n = 0;
    }
}

/// Packets being prepared for one `sendmmsg`, with the sealers of the devices they leave
/// from ([`Sealer`]: the ICRC of each packet for its flow).
///
/// A packet may leave pieces of its payload in the program's registered memory (its gaps,
/// [`TxBatch::commit_gapped`]): the ICRC is computed over that memory in place and the kernel
/// copies it from there, one copy of the payload less. The batch holds that memory (a lease
/// of its region) until the packet has gone; where a packet must be whole in its buffer (a
/// capture, fault injection) its gaps are filled first, and a packet with gaps never takes a
/// same-host lane.
pub(crate) struct TxBatch {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) lens: Vec<usize>,
    pub(super) dests: Vec<SocketAddr>,
    /// The address each packet leaves from, and whether it has its ICRC yet (packets get
    /// it when they go on the wire: a same-host lane needs none).
    srcs: Vec<IpAddr>,
    sealed: Vec<bool>,
    /// The gaps of each packet (none for most), in order of offset.
    gaps: Vec<Vec<Gap>>,
    /// What keeps the memory of every gap valid until the batch is sent.
    holds: Vec<Hold>,
    /// Packets with gaps, and the bytes of their gaps.
    gapped: usize,
    gap_bytes: usize,
    pub(super) count: usize,
    /// Bytes of the packets queued.
    bytes: usize,
    /// Whether every packet queued is an RC request or an RDMA READ response (a batch of
    /// nothing else may go to the device's transmit thread: see [`TxQueue`]).
    queueable: bool,
    /// Whether an RC or UC packet is queued (see [`TxBatch::has_ordered`]).
    ordered: bool,
    /// Packets of the batch to multicast groups (counted when it is sent).
    mcast: usize,
    /// One sealer per source address (a thread may send from several devices), the one of
    /// the last packet first: nearly every packet leaves from where the one before did.
    sealers: Vec<(IpAddr, Sealer)>,
}

/// Packets written straight into the ring of a same-host lane ([`Wire::direct_lane`]), one
/// copy less than through a [`TxBatch`]: published to the receiver, and counted as sent, when
/// dropped.
pub(crate) struct DirectTx<'a> {
    lane: LaneWriter<'a>,
    wire: &'a Wire,
    packets: usize,
    bytes: usize,
    records: usize,
}

impl DirectTx<'_> {
    /// Room for a packet of at most `max` bytes; `None` when the ring is full.
    #[inline]
    pub(crate) fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        self.lane.reserve(max)
    }

    /// Waits up to `wait` for room for a packet of `max` bytes in a full ring (see
    /// [`LaneWriter::wait_for_room`]); whether there is room now.
    pub(crate) fn wait_for_room(&mut self, max: usize, wait: std::time::Duration) -> bool {
        self.lane.wait_for_room(max, wait)
    }

    /// Makes the packets committed so far visible to the receiver now (waking it when it
    /// sleeps), before the writer is dropped; their payloads must be in place.
    #[inline]
    pub(crate) fn publish(&mut self) {
        self.lane.publish();
    }

    /// Whether the receiver sleeps (a hint: see [`LaneWriter::receiver_sleeps`]).
    #[inline]
    pub(crate) fn receiver_sleeps(&mut self) -> bool {
        self.lane.receiver_sleeps()
    }

    /// Queues the packet built in the reserved room, `len` bytes (at most the `max` of the
    /// reservation); a length under 4 (no packet) abandons the room.
    #[inline]
    pub(crate) fn commit(&mut self, len: usize) {
        if len >= 4 {
            self.lane.commit(len);
            self.packets += 1;
            self.bytes += len;
        }
    }

    /// Queues the work-request record built in the reserved room, `len` bytes (see
    /// [`DirectTx::commit`]), counting it as a record too.
    #[inline]
    pub(crate) fn commit_record(&mut self, len: usize) {
        self.commit(len);
        self.records += 1;
    }
}

impl Drop for DirectTx<'_> {
    fn drop(&mut self) {
        if self.packets > 0 {
            self.wire.count_sent(0, self.packets, self.bytes, 0, 0);
        }
        if self.records > 0 {
            self.wire
                .counters
                .wr_records
                .fetch_add(self.records as u64, Ordering::Relaxed);
        }
    }
}

// SAFETY: the raw pointers are the gaps' (`Gap::src`), into memory that the batch's holds
// keep valid, read by whichever thread sends the batch.
unsafe impl Send for TxBatch {}

impl TxBatch {
    pub(crate) fn new() -> TxBatch {
        TxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; PKT_BUF]).collect(),
            lens: vec![0; BATCH],
            dests: vec![SocketAddr::from(([0, 0, 0, 0], 0)); BATCH],
            srcs: vec![IpAddr::from([0, 0, 0, 0]); BATCH],
            sealed: vec![false; BATCH],
            gaps: (0..BATCH).map(|_| Vec::with_capacity(MAX_GAPS)).collect(),
            holds: Vec::with_capacity(BATCH),
            gapped: 0,
            gap_bytes: 0,
            count: 0,
            bytes: 0,
            queueable: true,
            ordered: false,
            mcast: 0,
            sealers: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.count == BATCH
    }

    /// Whether an RC or UC packet (request or response) is queued. A thread that drove a QP
    /// into this batch sends it before it lets go of the QP when so: another thread that
    /// drives the QP next, and sends at once (or through the transmit thread), would
    /// otherwise put the QP's later packets on the wire before these (a responder NAKs
    /// requests out of sequence and the requester goes back; an ACK that overtakes the READ
    /// responses before it makes the requester resend the READ).
    #[inline]
    pub(crate) fn has_ordered(&self) -> bool {
        self.ordered
    }

    /// Forgets every packet queued (sent, or dropped).
    #[inline]
    pub(super) fn clear(&mut self) {
        if self.gapped > 0 {
            self.gapped = 0;
            self.gap_bytes = 0;
            self.holds.clear();
        }
        self.count = 0;
        self.bytes = 0;
        self.queueable = true;
        self.ordered = false;
        self.mcast = 0;
    }

    /// Whether no packet is queued.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The buffer of the next packet.
    #[inline]
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// The buffer of the next packet, at least `len` bytes long (grown once when a QP
    /// segments beyond the path MTU).
    #[inline]
    pub(crate) fn slot_of(&mut self, len: usize) -> &mut [u8] {
        let b = &mut self.bufs[self.count];
        if b.len() < len {
            b.resize(len, 0);
        }
        b
    }

    /// Queues the packet written in the current slot, of the flow `src → dst` (both on port
    /// 4791). Its ICRC is computed when it goes on the wire ([`TxBatch::seal`]).
    #[inline]
    pub(crate) fn commit(&mut self, len: usize, src: IpAddr, dst: IpAddr) {
        self.mcast += usize::from(dst.is_multicast());
        self.bytes += len;
        // (The BTH opcode: RC requests are 0x00-0x0C and 0x13-0x1F; the RC responses, READ
        // responses 0x0D-0x10, ACK 0x11 and atomic ACK 0x12; other transports from 0x20.)
        let op = self.bufs[self.count][0];
        self.queueable &= op < 0x11 || (0x13..0x20).contains(&op);
        // (UC: 0x20-0x3F.)
        self.ordered |= op < 0x40;
        self.lens[self.count] = len;
        self.dests[self.count] = SocketAddr::new(dst, ROCE_PORT);
        self.srcs[self.count] = src;
        self.sealed[self.count] = false;
        self.gaps[self.count].clear();
        self.count += 1;
    }

    /// [`TxBatch::commit`] of a packet whose payload has `gaps` (taken: the batch holds their
    /// memory until the packet has gone). Gaps are the payload of an RC or UC request: they
    /// are released unused when the packet is anything else (a response written into the
    /// slot after a request failed midway there) or when one does not lie within the
    /// packet, after its BTH and before its ICRC, in order.
    #[inline]
    pub(crate) fn commit_gapped(
        &mut self,
        len: usize,
        src: IpAddr,
        dst: IpAddr,
        gaps: &mut PacketGaps,
    ) {
        let i = self.count;
        self.commit(len, src, dst);
        if gaps.n > 0 {
            // (RC responses are opcodes 0x0D-0x12; UC has 0x20-0x3F, all requests.)
            let op = self.bufs[i][0];
            let mut at = softrdma_wire::bth::HEADER_LEN;
            let fits = op < 0x40
                && !(0x0d..=0x12).contains(&op)
                && gaps.gaps[..gaps.n].iter().all(|g| match g {
                    Some((g, _)) if g.at >= at && g.at + g.len + 4 <= len => {
                        at = g.at + g.len;
                        true
                    }
                    _ => false,
                });
            if !fits {
                gaps.clear();
                return;
            }
            self.gapped += 1;
            for g in &mut gaps.gaps[..gaps.n] {
                if let Some((gap, hold)) = g.take() {
                    self.gap_bytes += gap.len;
                    self.gaps[i].push(gap);
                    self.holds.push(hold);
                }
            }
            gaps.n = 0;
        }
    }

    /// Copies the gaps of every packet into its buffer (for what must see packets whole: a
    /// capture, fault injection).
    fn fill_gaps(&mut self) {
        for i in 0..self.count {
            for g in self.gaps[i].drain(..) {
                // SAFETY: the gap's memory is held (`holds`) until the batch is cleared; the
                // gap lies within the packet's buffer (`commit_gapped`).
                unsafe {
                    super::memory::copy_from_memory(g.src, &mut self.bufs[i][g.at..g.at + g.len])
                };
            }
        }
        self.gapped = 0;
        self.gap_bytes = 0;
        self.holds.clear();
    }

    /// Gives packet `i` its ICRC for its flow (once).
    #[inline]
    fn seal(&mut self, i: usize) {
        if self.sealed[i] {
            return;
        }
        self.sealed[i] = true;
        let sealer = sealer_for(&mut self.sealers, self.srcs[i]);
        let packet = &mut self.bufs[i][..self.lens[i]];
        let gaps = &self.gaps[i];
        // (A packet the sealer refuses, which `drive` never commits, goes with its ICRC
        // bytes as written: the peer drops it.)
        if gaps.is_empty() {
            let _ = sealer.seal(self.dests[i].ip(), packet);
        } else {
            let mut spans = [(0, 0); MAX_GAPS];
            for (s, g) in spans.iter_mut().zip(gaps) {
                *s = (g.at, g.len);
            }
            let _ = sealer.seal_around(
                self.dests[i].ip(),
                packet,
                &spans[..gaps.len()],
                // SAFETY: the gap's memory is held until the batch is cleared.
                |k, crc| unsafe { super::memory::crc32_of_memory(crc, gaps[k].src, gaps[k].len) },
            );
        }
    }

    /// Gives every queued packet its ICRC.
    fn seal_all(&mut self) {
        for i in 0..self.count {
            self.seal(i);
        }
    }
}

/// The sealer of packets from `src` (port 4791) among `sealers`, moved to the front.
#[inline]
fn sealer_for(sealers: &mut Vec<(IpAddr, Sealer)>, src: IpAddr) -> &mut Sealer {
    match sealers.iter().position(|(s, _)| *s == src) {
        Some(0) => {}
        Some(i) => sealers.swap(0, i),
        None => {
            let s = Sealer::new(src, ROCE_PORT, MAX_TX_FLOWS);
            sealers.insert(0, (src, s));
        }
    }
    &mut sealers[0].1
}

thread_local! {
    static TX: std::cell::RefCell<Option<TxBatch>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's transmit batch, or with a new one when this thread is using
/// its batch already (a call from inside another `with_tx`: a CM event handled while a
/// polling thread receives, say, moves a QP to ERR, which sends the ACK it holds). Every `f`
/// sends what it queued before it returns.
pub(crate) fn with_tx<R>(f: impl FnOnce(&mut TxBatch) -> R) -> R {
    TX.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => f(slot.get_or_insert_with(TxBatch::new)),
        Err(_) => f(&mut TxBatch::new()),
    })
}

/// The device's way out, shared by every part of the engine: its UDP socket (which the
/// receive side reads too), the eventfd that wakes its progress thread, its packet counters
/// and the fault injection of its send path.
pub(crate) struct Wire {
    pub(crate) sock: UdpSock,
    /// The socket's address.
    pub(crate) local: SocketAddr,
    /// Wakes the progress thread.
    pub(crate) wake: EventFd,
    pub(crate) counters: Counters,
    /// Shared by the receive queues of one device (see `devices::open_queue`).
    faults: Arc<Faults>,
    /// The same-host lanes: packets for devices of this host skip the network stack.
    pub(crate) lanes: Lanes,
    /// When the wire was made: the time handed with a run of work-request records, which
    /// carry none (see `rx::take_lanes`).
    pub(crate) made: Instant,
    /// Batches of a stream on their way to the device's transmit thread.
    pub(crate) txq: Arc<TxQueue>,
}

impl Wire {
    /// The wire of the device socket `sock` bound to `local`, no faults, with the same-host
    /// `lanes` of the device. Fails with the errno of `eventfd`.
    pub(crate) fn new(
        sock: UdpSock,
        local: SocketAddr,
        lanes: Lanes,
    ) -> crate::error::Result<Wire> {
        let wake = EventFd::new()?;
        wake.set_nonblocking(true)?;
        Ok(Wire {
            sock,
            local,
            wake,
            counters: Counters::default(),
            faults: Arc::new(Faults::new()),
            lanes,
            made: Instant::now(),
            txq: Arc::new(TxQueue::default()),
        })
    }

    /// Sends a batch of finished packets: those for a device of this host with a lane up
    /// through it, the others (with their ICRC) on the wire, through fault injection when it
    /// is on (then all on the wire).
    #[inline]
    pub(crate) fn send(&self, tx: &mut TxBatch) {
        // (Called after every run, nearly always with nothing queued: the check stays here,
        // the sending out of line.)
        if tx.count != 0 {
            if self.txq.pending() != 0 {
                self.send_behind_queue(tx);
            } else {
                self.send_batch(tx);
            }
        }
    }

    /// Sends a batch while the transmit thread has batches to send: RC requests and READ
    /// responses join the queue behind them; anything else (an ACK, which may go with a
    /// completion the program sees at once, a CM message, UC and UD) waits until the queue is
    /// empty, and goes out behind it.
    #[inline(never)]
    fn send_behind_queue(&self, tx: &mut TxBatch) {
        if tx.queueable && self.queue_ok() && self.txq.push(tx) {
            return;
        }
        self.txq.wait_drained();
        self.send_batch(tx);
    }

    /// Whether this wire's batches may go through the transmit thread now: no fault
    /// injection and no capture (both see packets in the order they are sent, at once).
    #[inline]
    fn queue_ok(&self) -> bool {
        !self.faults.on() && !super::capture::active()
    }

    /// Whether `tx` should go to the transmit thread rather than be sent by the calling
    /// thread (see [`TxQueue`]): a full batch of RC requests or READ responses of at least
    /// [`TX_QUEUE_MIN_BYTES`], when the device has a transmit thread.
    #[inline]
    pub(crate) fn wants_queue(&self, tx: &TxBatch) -> bool {
        tx.count == BATCH
            && tx.bytes >= TX_QUEUE_MIN_BYTES
            && tx.queueable
            && tx_thread_on()
            && self.queue_ok()
    }

    /// Batches queued for the transmit thread or being sent by it.
    #[inline]
    pub(crate) fn tx_pending(&self) -> usize {
        self.txq.pending()
    }

    #[inline(never)]
    pub(super) fn send_batch(&self, tx: &mut TxBatch) {
        // (Each read once: either may be switched on meanwhile, and a packet with gaps must
        // not reach one that was off when its gaps were kept.)
        let faults = self.faults.on();
        let capture = super::capture::active();
        if tx.gapped > 0 && (faults || capture) {
            // (Both see every packet whole, as the wire would carry it.)
            tx.fill_gaps();
        }
        if tx.gap_bytes > 0 {
            self.counters
                .tx_in_place_bytes
                .fetch_add(tx.gap_bytes as u64, Ordering::Relaxed);
        }
        if tx.mcast > 0 {
            self.counters
                .mcast_tx_packets
                .fetch_add(tx.mcast as u64, Ordering::Relaxed);
            tx.mcast = 0;
        }
        let lanes = self.lanes.on() && !faults;
        if !lanes || capture {
            // (A capture shows every packet as the wire would carry it.)
            tx.seal_all();
        }
        if lanes {
            self.send_lanes(tx, capture);
        } else if faults {
            let (out, delayed) = self.faults.apply(
                tx.count,
                |i| (&tx.bufs[i][..tx.lens[i]], tx.dests[i]),
                &self.counters,
            );
            if delayed {
                self.wake.signal();
            }
            // SAFETY: no gaps.
            unsafe { self.account(out.len(), capture, |i| (&out[i].0[..], out[i].1, &[][..])) };
        } else {
            let TxBatch {
                bufs,
                lens,
                dests,
                gaps,
                ..
            } = &*tx;
            // SAFETY: the memory of every gap is held (`holds`) until the batch is cleared.
            unsafe {
                self.account(tx.count, capture, |i| {
                    (&bufs[i][..lens[i]], dests[i], &gaps[i][..])
                })
            };
        }
        tx.clear();
    }

    /// [`Wire::send`] with lanes: routes the batch, seals what goes on the wire, sends it
    /// and counts everything.
    fn send_lanes(&self, tx: &mut TxBatch, capture: bool) {
        let count = tx.count;
        if capture {
            for i in 0..count {
                super::capture::record(self.local, tx.dests[i], &tx.bufs[i][..tx.lens[i]]);
            }
        }
        let bytes: usize = tx.lens[..count].iter().sum();
        let mut keep = [0usize; BATCH];
        let (kept, laned) = {
            let TxBatch {
                bufs,
                lens,
                dests,
                gaps,
                ..
            } = &*tx;
            // (A packet with gaps goes on the wire: a lane's ring takes whole packets.)
            self.lanes.route(
                count,
                &|i| (&bufs[i][..lens[i]], dests[i]),
                &|i| !gaps[i].is_empty(),
                &mut keep,
            )
        };
        for &i in &keep[..kept] {
            tx.seal(i);
        }
        let (sent, failed, numbered) = if kept > 0 {
            let TxBatch {
                bufs,
                lens,
                dests,
                gaps,
                ..
            } = &*tx;
            // SAFETY: the memory of every gap is held (`holds`) until the batch is cleared.
            unsafe {
                self.sock.send_batch(kept, |j| {
                    let k = keep[j];
                    (&bufs[k][..lens[k]], dests[k], &gaps[k][..])
                })
            }
        } else {
            (0, 0, 0)
        };
        self.count_sent(sent, laned, bytes, failed, numbered);
    }

    /// Sends packets `pkt(0..count)` on the wire and counts them, recording them in the
    /// capture when `capture` (then no packet has gaps: see [`Wire::send_batch`]).
    ///
    /// # Safety
    /// As [`UdpSock::send_batch`]: the memory of every gap is valid until the call returns.
    unsafe fn account<'a>(
        &self,
        count: usize,
        capture: bool,
        pkt: impl Fn(usize) -> (&'a [u8], SocketAddr, &'a [Gap]),
    ) {
        if capture {
            for i in 0..count {
                let (p, dst, _) = pkt(i);
                super::capture::record(self.local, dst, p);
            }
        }
        let bytes: usize = (0..count).map(|i| pkt(i).0.len()).sum();
        // SAFETY: the caller's contract.
        let (sent, failed, numbered) = unsafe { self.sock.send_batch(count, pkt) };
        self.count_sent(sent, 0, bytes, failed, numbered);
    }

    /// Counts what a send handed on: `sent` packets to the kernel and `laned` to same-host
    /// lanes (also counted as sent), `bytes` in all, `failed` refused by the kernel,
    /// `numbered` of `sent` with a GSO number ([`UdpSock::send_batch`]).
    #[inline]
    fn count_sent(&self, sent: usize, laned: usize, bytes: usize, failed: usize, numbered: usize) {
        let c = &self.counters;
        if laned > 0 {
            c.same_host_packets
                .fetch_add(laned as u64, Ordering::Relaxed);
        }
        c.tx_packets
            .fetch_add((sent + laned) as u64, Ordering::Relaxed);
        c.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if failed > 0 {
            c.tx_errors.fetch_add(failed as u64, Ordering::Relaxed);
        }
        if numbered > 0 {
            c.tx_gso_numbered
                .fetch_add(numbered as u64, Ordering::Relaxed);
        }
    }

    /// Whether a QP may write its packets straight into a same-host lane's ring
    /// ([`Wire::direct_lane`]) rather than through a [`TxBatch`]: lanes on, no fault
    /// injection, no capture (both see packets only in a batch).
    #[inline]
    pub(crate) fn lanes_direct(&self) -> bool {
        self.lanes.on() && !self.faults.on() && !super::capture::active()
    }

    /// Offers a lane to the process of QP `dest_qpn` of the device at `peer` now (see
    /// [`super::Provider::prepare_lane`]).
    pub(crate) fn prepare_lane(&self, peer: IpAddr, dest_qpn: u32) {
        if self.lanes_direct() {
            self.lanes.prepare(
                SocketAddr::new(peer, ROCE_PORT),
                super::share::slot_of_qpn(dest_qpn),
            );
        }
    }

    /// Whether packets to QP `dest_qpn` of the device at `peer` may leave payload in the
    /// program's memory ([`TxBatch::commit_gapped`]): sending that way is on
    /// ([`gather_on`]), they go on the wire (no same-host lane there, see
    /// [`Lanes::known_remote`]), and neither fault injection nor a capture needs them whole.
    pub(crate) fn may_gather(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        gather_on()
            && !self.faults.on()
            && !super::capture::active()
            && self.lanes.known_remote(
                SocketAddr::new(peer, ROCE_PORT),
                super::share::slot_of_qpn(dest_qpn),
            )
    }

    /// Whether a same-host lane to QP `dest_qpn` of the device at `peer` is up.
    pub(crate) fn lane_is_up(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        self.lanes.is_up(
            SocketAddr::new(peer, ROCE_PORT),
            super::share::slot_of_qpn(dest_qpn),
        )
    }

    /// Whether work-request records may go to QP `dest_qpn` of the device at `peer` (see
    /// [`super::Provider::records_ready`]).
    pub(crate) fn records_ready(&self, peer: IpAddr, dest_qpn: u32) -> bool {
        self.lanes_direct()
            && super::lanes::wr_records()
            && self.lanes.records_ready(
                SocketAddr::new(peer, ROCE_PORT),
                super::share::slot_of_qpn(dest_qpn),
            )
    }

    /// A number that changes whenever [`Wire::records_ready`] may have changed its answer.
    #[inline]
    pub(crate) fn records_generation(&self) -> u64 {
        self.lanes.records_generation()
    }

    /// See [`super::Provider::offer_pair`].
    pub(crate) fn offer_pair(
        &self,
        peer: IpAddr,
        dest_qpn: u32,
        src_qpn: u32,
    ) -> Option<super::PairTx> {
        if !self.lanes_direct() {
            return None;
        }
        let dst = SocketAddr::new(peer, ROCE_PORT);
        self.lanes
            .offer_pair(dst, super::share::slot_of_qpn(dest_qpn), src_qpn, dest_qpn)
    }

    pub(crate) fn direct_lane(&self, peer: IpAddr, dest_qpn: u32) -> Option<DirectTx<'_>> {
        let dst = SocketAddr::new(peer, ROCE_PORT);
        let lane = self
            .lanes
            .writer(dst, super::share::slot_of_qpn(dest_qpn))?;
        Some(DirectTx {
            lane,
            wire: self,
            packets: 0,
            bytes: 0,
            records: 0,
        })
    }

    /// Makes this wire inject the faults of `other` (a further receive queue of the device
    /// of `other`): one configuration, generator and count for the whole device.
    pub(crate) fn share_faults(&mut self, other: &Wire) {
        self.faults = other.faults.clone();
    }

    /// Injects faults with `cfg` into what the device sends from now on (`None`: none).
    pub(crate) fn set_faults(&self, cfg: Option<FaultConfig>) {
        self.faults.set(cfg);
    }

    /// Sends the packets fault injection delayed until `now` or held back for reordering;
    /// returns when the next delayed one is due.
    pub(crate) fn release_delayed(&self, now: Instant) -> Option<Instant> {
        let (pkts, next) = self.faults.release_delayed(now);
        if !pkts.is_empty() {
            let capture = super::capture::active();
            // SAFETY: no gaps.
            unsafe {
                self.account(pkts.len(), capture, |i| {
                    (&pkts[i].0[..], pkts[i].1, &[][..])
                })
            };
        }
        next
    }
}

/// The smallest batch that goes to the transmit thread: 64 packets of 2 KiB (below it the
/// hand-over costs about what the sending does).
pub(crate) const TX_QUEUE_MIN_BYTES: usize = 128 << 10;
/// Batches a device's transmit thread holds at most (queued or being sent): 1 MiB of 4 KiB
/// packets. A thread with a full batch when all are taken waits for one.
const TX_QUEUE_MAX: usize = 4;
/// How long the transmit thread looks for the next batch before it sleeps: a stream hands it
/// one every few tens of µs.
const TX_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// Whether devices send the full batches of a stream from a transmit thread of their own
/// (`SOFTRDMA_TX_THREAD=1`; off by default). Measured on 16 cores (BENCHMARKS.md, "A
/// transmit thread"): one QP over the wire, WRITE 1 MiB 3.25 -> 3.88 GB/s and READ 1 MiB
/// 3.43 -> 3.68, but SEND 1 MiB no better and 8 QPs at once 7% slower (the threads take
/// cores from the other streams); the receiving side then bounds one QP. Measured again on
/// another 16-core machine (2026-11-28, `scripts/probes/tx_thread_ab.sh`, on against off):
/// WRITE 1 MiB +4%, SEND 1 MiB +7%, READ 1 MiB and WRITE 64 KiB even, 8 QPs at once -10%: not
/// on by default on large machines either.
pub(crate) fn tx_thread_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("SOFTRDMA_TX_THREAD").is_ok_and(|v| v.trim() != "0" && !v.trim().is_empty())
    })
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether payloads may be sent from the program's memory in place (see [`TxBatch`]): the
/// CPU computes the ICRC over memory in place at full speed
/// ([`super::memory::crc32_in_place`]), and `SOFTRDMA_TX_GATHER` is not `0` (read once).
pub(crate) fn gather_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        super::memory::crc32_in_place()
            && std::env::var("SOFTRDMA_TX_GATHER").map_or(true, |v| v.trim() != "0")
    })
}

/// How many transmit threads of this process may have streams at once
/// (`SOFTRDMA_TX_THREADS_MAX`; by default one per eight CPUs, at least one). A stream's
/// builder and its transmit thread keep two cores busy to move a fifth more than one would
/// (16 cores, one QP, WRITE 1 MiB); with a stream on every receive queue, transmit threads
/// for all of them took cores from the others (`perf -q 8`: 17.9 -> 13.2 GB/s; capped, 19.7
/// -> 18.3).
fn tx_threads_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("SOFTRDMA_TX_THREADS_MAX")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| (cpus() / 8).max(1))
    })
}

/// Transmit threads of this process that have a stream now (see [`TxQueue::claim`]).
static TX_STREAMING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The queue of a device's transmit thread: the full batches of a stream of large RC
/// requests or READ responses (WRITEs and SENDs of many packets, the answers to large READs),
/// which the thread hands to the kernel
/// while the thread that built them builds the next ones. One QP over the wire is bound by
/// the one thread that builds its packets (payload copy, ICRC) and sends them, two thirds of
/// its time in the kernel's send path; split over two threads the two halves overlap.
///
/// Order is kept: while batches are queued, every other batch sent through the same
/// [`Wire`] (the receive queue of the device the QP belongs to) either joins the queue (RC
/// requests, READ responses) or waits until what was queued before it has gone (ACKs, CM
/// messages, UC, UD: what must not go after a completion the program may already see).
/// Packets are sealed (ICRC) before they are queued. Between a QP's packets on the wire and
/// on a same-host lane there is no order (as when a lane comes up: the transport repairs
/// what a packet overtaken that way costs), nor between the queues of one device (a CM
/// message for a QP of a further queue goes through the first).
#[derive(Default)]
pub(crate) struct TxQueue {
    state: std::sync::Mutex<TxQueueState>,
    work: std::sync::Condvar,
    /// Batches queued since the queue was made, and batches sent: their difference is what
    /// is queued or being sent, and a thread that must go after what is queued now waits for
    /// the second to reach what the first is now (not for the queue to empty, which a stream
    /// may never let it do).
    queued_total: std::sync::atomic::AtomicU64,
    sent_total: std::sync::atomic::AtomicU64,
    /// The transmit thread is asleep (a push wakes it).
    asleep: std::sync::atomic::AtomicBool,
    /// This queue counts in [`TX_STREAMING`] (from a stream's first batch until its thread
    /// finds nothing more to send and sleeps).
    streaming: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct TxQueueState {
    queue: std::collections::VecDeque<TxBatch>,
    spares: Vec<TxBatch>,
    /// Batches made for the queue (at most [`TX_QUEUE_MAX`]).
    made: usize,
    /// The transmit thread runs.
    started: bool,
}

impl TxQueue {
    /// Batches queued or being sent.
    #[inline]
    pub(crate) fn pending(&self) -> usize {
        // (Sent first: what was queued is at least that by the time it is read.)
        let sent = self.sent_total.load(Ordering::Acquire);
        (self.queued_total.load(Ordering::Acquire) - sent) as usize
    }

    /// Whether this queue may take a stream's batch: it has a stream already, or fewer than
    /// [`tx_threads_max`] transmit threads of the process have one (then it counts, until
    /// its thread finds nothing more to send). Asked only once the thread runs.
    #[inline]
    pub(crate) fn claim(&self) -> bool {
        if self.streaming.load(Ordering::Relaxed) {
            return true;
        }
        let max = tx_threads_max();
        let mut n = TX_STREAMING.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return false;
            }
            match TX_STREAMING.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(m) => n = m,
            }
        }
        if self.streaming.swap(true, Ordering::AcqRel) {
            // (Another thread claimed for this queue meanwhile: one count is enough.)
            TX_STREAMING.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// The stream ended (its thread found nothing to send): the queue stops counting.
    fn unclaim(&self) {
        if self.streaming.swap(false, Ordering::AcqRel) {
            TX_STREAMING.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Notes that the transmit thread runs.
    pub(crate) fn mark_started(&self) {
        self.lock().started = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TxQueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seals the packets of `tx` and hands them to the transmit thread, leaving `tx` empty;
    /// waits for a batch to come back when the thread holds [`TX_QUEUE_MAX`]. `false` (and
    /// `tx` untouched) when the thread does not run.
    pub(crate) fn push(&self, tx: &mut TxBatch) -> bool {
        tx.seal_all();
        let mut spare = loop {
            let mut st = self.lock();
            if !st.started {
                return false;
            }
            if let Some(b) = st.spares.pop() {
                break b;
            }
            if st.made < TX_QUEUE_MAX {
                st.made += 1;
                drop(st);
                break TxBatch::new();
            }
            drop(st);
            // (The thread sends a batch in some 50-100 µs.)
            std::thread::yield_now();
        };
        std::mem::swap(tx, &mut spare);
        {
            // (Counted under the lock that orders the queue: the counts follow its order.)
            let mut st = self.lock();
            st.queue.push_back(spare);
            self.queued_total.fetch_add(1, Ordering::AcqRel);
        }
        if self.asleep.load(Ordering::SeqCst) {
            self.work.notify_one();
        }
        true
    }

    /// Waits until the transmit thread has sent every batch queued before the call (batches
    /// queued meanwhile may still be on their way).
    pub(crate) fn wait_drained(&self) {
        let target = self.queued_total.load(Ordering::Acquire);
        let mut spins = 0u32;
        while self.sent_total.load(Ordering::Acquire) < target {
            spins += 1;
            if spins.is_multiple_of(16) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The next batch to send, waiting for one up to [`TX_SPIN`] awake and then asleep;
    /// `None` after a second asleep with nothing (the caller checks whether its device
    /// still exists).
    pub(crate) fn next(&self) -> Option<TxBatch> {
        let looked = Instant::now();
        loop {
            if let Some(b) = self.lock().queue.pop_front() {
                return Some(b);
            }
            if looked.elapsed() < TX_SPIN {
                std::thread::yield_now();
                continue;
            }
            let st = self.lock();
            if !st.queue.is_empty() {
                continue;
            }
            self.unclaim();
            self.asleep.store(true, Ordering::SeqCst);
            // (A push queues under the lock, which the wait below holds until it sleeps, and
            // then finds `asleep` set: no wake-up is lost. The timeout lets the thread see
            // whether its device still exists.)
            let (mut st, _) = self
                .work
                .wait_timeout(st, std::time::Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner());
            self.asleep.store(false, Ordering::SeqCst);
            return st.queue.pop_front();
        }
    }

    /// Takes back a batch the transmit thread sent.
    pub(crate) fn sent(&self, b: TxBatch) {
        self.lock().spares.push(b);
        self.sent_total.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A batch of one RC WRITE ONLY packet whose second byte is `mark`.
    fn marked(mark: u8) -> TxBatch {
        let mut b = TxBatch::new();
        commit_marked(&mut b, 0x0a, mark);
        b
    }

    /// Queues in `b` a 64-byte packet of BTH opcode `op` whose second byte is `mark`.
    fn commit_marked(b: &mut TxBatch, op: u8, mark: u8) {
        let slot = b.slot();
        slot[..64].fill(0);
        slot[0] = op;
        slot[1] = mark;
        b.commit(
            64,
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from([127, 0, 0, 2]),
        );
    }

    fn commit_op(b: &mut TxBatch, op: u8) {
        commit_marked(b, op, 0);
    }

    #[test]
    fn the_transmit_queue_hands_batches_over_in_order_and_holds_at_most_its_bound() {
        let q = Arc::new(TxQueue::default());
        let mut b = marked(0);
        assert!(!q.push(&mut b), "no thread: not queued");
        assert_eq!((b.count, q.pending()), (1, 0));
        q.mark_started();
        let seen = std::sync::Mutex::new(Vec::new());
        let most = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while seen.lock().unwrap().len() < 40 {
                    if let Some(mut b) = q.next() {
                        most.fetch_max(q.pending(), Ordering::Relaxed);
                        // (What the transmit thread's send leaves of a batch.)
                        seen.lock().unwrap().push(b.bufs[0][1]);
                        b.clear();
                        q.sent(b);
                    }
                }
            });
            for i in 0..40u8 {
                let mut b = marked(i);
                assert!(b.has_ordered() && b.queueable);
                assert!(q.push(&mut b));
                // The caller keeps an empty batch.
                assert!(b.is_empty());
            }
            q.wait_drained();
            assert_eq!(q.pending(), 0);
        });
        assert_eq!(*seen.lock().unwrap(), (0..40).collect::<Vec<u8>>());
        assert!(most.load(Ordering::Relaxed) <= TX_QUEUE_MAX);
        assert!(q.lock().made <= TX_QUEUE_MAX);
    }

    /// A batch of one packet of BTH opcode `op`, `len` bytes, whose bytes 28.. (after a BTH
    /// and a RETH) are `memory`'s: left there as a gap held by `leases` (junk in the buffer),
    /// and the same packet whole and sealed.
    fn gapped(op: u8, memory: &[u8], leases: &AtomicU64) -> (TxBatch, Vec<u8>) {
        let (src, dst) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
        let len = 28 + memory.len() + 4;
        let mut whole = vec![0u8; len];
        whole[0] = op;
        whole[7] = 0x12;
        whole[28..28 + memory.len()].copy_from_slice(memory);
        Sealer::new(src, ROCE_PORT, 8)
            .seal(dst, &mut whole)
            .unwrap();
        let mut b = TxBatch::new();
        let slot = b.slot_of(len);
        slot[..len].copy_from_slice(&whole);
        slot[28..28 + memory.len()].fill(0xee);
        slot[len - 4..len].fill(0);
        let mut g = PacketGaps::default();
        leases.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the count outlives the batch; this lease is the hold's.
        let hold = unsafe { Hold::from_lease(std::ptr::NonNull::from(leases)) };
        g.push(28, memory.as_ptr(), memory.len(), hold);
        b.commit_gapped(len, src, dst, &mut g);
        (b, whole)
    }

    #[test]
    fn a_gap_is_sealed_over_its_memory_filled_on_demand_and_held_until_the_batch_goes() {
        let leases = AtomicU64::new(0);
        let memory: Vec<u8> = (0..3000u32).map(|i| (i * 11 + 2) as u8).collect();
        // An RC WRITE ONLY: its gap is taken, and held.
        let (mut b, whole) = gapped(0x0a, &memory, &leases);
        assert_eq!(
            (b.gapped, b.gap_bytes, leases.load(Ordering::Acquire)),
            (1, 3000, 1)
        );
        b.seal_all();
        let len = whole.len();
        assert_eq!(
            b.bufs[0][len - 4..len],
            whole[len - 4..],
            "the ICRC of the whole"
        );
        assert_ne!(
            b.bufs[0][..len],
            whole[..],
            "the payload is not in the buffer"
        );
        b.fill_gaps();
        assert_eq!(b.bufs[0][..len], whole[..], "filled: the packet whole");
        assert_eq!(
            (b.gapped, leases.load(Ordering::Acquire)),
            (0, 0),
            "released"
        );
        // Cleared after sending: released too.
        let (mut b, _) = gapped(0x04, &memory, &leases);
        assert_eq!(leases.load(Ordering::Acquire), 1);
        b.clear();
        assert_eq!(leases.load(Ordering::Acquire), 0);
        // A response written into a slot where a request failed: its gaps are not its own.
        for op in [0x0d, 0x10, 0x11, 0x12] {
            let (b, _) = gapped(op, &memory, &leases);
            assert_eq!(
                (b.gapped, leases.load(Ordering::Acquire)),
                (0, 0),
                "opcode {op:#x}"
            );
            assert!(b.gaps[0].is_empty());
        }
        // A gap over the ICRC: refused.
        let (src, dst) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]));
        let mut b = TxBatch::new();
        b.slot_of(100)[0] = 0x0a;
        let mut g = PacketGaps::default();
        leases.fetch_add(1, Ordering::AcqRel);
        // SAFETY: as in `gapped`.
        let hold = unsafe { Hold::from_lease(std::ptr::NonNull::from(&leases)) };
        g.push(28, memory.as_ptr(), 70, hold);
        b.commit_gapped(100, src, dst, &mut g);
        assert_eq!(
            (b.count, b.gapped, leases.load(Ordering::Acquire)),
            (1, 0, 0)
        );
    }

    #[test]
    fn a_batch_knows_whether_it_may_be_queued_and_whether_it_holds_requests() {
        let mut b = marked(1);
        assert!(b.queueable && b.has_ordered());
        // A READ response (0x10) may go to the queue too, an ACK (0x11) not.
        commit_op(&mut b, 0x10);
        assert!(b.queueable && b.has_ordered());
        commit_op(&mut b, 0x11);
        assert!(!b.queueable && b.has_ordered());
        let mut u = TxBatch::new();
        commit_op(&mut u, 0x64); // UD SEND ONLY: no order to keep
        assert!(!u.queueable && !u.has_ordered());
        let mut c = TxBatch::new();
        commit_op(&mut c, 0x2a); // UC RDMA WRITE ONLY
        assert!(!c.queueable && c.has_ordered());
    }
}
