//! Every test of `datapath.rs` again with `SOFTRDMA_TRANSPORT=wire`: the same-host lanes and
//! the wire give the same results. (A test binary of its own, so that it runs after
//! `datapath`, not beside it: the fault-injection tests count on timers on a machine that is
//! not twice as busy.)

#[path = "datapath.rs"]
mod cases;

/// Runs before `main` (an `.init_array` entry), while the process has one thread: every
/// device of this binary sends on the wire.
extern "C" fn wire_only() {
    // SAFETY: NUL-terminated strings; no other thread exists yet to read the environment.
    unsafe { libc::setenv(c"SOFTRDMA_TRANSPORT".as_ptr(), c"wire".as_ptr(), 1) };
}

#[used]
#[link_section = ".init_array"]
static WIRE_ONLY: extern "C" fn() = wire_only;
