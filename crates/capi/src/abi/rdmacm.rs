//! `rdma/rdma_cma.h` (and `infiniband/sa.h`'s path record): the librdmacm structs as C
//! programs see them (rdma-core v44, x86_64 glibc).

use super::verbs::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};
use libc::{
    c_char, c_int, c_void, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t,
};

/// `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: u32 = 0x0002;
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: u32 = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: u32 = 0x0111;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: u32 = 0x013F;

/// `struct rdma_ib_addr`: the InfiniBand addresses of an id.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (network byte order).
    pub pkey: u16,
}

/// The source-address union of `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_sockaddr {
    /// `src_addr` / `dst_addr`.
    pub addr: sockaddr,
    /// `src_sin` / `dst_sin`.
    pub sin: sockaddr_in,
    /// `src_sin6` / `dst_sin6`.
    pub sin6: sockaddr_in6,
    /// `src_storage` / `dst_storage`.
    pub storage: sockaddr_storage,
}

/// The `addr` union of `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_union {
    /// `ibaddr`.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// The source address (`src_addr`, `src_sin`, `src_sin6`, `src_storage`).
    pub src: rdma_sockaddr,
    /// The destination address (`dst_addr`, …).
    pub dst: rdma_sockaddr,
    /// `addr.ibaddr`.
    pub addr: rdma_addr_union,
}

/// `struct ibv_sa_path_rec` (`infiniband/sa.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Raw traffic.
    pub raw_traffic: c_int,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reversible.
    pub reversible: c_int,
    /// Number of paths.
    pub numb_path: u8,
    /// P_Key.
    pub pkey: u16,
    /// Service level.
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: u8,
    /// Path MTU.
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Static rate.
    pub rate: u8,
    /// Packet life time selector.
    pub packet_life_time_selector: u8,
    /// Packet life time.
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// The addresses.
    pub addr: rdma_addr,
    /// Path records (`num_paths` of them).
    pub path_rec: *mut ibv_sa_path_rec,
    /// Number of path records.
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    /// A pollable descriptor, readable while events wait.
    pub fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device context the id is bound to.
    pub verbs: *mut ibv_context,
    /// The event channel.
    pub channel: *mut rdma_event_channel,
    /// The user's context.
    pub context: *mut c_void,
    /// The id's QP.
    pub qp: *mut ibv_qp,
    /// Addresses and path.
    pub route: rdma_route,
    /// `enum rdma_port_space`.
    pub ps: u32,
    /// The port bound to.
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// Completion channel of a CM-made send CQ.
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Completion channel of a CM-made receive CQ.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue.
    pub srq: *mut ibv_srq,
    /// Protection domain of the QP.
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
}

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`.
pub const RDMA_MAX_RESP_RES: u8 = 0xff;

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retry count (ignored when accepting).
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ in use (ids without a QP).
    pub srq: u8,
    /// QP number (ids without a QP).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Address vector of the peer or group.
    pub ah_attr: ibv_ah_attr,
    /// Remote QP number.
    pub qp_num: u32,
    /// Remote Q_Key.
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected port spaces.
    pub conn: rdma_conn_param,
    /// Datagram port spaces and multicast.
    pub ud: rdma_ud_param,
    /// USER events.
    pub arg: u64,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id the event is about.
    pub id: *mut rdma_cm_id,
    /// The listener (CONNECT_REQUEST).
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// Status.
    pub status: c_int,
    /// Parameters.
    pub param: rdma_cm_event_param,
}

/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*` flags.
    pub ai_flags: c_int,
    /// Address family.
    pub ai_family: c_int,
    /// `enum ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// `enum rdma_port_space`.
    pub ai_port_space: c_int,
    /// Length of `ai_src_addr`.
    pub ai_src_len: socklen_t,
    /// Length of `ai_dst_addr`.
    pub ai_dst_len: socklen_t,
    /// Source address.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut sockaddr,
    /// Source canonical name.
    pub ai_src_canonname: *mut c_char,
    /// Destination canonical name.
    pub ai_dst_canonname: *mut c_char,
    /// Length of `ai_route`.
    pub ai_route_len: usize,
    /// Route data.
    pub ai_route: *mut c_void,
    /// Length of `ai_connect`.
    pub ai_connect_len: usize,
    /// Connection data.
    pub ai_connect: *mut c_void,
    /// The next entry.
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`.
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut sockaddr,
}

/// `struct ibv_rx_hash_conf` (verbs.h; part of [`ibv_qp_init_attr_ex`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rx_hash_conf {
    /// `enum ibv_rx_hash_function_flags`.
    pub rx_hash_function: u8,
    /// Length of the key.
    pub rx_hash_key_len: u8,
    /// The key.
    pub rx_hash_key: *mut u8,
    /// `enum ibv_rx_hash_fields`.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex` (verbs.h), as `rdma_create_qp_ex` reads it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr_ex {
    /// Context of the QP's asynchronous events.
    pub qp_context: *mut c_void,
    /// Send CQ (NULL: the CM makes one).
    pub send_cq: *mut ibv_cq,
    /// Receive CQ (NULL: the CM makes one).
    pub recv_cq: *mut ibv_cq,
    /// Shared receive queue.
    pub srq: *mut ibv_srq,
    /// Capabilities (actual ones written back).
    pub cap: super::verbs::ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Every send is signaled.
    pub sq_sig_all: c_int,
    /// `enum ibv_qp_init_attr_mask`.
    pub comp_mask: u32,
    /// PD (with `IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// `enum ibv_qp_create_flags`.
    pub create_flags: u32,
    /// Largest TSO header.
    pub max_tso_header: u16,
    /// RSS indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// RSS hash configuration.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// Source QP number.
    pub source_qpn: u32,
    /// `enum ibv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

/// `struct ibv_tm_cap` (verbs.h; part of [`ibv_srq_init_attr_ex`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_tm_cap {
    /// Tags.
    pub max_num_tags: u32,
    /// Outstanding operations.
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex` (verbs.h), as `rdma_create_srq_ex` reads it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr_ex {
    /// Context of the SRQ's asynchronous events.
    pub srq_context: *mut c_void,
    /// Sizes (actual ones written back).
    pub attr: super::verbs::ibv_srq_attr,
    /// `enum ibv_srq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_srq_type`.
    pub srq_type: u32,
    /// PD (with `IBV_SRQ_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// CQ (XRC).
    pub cq: *mut ibv_cq,
    /// Tag matching.
    pub tm_cap: ibv_tm_cap,
}
