//! InfiniBand path MTU (`enum ibv_mtu`) and its derivation from an Ethernet link MTU.
//!
//! On RoCEv2 every IB packet is carried in IP/UDP, so the IB MTU must leave room for those
//! headers inside the netdev MTU. Two overheads are in use on Linux (notes §2.8):
//!
//! * [`ROCE_PATH_MTU_OVERHEAD`] = 96 bytes: rdma_cm's `iboe_get_mtu` subtracts the sum of
//!   GRH(40), UDP(8), BTH(12), XRCETH(4), AtomicETH(28) and ICRC(4). This is the one used for
//!   the path MTU carried in a CM REQ and programmed into the QP ([`Mtu::for_link_mtu`]).
//! * [`RXE_PORT_MTU_OVERHEAD`] = 80 bytes: rxe's port `active_mtu` ([`Mtu::port_active_mtu`]).
//!
//! Both give 1024 for a 1500-byte link and 4096 for 9000 or 65536 (loopback).

use core::fmt;

/// Bytes rdma_cm subtracts from the netdev MTU before choosing the path MTU.
pub const ROCE_PATH_MTU_OVERHEAD: u32 = 96;

/// Bytes rxe subtracts from the netdev MTU for the port's active MTU.
pub const RXE_PORT_MTU_OVERHEAD: u32 = 80;

/// An InfiniBand MTU (`enum ibv_mtu`), with the ibverbs numeric values 1..=5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Mtu {
    /// `IBV_MTU_256` (1): 256 bytes.
    Mtu256 = 1,
    /// `IBV_MTU_512` (2): 512 bytes.
    Mtu512 = 2,
    /// `IBV_MTU_1024` (3): 1024 bytes.
    Mtu1024 = 3,
    /// `IBV_MTU_2048` (4): 2048 bytes.
    Mtu2048 = 4,
    /// `IBV_MTU_4096` (5): 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Converts an `ibv_mtu` value; `None` for anything outside 1..=5.
    pub const fn from_raw(raw: u32) -> Option<Mtu> {
        match raw {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The `ibv_mtu` numeric value. Never fails.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// The MTU in bytes (`128 << value`). Never fails.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU whose size is exactly `bytes`; `None` unless `bytes` is 256, 512, 1024, 2048 or
    /// 4096.
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The largest MTU not larger than `bytes`; `None` when `bytes < 256`.
    pub const fn floor_from_bytes(bytes: u32) -> Option<Mtu> {
        if bytes >= 4096 {
            Some(Mtu::Mtu4096)
        } else if bytes >= 2048 {
            Some(Mtu::Mtu2048)
        } else if bytes >= 1024 {
            Some(Mtu::Mtu1024)
        } else if bytes >= 512 {
            Some(Mtu::Mtu512)
        } else if bytes >= 256 {
            Some(Mtu::Mtu256)
        } else {
            None
        }
    }

    /// Path MTU for a RoCEv2 link whose netdev MTU is `netdev_mtu`, as rdma_cm derives it: the
    /// largest IB MTU `<= netdev_mtu − ROCE_PATH_MTU_OVERHEAD` (1500 → 1024, 9000 → 4096,
    /// 65536 → 4096). `None` when the link cannot carry even a 256-byte IB payload
    /// (`netdev_mtu < 352`).
    pub const fn for_link_mtu(netdev_mtu: u32) -> Option<Mtu> {
        Mtu::floor_from_bytes(netdev_mtu.saturating_sub(ROCE_PATH_MTU_OVERHEAD))
    }

    /// Port active MTU as rxe reports it: the largest IB MTU
    /// `<= netdev_mtu − RXE_PORT_MTU_OVERHEAD`. `None` when `netdev_mtu < 336`.
    pub const fn port_active_mtu(netdev_mtu: u32) -> Option<Mtu> {
        Mtu::floor_from_bytes(netdev_mtu.saturating_sub(RXE_PORT_MTU_OVERHEAD))
    }
}

impl fmt::Display for Mtu {
    /// Formats as the byte count, e.g. `1024`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}
