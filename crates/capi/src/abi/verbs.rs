//! `infiniband/verbs.h` (rdma-core v44, x86_64 glibc): the structs, unions and enum values
//! that the library and the programs touch, with the header's field names. Enums are plain
//! `u32`/`i32` values (a C program may pass any number), with the header's constants.

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t, size_t};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `union ibv_gid`: 16 bytes, 8-byte aligned (the `global` view holds two `__be64`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// The 16 bytes, network order.
    pub raw: [u8; 16],
    /// Subnet prefix and interface id, big endian.
    pub global: ibv_gid_global,
}

/// The `global` view of [`ibv_gid`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_global {
    /// `__be64 subnet_prefix`.
    pub subnet_prefix: u64,
    /// `__be64 interface_id`.
    pub interface_id: u64,
}

/// `enum ibv_gid_type`: `IBV_GID_TYPE_IB`.
pub const IBV_GID_TYPE_IB: u32 = 0;
/// `IBV_GID_TYPE_ROCE_V1`.
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` (what the private `ibv_query_gid_type` reports).
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `enum ibv_node_type`: `IBV_NODE_CA`.
pub const IBV_NODE_CA: c_int = 1;
/// `IBV_NODE_UNKNOWN`.
pub const IBV_NODE_UNKNOWN: c_int = -1;
/// `enum ibv_transport_type`: `IBV_TRANSPORT_IB`.
pub const IBV_TRANSPORT_IB: c_int = 0;
/// `IBV_TRANSPORT_IWARP`.
pub const IBV_TRANSPORT_IWARP: c_int = 1;

/// `enum ibv_atomic_cap`: `IBV_ATOMIC_NONE`, `_HCA`, `_GLOB`.
pub const IBV_ATOMIC_NONE: u32 = 0;
/// `IBV_ATOMIC_HCA`.
pub const IBV_ATOMIC_HCA: u32 = 1;
/// `IBV_ATOMIC_GLOB`.
pub const IBV_ATOMIC_GLOB: u32 = 2;

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps.per_transport_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps_per_transport {
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub per_transport_caps: ibv_odp_caps_per_transport,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `enum ibv_mtu`: `IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5.
pub const IBV_MTU_256: u32 = 1;
/// `IBV_MTU_4096`.
pub const IBV_MTU_4096: u32 = 5;

/// `enum ibv_port_state`: `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_UNSPECIFIED`.
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `struct ibv_port_attr` (52 bytes in v44; 56 in later headers, which add a `u32
/// port_cap_flags2`-sized tail the library fills only when the caller's size has room).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `struct ibv_port_attr` that `ibv_query_port@IBVERBS_1.1` writes (the layout of
/// the IBVERBS_1.1 era, up to `flags`).
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `enum ibv_event_type` values are those of [`softrdma::EventType`]; `IBV_EVENT_CQ_ERR`.
pub const IBV_EVENT_CQ_ERR: u32 = 0;
/// `IBV_EVENT_DEVICE_FATAL`.
pub const IBV_EVENT_DEVICE_FATAL: u32 = 8;
/// `IBV_EVENT_PORT_ACTIVE`.
pub const IBV_EVENT_PORT_ACTIVE: u32 = 9;
/// `IBV_EVENT_WQ_FATAL` (the last one).
pub const IBV_EVENT_WQ_FATAL: u32 = 19;

/// The `element` union of [`ibv_async_event`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: ibv_async_event_element,
    pub event_type: u32,
}

/// `enum ibv_wc_status`: `IBV_WC_SUCCESS` … `IBV_WC_TM_RNDV_INCOMPLETE` (= 23).
pub const IBV_WC_SUCCESS: u32 = 0;
/// `IBV_WC_GENERAL_ERR`.
pub const IBV_WC_GENERAL_ERR: u32 = 21;

/// `IBV_WC_GRH`.
pub const IBV_WC_GRH: u32 = 1;
/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: u32 = 2;
/// `IBV_WC_WITH_INV`.
pub const IBV_WC_WITH_INV: u32 = 8;

/// `struct ibv_wc`. `imm_data` is the union of `__be32 imm_data` and `uint32_t
/// invalidated_rkey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `enum ibv_access_flags`: `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `IBV_ACCESS_OPTIONAL_RANGE` (bits `ibv_reg_mr` ignores when the device lacks them).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_int = 0x3ff0_0000;

/// `struct ibv_pd`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: size_t,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `enum ibv_mw_type`: `IBV_MW_TYPE_1`, `IBV_MW_TYPE_2`.
pub const IBV_MW_TYPE_1: u32 = 1;

/// `struct ibv_mw`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `enum ibv_srq_attr_mask`: `IBV_SRQ_MAX_WR`, `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_MAX_WR: c_int = 1;
/// `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: c_int = 2;

/// `enum ibv_qp_type`: `IBV_QPT_RC`.
pub const IBV_QPT_RC: u32 = 2;
/// `IBV_QPT_UC`.
pub const IBV_QPT_UC: u32 = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: u32 = 4;
/// `IBV_QPT_RAW_PACKET`.
pub const IBV_QPT_RAW_PACKET: u32 = 8;
/// `IBV_QPT_XRC_SEND`.
pub const IBV_QPT_XRC_SEND: u32 = 9;
/// `IBV_QPT_XRC_RECV`.
pub const IBV_QPT_XRC_RECV: u32 = 10;
/// `IBV_QPT_DRIVER`.
pub const IBV_QPT_DRIVER: u32 = 0xff;

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `enum ibv_qp_attr_mask`: `IBV_QP_STATE` … `IBV_QP_RATE_LIMIT` (bit 25) are those of
/// [`softrdma::QpAttrMask`]; `IBV_QP_STATE`.
pub const IBV_QP_STATE: c_int = 1;

/// `enum ibv_qp_state`: `IBV_QPS_RESET` … `IBV_QPS_ERR` (6), `IBV_QPS_UNKNOWN` (7).
pub const IBV_QPS_RESET: u32 = 0;
/// `IBV_QPS_UNKNOWN`.
pub const IBV_QPS_UNKNOWN: u32 = 7;

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `enum ibv_wr_opcode` values are those of [`softrdma::WrOpcode`]; `IBV_WR_SEND`.
pub const IBV_WR_SEND: u32 = 2;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: c_uint = 8;

/// `struct ibv_sge` (the same layout as [`softrdma::Sge`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `qp_type.xrc` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_xrc {
    pub remote_srqn: u32,
}

/// The `qp_type` union of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    pub xrc: ibv_send_wr_xrc,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`: the argument of `ibv_bind_mw`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `bind_mw` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `tso` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The anonymous `bind_mw`/`tso` union at the end of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`. `imm_data` is the anonymous union of `__be32 imm_data` and
/// `uint32_t invalidate_rkey`; `ext` the anonymous union of `bind_mw` and `tso`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    pub qp_type: ibv_send_wr_qp_type,
    pub ext: ibv_send_wr_ext,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct _ibv_device_ops` (unused by rdma-core since v13).
#[repr(C)]
#[derive(Debug)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `ops.poll_cq`.
pub type poll_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`.
pub type req_notify_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.post_srq_recv`.
pub type post_srq_recv_fn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.post_send`.
pub type post_send_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`.
pub type post_recv_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.alloc_mw`.
pub type alloc_mw_fn = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
/// `ops.bind_mw`.
pub type bind_mw_fn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut c_void) -> c_int;
/// `ops.dealloc_mw`.
pub type dealloc_mw_fn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;
/// An ops slot the library leaves NULL.
pub type compat_fn = Option<unsafe extern "C" fn()>;

/// `struct ibv_context_ops` (256 bytes). The `_compat_*` slots are unused by programs.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: compat_fn,
    pub _compat_query_port: compat_fn,
    pub _compat_alloc_pd: compat_fn,
    pub _compat_dealloc_pd: compat_fn,
    pub _compat_reg_mr: compat_fn,
    pub _compat_rereg_mr: compat_fn,
    pub _compat_dereg_mr: compat_fn,
    pub alloc_mw: Option<alloc_mw_fn>,
    pub bind_mw: Option<bind_mw_fn>,
    pub dealloc_mw: Option<dealloc_mw_fn>,
    pub _compat_create_cq: compat_fn,
    pub poll_cq: Option<poll_cq_fn>,
    pub req_notify_cq: Option<req_notify_cq_fn>,
    pub _compat_cq_event: compat_fn,
    pub _compat_resize_cq: compat_fn,
    pub _compat_destroy_cq: compat_fn,
    pub _compat_create_srq: compat_fn,
    pub _compat_modify_srq: compat_fn,
    pub _compat_query_srq: compat_fn,
    pub _compat_destroy_srq: compat_fn,
    pub post_srq_recv: Option<post_srq_recv_fn>,
    pub _compat_create_qp: compat_fn,
    pub _compat_query_qp: compat_fn,
    pub _compat_modify_qp: compat_fn,
    pub _compat_destroy_qp: compat_fn,
    pub post_send: Option<post_send_fn>,
    pub post_recv: Option<post_recv_fn>,
    pub _compat_create_ah: compat_fn,
    pub _compat_destroy_ah: compat_fn,
    pub _compat_attach_mcast: compat_fn,
    pub _compat_detach_mcast: compat_fn,
    pub _compat_async_event: compat_fn,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `verbs_context.query_port`: size-aware port query.
pub type query_port_fn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, size_t) -> c_int;
/// `verbs_context.query_device_ex`.
pub type query_device_ex_fn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    size_t,
) -> c_int;
/// `verbs_context.create_qp_ex` (the attr is `struct ibv_qp_init_attr_ex`, see `verbs::ex`).
pub type create_qp_ex_fn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_qp;
/// `verbs_context.create_cq_ex` (attr `struct ibv_cq_init_attr_ex`, result `struct
/// ibv_cq_ex`, see `verbs::ex`).
pub type create_cq_ex_fn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut c_void;
/// `verbs_context.advise_mr` (`ibv_advise_mr`).
pub type advise_mr_fn = unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int;
/// A `verbs_context` slot the library leaves NULL.
pub type vslot = Option<unsafe extern "C" fn()>;

/// `struct verbs_context` as the v44 header has it (648 bytes, `context` last at 320). The
/// library allocates the larger [`verbs_context_alloc`] (rdma-core HEAD's 696 bytes).
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<query_port_fn>,
    pub advise_mr: Option<advise_mr_fn>,
    pub alloc_null_mr: vslot,
    pub read_counters: vslot,
    pub attach_counters_point_flow: vslot,
    pub create_counters: vslot,
    pub destroy_counters: vslot,
    pub reg_dm_mr: vslot,
    pub alloc_dm: vslot,
    pub free_dm: vslot,
    pub modify_flow_action_esp: vslot,
    pub destroy_flow_action: vslot,
    pub create_flow_action_esp: vslot,
    pub modify_qp_rate_limit: vslot,
    pub alloc_parent_domain: vslot,
    pub dealloc_td: vslot,
    pub alloc_td: vslot,
    pub modify_cq: vslot,
    pub post_srq_ops: vslot,
    pub destroy_rwq_ind_table: vslot,
    pub create_rwq_ind_table: vslot,
    pub destroy_wq: vslot,
    pub modify_wq: vslot,
    pub create_wq: vslot,
    pub query_rt_values: vslot,
    pub create_cq_ex: Option<create_cq_ex_fn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<query_device_ex_fn>,
    pub ibv_destroy_flow: vslot,
    pub ABI_placeholder2: vslot,
    pub ibv_create_flow: vslot,
    pub ABI_placeholder1: vslot,
    pub open_qp: vslot,
    pub create_qp_ex: Option<create_qp_ex_fn>,
    pub get_srq_num: vslot,
    pub create_srq_ex: vslot,
    pub open_xrcd: vslot,
    pub close_xrcd: vslot,
    pub _ABI_placeholder3: u64,
    pub sz: size_t,
    pub context: ibv_context,
}

/// Slots that newer headers put in front of [`verbs_context`] (HEAD: 6 pointers). The
/// library leaves them NULL; they exist so that `sz` covers them.
pub const VERBS_CONTEXT_HEAD_SLOTS: usize = 6;

/// What the library allocates for a context: the newest `verbs_context` layout (696 bytes,
/// `ibv_context` at 368), so `verbs_get_ctx_op` of programs built against any header up
/// to rdma-core HEAD finds the slots where it looks.
#[repr(C)]
pub struct verbs_context_alloc {
    /// The slots newer than v44, NULL.
    pub head_slots: [vslot; VERBS_CONTEXT_HEAD_SLOTS],
    /// The v44 layout, ending with the `ibv_context`.
    pub vctx: verbs_context,
}

/// `IBV_DEVICE_*` capability bits used: `IBV_DEVICE_RC_RNR_NAK_GEN`.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;
