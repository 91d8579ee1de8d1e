//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: transport-independent address translation.
//!
//! As in librdmacm, the work is done by the system resolver (`getaddrinfo(3)`): the hints
//! are translated into socket hints (the QP type into a socket type, the port space into a
//! protocol, `RAI_PASSIVE`/`RAI_NUMERICHOST` into `AI_PASSIVE`/`AI_NUMERICHOST`), the first
//! answer is translated back, and the resolver's `EAI_*` codes are returned unchanged. On
//! RoCE there is no route or connection data to add (`ai_route` and `ai_connect` stay
//! empty), and the answer has one entry.

use super::PortSpace;
use crate::QpType;
use std::ffi::{CStr, CString};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `RAI_PASSIVE`: the result is for the passive (listening) side: a source address (the
/// wildcard address when no node is given) and no destination.
pub const RAI_PASSIVE: u32 = 0x1;
/// `RAI_NUMERICHOST`: the node must be a numeric address; names fail with `EAI_NONAME`
/// and no lookup is made.
pub const RAI_NUMERICHOST: u32 = 0x2;
/// `RAI_NOROUTE`: suppress route resolution (there is none to do on RoCE; accepted).
pub const RAI_NOROUTE: u32 = 0x4;
/// `RAI_FAMILY`: interpret the node in the family of `ai_family` (the family restricts the
/// lookup whether or not this flag is set, as in librdmacm; the flag only matters for
/// `AF_IB`, which softrdma does not support).
pub const RAI_FAMILY: u32 = 0x8;

/// librdmacm's `RAI_SA` (0x10): resolve through the InfiniBand SA.
const RAI_SA: u32 = 0x10;
/// librdmacm's `RAI_DNS` (0x20): resolve through DNS (the default, and the only way here).
const RAI_DNS: u32 = 0x20;
const KNOWN_FLAGS: u32 =
    RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY | RAI_SA | RAI_DNS;

/// glibc's `EAI_ADDRFAMILY` (-9): the host has no address in the requested family (the
/// `libc` crate does not define it for Linux).
pub const EAI_ADDRFAMILY: i32 = -9;

/// One entry of the list [`getaddrinfo`] returns (`struct rdma_addrinfo`);
/// `rdma_freeaddrinfo` is dropping it.
///
/// ```
/// use softrdma::rdma_cm::{getaddrinfo, AddrInfoHints, PortSpace, RAI_PASSIVE};
/// use softrdma::QpType;
/// let hints = AddrInfoHints { ai_flags: RAI_PASSIVE, ..Default::default() };
/// let res = getaddrinfo(Some("127.77.0.1"), Some("7471"), Some(&hints)).unwrap();
/// let ai = &res[0];
/// assert_eq!(ai.ai_src_addr, Some("127.77.0.1:7471".parse().unwrap()));
/// assert_eq!((ai.ai_qp_type, ai.ai_port_space), (QpType::Rc, PortSpace::Tcp));
/// assert_eq!(ai.ai_dst_addr, None); // passive
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrInfo {
    /// `RAI_PASSIVE` for a passive result, else 0 (or the hints' flags when only hints
    /// were given).
    pub ai_flags: u32,
    /// The address family: `libc::AF_INET` or `libc::AF_INET6` (0 when only hints without
    /// a family were given).
    pub ai_family: i32,
    /// The QP type: the hints' type, else the one the socket type implies (stream → RC,
    /// datagram → UD).
    pub ai_qp_type: QpType,
    /// The port space: the hints' port space, else the one the protocol implies (TCP →
    /// `RDMA_PS_TCP`, UDP → `RDMA_PS_UDP`).
    pub ai_port_space: PortSpace,
    /// The local address: for a passive result the resolved address, for an active one the
    /// hints' source address (if any).
    pub ai_src_addr: Option<SocketAddr>,
    /// The destination address (None for a passive result).
    pub ai_dst_addr: Option<SocketAddr>,
    /// The source's canonical name (librdmacm never asks the resolver for one: None).
    pub ai_src_canonname: Option<String>,
    /// The destination's canonical name (None, as above).
    pub ai_dst_canonname: Option<String>,
    /// Routing data (InfiniBand path records): empty on RoCE.
    pub ai_route: Vec<u8>,
    /// Connection data to send ahead of the private data: empty on RoCE.
    pub ai_connect: Vec<u8>,
}

/// The hints (the fields of `struct rdma_addrinfo` that `rdma_getaddrinfo` reads from its
/// `hints` argument). `Default` is "no preference".
///
/// ```
/// use softrdma::rdma_cm::{getaddrinfo, AddrInfoHints, PortSpace};
/// use softrdma::QpType;
/// // A UD endpoint: the UDP port space and a source address to report.
/// let hints = AddrInfoHints {
///     ai_qp_type: Some(QpType::Ud),
///     ai_port_space: Some(PortSpace::Udp),
///     ai_src_addr: Some("127.78.0.1:0".parse().unwrap()),
///     ..Default::default()
/// };
/// let ai = &getaddrinfo(Some("127.77.0.1"), Some("7174"), Some(&hints)).unwrap()[0];
/// assert_eq!(ai.ai_dst_addr, Some("127.77.0.1:7174".parse().unwrap()));
/// assert_eq!(ai.ai_src_addr, hints.ai_src_addr);
/// assert_eq!(ai.ai_qp_type, QpType::Ud);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrInfoHints {
    /// `RAI_*` flags.
    pub ai_flags: u32,
    /// 0 (`AF_UNSPEC`), `libc::AF_INET` or `libc::AF_INET6`.
    pub ai_family: i32,
    /// The QP type the caller will use (None: any, RC by default).
    pub ai_qp_type: Option<QpType>,
    /// The port space the caller will use (None: any, TCP by default).
    pub ai_port_space: Option<PortSpace>,
    /// A source address to report (active side), or to use when neither node nor service
    /// is given.
    pub ai_src_addr: Option<SocketAddr>,
    /// A destination to report when neither node nor service is given.
    pub ai_dst_addr: Option<SocketAddr>,
}

/// How [`getaddrinfo`] fails: an `EAI_*` code of the resolver (`rdma_getaddrinfo` returns
/// it), or -1 with an errno.
///
/// ```
/// use softrdma::rdma_cm::{getaddrinfo, AddrInfoHints, GaiError, RAI_NUMERICHOST};
/// let hints = AddrInfoHints { ai_flags: RAI_NUMERICHOST, ..Default::default() };
/// let e = getaddrinfo(Some("not-a-number"), None, Some(&hints)).unwrap_err();
/// assert_eq!(e, GaiError::Eai(libc::EAI_NONAME));
/// assert_eq!((e.code(), e.errno()), (libc::EAI_NONAME, None));
/// let e = getaddrinfo(None, None, None).unwrap_err(); // nothing to resolve
/// assert_eq!((e.code(), e.errno()), (-1, Some(libc::EINVAL)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaiError {
    /// An `EAI_*` code (`libc::EAI_NONAME`, `libc::EAI_SERVICE`, …, [`EAI_ADDRFAMILY`]) other
    /// than `EAI_SYSTEM`.
    Eai(i32),
    /// `EAI_SYSTEM`: a system error, with its errno.
    System(i32),
    /// `rdma_getaddrinfo` returned -1 and set errno to this value.
    Errno(i32),
}

impl GaiError {
    /// The value `rdma_getaddrinfo` returns: the `EAI_*` code, or -1 for errno failures.
    pub fn code(&self) -> i32 {
        match *self {
            GaiError::Eai(c) => c,
            GaiError::System(_) => libc::EAI_SYSTEM,
            GaiError::Errno(_) => -1,
        }
    }

    /// The errno that goes with the failure: for [`GaiError::Errno`] and
    /// [`GaiError::System`], None for the other `EAI_*` codes.
    pub fn errno(&self) -> Option<i32> {
        match *self {
            GaiError::Eai(_) => None,
            GaiError::System(e) | GaiError::Errno(e) => Some(e),
        }
    }
}

impl std::fmt::Display for GaiError {
    /// `gai_strerror(code)` for `EAI_*` codes, `strerror(errno)` otherwise.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            GaiError::Eai(c) => f.write_str(&gai_strerror(c)),
            GaiError::System(e) => write!(
                f,
                "{}: {}",
                gai_strerror(libc::EAI_SYSTEM),
                std::io::Error::from_raw_os_error(e)
            ),
            GaiError::Errno(e) => write!(f, "{}", std::io::Error::from_raw_os_error(e)),
        }
    }
}

impl std::error::Error for GaiError {}

fn gai_strerror(code: i32) -> String {
    // SAFETY: gai_strerror returns a pointer to a static, NUL-terminated string (or an
    // "Unknown error" string) for every code.
    let p = unsafe { libc::gai_strerror(code) };
    if p.is_null() {
        return format!("Unknown error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One answer of the system resolver, translated to Rust.
struct SysAnswer {
    passive: bool,
    family: i32,
    socktype: i32,
    protocol: i32,
    addr: SocketAddr,
}

fn sockaddr_to_std(sa: *const libc::sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the resolver gives a valid sockaddr of `len` bytes; the family field is
    // first in every sockaddr and the length is checked before the cast.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                let a = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let a = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    u32::from_be(a.sin6_flowinfo),
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Calls the system resolver with the socket hints librdmacm derives from `hints`, and
/// returns its first answer.
fn system_getaddrinfo(
    node: Option<&str>,
    service: Option<&str>,
    hints: Option<&AddrInfoHints>,
) -> Result<SysAnswer, GaiError> {
    let node = node
        .map(CString::new)
        .transpose()
        .map_err(|_| GaiError::Eai(libc::EAI_NONAME))?;
    let service = service
        .map(CString::new)
        .transpose()
        .map_err(|_| GaiError::Eai(libc::EAI_SERVICE))?;
    // SAFETY: addrinfo is plain data; all-zero is "no hints" for every field.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if let Some(h) = hints {
        if h.ai_flags & RAI_PASSIVE != 0 {
            ai.ai_flags |= libc::AI_PASSIVE;
        }
        if h.ai_flags & RAI_NUMERICHOST != 0 {
            ai.ai_flags |= libc::AI_NUMERICHOST;
        }
        ai.ai_family = h.ai_family;
        ai.ai_socktype = match h.ai_qp_type {
            Some(QpType::Rc | QpType::Uc | QpType::XrcSend | QpType::XrcRecv) => libc::SOCK_STREAM,
            Some(QpType::Ud) => libc::SOCK_DGRAM,
            Some(QpType::RawPacket) | None => 0,
        };
        ai.ai_protocol = match h.ai_port_space {
            Some(PortSpace::Tcp) => libc::IPPROTO_TCP,
            Some(PortSpace::Udp | PortSpace::Ipoib) => libc::IPPROTO_UDP,
            Some(PortSpace::Ib) => match ai.ai_socktype {
                libc::SOCK_STREAM => libc::IPPROTO_TCP,
                libc::SOCK_DGRAM => libc::IPPROTO_UDP,
                _ => 0,
            },
            None => 0,
        };
    }
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and outlive the call; `ai` is a valid hints
    // structure (null pointers, zero lengths); `res` receives a list we free below.
    let rc = unsafe {
        libc::getaddrinfo(
            node.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            service.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            if hints.is_some() {
                &ai
            } else {
                std::ptr::null()
            },
            &mut res,
        )
    };
    if rc != 0 {
        if rc == libc::EAI_SYSTEM {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(GaiError::System(e));
        }
        return Err(GaiError::Eai(rc));
    }
    // SAFETY: on success `res` is a non-empty list the resolver allocated.
    let out = unsafe {
        let first = &*res;
        let addr = sockaddr_to_std(first.ai_addr, first.ai_addrlen);
        let ans = addr.map(|addr| SysAnswer {
            passive: first.ai_flags & libc::AI_PASSIVE != 0,
            family: first.ai_family,
            socktype: first.ai_socktype,
            protocol: first.ai_protocol,
            addr,
        });
        libc::freeaddrinfo(res);
        ans
    };
    out.ok_or(GaiError::Eai(libc::EAI_FAMILY))
}

/// Resolves `node` and `service` into the addresses and parameters an RDMA connection needs
/// (`rdma_getaddrinfo`); `rdma_freeaddrinfo` is dropping the result.
///
/// * With `RAI_PASSIVE` the entry carries a source address to bind and listen on (the
///   wildcard address when `node` is None) and no destination; otherwise it carries the
///   destination, and the hints' source address if they give one.
/// * Names go through the system resolver (`/etc/hosts`, DNS): `localhost` works; with
///   `RAI_NUMERICHOST` only numeric addresses are accepted. `service` is a port number or a
///   service name the resolver knows (`/etc/services`).
/// * The hints' family restricts the answer (`AF_INET`, `AF_INET6`, or 0 for either).
/// * The QP type and port space come from the hints, or default to RC in the TCP port
///   space; UD goes with the UDP port space (and each implies the other when only one is
///   given).
/// * With neither `node` nor `service`, the entry is built from the hints alone (flags,
///   family, QP type, port space, source and destination addresses).
///
/// Fails, as librdmacm does, with:
/// * [`GaiError::Errno`]`(EINVAL)` (return value -1) when `node`, `service` and `hints` are
///   all None;
/// * `EAI_BADFLAGS` for flags outside `RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE |
///   RAI_FAMILY` and librdmacm's `RAI_SA` (0x10) / `RAI_DNS` (0x20) (librdmacm itself
///   ignores unknown bits); `RAI_SA` fails with errno `EOPNOTSUPP` (there is no InfiniBand
///   SA on RoCE);
/// * `EAI_FAMILY` for a family other than 0, `AF_INET` and `AF_INET6` (`AF_IB` included:
///   softrdma has no InfiniBand addresses);
/// * `EAI_NONAME` for an unknown name, or any name with `RAI_NUMERICHOST`;
/// * [`EAI_ADDRFAMILY`] or `EAI_NONAME` when the node has no address in the requested
///   family (glibc gives the first for numeric addresses);
/// * `EAI_SERVICE` for a service that is neither a number nor a known name;
/// * `EAI_SOCKTYPE` for an inconsistent QP type and port space (e.g. UD in the TCP port
///   space): the man page calls this `EAI_QPTYPE`, but rdma-core defines no such constant
///   and returns the resolver's `EAI_SOCKTYPE`;
/// * the resolver's other codes (`EAI_AGAIN`, `EAI_FAIL`, `EAI_MEMORY`, `EAI_SYSTEM`).
pub fn getaddrinfo(
    node: Option<&str>,
    service: Option<&str>,
    hints: Option<&AddrInfoHints>,
) -> Result<Vec<AddrInfo>, GaiError> {
    if node.is_none() && service.is_none() && hints.is_none() {
        return Err(GaiError::Errno(libc::EINVAL));
    }
    if let Some(h) = hints {
        if h.ai_flags & !KNOWN_FLAGS != 0 {
            return Err(GaiError::Eai(libc::EAI_BADFLAGS));
        }
        if h.ai_flags & RAI_SA != 0 {
            return Err(GaiError::Errno(libc::EOPNOTSUPP));
        }
        if !matches!(h.ai_family, 0 | libc::AF_INET | libc::AF_INET6) {
            return Err(GaiError::Eai(libc::EAI_FAMILY));
        }
    }

    let mut rai = if node.is_some() || service.is_some() {
        let ans = system_getaddrinfo(node, service, hints)?;
        let qp_type = hints
            .and_then(|h| h.ai_qp_type)
            .unwrap_or(match ans.socktype {
                libc::SOCK_DGRAM => QpType::Ud,
                _ => QpType::Rc,
            });
        let port_space = hints
            .and_then(|h| h.ai_port_space)
            .unwrap_or(match ans.protocol {
                libc::IPPROTO_UDP => PortSpace::Udp,
                _ => PortSpace::Tcp,
            });
        AddrInfo {
            ai_flags: if ans.passive { RAI_PASSIVE } else { 0 },
            ai_family: ans.family,
            ai_qp_type: qp_type,
            ai_port_space: port_space,
            ai_src_addr: ans.passive.then_some(ans.addr),
            ai_dst_addr: (!ans.passive).then_some(ans.addr),
            ai_src_canonname: None,
            ai_dst_canonname: None,
            ai_route: Vec::new(),
            ai_connect: Vec::new(),
        }
    } else {
        let h = hints.expect("checked above: hints are given");
        AddrInfo {
            ai_flags: h.ai_flags,
            ai_family: h.ai_family,
            ai_qp_type: h.ai_qp_type.unwrap_or(QpType::Rc),
            ai_port_space: h.ai_port_space.unwrap_or(PortSpace::Tcp),
            ai_src_addr: None,
            ai_dst_addr: h.ai_dst_addr,
            ai_src_canonname: None,
            ai_dst_canonname: None,
            ai_route: Vec::new(),
            ai_connect: Vec::new(),
        }
    };
    if rai.ai_src_addr.is_none() {
        rai.ai_src_addr = hints.and_then(|h| h.ai_src_addr);
    }
    Ok(vec![rai])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hints(flags: u32) -> AddrInfoHints {
        AddrInfoHints {
            ai_flags: flags,
            ..Default::default()
        }
    }

    #[test]
    fn rdma_getaddrinfo_needs_node_service_or_hints() {
        let e = getaddrinfo(None, None, None).unwrap_err();
        assert_eq!((e.code(), e.errno()), (-1, Some(libc::EINVAL)));
        // Hints alone are enough.
        assert_eq!(getaddrinfo(None, None, Some(&hints(0))).unwrap().len(), 1);
    }

    #[test]
    fn rdma_getaddrinfo_active_numeric_gives_the_destination_rc_tcp() {
        let r = getaddrinfo(Some("127.0.0.70"), Some("7174"), None).unwrap();
        assert_eq!(r.len(), 1);
        let a = &r[0];
        assert_eq!(a.ai_flags, 0);
        assert_eq!(a.ai_family, libc::AF_INET);
        assert_eq!(a.ai_qp_type, QpType::Rc);
        assert_eq!(a.ai_port_space, PortSpace::Tcp);
        assert_eq!(a.ai_dst_addr, Some("127.0.0.70:7174".parse().unwrap()));
        assert_eq!(a.ai_src_addr, None);
        assert!(a.ai_route.is_empty() && a.ai_connect.is_empty());
        assert_eq!(a.ai_dst_canonname, None);
    }

    #[test]
    fn rdma_getaddrinfo_active_reports_the_hints_source() {
        let h = AddrInfoHints {
            ai_src_addr: Some("127.0.0.71:0".parse().unwrap()),
            ..Default::default()
        };
        let a = &getaddrinfo(Some("127.0.0.70"), Some("7174"), Some(&h)).unwrap()[0];
        assert_eq!(a.ai_src_addr, h.ai_src_addr);
        assert_eq!(a.ai_dst_addr, Some("127.0.0.70:7174".parse().unwrap()));
    }

    #[test]
    fn rdma_getaddrinfo_passive_without_node_is_the_wildcard() {
        let h = AddrInfoHints {
            ai_flags: RAI_PASSIVE,
            ai_family: libc::AF_INET,
            ..Default::default()
        };
        let a = &getaddrinfo(None, Some("7174"), Some(&h)).unwrap()[0];
        assert_eq!(a.ai_flags & RAI_PASSIVE, RAI_PASSIVE);
        assert_eq!(a.ai_src_addr, Some("0.0.0.0:7174".parse().unwrap()));
        assert_eq!(a.ai_dst_addr, None);
        let h6 = AddrInfoHints {
            ai_family: libc::AF_INET6,
            ..h
        };
        let a = &getaddrinfo(None, Some("7174"), Some(&h6)).unwrap()[0];
        assert_eq!(a.ai_family, libc::AF_INET6);
        assert_eq!(a.ai_src_addr, Some("[::]:7174".parse().unwrap()));
    }

    #[test]
    fn rdma_getaddrinfo_passive_with_node_gives_the_source_only() {
        let h = AddrInfoHints {
            ai_flags: RAI_PASSIVE,
            // Ignored for a passive result: the resolved address wins.
            ai_src_addr: Some("127.0.0.9:1".parse().unwrap()),
            ..Default::default()
        };
        let a = &getaddrinfo(Some("127.0.0.70"), Some("9000"), Some(&h)).unwrap()[0];
        assert_eq!(a.ai_src_addr, Some("127.0.0.70:9000".parse().unwrap()));
        assert_eq!(a.ai_dst_addr, None);
    }

    #[test]
    fn rdma_getaddrinfo_resolves_localhost_and_numerichost_refuses_names() {
        let a = &getaddrinfo(Some("localhost"), Some("1"), None).unwrap()[0];
        assert!(a.ai_dst_addr.unwrap().ip().is_loopback());
        let e =
            getaddrinfo(Some("localhost"), Some("1"), Some(&hints(RAI_NUMERICHOST))).unwrap_err();
        assert_eq!(e.code(), libc::EAI_NONAME);
        assert_eq!(e.errno(), None);
        // Numeric addresses still pass.
        let a = &getaddrinfo(Some("::1"), Some("1"), Some(&hints(RAI_NUMERICHOST))).unwrap()[0];
        assert_eq!(a.ai_family, libc::AF_INET6);
        assert_eq!(a.ai_dst_addr, Some("[::1]:1".parse().unwrap()));
    }

    #[test]
    fn rdma_getaddrinfo_unknown_name_is_eai_noname_or_a_resolver_failure() {
        let e = getaddrinfo(Some("no-such-host.invalid"), Some("1"), None).unwrap_err();
        // Without DNS the resolver may also answer EAI_AGAIN / EAI_FAIL.
        assert!(
            [
                libc::EAI_NONAME,
                libc::EAI_AGAIN,
                libc::EAI_FAIL,
                libc::EAI_NODATA
            ]
            .contains(&e.code()),
            "{e:?}"
        );
    }

    #[test]
    fn rdma_getaddrinfo_family_restricts_the_answer() {
        for flags in [0, RAI_FAMILY] {
            let h = AddrInfoHints {
                ai_flags: flags,
                ai_family: libc::AF_INET6,
                ..Default::default()
            };
            let e = getaddrinfo(Some("127.0.0.1"), Some("1"), Some(&h)).unwrap_err();
            assert!(
                [EAI_ADDRFAMILY, libc::EAI_NONAME].contains(&e.code()),
                "{e:?}"
            );
            let h4 = AddrInfoHints {
                ai_family: libc::AF_INET,
                ..h
            };
            let a = &getaddrinfo(Some("127.0.0.1"), Some("1"), Some(&h4)).unwrap()[0];
            assert_eq!(a.ai_family, libc::AF_INET);
        }
    }

    #[test]
    fn rdma_getaddrinfo_bad_family_is_eai_family() {
        for fam in [libc::AF_UNIX, libc::AF_IB, 12345] {
            let h = AddrInfoHints {
                ai_family: fam,
                ..Default::default()
            };
            let e = getaddrinfo(Some("127.0.0.1"), Some("1"), Some(&h)).unwrap_err();
            assert_eq!(e.code(), libc::EAI_FAMILY, "family {fam}");
        }
    }

    #[test]
    fn rdma_getaddrinfo_bad_flags_are_eai_badflags_and_sa_is_unsupported() {
        let e = getaddrinfo(Some("127.0.0.1"), None, Some(&hints(0x100))).unwrap_err();
        assert_eq!(e.code(), libc::EAI_BADFLAGS);
        let e = getaddrinfo(None, Some("1"), Some(&hints(RAI_SA))).unwrap_err();
        assert_eq!((e.code(), e.errno()), (-1, Some(libc::EOPNOTSUPP)));
        // RAI_NOROUTE and RAI_DNS are accepted.
        getaddrinfo(Some("127.0.0.1"), None, Some(&hints(RAI_NOROUTE | RAI_DNS))).unwrap();
    }

    #[test]
    fn rdma_getaddrinfo_qp_type_and_port_space_go_together() {
        let q = |qp, ps| AddrInfoHints {
            ai_qp_type: qp,
            ai_port_space: ps,
            ..Default::default()
        };
        let one = |h: AddrInfoHints| getaddrinfo(Some("127.0.0.1"), Some("1"), Some(&h));
        let a = &one(q(Some(QpType::Ud), None)).unwrap()[0];
        assert_eq!(
            (a.ai_qp_type, a.ai_port_space),
            (QpType::Ud, PortSpace::Udp)
        );
        let a = &one(q(None, Some(PortSpace::Udp))).unwrap()[0];
        assert_eq!(
            (a.ai_qp_type, a.ai_port_space),
            (QpType::Ud, PortSpace::Udp)
        );
        let a = &one(q(None, Some(PortSpace::Tcp))).unwrap()[0];
        assert_eq!(
            (a.ai_qp_type, a.ai_port_space),
            (QpType::Rc, PortSpace::Tcp)
        );
        let a = &one(q(Some(QpType::Rc), Some(PortSpace::Ib))).unwrap()[0];
        assert_eq!((a.ai_qp_type, a.ai_port_space), (QpType::Rc, PortSpace::Ib));
        let a = &one(q(Some(QpType::Ud), Some(PortSpace::Ib))).unwrap()[0];
        assert_eq!((a.ai_qp_type, a.ai_port_space), (QpType::Ud, PortSpace::Ib));
        for (qp, ps) in [(QpType::Ud, PortSpace::Tcp), (QpType::Rc, PortSpace::Udp)] {
            let e = one(q(Some(qp), Some(ps))).unwrap_err();
            assert_eq!(e.code(), libc::EAI_SOCKTYPE, "{qp:?} in {ps:?}");
        }
    }

    #[test]
    fn rdma_getaddrinfo_service_is_a_number_or_a_known_name() {
        let a = &getaddrinfo(Some("127.0.0.1"), Some("65535"), None).unwrap()[0];
        assert_eq!(a.ai_dst_addr.unwrap().port(), 65535);
        let e = getaddrinfo(Some("127.0.0.1"), Some("no-such-service"), None).unwrap_err();
        assert_eq!(e.code(), libc::EAI_SERVICE);
        assert_eq!(
            getaddrinfo(Some("127.0.0.1"), Some("7\x0007"), None)
                .unwrap_err()
                .code(),
            libc::EAI_SERVICE
        );
    }

    #[test]
    fn rdma_getaddrinfo_hints_alone_build_the_entry() {
        let h = AddrInfoHints {
            ai_flags: RAI_NOROUTE,
            ai_family: libc::AF_INET,
            ai_qp_type: Some(QpType::Ud),
            ai_port_space: Some(PortSpace::Udp),
            ai_src_addr: Some("127.0.0.71:5".parse().unwrap()),
            ai_dst_addr: Some("127.0.0.70:6".parse().unwrap()),
        };
        let a = &getaddrinfo(None, None, Some(&h)).unwrap()[0];
        assert_eq!(a.ai_flags, RAI_NOROUTE);
        assert_eq!(a.ai_family, libc::AF_INET);
        assert_eq!(
            (a.ai_qp_type, a.ai_port_space),
            (QpType::Ud, PortSpace::Udp)
        );
        assert_eq!(a.ai_src_addr, h.ai_src_addr);
        assert_eq!(a.ai_dst_addr, h.ai_dst_addr);
    }

    #[test]
    fn rdma_getaddrinfo_errors_display_like_gai_strerror() {
        let e = GaiError::Eai(libc::EAI_NONAME);
        assert_eq!(e.to_string(), gai_strerror(libc::EAI_NONAME));
        assert!(!e.to_string().is_empty());
        let e = GaiError::Errno(libc::EINVAL);
        assert!(e.to_string().contains("Invalid argument"), "{e}");
        let e: Box<dyn std::error::Error> = Box::new(GaiError::System(libc::ENOMEM));
        assert!(e.to_string().contains("memory"), "{e}");
        assert_eq!(GaiError::System(libc::ENOMEM).code(), libc::EAI_SYSTEM);
    }
}
