//! Devices and contexts: the device list (with `SOFTRDMA_DEVICES`), names and GUIDs,
//! `ibv_open_device`/`ibv_close_device`, and the queries of device, port, GID and P_Key.

use super::objects::{self, device_of};
use crate::abi::*;
use crate::ffi::{guard, ret_ptr, set_errno};
use libc::{c_char, c_int, EINVAL};
use std::sync::Arc;

/// The devices `SOFTRDMA_DEVICES` asks for, as (name, address): its comma-separated entries
/// are `IP` (the device `srdma_<ip>`) or `NAME=IP` (the address listed under `NAME`, so two
/// processes on one host can each have a device of the same name, as programs that send
/// their device name to the peer, such as ucx_perftest, need). Unusable entries (not an
/// address, an empty name or one of 64 bytes or more) are skipped.
pub fn env_devices() -> Vec<(String, std::net::IpAddr)> {
    let Ok(v) = std::env::var("SOFTRDMA_DEVICES") else {
        return Vec::new();
    };
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|e| {
            let (name, a) = match e.split_once('=') {
                Some((n, a)) => (Some(n.trim()), a.trim()),
                None => (None, e),
            };
            let ip = a.parse::<std::net::IpAddr>().ok()?;
            let name = name.map_or_else(|| format!("srdma_{ip}"), str::to_string);
            (!name.is_empty() && name.len() < 64).then_some((name, ip))
        })
        .collect()
}

/// The devices a C program sees: softrdma's own list (`srdma0` … one per local address),
/// then those of [`env_devices`] whose name is not already listed (and whose address is
/// one of this machine).
pub fn c_device_list() -> softrdma::Result<Vec<*mut ibv_device>> {
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for d in softrdma::get_device_list()? {
        out.push(objects::device_ptr(d.name(), &d));
        names.push(d.name().to_string());
    }
    for (name, ip) in env_devices() {
        if names.contains(&name) {
            continue;
        }
        if let Ok(d) = softrdma::Device::from_addr(ip) {
            out.push(objects::device_ptr(&name, &d));
            names.push(name);
        }
    }
    Ok(out)
}

/// `ibv_get_device_list`: a NULL-terminated array (free it with `ibv_free_device_list`),
/// `*num_devices` set when non-NULL; NULL with errno when the interfaces cannot be read.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ret_ptr(|| {
        let list = c_device_list().map_err(|e| e.errno())?;
        // SAFETY: calloc of n+1 pointers; freed by ibv_free_device_list.
        let arr = unsafe { libc::calloc(list.len() + 1, std::mem::size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if arr.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: i < n+1.
            unsafe { *arr.add(i) = *d };
        }
        if !num_devices.is_null() {
            // SAFETY: caller's out pointer.
            unsafe { *num_devices = list.len() as c_int };
        }
        Ok(arr)
    })
}

/// `ibv_free_device_list`: frees the array (devices stay valid for open contexts).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the array came from calloc in ibv_get_device_list (or is NULL).
    unsafe { libc::free(list.cast()) };
}

/// `ibv_get_device_name`: the device's name, NULL (EINVAL) for NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || {
        if device.is_null() {
            set_errno(EINVAL);
            return std::ptr::null();
        }
        // SAFETY: a device of this library.
        unsafe { (*device).name.as_ptr() }
    })
}

/// `ibv_get_device_guid`: the node GUID in network byte order (0 for NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || {
        // SAFETY: NULL or a device of this library.
        unsafe { device_of(device) }.map_or(0, |d| d.dev.guid().to_be())
    })
}

/// `ibv_get_device_index`: -1, as rdma-core gives for a device without a kernel index.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    let _ = device;
    -1
}

/// `ibv_close_device`: 0, or -1 with EINVAL for NULL. Objects left open stay usable as far
/// as softrdma goes (rdma-core leaves that undefined). A connection manager's context is
/// left open.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    crate::ffi::ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { objects::context_of(context) }.ok_or(EINVAL)?;
        if !c.cm_owned {
            // SAFETY: the context is live and the program gives it up.
            unsafe { objects::free_context(context) };
        }
        Ok(())
    })
}

/// The softrdma context of a C one, `EINVAL` for NULL.
///
/// # Safety
/// `p` must be NULL or a live context of this library.
pub(crate) unsafe fn ctx<'a>(p: *mut ibv_context) -> Result<&'a Arc<softrdma::Context>, i32> {
    // SAFETY: caller's contract.
    unsafe { objects::context_of(p) }
        .map(|c| &c.ctx)
        .ok_or(EINVAL)
}

/// The device attributes in C form.
pub fn device_attr_to_c(a: &softrdma::DeviceAttr) -> ibv_device_attr {
    let mut c: ibv_device_attr = objects::zeroed();
    for (d, s) in c.fw_ver.iter_mut().zip(a.fw_ver.bytes().take(63)) {
        *d = s as c_char;
    }
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    c.node_guid = a.node_guid.to_be();
    c.sys_image_guid = a.sys_image_guid.to_be();
    c.max_mr_size = a.max_mr_size;
    c.page_size_cap = a.page_size_cap;
    c.vendor_id = a.vendor_id;
    c.vendor_part_id = a.vendor_part_id;
    c.hw_ver = a.hw_ver;
    c.max_qp = i(a.max_qp);
    c.max_qp_wr = i(a.max_qp_wr);
    c.device_cap_flags = a.device_cap_flags.bits();
    c.max_sge = i(a.max_sge);
    c.max_sge_rd = i(a.max_sge_rd);
    c.max_cq = i(a.max_cq);
    c.max_cqe = i(a.max_cqe);
    c.max_mr = i(a.max_mr);
    c.max_pd = i(a.max_pd);
    c.max_qp_rd_atom = i(a.max_qp_rd_atom);
    c.max_res_rd_atom = i(a.max_res_rd_atom);
    c.max_qp_init_rd_atom = i(a.max_qp_init_rd_atom);
    c.atomic_cap = a.atomic_cap as u32;
    c.max_mw = i(a.max_mw);
    c.max_mcast_grp = i(a.max_mcast_grp);
    c.max_mcast_qp_attach = i(a.max_mcast_qp_attach);
    c.max_total_mcast_qp_attach = i(a.max_total_mcast_qp_attach);
    c.max_ah = i(a.max_ah);
    c.max_srq = i(a.max_srq);
    c.max_srq_wr = i(a.max_srq_wr);
    c.max_srq_sge = i(a.max_srq_sge);
    c.max_pkeys = a.max_pkeys;
    c.local_ca_ack_delay = a.local_ca_ack_delay;
    c.phys_port_cnt = a.phys_port_cnt;
    c
}

/// `ibv_query_device`: 0, or the errno (EINVAL for NULL arguments).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    crate::ffi::ret_errno(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if device_attr.is_null() {
            return Err(EINVAL);
        }
        let a = c.query_device().map_err(|e| e.errno())?;
        // SAFETY: the caller's struct.
        unsafe { device_attr.write(device_attr_to_c(&a)) };
        Ok(())
    })
}

/// The port attributes in C form (the v44 layout).
pub fn port_attr_to_c(a: &softrdma::PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: a.state as u32,
        max_mtu: a.max_mtu as u32,
        active_mtu: a.active_mtu as u32,
        gid_tbl_len: a.gid_tbl_len as c_int,
        port_cap_flags: a.port_cap_flags.bits(),
        max_msg_sz: a.max_msg_sz,
        bad_pkey_cntr: a.bad_pkey_cntr,
        qkey_viol_cntr: a.qkey_viol_cntr,
        pkey_tbl_len: a.pkey_tbl_len,
        lid: a.lid,
        sm_lid: a.sm_lid,
        lmc: a.lmc,
        max_vl_num: a.max_vl_num,
        sm_sl: a.sm_sl,
        subnet_timeout: a.subnet_timeout,
        init_type_reply: a.init_type_reply,
        active_width: a.active_width,
        active_speed: a.active_speed,
        phys_state: a.phys_state,
        link_layer: a.link_layer as u8,
        flags: a.flags,
        port_cap_flags2: 0,
    }
}

/// Writes the port attributes into `len` bytes at `out` (the fields that fit; bytes past
/// the known layout zeroed).
unsafe fn write_port(context: *mut ibv_context, port: u8, out: *mut u8, len: usize) -> c_int {
    crate::ffi::ret_errno(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let a = port_attr_to_c(&c.query_port(port).map_err(|e| e.errno())?);
        let n = len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: out has len bytes (caller's contract); n <= both sizes.
        unsafe {
            std::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), out, n);
            if len > n {
                std::ptr::write_bytes(out.add(n), 0, len - n);
            }
        }
        Ok(())
    })
}

/// `ibv_query_port@IBVERBS_1.1`: writes the 48-byte layout of that era (programs built
/// against current headers use the `verbs_context` slot instead); 0 or the errno (EINVAL
/// for a port other than 1 or NULL arguments).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut libc::c_void,
) -> c_int {
    // SAFETY: the compat struct has 48 bytes.
    unsafe { write_port(context, port_num, port_attr.cast(), COMPAT_PORT_ATTR_LEN) }
}

/// `verbs_context.query_port`: the size-aware port query of the inline `ibv_query_port`.
pub unsafe extern "C" fn query_port_sized(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    // SAFETY: the caller's struct has port_attr_len bytes.
    unsafe { write_port(context, port_num, port_attr.cast(), port_attr_len) }
}

/// `ibv_query_gid`: 0, or -1 with errno (EINVAL: bad port/index or NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    crate::ffi::ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if gid.is_null() || index < 0 {
            return Err(EINVAL);
        }
        let g = c.query_gid(port_num, index as u32).map_err(|e| e.errno())?;
        // SAFETY: the caller's gid.
        unsafe { gid.write(ibv_gid { raw: g.raw }) };
        Ok(())
    })
}

/// `ibv_query_pkey`: the P_Key (network order) at `index`; 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    crate::ffi::ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if pkey.is_null() || !(0..=0xffff).contains(&index) {
            return Err(EINVAL);
        }
        let k = c
            .query_pkey(port_num, index as u16)
            .map_err(|e| e.errno())?;
        // SAFETY: the caller's pkey.
        unsafe { pkey.write(k.to_be()) };
        Ok(())
    })
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order), or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: NULL or a live context.
        let r = unsafe { ctx(context) }.and_then(|c| {
            c.get_pkey_index(port_num, u16::from_be(pkey))
                .map_err(|e| e.errno())
        });
        match r {
            Ok(i) => c_int::from(i),
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

fn gid_entry_to_c(e: &softrdma::GidEntry) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: e.gid.raw },
        gid_index: e.gid_index,
        port_num: e.port_num,
        gid_type: match e.gid_type {
            softrdma::GidType::Ib => IBV_GID_TYPE_IB,
            softrdma::GidType::RoceV1 => IBV_GID_TYPE_ROCE_V1,
            softrdma::GidType::RoceV2 => IBV_GID_TYPE_ROCE_V2,
        },
        ndev_ifindex: e.ndev_ifindex,
    }
}

/// `_ibv_query_gid_ex@IBVERBS_1.11` (behind the inline `ibv_query_gid_ex`): 0, or the
/// errno (EINVAL for flags, a short `entry_size`, NULL, a bad port or index).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    crate::ffi::ret_errno(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(EINVAL);
        }
        let port = u8::try_from(port_num).map_err(|_| EINVAL)?;
        let e = c.query_gid_ex(port, gid_index).map_err(|e| e.errno())?;
        // SAFETY: the caller's entry has at least the struct's size.
        unsafe { entry.write(gid_entry_to_c(&e)) };
        Ok(())
    })
}

/// `_ibv_query_gid_table@IBVERBS_1.11`: the number of entries written, or a negative errno
/// (-EINVAL for flags, a short `entry_size`, NULL, or a `max_entries` below the table's
/// length, as the kernel answers).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        // SAFETY: NULL or a live context.
        let Ok(c) = (unsafe { ctx(context) }) else {
            return -(EINVAL as isize);
        };
        if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(EINVAL as isize);
        }
        let table = c.query_gid_table();
        if table.len() > max_entries {
            return -(EINVAL as isize);
        }
        if entries.is_null() && !table.is_empty() {
            return -(EINVAL as isize);
        }
        for (i, e) in table.iter().enumerate() {
            // SAFETY: entries holds max_entries elements of entry_size bytes.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(i * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(gid_entry_to_c(e))
            };
        }
        table.len() as isize
    })
}

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34` (used by ibv_devinfo): the sysfs GID type
/// (`IBV_GID_TYPE_SYSFS_ROCE_V2`); 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    type_: *mut u32,
) -> c_int {
    crate::ffi::ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if type_.is_null() {
            return Err(EINVAL);
        }
        let e = c.query_gid_ex(port_num, index).map_err(|e| e.errno())?;
        let t = match e.gid_type {
            softrdma::GidType::RoceV2 => IBV_GID_TYPE_SYSFS_ROCE_V2,
            _ => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
        };
        // SAFETY: the caller's out pointer.
        unsafe { type_.write(t) };
        Ok(())
    })
}
