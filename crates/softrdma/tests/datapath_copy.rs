//! Every test of `datapath.rs` again with two copy engines (`SOFTRDMA_COPY_THREADS=2`): the
//! payload copies of runs of packets, sent into a same-host lane's ring or received, are
//! deferred and made together, shared with helper threads when a run is large, and every
//! result (data, ordering against atomics and READs, completion statuses, faults, flow
//! control) is the same as with each copy made on the spot. (A test binary of its own, run
//! after `datapath`, as `datapath_wire` is; by default a machine of fewer than 8 CPUs has no
//! copy engines.)

#[path = "datapath.rs"]
mod cases;

/// Runs before `main` (an `.init_array` entry), while the process has one thread: this
/// binary's process gets two copy engines.
extern "C" fn two_copy_threads() {
    // SAFETY: NUL-terminated strings; no other thread exists yet to read the environment.
    unsafe { libc::setenv(c"SOFTRDMA_COPY_THREADS".as_ptr(), c"2".as_ptr(), 1) };
}

#[used]
#[link_section = ".init_array"]
static TWO_COPY_THREADS: extern "C" fn() = two_copy_threads;
