//! Addresses for tests, doc tests and examples that share a machine with other runs.
//!
//! A softrdma device is UDP port 4791 on one local address, so two test runs (or a test run
//! beside `softrdma perf`) that pick the same fixed address fail with `EADDRINUSE`, and two
//! runs that join the same multicast group receive each other's datagrams. The functions
//! here hand out loopback addresses (`127.200.0.1` – `127.253.255.254`), multicast groups and
//! TCP ports that no other caller of these functions on this machine holds, so any number of
//! runs can go at once:
//!
//! * each process starts at its own place in the range (derived from its process id) and
//!   walks on from there, never handing out an address twice;
//! * an address is reserved with a one-byte `fcntl` record lock in
//!   `$TMPDIR/softrdma-test-addrs.lock` (the byte at the address's offset), which the kernel
//!   holds for the process until it exits, so two processes never reserve the same one;
//! * a loopback address is handed out only once binding UDP port 4791 on it succeeds, so an
//!   address some other program (one that does not use this module) holds is skipped.
//!
//! The reservation lasts until the process exits; child processes (an example run by a test)
//! may use the addresses their parent reserved. When the lock file cannot be opened the
//! process-id start and the bind probe still apply.
//!
//! ```
//! let a = softrdma::testing::unique_loopback_addr();
//! let b = softrdma::testing::unique_loopback_addr();
//! assert_ne!(a, b);
//! let dev = softrdma::Device::from_addr(a.into()).unwrap();
//! let _ctx = dev.open().unwrap();
//! ```

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// First value of the second octet of the addresses handed out.
const FIRST_OCTET: u32 = 200;
/// How many /16 networks (127.200/16 – 127.253/16) the range spans.
const NETS: u32 = 54;
/// Blocks of 254 addresses (one /24 each, .1 – .254) in the range.
const BLOCKS: u32 = NETS * 256;
/// Addresses in the range.
const TOTAL: u32 = BLOCKS * 254;

/// The `i`-th address of the range (`i < TOTAL`).
fn nth(i: u32) -> Ipv4Addr {
    let block = i / 254;
    let host = i % 254 + 1;
    Ipv4Addr::new(
        127,
        (FIRST_OCTET + block / 256) as u8,
        (block % 256) as u8,
        host as u8,
    )
}

/// The lock file, opened once and never closed (closing any descriptor of it would drop
/// this process's locks); `None` when it cannot be opened.
fn lock_file() -> Option<&'static File> {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(std::env::temp_dir().join("softrdma-test-addrs.lock"))
            .ok()
    })
    .as_ref()
}

/// Takes the record lock of `addr` (one byte at the offset of its 32-bit value); false when
/// another process holds it. Without a lock file every address counts as free.
fn lock(addr: Ipv4Addr) -> bool {
    let Some(f) = lock_file() else {
        return true;
    };
    // SAFETY: flock is plain old data; every field the kernel reads is set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = i64::from(u32::from(addr)) as _;
    fl.l_len = 1;
    // SAFETY: F_SETLK with a valid flock on a descriptor this process keeps open.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) == 0 }
}

/// The next address of this process's walk that no other process has reserved, reserved now.
fn reserve(probe: bool) -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = (std::process::id() % BLOCKS) * 254;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(
            n < TOTAL,
            "softrdma::testing: every address of 127.200.0.0 – 127.253.255.255 is taken"
        );
        let a = nth((start + n) % TOTAL);
        if lock(a) && (!probe || UdpSocket::bind((a, 4791)).is_ok()) {
            return a;
        }
    }
}

/// A loopback address (`127.200.0.1` – `127.253.255.254`) that no other caller of this
/// module on this machine holds and on which UDP port 4791 was free a moment ago: a device
/// address of its own for a test or an example. Every call gives a different address.
///
/// Panics if the whole range is taken.
pub fn unique_loopback_addr() -> Ipv4Addr {
    reserve(true)
}

/// An IPv4 multicast group (`239.200.0.1` – `239.253.255.254`) that no other caller of this
/// module on this machine uses, so no other run's datagrams reach its members. Every call
/// gives a different group.
///
/// Panics if the whole range is taken.
pub fn unique_multicast_group() -> Ipv4Addr {
    let [_, a, b, c] = reserve(false).octets();
    Ipv4Addr::new(239, a, b, c)
}

/// An IPv6 site-local multicast group (`ff15::5352:<a>:<b>:<c>`) that no other caller of
/// this module on this machine uses. Every call gives a different group.
///
/// Panics if the whole range is taken.
pub fn unique_multicast_group_v6() -> Ipv6Addr {
    let [_, a, b, c] = reserve(false).octets();
    Ipv6Addr::new(
        0xff15,
        0,
        0,
        0,
        0x5352,
        u16::from(a),
        u16::from(b),
        u16::from(c),
    )
}

/// A TCP port the kernel reports free a moment ago (bound on `127.0.0.1` port 0), for a
/// program's out-of-band exchange. Another program may take it before the caller binds it,
/// though the kernel hands out ephemeral ports in turn, which makes that unlikely.
///
/// Panics when no TCP socket can be bound on `127.0.0.1`.
pub fn unused_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a TCP socket on 127.0.0.1 port 0")
        .port()
}

/// For the library's unit tests: a context on a device of its own, and two PDs of it.
#[cfg(test)]
pub(crate) fn context_with_two_pds() -> (crate::Context, crate::Pd, crate::Pd) {
    let ctx = crate::Device::from_addr(unique_loopback_addr().into())
        .unwrap()
        .open()
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let other = ctx.alloc_pd().unwrap();
    (ctx, pd, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_stays_inside_127_200_to_127_253_and_skips_0_and_255() {
        assert_eq!(nth(0), Ipv4Addr::new(127, 200, 0, 1));
        assert_eq!(nth(253), Ipv4Addr::new(127, 200, 0, 254));
        assert_eq!(nth(254), Ipv4Addr::new(127, 200, 1, 1));
        assert_eq!(nth(TOTAL - 1), Ipv4Addr::new(127, 253, 255, 254));
    }

    #[test]
    fn addresses_are_distinct_free_and_locked_against_other_processes() {
        let a = unique_loopback_addr();
        let b = unique_loopback_addr();
        assert_ne!(a, b);
        // Free: a device can bind them.
        let _s = UdpSocket::bind((a, 4791)).unwrap();
        // Locked: seen through another open file description (as another process would
        // see it), the byte of `a` is write-locked. OFD and classic record locks conflict
        // even within one process. That description stays open: closing any descriptor of
        // the file would drop this process's locks.
        lock_file().expect("the lock file opens");
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(std::env::temp_dir().join("softrdma-test-addrs.lock"))
            .unwrap();
        // SAFETY: as in lock().
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = i64::from(u32::from(a)) as _;
        fl.l_len = 1;
        // SAFETY: F_OFD_GETLK with a valid flock whose l_pid is 0.
        let r = unsafe { libc::fcntl(other.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        std::mem::forget(other);
        assert_eq!(r, 0);
        assert_eq!(
            fl.l_type,
            libc::F_WRLCK as _,
            "another process sees the lock"
        );
    }

    #[test]
    fn groups_are_multicast_and_distinct() {
        let g = unique_multicast_group();
        assert!(g.is_multicast());
        assert_ne!(g, unique_multicast_group());
        assert!(unique_multicast_group_v6().is_multicast());
    }
}
