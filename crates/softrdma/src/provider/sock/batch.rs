//! Batched I/O on a socket: `sendmmsg` with UDP GSO, `recvmmsg` with GRO.

use super::{from_sockaddr, gso_to, write_sockaddr, GsoTo, UdpSock, UDP_GRO, UDP_SEGMENT};
use crate::error::{Error, Result};
use softrdma_wire::icrc::{self, IdentBasis, IdentSolver};
use softrdma_wire::roce::ICRC_LEN;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

impl UdpSock {
    /// Sends `pkts[i].0` to `pkts[i].1`, in order, with as few system calls as possible:
    /// consecutive packets of the same length to the same destination (the last of a run may
    /// be shorter) go out as one UDP GSO "super-datagram" that the kernel cuts into datagrams
    /// (or, on loopback, hands whole to a GRO receiver), and up to 64 such messages go into
    /// one `sendmmsg`. (An answer and the ACK behind it, to a loopback peer, are one such
    /// message: whoever receives it takes both at once, so that a program that waits for the
    /// completion of its RDMA WRITE and then spins on memory for the peer's answer finds the
    /// answer landed. As two datagrams, `ib_write_lat` over the wire waited for the progress
    /// thread's hand-off: 0.85 ms a round trip instead of 7.6 µs on 2 cores.)
    ///
    /// The packets come sealed for IPv4 identification 0, which is what an unconnected
    /// socket with DF set gives a datagram of its own. When the kernel cuts a super-datagram
    /// into IPv4 datagrams (software segmentation on the way to a device without UDP
    /// segmentation offload, or a receiver without GRO) it numbers them 0, 1, 2, … (even with
    /// DF), and a NIC that segments numbers them alike; a peer that verifies the ICRC against
    /// the header it receives (Linux rxe, a RoCE NIC) would drop every datagram but the first.
    /// So toward unicast IPv4 addresses other than loopback (where a batch of fewer than
    /// [`CUT_MIN`] packets goes one datagram a packet) the `k`-th packet of a
    /// super-datagram goes with its ICRC turned into the one for identification `k`
    /// ([`softrdma_wire::icrc::ipv4_ident_syndrome`]; four bytes from a scratch buffer, the
    /// packet itself unchanged), unless `SOFTRDMA_GSO_NUMBERED=0`, which sends each packet
    /// there as a datagram of its own. Toward loopback addresses (whose GRO receiver takes a
    /// super-datagram whole, every datagram with identification 0) and over IPv6 (which has no
    /// identification; toward another host from batches of [`CUT_MIN`] or more only) packets go as
    /// sealed; to IPv4 multicast and broadcast one at a time.
    ///
    /// A packet's [`Gap`]s (the third field, in order of offset) are bytes the kernel takes
    /// from the program's memory rather than from the packet's buffer (which holds the rest
    /// of the packet at their offsets, and its full length).
    ///
    /// Datagrams the kernel refuses (`EMSGSIZE`, unreachable) are dropped and counted in the
    /// second field of the result, as a NIC drops what it cannot send. The first counts the
    /// packets sent, the third those of them sent with a number other than 0 (see above).
    ///
    /// # Safety
    /// Every gap's memory is valid for reads until the call returns.
    pub(crate) unsafe fn send_batch<'a>(
        &self,
        count: usize,
        pkt: impl Fn(usize) -> (&'a [u8], SocketAddr, &'a [Gap]),
    ) -> (usize, usize, usize) {
        const MAX_SEGS: usize = 64;
        const MAX_GSO_BYTES: usize = 65000;
        SEND_SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let SendScratch {
                groups,
                iovs,
                hdrs,
                icrcs,
                idents,
            } = &mut *scratch;
            let gso = self.gso.load(Ordering::Relaxed);
            let number_loopback = self.gso_number_loopback || test_number_loopback();
            // Groups: (first packet, number of packets, segment size, numbered).
            groups.clear();
            let mut i = 0;
            while i < count {
                let (first, dst, _) = pkt(i);
                let seg = first.len();
                let mut n = 1;
                let mut total = seg;
                let to = gso_to(dst, number_loopback);
                // (Whether a run may go as one message, whether it is cut on the way,
                // whether its datagrams are numbered.)
                let (may, cut, numbered) = match to {
                    GsoTo::Whole => (true, false, false),
                    GsoTo::Cut { numbered } => (!numbered || self.gso_numbered, true, numbered),
                    GsoTo::Never => (false, true, false),
                };
                if gso && may {
                    while i + n < count && n < MAX_SEGS {
                        let (p, d, _) = pkt(i + n);
                        // One super-datagram carries packets for one process of the
                        // peer device: the peer's steering reads the first packet's QP slot.
                        if d != dst
                            || p.get(5) != first.get(5)
                            || p.len() > seg
                            || total + p.len() > MAX_GSO_BYTES
                            || p.len() < ICRC_LEN
                        {
                            break;
                        }
                        total += p.len();
                        n += 1;
                        if p.len() < seg {
                            break;
                        }
                    }
                }
                if cut && n > 1 && count < CUT_MIN {
                    // Too few to pay for cutting: each its own datagram, as sealed.
                    groups.extend((i..i + n).map(|k| (k, 1, pkt(k).0.len(), false)));
                } else {
                    groups.push((i, n, seg, numbered && n > 1));
                }
                i += n;
            }
            let mut sent = 0;
            let mut failed = 0;
            let mut numbered_sent = 0;
            let mut g = 0;
            // SAFETY: CMSG_SPACE is a pure computation.
            let cmsg_space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            while g < groups.len() {
                let n = (groups.len() - g).min(MMSG_MAX);
                // The numbered packets' ICRCs first: the iovecs below point into `icrcs`,
                // which must not grow meanwhile.
                icrcs.clear();
                // (One basis for a group's packets of its segment size; only its last may be
                // shorter.)
                for &(first, count, seg, numbered) in &groups[g..g + n] {
                    if numbered {
                        let full = icrc::ipv4_ident_basis(idents, seg - ICRC_LEN);
                        let mut shorter = None;
                        for k in 1..count {
                            let p = pkt(first + k).0;
                            if p.len() == seg {
                                icrcs.push(numbered_icrc(full, p, k as u16));
                            } else {
                                shorter = Some((p, k as u16));
                            }
                        }
                        if let Some((p, k)) = shorter {
                            let b = icrc::ipv4_ident_basis(idents, p.len() - ICRC_LEN);
                            icrcs.push(numbered_icrc(b, p, k));
                        }
                    }
                }
                iovs.clear();
                let mut iov_counts = [0usize; MMSG_MAX];
                let mut numbered_at = 0;
                for (&(first, count, _, numbered), c) in
                    groups[g..g + n].iter().zip(&mut iov_counts)
                {
                    let before = iovs.len();
                    for k in first..first + count {
                        let (p, _, gaps) = pkt(k);
                        if numbered && k > first {
                            // Gaps lie before the ICRC (`TxBatch::commit_gapped`).
                            let icrc_at = p.len().saturating_sub(ICRC_LEN);
                            push_iovecs(iovs, &p[..icrc_at], gaps);
                            iovs.push(libc::iovec {
                                iov_base: icrcs[numbered_at].as_mut_ptr().cast(),
                                iov_len: ICRC_LEN,
                            });
                            numbered_at += 1;
                        } else {
                            push_iovecs(iovs, p, gaps);
                        }
                    }
                    *c = iovs.len() - before;
                }
                let mut at = 0;
                for k in 0..n {
                    let (first, count, seg, _) = groups[g + k];
                    hdrs.names[k].len = write_sockaddr(&pkt(first).1, &mut hdrs.names[k].ss);
                    let h = &mut hdrs.msgs[k].msg_hdr;
                    h.msg_name = (&mut hdrs.names[k].ss as *mut libc::sockaddr_storage).cast();
                    h.msg_namelen = hdrs.names[k].len;
                    h.msg_iov = iovs[at..].as_mut_ptr();
                    h.msg_iovlen = iov_counts[k];
                    h.msg_flags = 0;
                    at += iov_counts[k];
                    if count > 1 {
                        h.msg_control = hdrs.cmsgs[k].0.as_mut_ptr().cast();
                        h.msg_controllen = cmsg_space;
                        // SAFETY: the control buffer is 32 aligned bytes, enough for one cmsg
                        // carrying a u16.
                        unsafe {
                            let cm = libc::CMSG_FIRSTHDR(h);
                            (*cm).cmsg_level = libc::SOL_UDP;
                            (*cm).cmsg_type = UDP_SEGMENT;
                            (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                            std::ptr::write_unaligned(
                                libc::CMSG_DATA(cm).cast::<u16>(),
                                seg as u16,
                            );
                        }
                    } else {
                        h.msg_control = std::ptr::null_mut();
                        h.msg_controllen = 0;
                    }
                }
                // SAFETY: msgs[..n] point at live buffers, iovecs, names and control data,
                // all of which outlive the call, and at gaps' memory, valid until it returns
                // (the caller's contract).
                let r = unsafe {
                    libc::sendmmsg(
                        self.fd.as_raw_fd(),
                        hdrs.msgs.as_mut_ptr(),
                        n as libc::c_uint,
                        0,
                    )
                };
                if r > 0 {
                    for &(_, count, _, numbered) in &groups[g..g + r as usize] {
                        sent += count;
                        if numbered {
                            numbered_sent += count - 1;
                        }
                    }
                    g += r as usize;
                    continue;
                }
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        // The send buffer is full: wait until writable, then go on.
                        let mut p = libc::pollfd {
                            fd: self.fd.as_raw_fd(),
                            events: libc::POLLOUT,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd.
                        unsafe { libc::poll(&mut p, 1, 100) };
                    }
                    Some(libc::EIO) | Some(libc::EINVAL) if groups[g].1 > 1 => {
                        // No UDP GSO here: send every packet on its own from now on (this
                        // group's packets become groups of one, sent on the next round).
                        tracing::info!(error = %e, "UDP GSO unavailable; sending datagrams one by one");
                        self.gso.store(false, Ordering::Relaxed);
                        let (first, count, _, _) = groups[g];
                        let singles: Vec<(usize, usize, usize, bool)> = (first..first + count)
                            .map(|k| (k, 1, pkt(k).0.len(), false))
                            .collect();
                        groups.splice(g..g + 1, singles);
                    }
                    _ => {
                        // The first message failed on its own: drop it and go on.
                        tracing::debug!(error = %e, dst = %pkt(groups[g].0).1, "datagram not sent");
                        failed += groups[g].1;
                        g += 1;
                    }
                }
            }
            (sent, failed, numbered_sent)
        })
    }

    /// Receives up to `bufs.len()` messages without blocking; for each, its length, source
    /// and GRO segment size (0: one datagram) go into `meta`. With GRO a message holds several
    /// datagrams of `segment` bytes each (the last may be shorter). Returns how many messages
    /// arrived (0 when none is waiting). Fails only with an error of `recvmmsg` other than
    /// `EAGAIN` and `EINTR` (an ICMP error reported for an earlier datagram, for instance).
    pub(crate) fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        meta: &mut [RxMsg],
        scratch: &mut RecvScratch,
    ) -> Result<usize> {
        self.recv_batch_upto(bufs, meta, scratch, MMSG_MAX)
    }

    /// [`UdpSock::recv_batch`], taking at most `max` messages (at least one). On loopback a
    /// `recvmmsg` that takes one message of up to 64 costs some 0.3-0.5 µs more than one of up to
    /// one (`scripts/probes/udp_recv_variants.c`): after the message it tries for another and
    /// finds none. A receiver that expects one message (a ping-pong's answer) asks for one.
    pub(crate) fn recv_batch_upto(
        &self,
        bufs: &mut [Vec<u8>],
        meta: &mut [RxMsg],
        scratch: &mut RecvScratch,
        max: usize,
    ) -> Result<usize> {
        let all = bufs.len().min(MMSG_MAX).min(meta.len());
        let n = all.min(max.max(1));
        if n == 0 {
            return Ok(0);
        }
        let RecvScratch { hdrs, key, dirty } = scratch;
        // The headers of the last call on the same buffers are still in place: only the
        // fields the kernel wrote back (for the messages it filled) are reset. A busy
        // poller calls this in a loop, mostly for nothing. (Set up for all the buffers, so
        // that a call for fewer finds them ready.)
        let k = (
            bufs.as_ptr() as usize,
            all,
            self.gro,
            bufs[0].as_ptr() as usize,
            bufs[all - 1].as_ptr() as usize,
            bufs[0].len(),
        );
        let reset = if *key == Some(k) { *dirty } else { all };
        *key = Some(k);
        let controllen = if self.gro { 32 } else { 0 };
        for (i, buf) in bufs.iter_mut().enumerate().take(reset) {
            hdrs.iovs[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let h = &mut hdrs.msgs[i].msg_hdr;
            h.msg_name = (&mut hdrs.names[i].ss as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut hdrs.iovs[i];
            h.msg_iovlen = 1;
            h.msg_flags = 0;
            h.msg_control = if self.gro {
                hdrs.cmsgs[i].0.as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
            h.msg_controllen = controllen;
        }
        // Whatever happens below, the kernel writes into the first message at most.
        *dirty = 1;
        loop {
            // SAFETY: msgs[..n] point at live, writable buffers, names and control
            // buffers, all of which outlive the call.
            let r = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                let r = r as usize;
                *dirty = r.max(1);
                for (i, m) in meta.iter_mut().enumerate().take(r) {
                    let h = &hdrs.msgs[i].msg_hdr;
                    let truncated = h.msg_flags & libc::MSG_TRUNC != 0;
                    let mut segment = 0;
                    if self.gro && h.msg_controllen > 0 {
                        // SAFETY: the kernel filled at most msg_controllen bytes of our
                        // 32-byte control buffer with well-formed cmsgs.
                        unsafe {
                            let mut cm = libc::CMSG_FIRSTHDR(h);
                            while !cm.is_null() {
                                if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                                    segment = std::ptr::read_unaligned(
                                        libc::CMSG_DATA(cm).cast::<libc::c_int>(),
                                    ) as usize;
                                }
                                cm = libc::CMSG_NXTHDR(h, cm);
                            }
                        }
                    }
                    *m = RxMsg {
                        len: if truncated {
                            0
                        } else {
                            hdrs.msgs[i].msg_len as usize
                        },
                        src: from_sockaddr(&hdrs.names[i].ss),
                        segment,
                        truncated,
                    };
                }
                return Ok(r);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                _ => return Err(Error::from_io(e, "recvmmsg")),
            }
        }
    }
}

/// Bytes of a packet that its buffer does not hold: `len` bytes of the program's memory at
/// `src` stand at offset `at` of the packet (see [`UdpSock::send_batch`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gap {
    pub(crate) at: usize,
    pub(crate) src: *const u8,
    pub(crate) len: usize,
}

/// Appends the pieces of packet `p` to `iovs`: its buffer's bytes around its `gaps` (in order
/// of offset, within the packet), and the gaps' memory.
#[inline]
fn push_iovecs(iovs: &mut Vec<libc::iovec>, p: &[u8], gaps: &[Gap]) {
    let mut at = 0;
    for g in gaps {
        if g.at > at {
            iovs.push(libc::iovec {
                iov_base: p[at..].as_ptr() as *mut libc::c_void,
                iov_len: g.at - at,
            });
        }
        iovs.push(libc::iovec {
            iov_base: g.src as *mut libc::c_void,
            iov_len: g.len,
        });
        at = g.at + g.len;
    }
    if at < p.len() {
        iovs.push(libc::iovec {
            iov_base: p[at..].as_ptr() as *mut libc::c_void,
            iov_len: p.len() - at,
        });
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: sends of this thread treat loopback addresses as numbered destinations.
    static NUMBER_LOOPBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tests: whether this thread asked for loopback addresses to be numbered destinations.
#[inline]
fn test_number_loopback() -> bool {
    #[cfg(test)]
    if NUMBER_LOOPBACK.with(std::cell::Cell::get) {
        return true;
    }
    false
}

/// The fewest packets a batch holds for its runs to go as UDP GSO messages to another host
/// (see [`UdpSock::send_batch`]); a smaller batch (a lone message, an answer with its ACK
/// behind) goes one datagram a packet. The kernel cuts such a
/// message into datagrams in the sender's system call, so the receiver starts on the first
/// only when the last is cut: a cost to a lone mid-size message (between two network
/// namespaces over veth, 2 cores: a 16 KiB WRITE's round trip 13-14 µs typical as four
/// datagrams, 19-24 as one message) that only a stream repays (64 KiB: 37 -> 31), and
/// to an answer with its ACK behind (IPv6 over that veth: an 8-byte SEND's one-way 8.5-10.4 µs
/// typical as one message, 6.2-7.0 as two datagrams).
const CUT_MIN: usize = 8;

/// Messages per `sendmmsg` / `recvmmsg`.
const MMSG_MAX: usize = 64;

/// A socket address as the kernel takes it, and its length.
#[derive(Clone, Copy)]
struct Name {
    ss: libc::sockaddr_storage,
    len: libc::socklen_t,
}

/// The system-call structures of one `sendmmsg` or `recvmmsg`, kept per thread so that a
/// batch costs no allocation and no zeroing of its headers: every field the kernel reads is
/// written before each call.
struct MsgHdrs {
    names: [Name; MMSG_MAX],
    msgs: [libc::mmsghdr; MMSG_MAX],
    cmsgs: [CmsgBuf; MMSG_MAX],
    iovs: [libc::iovec; MMSG_MAX],
}

impl MsgHdrs {
    fn new() -> Box<MsgHdrs> {
        // SAFETY: plain C structures (integers and raw pointers), for which all-zero is a
        // valid value.
        Box::new(unsafe { zeroed() })
    }
}

/// The scratch of a receiver for [`UdpSock::recv_batch`] (one per set of receive buffers,
/// kept with them): the headers, the buffers they were set up for (their addresses and
/// count, and whether GRO control buffers are attached), and how many of them the kernel may
/// have written into since. Kept with the buffers rather than per thread, so that a thread
/// that receives for several devices or receive queues in turn (a CQ shared by QPs of
/// several queues) does not set up all the headers again at each call.
pub(crate) struct RecvScratch {
    hdrs: Box<MsgHdrs>,
    key: Option<(usize, usize, bool, usize, usize, usize)>,
    dirty: usize,
}

impl RecvScratch {
    /// An empty scratch (headers set up at the first call).
    pub(crate) fn new() -> RecvScratch {
        RecvScratch {
            hdrs: MsgHdrs::new(),
            key: None,
            dirty: 0,
        }
    }
}

// SAFETY: the raw pointers in the headers point into the scratch's own boxed headers (which
// do not move with it) and into the buffers its key names, and are only used through
// `&mut RecvScratch` in `recv_batch`, after checking the key against the buffers given.
unsafe impl Send for RecvScratch {}

/// A thread's scratch for [`UdpSock::send_batch`].
struct SendScratch {
    groups: Vec<(usize, usize, usize, bool)>,
    iovs: Vec<libc::iovec>,
    hdrs: Box<MsgHdrs>,
    /// The ICRCs of numbered packets (see [`UdpSock::send_batch`]).
    icrcs: Vec<[u8; ICRC_LEN]>,
    /// The effect of an identification on the ICRC, per packet length.
    idents: IdentSolver,
}

/// The ICRC with which packet `p` (BTH through ICRC, sealed for IPv4 identification 0) goes
/// as the datagram with identification `ident`; `basis` is that of its length
/// ([`icrc::ipv4_ident_basis`]). (A packet shorter than an ICRC joins no super-datagram; one
/// would get an ICRC of 0.)
fn numbered_icrc(basis: &IdentBasis, p: &[u8], ident: u16) -> [u8; ICRC_LEN] {
    let Some(ib_len) = p.len().checked_sub(ICRC_LEN) else {
        return [0; ICRC_LEN];
    };
    let sealed = u32::from_le_bytes([p[ib_len], p[ib_len + 1], p[ib_len + 2], p[ib_len + 3]]);
    (sealed ^ basis.syndrome(ident)).to_le_bytes()
}

thread_local! {
    static SEND_SCRATCH: std::cell::RefCell<SendScratch> = std::cell::RefCell::new(SendScratch {
        groups: Vec::with_capacity(MMSG_MAX),
        iovs: Vec::with_capacity(MMSG_MAX),
        hdrs: MsgHdrs::new(),
        icrcs: Vec::new(),
        idents: IdentSolver::new(),
    });
}

/// What [`UdpSock::recv_batch`] learnt of one received message.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RxMsg {
    /// Bytes received (0 for a truncated message).
    pub(crate) len: usize,
    /// The sender.
    pub(crate) src: Option<SocketAddr>,
    /// GRO segment size: the message holds datagrams of this many bytes (0: just one).
    pub(crate) segment: usize,
    /// The message did not fit the buffer (then `len` is 0): malformed, not a probe.
    pub(crate) truncated: bool,
}

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

#[cfg(test)]
mod tests {
    use super::super::UdpSock;
    use super::{Gap, RecvScratch, RxMsg};
    use std::net::{IpAddr, SocketAddr};

    /// Two device sockets on loopback addresses of this run's own (ports the kernel picks),
    /// with GRO as the device sockets have it.
    fn pair() -> (UdpSock, UdpSock, SocketAddr) {
        let a =
            UdpSock::bind_shared(IpAddr::V4(crate::testing::unique_loopback_addr()), 0).unwrap();
        let b =
            UdpSock::bind_shared(IpAddr::V4(crate::testing::unique_loopback_addr()), 0).unwrap();
        let ba = b.local_addr().unwrap();
        (a, b, ba)
    }

    /// Receives until `want` messages came (or 100,000 empty tries), returning each message's
    /// length and GRO segment.
    fn drain(s: &UdpSock, scratch: &mut RecvScratch, want: usize) -> Vec<(usize, usize)> {
        let mut bufs = vec![vec![0u8; 65536]; 8];
        let mut meta = vec![RxMsg::default(); 8];
        let mut got = Vec::new();
        for _ in 0..100_000 {
            let n = s.recv_batch(&mut bufs, &mut meta, scratch).unwrap();
            got.extend(meta[..n].iter().map(|m| (m.len, m.segment)));
            if got.len() >= want {
                break;
            }
        }
        got
    }

    #[test]
    fn an_answer_and_its_ack_and_a_run_of_segments_each_go_as_one_gso_message() {
        let (a, b, ba) = pair();
        let gro = b.gro;
        let gso = a.gso.load(std::sync::atomic::Ordering::Relaxed);
        let mut scratch = RecvScratch::new();
        // An answer and the shorter ACK behind it, for one QP slot (byte 5, in the BTH's
        // destination QP, is the same), to a loopback peer: one message for a GRO receiver,
        // which takes both at once (see `send_batch`).
        let two = [vec![1u8; 60], vec![1u8; 48]];
        // SAFETY: no gaps.
        let r = unsafe { a.send_batch(2, |i| (&two[i][..], ba, &[][..])) };
        assert_eq!(r, (2, 0, 0));
        let got = drain(&b, &mut scratch, if gro && gso { 1 } else { 2 });
        if gro && gso {
            assert_eq!(got, vec![(108, 60)], "one GSO message, received whole");
        } else {
            assert_eq!(got, vec![(60, 0), (48, 0)]);
        }
        // A run of eight full segments: one GSO message too.
        let run: Vec<Vec<u8>> = (0..8)
            .map(|i| {
                let mut p = vec![7u8; 1024];
                p[0] = i as u8;
                p
            })
            .collect();
        // SAFETY: no gaps.
        let r = unsafe { a.send_batch(8, |i| (&run[i][..], ba, &[][..])) };
        assert_eq!(r, (8, 0, 0));
        let got = drain(&b, &mut scratch, if gro && gso { 1 } else { 8 });
        let bytes: usize = got.iter().map(|g| g.0).sum();
        assert_eq!(bytes, 8 * 1024, "{got:?}");
        if gro && gso {
            assert_eq!(
                got,
                vec![(8 * 1024, 1024)],
                "one GSO message, received whole"
            );
        }
        // Packets for two QP slots of the peer: two messages (its steering reads the first
        // packet's slot).
        let mixed = [vec![1u8; 60], vec![2u8; 48]];
        // SAFETY: no gaps.
        let r = unsafe { a.send_batch(2, |i| (&mixed[i][..], ba, &[][..])) };
        assert_eq!(r, (2, 0, 0));
        assert_eq!(drain(&b, &mut scratch, 2), vec![(60, 0), (48, 0)]);
    }

    #[test]
    fn datagrams_cut_from_a_gso_message_carry_the_icrc_of_their_identification() {
        use softrdma_wire::icrc::{ipv4_ident_syndrome, IdentSolver};
        let (a, _, _) = pair();
        if !a.gso.load(std::sync::atomic::Ordering::Relaxed) || !a.gso_numbered {
            return; // SOFTRDMA_NO_GSO / SOFTRDMA_GSO_NUMBERED=0: nothing is numbered.
        }
        // A receiver without GRO: the kernel cuts a GSO message into datagrams for it,
        // numbering their identifications 0, 1, 2, ... as on the way to a device.
        let plain = std::net::UdpSocket::bind((crate::testing::unique_loopback_addr(), 0)).unwrap();
        plain.set_nonblocking(true).unwrap();
        let to = plain.local_addr().unwrap();
        super::NUMBER_LOOPBACK.with(|n| n.set(true));
        // Ten packets (the last shorter), one with its middle in a gap, then a run of three
        // (a message of its own, numbered from 0 again); then a batch of three alone (too few
        // to be cut: datagrams of their own, as sealed).
        let memory = vec![0x5au8; 1024];
        let mut pkts: Vec<Vec<u8>> = (0..13u32)
            .map(|i| {
                let len = if i == 9 { 500 } else { 1024 };
                let mut p: Vec<u8> = (0..len).map(|b| (b as u32 * 7 + i) as u8).collect();
                p[5] = 3; // one QP slot of the peer
                p[len - 4..].copy_from_slice(&(0x1234_5678 ^ i).to_le_bytes());
                p
            })
            .collect();
        pkts[4][100..900].fill(0x5a);
        let gap = [Gap {
            at: 100,
            src: memory.as_ptr(),
            len: 800,
        }];
        let mut junk = pkts[4].clone();
        junk[100..900].fill(0xee);
        // SAFETY: the gap's memory lives until the end.
        let r = unsafe {
            a.send_batch(13, |i| {
                let p = if i == 4 { &junk[..] } else { &pkts[i][..] };
                (p, to, if i == 4 { &gap[..] } else { &[][..] })
            })
        };
        assert_eq!(r, (13, 0, 9 + 2), "numbered: 1-9 and 1-2");
        // SAFETY: no gaps.
        let r = unsafe { a.send_batch(3, |i| (&pkts[10 + i][..], to, &[][..])) };
        super::NUMBER_LOOPBACK.with(|n| n.set(false));
        assert_eq!(r, (3, 0, 0));
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        for _ in 0..100_000 {
            if let Ok(n) = plain.recv(&mut buf) {
                got.push(buf[..n].to_vec());
                if got.len() == 16 {
                    break;
                }
            }
        }
        assert_eq!(got.len(), 16);
        let mut solver = IdentSolver::new();
        let sent = pkts.iter().chain(&pkts[10..]);
        for (k, (g, p)) in got.iter().zip(sent).enumerate() {
            assert_eq!(g.len(), p.len(), "datagram {k}");
            let n = p.len() - 4;
            assert_eq!(
                g[..n],
                p[..n],
                "datagram {k}: the bytes before the ICRC as sent"
            );
            let sealed = u32::from_le_bytes(p[n..].try_into().unwrap());
            let carried = u32::from_le_bytes(g[n..].try_into().unwrap());
            let ident = match k {
                0..10 => k as u16,
                10..13 => k as u16 - 10,
                _ => 0,
            };
            assert_eq!(
                carried,
                sealed ^ ipv4_ident_syndrome(&mut solver, n, ident),
                "datagram {k}: the ICRC for identification {ident}"
            );
        }
    }

    #[test]
    fn the_bytes_of_gaps_are_sent_from_their_memory_in_place() {
        let (a, b, ba) = pair();
        let mut scratch = RecvScratch::new();
        // Eight packets of 1,024 bytes (one GSO message where the kernel has it): the first
        // without gaps, then one gap, two gaps, a gap at the very start and one at the end.
        let memory: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 1) as u8).collect();
        let gaps: Vec<Vec<Gap>> = (0..8usize)
            .map(|i| {
                let m = memory[i * 1024..].as_ptr();
                // SAFETY: offsets within `memory`.
                let at = |off: usize| unsafe { m.add(off) };
                match i {
                    0 => vec![],
                    1 | 5 => vec![Gap {
                        at: 12,
                        src: at(12),
                        len: 1000,
                    }],
                    2 | 6 => vec![
                        Gap {
                            at: 40,
                            src: at(40),
                            len: 100,
                        },
                        Gap {
                            at: 140,
                            src: at(140),
                            len: 600,
                        },
                    ],
                    3 => vec![Gap {
                        at: 0,
                        src: at(0),
                        len: 512,
                    }],
                    _ => vec![Gap {
                        at: 512,
                        src: at(512),
                        len: 512,
                    }],
                }
            })
            .collect();
        // The buffers hold the rest; the gaps' bytes in them are junk that must not be sent.
        let bufs: Vec<Vec<u8>> = (0..8)
            .map(|i| {
                let mut p = memory[i * 1024..(i + 1) * 1024].to_vec();
                for g in &gaps[i] {
                    p[g.at..g.at + g.len].fill(0xee);
                }
                p
            })
            .collect();
        // SAFETY: every gap's memory is `memory`'s, alive until the end.
        let r = unsafe { a.send_batch(8, |i| (&bufs[i][..], ba, &gaps[i][..])) };
        assert_eq!(r, (8, 0, 0));
        let mut rx = vec![vec![0u8; 65536]; 8];
        let mut meta = vec![RxMsg::default(); 8];
        let mut got = Vec::new();
        for _ in 0..100_000 {
            let n = b.recv_batch(&mut rx, &mut meta, &mut scratch).unwrap();
            for (m, buf) in meta[..n].iter().zip(&rx) {
                got.extend_from_slice(&buf[..m.len]);
            }
            if got.len() >= memory.len() {
                break;
            }
        }
        assert!(
            got == memory,
            "the datagrams carry the memory's bytes at every gap"
        );
    }
}
