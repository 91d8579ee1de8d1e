//! Every test of `datapath.rs` again with `SOFTRDMA_TRANSPORT=wire`: the same-host lanes and
//! the wire give the same results. (A test binary of its own, so that it runs after
//! `datapath`, not beside it: the fault-injection tests count on timers on a machine that is
//! not twice as busy.)

#[path = "datapath.rs"]
mod cases;

// Every device of this binary sends on the wire.
crate::preset_env!("SOFTRDMA_TRANSPORT", "wire");
