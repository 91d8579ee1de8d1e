//! The extended verbs (`verbs_context.create_qp_ex`, `query_device_ex`, `create_cq_ex`,
//! `ibv_qp_to_qp_ex`, the `ibv_qp_ex` `wr_*` table and the `ibv_cq_ex` poll functions).
//!
//! STUB owned by the capi-ex branch, which replaces this file: [`install`] is called for
//! every new context with its `verbs_context` and fills the extended slots;
//! `ibv_qp_to_qp_ex` turns a QP into its `ibv_qp_ex`. [`QpExTail`] and [`CqExTail`] are the
//! room after the `ibv_qp`/`ibv_cq` header in every QP/CQ wrapper
//! (`super::objects::CQp::ex`, `CCq::ex`), so that `struct ibv_qp_ex` / `struct ibv_cq_ex`
//! can start at the same address as the base object.

use crate::abi::*;

/// The bytes after `struct ibv_qp` in `struct ibv_qp_ex` (HEAD: 360 - 160), zeroed until
/// `verbs::ex` fills them.
#[repr(C)]
pub struct QpExTail(pub [u64; 25]);

impl Default for QpExTail {
    fn default() -> Self {
        QpExTail([0; 25])
    }
}

/// The bytes after `struct ibv_cq` in `struct ibv_cq_ex`, zeroed until `verbs::ex` fills
/// them.
#[repr(C)]
pub struct CqExTail(pub [u64; 24]);

impl Default for CqExTail {
    fn default() -> Self {
        CqExTail([0; 24])
    }
}

/// Fills the extended slots of a new context's `verbs_context` (the stub fills none, so
/// programs fall back to the basic verbs or get `EOPNOTSUPP` from the inline wrappers).
pub fn install(vctx: &mut verbs_context) {
    let _ = vctx;
}

/// `ibv_qp_to_qp_ex`: the stub has no extended QPs and returns NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut libc::c_void {
    let _ = qp;
    std::ptr::null_mut()
}
