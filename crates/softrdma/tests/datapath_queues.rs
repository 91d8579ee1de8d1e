//! Every test of `datapath.rs` again with three receive queues per device
//! (`SOFTRDMA_QUEUES=3`): the QPs of this binary's devices are spread over three sockets of
//! each device's reuseport group, each with a progress thread of its own, and every result
//! (data, completion statuses, faults, flow control) is the same as on one queue. (A test
//! binary of its own, run after `datapath`, as `datapath_wire` is.)

#[path = "datapath.rs"]
mod cases;

/// Runs before `main` (an `.init_array` entry), while the process has one thread: every
/// device of this binary spreads its RC and UC QPs over three receive queues.
extern "C" fn three_queues() {
    // SAFETY: NUL-terminated strings; no other thread exists yet to read the environment.
    unsafe { libc::setenv(c"SOFTRDMA_QUEUES".as_ptr(), c"3".as_ptr(), 1) };
}

#[used]
#[link_section = ".init_array"]
static THREE_QUEUES: extern "C" fn() = three_queues;
