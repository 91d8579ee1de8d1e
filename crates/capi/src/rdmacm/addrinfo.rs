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

/// A `malloc`ed copy of `len` bytes at `src` (NULL for none or when out of memory).
unsafe fn c_copy(src: *const u8, len: usize) -> *mut c_void {
    if len == 0 {
        return std::ptr::null_mut();
    }
    let p = libc::malloc(len);
    if !p.is_null() {
        std::ptr::copy_nonoverlapping(src, p.cast::<u8>(), len);
    }
    p
}

/// A `malloc`ed copy of `s` as a C string (NULL for none, an interior NUL or no memory).
unsafe fn c_string(s: Option<&str>) -> *mut c_char {
    match s.and_then(|s| CString::new(s).ok()) {
        Some(c) => c_copy(c.as_ptr().cast(), c.as_bytes_with_nul().len()).cast(),
        None => std::ptr::null_mut(),
    }
}

/// One C entry for `a`, allocated as librdmacm does: the entry and each buffer it points
/// to come from `malloc` separately, so that programs may `free` and replace a field (the
/// verbs provider of libfabric swaps `ai_src_addr`/`ai_dst_addr`) and `rdma_freeaddrinfo`
/// frees what the fields hold then. NULL when out of memory.
unsafe fn to_c(a: &AddrInfo, next: *mut rdma_addrinfo) -> *mut rdma_addrinfo {
    let r = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
    if r.is_null() {
        return r;
    }
    let h = &mut *r;
    h.ai_next = next;
    h.ai_flags = a.ai_flags as c_int;
    h.ai_family = a.ai_family;
    h.ai_qp_type = a.ai_qp_type as c_int;
    h.ai_port_space = c_int::from(a.ai_port_space.to_u16());
    let mut ok = true;
    if let Some(s) = &a.ai_src_addr {
        let (u, len) = sa_to_c(s);
        h.ai_src_addr = c_copy((&u as *const rdma_sockaddr).cast(), len as usize).cast();
        h.ai_src_len = len;
        ok &= !h.ai_src_addr.is_null();
    }
    if let Some(d) = &a.ai_dst_addr {
        let (u, len) = sa_to_c(d);
        h.ai_dst_addr = c_copy((&u as *const rdma_sockaddr).cast(), len as usize).cast();
        h.ai_dst_len = len;
        ok &= !h.ai_dst_addr.is_null();
    }
    if !a.ai_route.is_empty() {
        h.ai_route = c_copy(a.ai_route.as_ptr(), a.ai_route.len());
        h.ai_route_len = a.ai_route.len();
        ok &= !h.ai_route.is_null();
    }
    if !a.ai_connect.is_empty() {
        h.ai_connect = c_copy(a.ai_connect.as_ptr(), a.ai_connect.len());
        h.ai_connect_len = a.ai_connect.len();
        ok &= !h.ai_connect.is_null();
    }
    h.ai_src_canonname = c_string(a.ai_src_canonname.as_deref());
    h.ai_dst_canonname = c_string(a.ai_dst_canonname.as_deref());
    if !ok {
        h.ai_next = std::ptr::null_mut();
        free_list(r);
        return std::ptr::null_mut();
    }
    r
}

/// Frees a C list: each entry and every buffer its fields point to at this moment.
unsafe fn free_list(mut p: *mut rdma_addrinfo) {
    while !p.is_null() {
        let h = &*p;
        let next = h.ai_next;
        for f in [
            h.ai_src_addr.cast::<c_void>(),
            h.ai_dst_addr.cast(),
            h.ai_src_canonname.cast(),
            h.ai_dst_canonname.cast(),
            h.ai_route,
            h.ai_connect,
        ] {
            libc::free(f);
        }
        libc::free(p.cast());
        p = next;
    }
}

/// `rdma_getaddrinfo`: resolves `node`/`service` into an `rdma_addrinfo` list.
///
/// Returns 0, an `EAI_*` code, or -1 with errno (`EINVAL` when nothing is given or `res` is
/// NULL, `EOPNOTSUPP` for `RAI_SA`, `ENOMEM`); `EAI_SYSTEM` sets errno too.
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
                    let e = to_c(a, next);
                    if e.is_null() {
                        free_list(next);
                        set_errno(libc::ENOMEM);
                        return -1;
                    }
                    next = e;
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

/// `rdma_freeaddrinfo`: frees a list `rdma_getaddrinfo` returned, with `free` on each
/// entry and on the buffers its fields point to (which the program may have replaced with
/// `malloc`ed ones, as with librdmacm).
#[export_name = "softrdma_rdma_freeaddrinfo"]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || free_list(res))
}
