//! GIDs: 128-bit port addresses. On RoCEv2 a GID is an IP address: an IPv6 address as is, an
//! IPv4 address in its IPv4-mapped form `::ffff:a.b.c.d` ([`ipv6_mapped`]). Also the other
//! identifiers of a device: its node GUID ([`guid_for`]) and random numbers ([`random_u32`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `union ibv_gid`: 16 bytes in network order.
///
/// ```
/// use softrdma::Gid;
/// use std::net::IpAddr;
/// let g = Gid::from_ip("192.0.2.1".parse().unwrap());
/// assert_eq!(g.to_string(), "::ffff:192.0.2.1");
/// assert_eq!(g.to_ip(), "192.0.2.1".parse::<IpAddr>().unwrap());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid {
    /// The raw bytes (`gid.raw`).
    pub raw: [u8; 16],
}

impl Gid {
    /// The all-zero GID (an empty table entry).
    pub const ZERO: Gid = Gid { raw: [0; 16] };

    /// The GID that stands for `ip` (IPv4-mapped for IPv4).
    pub fn from_ip(ip: IpAddr) -> Gid {
        Gid {
            raw: ipv6_mapped(ip).octets(),
        }
    }

    /// The IP address the GID stands for: IPv4 for an IPv4-mapped GID, IPv6 otherwise.
    #[inline]
    pub fn to_ip(&self) -> IpAddr {
        // (Read as two words: this runs for every packet and record a QP sends; through
        // `Ipv6Addr::to_ipv4_mapped` it took some 40 instructions.)
        let r = &self.raw;
        let hi = u64::from_ne_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]);
        if hi == 0 && r[8..12] == [0, 0, 0xff, 0xff] {
            IpAddr::V4(Ipv4Addr::new(r[12], r[13], r[14], r[15]))
        } else {
            IpAddr::V6(Ipv6Addr::from(*r))
        }
    }

    /// The subnet prefix (`gid.global.subnet_prefix`), the first 8 bytes as a number.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.raw[..8].try_into().expect("8 bytes"))
    }

    /// The interface ID (`gid.global.interface_id`), the last 8 bytes as a number.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.raw[8..].try_into().expect("8 bytes"))
    }

    /// Whether this is a multicast GID: an IPv6 multicast address (`ff00::/8`) or the
    /// IPv4-mapped form of an IPv4 multicast address (224.0.0.0/4), as rdma_cm uses on RoCE.
    pub fn is_multicast(&self) -> bool {
        self.to_ip().is_multicast()
    }

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.raw == [0; 16]
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Gid {
        Gid { raw }
    }
}

impl fmt::Display for Gid {
    /// The IPv6 text form, as `ibv_devinfo -v` prints GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.raw).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// `enum ibv_gid_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum GidType {
    /// `IBV_GID_TYPE_IB`.
    Ib = 0,
    /// `IBV_GID_TYPE_ROCE_V1`.
    RoceV1 = 1,
    /// `IBV_GID_TYPE_ROCE_V2`: every softrdma GID.
    RoceV2 = 2,
}

/// `ip` as an IPv6 address: IPv4 addresses in their IPv4-mapped form `::ffff:a.b.c.d` (how a
/// GID, an IPv6 pseudo-header or a GRH carries them).
pub(crate) fn ipv6_mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// A node GUID derived from the address, so that a device keeps its GUID across runs:
/// `02:53:52` ("SR", locally administered) then 40 bits of an FNV-1a hash of the address.
pub(crate) fn guid_for(addr: &IpAddr) -> u64 {
    let bytes = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0x02_5352u64 << 40) | (h & 0xff_ffff_ffff)
}

/// A random u32 from the operating system's CSPRNG.
pub(crate) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // The OS generator only fails if the kernel has no entropy source at all, which Linux
    // 3.17+ never reports after boot; fall back on the hasher's per-process random keys.
    if getrandom::fill(&mut b).is_err() {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(
            std::time::UNIX_EPOCH
                .elapsed()
                .map_or(0, |d| d.as_nanos() as u64),
        );
        return h.finish() as u32;
    }
    u32::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_forms() {
        assert!(Gid::from_ip("239.1.2.3".parse().unwrap()).is_multicast());
        assert!(Gid::from_ip("ff0e::1".parse().unwrap()).is_multicast());
        assert!(!Gid::from_ip("10.0.0.1".parse().unwrap()).is_multicast());
        let g = Gid::from_ip("fe80::1".parse().unwrap());
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g.interface_id(), 1);
    }

    #[test]
    fn to_ip_gives_ipv4_for_mapped_gids_only_as_the_standard_library_does() {
        let mut cases: Vec<[u8; 16]> = [
            "192.0.2.1",
            "0.0.0.0",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff",
            "::ffff:0:0:1",
            "::1:ffff:c000:201",
            "64:ff9b::c000:201",
            "fe80::ffff:c000:201",
            "fe80::1",
        ]
        .iter()
        .map(|a| ipv6_mapped(a.parse().unwrap()).octets())
        .collect();
        // Every single byte changed in a mapped GID.
        let mapped = ipv6_mapped("10.1.2.3".parse().unwrap()).octets();
        for i in 0..16 {
            let mut g = mapped;
            g[i] ^= 0x40;
            cases.push(g);
        }
        for raw in cases {
            let v6 = Ipv6Addr::from(raw);
            let want = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            assert_eq!(Gid { raw }.to_ip(), want, "{v6}");
        }
    }
}
