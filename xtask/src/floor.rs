//! `xtask udp-floor`: the latency floor of the machine's loopback for a busy-polling UDP
//! ping-pong, the transport under softrdma, without softrdma.
//!
//! Two threads, each with a non-blocking UDP socket on its own 127.0.0.x address, bounce one
//! datagram back and forth, each spinning on `recv_from` (as softrdma's pollers spin on
//! `recvmmsg`). Reported: the one-way latency (round trip / 2) with one datagram per
//! direction, with one more small datagram sent before it each time (what an RC ACK costs
//! when it goes first), and with one sent behind it in the same `sendmmsg` (how softrdma
//! sends an answer with the ACK it owes). softrdma's own 8-byte SEND latency can be compared
//! with all three.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// One-way latencies (µs, median and minimum) of a busy-polling UDP ping-pong on loopback.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Median one-way latency.
    pub p50_us: f64,
    /// Smallest one-way latency.
    pub min_us: f64,
}

/// Runs `n` round trips between `a` and `b` (addresses to bind, port 0 for any), with
/// `extra` additional 28-byte datagrams sent to `sink` before each payload (0 or more).
///
/// Fails with the socket error when an address cannot be bound, or when a round trip takes
/// more than 10 s (something else is wrong: the loopback interface, a firewall).
pub fn udp_floor(a: SocketAddr, b: SocketAddr, n: usize, extra: usize) -> std::io::Result<Floor> {
    let sa = UdpSocket::bind(a)?;
    let sb = UdpSocket::bind(b)?;
    let sink = UdpSocket::bind(SocketAddr::new(a.ip(), 0))?;
    let (a, b, sink) = (sa.local_addr()?, sb.local_addr()?, sink.local_addr()?);
    sa.set_nonblocking(true)?;
    sb.set_nonblocking(true)?;
    ping_pong(
        n,
        move |buf| {
            spin(&sb, buf)?;
            for _ in 0..extra {
                sb.send_to(&buf[..28], sink)?;
            }
            sb.send_to(&buf[..PAYLOAD], a).map(|_| ())
        },
        |buf| {
            for _ in 0..extra {
                sa.send_to(&buf[..28], sink)?;
            }
            sa.send_to(&buf[..PAYLOAD], b)?;
            spin(&sa, buf)
        },
    )
}

/// Bytes of the datagram that goes back and forth (the others, smaller, are taken and
/// passed over).
const PAYLOAD: usize = 60;

/// Spins on the non-blocking socket `s` until a datagram of [`PAYLOAD`] bytes comes, taking
/// the others as they come. Fails after 10 s without one.
fn spin(s: &UdpSocket, buf: &mut [u8]) -> std::io::Result<()> {
    let t = Instant::now();
    loop {
        match s.recv(buf) {
            Ok(PAYLOAD) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no datagram within 10 s on loopback",
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `n` round trips: `round` on this thread (send, then wait for the answer), timed,
/// and `echo` on a thread of its own (wait, then answer), each with a buffer of 64 bytes.
/// Returns the one-way latencies (half of each round trip); fails with the first error of
/// either side.
fn ping_pong(
    n: usize,
    mut echo: impl FnMut(&mut [u8]) -> std::io::Result<()> + Send + 'static,
    mut round: impl FnMut(&mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<Floor> {
    let echoer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 64];
        (0..n).try_for_each(|_| echo(&mut buf))
    });
    let mut buf = [0u8; 64];
    let mut lat = Vec::with_capacity(n);
    let mut result = Ok(());
    for _ in 0..n {
        let t = Instant::now();
        if let Err(e) = round(&mut buf) {
            result = Err(e);
            break;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    let echoed = echoer
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the echo thread panicked")));
    result?;
    echoed?;
    lat.sort_by(f64::total_cmp);
    Ok(Floor {
        p50_us: lat.get(lat.len() / 2).copied().unwrap_or(f64::NAN),
        min_us: lat.first().copied().unwrap_or(f64::NAN),
    })
}

/// Sends `payload` and then `trailer` to `to`, in one `sendmmsg`, each datagram with the
/// destination in its header (as softrdma's unconnected device socket sends).
fn send_pair(s: &UdpSocket, to: SocketAddr, payload: &[u8], trailer: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut name, name_len) = sockaddr(to);
    let mut iov = [
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
        libc::iovec {
            iov_base: trailer.as_ptr() as *mut libc::c_void,
            iov_len: trailer.len(),
        },
    ];
    // SAFETY: zeroed mmsghdrs are valid (no name, no control); each is given the destination
    // and one iovec, which live until the call returns.
    let mut msgs: [libc::mmsghdr; 2] = unsafe { std::mem::zeroed() };
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        m.msg_hdr.msg_namelen = name_len;
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: two initialised messages.
    let n = unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), 2, 0) };
    if n == 2 {
        Ok(())
    } else if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Err(std::io::Error::other("sendmmsg sent one datagram of two"))
    }
}

/// `addr` as a socket address for the system calls, and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// As [`udp_floor`], but each one-way is the payload followed, in the same `sendmmsg`, by a
/// 28-byte datagram to the same peer, which the peer takes too (what an RC answer with the
/// ACK it owes behind it costs: softrdma over the wire sends them so).
pub fn udp_floor_trailing(a: SocketAddr, b: SocketAddr, n: usize) -> std::io::Result<Floor> {
    let sa = UdpSocket::bind(a)?;
    let sb = UdpSocket::bind(b)?;
    let (a, b) = (sa.local_addr()?, sb.local_addr()?);
    // (Not connected: connected, the test of this function once failed with ECONNREFUSED
    // in a full `cargo test` run, an ICMP error that only a connected socket reports (its
    // source not established; 300 runs alone passed). softrdma's device socket is not
    // connected either.)
    sa.set_nonblocking(true)?;
    sb.set_nonblocking(true)?;
    ping_pong(
        n,
        move |buf| {
            spin(&sb, buf)?;
            send_pair(&sb, a, &[0u8; PAYLOAD], &[0u8; 28])
        },
        |buf| {
            send_pair(&sa, b, &[0u8; PAYLOAD], &[0u8; 28])?;
            spin(&sa, buf)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_ping_pong_reports_positive_latencies() {
        let a: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for extra in [0, 1] {
            let f = udp_floor(a, b, 200, extra).unwrap();
            assert!(f.min_us > 0.0 && f.p50_us >= f.min_us, "{f:?}");
        }
        let f = udp_floor_trailing(a, b, 200).unwrap();
        assert!(f.min_us > 0.0 && f.p50_us >= f.min_us, "{f:?}");
    }
}
