//! The transmit side: batches of packets for one `sendmmsg`, with their ICRC, and the
//! device's [`Wire`]: its socket, wake-up eventfd, counters and fault injection, through
//! which every other part of the engine sends.

use super::counters::Counters;
use super::faults::{FaultConfig, Faults};
use super::fd::EventFd;
use super::lanes::{LaneWriter, Lanes};
use super::sock::{UdpSock, ROCE_PORT};
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

/// Packets being prepared for one `sendmmsg`, with the sealers of the devices they leave
/// from ([`Sealer`]: the ICRC of each packet for its flow).
pub(crate) struct TxBatch {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) lens: Vec<usize>,
    pub(super) dests: Vec<SocketAddr>,
    /// The address each packet leaves from, and whether it has its ICRC yet (packets get
    /// it when they go on the wire: a same-host lane needs none).
    srcs: Vec<IpAddr>,
    sealed: Vec<bool>,
    pub(super) count: usize,
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
            self.wire.count_sent(0, self.packets, self.bytes, 0);
        }
        if self.records > 0 {
            self.wire
                .counters
                .wr_records
                .fetch_add(self.records as u64, Ordering::Relaxed);
        }
    }
}

impl TxBatch {
    pub(crate) fn new() -> TxBatch {
        TxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; PKT_BUF]).collect(),
            lens: vec![0; BATCH],
            dests: vec![SocketAddr::from(([0, 0, 0, 0], 0)); BATCH],
            srcs: vec![IpAddr::from([0, 0, 0, 0]); BATCH],
            sealed: vec![false; BATCH],
            count: 0,
            mcast: 0,
            sealers: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.count == BATCH
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
        self.lens[self.count] = len;
        self.dests[self.count] = SocketAddr::new(dst, ROCE_PORT);
        self.srcs[self.count] = src;
        self.sealed[self.count] = false;
        self.count += 1;
    }

    /// Gives packet `i` its ICRC for its flow (once).
    #[inline]
    fn seal(&mut self, i: usize) {
        if self.sealed[i] {
            return;
        }
        self.sealed[i] = true;
        let sealer = sealer_for(&mut self.sealers, self.srcs[i]);
        // (A packet the sealer refuses, which `drive` never commits, goes with its ICRC
        // bytes as written: the peer drops it.)
        let _ = sealer.seal(self.dests[i].ip(), &mut self.bufs[i][..self.lens[i]]);
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
            self.send_batch(tx);
        }
    }

    #[inline(never)]
    fn send_batch(&self, tx: &mut TxBatch) {
        if tx.mcast > 0 {
            self.counters
                .mcast_tx_packets
                .fetch_add(tx.mcast as u64, Ordering::Relaxed);
            tx.mcast = 0;
        }
        let lanes = self.lanes.on() && !self.faults.on();
        if !lanes || super::capture::active() {
            // (A capture shows every packet as the wire would carry it.)
            tx.seal_all();
        }
        if lanes {
            self.send_lanes(tx);
        } else if self.faults.on() {
            let (out, delayed) = self.faults.apply(
                tx.count,
                |i| (&tx.bufs[i][..tx.lens[i]], tx.dests[i]),
                &self.counters,
            );
            if delayed {
                self.wake.signal();
            }
            self.account(out.len(), |i| (&out[i].0[..], out[i].1));
        } else {
            let TxBatch {
                bufs, lens, dests, ..
            } = &*tx;
            self.account(tx.count, |i| (&bufs[i][..lens[i]], dests[i]));
        }
        tx.count = 0;
    }

    /// [`Wire::send`] with lanes: routes the batch, seals what goes on the wire, sends it
    /// and counts everything.
    fn send_lanes(&self, tx: &mut TxBatch) {
        let count = tx.count;
        if super::capture::active() {
            for i in 0..count {
                super::capture::record(self.local, tx.dests[i], &tx.bufs[i][..tx.lens[i]]);
            }
        }
        let bytes: usize = tx.lens[..count].iter().sum();
        let mut keep = [0usize; BATCH];
        let (kept, laned) = {
            let TxBatch {
                bufs, lens, dests, ..
            } = &*tx;
            self.lanes
                .route(count, &|i| (&bufs[i][..lens[i]], dests[i]), &mut keep)
        };
        for &i in &keep[..kept] {
            tx.seal(i);
        }
        let (sent, failed) = if kept > 0 {
            let TxBatch {
                bufs, lens, dests, ..
            } = &*tx;
            self.sock
                .send_batch(kept, |j| (&bufs[keep[j]][..lens[keep[j]]], dests[keep[j]]))
        } else {
            (0, 0)
        };
        self.count_sent(sent, laned, bytes, failed);
    }

    /// Sends packets `pkt(0..count)` on the wire and counts them.
    fn account<'a>(&self, count: usize, pkt: impl Fn(usize) -> (&'a [u8], SocketAddr)) {
        if super::capture::active() {
            for i in 0..count {
                let (p, dst) = pkt(i);
                super::capture::record(self.local, dst, p);
            }
        }
        let bytes: usize = (0..count).map(|i| pkt(i).0.len()).sum();
        let (sent, failed) = self.sock.send_batch(count, pkt);
        self.count_sent(sent, 0, bytes, failed);
    }

    /// Counts what a send handed on: `sent` packets to the kernel and `laned` to same-host
    /// lanes (also counted as sent), `bytes` in all, `failed` refused by the kernel.
    #[inline]
    fn count_sent(&self, sent: usize, laned: usize, bytes: usize, failed: usize) {
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
    }

    /// Whether a QP may write its packets straight into a same-host lane's ring
    /// ([`Wire::direct_lane`]) rather than through a [`TxBatch`]: lanes on, no fault
    /// injection, no capture (both see packets only in a batch).
    #[inline]
    pub(crate) fn lanes_direct(&self) -> bool {
        self.lanes.on() && !self.faults.on() && !super::capture::active()
    }

    /// The lane to QP `dest_qpn` of the device at `peer`, to write packets straight into
    /// (see [`super::Provider::direct_lane`]).
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
            self.account(pkts.len(), |i| (&pkts[i].0[..], pkts[i].1));
        }
        next
    }
}
