//! Every test of `datapath.rs` again in the shape of a path between two hosts over IPv4:
//! `SOFTRDMA_TRANSPORT=wire`, packets of the path MTU (`SOFTRDMA_SAME_HOST_SEGMENT=0`), and
//! `SOFTRDMA_GSO_NUMBERED=all`, which numbers the datagrams of every UDP GSO message toward
//! loopback too (each sealed with the IPv4 identification the kernel gives it between hosts),
//! so every receive verifies such datagrams through a solved identification. (A binary of its
//! own, like `datapath_wire`: the environment is the process's.)

#[path = "datapath.rs"]
mod cases;

crate::preset_env!("SOFTRDMA_TRANSPORT", "wire");
crate::preset_env!("SOFTRDMA_SAME_HOST_SEGMENT", "0");
crate::preset_env!("SOFTRDMA_GSO_NUMBERED", "all");
