//! Delayed calls for the event channels: one thread for the process, started the first time
//! a channel needs one, that runs each function given to [`after`] once its instant has come.
//!
//! A non-blocking channel whose every event is held back (a DISCONNECTED waiting for its QP's
//! receive completions to be polled, see `objects::RecvHold`) must not stay readable, or a
//! program polling its descriptor spins; it must become readable again when the hold may have
//! ended. The CQ's next poll that takes completions says so at once; this thread says so
//! after a short while in every other case (the hold ran out, the QP went).

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

type Call = Box<dyn FnOnce() + Send>;

struct Rewake {
    calls: Mutex<Vec<(Instant, Call)>>,
    cv: Condvar,
}

fn rewake() -> Option<&'static Rewake> {
    static R: OnceLock<Option<&'static Rewake>> = OnceLock::new();
    *R.get_or_init(|| {
        let r: &'static Rewake = Box::leak(Box::new(Rewake {
            calls: Mutex::new(Vec::new()),
            cv: Condvar::new(),
        }));
        crate::provider::spawn_quiet("softrdma-cm-rewake".into(), move || run(r))
            .ok()
            .map(|_| r)
    })
}

fn run(r: &'static Rewake) {
    let mut calls = r.calls.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        let mut i = 0;
        while i < calls.len() {
            if calls[i].0 <= now {
                due.push(calls.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if !due.is_empty() {
            drop(calls);
            due.sort_by_key(|c| c.0);
            for (_, f) in due {
                f();
            }
            calls = r.calls.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        calls = match calls.iter().map(|c| c.0).min() {
            None => r.cv.wait(calls).unwrap_or_else(|p| p.into_inner()),
            Some(next) => {
                r.cv.wait_timeout(calls, next.saturating_duration_since(now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
    }
}

/// Runs `f` once, on the process's rewake thread, at `at` or soon after. When that thread
/// cannot be started (the process is out of threads), runs `f` at once: a spurious wake-up of
/// a channel is harmless, a lost one is not. Never fails.
pub(super) fn after(at: Instant, f: Call) {
    match rewake() {
        Some(r) => {
            r.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((at, f));
            r.cv.notify_one();
        }
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn calls_run_once_each_in_the_order_of_their_instants() {
        let (tx, rx) = mpsc::channel();
        let now = Instant::now();
        for (k, ms) in [(2u32, 30u64), (0, 0), (1, 10)] {
            let tx = tx.clone();
            after(
                now + Duration::from_millis(ms),
                Box::new(move || tx.send(k).unwrap()),
            );
        }
        let got: Vec<u32> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
            .collect();
        assert_eq!(got, [0, 1, 2]);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    }
}
