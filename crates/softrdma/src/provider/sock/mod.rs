//! The device's UDP socket: one unconnected socket bound to the device address and port 4791,
//! with the options RoCEv2 needs, and batched I/O (`sendmmsg`, `recvmmsg`).
//!
//! IPv4 sockets set `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: Linux then sends every datagram of an
//! unconnected socket with DF set and IP Identification 0, so the IPv4 header a receiver sees
//! is the one the sender predicted when it computed the ICRC (roce_cm_notes.md §5.2); the
//! datagrams the kernel cuts from a UDP GSO message are numbered 0, 1, 2, … instead, and
//! `batch` seals each for its number. IPv6
//! sockets set `IPV6_DONTFRAG`, and `UDP_NO_CHECK6_RX` so that zero-checksum datagrams (as
//! rxe sends them) are accepted.
//!
//! Here: options, addresses and binding. `batch`: `sendmmsg` with UDP GSO and `recvmmsg`
//! with GRO; `group`: multicast sending options and group sockets; `errqueue`: liveness
//! probes and the ICMP errors of the error queue.

use crate::error::{Error, ErrorKind, Result};

mod batch;
mod errqueue;
mod group;

pub(crate) use batch::{Gap, RecvScratch, RxMsg};

use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicBool;

/// The RoCEv2 UDP port.
pub(crate) const ROCE_PORT: u16 = softrdma_wire::ROCE_V2_UDP_PORT;

const UDP_NO_CHECK6_RX: libc::c_int = 102;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// How datagrams to `dst` may go in a UDP GSO message (see [`UdpSock::send_batch`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GsoTo {
    /// Whole: to a loopback address, whose GRO receiver takes the message whole, every
    /// datagram with IPv4 identification 0 as sealed.
    Whole,
    /// Cut into datagrams on the way (toward another host): over IPv6 (no identification)
    /// as sealed; over IPv4 (`numbered`) the kernel numbers the datagrams' identifications 0,
    /// 1, 2, ..., so datagram `k` must carry the ICRC computed with identification `k`.
    Cut { numbered: bool },
    /// One datagram a message (IPv4 multicast and broadcast).
    Never,
}

/// `number_loopback`: IPv4 loopback addresses are treated as another host's (numbered;
/// `SOFTRDMA_GSO_NUMBERED=all`, for tests).
fn gso_to(dst: SocketAddr, number_loopback: bool) -> GsoTo {
    let v4 = match dst.ip() {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(m) => m,
            None if a.is_loopback() => return GsoTo::Whole,
            None => return GsoTo::Cut { numbered: false },
        },
    };
    if v4.is_loopback() && !number_loopback {
        GsoTo::Whole
    } else if v4.is_multicast() || v4.is_broadcast() || v4.is_unspecified() {
        GsoTo::Never
    } else {
        GsoTo::Cut { numbered: true }
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
    /// Whether UDP GSO messages may go to unicast IPv4 addresses other than loopback, their
    /// datagrams sealed with the identifications the kernel gives them ([`GsoTo::Cut`];
    /// `SOFTRDMA_GSO_NUMBERED=0` turns it off).
    gso_numbered: bool,
    /// Whether loopback addresses are numbered destinations too (`SOFTRDMA_GSO_NUMBERED=all`:
    /// two devices of one host exchange datagrams as if between hosts, for tests).
    gso_number_loopback: bool,
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
        let numbered = std::env::var_os("SOFTRDMA_GSO_NUMBERED");
        let gso_numbered = numbered.as_ref().is_none_or(|v| v != "0");
        let gso_number_loopback = numbered.is_some_and(|v| v == "all");
        Ok(UdpSock {
            fd,
            gso: AtomicBool::new(gso),
            gso_numbered,
            gso_number_loopback,
            gro,
        })
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
}
