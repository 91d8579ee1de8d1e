//! The transmit side: batches of packets for one `sendmmsg`, with their ICRC, and the
//! device's [`Wire`]: its socket, wake-up eventfd, counters and fault injection, through
//! which every other part of the engine sends.

use super::counters::Counters;
use super::faults::{FaultConfig, Faults};
use super::fd::EventFd;
use super::sock::{UdpSock, ROCE_PORT};
use crate::gid::ipv6_mapped;
use softrdma_wire::icrc::IcrcPrefix;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Room for one packet: the largest transport packet (4096-byte MTU + headers + ICRC) with
/// headroom.
pub(crate) const PKT_BUF: usize = 4096 + 128;
/// Datagrams per `sendmmsg` or `recvmmsg`.
pub(crate) const BATCH: usize = 64;

/// Packets being prepared for one `sendmmsg`, with their ICRC flows.
pub(crate) struct TxBatch {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) lens: Vec<usize>,
    pub(super) dests: Vec<SocketAddr>,
    pub(super) count: usize,
    pub(super) prefixes: HashMap<(IpAddr, IpAddr), IcrcPrefix>,
    /// The flow of the last packet committed and its prefix: nearly every packet of a batch
    /// goes on the same flow as the one before, which then costs no hash lookup.
    pub(super) last: Option<(IpAddr, IpAddr, IcrcPrefix)>,
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

    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.count == BATCH
    }

    /// The buffer of the next packet.
    #[inline]
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// Seals the packet written in the current slot: computes its ICRC for the flow
    /// `src → dst` (both on port 4791) and queues it.
    pub(crate) fn commit(&mut self, len: usize, src: IpAddr, dst: IpAddr) {
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

/// The ICRC flow of packets sent from `src` to `dst` (port 4791 to port 4791). Mixed
/// families cannot happen: address vectors are checked against the device.
pub(super) fn flow(src: IpAddr, dst: IpAddr) -> IcrcPrefix {
    icrc_flow(src, ROCE_PORT, dst)
}

/// The ICRC flow of datagrams from `src` port `src_port` to `dst` port 4791 (both sides of
/// one family; IPv4-mapped otherwise).
pub(super) fn icrc_flow(src: IpAddr, src_port: u16, dst: IpAddr) -> IcrcPrefix {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IcrcPrefix::ipv4(s, d, src_port, ROCE_PORT),
        (s, d) => IcrcPrefix::ipv6(ipv6_mapped(s), ipv6_mapped(d), src_port, ROCE_PORT),
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
    faults: Faults,
}

impl Wire {
    /// The wire of the device socket `sock` bound to `local`, no faults.
    pub(crate) fn new(sock: UdpSock, local: SocketAddr) -> crate::error::Result<Wire> {
        let wake = EventFd::new()?;
        wake.set_nonblocking(true)?;
        Ok(Wire {
            sock,
            local,
            wake,
            counters: Counters::default(),
            faults: Faults::new(),
        })
    }

    /// Sends a batch of finished packets, through fault injection when it is on.
    pub(crate) fn send(&self, tx: &mut TxBatch) {
        if tx.count == 0 {
            return;
        }
        if self.faults.on() {
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

    /// Sends packets `pkt(0..count)` and counts them.
    fn account<'a>(&self, count: usize, pkt: impl Fn(usize) -> (&'a [u8], SocketAddr)) {
        if super::capture::active() {
            for i in 0..count {
                let (p, dst) = pkt(i);
                super::capture::record(self.local, dst, p);
            }
        }
        let bytes: usize = (0..count).map(|i| pkt(i).0.len()).sum();
        let (sent, failed) = self.sock.send_batch(count, pkt);
        let c = &self.counters;
        c.tx_packets.fetch_add(sent as u64, Ordering::Relaxed);
        c.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        c.tx_errors.fetch_add(failed as u64, Ordering::Relaxed);
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
