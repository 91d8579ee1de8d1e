//! Setting a lane up: the offer (a ring and a bell, passed over the receiving process's slot
//! socket) and its answer.

use super::ring::{Consumer, Producer};
use super::{InLane, Lanes, OutLane, OutState, NOT_LOCAL_FOR, REFUSED_FOR, RING_CAP};
use crate::provider::scm::send_with_fds;
use crate::provider::share::{MSG_LANE_ACCEPT, MSG_LANE_OFFER};
use crate::provider::unix_names;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
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
        m[0] = MSG_LANE_OFFER;
        unix_names::put_addr(&mut m[1..20], self.local);
        m[20] = self.slot;
        m[21..29].copy_from_slice(&nonce.to_be_bytes());
        m[29..31].copy_from_slice(&ip.port().to_be_bytes());
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
                dirty: false,
                records: false,
            },
        }
    }

    /// Takes a lane message received on the slot socket (`m`, with the descriptors `fds`),
    /// from a process of this user: an offer (mapped and answered) or an answer.
    pub(crate) fn on_message(&self, m: &[u8], mut fds: Vec<OwnedFd>) {
        match m.first() {
            Some(&MSG_LANE_OFFER) if m.len() >= OFFER_LEN && fds.len() == 2 => {
                let (Some(src), src_slot) = (unix_names::get_addr(&m[1..20]), m[20]) else {
                    return;
                };
                // For this device's socket (its port: tests run devices on other ports).
                let to_me = u16::from_be_bytes([m[29], m[30]]) == self.local.port();
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
                    });
                    self.any_inbound.store(true, Ordering::Release);
                    self.note_inbound(&inb);
                    self.gen.fetch_add(1, Ordering::Release);
                }
                let mut a = [0u8; 11];
                a[0] = MSG_LANE_ACCEPT;
                a[1..9].copy_from_slice(&m[21..29]);
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
fn bell_pair() -> crate::error::Result<(OwnedFd, OwnedFd)> {
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
/// nonce, the destination port.
const OFFER_LEN: usize = 31;
