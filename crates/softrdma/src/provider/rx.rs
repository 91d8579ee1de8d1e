//! The receive side: datagrams from the socket, their ICRC checks, and delivery of runs of
//! packets to their QPs.

use super::capture;
use super::counters::Counters;
use super::lanes::pair::PairRx;
use super::lanes::{records, WR_RECORD};
use super::share::{self, Share};
use super::sock::{RecvScratch, RxMsg};
use super::tx::{TxBatch, Wire, BATCH};
use crate::gid::Gid;
pub(super) use softrdma_proto::device::DeviceCounters as Counts;
use softrdma_proto::device::{RxFlows, Sender};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Checks one received datagram (the UDP payload `pkt`, from `src`) with its sender's flow
/// ([`Sender::check`]: headers, ICRC, the identification rule), counting in `counts`.
/// Returns the destination QP number of a good packet; counts and drops a bad one.
#[inline]
fn check_packet(
    wire: &Wire,
    counts: &mut Counts,
    sender: &mut Sender<'_>,
    pkt: &[u8],
    src: SocketAddr,
) -> Option<u32> {
    let (qpn, ident) = sender.check(counts, pkt).ok()?;
    good_packet(wire, counts, pkt, src, ident);
    Some(qpn)
}

/// Counts a good packet (`pkt`, from `src`, verified with IPv4 identification `ident`) and
/// hands it to the packet capture when one runs.
#[inline]
fn good_packet(wire: &Wire, counts: &mut Counts, pkt: &[u8], src: SocketAddr, ident: u16) {
    counts.rx_packets += 1;
    counts.rx_bytes += pkt.len() as u64;
    if capture::active() {
        capture::record_received(src, wire.local, pkt, ident);
    }
}

/// Checks one packet from a same-host lane (`pkt`, from the device at `src`): its layout
/// only, as [`check_packet`] does, but no ICRC: a lane is memory, not a network, and its
/// packets come without one. Returns the destination QP number of a good packet.
#[inline]
fn check_lane_packet(wire: &Wire, counts: &mut Counts, pkt: &[u8], src: SocketAddr) -> Option<u32> {
    let Ok(view) = softrdma_wire::roce::Packet::new_checked(pkt) else {
        counts.count_drop(softrdma_proto::device::DropReason::Malformed, 1);
        return None;
    };
    good_packet(wire, counts, pkt, src, 0);
    Some(view.bth().dest_qp())
}

/// Adds what the receive side counted in `counts` (as [`RxFlows`] and [`softrdma_proto::device::verify_icrc`]
/// count) to the device's counters, and zeroes it. Called before packets go to a QP or the
/// CM, so that the counters a program reads after a completion include its packets.
pub(super) fn add_counts(counts: &mut Counts, c: &Counters) {
    if *counts == Counts::default() {
        return;
    }
    let pairs = [
        (counts.rx_packets, &c.rx_packets),
        (counts.rx_bytes, &c.rx_bytes),
        (counts.malformed, &c.malformed),
        (counts.icrc_errors, &c.icrc_errors),
        (counts.icrc_ident_solved, &c.icrc_ident_solved),
        (counts.cnp_received, &c.cnp_received),
    ];
    for (n, a) in pairs {
        if n != 0 {
            a.fetch_add(n, Ordering::Relaxed);
        }
    }
    *counts = Counts::default();
}

/// How a packet reached the device.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via {
    /// On the device socket: an RC or UC QP takes it only from its peer.
    Unicast,
    /// On the socket of this multicast group: the QP takes it only while attached.
    Group(Gid),
}

/// What became of packets handed to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The transport has them.
    Delivered,
    /// The QP cannot take them: no transport (RESET), or not attached to the group.
    NotReady,
    /// An RC or UC QP, and they did not come from its peer.
    WrongSource,
}

/// Where the receive side hands what it received: the engine above it, which holds the QPs
/// and QP 1.
pub(crate) trait RxSink {
    /// Hands a run of good packets, all from `src` to `dst` and for QP `qpn`, to that QP's
    /// transport, at `now`; `None` when there is no such QP. (A run of work-request records
    /// from a lane is handed a time that means nothing: records carry none, and the QP reads
    /// the clock when one bounces into its transport.)
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &self,
        qpn: u32,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Option<Delivery>;

    /// A QP found already, as a caller may hand it (the engine's: its `QpPort`).
    type Port: Clone;

    /// As [`RxSink::deliver`], to the QP `qp` itself (found already), unicast.
    fn deliver_to(
        &self,
        qp: Self::Port,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Delivery;

    /// Hands a good packet for QP 1 to the CM (of this process, or of the one it is for when
    /// not `forwarded` here already).
    fn mad(&self, pkt: &[u8], src: SocketAddr, now: Instant, tx: &mut TxBatch, forwarded: bool);

    /// Reads the socket's ICMP errors; returns how many.
    fn icmp_errors(&self, tx: &mut TxBatch) -> usize;

    /// The steering of the shared device is out of date: runs its discovery again.
    fn rediscover(&self);

    /// A QP pair ring for QP `qpn` from QP `src_qpn` of the device at `src` was offered:
    /// whether that QP takes it (see `lanes::pair`).
    fn attach_pair(&self, qpn: u32, src: SocketAddr, src_qpn: u32, p: &Arc<PairRx>) -> bool;
}

/// Hands a run of good packets, all for QP `qpn` and from `src`, to that QP's transport
/// under one lock, then drives the QP once; counts what it could not take. Returns `false`
/// when no QP took them (none by that number, or not ready).
fn deliver(
    wire: &Wire,
    sink: &impl RxSink,
    qpn: u32,
    pkts: &[&[u8]],
    src: SocketAddr,
    now: Instant,
    tx: &mut TxBatch,
) -> bool {
    let got = sink.deliver(qpn, pkts, src, wire.local.ip(), Via::Unicast, now, tx);
    count_delivery(wire, pkts.len(), got)
}

/// Counts what became of `n` packets handed to a QP (`None`: no such QP); whether they were
/// taken (delivered, or dropped as from a wrong source) rather than left unknown.
fn count_delivery(wire: &Wire, n: usize, got: Option<Delivery>) -> bool {
    let c = &wire.counters;
    let n = n as u64;
    match got {
        Some(Delivery::Delivered) => true,
        None | Some(Delivery::NotReady) => {
            c.unknown_qp.fetch_add(n, Ordering::Relaxed);
            false
        }
        Some(Delivery::WrongSource) => {
            c.wrong_source.fetch_add(n, Ordering::Relaxed);
            true
        }
    }
}

/// Takes what the QP pair ring `p` holds and hands it to its QP (records: refused to their
/// sender when the QP does not take them), counting it; returns how many. `wait`: see
/// [`PairRx::take`].
pub(super) fn take_pair<S: RxSink>(
    wire: &Wire,
    sink: &S,
    p: &PairRx,
    qp: Option<S::Port>,
    wait: bool,
    tx: &mut TxBatch,
) -> usize {
    // (Counted by the ring: see `Lanes::pair_received`.) Only records for the ring's QP are
    // carried out: anything else its writer put there (the peer is a process of this user,
    // but its bytes are input all the same) is dropped and counted as malformed.
    let ok = |r: &[u8]| r.first() == Some(&WR_RECORD) && records::dest_qpn(r) == Some(p.qpn);
    // To the ring's QP when the caller handed it (a CQ's poll): no lookup by number. (A run
    // of records is handed the wire's birth for a time, as in `deliver_lane_run`.)
    let deliver_run = |run: &[&[u8]], tx: &mut TxBatch| {
        let (dst, now) = (wire.local.ip(), wire.made);
        let got = match &qp {
            Some(q) => Some(sink.deliver_to(q.clone(), run, p.src, dst, now, tx)),
            None => sink.deliver(p.qpn, run, p.src, dst, Via::Unicast, now, tx),
        };
        if !count_delivery(wire, run.len(), got) {
            refuse_records(wire, run, p.src);
        }
    };
    p.take(wait, |run| {
        if run.iter().all(|r| ok(r)) {
            deliver_run(run, tx);
            return;
        }
        for r in run {
            if ok(r) {
                deliver_run(&[r], tx);
            } else {
                wire.counters.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// [`deliver`] for a run from a lane: packets, or work-request `records`, which are refused
/// to their senders when no QP takes them (they send them again as packets, and get what the
/// wire would give). What the QP's pair ring `pair` holds was written before the run (see
/// `lanes::pair`): it goes first.
#[allow(clippy::too_many_arguments)]
#[inline]
fn deliver_lane_run(
    wire: &Wire,
    sink: &impl RxSink,
    pair: Option<&PairRx>,
    qpn: u32,
    pkts: &[&[u8]],
    records: bool,
    src: SocketAddr,
    now: &mut Option<Instant>,
    tx: &mut TxBatch,
) {
    if let Some(p) = pair {
        take_pair(wire, sink, p, None, true, tx);
    }
    // (A run of records is handed the wire's birth for a time: the QP reads the clock itself
    // when a bounce gives requests to its transport.)
    let now = if records {
        wire.made
    } else {
        *now.get_or_insert_with(Instant::now)
    };
    if !deliver(wire, sink, qpn, pkts, src, now, tx) && records {
        refuse_records(wire, pkts, src);
    }
}

/// The receive side of an engine: buffers and ICRC flows, used by whichever thread receives
/// (the progress thread, or an application thread polling a CQ), one at a time so that
/// packets are processed in the order they arrived.
pub(crate) struct RxState {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) meta: Vec<RxMsg>,
    /// The system-call headers for `bufs`.
    pub(super) scratch: RecvScratch,
    /// The ICRC flows of the senders.
    flows: RxFlows,
    /// What the checks counted, not yet added to the device's counters.
    counts: Counts,
    /// How many messages the next `recvmmsg` asks for ([`RxWidth`]).
    width: RxWidth,
}

/// How many messages a program's poll asks `recvmmsg` for (see [`RxState::receive_rounds`]).
/// A `recvmmsg` of up to 64 that finds one message tries for a second and costs some 0.3-0.5
/// µs more than one of up to one
/// ([`UdpSock::recv_batch_upto`](super::sock::UdpSock::recv_batch_upto)), and a ping-pong's
/// receiver finds one message a look (on loopback an answer and the ACK behind it are one
/// GSO message). So after a look that took one message and one right after it that found
/// nothing, looks ask for one; a look that takes a message right after one that took one
/// (a stream, or an answer whose ACK came as a datagram of its own) asks for all again.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RxWidth {
    /// Ask for one message.
    one: bool,
    /// The last look took exactly one message.
    took_one: bool,
}

impl RxWidth {
    /// The most messages to ask for now, of `all`.
    #[inline]
    pub(crate) fn get(self, all: usize) -> usize {
        if self.one {
            1
        } else {
            all
        }
    }

    /// A look took `n` messages.
    #[inline]
    pub(crate) fn took(&mut self, n: usize) {
        if n == 0 {
            self.one |= self.took_one;
        } else if self.took_one || n > 1 {
            self.one = false;
        }
        self.took_one = n == 1;
    }
}

/// The most senders whose ICRC flows the receive side keeps (one beyond them is checked with
/// a prefix built for its packets: hostile sources cannot grow memory).
const MAX_RX_FLOWS: usize = 4096;

impl RxState {
    pub(crate) fn new() -> RxState {
        RxState {
            bufs: (0..BATCH).map(|_| vec![0u8; 65536]).collect(),
            meta: vec![RxMsg::default(); BATCH],
            scratch: RecvScratch::new(),
            flows: RxFlows::new(MAX_RX_FLOWS),
            counts: Counts::default(),
            width: RxWidth::default(),
        }
    }
}

/// The RoCEv2 packets of one received message (one datagram, or a GRO batch of
/// `segment`-byte datagrams) and their sender; `None` (counted as malformed when empty)
/// when there is nothing to process.
pub(crate) fn datagrams<'a>(
    c: &Counters,
    buf: &'a [u8],
    m: RxMsg,
) -> Option<(SocketAddr, std::slice::Chunks<'a, u8>)> {
    let src = m.src?;
    if m.len == 0 {
        let c = if m.truncated {
            &c.malformed
        } else {
            &c.probes_received
        };
        c.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let seg = if m.segment == 0 { m.len } else { m.segment };
    Some((src, buf[..m.len].chunks(seg)))
}

impl RxState {
    /// Receives and processes what is waiting on the device socket, up to `rounds` batches,
    /// handing what is good to `sink`. Returns the number of messages received. With
    /// `narrow` (a program's poll) a look asks for as many messages as [`RxWidth`] says;
    /// otherwise (the progress thread, which ends its turn when a look finds fewer than a
    /// batch, and a final drain) for a batch.
    pub(crate) fn receive_rounds(
        &mut self,
        wire: &Wire,
        share: &Share,
        sink: &impl RxSink,
        tx: &mut TxBatch,
        rounds: usize,
        narrow: bool,
    ) -> usize {
        let mut total = 0;
        let RxState {
            bufs,
            meta,
            scratch,
            flows,
            counts,
            width,
        } = self;
        let local = wire.local.ip();
        for _ in 0..rounds {
            let n = match wire.sock.recv_batch_upto(
                bufs,
                meta,
                scratch,
                if narrow { width.get(BATCH) } else { BATCH },
            ) {
                Ok(n) => n,
                Err(e) => {
                    // An ICMP error for an earlier datagram is reported here once, and its
                    // details wait in the error queue (which keeps the socket readable
                    // until drained): read them, then go on receiving.
                    let icmp = sink.icmp_errors(tx);
                    if icmp == 0 {
                        tracing::warn!(error = %e, "receive failed");
                        0
                    } else {
                        continue;
                    }
                }
            };
            width.took(n);
            if n == 0 {
                break;
            }
            total += n;
            let now = Instant::now();
            // Runs of packets for the same QP (up to BATCH) are delivered under one lock.
            let mut run = PacketRun::new();
            for i in 0..n {
                let Some((src, pkts)) = datagrams(&wire.counters, &bufs[i], meta[i]) else {
                    continue;
                };
                // One flow lookup per message: the datagrams of a GRO batch share a sender.
                let mut sender = flows.sender(src, local);
                run.clear();
                let mut run_qpn = None;
                for pkt in pkts {
                    if pkt.len() == super::steer::MARKER_LEN
                        && pkt[0] == super::steer::MARKER_OPCODE
                        && share.on_marker(pkt, src)
                    {
                        continue;
                    }
                    let Some(qpn) = check_packet(wire, counts, &mut sender, pkt, src) else {
                        continue;
                    };
                    if qpn == softrdma_wire::mad::GSI_QPN {
                        add_counts(counts, &wire.counters);
                        take_lanes(wire, share, sink, tx, counts, false);
                        sink.mad(pkt, src, now, tx, false);
                        continue;
                    }
                    if !owns_qpn(share, qpn) {
                        misrouted(wire, share, sink, qpn, src, pkt);
                        continue;
                    }
                    if run_qpn != Some(qpn) || run.is_full() {
                        if let Some(q) = run_qpn {
                            add_counts(counts, &wire.counters);
                            deliver(wire, sink, q, run.as_slice(), src, now, tx);
                        }
                        run.clear();
                        run_qpn = Some(qpn);
                    }
                    run.push(pkt);
                }
                add_counts(counts, &wire.counters);
                if let Some(q) = run_qpn {
                    deliver(wire, sink, q, run.as_slice(), src, now, tx);
                }
            }
            wire.send(tx);
            if n < BATCH {
                break;
            }
        }
        total
    }
}

/// The QP number that addresses a multicast group (IBA 10.5.2.5).
pub(crate) const MULTICAST_QPN: u32 = 0xff_ffff;

/// Whether packets for `qpn` are this process's (its slot's, or the multicast QP's): the
/// others belong to other processes sharing the device.
#[inline]
fn owns_qpn(share: &Share, qpn: u32) -> bool {
    share::slot_of_qpn(qpn) == share.slot() || qpn == MULTICAST_QPN
}

/// A good packet for a QP of another process sharing the device: forwarded to it (counted in
/// `misrouted`), or dropped when that process is gone (`unknown_qp`); either way the
/// steering is out of date, so discovery runs again.
fn misrouted(
    wire: &Wire,
    share: &Share,
    sink: &impl RxSink,
    qpn: u32,
    src: SocketAddr,
    pkt: &[u8],
) {
    let c = &wire.counters;
    match share.forward(share::slot_of_qpn(qpn), src, pkt) {
        Ok(()) => c.misrouted.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            tracing::debug!(qpn, error = %e, "a packet for another process not forwarded");
            c.unknown_qp.fetch_add(1, Ordering::Relaxed)
        }
    };
    if share.discovery_due() {
        sink.rediscover();
    }
}

impl RxState {
    /// Receives what other processes sharing the device forwarded to this one (packets that
    /// reached them for QPs of this process) and processes it as if it had arrived on the
    /// device socket: the same checks, then delivery. Returns the number of messages taken.
    pub(crate) fn receive_forwarded(
        &mut self,
        wire: &Wire,
        share: &Share,
        sink: &impl RxSink,
        tx: &mut TxBatch,
    ) -> usize {
        let RxState {
            bufs,
            flows,
            counts,
            ..
        } = self;
        let buf = &mut bufs[0];
        let mut n = 0;
        while n < 4 * BATCH {
            let Some(got) = share.recv(buf) else {
                break;
            };
            n += 1;
            let (src, range) = match got {
                share::SlotMsg::Packet(src, range) => (src, range),
                share::SlotMsg::Lane(len, fds) => {
                    wire.lanes
                        .on_message(&buf[..len], fds, &|qpn, src, src_qpn, p| {
                            sink.attach_pair(qpn, src, src_qpn, p)
                        });
                    continue;
                }
                share::SlotMsg::Other => continue,
            };
            let pkt = &buf[range];
            let mut sender = flows.sender(src, wire.local.ip());
            let checked = check_packet(wire, counts, &mut sender, pkt, src);
            add_counts(counts, &wire.counters);
            let Some(qpn) = checked else {
                continue;
            };
            let now = Instant::now();
            tracing::trace!(qpn, %src, len = pkt.len(), "a packet forwarded by another process");
            if qpn == softrdma_wire::mad::GSI_QPN {
                take_lanes(wire, share, sink, tx, counts, false);
                sink.mad(pkt, src, now, tx, true);
            } else if owns_qpn(share, qpn) {
                deliver(wire, sink, qpn, &[pkt], src, now, tx);
            } else {
                // Never a second hop.
                wire.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
            }
        }
        wire.send(tx);
        n
    }
}

impl RxState {
    /// Receives what waits in the device's same-host lanes (see `lanes`) and processes it as
    /// if it had arrived on the device socket: the same checks, then delivery in runs per QP.
    /// The first records of a lane new since the last look wait for the next one (the caller
    /// reads the socket in between), unless `all`. Returns the number of packets taken.
    pub(crate) fn receive_lanes(
        &mut self,
        wire: &Wire,
        share: &Share,
        sink: &impl RxSink,
        tx: &mut TxBatch,
        all: bool,
    ) -> usize {
        take_lanes(wire, share, sink, tx, &mut self.counts, !all)
    }
}

/// Up to [`BATCH`] packets for one QP, borrowed from where they lie (a socket buffer, a lane's
/// ring), to hand over under one lock. Made without writing its room: an array of 64 empty
/// slices was zeroed (1 KiB) at every look at a lane, the largest cost of taking a packet
/// off a ring in a ping-pong (some 400 instructions a round trip, callgrind).
struct PacketRun<'a> {
    pkts: [std::mem::MaybeUninit<&'a [u8]>; BATCH],
    /// The first `n` of `pkts` are written.
    n: usize,
}

impl<'a> PacketRun<'a> {
    #[inline]
    fn new() -> PacketRun<'a> {
        PacketRun {
            pkts: [const { std::mem::MaybeUninit::uninit() }; BATCH],
            n: 0,
        }
    }

    #[inline]
    fn is_full(&self) -> bool {
        self.n == BATCH
    }

    /// Adds a packet. The caller checks [`PacketRun::is_full`] first; a push onto a full
    /// run panics (index out of bounds).
    #[inline]
    fn push(&mut self, pkt: &'a [u8]) {
        self.pkts[self.n].write(pkt);
        self.n += 1;
    }

    #[inline]
    fn clear(&mut self) {
        self.n = 0;
    }

    /// The packets pushed since the last [`PacketRun::clear`], in order.
    #[inline]
    fn as_slice(&self) -> &[&'a [u8]] {
        // SAFETY: the first `n` entries were written by `push` (and `n` never exceeds
        // BATCH); `MaybeUninit<T>` has the layout of `T`.
        unsafe { std::slice::from_raw_parts(self.pkts.as_ptr().cast::<&'a [u8]>(), self.n) }
    }
}

/// Answers each work request among the records `pkts` (from the device at `src`) with a
/// refusal ([`records::Kind::Refuse`]): no QP here takes records for its destination.
#[cold]
fn refuse_records(wire: &Wire, pkts: &[&[u8]], src: SocketAddr) {
    for p in pkts {
        let Some((r, _)) = records::Record::parse(p) else {
            continue;
        };
        if !r.kind.is_request() {
            continue;
        }
        let a = records::Record::answer(records::Kind::Refuse, &r);
        if let Some(mut lane) = wire.direct_lane(src.ip(), a.dest_qpn) {
            if let Some(buf) = lane.reserve(records::HEADER) {
                a.emit(buf);
                lane.commit_record(records::HEADER);
            }
        }
    }
}

/// What [`RxState::receive_lanes`] does, with the receive side's counts.
///
/// Also called before a MAD from the socket goes to the CM (`skip_fresh` false): what the peer
/// sent on a lane before it sent the MAD (the ACK of the last message before a DREQ, say) is
/// in the ring by then, and is taken first, in the order the peer sent it. Otherwise
/// (`skip_fresh`) the first records of a new lane wait for the next look.
fn take_lanes(
    wire: &Wire,
    share: &Share,
    sink: &impl RxSink,
    tx: &mut TxBatch,
    counts: &mut Counts,
    skip_fresh: bool,
) -> usize {
    {
        let got = wire.lanes.with_inbound(|inb| {
            let mut total = 0;
            // Whether a lane brought its first records (see `Lanes::note_inbound`).
            let mut now_used = false;
            for lane in inb.iter_mut() {
                'lane: {
                    if lane.fresh {
                        // A new lane's first records wait one look: the packets its sender put on
                        // the wire before the lane was up (in the socket by now, as a rule) are
                        // read first, in this round, and the lane's first ones do not overtake
                        // them (which costs an RC QP a sequence NAK and a go-back-N). Not before
                        // a MAD, though: what came on the lane before it goes first.
                        if !lane.cons.pending() {
                            break 'lane;
                        }
                        lane.fresh = false;
                        now_used = true;
                        if skip_fresh {
                            break 'lane;
                        }
                    }
                    let src = lane.src;
                    // At most 4 batches from one lane per call: the others get their turn, and
                    // the producer gets room back after each batch.
                    for _ in 0..4 {
                        if !lane.cons.pending() {
                            break;
                        }
                        let mut pos = lane.cons.tail();
                        // The clock is read for packets only (28 ns on this VM, twice in each
                        // round trip of a ping-pong of records otherwise): records carry no time
                        // (the QP reads it if a bounced record needs the transport).
                        let mut now = None;
                        let mut run = PacketRun::new();
                        let mut taken = 0;
                        let mut run_qpn = None;
                        let mut run_records = false;
                        while taken < BATCH {
                            let (pkt, next) = match lane.cons.record_at(pos) {
                                Ok(Some(r)) => r,
                                Ok(None) => break,
                                Err(super::lanes::ring::Corrupt) => {
                                    lane.corrupt = true;
                                    break;
                                }
                            };
                            pos = next;
                            taken += 1;
                            // A work-request record (not a packet: no checks of a packet's
                            // layout, and no capture) or a packet.
                            let is_record = pkt.first() == Some(&WR_RECORD);
                            let qpn = if is_record {
                                let Some(q) = records::dest_qpn(pkt) else {
                                    counts.count_drop(
                                        softrdma_proto::device::DropReason::Malformed,
                                        1,
                                    );
                                    continue;
                                };
                                counts.rx_packets += 1;
                                counts.rx_bytes += pkt.len() as u64;
                                q
                            } else {
                                let Some(q) = check_lane_packet(wire, counts, pkt, src) else {
                                    continue;
                                };
                                q
                            };
                            if qpn == softrdma_wire::mad::GSI_QPN || !owns_qpn(share, qpn) {
                                // Lanes carry packets for this process's QPs only.
                                wire.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
                                if is_record {
                                    refuse_records(wire, &[pkt], src);
                                }
                                continue;
                            }
                            // A run is packets or records, never both: a QP takes the packets
                            // before a record before it takes the record.
                            if run_qpn != Some(qpn) || run_records != is_record || run.is_full() {
                                if let Some(q) = run_qpn {
                                    add_counts(counts, &wire.counters);
                                    deliver_lane_run(
                                        wire,
                                        sink,
                                        lane.pair_of(q).map(|p| &**p),
                                        q,
                                        run.as_slice(),
                                        run_records,
                                        src,
                                        &mut now,
                                        tx,
                                    );
                                }
                                run.clear();
                                run_qpn = Some(qpn);
                                run_records = is_record;
                            }
                            run.push(pkt);
                        }
                        add_counts(counts, &wire.counters);
                        if let Some(q) = run_qpn {
                            deliver_lane_run(
                                wire,
                                sink,
                                lane.pair_of(q).map(|p| &**p),
                                q,
                                run.as_slice(),
                                run_records,
                                src,
                                &mut now,
                                tx,
                            );
                        }
                        total += taken;
                        lane.cons.release(pos);
                        if lane.corrupt || taken < BATCH {
                            break;
                        }
                    }
                }
                // The lane's QP pair rings, whether or not the lane brought anything yet (a
                // poller of the QP's CQ may be at one: left to it, unless everything must be
                // taken now).
                for p in &lane.pairs {
                    if p.pending() {
                        total += take_pair(wire, sink, p, None, !skip_fresh, tx);
                    }
                }
                if lane.pairs.iter().any(|p| p.is_closed()) {
                    lane.pairs.retain(|p| !p.is_closed());
                }
            }
            if now_used {
                wire.lanes.note_inbound(inb);
            }
            total
        });
        wire.send(tx);
        got.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_run_gives_back_what_was_pushed_since_it_was_cleared() {
        let data: Vec<Vec<u8>> = (0..=BATCH).map(|i| vec![i as u8; i % 7 + 1]).collect();
        let mut run = PacketRun::new();
        assert!(run.as_slice().is_empty());
        for (i, d) in data.iter().take(BATCH).enumerate() {
            assert!(!run.is_full());
            run.push(d);
            assert_eq!(run.as_slice().len(), i + 1);
        }
        assert!(run.is_full());
        let want: Vec<&[u8]> = data.iter().take(BATCH).map(|d| &d[..]).collect();
        assert_eq!(run.as_slice(), &want[..]);
        run.clear();
        assert!(run.as_slice().is_empty() && !run.is_full());
        run.push(&data[BATCH]);
        assert_eq!(run.as_slice(), &[&data[BATCH][..]]);
    }

    #[test]
    fn a_receiver_asks_for_one_message_in_a_ping_pong_and_for_all_in_a_stream() {
        let mut w = RxWidth::default();
        assert_eq!(w.get(64), 64);
        // A ping-pong: one message, then looks that find nothing.
        w.took(1);
        assert_eq!(
            w.get(64),
            64,
            "one look that took one message proves nothing yet"
        );
        w.took(0);
        assert_eq!(w.get(64), 1);
        for _ in 0..5 {
            w.took(0);
            assert_eq!(w.get(64), 1, "empty looks keep it");
        }
        w.took(1);
        w.took(0);
        assert_eq!(w.get(64), 1);
        // A stream starts: a message right after one that took one asks for all again.
        w.took(1);
        assert_eq!(w.get(64), 1);
        w.took(1);
        assert_eq!(w.get(64), 64);
        w.took(40);
        w.took(0);
        assert_eq!(
            w.get(64),
            64,
            "a look of several then nothing: still a stream"
        );
        // Several at once (an answer and its ACK as two datagrams) also ask for all.
        w.took(1);
        w.took(0);
        assert_eq!(w.get(64), 1);
        w.took(1);
        w.took(2);
        assert_eq!(w.get(64), 64);
        // Never more than there are buffers for.
        assert_eq!(RxWidth::default().get(8), 8);
    }
}
