//! The extended verbs of `infiniband/verbs.h`: `struct ibv_qp_ex` (the `ibv_wr_*` work
//! request builders), `struct ibv_cq_ex` (`ibv_start_poll` and the `ibv_wc_read_*` readers)
//! and `struct ibv_cq_init_attr_ex`, for x86_64. (`struct ibv_qp_init_attr_ex` is in
//! [`super::rdmacm`], `struct ibv_device_attr_ex` in [`super::verbs`].) Programs reach all of
//! them through function pointers (the `verbs_context` slots and the tables below), never
//! through symbols.

use super::verbs::{ibv_ah, ibv_comp_channel, ibv_cq, ibv_pd, ibv_qp, ibv_sge};
use libc::{c_int, c_uint, c_void, size_t};

/// `enum ibv_qp_init_attr_mask`: `pd` is valid.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `xrcd` is valid.
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
/// `create_flags` is valid.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `max_tso_header` is valid.
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
/// `rwq_ind_tbl` is valid.
pub const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 1 << 4;
/// `rx_hash_conf` is valid.
pub const IBV_QP_INIT_ATTR_RX_HASH: u32 = 1 << 5;
/// `send_ops_flags` is valid.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `enum ibv_qp_create_send_ops_flags`: the QP will post `ibv_wr_rdma_write`.
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
/// `ibv_wr_rdma_write_imm`.
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
/// `ibv_wr_send`.
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
/// `ibv_wr_send_imm`.
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
/// `ibv_wr_rdma_read`.
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
/// `ibv_wr_atomic_cmp_swp`.
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
/// `ibv_wr_atomic_fetch_add`.
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
/// `ibv_wr_local_inv`.
pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
/// `ibv_wr_bind_mw`.
pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
/// `ibv_wr_send_inv`.
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
/// `ibv_wr_send_tso`.
pub const IBV_QP_EX_WITH_TSO: u64 = 1 << 10;
/// `ibv_wr_flush` (HEAD).
pub const IBV_QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// `ibv_wr_atomic_write`.
pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

/// `enum ibv_create_cq_wc_flags`: `ibv_wc_read_byte_len` is valid.
pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
/// `ibv_wc_read_imm_data`.
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
/// `ibv_wc_read_qp_num`.
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
/// `ibv_wc_read_src_qp`.
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
/// `ibv_wc_read_slid`.
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
/// `ibv_wc_read_sl`.
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
/// `ibv_wc_read_dlid_path_bits`.
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
/// `ibv_wc_read_completion_ts`.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `ibv_wc_read_cvlan`.
pub const IBV_WC_EX_WITH_CVLAN: u64 = 1 << 8;
/// `ibv_wc_read_flow_tag`.
pub const IBV_WC_EX_WITH_FLOW_TAG: u64 = 1 << 9;
/// `ibv_wc_read_tm_info`.
pub const IBV_WC_EX_WITH_TM_INFO: u64 = 1 << 10;
/// `ibv_wc_read_completion_wallclock_ns`.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
/// `IBV_WC_STANDARD_FLAGS`: the fields of a plain `struct ibv_wc`.
pub const IBV_WC_STANDARD_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS;

/// `enum ibv_cq_init_attr_mask`: `flags` is valid.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
/// `parent_domain` is valid.
pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
/// `enum ibv_create_cq_attr_flags`: the CQ is polled by one thread only.
pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;
/// The CQ may overrun without an error.
pub const IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: u32 = 1 << 1;

/// `struct ibv_data_buf`: one buffer of `ibv_wr_set_inline_data_list`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_data_buf {
    /// First byte.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: size_t,
}

/// `struct ibv_qp_ex` (rdma-core HEAD, 360 bytes; v44's ends before `wr_flush`, at 352): the
/// QP followed by the `ibv_wr_*` builder table. `wr_id` and `wr_flags` are read by each
/// builder.
#[repr(C)]
pub struct ibv_qp_ex {
    /// The QP itself (`ibv_qp_to_qp_ex` and back are the same address).
    pub qp_base: ibv_qp,
    /// Reserved (0).
    pub comp_mask: u64,
    /// The `wr_id` of the next work request a builder starts.
    pub wr_id: u64,
    /// The `enum ibv_send_flags` of the next work request a builder starts.
    pub wr_flags: c_uint,
    /// `ibv_wr_atomic_cmp_swp(qp, rkey, remote_addr, compare, swap)`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    /// `ibv_wr_atomic_fetch_add(qp, rkey, remote_addr, add)`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    /// `ibv_wr_bind_mw(qp, mw, rkey, bind_info)`.
    pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const c_void)>,
    /// `ibv_wr_local_inv(qp, invalidate_rkey)`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_rdma_read(qp, rkey, remote_addr)`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write(qp, rkey, remote_addr)`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write_imm(qp, rkey, remote_addr, imm_data)` (imm_data big-endian).
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_send(qp)`.
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_send_imm(qp, imm_data)` (imm_data big-endian).
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_inv(qp, invalidate_rkey)`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_tso(qp, hdr, hdr_sz, mss)`.
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    /// `ibv_wr_set_ud_addr(qp, ah, remote_qpn, remote_qkey)`.
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    /// `ibv_wr_set_xrc_srqn(qp, remote_srqn)`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_set_inline_data(qp, addr, length)`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, size_t)>,
    /// `ibv_wr_set_inline_data_list(qp, num_buf, buf_list)`.
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, size_t, *const ibv_data_buf)>,
    /// `ibv_wr_set_sge(qp, lkey, addr, length)`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_set_sge_list(qp, num_sge, sg_list)`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, size_t, *const ibv_sge)>,
    /// `ibv_wr_start(qp)`: opens the critical section.
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_complete(qp)`: posts what was built; 0 or an errno.
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    /// `ibv_wr_abort(qp)`: discards what was built.
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_atomic_write(qp, rkey, remote_addr, atomic_wr)`.
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    /// `ibv_wr_flush(qp, rkey, remote_addr, len, type, level)` (HEAD only).
    pub wr_flush: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, size_t, u8, u8)>,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_poll_cq_attr {
    /// Reserved (must be 0).
    pub comp_mask: u32,
}

/// `struct ibv_wc_tm_info` (tag matching; never valid here).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_wc_tm_info {
    /// Tag.
    pub tag: u64,
    /// Opaque user data.
    pub priv_: u32,
}

/// `struct ibv_cq_ex`: a `struct ibv_cq` (C repeats its fields; here it is embedded as
/// `cq`) followed by the current completion's `status`/`wr_id` and the polling table.
#[repr(C)]
pub struct ibv_cq_ex {
    /// The fields of `struct ibv_cq` (`ibv_cq_ex_to_cq` is the same address).
    pub cq: ibv_cq,
    /// Reserved (0).
    pub comp_mask: u32,
    /// `enum ibv_wc_status` of the current completion.
    pub status: u32,
    /// `wr_id` of the current completion.
    pub wr_id: u64,
    /// `ibv_start_poll(cq, attr)`: 0 with the first completion current, or ENOENT.
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    /// `ibv_next_poll(cq)`: 0 with the next completion current, or ENOENT.
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `ibv_end_poll(cq)`.
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    /// `ibv_wc_read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_imm_data` (big-endian).
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    /// `ibv_wc_read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_completion_ts`.
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    /// `ibv_wc_read_cvlan`.
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    /// `ibv_wc_read_flow_tag`.
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_tm_info`.
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    /// `ibv_wc_read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_cq_init_attr_ex {
    /// Minimum number of entries.
    pub cqe: u32,
    /// Returned in completion events.
    pub cq_context: *mut c_void,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector (< `num_comp_vectors`).
    pub comp_vector: u32,
    /// `enum ibv_create_cq_wc_flags`: the fields the readers may ask for.
    pub wc_flags: u64,
    /// `enum ibv_cq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_create_cq_attr_flags` (`IBV_CQ_INIT_ATTR_MASK_FLAGS`).
    pub flags: u32,
    /// `IBV_CQ_INIT_ATTR_MASK_PD`.
    pub parent_domain: *mut ibv_pd,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<super::rdmacm::ibv_qp_init_attr_ex>() == 136);
    assert!(offset_of!(super::rdmacm::ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(size_of::<ibv_qp_ex>() == 360);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_cmp_swp) == 184);
    assert!(offset_of!(ibv_qp_ex, wr_id) == 168);
    assert!(offset_of!(ibv_qp_ex, wr_start) == 320);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_write) == 344);
    assert!(size_of::<ibv_cq_ex>() == 288);
    assert!(offset_of!(ibv_cq_ex, start_poll) == 144);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
};
