//! The abstract Unix socket names through which the processes of a shared device find each
//! other (see `share.rs`): naming per user and device, binding a name (a host-wide lock or a
//! slot that the kernel frees when its process dies), connecting to a process's slot socket,
//! and the socket-address codec of slot socket messages.

use crate::error::{Error, Result};
use std::mem::zeroed;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The abstract socket name of `what` for the device at `ip`, unique per user.
pub(super) fn name(ip: IpAddr, what: &str) -> String {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("softrdma-{uid}/{ip}/{what}")
}

pub(super) fn unix_addr(name: &str) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut sun: libc::sockaddr_un = unsafe { zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > sun.sun_path.len() {
        return Err(Error::invalid(format!("socket name too long: {name}")));
    }
    // sun_path[0] stays 0: the abstract namespace.
    for (d, s) in sun.sun_path[1..].iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + bytes.len();
    Ok((sun, len as libc::socklen_t))
}

pub(super) fn unix_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(Error::last_os_error("socket(AF_UNIX, SOCK_DGRAM)"));
    }
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a fresh abstract datagram socket to `name`. `Ok(None)` when another socket holds
/// the name (`EADDRINUSE`).
pub(super) fn bind_name(name: &str) -> Result<Option<OwnedFd>> {
    let fd = unix_socket()?;
    let (sun, len) = unix_addr(name)?;
    // SAFETY: a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sun as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r == 0 {
        return Ok(Some(fd));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EADDRINUSE) {
        return Ok(None);
    }
    Err(Error::from_io(e, format!("binding the socket name {name}")))
}

/// A datagram socket connected to the slot socket of `slot` on the device at `ip` (this
/// user's); fails with `ECONNREFUSED` when no process of this host holds it.
pub(crate) fn connect_slot(ip: IpAddr, slot: u8) -> std::io::Result<OwnedFd> {
    let fd = unix_socket().map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    let (sun, len) = unix_addr(&name(ip, &format!("slot/{slot}")))
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sun as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether a process of this user on this host holds `slot` of the device at `ip`.
pub(crate) fn slot_is_held(ip: IpAddr, slot: u8) -> bool {
    connect_slot(ip, slot).is_ok()
}

/// Bytes of a socket address in a slot socket message (see [`put_addr`]).
pub(crate) const ADDR_LEN: usize = 19;

/// Writes `a` into `b[..ADDR_LEN]` as family (4 or 6), address (16 bytes), port
/// (big-endian): how slot socket messages carry a socket address.
pub(crate) fn put_addr(b: &mut [u8], a: SocketAddr) {
    b[17..19].copy_from_slice(&a.port().to_be_bytes());
    match a.ip() {
        IpAddr::V4(a) => {
            b[0] = 4;
            b[1..5].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            b[0] = 6;
            b[1..17].copy_from_slice(&a.octets());
        }
    }
}

/// Reads what [`put_addr`] wrote; `None` for an unknown family.
pub(crate) fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let ip = match b[0] {
        4 => IpAddr::from([b[1], b[2], b[3], b[4]]),
        6 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[1..17]);
            IpAddr::from(a)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, u16::from_be_bytes([b[17], b[18]])))
}

/// Whether a socket is bound to the abstract `name` now (`probe`: a datagram socket to
/// connect with).
pub(super) fn name_is_held(probe: &OwnedFd, name: &str) -> bool {
    let Ok((sun, len)) = unix_addr(name) else {
        return false;
    };
    // SAFETY: a valid sockaddr_un of `len` bytes. Connecting a datagram socket only sets its
    // default destination; connecting again replaces it.
    let r = unsafe {
        libc::connect(
            probe.as_raw_fd(),
            (&sun as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    r == 0
}

/// Holds the abstract name `name` (a host-wide lock that dies with its process), waiting up
/// to `wait` for it; `None` when it stayed taken.
pub(super) fn hold_name(name: &str, wait: Duration) -> Option<OwnedFd> {
    let end = Instant::now() + wait;
    loop {
        match bind_name(name) {
            Ok(Some(fd)) => return Some(fd),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(2)),
            _ => return None,
        }
    }
}
