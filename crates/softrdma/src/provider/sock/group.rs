//! The device's multicast options and the sockets of multicast groups.

use super::{setopt, setopt_val, UdpSock, ROCE_PORT};
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

impl UdpSock {
    /// Makes the device socket able to send to IP multicast groups: out of the interface of
    /// the device address `local` (IPv4: `IP_MULTICAST_IF` with the address; IPv6:
    /// `IPV6_MULTICAST_IF` with `ifindex`), looped back to the groups' members on this host,
    /// and with a TTL / hop limit of 1.
    ///
    /// Fails with the `setsockopt` error (for IPv6, `ENODEV` or `EADDRNOTAVAIL` for a bad
    /// interface index).
    pub(crate) fn set_multicast_tx(&self, local: IpAddr, ifindex: u32) -> Result<()> {
        let raw = self.raw();
        match local {
            IpAddr::V4(a) => {
                let ifaddr = libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                };
                setopt_val(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &ifaddr)?;
                setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, 1)?;
                setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 1)?;
            }
            IpAddr::V6(_) => {
                let idx = ifindex as libc::c_int;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, idx)?;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP, 1)?;
                setopt(raw, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, 1)?;
            }
        }
        Ok(())
    }

    /// A socket that receives the RoCEv2 datagrams sent to the multicast group `group`: bound
    /// to `group:4791` with `SO_REUSEADDR` (every device of every process on this host that
    /// joins the group gets its own copy) and a member of the group on the interface of the
    /// device address `local` (IPv4: `IP_ADD_MEMBERSHIP` with that address; IPv6:
    /// `IPV6_ADD_MEMBERSHIP` with `ifindex`). It only receives groups it joined itself
    /// (`IP_MULTICAST_ALL` off).
    ///
    /// Fails with `EINVAL` when `group` is not multicast or not of the family of `local`, and
    /// with the error of `socket`, `bind` or `setsockopt` otherwise (say `ENOBUFS` past the
    /// kernel's `igmp_max_memberships`, `ENODEV` for an interface without multicast).
    pub(crate) fn bind_group(group: IpAddr, local: IpAddr, ifindex: u32) -> Result<UdpSock> {
        if !group.is_multicast() || group.is_ipv4() != local.is_ipv4() {
            return Err(Error::invalid(format!(
                "{group} is not a multicast group the device at {local} can join"
            )));
        }
        // The interface index scopes a link-local group (ff02::/16, ff12::/16); the kernel
        // ignores it for wider scopes.
        let at = match group {
            IpAddr::V6(g) => SocketAddr::V6(SocketAddrV6::new(g, ROCE_PORT, 0, ifindex)),
            IpAddr::V4(_) => SocketAddr::new(group, ROCE_PORT),
        };
        let sock = Self::bind_with(at, true, false)?;
        let raw = sock.raw();
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => {
                // Best effort: kernels before 2.6.31 lack the option and deliver every group.
                let _ = setopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0);
                setopt_val(raw, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq4(g, l))?;
            }
            (IpAddr::V6(g), _) => {
                let _ = setopt(raw, libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
                setopt_val(
                    raw,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_ADD_MEMBERSHIP,
                    &mreq6(g, ifindex),
                )?;
            }
            _ => unreachable!("families checked above"),
        }
        Ok(sock)
    }

    /// Leaves the group a [`UdpSock::bind_group`] socket joined (the socket then receives
    /// nothing more, even while it stays open).
    ///
    /// Fails with the `setsockopt` error (`EADDRNOTAVAIL` when it was not a member).
    pub(crate) fn leave_group(&self, group: IpAddr, local: IpAddr, ifindex: u32) -> Result<()> {
        let raw = self.raw();
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => setopt_val(
                raw,
                libc::IPPROTO_IP,
                libc::IP_DROP_MEMBERSHIP,
                &mreq4(g, l),
            ),
            (IpAddr::V6(g), _) => setopt_val(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_DROP_MEMBERSHIP,
                &mreq6(g, ifindex),
            ),
            _ => Err(Error::invalid(
                "group and device address of different families",
            )),
        }
    }
}

const IPV6_MULTICAST_ALL: libc::c_int = 29;

fn mreq4(group: Ipv4Addr, local: Ipv4Addr) -> libc::ip_mreq {
    libc::ip_mreq {
        imr_multiaddr: libc::in_addr {
            s_addr: u32::from_ne_bytes(group.octets()),
        },
        imr_interface: libc::in_addr {
            s_addr: u32::from_ne_bytes(local.octets()),
        },
    }
}

fn mreq6(group: Ipv6Addr, ifindex: u32) -> libc::ipv6_mreq {
    libc::ipv6_mreq {
        ipv6mr_multiaddr: libc::in6_addr {
            s6_addr: group.octets(),
        },
        ipv6mr_interface: ifindex as _,
    }
}
