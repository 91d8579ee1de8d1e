//! Drop-in `libibverbs.so.1` and `librdmacm.so.1`: rdma-core's C ABI over the softrdma
//! library, so that unmodified C programs (rdma-core's tools, perftest, UCX, libfabric …)
//! run on softrdma's software RoCEv2 device.
//!
//! The crate builds a static library; `link.sh` links it into the two shared objects with
//! rdma-core's symbol versions (`IBVERBS_1.0` … `IBVERBS_1.14`, `RDMACM_1.0` … `RDMACM_1.3`).
//! The whole engine lives in `libibverbs.so.1`; `librdmacm.so.1` is one tail jump per
//! function into it, so a program that links both has one copy of every device, QP and
//! connection.
//!
//! Layout:
//! - [`abi`]: the `#[repr(C)]` structs of rdma-core's public headers (x86_64), checked
//!   against the installed headers by `tests/layout.rs`.
//! - [`verbs`]: the `ibv_*` functions and the objects behind the pointers they hand out.
//! - [`rdmacm`]: the `rdma_*` functions.
//! - [`revocable`]: channel wrappers that a late call on a destroyed channel can still read.
//!
//! Every entry point translates: the softrdma library under it stays the one
//! implementation. Errors set `errno` as rdma-core does; no panic crosses the C boundary
//! (each entry point catches it and fails with `EIO`).

#![allow(non_camel_case_types, non_snake_case, clippy::missing_safety_doc)]

pub mod abi;
pub mod ffi;
pub mod rdmacm;
pub mod revocable;
pub mod verbs;
