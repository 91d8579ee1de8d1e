//! The device's UDP socket: one unconnected socket bound to the device address and port 4791,
//! with the options RoCEv2 needs, and batched I/O (`sendmmsg`, `recvmmsg`).
//!
//! IPv4 sockets set `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: Linux then sends every datagram of an
//! unconnected socket with DF set and IP Identification 0, so the IPv4 header a receiver sees
//! is the one the sender predicted when it computed the ICRC (roce_cm_notes.md §5.2). IPv6
//! sockets set `IPV6_DONTFRAG`, and `UDP_NO_CHECK6_RX` so that zero-checksum datagrams (as
//! rxe sends them) are accepted.

use crate::error::{Error, ErrorKind, Result};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The RoCEv2 UDP port.
pub(crate) const ROCE_PORT: u16 = softrdma_wire::ROCE_V2_UDP_PORT;

const UDP_NO_CHECK6_RX: libc::c_int = 102;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Whether datagrams to `dst` may be sent as a UDP GSO super-datagram without their IPv4
/// identifications differing from 0 on the wire (see [`UdpSock::send_batch`]).
fn gso_keeps_ident(dst: SocketAddr) -> bool {
    match dst.ip() {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.to_ipv4_mapped().is_none_or(|m| m.is_loopback()),
    }
}

/// `setsockopt` with an option value of any plain type.
fn setopt_val<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> Result<()> {
    // SAFETY: passes a pointer to a live `T` and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(Error::last_os_error(format!(
            "setsockopt(level {level}, option {name})"
        )));
    }
    Ok(())
}

fn setopt(fd: RawFd, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> Result<()> {
    setopt_val(fd, level, name, &val)
}

pub(crate) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = write_sockaddr(addr, &mut ss);
    (ss, len)
}

/// Writes `addr` into `ss` as a `sockaddr_in` or `sockaddr_in6` and returns its length (the
/// rest of `ss` is left as it was: the kernel reads only that length).
fn write_sockaddr(addr: &SocketAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { std::ptr::write((ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    len as libc::socklen_t
}

pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // A v4-mapped source on a v6 socket is an IPv4 peer.
            let ip = match ip.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(ip),
            };
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// The device socket.
#[derive(Debug)]
pub(crate) struct UdpSock {
    fd: OwnedFd,
    /// Whether sends may use UDP GSO (cleared if the kernel refuses it).
    gso: AtomicBool,
    /// Whether the socket delivers GRO-coalesced messages.
    gro: bool,
}

impl UdpSock {
    /// Binds `addr:port` with the RoCEv2 options as a member of the device's reuseport group
    /// (`SO_REUSEPORT`): every process of this user that opens the device binds one such
    /// socket, and the group's steering program ([`UdpSock::attach_steering`]) gives each
    /// datagram to the process that owns its QP (see `provider::share`).
    ///
    /// Fails with `EADDRINUSE` when a socket without `SO_REUSEPORT`, another user's, or a
    /// kernel RoCE device holds the port on that address.
    pub(crate) fn bind_shared(addr: IpAddr, port: u16) -> Result<UdpSock> {
        Self::bind_with(SocketAddr::new(addr, port), false, true)
    }

    /// Attaches the classic BPF program `prog` to the socket's reuseport group
    /// (`SO_ATTACH_REUSEPORT_CBPF`; no privilege needed), replacing the one attached before.
    ///
    /// Fails with the `setsockopt` error (`EINVAL` for a program the kernel refuses).
    pub(crate) fn attach_steering(&self, prog: &[libc::sock_filter]) -> Result<()> {
        const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
        let fprog = libc::sock_fprog {
            len: prog.len() as libc::c_ushort,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        setopt_val(
            self.raw(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            &fprog,
        )
    }

    /// Sends one datagram `buf` to `dst` without blocking; a failure is ignored (used for
    /// discovery markers, which discovery repeats when one is lost).
    pub(crate) fn send_one(&self, buf: &[u8], dst: SocketAddr) {
        let (ss, len) = to_sockaddr(&dst);
        // SAFETY: a valid buffer and a valid sockaddr of `len` bytes.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&ss as *const libc::sockaddr_storage).cast(),
                len,
            );
        }
    }

    /// Binds `at` with the RoCEv2 options, and `SO_REUSEADDR` first when `reuse`,
    /// `SO_REUSEPORT` when `reuse_port`.
    fn bind_with(at: SocketAddr, reuse: bool, reuse_port: bool) -> Result<UdpSock> {
        let (addr, port) = (at.ip(), at.port());
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(Error::last_os_error("socket(AF_INET*, SOCK_DGRAM)"));
        }
        // SAFETY: fd is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        if addr.is_ipv4() {
            setopt(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
            // ICMP errors (port unreachable: no RoCEv2 device at a peer) reach the error
            // queue, read by take_icmp_errors, instead of being dropped.
            setopt(raw, libc::IPPROTO_IP, libc::IP_RECVERR, 1)?;
        } else {
            setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1)?;
            setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)?;
            // Accept rxe's zero-checksum IPv6 datagrams; older kernels lack the option.
            let _ = setopt(raw, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1);
        }
        for (name, size) in [(libc::SO_RCVBUF, 8 << 20), (libc::SO_SNDBUF, 8 << 20)] {
            let _ = setopt(raw, libc::SOL_SOCKET, name, size);
        }
        if reuse {
            setopt(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        }
        if reuse_port {
            setopt(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        }
        let (ss, len) = to_sockaddr(&at);
        // SAFETY: ss/len describe a valid sockaddr of the socket's family.
        let r = unsafe { libc::bind(raw, (&ss as *const libc::sockaddr_storage).cast(), len) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EADDRINUSE) {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!(
                        "UDP port {port} on {addr} is held by a socket that does not share it (another \
                         user's softrdma, another program, or a kernel RoCE device): bind another \
                         address, e.g. another 127.0.0.x on loopback"
                    ),
                ));
            }
            return Err(Error::from_io(e, format!("binding {addr}:{port}")));
        }
        let gro = std::env::var_os("SOFTRDMA_NO_GRO").is_none()
            && setopt(raw, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        let gso = std::env::var_os("SOFTRDMA_NO_GSO").is_none();
        Ok(UdpSock {
            fd,
            gso: AtomicBool::new(gso),
            gro,
        })
    }

    /// Makes the device socket able to send to IP multicast groups: out of the interface of
    /// the device address `local` (IPv4: `IP_MULTICAST_IF` with the address; IPv6:
    /// `IPV6_MULTICAST_IF` with `ifindex`), looped back to the groups' members on this host,
    /// and with a TTL / hop limit of 1.
    ///
    /// Fails with the `setsockopt` error (for IPv6, `ENODEV` or `EADDRNOTAVAIL` for a bad
    /// interface index).
    pub(crate) fn set_multicast_tx(&self, local: IpAddr, ifindex: u32) -> Result<()> {
        let raw = self.raw();
        match local {
            IpAddr::V4(a) => {
                let ifaddr = libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                };
                setopt_val(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &ifaddr)?;
                setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, 1)?;
                setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 1)?;
            }
            IpAddr::V6(_) => {
                let idx = ifindex as libc::c_int;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, idx)?;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP, 1)?;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, 1)?;
            }
        }
        Ok(())
    }

    /// A socket that receives the RoCEv2 datagrams sent to the multicast group `group`: bound
    /// to `group:4791` with `SO_REUSEADDR` (every device of every process on this host that
    /// joins the group gets its own copy) and a member of the group on the interface of the
    /// device address `local` (IPv4: `IP_ADD_MEMBERSHIP` with that address; IPv6:
    /// `IPV6_ADD_MEMBERSHIP` with `ifindex`). It only receives groups it joined itself
    /// (`IP_MULTICAST_ALL` off).
    ///
    /// Fails with `EINVAL` when `group` is not multicast or not of the family of `local`, and
    /// with the error of `socket`, `bind` or `setsockopt` otherwise (say `ENOBUFS` past the
    /// kernel's `igmp_max_memberships`, `ENODEV` for an interface without multicast).
    pub(crate) fn bind_group(group: IpAddr, local: IpAddr, ifindex: u32) -> Result<UdpSock> {
        if !group.is_multicast() || group.is_ipv4() != local.is_ipv4() {
            return Err(Error::invalid(format!(
                "{group} is not a multicast group the device at {local} can join"
            )));
        }
        // The interface index scopes a link-local group (ff02::/16, ff12::/16); the kernel
        // ignores it for wider scopes.
        let at = match group {
            IpAddr::V6(g) => SocketAddr::V6(SocketAddrV6::new(g, ROCE_PORT, 0, ifindex)),
            IpAddr::V4(_) => SocketAddr::new(group, ROCE_PORT),
        };
        let sock = Self::bind_with(at, true, false)?;
        let raw = sock.raw();
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => {
                // Best effort: kernels before 2.6.31 lack the option and deliver every group.
                let _ = setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0);
                setopt_val(raw, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq4(g, l))?;
            }
            (IpAddr::V6(g), _) => {
                let _ = setopt(raw, libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
                setopt_val(
                    raw,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_ADD_MEMBERSHIP,
                    &mreq6(g, ifindex),
                )?;
            }
            _ => unreachable!("families checked above"),
        }
        Ok(sock)
    }

    /// Leaves the group a [`UdpSock::bind_group`] socket joined (the socket then receives
    /// nothing more, even while it stays open).
    ///
    /// Fails with the `setsockopt` error (`EADDRNOTAVAIL` when it was not a member).
    pub(crate) fn leave_group(&self, group: IpAddr, local: IpAddr, ifindex: u32) -> Result<()> {
        let raw = self.raw();
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => setopt_val(
                raw,
                libc::IPPROTO_IP,
                libc::IP_DROP_MEMBERSHIP,
                &mreq4(g, l),
            ),
            (IpAddr::V6(g), _) => setopt_val(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_DROP_MEMBERSHIP,
                &mreq6(g, ifindex),
            ),
            _ => Err(Error::invalid(
                "group and device address of different families",
            )),
        }
    }

    /// The locally bound address.
    pub(crate) fn local_addr(&self) -> Result<SocketAddr> {
        // SAFETY: all-zero sockaddr_storage is valid; getsockname fills at most `len` bytes.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let r = unsafe {
            libc::getsockname(
                self.fd.as_raw_fd(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(Error::last_os_error("getsockname"));
        }
        from_sockaddr(&ss).ok_or_else(|| Error::invalid("unknown socket family"))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends `pkts[i].0` to `pkts[i].1`, in order, with as few system calls as possible:
    /// consecutive packets of the same length to the same destination (the last of a run may
    /// be shorter) go out as one UDP GSO "super-datagram" that the kernel cuts into datagrams
    /// (or, on loopback, hands whole to a GRO receiver), and up to 64 such messages go into
    /// one `sendmmsg`.
    ///
    /// UDP GSO is used only where it cannot change the IPv4 identification the ICRC was
    /// computed with (0): toward loopback addresses and over IPv6 (which has none). When the
    /// kernel cuts a super-datagram into IPv4 datagrams it numbers them 0, 1, 2, … (even with
    /// DF), so every datagram but the first would carry an identification its ICRC was not
    /// computed with; a peer that verifies against the header it receives (Linux rxe, a
    /// RoCE NIC) drops them. Toward other IPv4 addresses each packet is its own datagram.
    ///
    /// Datagrams the kernel refuses (`EMSGSIZE`, unreachable) are dropped and counted in the
    /// second field of the result, as a NIC drops what it cannot send.
    pub(crate) fn send_batch<'a>(
        &self,
        count: usize,
        pkt: impl Fn(usize) -> (&'a [u8], SocketAddr),
    ) -> (usize, usize) {
        const MAX_SEGS: usize = 64;
        const MAX_GSO_BYTES: usize = 65000;
        SEND_SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let SendScratch { groups, iovs, hdrs } = &mut *scratch;
            let gso = self.gso.load(Ordering::Relaxed);
            // Groups: (first packet, number of packets, segment size).
            groups.clear();
            let mut i = 0;
            while i < count {
                let (first, dst) = pkt(i);
                let seg = first.len();
                let mut n = 1;
                let mut total = seg;
                if gso && gso_keeps_ident(dst) {
                    while i + n < count && n < MAX_SEGS {
                        let (p, d) = pkt(i + n);
                        // One super-datagram carries packets for one process of the
                        // peer device: the peer's steering reads the first packet's QP slot.
                        if d != dst
                            || p.get(5) != first.get(5)
                            || p.len() > seg
                            || total + p.len() > MAX_GSO_BYTES
                            || p.is_empty()
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
                groups.push((i, n, seg));
                i += n;
            }
            let mut sent = 0;
            let mut failed = 0;
            let mut g = 0;
            // SAFETY: CMSG_SPACE is a pure computation.
            let cmsg_space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            while g < groups.len() {
                let n = (groups.len() - g).min(MMSG_MAX);
                iovs.clear();
                for &(first, count, _) in &groups[g..g + n] {
                    for k in first..first + count {
                        let p = pkt(k).0;
                        iovs.push(libc::iovec {
                            iov_base: p.as_ptr() as *mut libc::c_void,
                            iov_len: p.len(),
                        });
                    }
                }
                let mut at = 0;
                for k in 0..n {
                    let (first, count, seg) = groups[g + k];
                    hdrs.names[k].len = write_sockaddr(&pkt(first).1, &mut hdrs.names[k].ss);
                    let h = &mut hdrs.msgs[k].msg_hdr;
                    h.msg_name = (&mut hdrs.names[k].ss as *mut libc::sockaddr_storage).cast();
                    h.msg_namelen = hdrs.names[k].len;
                    h.msg_iov = iovs[at..].as_mut_ptr();
                    h.msg_iovlen = count;
                    h.msg_flags = 0;
                    at += count;
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
                // all of which outlive the call.
                let r = unsafe {
                    libc::sendmmsg(
                        self.fd.as_raw_fd(),
                        hdrs.msgs.as_mut_ptr(),
                        n as libc::c_uint,
                        0,
                    )
                };
                if r > 0 {
                    for k in 0..r as usize {
                        sent += groups[g + k].1;
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
                        let (first, count, _) = groups[g];
                        let singles: Vec<(usize, usize, usize)> = (first..first + count)
                            .map(|k| (k, 1, pkt(k).0.len()))
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
            (sent, failed)
        })
    }

    /// Receives up to `bufs.len()` messages without blocking; for each, its length, source
    /// and GRO segment size (0: one datagram) go into `meta`. With GRO a message holds several
    /// datagrams of `segment` bytes each (the last may be shorter). Returns how many messages
    /// arrived (0 when none is waiting).
    pub(crate) fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [RxMsg]) -> Result<usize> {
        let n = bufs.len().min(MMSG_MAX).min(meta.len());
        if n == 0 {
            return Ok(0);
        }
        RECV_SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let RecvScratch { hdrs, key, dirty } = &mut *scratch;
            // The headers of the last call on the same buffers are still in place: only the
            // fields the kernel wrote back (for the messages it filled) are reset. A busy
            // poller calls this in a loop, mostly for nothing.
            let k = (
                bufs.as_ptr() as usize,
                n,
                self.gro,
                bufs[0].as_ptr() as usize,
                bufs[n - 1].as_ptr() as usize,
                bufs[0].len(),
            );
            let reset = if *key == Some(k) { *dirty } else { n };
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
                                    if (*cm).cmsg_level == libc::SOL_UDP
                                        && (*cm).cmsg_type == UDP_GRO
                                    {
                                        segment = std::ptr::read_unaligned(
                                            libc::CMSG_DATA(cm).cast::<libc::c_int>(),
                                        )
                                            as usize;
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
        })
    }
}

impl UdpSock {
    /// Sends an empty datagram to `dst`: a liveness probe. RoCEv2 receivers drop it (softrdma
    /// counts it as a probe, Linux rxe as too short); a host where nothing holds the port
    /// answers with ICMP port unreachable, which [`UdpSock::take_icmp_errors`] then reads.
    /// Never blocks; a failure is ignored (the next probe tries again).
    pub(crate) fn send_probe(&self, dst: SocketAddr) {
        let (ss, len) = to_sockaddr(&dst);
        // SAFETY: an empty buffer and a valid sockaddr of `len` bytes.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                (&ss as *const libc::sockaddr_storage).cast(),
                len,
            );
        }
    }

    /// Drains the socket's error queue (`IP_RECVERR` / `IPV6_RECVERR`), appending to `out`
    /// the original destination and errno of each datagram an ICMP error came back for
    /// (`ECONNREFUSED` for port unreachable, `EHOSTUNREACH`, `ENETUNREACH`, `EMSGSIZE` …).
    /// Errors of local origin are read and dropped. Never blocks; stops when the queue is
    /// empty or on an unexpected error (nothing is lost: the kernel keeps what was not read).
    pub(crate) fn take_icmp_errors(&self, out: &mut Vec<(SocketAddr, i32)>) {
        // The queue is bounded by the socket's receive buffer; a flood of ICMP errors is
        // rate-limited by the sender's kernel. Bound the work per call all the same.
        for _ in 0..256 {
            // SAFETY: all-zero bytes are a valid sockaddr_storage and msghdr.
            let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut data = [0u8; 64];
            let mut control = [0u64; 64];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: as above.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = control.as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: h points at live, writable buffers that outlive the call.
            let r = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut h,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            // SAFETY: the kernel wrote well-formed cmsgs into at most msg_controllen bytes of
            // `control`; each IP(V6)_RECVERR one holds a sock_extended_err (read unaligned).
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(&h);
                while !cm.is_null() {
                    let c = &*cm;
                    let recverr = (c.cmsg_level == libc::IPPROTO_IP
                        && c.cmsg_type == libc::IP_RECVERR)
                        || (c.cmsg_level == libc::IPPROTO_IPV6
                            && c.cmsg_type == libc::IPV6_RECVERR);
                    if recverr {
                        let ee = std::ptr::read_unaligned(
                            libc::CMSG_DATA(cm).cast::<libc::sock_extended_err>(),
                        );
                        let icmp = ee.ee_origin == libc::SO_EE_ORIGIN_ICMP
                            || ee.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
                        if icmp {
                            if let Some(dst) = from_sockaddr(&name) {
                                out.push((dst, ee.ee_errno as i32));
                            }
                        }
                    }
                    cm = libc::CMSG_NXTHDR(&h, cm);
                }
            }
        }
    }
}

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

/// A thread's scratch for [`UdpSock::recv_batch`]: the headers, the buffers they were set up
/// for (their addresses and count, and whether GRO control buffers are attached), and how
/// many of them the kernel may have written into since.
struct RecvScratch {
    hdrs: Box<MsgHdrs>,
    key: Option<(usize, usize, bool, usize, usize, usize)>,
    dirty: usize,
}

/// A thread's scratch for [`UdpSock::send_batch`].
struct SendScratch {
    groups: Vec<(usize, usize, usize)>,
    iovs: Vec<libc::iovec>,
    hdrs: Box<MsgHdrs>,
}

thread_local! {
    static SEND_SCRATCH: std::cell::RefCell<SendScratch> = std::cell::RefCell::new(SendScratch {
        groups: Vec::with_capacity(MMSG_MAX),
        iovs: Vec::with_capacity(MMSG_MAX),
        hdrs: MsgHdrs::new(),
    });
    static RECV_SCRATCH: std::cell::RefCell<RecvScratch> = std::cell::RefCell::new(RecvScratch {
        hdrs: MsgHdrs::new(),
        key: None,
        dirty: 0,
    });
}

const IPV6_MULTICAST_ALL: libc::c_int = 29;

fn mreq4(group: Ipv4Addr, local: Ipv4Addr) -> libc::ip_mreq {
    libc::ip_mreq {
        imr_multiaddr: libc::in_addr {
            s_addr: u32::from_ne_bytes(group.octets()),
        },
        imr_interface: libc::in_addr {
            s_addr: u32::from_ne_bytes(local.octets()),
        },
    }
}

fn mreq6(group: Ipv6Addr, ifindex: u32) -> libc::ipv6_mreq {
    libc::ipv6_mreq {
        ipv6mr_multiaddr: libc::in6_addr {
            s6_addr: group.octets(),
        },
        ipv6mr_interface: ifindex as _,
    }
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
