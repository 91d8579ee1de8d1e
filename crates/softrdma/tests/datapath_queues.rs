//! Every test of `datapath.rs` again with three receive queues per device
//! (`SOFTRDMA_QUEUES=3`): the QPs of this binary's devices are spread over three sockets of
//! each device's reuseport group, each with a progress thread of its own, and every result
//! (data, completion statuses, faults, flow control) is the same as on one queue. Without QP
//! pair rings (`SOFTRDMA_PAIR_RINGS=0`): short requests' records take the device's lane.
//! (A test binary of its own, run after `datapath`, as `datapath_wire` is.)

#[path = "datapath.rs"]
mod cases;

// Every device of this binary spreads its RC and UC QPs over three receive queues.
crate::preset_env!("SOFTRDMA_QUEUES", "3");
crate::preset_env!("SOFTRDMA_PAIR_RINGS", "0");
