//! `struct sockaddr` ⇄ [`SocketAddr`].

use crate::abi::rdma_sockaddr;
use libc::{c_int, sockaddr, sockaddr_in, sockaddr_in6, socklen_t, AF_INET, AF_INET6};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Errors of the Rust library as errno values (the whole librdmacm side uses it).
pub(crate) type Res<T = ()> = Result<T, i32>;

/// Reads a C socket address (IPv4 or IPv6).
///
/// Fails with `EINVAL` for NULL or another family (`AF_IB` included: softrdma has no
/// InfiniBand addresses), as librdmacm does for an address whose length it cannot tell.
///
/// # Safety
/// `sa` is NULL or points to a socket address as long as its family says.
pub unsafe fn from_c(sa: *const sockaddr) -> Result<SocketAddr, i32> {
    if sa.is_null() {
        return Err(libc::EINVAL);
    }
    match c_int::from((*sa).sa_family) {
        AF_INET => {
            let s = &*(sa as *const sockaddr_in);
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        AF_INET6 => {
            let s = &*(sa as *const sockaddr_in6);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => Err(libc::EINVAL),
    }
}

/// The C form of `a` in a `struct sockaddr_storage`-sized union, with its length.
pub fn to_c(a: &SocketAddr) -> (rdma_sockaddr, socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut u: rdma_sockaddr = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            u.sin = sockaddr_in {
                sin_family: AF_INET as u16,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            (u, std::mem::size_of::<sockaddr_in>() as socklen_t)
        }
        SocketAddr::V6(v6) => {
            u.sin6 = sockaddr_in6 {
                sin6_family: AF_INET6 as u16,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            (u, std::mem::size_of::<sockaddr_in6>() as socklen_t)
        }
    }
}

/// `a`, or all zeroes for `None` (what librdmacm shows for an unknown address).
pub fn to_c_or_zero(a: Option<SocketAddr>) -> rdma_sockaddr {
    match a {
        Some(a) => to_c(&a).0,
        // SAFETY: all-zero is a valid sockaddr_storage.
        None => unsafe { std::mem::zeroed() },
    }
}
