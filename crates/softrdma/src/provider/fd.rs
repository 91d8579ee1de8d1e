//! A counting event file descriptor (Linux `eventfd` in semaphore mode): the real, pollable
//! descriptor behind completion channels and asynchronous event queues.
//!
//! Every queued event adds one to the counter; every successful read takes one away, so a
//! descriptor is readable exactly while events are waiting. Whether a read blocks is decided
//! by the descriptor's own `O_NONBLOCK` flag, which the user may change with `fcntl`, exactly
//! as with rdma-core's channels.

use crate::error::{Error, ErrorKind, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd created with `EFD_SEMAPHORE | EFD_CLOEXEC`.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

/// The milliseconds left until `deadline` for `poll(2)`, rounded up (a sub-millisecond rest
/// is not a busy loop); fails with `ETIMEDOUT` once it has passed.
pub(crate) fn ms_until(deadline: std::time::Instant) -> Result<i32> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(Error::new(
            ErrorKind::Os(libc::ETIMEDOUT),
            "no event came before the timeout",
        ));
    }
    Ok(left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32)
}

/// The error of a wait that a signal interrupted (`EINTR`), as `read(2)` on rdma-core's
/// channel descriptors fails: a program whose signal handler sets a flag (qperf's test timer,
/// `SIGALRM` without `SA_RESTART`) sees the call return and looks at the flag.
pub(crate) fn interrupted() -> Error {
    Error::new(
        ErrorKind::Os(libc::EINTR),
        "the wait was interrupted by a signal",
    )
}

/// Whether a wait that `poll(2)` gave up with `EINTR` ends (with [`interrupted`]) rather than
/// going on: when some signal's handler was installed without `SA_RESTART`. A `read(2)` on
/// the descriptor, which rdma-core blocks in, is restarted by the kernel after a handler
/// with `SA_RESTART` and fails after one without; `poll` fails after either, and which signal
/// came is not known by then, so this looks at every handler (only after an interruption).
pub(crate) fn interruption_ends_wait() -> bool {
    let max = libc::SIGRTMAX();
    // Left out: a fault's signals, and those of an abort or a bad system call, which come
    // from the thread's own instruction or call, not while it sleeps in one (Rust's runtime,
    // Open MPI and crash reporters install handlers for them without SA_RESTART); and the
    // signals this thread blocks, which cannot have interrupted it.
    let own = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGABRT,
        libc::SIGSYS,
    ];
    // SAFETY: reads this thread's mask into a local value.
    let mut blocked: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut blocked) };
    (1..=max).filter(|s| !own.contains(s)).any(|sig| {
        // SAFETY: tests a signal in a local set.
        if unsafe { libc::sigismember(&blocked, sig) } == 1 {
            return false;
        }
        // SAFETY: queries (does not change) the action of `sig` into a local value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0;
        ok && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
            && old.sa_flags & libc::SA_RESTART == 0
    })
}

/// Spawns a thread of the library's own (a progress thread, a helper) with every
/// asynchronous signal blocked in it: a signal sent to the process then goes to one of the
/// program's threads, as it would without this library, and interrupts the wait the program
/// is blocked in. (The synchronous signals of a fault are left as they are.)
pub(crate) fn spawn_quiet<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    // SAFETY: builds signal sets in local values and changes this thread's mask, restored
    // below; the new thread starts with the mask in force when it is created.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut all, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    let r = std::thread::Builder::new().name(name).spawn(f);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

impl EventFd {
    /// Creates a blocking descriptor with a zero counter.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os_error("eventfd"));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds one event.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        loop {
            // SAFETY: writes 8 bytes from a live local variable to our own descriptor.
            let n = unsafe {
                libc::write(
                    self.fd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
            if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // The counter cannot overflow in practice (2^64 - 2 events); any other
                // failure leaves the event queued, and a reader will find it on its next wake.
                return;
            }
        }
    }

    /// Takes one event: blocks while the counter is zero, unless the descriptor is
    /// non-blocking, in which case it fails with `EAGAIN` ([`ErrorKind::WouldBlock`]); a
    /// signal whose handler lacks `SA_RESTART` ends the wait with `EINTR`.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut val: u64 = 0;
        // SAFETY: reads 8 bytes into a live local variable from our own descriptor.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut val as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n == std::mem::size_of::<u64>() as isize {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            // (After a handler with SA_RESTART the kernel restarts the read itself.)
            Some(libc::EINTR) => Err(interrupted()),
            Some(libc::EAGAIN) => Err(Error::new(ErrorKind::WouldBlock, "no event is waiting")),
            _ => Err(Error::from_io(err, "reading the event descriptor")),
        }
    }

    /// Takes one event, waiting until `deadline` at most, whatever the descriptor's blocking
    /// mode; fails with `ETIMEDOUT` when none came by then, and with `EINTR` when a signal
    /// interrupts it ([`interruption_ends_wait`]). An event that arrives later stays
    /// counted for the next taker. Several threads may wait at once: the read that takes an
    /// event never blocks (`RWF_NOWAIT`), so a thread that lost the race waits again, and
    /// none sleeps past its deadline.
    pub(crate) fn wait_deadline(&self, deadline: std::time::Instant) -> Result<()> {
        loop {
            match self.read_nowait() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(e),
            }
            let ms = ms_until(deadline)?;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(Error::from_io(err, "polling the event descriptor"));
                }
                if interruption_ends_wait() {
                    return Err(interrupted());
                }
            }
        }
    }

    /// Takes one event if the counter is not zero, without ever blocking: `Ok(false)` when
    /// it is zero.
    pub(crate) fn read_nowait(&self) -> Result<bool> {
        let mut val: u64 = 0;
        let iov = libc::iovec {
            iov_base: (&mut val as *mut u64).cast(),
            iov_len: std::mem::size_of::<u64>(),
        };
        loop {
            // SAFETY: reads 8 bytes into a live local variable from our own descriptor.
            let n = unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
            if n == std::mem::size_of::<u64>() as isize {
                return Ok(true);
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(false),
                // A kernel whose eventfd lacks RWF_NOWAIT (before 5.x): read only when poll
                // says an event waits (another thread may still take it first).
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => return Ok(self.poll_then_read()),
                _ => return Err(Error::from_io(err, "reading the event descriptor")),
            }
        }
    }

    /// Takes one event if one is waiting, whatever the descriptor's blocking mode, never
    /// blocking: another thread may take the event between a look and the read (a waiter in
    /// `get_cm_event` while the program destroys an id), and a blocking read then slept for
    /// good (rping's `rdma_destroy_id` hung that way).
    pub(crate) fn try_wait(&self) -> bool {
        self.read_nowait().unwrap_or(false)
    }

    /// [`EventFd::try_wait`] on a kernel whose eventfd lacks `RWF_NOWAIT`: reads only when
    /// `poll` says an event waits (a blocking descriptor can still block if another thread
    /// takes it first).
    fn poll_then_read(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one valid pollfd for zero milliseconds.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 1 && self.wait().is_ok()
    }

    /// Whether the descriptor has `O_NONBLOCK` (a read fails with `EAGAIN` instead of
    /// blocking); `false` when `fcntl` fails.
    pub(crate) fn is_nonblocking(&self) -> bool {
        // SAFETY: fcntl(F_GETFL) on our own valid descriptor.
        let flags = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
        flags >= 0 && flags & libc::O_NONBLOCK != 0
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor.
    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let fd = self.fd.as_raw_fd();
        // SAFETY: fcntl on our own valid descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(Error::last_os_error("fcntl(F_GETFL)"));
        }
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(Error::last_os_error("fcntl(F_SETFL)"));
        }
        Ok(())
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_and_honours_nonblocking() {
        let fd = EventFd::new().unwrap();
        fd.set_nonblocking(true).unwrap();
        assert_eq!(fd.wait().unwrap_err().kind(), ErrorKind::WouldBlock);
        fd.signal();
        fd.signal();
        fd.wait().unwrap();
        assert!(fd.try_wait());
        assert!(!fd.try_wait());
    }

    #[test]
    fn wait_deadline_times_out_and_leaves_a_late_event_for_the_next_taker() {
        let fd = EventFd::new().unwrap();
        let soon = std::time::Instant::now() + std::time::Duration::from_millis(20);
        assert_eq!(fd.wait_deadline(soon).unwrap_err().errno(), libc::ETIMEDOUT);
        fd.signal();
        let far = std::time::Instant::now() + std::time::Duration::from_secs(30);
        fd.wait_deadline(far).unwrap();
        // A blocking descriptor, and a past deadline with an event waiting: taken at once.
        fd.signal();
        fd.wait_deadline(std::time::Instant::now()).unwrap();
        assert!(!fd.try_wait());
    }
}
