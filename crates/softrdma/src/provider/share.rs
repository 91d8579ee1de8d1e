//! One device, many processes: how the processes that open the same softrdma device (the same
//! IP address) share its UDP port 4791, as every process on a host shares its NIC.
//!
//! The design and the kernel facts behind it are in `docs/design/shared_devices.md`. In short:
//!
//! - **Members and slots.** Each process that opens the device binds its own socket to
//!   `IP:4791` with `SO_REUSEPORT`: the sockets form one reuseport group. The process also
//!   takes a *slot* (1..=254), by binding an abstract `AF_UNIX` datagram socket named after the
//!   device and the slot. The kernel frees both when the process dies, so a dead process never
//!   holds a slot. Every QP number of the process carries the slot in bits 16..23 (the byte
//!   at offset 5 of the BTH), every local CM communication ID in bits 24..31.
//! - **Steering.** A classic BPF program attached to the group (`SO_ATTACH_REUSEPORT_CBPF`,
//!   which needs no privilege) reads that byte of each datagram and returns the group index
//!   of the slot's socket, so a packet reaches the process that owns its QP with no extra hop.
//! - **Discovery.** Group indices are the kernel's: a member that joins is appended, and when
//!   one leaves the last one fills its hole. So the indices are *discovered*: a member sends
//!   one marker datagram per index (the program sends a marker to the index it names), each
//!   member answers on the discoverer's slot socket with the index its marker said, and the
//!   discoverer attaches a program built from the answers. Discovery runs when a member joins,
//!   and again whenever a packet arrives at the wrong process (after a death).
//! - **Correctness never depends on steering.** A packet that reaches the wrong process (the
//!   program is stale, or a GRO batch mixes QPs of two processes) is forwarded to the owner's
//!   slot socket, counted in `misrouted`, and goes through the owner's checks as if it had
//!   arrived on its UDP socket. A packet for a slot nobody holds is dropped (`unknown_qp`),
//!   as a NIC drops packets for a QP that no longer exists.
//! - **QP 1.** The connection manager's MADs are routed by what they name: a REQ or SIDR_REQ
//!   by its service ID, to the process that listens on it (listeners claim
//!   `svc/<id>` names, so two processes cannot listen on one service of a device: `EADDRINUSE`),
//!   every other CM message by the communication ID it is addressed to.

use super::steer::{steering_program, MARKER_LEN, MARKER_MAGIC, MARKER_OPCODE};
use super::unix_names::{
    bind_name, connect_slot, get_addr, hold_name, name, name_is_held, put_addr, unix_socket,
    ADDR_LEN,
};
use crate::error::{Error, ErrorKind, Result};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The lowest and highest slot a process can take (0 would make QP 1's byte a slot, 255
/// the multicast QP's).
pub(crate) const FIRST_SLOT: u8 = 1;
/// See [`FIRST_SLOT`].
pub(crate) const LAST_SLOT: u8 = 254;
/// The lowest slot a further receive queue of a process can take (see `Share::join_further`).
pub(crate) const FURTHER_SLOTS: u8 = 128;

/// Kinds of message on a slot socket.
const MSG_PACKET: u8 = 1;
const MSG_REPLY: u8 = 2;
/// A same-host lane offered (with its ring and bell) or accepted (see `lanes`).
pub(super) const MSG_LANE_OFFER: u8 = 3;
/// See [`MSG_LANE_OFFER`].
pub(super) const MSG_LANE_ACCEPT: u8 = 4;
/// A QP pair ring offered (with its ring) or answered (see `lanes::pair`).
pub(super) const MSG_PAIR_OFFER: u8 = 5;
/// See [`MSG_PAIR_OFFER`].
pub(super) const MSG_PAIR_ACCEPT: u8 = 6;
/// Bytes before the packet in a forwarded packet: kind, the sender's address (see
/// [`super::unix_names::put_addr`]).
const FWD_HEADER: usize = 1 + ADDR_LEN;

/// The slot byte of a QP number (bits 16..23).
#[inline]
pub(crate) fn slot_of_qpn(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

/// The slot byte of a local CM communication ID (bits 24..31).
#[inline]
pub(crate) fn slot_of_comm_id(id: u32) -> u8 {
    (id >> 24) as u8
}

/// What a process holds of a shared device.
pub(crate) struct Share {
    ip: IpAddr,
    /// This process's slot on the device.
    slot: u8,
    /// The slot socket: forwarded packets and discovery answers arrive here.
    sock: OwnedFd,
    /// This process's socket's index in the reuseport group, as the last marker said
    /// (`u32::MAX`: not known yet).
    index: AtomicU32,
    /// A discovery runs (at most one per process and device).
    discovering: AtomicBool,
    /// Asked to discover again after the running one.
    again: AtomicBool,
    disc: Mutex<Disc>,
    answered: Condvar,
    /// Sockets connected to other slots' sockets, for forwarding.
    peers: Mutex<std::collections::HashMap<u8, OwnedFd>>,
}

/// How long forwarding one packet may wait for room in the owner's queue.
const FORWARD_WAIT: Duration = Duration::from_millis(20);

/// The state of a discovery.
#[derive(Default)]
struct Disc {
    nonce: u64,
    /// (slot, index) answers to the markers of `nonce`.
    answers: Vec<(u8, u8)>,
    /// When the last discovery ended (rate limit for rediscovery).
    last: Option<Instant>,
    /// The members and their indices as the last discovery found them.
    members: Vec<(u8, u8)>,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("ip", &self.ip)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Share {
    /// Takes a free slot of the device at `ip` (starting from a random one).
    ///
    /// Fails with `EBUSY` when all 254 slots are taken, and with the socket error otherwise.
    pub(crate) fn join(ip: IpAddr) -> Result<Share> {
        Self::join_in(ip, FIRST_SLOT, LAST_SLOT)
    }

    /// [`Share::join`] for a further receive queue of a process that holds a slot already:
    /// from the upper half of the slots only, so that processes' further queues never take
    /// the slots that processes opening the device need (at least 127 stay theirs).
    pub(crate) fn join_further(ip: IpAddr) -> Result<Share> {
        Self::join_in(ip, FURTHER_SLOTS, LAST_SLOT)
    }

    /// Takes a free slot in `first..=last` (see [`Share::join`]).
    fn join_in(ip: IpAddr, first: u8, last: u8) -> Result<Share> {
        let span = u32::from(last - first) + 1;
        let start = crate::gid::random_u32() % span;
        for k in 0..span {
            let slot = first + ((start + k) % span) as u8;
            if let Some(sock) = bind_name(&name(ip, &format!("slot/{slot}")))? {
                // Room for bursts of forwarded packets.
                let size: libc::c_int = 4 << 20;
                // SAFETY: a pointer to a live c_int and its size.
                unsafe {
                    libc::setsockopt(
                        sock.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_RCVBUF,
                        (&size as *const libc::c_int).cast(),
                        size_of::<libc::c_int>() as libc::socklen_t,
                    );
                    // Each message says who sent it: a lane is taken only from this user.
                    let on: libc::c_int = 1;
                    libc::setsockopt(
                        sock.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_PASSCRED,
                        (&on as *const libc::c_int).cast(),
                        size_of::<libc::c_int>() as libc::socklen_t,
                    );
                }
                return Ok(Share {
                    ip,
                    slot,
                    sock,
                    index: AtomicU32::new(u32::MAX),
                    discovering: AtomicBool::new(false),
                    again: AtomicBool::new(false),
                    disc: Mutex::new(Disc::default()),
                    answered: Condvar::new(),
                    peers: Mutex::new(std::collections::HashMap::new()),
                });
            }
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!("all {span} process slots of the device at {ip} are taken"),
        ))
    }

    /// This process's slot.
    pub(crate) fn slot(&self) -> u8 {
        self.slot
    }

    /// The slot socket's descriptor (for the progress thread's poll set).
    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// The slots other processes hold now on this device.
    pub(crate) fn live_slots(&self) -> Vec<u8> {
        let Ok(probe) = unix_socket() else {
            return Vec::new();
        };
        (FIRST_SLOT..=LAST_SLOT)
            .filter(|&s| {
                s != self.slot && name_is_held(&probe, &name(self.ip, &format!("slot/{s}")))
            })
            .collect()
    }

    /// The members the last discovery found (slot, group index), this process included.
    pub(crate) fn members(&self) -> Vec<(u8, u8)> {
        self.disc
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .members
            .clone()
    }

    /// Sends one message, gathered from `parts`, to the slot socket of `slot`, through a
    /// socket connected to it (kept for the next time). A datagram socket's queue is short
    /// (`net.unix.max_dgram_qlen`, 10 by default), so a full one is waited for, at most
    /// [`FORWARD_WAIT`] in all: a burst of forwarded packets is slowed, not dropped. Fails
    /// with `ECONNREFUSED` when no process holds the slot, `EAGAIN` when its queue stayed
    /// full.
    fn send_to_slot(&self, slot: u8, parts: &[&[u8]]) -> std::io::Result<()> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let std::collections::hash_map::Entry::Vacant(v) = peers.entry(slot) {
            v.insert(connect_slot(self.ip, slot)?);
        }
        let fd = peers[&slot].as_raw_fd();
        let mut iov: [libc::iovec; 4] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        let n = parts.len().min(4);
        for (v, p) in iov.iter_mut().zip(parts) {
            *v = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
        }
        // SAFETY: all-zero msghdr is valid; the iovecs outlive the calls.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n;
        let end = Instant::now() + FORWARD_WAIT;
        loop {
            // SAFETY: msg describes valid buffers; fd is a connected socket.
            let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            let left = end.saturating_duration_since(Instant::now());
            if e.raw_os_error() != Some(libc::EAGAIN) || left.is_zero() {
                if e.raw_os_error() != Some(libc::EAGAIN) {
                    // The process is gone (ECONNREFUSED): connect afresh next time.
                    peers.remove(&slot);
                }
                return Err(e);
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as libc::c_int) };
        }
    }

    /// Forwards a packet (`pkt`, the UDP payload) that arrived from `src` to the process in
    /// `slot`. Fails with the socket error: `ECONNREFUSED` when no process holds the slot,
    /// `EAGAIN` when its socket is full.
    pub(crate) fn forward(&self, slot: u8, src: SocketAddr, pkt: &[u8]) -> std::io::Result<()> {
        let mut h = [0u8; FWD_HEADER];
        h[0] = MSG_PACKET;
        put_addr(&mut h[1..], src);
        self.send_to_slot(slot, &[&h, pkt])
    }

    /// Receives one message from the slot socket into `buf`, without blocking; `None` when
    /// nothing waits. A discovery answer is taken in here (and gives [`SlotMsg::Other`]).
    pub(crate) fn recv(&self, buf: &mut [u8]) -> Option<SlotMsg> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for the sender's credentials and MAX_FDS descriptors (u64s: aligned).
        let mut cbuf = [0u64; 16];
        // SAFETY: all-zero msghdr is valid; iov and cbuf outlive the call.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 16]>();
        // SAFETY: msg describes valid buffers.
        let r = unsafe {
            libc::recvmsg(
                self.sock.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if r < 0 {
            return None;
        }
        let (fds, uid) = super::scm::control(&msg);
        let m = &buf[..r as usize];
        Some(match m.first() {
            Some(&MSG_PACKET) if m.len() >= FWD_HEADER => match get_addr(&m[1..]) {
                Some(src) => SlotMsg::Packet(src, FWD_HEADER..m.len()),
                None => SlotMsg::Other,
            },
            Some(&MSG_REPLY) if m.len() == 11 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&m[1..9]);
                let nonce = u64::from_be_bytes(n);
                let mut d = self.disc.lock().unwrap_or_else(|p| p.into_inner());
                if d.nonce == nonce && !d.answers.iter().any(|&(s, _)| s == m[9]) {
                    d.answers.push((m[9], m[10]));
                    self.answered.notify_all();
                }
                SlotMsg::Other
            }
            Some(&MSG_LANE_OFFER)
            | Some(&MSG_LANE_ACCEPT)
            | Some(&MSG_PAIR_OFFER)
            | Some(&MSG_PAIR_ACCEPT) => {
                // SAFETY: getuid cannot fail.
                if uid != Some(unsafe { libc::getuid() }) {
                    tracing::debug!(?uid, "a lane message from another user ignored");
                    return Some(SlotMsg::Other);
                }
                SlotMsg::Lane(r as usize, fds)
            }
            _ => SlotMsg::Other,
        })
    }

    /// Whether `pkt`, from `src` to this device, is a discovery marker (then it has been
    /// answered).
    pub(crate) fn on_marker(&self, pkt: &[u8], src: SocketAddr) -> bool {
        if pkt.len() != MARKER_LEN
            || pkt[0] != MARKER_OPCODE
            || pkt[2..6] != MARKER_MAGIC
            || src.ip() != self.ip
        {
            return false;
        }
        let index = pkt[1];
        self.index.store(u32::from(index), Ordering::Relaxed);
        let mut reply = [0u8; 11];
        reply[0] = MSG_REPLY;
        reply[1..9].copy_from_slice(&pkt[7..15]);
        reply[9] = self.slot;
        reply[10] = index;
        let _ = self.send_to_slot(pkt[6], &[&reply]);
        true
    }

    /// Whether a packet that reached the wrong process should start a discovery: none runs
    /// and none ended in the last 100 ms (a burst of misrouted packets starts one).
    pub(crate) fn discovery_due(&self) -> bool {
        !self.discovering.load(Ordering::Acquire)
            && self
                .disc
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
    }

    /// Whether a discovery runs (then it is asked to run once more after).
    pub(crate) fn busy(&self) -> bool {
        if self.discovering.load(Ordering::Acquire) {
            self.again.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Runs discovery unless one runs or one ended less than `min_gap` ago (then asks for one
    /// more after the running one). `send_marker` sends a datagram to the device's own
    /// `IP:4791` from its UDP socket; `attach` attaches a steering program to the group.
    /// Blocks for up to about a second; meant for a thread of its own.
    pub(crate) fn discover(
        &self,
        min_gap: Duration,
        send_marker: impl Fn(&[u8]),
        attach: impl Fn(&[libc::sock_filter]) -> Result<()>,
    ) {
        if self.discovering.swap(true, Ordering::AcqRel) {
            self.again.store(true, Ordering::Release);
            return;
        }
        loop {
            let recent = self
                .disc
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last
                .is_some_and(|t| t.elapsed() < min_gap);
            if recent {
                std::thread::sleep(min_gap);
            }
            self.again.store(false, Ordering::Release);
            // One discovery at a time per device on the host: the members' answers and the
            // program must come from one view of the group.
            let lock = hold_name(&name(self.ip, "discovery"), Duration::from_secs(2));
            // Markers are steered only by a program that has the marker rule. Any member
            // that finished a discovery attached one, and it stays with the group, so the
            // first round goes without touching it. A group whose members all started at
            // once has none yet, and its kernel hash sends every marker of this member to
            // one socket: when the first round fails, attach the program of the members
            // known so far (none for a newcomer: the others' packets are then spread by the
            // hash, and forwarded, until the result) and go on.
            let found = (0..6).find_map(|attempt| {
                if attempt == 1 {
                    if let Err(e) = attach(&steering_program(&self.members())) {
                        tracing::warn!(error = %e, "attaching the steering program");
                    }
                }
                if attempt > 1 {
                    std::thread::sleep(Duration::from_millis(5 << attempt));
                }
                self.discover_once(&send_marker)
            });
            if let Some(members) = found {
                let prog = steering_program(&members);
                match attach(&prog) {
                    Ok(()) => {
                        tracing::debug!(ip = %self.ip, ?members, "steering program attached")
                    }
                    Err(e) => tracing::warn!(error = %e, "attaching the steering program"),
                }
                let mut d = self.disc.lock().unwrap_or_else(|p| p.into_inner());
                d.members = members;
            } else {
                tracing::debug!(ip = %self.ip, "discovery found no consistent view; packets are forwarded");
            }
            drop(lock);
            self.disc.lock().unwrap_or_else(|p| p.into_inner()).last = Some(Instant::now());
            if !self.again.load(Ordering::Acquire) {
                break;
            }
        }
        self.discovering.store(false, Ordering::Release);
    }

    /// One round of discovery: the members' (slot, index) when every live member answered
    /// with a distinct index below the group's size.
    fn discover_once(&self, send_marker: &impl Fn(&[u8])) -> Option<Vec<(u8, u8)>> {
        let mut live = self.live_slots();
        live.push(self.slot);
        live.sort_unstable();
        let n = live.len();
        let nonce =
            (u64::from(crate::gid::random_u32()) << 32) | u64::from(crate::gid::random_u32());
        {
            let mut d = self.disc.lock().unwrap_or_else(|p| p.into_inner());
            d.nonce = nonce;
            d.answers.clear();
        }
        for i in 0..n {
            let mut m = [0u8; MARKER_LEN];
            m[0] = MARKER_OPCODE;
            m[1] = i as u8;
            m[2..6].copy_from_slice(&MARKER_MAGIC);
            m[6] = self.slot;
            m[7..15].copy_from_slice(&nonce.to_be_bytes());
            send_marker(&m);
        }
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut d = self.disc.lock().unwrap_or_else(|p| p.into_inner());
        while d.answers.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            d = self
                .answered
                .wait_timeout(d, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut answers = d.answers.clone();
        drop(d);
        answers.sort_unstable();
        let slots: Vec<u8> = answers.iter().map(|a| a.0).collect();
        let mut idx: Vec<u8> = answers.iter().map(|a| a.1).collect();
        idx.sort_unstable();
        let consistent = slots == live && idx.iter().enumerate().all(|(k, &i)| usize::from(i) == k);
        tracing::trace!(ip = %self.ip, ?live, ?answers, consistent, "discovery round");
        consistent.then_some(answers)
    }

    /// Claims the service ID `sid` of this device for a listener of this process: fails with
    /// `EADDRINUSE` when another process listens on it. The claim lasts as long as the value.
    pub(crate) fn claim_service(&self, sid: u64) -> Result<ServiceClaim> {
        let Some(lock) = bind_name(&name(self.ip, &format!("svc/{sid:016x}")))? else {
            return Err(Error::new(
                ErrorKind::AddrInUse,
                format!(
                    "another process listens on service {sid:#x} of the device at {}",
                    self.ip
                ),
            ));
        };
        let locator = bind_name(&name(self.ip, &format!("svc/{sid:016x}/{}", self.slot)))?
            .ok_or_else(|| Error::new(ErrorKind::AddrInUse, "service locator taken"))?;
        Ok(ServiceClaim {
            _lock: lock,
            _locator: locator,
        })
    }

    /// The slot of the process (other than this one) that listens on the service `sid` of
    /// this device, if any.
    pub(crate) fn service_owner(&self, sid: u64) -> Option<u8> {
        let probe = unix_socket().ok()?;
        if !name_is_held(&probe, &name(self.ip, &format!("svc/{sid:016x}"))) {
            return None;
        }
        let known: Vec<u8> = self.members().into_iter().map(|m| m.0).collect();
        let held = |s: u8| name_is_held(&probe, &name(self.ip, &format!("svc/{sid:016x}/{s}")));
        known
            .iter()
            .copied()
            .filter(|&s| s != self.slot)
            .find(|&s| held(s))
            .or_else(|| {
                (FIRST_SLOT..=LAST_SLOT)
                    .filter(|&s| s != self.slot)
                    .find(|&s| held(s))
            })
    }
}

/// A message from a slot socket ([`Share::recv`]).
pub(crate) enum SlotMsg {
    /// A packet forwarded by another process: its sender, and where it lies in the buffer.
    Packet(SocketAddr, std::ops::Range<usize>),
    /// A same-host lane message from a process of this user: its length in the buffer, and
    /// the descriptors that came with it.
    Lane(usize, Vec<OwnedFd>),
    /// Nothing for the caller (a discovery answer, or a message that makes no sense).
    Other,
}

/// A listener's hold on a service ID of a shared device ([`Share::claim_service`]).
#[derive(Debug)]
pub(crate) struct ServiceClaim {
    _lock: OwnedFd,
    _locator: OwnedFd,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_probed() {
        let ip: IpAddr = crate::testing::unique_loopback_addr().into();
        let a = Share::join(ip).unwrap();
        let b = Share::join(ip).unwrap();
        assert_ne!(a.slot(), b.slot());
        assert_eq!(a.live_slots(), vec![b.slot()]);
        let c1 = a.claim_service(0x1_0600_1234).unwrap();
        let e = b.claim_service(0x1_0600_1234).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRINUSE);
        assert_eq!(b.service_owner(0x1_0600_1234), Some(a.slot()));
        drop(c1);
        assert_eq!(b.service_owner(0x1_0600_1234), None);
        drop(b);
        assert!(a.live_slots().is_empty());
    }
}
