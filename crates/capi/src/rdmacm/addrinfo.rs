//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`, and reading a C `struct rdma_addrinfo`.

use super::sa::{from_c as sa_from_c, to_c as sa_to_c};
use super::Res;
use crate::abi::*;
use crate::ffi::{guard, set_errno};
use libc::{c_char, c_int, c_void, sockaddr};
use softrdma::rdma_cm::{getaddrinfo, AddrInfo, AddrInfoHints, PortSpace};
use softrdma::QpType;
use std::ffi::{CStr, CString};

fn qp_type_opt(t: c_int) -> Option<QpType> {
    QpType::ALL.iter().copied().find(|q| *q as c_int == t)
}

fn ps_opt(p: c_int) -> Option<PortSpace> {
    u16::try_from(p).ok().and_then(PortSpace::from_u16)
}

unsafe fn opt_addr(sa: *const sockaddr) -> Res<Option<std::net::SocketAddr>> {
    if sa.is_null() {
        Ok(None)
    } else {
        sa_from_c(sa).map(Some)
    }
}

unsafe fn bytes(p: *const c_void, len: usize) -> Vec<u8> {
    if p.is_null() || len == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts(p as *const u8, len).to_vec()
    }
}

unsafe fn string(p: *const c_char) -> Option<String> {
    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
}

/// Reads a C `rdma_addrinfo` (one entry), filling a missing QP type or port space from the
/// other (UD ⇄ UDP, else RC ⇄ TCP).
///
/// Fails with `EINVAL` for an address of an unsupported family.
pub(crate) unsafe fn from_c(r: &rdma_addrinfo) -> Res<AddrInfo> {
    let qpt = qp_type_opt(r.ai_qp_type);
    let ps = ps_opt(r.ai_port_space);
    let (qpt, ps) = match (qpt, ps) {
        (Some(t), Some(p)) => (t, p),
        (Some(QpType::Ud), None) => (QpType::Ud, PortSpace::Udp),
        (Some(t), None) => (t, PortSpace::Tcp),
        (None, Some(p @ (PortSpace::Udp | PortSpace::Ipoib))) => (QpType::Ud, p),
        (None, Some(p)) => (QpType::Rc, p),
        (None, None) => (QpType::Rc, PortSpace::Tcp),
    };
    Ok(AddrInfo {
        ai_flags: r.ai_flags as u32,
        ai_family: r.ai_family,
        ai_qp_type: qpt,
        ai_port_space: ps,
        ai_src_addr: opt_addr(r.ai_src_addr)?,
        ai_dst_addr: opt_addr(r.ai_dst_addr)?,
        ai_src_canonname: string(r.ai_src_canonname),
        ai_dst_canonname: string(r.ai_dst_canonname),
        ai_route: bytes(r.ai_route, r.ai_route_len),
        ai_connect: bytes(r.ai_connect, r.ai_connect_len),
    })
}

/// One entry of a list `rdma_getaddrinfo` returns, with the storage its pointers use.
#[repr(C)]
struct CAddrInfo {
    hdr: rdma_addrinfo,
    src: rdma_sockaddr,
    dst: rdma_sockaddr,
    route: Vec<u8>,
    connect: Vec<u8>,
    src_canon: Option<CString>,
    dst_canon: Option<CString>,
}

fn to_c(a: &AddrInfo, next: *mut rdma_addrinfo) -> *mut rdma_addrinfo {
    // SAFETY: all-zero is a valid rdma_addrinfo and rdma_sockaddr.
    let mut b: Box<CAddrInfo> = Box::new(CAddrInfo {
        hdr: unsafe { std::mem::zeroed() },
        src: unsafe { std::mem::zeroed() },
        dst: unsafe { std::mem::zeroed() },
        route: a.ai_route.clone(),
        connect: a.ai_connect.clone(),
        src_canon: a
            .ai_src_canonname
            .as_deref()
            .and_then(|s| CString::new(s).ok()),
        dst_canon: a
            .ai_dst_canonname
            .as_deref()
            .and_then(|s| CString::new(s).ok()),
    });
    b.hdr.ai_flags = a.ai_flags as c_int;
    b.hdr.ai_family = a.ai_family;
    b.hdr.ai_qp_type = a.ai_qp_type as c_int;
    b.hdr.ai_port_space = c_int::from(a.ai_port_space.to_u16());
    if let Some(s) = &a.ai_src_addr {
        let (u, len) = sa_to_c(s);
        b.src = u;
        b.hdr.ai_src_len = len;
        b.hdr.ai_src_addr = &mut b.src as *mut rdma_sockaddr as *mut sockaddr;
    }
    if let Some(d) = &a.ai_dst_addr {
        let (u, len) = sa_to_c(d);
        b.dst = u;
        b.hdr.ai_dst_len = len;
        b.hdr.ai_dst_addr = &mut b.dst as *mut rdma_sockaddr as *mut sockaddr;
    }
    if !b.route.is_empty() {
        b.hdr.ai_route_len = b.route.len();
        b.hdr.ai_route = b.route.as_mut_ptr() as *mut c_void;
    }
    if !b.connect.is_empty() {
        b.hdr.ai_connect_len = b.connect.len();
        b.hdr.ai_connect = b.connect.as_mut_ptr() as *mut c_void;
    }
    b.hdr.ai_src_canonname = b
        .src_canon
        .as_ref()
        .map_or(std::ptr::null_mut(), |s| s.as_ptr() as *mut c_char);
    b.hdr.ai_dst_canonname = b
        .dst_canon
        .as_ref()
        .map_or(std::ptr::null_mut(), |s| s.as_ptr() as *mut c_char);
    b.hdr.ai_next = next;
    Box::into_raw(b) as *mut rdma_addrinfo
}

/// `rdma_getaddrinfo`: resolves `node`/`service` into an `rdma_addrinfo` list.
///
/// Returns 0, an `EAI_*` code, or -1 with errno (`EINVAL` when nothing is given or `res` is
/// NULL, `EOPNOTSUPP` for `RAI_SA`); `EAI_SYSTEM` sets errno too.
#[export_name = "softrdma_rdma_getaddrinfo"]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let node = string(node);
        let service = string(service);
        let h = if hints.is_null() {
            None
        } else {
            let h = &*hints;
            let src = match opt_addr(h.ai_src_addr) {
                Ok(a) => a,
                Err(e) => {
                    set_errno(e);
                    return -1;
                }
            };
            let dst = match opt_addr(h.ai_dst_addr) {
                Ok(a) => a,
                Err(e) => {
                    set_errno(e);
                    return -1;
                }
            };
            Some(AddrInfoHints {
                ai_flags: h.ai_flags as u32,
                ai_family: h.ai_family,
                ai_qp_type: qp_type_opt(h.ai_qp_type),
                ai_port_space: ps_opt(h.ai_port_space),
                ai_src_addr: src,
                ai_dst_addr: dst,
            })
        };
        match getaddrinfo(node.as_deref(), service.as_deref(), h.as_ref()) {
            Ok(list) => {
                let mut next = std::ptr::null_mut();
                for a in list.iter().rev() {
                    next = to_c(a, next);
                }
                *res = next;
                0
            }
            Err(e) => {
                if let Some(errno) = e.errno() {
                    set_errno(errno);
                }
                e.code()
            }
        }
    })
}

/// `rdma_freeaddrinfo`: frees a list `rdma_getaddrinfo` returned.
#[export_name = "softrdma_rdma_freeaddrinfo"]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            let b = Box::from_raw(p as *mut CAddrInfo);
            p = b.hdr.ai_next;
        }
    })
}
