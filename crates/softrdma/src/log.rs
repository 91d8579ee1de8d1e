//! Logging: softrdma reports through [`tracing`]. A program that installs a subscriber of its
//! own (as the `softrdma` command does) sees softrdma's events there, filtered as it chooses.
//!
//! For every other program — a Rust program without a subscriber, or a C program on the
//! drop-in `libibverbs.so.1`, which cannot install one — the environment variable
//! `SOFTRDMA_LOG` turns logging on: when it is set (an [`EnvFilter`] directive such as `debug`
//! or `softrdma=trace,softrdma_proto=debug`) the first device engine to start installs a
//! subscriber that writes to standard error with that filter, unless the program already has
//! a global subscriber (then that one is kept and the variable is left to it). Without
//! `SOFTRDMA_LOG` the library installs nothing.
//!
//! [`EnvFilter`]: tracing_subscriber::EnvFilter
//!
//! ```
//! // What a program can call itself, early, to decide when this happens:
//! softrdma::log::init_from_env();
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// The environment variable read by [`init_from_env`].
pub const ENV: &str = "SOFTRDMA_LOG";

/// The tracing target of the line each RC, UC or UD QP logs at debug level when it is freed,
/// with its transport's counters (`softrdma_proto::transport::QpStats`: packets and bytes
/// each way, packets sent again, restarts, timeouts, tail-loss probes, NAKs, duplicates,
/// READs answered again …), for programs that cannot read them otherwise (a C program on
/// the drop-in libraries): `SOFTRDMA_LOG=softrdma::counters=debug`.
pub const COUNTERS_TARGET: &str = "softrdma::counters";

/// Installs a standard-error subscriber filtered by `SOFTRDMA_LOG` (coloured when standard
/// error is a terminal), once per process, when the variable is set and no global subscriber
/// exists yet. Returns whether this call (or an
/// earlier one) installed it. Never fails: an unparsable directive is reported on standard
/// error and the valid part of it (possibly nothing) is used.
pub fn init_from_env() -> bool {
    static ONCE: Once = Once::new();
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    ONCE.call_once(|| {
        let Ok(spec) = std::env::var(ENV) else {
            return;
        };
        let filter = match tracing_subscriber::EnvFilter::try_new(&spec) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("softrdma: {ENV}={spec:?}: {e}; logging what parses");
                tracing_subscriber::EnvFilter::new(&spec)
            }
        };
        let ok = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // (Colours only on a terminal: a log redirected to a file stays plain text.)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
            .is_ok();
        INSTALLED.store(ok, Ordering::Release);
    });
    INSTALLED.load(Ordering::Acquire)
}
