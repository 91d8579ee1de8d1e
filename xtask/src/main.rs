//! softrdma's project chores (none yet).

fn main() {}
