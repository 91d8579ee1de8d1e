//! The structs, enums and constants of rdma-core's public headers (`infiniband/verbs.h`,
//! `rdma/rdma_cma.h`), `#[repr(C)]` with the field names of the headers, for x86_64 glibc.
//! `tests/layout.rs` compiles an `offsetof` dump against the installed headers
//! (libibverbs-dev, librdmacm-dev) and compares every size and offset.

pub mod ex;
pub mod rdmacm;
pub mod verbs;

pub use ex::*;
pub use rdmacm::*;
pub use verbs::*;
