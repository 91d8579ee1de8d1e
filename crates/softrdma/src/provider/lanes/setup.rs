//! Setting a lane up: the offer (a ring and a bell, passed over the receiving process's slot
//! socket) and its answer.

use super::pair::{PairRx, PairShared, PairTx, PAIR_CAP};
use super::ring::{Consumer, Producer, Watch};
use super::{
    pair, InLane, Lanes, OutLane, OutState, MAX_PAIRS, NOT_LOCAL_FOR, REFUSED_FOR, RING_CAP,
};
use crate::provider::scm::send_with_fds;
use crate::provider::share::{MSG_LANE_ACCEPT, MSG_LANE_OFFER, MSG_PAIR_ACCEPT, MSG_PAIR_OFFER};
use crate::provider::unix_names;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

impl Lanes {
    /// Offers a lane to the process holding `slot` of the device at `ip`, when this host has
    /// one: the state of the destination after.
    pub(super) fn offer(&self, ip: SocketAddr, slot: u8) -> OutState {
        let not_local = OutState::Wire {
            until: Instant::now() + NOT_LOCAL_FOR,
        };
        if !self.on {
            return not_local;
        }
        let Ok(sock) = unix_names::connect_slot(ip.ip(), slot) else {
            return not_local;
        };
        let made = Producer::create(RING_CAP).and_then(|(prod, memfd)| {
            let (mine, theirs) = bell_pair()?;
            Ok((prod, memfd, mine, theirs))
        });
        let (prod, memfd, mine, theirs) = match made {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "no same-host lane");
                return not_local;
            }
        };
        let nonce = self.nonces.fetch_add(1, Ordering::Relaxed);
        let mut m = [0u8; OFFER_LEN];
        self.put_offer_head(&mut m, MSG_LANE_OFFER, nonce, ip.port());
        if let Err(e) = send_with_fds(&sock, &m, &[memfd.as_raw_fd(), theirs.as_raw_fd()]) {
            tracing::debug!(%ip, slot, error = %e, "a same-host lane offer not sent");
            return not_local;
        }
        tracing::debug!(%ip, slot, "a same-host lane offered");
        OutState::Offered {
            nonce,
            at: Instant::now(),
            lane: OutLane {
                prod,
                bell: Arc::new(mine),
                alive: Arc::new(AtomicBool::new(true)),
                dirty: false,
                records: false,
            },
        }
    }

    /// Offers a QP pair ring (see [`Lanes::offer_pair`]) beside the lane whose progress
    /// `watch`, liveness `alive` and bell `bell` are given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_pair_offer(
        &self,
        dst: SocketAddr,
        slot: u8,
        src_qpn: u32,
        dest_qpn: u32,
        watch: Watch,
        alive: Arc<AtomicBool>,
        bell: Arc<OwnedFd>,
    ) -> Option<PairTx> {
        if self.pairs_out.fetch_add(1, Ordering::Relaxed) >= MAX_PAIRS {
            self.pairs_out.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // (From here the count is the ring's: given back when it drops, or below.)
        let made = Producer::create(PAIR_CAP).map_err(|e| {
            tracing::debug!(error = %e, "no QP pair ring");
        });
        let sock = unix_names::connect_slot(dst.ip(), slot).ok();
        let (Ok((prod, memfd)), Some(sock)) = (made, sock) else {
            self.pairs_out.fetch_sub(1, Ordering::Relaxed);
            return None;
        };
        let nonce = self.nonces.fetch_add(1, Ordering::Relaxed);
        let mut m = [0u8; PAIR_OFFER_LEN];
        self.put_offer_head(&mut m, MSG_PAIR_OFFER, nonce, dst.port());
        m[31..35].copy_from_slice(&src_qpn.to_be_bytes());
        m[35..39].copy_from_slice(&dest_qpn.to_be_bytes());
        let shared = Arc::new(PairShared::new());
        {
            let mut offers = self.pair_offers.lock().unwrap_or_else(|p| p.into_inner());
            // (Offers whose ring is gone, answered or not, are forgotten here.)
            offers.retain(|(_, w)| w.strong_count() > 0);
            offers.push((nonce, Arc::downgrade(&shared)));
        }
        let counts = Arc::new(pair::PairCounts::default());
        self.pair_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push(counts.clone());
        let tx = PairTx::new(
            prod,
            shared,
            watch,
            alive,
            bell,
            self.pairs_out.clone(),
            counts,
        );
        if let Err(e) = send_with_fds(&sock, &m, &[memfd.as_raw_fd()]) {
            tracing::debug!(%dst, slot, error = %e, "a QP pair ring offer not sent");
            return None;
        }
        tracing::debug!(%dst, slot, src_qpn, dest_qpn, "a QP pair ring offered");
        Some(tx)
    }

    /// Takes a lane message received on the slot socket (`m`, with the descriptors `fds`),
    /// from a process of this user: a lane's or a QP pair ring's offer (mapped and answered)
    /// or answer. A QP pair ring offered goes to `attach` (the QP it is for, the sending
    /// device, the sending QP, the ring), which says whether the QP takes it.
    pub(crate) fn on_message(&self, m: &[u8], mut fds: Vec<OwnedFd>, attach: &AttachPair) {
        match m.first() {
            Some(&MSG_PAIR_OFFER) if m.len() >= PAIR_OFFER_LEN && fds.len() == 1 => {
                let Some((h, to_me)) = self.read_offer(m) else {
                    return;
                };
                let (src, src_slot, nonce) = (h.src, h.slot, h.nonce);
                let u32_at = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
                let (src_qpn, dest_qpn) = (u32_at(31), u32_at(35));
                let memfd = fds.pop().expect("one descriptor");
                let mut accepted = false;
                if self.on && to_me && pair::pair_rings() {
                    if let Ok(cons) = Consumer::open(&memfd) {
                        let counts = Arc::new(pair::PairCounts::default());
                        self.pair_rx_counts
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                            .push(counts.clone());
                        let rx = Arc::new(PairRx::new(dest_qpn, src, cons, counts));
                        // Beside the lane from the same process (records come only when one
                        // is up both ways); under the inbound lanes' lock, which their reader
                        // takes before the QP's.
                        let mut inb = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
                        // (The newest such lane: one its producer closed may linger until its
                        // hang-up is seen.)
                        if let Some(l) = inb
                            .iter_mut()
                            .rev()
                            .find(|l| l.src == src && l.slot == src_slot)
                        {
                            if attach(dest_qpn, src, src_qpn, &rx) {
                                // (A ring the QP had from this peer before is replaced.)
                                l.pairs.retain(|p| p.qpn != dest_qpn);
                                l.pairs.push(rx);
                                accepted = true;
                                self.note_inbound(&inb);
                            }
                        }
                    }
                }
                let mut a = [0u8; 10];
                a[0] = MSG_PAIR_ACCEPT;
                a[1..9].copy_from_slice(&nonce);
                a[9] = u8::from(accepted);
                if let Ok(sock) = unix_names::connect_slot(src.ip(), src_slot) {
                    let _ = send_with_fds(&sock, &a, &[]);
                }
                tracing::debug!(%src, src_qpn, dest_qpn, accepted, "a QP pair ring offer answered");
            }
            Some(&MSG_PAIR_ACCEPT) if m.len() >= 10 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&m[1..9]);
                let nonce = u64::from_be_bytes(n);
                let mut offers = self.pair_offers.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = offers.iter().position(|(k, _)| *k == nonce) {
                    let (_, w) = offers.swap_remove(i);
                    if let Some(shared) = w.upgrade() {
                        shared.answered(m[9] == 1);
                    }
                }
            }

            Some(&MSG_LANE_OFFER) if m.len() >= OFFER_LEN && fds.len() == 2 => {
                let Some((h, to_me)) = self.read_offer(m) else {
                    return;
                };
                let (src, src_slot, nonce) = (h.src, h.slot, h.nonce);
                let theirs = fds.pop().expect("two descriptors");
                let memfd = fds.pop().expect("two descriptors");
                let cons = if self.on && to_me {
                    Consumer::open(&memfd).map_err(|e| {
                        tracing::debug!(error = %e, "a same-host lane offer refused");
                    })
                } else {
                    Err(())
                };
                let accepted = cons.is_ok();
                if let Ok(cons) = cons {
                    let mut inb = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
                    inb.push(InLane {
                        src,
                        slot: src_slot,
                        cons,
                        bell: Arc::new(theirs),
                        corrupt: false,
                        fresh: true,
                        pairs: Vec::new(),
                    });
                    self.any_inbound.store(true, Ordering::Release);
                    self.note_inbound(&inb);
                    self.gen.fetch_add(1, Ordering::Release);
                }
                let mut a = [0u8; 11];
                a[0] = MSG_LANE_ACCEPT;
                a[1..9].copy_from_slice(&nonce);
                a[9] = u8::from(accepted);
                // This process takes work-request records (`super::WR_RECORD`) unless
                // SOFTRDMA_WR_RECORDS=0.
                a[10] = u8::from(super::wr_records());
                if let Ok(sock) = unix_names::connect_slot(src.ip(), src_slot) {
                    let _ = send_with_fds(&sock, &a, &[]);
                }
                tracing::debug!(%src, src_slot, accepted, "a same-host lane offer answered");
            }
            Some(&MSG_LANE_ACCEPT) if m.len() >= 10 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&m[1..9]);
                let nonce = u64::from_be_bytes(n);
                let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
                for o in out.iter_mut() {
                    if matches!(&o.state, OutState::Offered { nonce: k, .. } if *k == nonce) {
                        let old = std::mem::replace(
                            &mut o.state,
                            OutState::Wire {
                                until: Instant::now() + NOT_LOCAL_FOR,
                            },
                        );
                        match (old, m[9]) {
                            (OutState::Offered { mut lane, .. }, 1) => {
                                lane.records = m.get(10) == Some(&1);
                                o.state = OutState::Up(lane);
                                self.records_gen.fetch_add(1, Ordering::Release);
                                self.gen.fetch_add(1, Ordering::Release);
                                tracing::debug!(ip = %o.ip, slot = o.slot, "a same-host lane is up");
                            }
                            _ => {
                                // Refused (lanes off there, or a ring it could not map):
                                // not asked again for a while.
                                o.state = OutState::Wire {
                                    until: Instant::now() + REFUSED_FOR,
                                };
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// A connected pair of `SOCK_SEQPACKET` sockets (non-blocking, close-on-exec).
pub(super) fn bell_pair() -> crate::error::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: writes two descriptors into `fds`; the result is checked.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(crate::error::Error::last_os_error("socketpair"));
    }
    // SAFETY: two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Bytes of an offer: kind, the offering device's address (family, 16, port), its slot, the
/// nonce, the destination port (see [`OfferHead`]).
const OFFER_LEN: usize = 31;

/// The fields every offer (a lane's, a QP pair ring's) begins with, after its kind.
struct OfferHead {
    /// The offering device's address and the offering process's slot on it.
    src: SocketAddr,
    slot: u8,
    /// The offer's nonce (its answer carries it back).
    nonce: [u8; 8],
    /// The port of the device the offer is for.
    port: u16,
}

impl OfferHead {
    /// Reads the fields of the offer `m` (at least [`OFFER_LEN`] bytes); `None` when its
    /// address is not one.
    fn read(m: &[u8]) -> Option<OfferHead> {
        Some(OfferHead {
            src: unix_names::get_addr(&m[1..20])?,
            slot: m[20],
            nonce: m[21..29].try_into().ok()?,
            port: u16::from_be_bytes([m[29], m[30]]),
        })
    }
}

impl Lanes {
    /// Reads the [`OfferHead`] of the offer `m` (see [`OfferHead::read`]), and whether it is
    /// for this device's socket (its port: tests run devices on other ports).
    fn read_offer(&self, m: &[u8]) -> Option<(OfferHead, bool)> {
        let h = OfferHead::read(m)?;
        let to_me = h.port == self.local.port();
        Some((h, to_me))
    }

    /// Writes the kind and the [`OfferHead`] of an offer from this device into `m` (at least
    /// [`OFFER_LEN`] bytes): for the device at port `port`, with `nonce`.
    fn put_offer_head(&self, m: &mut [u8], kind: u8, nonce: u64, port: u16) {
        m[0] = kind;
        unix_names::put_addr(&mut m[1..20], self.local);
        m[20] = self.slot;
        m[21..29].copy_from_slice(&nonce.to_be_bytes());
        m[29..31].copy_from_slice(&port.to_be_bytes());
    }
}
/// Hands a QP pair ring offered to its QP (the QP's number, the sending device, the sending
/// QP, the ring); says whether the QP took it.
pub(crate) type AttachPair<'a> = dyn Fn(u32, SocketAddr, u32, &Arc<PairRx>) -> bool + 'a;

/// Bytes of a QP pair ring's offer: a lane offer's fields, then the sending QP's number and
/// the receiving QP's.
const PAIR_OFFER_LEN: usize = 39;
