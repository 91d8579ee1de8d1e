//! ConnectRequest (REQ): its view, its paths and its representation.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::Result;
use core::net::Ipv6Addr;

/// Size of the private data of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;

/// Transport service type of a REQ (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportServiceType {
    /// Reliable connected (0).
    Rc,
    /// Unreliable connected (1).
    Uc,
    /// Reliable datagram (2).
    Rd,
    /// XRC (3; Linux also sets the extended transport type to 1).
    Xrc,
}

impl TransportServiceType {
    /// Decodes the low two bits of `v` (every value is defined, so this never fails).
    pub const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => Self::Xrc,
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Rc => 0,
            Self::Uc => 1,
            Self::Rd => 2,
            Self::Xrc => 3,
        }
    }
}

mod offset {
    pub const PRIMARY_PATH: usize = 52;
    pub const ALTERNATE_PATH: usize = 96;
    pub const PATH_LEN: usize = 44;
    pub const PRIVATE_DATA: usize = 140;
}

cm_view! {
    /// A view of a ConnectRequest (REQ, attribute 0x0010).
    ReqPacket, private_data: offset::PRIVATE_DATA;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// ECE vendor ID (24 bits at byte 5; zero unless the sender uses ECE).
    vendor_id, set_vendor_id: u32 = (5, 0, 24);
    /// Service ID the REQ is addressed to.
    service_id, set_service_id: u64 = (8, 0, 64);
    /// GUID of the sender's channel adapter.
    local_ca_guid, set_local_ca_guid: u64 = (16, 0, 64);
    /// Local Q_Key (0 for RC).
    local_qkey, set_local_qkey: u32 = (28, 0, 32);
    /// Sender's QP number (24 bits).
    local_qpn, set_local_qpn: u32 = (32, 0, 24);
    /// Responder resources the sender offers (RDMA reads/atomics it accepts in flight).
    responder_resources, set_responder_resources: u8 = (35, 0, 8);
    /// Local EE context number (24 bits, 0 unless RD).
    local_eecn, set_local_eecn: u32 = (36, 0, 24);
    /// Initiator depth of the sender (reads/atomics it issues in flight).
    initiator_depth, set_initiator_depth: u8 = (39, 0, 8);
    /// Remote EE context number (24 bits, 0 unless RD).
    remote_eecn, set_remote_eecn: u32 = (40, 0, 24);
    /// Remote CM response timeout (5-bit IBA time).
    remote_cm_response_timeout, set_remote_cm_response_timeout: u8 = (43, 0, 5);
    /// Transport service type, raw 2 bits (see [`TransportServiceType`]).
    transport_service_type, set_transport_service_type: u8 = (43, 5, 2);
    /// End-to-end flow control.
    end_to_end_flow_control, set_end_to_end_flow_control: bool = (43, 7, 1);
    /// Starting PSN of the sender's send queue (24 bits).
    starting_psn, set_starting_psn: u32 = (44, 0, 24);
    /// Local CM response timeout (5-bit IBA time).
    local_cm_response_timeout, set_local_cm_response_timeout: u8 = (47, 0, 5);
    /// Retry count (3 bits).
    retry_count, set_retry_count: u8 = (47, 5, 3);
    /// Partition key.
    partition_key, set_partition_key: u16 = (48, 0, 16);
    /// Path MTU (4 bits, `enum ib_mtu`: 1 = 256 … 5 = 4096).
    path_mtu, set_path_mtu: u8 = (50, 0, 4);
    /// RDC exists.
    rdc_exists, set_rdc_exists: bool = (50, 4, 1);
    /// RNR retry count (3 bits, 7 = infinite).
    rnr_retry_count, set_rnr_retry_count: u8 = (50, 5, 3);
    /// Max CM retries (4 bits).
    max_cm_retries, set_max_cm_retries: u8 = (51, 0, 4);
    /// The sender's QP uses a shared receive queue.
    srq, set_srq: bool = (51, 4, 1);
    /// Extended transport type (3 bits; 1 = XRC).
    extended_transport_type, set_extended_transport_type: u8 = (51, 5, 3);
    /// Primary path: local port LID (0xFFFF on RoCE).
    primary_local_lid, set_primary_local_lid: u16 = (52, 0, 16);
    /// Primary path: remote port LID (0xFFFF on RoCE).
    primary_remote_lid, set_primary_remote_lid: u16 = (54, 0, 16);
    /// Primary path: flow label (20 bits).
    primary_flow_label, set_primary_flow_label: u32 = (88, 0, 20);
    /// Primary path: packet rate (6 bits).
    primary_packet_rate, set_primary_packet_rate: u8 = (91, 2, 6);
    /// Primary path: traffic class (the IP TOS on RoCE).
    primary_traffic_class, set_primary_traffic_class: u8 = (92, 0, 8);
    /// Primary path: hop limit (the IP TTL on RoCE).
    primary_hop_limit, set_primary_hop_limit: u8 = (93, 0, 8);
    /// Primary path: service level (4 bits).
    primary_sl, set_primary_sl: u8 = (94, 0, 4);
    /// Primary path: subnet local.
    primary_subnet_local, set_primary_subnet_local: bool = (94, 4, 1);
    /// Primary path: local ACK timeout (5-bit IBA time).
    primary_local_ack_timeout, set_primary_local_ack_timeout: u8 = (95, 0, 5);
    /// Alternate path: local port LID.
    alternate_local_lid, set_alternate_local_lid: u16 = (96, 0, 16);
    /// Alternate path: remote port LID.
    alternate_remote_lid, set_alternate_remote_lid: u16 = (98, 0, 16);
    /// Alternate path: flow label (20 bits).
    alternate_flow_label, set_alternate_flow_label: u32 = (132, 0, 20);
    /// Alternate path: packet rate (6 bits).
    alternate_packet_rate, set_alternate_packet_rate: u8 = (135, 2, 6);
    /// Alternate path: traffic class.
    alternate_traffic_class, set_alternate_traffic_class: u8 = (136, 0, 8);
    /// Alternate path: hop limit.
    alternate_hop_limit, set_alternate_hop_limit: u8 = (137, 0, 8);
    /// Alternate path: service level (4 bits).
    alternate_sl, set_alternate_sl: u8 = (138, 0, 4);
    /// Alternate path: subnet local.
    alternate_subnet_local, set_alternate_subnet_local: bool = (138, 4, 1);
    /// Alternate path: local ACK timeout (5-bit IBA time).
    alternate_local_ack_timeout, set_alternate_local_ack_timeout: u8 = (139, 0, 5);
    /// SAP supported (byte 139, bit 5).
    sap_supported, set_sap_supported: bool = (139, 5, 1);
}

impl<T: AsRef<[u8]>> ReqPacket<T> {
    /// Primary path: local port GID (the initiator's IP address as a GID on RoCE).
    pub fn primary_local_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 56))
    }

    /// Primary path: remote port GID (the target's IP address as a GID on RoCE).
    pub fn primary_remote_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 72))
    }

    /// Alternate path: local port GID.
    pub fn alternate_local_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 100))
    }

    /// Alternate path: remote port GID.
    pub fn alternate_remote_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 116))
    }

    /// The 44 raw bytes of the primary path (offsets 52..96).
    pub fn primary_path_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[offset::PRIMARY_PATH..offset::PRIMARY_PATH + offset::PATH_LEN]
    }

    /// The 44 raw bytes of the alternate path (offsets 96..140, SAP bit included).
    pub fn alternate_path_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[offset::ALTERNATE_PATH..offset::ALTERNATE_PATH + offset::PATH_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReqPacket<T> {
    /// Sets the primary local port GID.
    pub fn set_primary_local_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[56..72].copy_from_slice(&gid.octets());
    }

    /// Sets the primary remote port GID.
    pub fn set_primary_remote_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[72..88].copy_from_slice(&gid.octets());
    }

    /// Sets the alternate local port GID.
    pub fn set_alternate_local_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[100..116].copy_from_slice(&gid.octets());
    }

    /// Sets the alternate remote port GID.
    pub fn set_alternate_remote_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[116..132].copy_from_slice(&gid.octets());
    }
}

/// One path of a REQ (primary or alternate). On RoCE the alternate path is all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, permissive, on RoCE when routed).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (sender's IP as a GID; IPv4 is v4-mapped).
    pub local_gid: Ipv6Addr,
    /// Remote port GID.
    pub remote_gid: Ipv6Addr,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `enum ib_rate`).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5-bit IBA time).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    /// A path with every field zero (what RoCE REQs carry as the alternate path).
    pub const ZERO: ReqPath = ReqPath {
        local_lid: 0,
        remote_lid: 0,
        local_gid: Ipv6Addr::UNSPECIFIED,
        remote_gid: Ipv6Addr::UNSPECIFIED,
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0,
    };
}

/// A ConnectRequest (REQ) as a plain value.
///
/// Integer fields narrower than their type (QPNs, PSN, timeouts, …) are truncated to their
/// wire width by `emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_service_type: TransportServiceType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub partition_key: u16,
    /// Path MTU (4 bits, `enum ib_mtu`).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: ReqPath,
    /// Alternate path (all zero on RoCE).
    pub alternate_path: ReqPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm puts its 36-byte header first, see [`crate::cma`]).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Reads a REQ.
    ///
    /// Fails with [`Error::Truncated`](crate::Error::Truncated) when the view is shorter than [`CM_DATA_LEN`].
    pub fn parse<T: AsRef<[u8]>>(p: &ReqPacket<T>) -> Result<ReqRepr> {
        p.check_len()?;
        Ok(ReqRepr {
            local_comm_id: p.local_comm_id(),
            vendor_id: p.vendor_id(),
            service_id: p.service_id(),
            local_ca_guid: p.local_ca_guid(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            responder_resources: p.responder_resources(),
            local_eecn: p.local_eecn(),
            initiator_depth: p.initiator_depth(),
            remote_eecn: p.remote_eecn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            transport_service_type: TransportServiceType::from_bits(p.transport_service_type()),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            starting_psn: p.starting_psn(),
            local_cm_response_timeout: p.local_cm_response_timeout(),
            retry_count: p.retry_count(),
            partition_key: p.partition_key(),
            path_mtu: p.path_mtu(),
            rdc_exists: p.rdc_exists(),
            rnr_retry_count: p.rnr_retry_count(),
            max_cm_retries: p.max_cm_retries(),
            srq: p.srq(),
            extended_transport_type: p.extended_transport_type(),
            primary_path: ReqPath {
                local_lid: p.primary_local_lid(),
                remote_lid: p.primary_remote_lid(),
                local_gid: p.primary_local_gid(),
                remote_gid: p.primary_remote_gid(),
                flow_label: p.primary_flow_label(),
                packet_rate: p.primary_packet_rate(),
                traffic_class: p.primary_traffic_class(),
                hop_limit: p.primary_hop_limit(),
                sl: p.primary_sl(),
                subnet_local: p.primary_subnet_local(),
                local_ack_timeout: p.primary_local_ack_timeout(),
            },
            alternate_path: ReqPath {
                local_lid: p.alternate_local_lid(),
                remote_lid: p.alternate_remote_lid(),
                local_gid: p.alternate_local_gid(),
                remote_gid: p.alternate_remote_gid(),
                flow_label: p.alternate_flow_label(),
                packet_rate: p.alternate_packet_rate(),
                traffic_class: p.alternate_traffic_class(),
                hop_limit: p.alternate_hop_limit(),
                sl: p.alternate_sl(),
                subnet_local: p.alternate_subnet_local(),
                local_ack_timeout: p.alternate_local_ack_timeout(),
            },
            sap_supported: p.sap_supported(),
            private_data: read_array(p.buffer.as_ref(), offset::PRIVATE_DATA),
        })
    }

    /// Length of the CM data a REQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REQ, zeroing every reserved bit.
    ///
    /// Panics if the view is shorter than [`CM_DATA_LEN`]; checked views never are.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ReqPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_vendor_id(self.vendor_id);
        p.set_service_id(self.service_id);
        p.set_local_ca_guid(self.local_ca_guid);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_responder_resources(self.responder_resources);
        p.set_local_eecn(self.local_eecn);
        p.set_initiator_depth(self.initiator_depth);
        p.set_remote_eecn(self.remote_eecn);
        p.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        p.set_transport_service_type(self.transport_service_type.bits());
        p.set_end_to_end_flow_control(self.end_to_end_flow_control);
        p.set_starting_psn(self.starting_psn);
        p.set_local_cm_response_timeout(self.local_cm_response_timeout);
        p.set_retry_count(self.retry_count);
        p.set_partition_key(self.partition_key);
        p.set_path_mtu(self.path_mtu);
        p.set_rdc_exists(self.rdc_exists);
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_max_cm_retries(self.max_cm_retries);
        p.set_srq(self.srq);
        p.set_extended_transport_type(self.extended_transport_type);
        let a = &self.primary_path;
        p.set_primary_local_lid(a.local_lid);
        p.set_primary_remote_lid(a.remote_lid);
        p.set_primary_local_gid(a.local_gid);
        p.set_primary_remote_gid(a.remote_gid);
        p.set_primary_flow_label(a.flow_label);
        p.set_primary_packet_rate(a.packet_rate);
        p.set_primary_traffic_class(a.traffic_class);
        p.set_primary_hop_limit(a.hop_limit);
        p.set_primary_sl(a.sl);
        p.set_primary_subnet_local(a.subnet_local);
        p.set_primary_local_ack_timeout(a.local_ack_timeout);
        let b = &self.alternate_path;
        p.set_alternate_local_lid(b.local_lid);
        p.set_alternate_remote_lid(b.remote_lid);
        p.set_alternate_local_gid(b.local_gid);
        p.set_alternate_remote_gid(b.remote_gid);
        p.set_alternate_flow_label(b.flow_label);
        p.set_alternate_packet_rate(b.packet_rate);
        p.set_alternate_traffic_class(b.traffic_class);
        p.set_alternate_hop_limit(b.hop_limit);
        p.set_alternate_sl(b.sl);
        p.set_alternate_subnet_local(b.subnet_local);
        p.set_alternate_local_ack_timeout(b.local_ack_timeout);
        p.set_sap_supported(self.sap_supported);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
