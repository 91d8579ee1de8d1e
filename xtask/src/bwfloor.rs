//! `xtask udp-bw-floor`: the bandwidth floor of the machine's loopback for one stream of
//! UDP datagrams of RoCEv2's size, sent with GSO and received with GRO as softrdma's devices
//! do, without softrdma; and one TCP stream beside it (what iperf3 measures).
//!
//! One thread sends, another receives, each on its own socket of a 127.0.0.x address. The
//! sender hands the kernel `segments` datagrams of `segment` bytes per system call (UDP
//! GSO); the receiver's socket has UDP GRO on, so the kernel may hand it several at once.
//! With `copy`, each side also copies every byte once in user space, as a RoCE device must
//! (the payload into the packet, and out of it into the target memory): the floor of a
//! device that makes one copy a side. What is counted is what the receiver got (UDP has no
//! flow control: datagrams the receiver had no room for are lost, and reported).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// What one stream moved.
#[derive(Debug, Clone, Copy)]
pub struct BwFloor {
    /// Bytes the receiver got per second, in GB/s (10^9 bytes).
    pub gbps: f64,
    /// Share of the bytes sent that never reached the receiver (0 for TCP).
    pub lost: f64,
}

fn setopt(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: `v` is a live c_int and its size is passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A 1 MiB region that a side copies to or from, as a device copies out of or into memory
/// registered by the program.
fn region() -> Vec<u8> {
    (0..1 << 20).map(|i: u32| i as u8).collect()
}

/// Sends UDP datagrams of `segment` bytes from `a` to `b` for `secs` seconds, `segments` per
/// system call (GSO; 1 sends them one by one), and returns what the receiver got.
///
/// Fails when an address cannot be bound, when the kernel refuses GSO or GRO (UDP_SEGMENT
/// needs Linux 4.18, UDP_GRO 5.0), or on any other socket error than a full buffer.
pub fn udp_bw_floor(
    a: SocketAddr,
    b: SocketAddr,
    secs: f64,
    segment: usize,
    segments: usize,
    copy: bool,
) -> std::io::Result<BwFloor> {
    let rx = UdpSocket::bind(b)?;
    let tx = UdpSocket::bind(a)?;
    tx.connect(rx.local_addr()?)?;
    setopt(rx.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 1)?;
    setopt(rx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20)?;
    setopt(tx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20)?;
    if segments > 1 {
        setopt(
            tx.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            segment as libc::c_int,
        )?;
    }
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    let done = Arc::new(AtomicBool::new(false));
    let done_rx = done.clone();
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, Duration)> {
        let mut buf = vec![0u8; 1 << 16];
        let mut target = region();
        let (mut got, mut at) = (0u64, 0usize);
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            match rx.recv(&mut buf) {
                Ok(n) => {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = now;
                    got += n as u64;
                    if copy {
                        if at + n > target.len() {
                            at = 0;
                        }
                        target[at..at + n].copy_from_slice(&buf[..n]);
                        at += n;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if done_rx.load(Ordering::Acquire) {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        std::hint::black_box(&target);
        Ok((got, first.map_or(Duration::ZERO, |f| last - f)))
    });
    let source = region();
    let mut buf = vec![0u8; segment * segments];
    let (mut sent, mut at) = (0u64, 0usize);
    let start = Instant::now();
    let mut result = Ok(());
    while start.elapsed().as_secs_f64() < secs {
        if copy {
            let n = buf.len();
            if at + n > source.len() {
                at = 0;
            }
            buf.copy_from_slice(&source[at..at + n]);
            at += n;
        }
        match tx.send(&buf) {
            Ok(n) => sent += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    done.store(true, Ordering::Release);
    let (got, took) = receiver
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the receiving thread panicked")))?;
    result?;
    Ok(BwFloor {
        gbps: got as f64 / took.as_secs_f64().max(1e-9) / 1e9,
        lost: 1.0 - got as f64 / (sent.max(1)) as f64,
    })
}

/// One TCP stream to a listener on `b` (port 0: any) for `secs` seconds in writes of
/// `chunk` bytes, received in reads of up to 1 MiB (iperf3's pattern), with the same user-space copies as
/// [`udp_bw_floor`] when `copy`. Fails on a socket error.
pub fn tcp_bw(b: SocketAddr, secs: f64, chunk: usize, copy: bool) -> std::io::Result<BwFloor> {
    let listener = TcpListener::bind(b)?;
    let to = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, Duration)> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut target = region();
        let mut got = 0u64;
        let start = Instant::now();
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if copy {
                target[..n].copy_from_slice(&buf[..n]);
            }
        }
        std::hint::black_box(&target);
        Ok((got, start.elapsed()))
    });
    let mut s = TcpStream::connect(to)?;
    let source = region();
    let mut buf = vec![0u8; chunk];
    let start = Instant::now();
    let mut at = 0usize;
    while start.elapsed().as_secs_f64() < secs {
        if copy {
            if at + chunk > source.len() {
                at = 0;
            }
            buf.copy_from_slice(&source[at..at + chunk]);
            at += chunk;
        }
        s.write_all(&buf)?;
    }
    drop(s);
    let (got, took) = receiver
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the receiving thread panicked")))?;
    Ok(BwFloor {
        gbps: got as f64 / took.as_secs_f64().max(1e-9) / 1e9,
        lost: 0.0,
    })
}
