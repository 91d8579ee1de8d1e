//! Devices: one software RDMA device per local IP address.
//!
//! softrdma's devices are not hardware: each one is a local IPv4 or IPv6 address on which the
//! device will speak RoCEv2 (UDP port 4791). [`get_device_list`] lists one device per address
//! of the machine's interfaces (IPv6 link-local addresses excepted), named `srdma0`,
//! `srdma1`, … in interface order, IPv4 first. [`Device::from_addr`] gives a device for any
//! local address, listed or not: on Linux every address of 127.0.0.0/8 is local, so
//! `127.0.0.1`, `127.0.0.2`, … are as many independent "NICs" on loopback, which lets tests
//! run two devices in one process or in two.
//!
//! Every context opened on the same address shares one device state (QP numbers, memory keys,
//! the UDP socket of the data path), as contexts of one rxe device share its tables.

use crate::error::{Error, ErrorKind, Result};
use crate::gid::{Gid, GidType};
use softrdma_proto::Mtu;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// The only port of every softrdma device (ports are numbered from 1, as in verbs).
pub const PORT_NUM: u8 = 1;

/// A software RDMA device (`struct ibv_device`): a local IP address with a name and a GUID.
///
/// Cheap to clone; open it with [`Device::open`].
#[derive(Clone)]
pub struct Device {
    pub(crate) info: Arc<DeviceInfo>,
}

#[derive(Debug)]
pub(crate) struct DeviceInfo {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    pub(crate) ifname: String,
    pub(crate) ifindex: u32,
    pub(crate) guid: u64,
    pub(crate) netdev_mtu: u32,
}

/// Lists the devices of this machine (`ibv_get_device_list`): one per local IP address,
/// IPv6 link-local addresses excepted, in interface order with IPv4 first.
///
/// A machine with no usable address gives an empty list, not an error. Fails with the errno
/// of `getifaddrs` when the interfaces cannot be read.
pub fn get_device_list() -> Result<Vec<Device>> {
    let mut addrs = if_addrs::get_if_addrs()
        .map_err(|e| Error::from_io(e, "listing the network interfaces (getifaddrs)"))?;
    addrs.retain(|a| match a.ip() {
        IpAddr::V6(v6) => !is_v6_link_local(&v6) && !v6.is_unspecified(),
        IpAddr::V4(v4) => !v4.is_unspecified(),
    });
    addrs.sort_by_key(|a| (a.index.unwrap_or(u32::MAX), a.ip().is_ipv6()));
    Ok(addrs
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let ifindex = a.index.unwrap_or(0);
            Device::new(format!("srdma{i}"), a.ip(), a.name.clone(), ifindex)
        })
        .collect())
}

fn is_v6_link_local(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}

fn netdev_mtu(ifname: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500)
}

impl Device {
    fn new(name: String, addr: IpAddr, ifname: String, ifindex: u32) -> Device {
        let netdev_mtu = netdev_mtu(&ifname);
        Device {
            info: Arc::new(DeviceInfo {
                name,
                addr,
                guid: crate::gid::guid_for(&addr),
                ifname,
                ifindex,
                netdev_mtu,
            }),
        }
    }

    /// The device for the local address `addr`: the listed one if there is one, else a new
    /// device named `srdma_<addr>` (how 127.0.0.2, 127.0.0.3, … become devices).
    ///
    /// Fails with `EADDRNOTAVAIL` when `addr` is not an address of this machine (it cannot be
    /// bound) and `EINVAL` for the unspecified or a multicast address.
    pub fn from_addr(addr: IpAddr) -> Result<Device> {
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(Error::invalid(format!(
                "{addr} cannot be a device address (unspecified or multicast)"
            )));
        }
        let list = get_device_list()?;
        if let Some(d) = list.iter().find(|d| d.info.addr == addr) {
            return Ok(d.clone());
        }
        if std::net::UdpSocket::bind((addr, 0)).is_err() {
            return Err(Error::new(
                ErrorKind::AddrNotAvailable,
                format!("{addr} is not an address of this machine"),
            ));
        }
        // An address that binds but is not listed: a loopback alias (127.0.0.0/8) or an
        // address on an interface if_addrs did not report. Attribute it to the interface of
        // the same family whose network holds it, else to loopback.
        let (ifname, ifindex) = if addr.is_loopback() {
            list.iter()
                .find(|d| d.info.addr.is_loopback() && d.info.addr.is_ipv4() == addr.is_ipv4())
                .map(|d| (d.info.ifname.clone(), d.info.ifindex))
                .unwrap_or_else(|| ("lo".to_string(), 1))
        } else {
            ("lo".to_string(), 1)
        };
        Ok(Device::new(format!("srdma_{addr}"), addr, ifname, ifindex))
    }

    /// The listed device called `name` (`srdma0`, …) or, for a name of the form
    /// `srdma_<addr>`, the device of that address.
    ///
    /// Fails with `ENODEV` when there is no such device.
    pub fn by_name(name: &str) -> Result<Device> {
        if let Some(d) = get_device_list()?.into_iter().find(|d| d.name() == name) {
            return Ok(d);
        }
        if let Some(addr) = name.strip_prefix("srdma_").and_then(|a| a.parse().ok()) {
            return Device::from_addr(addr);
        }
        Err(Error::new(
            ErrorKind::NoDevice,
            format!("no device named {name:?}"),
        ))
    }

    /// The device's name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The node GUID (`ibv_get_device_guid`), as a number (rdma-core hands it out in network
    /// byte order; `to_be_bytes` gives those bytes).
    pub fn guid(&self) -> u64 {
        self.info.guid
    }

    /// The IP address the device speaks RoCEv2 on.
    pub fn addr(&self) -> IpAddr {
        self.info.addr
    }

    /// The name of the network interface that carries the address (`lo`, `eth0`, …).
    pub fn ifname(&self) -> &str {
        &self.info.ifname
    }

    /// The index of that network interface.
    pub fn ifindex(&self) -> u32 {
        self.info.ifindex
    }

    /// The MTU of that network interface, in bytes (1500 if it cannot be read).
    pub fn netdev_mtu(&self) -> u32 {
        self.info.netdev_mtu
    }

    /// The MTU the port offers (`active_mtu`): the largest IB MTU that fits the interface MTU
    /// once IP, UDP and the transport headers are taken off, as rxe computes it (1500 → 1024,
    /// loopback's 65536 → 4096).
    pub fn active_mtu(&self) -> Mtu {
        Mtu::port_active_mtu(self.info.netdev_mtu).unwrap_or(Mtu::Mtu256)
    }

    /// The GID of the port's only table entry: the IPv4-mapped or IPv6 address.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.info.addr)
    }

    /// The transport type (`ctx->device->transport_type`): always IB, as for every RoCE
    /// device.
    pub fn transport_type(&self) -> TransportType {
        TransportType::Ib
    }

    /// The node type: a channel adapter (`IBV_NODE_CA`).
    pub fn node_type(&self) -> NodeType {
        NodeType::Ca
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.info.name)
            .field("addr", &self.info.addr)
            .field("ifname", &self.info.ifname)
            .finish()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.info.addr == other.info.addr
    }
}

impl Eq for Device {}

/// `enum ibv_transport_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum TransportType {
    /// `IBV_TRANSPORT_IB` (InfiniBand and RoCE).
    Ib = 0,
    /// `IBV_TRANSPORT_IWARP`.
    Iwarp = 1,
}

/// `enum ibv_node_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum NodeType {
    /// `IBV_NODE_CA`: a channel adapter.
    Ca = 1,
}

bitflags::bitflags! {
    /// `enum ibv_device_cap_flags`: what the device can do.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct DeviceCapFlags: u32 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`.
        const RESIZE_MAX_WR = 1 << 0;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`.
        const BAD_PKEY_CNTR = 1 << 1;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`.
        const BAD_QKEY_CNTR = 1 << 2;
        /// `IBV_DEVICE_RAW_MULTI`.
        const RAW_MULTI = 1 << 3;
        /// `IBV_DEVICE_AUTO_PATH_MIG`.
        const AUTO_PATH_MIG = 1 << 4;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`.
        const CHANGE_PHY_PORT = 1 << 5;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`.
        const UD_AV_PORT_ENFORCE = 1 << 6;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`: modify_qp accepts the current state.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// `IBV_DEVICE_SHUTDOWN_PORT`.
        const SHUTDOWN_PORT = 1 << 8;
        /// `IBV_DEVICE_INIT_TYPE`.
        const INIT_TYPE = 1 << 9;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`.
        const SYS_IMAGE_GUID = 1 << 11;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`: the responder sends RNR NAKs.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// `IBV_DEVICE_SRQ_RESIZE`: modify_srq can change max_wr.
        const SRQ_RESIZE = 1 << 13;
        /// `IBV_DEVICE_N_NOTIFY_CQ`.
        const N_NOTIFY_CQ = 1 << 14;
        /// `IBV_DEVICE_MEM_WINDOW`: memory windows ([`crate::Pd::alloc_mw`]).
        const MEM_WINDOW = 1 << 17;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`: type 2 windows associated with a QP number only.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2 windows associated with a QP (reached and
        /// invalidated only through the QP that bound them), softrdma's kind.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
    }
}

/// `enum ibv_atomic_cap`: the atomicity guarantee of RDMA atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`.
    None = 0,
    /// `IBV_ATOMIC_HCA`: atomic with respect to all atomics of this device.
    Hca = 1,
    /// `IBV_ATOMIC_GLOB`: also atomic with respect to the CPU.
    Glob = 2,
}

/// `struct ibv_device_attr`: the device's limits (upper bounds a program can rely on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// IEEE vendor ID.
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs per device.
    pub max_qp: u32,
    /// Most outstanding work requests on a queue.
    pub max_qp_wr: u32,
    /// Capability flags.
    pub device_cap_flags: DeviceCapFlags,
    /// Most scatter/gather entries per send or receive work request.
    pub max_sge: u32,
    /// Most scatter/gather entries per RDMA READ work request.
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA READ/atomic requests a QP can be the target of.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READ/atomic requests a QP can initiate.
    pub max_qp_init_rd_atom: u32,
    /// Most responder resources for the whole device.
    pub max_res_rd_atom: u32,
    /// Atomicity of RDMA atomics.
    pub atomic_cap: AtomicCap,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most multicast groups.
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most QP attachments to multicast groups in total.
    pub max_total_mcast_qp_attach: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most outstanding work requests on an SRQ.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries per SRQ work request.
    pub max_srq_sge: u32,
    /// Number of P_Keys in the table.
    pub max_pkeys: u16,
    /// Local CA ACK delay (IBA time exponent).
    pub local_ca_ack_delay: u8,
    /// Number of ports.
    pub phys_port_cnt: u8,
    /// Most bytes of inline data in a send work request (softrdma extension of the table;
    /// rdma-core reports it through the QP caps).
    pub max_inline_data: u32,
    /// On-demand paging (`ibv_device_attr_ex.odp_caps`, the extended table's): which
    /// operations may use regions registered with ON_DEMAND ([`crate::Pd::reg_mr`]).
    pub odp_caps: OdpCaps,
}

bitflags::bitflags! {
    /// `enum ibv_odp_general_caps`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpGeneralCaps: u64 {
        /// `IBV_ODP_SUPPORT`: regions may be registered with ON_DEMAND.
        const SUPPORT = 1 << 0;
        /// `IBV_ODP_SUPPORT_IMPLICIT`: one region may cover the whole address space (a null
        /// address, length `SIZE_MAX`).
        const SUPPORT_IMPLICIT = 1 << 1;
    }

    /// `enum ibv_odp_transport_cap_bits`: the operations of one transport that may use
    /// on-demand regions.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpTransportCaps: u32 {
        /// `IBV_ODP_SUPPORT_SEND`.
        const SEND = 1 << 0;
        /// `IBV_ODP_SUPPORT_RECV`.
        const RECV = 1 << 1;
        /// `IBV_ODP_SUPPORT_WRITE`.
        const WRITE = 1 << 2;
        /// `IBV_ODP_SUPPORT_READ`.
        const READ = 1 << 3;
        /// `IBV_ODP_SUPPORT_ATOMIC`.
        const ATOMIC = 1 << 4;
        /// `IBV_ODP_SUPPORT_SRQ_RECV`.
        const SRQ_RECV = 1 << 5;
    }
}

/// `struct ibv_odp_caps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OdpCaps {
    /// What the device offers in general.
    pub general_caps: OdpGeneralCaps,
    /// RC's operations.
    pub rc_odp_caps: OdpTransportCaps,
    /// UC's operations.
    pub uc_odp_caps: OdpTransportCaps,
    /// UD's operations.
    pub ud_odp_caps: OdpTransportCaps,
}

/// The limits every softrdma device enforces.
pub(crate) fn device_attr(dev: &Device) -> DeviceAttr {
    DeviceAttr {
        fw_ver: concat!("softrdma ", env!("CARGO_PKG_VERSION")).to_string(),
        node_guid: dev.guid(),
        sys_image_guid: dev.guid(),
        max_mr_size: 1 << 40,
        page_size_cap: 0xffff_f000,
        vendor_id: 0,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: 1 << 16,
        max_qp_wr: 1 << 14,
        device_cap_flags: DeviceCapFlags::CURR_QP_STATE_MOD
            | DeviceCapFlags::SYS_IMAGE_GUID
            | DeviceCapFlags::RC_RNR_NAK_GEN
            | DeviceCapFlags::SRQ_RESIZE
            | DeviceCapFlags::PORT_ACTIVE_EVENT
            | DeviceCapFlags::MEM_WINDOW
            | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 1 << 14,
        // As ConnectX: libfabric's ofi_rxm sizes one CQ for every peer of its universe
        // (256 by default) times the queue depth, past 65,536.
        max_cqe: (1 << 22) - 1,
        max_mr: 1 << 18,
        max_pd: 1 << 16,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_res_rd_atom: 128 << 16,
        atomic_cap: AtomicCap::Hca,
        max_mw: 1 << 16,
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 56 * 8192,
        max_ah: 1 << 15,
        max_srq: 1 << 14,
        max_srq_wr: 1 << 14,
        max_srq_sge: 32,
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        max_inline_data: 1024,
        // Every access to registered memory goes through one check, which populates an
        // on-demand region's pages: every operation of every transport may use one (where
        // the kernel populates pages on request).
        odp_caps: if !crate::provider::memory::on_demand_supported() {
            OdpCaps::default()
        } else {
            OdpCaps {
                general_caps: OdpGeneralCaps::all(),
                rc_odp_caps: OdpTransportCaps::all(),
                uc_odp_caps: OdpTransportCaps::SEND
                    | OdpTransportCaps::RECV
                    | OdpTransportCaps::WRITE
                    | OdpTransportCaps::SRQ_RECV,
                ud_odp_caps: OdpTransportCaps::SEND
                    | OdpTransportCaps::RECV
                    | OdpTransportCaps::SRQ_RECV,
            }
        },
    }
}

/// `enum ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum PortState {
    /// `IBV_PORT_NOP`.
    Nop = 0,
    /// `IBV_PORT_DOWN`.
    Down = 1,
    /// `IBV_PORT_INIT`.
    Init = 2,
    /// `IBV_PORT_ARMED`.
    Armed = 3,
    /// `IBV_PORT_ACTIVE`.
    Active = 4,
    /// `IBV_PORT_ACTIVE_DEFER`.
    ActiveDefer = 5,
}

impl PortState {
    /// `ibv_port_state_str`.
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        }
    }
}

/// `IBV_LINK_LAYER_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_INFINIBAND`.
    Infiniband = 1,
    /// `IBV_LINK_LAYER_ETHERNET`: RoCE; programs address peers by GID, not LID.
    Ethernet = 2,
}

bitflags::bitflags! {
    /// `enum ibv_port_cap_flags` (the bits softrdma sets).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct PortCapFlags: u32 {
        /// `IBV_PORT_CM_SUP`: the port runs a connection manager.
        const CM_SUP = 1 << 16;
        /// `IBV_PORT_IP_BASED_GIDS`: the GID table holds IP addresses.
        const IP_BASED_GIDS = 1 << 26;
    }
}

/// `IBV_QPF_GRH_REQUIRED`: every address handle must carry a GRH (global route), as on any
/// RoCE port.
pub const QPF_GRH_REQUIRED: u8 = 1;

/// `struct ibv_port_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state (always ACTIVE).
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use on the port, from the interface MTU.
    pub active_mtu: Mtu,
    /// Length of the GID table.
    pub gid_tbl_len: u32,
    /// Capability flags.
    pub port_cap_flags: PortCapFlags,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// Length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// Base LID (0: RoCE has none).
    pub lid: u16,
    /// LID of the subnet manager (0).
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Number of virtual lanes.
    pub max_vl_num: u8,
    /// Subnet-manager service level.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active link width (`1` = 1X).
    pub active_width: u8,
    /// Active link speed code.
    pub active_speed: u8,
    /// Physical port state (`5` = LinkUp).
    pub phys_state: u8,
    /// Link layer: Ethernet.
    pub link_layer: LinkLayer,
    /// Port flags ([`QPF_GRH_REQUIRED`]).
    pub flags: u8,
}

pub(crate) fn port_attr(dev: &Device) -> PortAttr {
    PortAttr {
        state: PortState::Active,
        max_mtu: Mtu::Mtu4096,
        active_mtu: dev.active_mtu(),
        gid_tbl_len: GID_TABLE_LEN,
        port_cap_flags: PortCapFlags::CM_SUP | PortCapFlags::IP_BASED_GIDS,
        max_msg_sz: 1 << 31,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,
        active_speed: 32,
        phys_state: 5,
        link_layer: LinkLayer::Ethernet,
        flags: QPF_GRH_REQUIRED,
    }
}

/// Entries in every port's GID table: one, the device's address.
pub const GID_TABLE_LEN: u32 = 1;

/// The default (and only) P_Key.
pub use softrdma_wire::bth::DEFAULT_PKEY;

/// `struct ibv_gid_entry`: one GID table entry with its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the table.
    pub gid_index: u32,
    /// The port (1).
    pub port_num: u32,
    /// RoCEv2, always.
    pub gid_type: GidType,
    /// Interface index of the network device that carries the address.
    pub ndev_ifindex: u32,
}
