//! The rest of ibverbs.map: string helpers, rate conversions, fork control, sysfs access,
//! and the calls softrdma does not offer (kernel-structure copies, imports, ECE), which
//! fail as rdma-core does on a device without them.

use crate::abi::*;
use crate::cstr;
use crate::ffi::set_errno;
use libc::{c_char, c_int, c_void, size_t, EOPNOTSUPP};

/// `ibv_wc_status_str`: the text of a completion status ("unknown" for others).
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    match status {
        0 => cstr!("success"),
        1 => cstr!("local length error"),
        2 => cstr!("local QP operation error"),
        3 => cstr!("local EE context operation error"),
        4 => cstr!("local protection error"),
        5 => cstr!("Work Request Flushed Error"),
        6 => cstr!("memory management operation error"),
        7 => cstr!("bad response error"),
        8 => cstr!("local access error"),
        9 => cstr!("remote invalid request error"),
        10 => cstr!("remote access error"),
        11 => cstr!("remote operation error"),
        12 => cstr!("transport retry counter exceeded"),
        13 => cstr!("RNR retry counter exceeded"),
        14 => cstr!("local RDD violation error"),
        15 => cstr!("remote invalid RD request"),
        16 => cstr!("aborted error"),
        17 => cstr!("invalid EE context number"),
        18 => cstr!("invalid EE context state"),
        19 => cstr!("fatal error"),
        20 => cstr!("response timeout error"),
        21 => cstr!("general error"),
        22 => cstr!("TM error"),
        23 => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_event_type_str`: the text of an asynchronous event type ("unknown" for others).
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
    match event {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_node_type_str`: the text of a node type ("unknown" for others).
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    match node_type {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

/// `ibv_port_state_str`: the text of a port state ("unknown" for others).
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: u32) -> *const c_char {
    match port_state {
        0 => cstr!("PORT_NOP"),
        1 => cstr!("PORT_DOWN"),
        2 => cstr!("PORT_INIT"),
        3 => cstr!("PORT_ARMED"),
        4 => cstr!("PORT_ACTIVE"),
        5 => cstr!("PORT_ACTIVE_DEFER"),
        _ => cstr!("unknown"),
    }
}

/// `enum ibv_rate` values with their multiple of 2.5 Gb/s (0 when not a multiple) and
/// Mb/s.
const RATES: &[(c_int, c_int, c_int)] = &[
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 0, 14062),
    (12, 0, 56250),
    (13, 0, 112500),
    (14, 0, 168750),
    (15, 0, 25781),
    (16, 0, 103125),
    (17, 0, 206250),
    (18, 0, 309375),
    (19, 0, 28125),
    (20, 0, 53125),
    (21, 0, 425000),
    (22, 0, 637500),
    (23, 0, 850000),
    (24, 0, 1275000),
];

/// `ibv_rate_to_mult@IBVERBS_1.0`: the rate as a multiple of 2.5 Gb/s, -1 for others.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.1 != 0)
        .map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate@IBVERBS_1.0`: the rate of a multiple of 2.5 Gb/s, `IBV_RATE_MAX` (0)
/// for others.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && r.1 != 0)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s, -1 for others.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: the rate of a speed in Mb/s, `IBV_RATE_MAX` (0) for others.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// `ibv_fork_init`: 0 (softrdma's memory regions stay valid across fork in the parent).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2).
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range`: 0 (nothing to do).
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(base: *mut c_void, size: size_t) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_dofork_range`: 0 (nothing to do).
#[no_mangle]
pub extern "C" fn ibv_dofork_range(base: *mut c_void, size: size_t) -> c_int {
    let _ = (base, size);
    0
}

/// `ibv_read_sysfs_file@IBVERBS_1.0` (private; ibv_devinfo uses it): reads `dir/file` into
/// `buf` (NUL-terminated, trailing newline dropped) and returns its length, or -1 with
/// errno (softrdma devices have no sysfs directory, so their files give ENOENT).
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> c_int {
    crate::ffi::guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: C strings from the caller.
        let (d, f) = unsafe {
            (
                std::ffi::CStr::from_ptr(dir).to_string_lossy().into_owned(),
                std::ffi::CStr::from_ptr(file)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        match std::fs::read(format!("{d}/{f}")) {
            Ok(mut data) => {
                data.truncate(size - 1);
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                // SAFETY: buf has size bytes; data.len() < size.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
                    *buf.add(data.len()) = 0;
                }
                data.len() as c_int
            }
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                -1
            }
        }
    })
}

/// `ibv_get_sysfs_path@IBVERBS_1.0` (private): -1 with ENOSYS (softrdma uses no sysfs).
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    set_errno(libc::ENOSYS);
    std::ptr::null()
}

/// `ibv_copy_qp_attr_from_kern@IBVERBS_1.0` (provider ABI): nothing to copy on softrdma;
/// leaves `dst` untouched and sets ENOSYS.
#[no_mangle]
pub extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
    set_errno(libc::ENOSYS);
}

/// `ibv_copy_ah_attr_from_kern@IBVERBS_1.1` (provider ABI): as `ibv_copy_qp_attr_from_kern`.
#[no_mangle]
pub extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
    set_errno(libc::ENOSYS);
}

/// `ibv_copy_path_rec_from_kern@IBVERBS_1.0` (provider ABI): as above.
#[no_mangle]
pub extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
    set_errno(libc::ENOSYS);
}

/// `ibv_copy_path_rec_to_kern@IBVERBS_1.0` (provider ABI): as above.
#[no_mangle]
pub extern "C" fn ibv_copy_path_rec_to_kern(dst: *mut c_void, src: *mut c_void) {
    let _ = (dst, src);
    set_errno(libc::ENOSYS);
}

/// `ibv_resolve_eth_l2_from_gid`: EOPNOTSUPP (softrdma speaks UDP, no Ethernet header).
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    let _ = (context, attr, eth_mac, vid);
    set_errno(EOPNOTSUPP);
    EOPNOTSUPP
}

/// `ibv_import_device@IBVERBS_1.10`: NULL with EOPNOTSUPP (no kernel command fd to share).
#[no_mangle]
pub extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let _ = cmd_fd;
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_pd`: NULL with EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    let _ = (context, pd_handle);
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_mr`: NULL with EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    let _ = (pd, mr_handle);
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_dm`: NULL with EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn ibv_import_dm(context: *mut ibv_context, dm_handle: u32) -> *mut c_void {
    let _ = (context, dm_handle);
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_unimport_pd`: nothing was imported; does nothing.
#[no_mangle]
pub extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    let _ = pd;
}

/// `ibv_unimport_mr`: nothing was imported; does nothing.
#[no_mangle]
pub extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    let _ = mr;
}

/// `ibv_unimport_dm`: nothing was imported; does nothing.
#[no_mangle]
pub extern "C" fn ibv_unimport_dm(dm: *mut c_void) {
    let _ = dm;
}

/// `ibv_query_ece`: EOPNOTSUPP (no enhanced connection establishment).
#[no_mangle]
pub extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    let _ = (qp, ece);
    EOPNOTSUPP
}

/// `ibv_set_ece`: EOPNOTSUPP (no enhanced connection establishment).
#[no_mangle]
pub extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    let _ = (qp, ece);
    EOPNOTSUPP
}
