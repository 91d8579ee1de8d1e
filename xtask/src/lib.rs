//! Project chores for softrdma, run as `cargo run --release -p xtask -- <command>`.

#![warn(missing_docs)]

pub mod data;
pub mod stats;
