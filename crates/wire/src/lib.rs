//! Wire formats of RoCEv2 and of the InfiniBand connection manager, as softrdma puts them on
//! UDP port 4791.
//!
//! The style is smoltcp's: for every header there is a zero-copy *view*,
//! `Packet<T: AsRef<[u8]>>`, whose checked constructor (`new_checked`) guarantees that every
//! field accessor stays inside the buffer, and a *representation*, `Repr`, a plain value with
//! `parse` (from a checked view) and `emit` (into a mutable view). Parsing never panics on any
//! input: malformed bytes give an [`Error`].
//!
//! Layout of the crate:
//! - [`ip`]: just enough Ethernet, IPv4, IPv6 and UDP to read captures and compute the ICRC;
//! - [`opcode`]: the RC/UC/UD opcode table and which headers each opcode carries;
//! - [`bth`] and the extended transport headers [`reth`], [`aeth`], [`deth`], [`immdt`],
//!   [`ieth`], [`atomic_eth`], [`atomic_ack_eth`];
//! - [`roce`]: a whole RoCEv2 transport packet (BTH, extension headers, payload, pad, ICRC);
//! - [`icrc`]: the invariant CRC over IPv4 or IPv6;
//! - [`mad`], [`cm`], [`cma`]: management datagrams, IB CM messages and the rdma_cm
//!   private-data header with the port-space service IDs;
//! - [`pcap`]: a reader and writer of classic pcap files.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod deth;
mod error;
mod field;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ip;
pub mod mad;
pub mod opcode;
pub mod pcap;
pub mod reth;
pub mod roce;

pub use error::{Error, Result};

/// The UDP destination port of RoCEv2 (IANA "roce").
pub const ROCE_V2_UDP_PORT: u16 = 4791;
