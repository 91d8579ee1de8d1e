//! Signals and the blocking calls. A signal whose handler was installed without
//! `SA_RESTART` ends a wait in `get_cq_event` or `get_cm_event` with `EINTR`, as `read(2)` on
//! rdma-core's channel descriptors does (qperf's test timer, `SIGALRM` with a handler that
//! sets a flag, relies on it to stop); after a handler with `SA_RESTART` the wait goes on.
//! And the library's own threads (progress, discovery, helpers) block asynchronous signals,
//! so that a signal sent to the process reaches one of the program's threads.
//!
//! Its own test binary: it installs a handler for `SIGUSR2`, which no other test uses.

use softrdma::rdma_cm::EventChannel;
use softrdma::testing::unique_loopback_addr;
use softrdma::{CompChannel, Context, Cq, Device};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static CAUGHT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr2(_: libc::c_int) {
    CAUGHT.fetch_add(1, Ordering::Relaxed);
}

/// Tests that install handlers run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Installs `on_usr2` for SIGUSR2, with or without `SA_RESTART`.
fn install(restart: bool) {
    // SAFETY: installs a handler that only touches an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr2 as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
}

/// Puts SIGUSR2 back to its default action.
fn uninstall() {
    // SAFETY: restores the default action.
    unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
}

/// Runs `wait` on a thread of its own and sends that thread SIGUSR2 every 20 ms until it
/// returns (so that one signal at least comes while it waits, however late it starts);
/// returns what it returned and the signals sent.
fn signalled<T: Send + 'static>(wait: impl FnOnce() -> T + Send + 'static) -> (T, usize) {
    let tid = Arc::new(Mutex::new(None::<libc::pthread_t>));
    let done = Arc::new(AtomicBool::new(false));
    let t = {
        let (tid, done) = (tid.clone(), done.clone());
        std::thread::spawn(move || {
            // SAFETY: this thread's own id.
            *tid.lock().unwrap() = Some(unsafe { libc::pthread_self() });
            let r = wait();
            done.store(true, Ordering::Release);
            r
        })
    };
    let mut sent = 0;
    while !done.load(Ordering::Acquire) {
        // (A hang guard, not a timing check: a wait that signals cannot end fails here.)
        assert!(sent < 1000, "the wait did not end after {sent} signals");
        std::thread::sleep(Duration::from_millis(20));
        if let Some(id) = *tid.lock().unwrap() {
            if !done.load(Ordering::Acquire) {
                // SAFETY: the thread is alive until `done` (it is joined below).
                unsafe { libc::pthread_kill(id, libc::SIGUSR2) };
                sent += 1;
            }
        }
    }
    (t.join().unwrap(), sent)
}

/// A device of the test's own, a completion channel and a CQ that reports to it.
fn channel_with_cq() -> (Context, CompChannel, Cq) {
    let ctx = Device::from_addr(unique_loopback_addr().into())
        .unwrap()
        .open()
        .unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(4, 0, Some(&ch), 0).unwrap();
    (ctx, ch, cq)
}

#[test]
fn a_signal_without_sa_restart_ends_a_wait_with_eintr() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_ctx, ch, _cq) = channel_with_cq();
    install(false);
    let before = CAUGHT.load(Ordering::Relaxed);
    // Blocking, no timeout: only the signal can end it.
    let (r, sent) = signalled(move || ch.get_cq_event().map(|_| ()));
    assert!(sent >= 1);
    assert_eq!(r.unwrap_err().errno(), libc::EINTR);
    assert!(CAUGHT.load(Ordering::Relaxed) > before, "the handler ran");

    let cm = EventChannel::new().unwrap();
    let (r, _) = signalled(move || cm.get_cm_event().map(|_| ()));
    assert_eq!(r.unwrap_err().errno(), libc::EINTR);
    uninstall();
}

#[test]
fn a_signal_with_sa_restart_leaves_a_wait_going() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_ctx, ch, _cq) = channel_with_cq();
    install(true);
    // Signals all through the wait; it ends only at its timeout.
    let (r, sent) = signalled(move || {
        ch.get_cq_event_timeout(Duration::from_millis(300))
            .map(|_| ())
    });
    assert!(sent >= 1);
    assert_eq!(r.unwrap_err().errno(), libc::ETIMEDOUT);
    let cm = EventChannel::new().unwrap();
    let (r, _) = signalled(move || {
        cm.get_cm_event_timeout(Duration::from_millis(300))
            .map(|_| ())
    });
    assert_eq!(r.unwrap_err().errno(), libc::ETIMEDOUT);
    uninstall();
}

/// Every thread of the library (named `softrdma-...`) has SIGALRM, SIGUSR2, SIGINT and
/// SIGCHLD blocked; the test's own threads have none of them blocked.
#[test]
fn the_library_threads_block_asynchronous_signals() {
    let addr = unique_loopback_addr();
    let _ctx = softrdma::rdma_cm::start_device(addr.into()).unwrap();
    let bit = |sig: libc::c_int| 1u64 << (sig - 1);
    let want = bit(libc::SIGALRM) | bit(libc::SIGUSR2) | bit(libc::SIGINT) | bit(libc::SIGCHLD);
    let mut library = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        if comm.starts_with("softrdma-") {
            library += 1;
            assert_eq!(blocked & want, want, "{}: SigBlk {blocked:#x}", comm.trim());
            assert_eq!(
                blocked & bit(libc::SIGSEGV),
                0,
                "a fault's signal stays open"
            );
        }
    }
    assert!(library >= 1, "the device's progress thread at least");
}
