//! The `ops` table of `struct ibv_context`: `post_send`, `post_recv`, `post_srq_recv`,
//! `poll_cq`, `req_notify_cq`, which programs reach through rdma-core's inline wrappers.
//!
//! No allocation, lock or copy of data is added here: linked work-request lists are
//! translated into fixed stack arrays in chunks of [`CHUNK`], C `ibv_sge` arrays are read in
//! place as `softrdma::Sge` slices (same layout), and completions are polled into a stack
//! array and converted.

use super::objects::{CAh, CCq, CMw, CQp, CSrq};
use super::resources::sges;
use crate::abi::*;
use crate::ffi::guard;
use libc::{c_int, EINVAL};
use softrdma::{RecvWr, SendFlags, SendWr, WcFlags, WorkCompletion, WrOpcode};

/// Work requests or completions translated per step.
pub const CHUNK: usize = 16;

fn wr_opcode(op: u32) -> Option<WrOpcode> {
    Some(match op {
        0 => WrOpcode::RdmaWrite,
        1 => WrOpcode::RdmaWriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::RdmaRead,
        5 => WrOpcode::AtomicCmpAndSwp,
        6 => WrOpcode::AtomicFetchAndAdd,
        7 => WrOpcode::LocalInv,
        8 => WrOpcode::BindMw,
        9 => WrOpcode::SendWithInv,
        10 => WrOpcode::Tso,
        _ => return None,
    })
}

/// One C send work request as softrdma's.
///
/// # Safety
/// `w` must be a valid `ibv_send_wr` whose pointers are valid.
unsafe fn send_wr<'a>(w: &'a ibv_send_wr, ud: bool) -> Result<SendWr<'a>, i32> {
    let opcode = wr_opcode(w.opcode).ok_or(EINVAL)?;
    // SAFETY: caller's contract.
    let sg_list = unsafe { sges(w.sg_list, w.num_sge)? };
    let mut s = SendWr {
        wr_id: w.wr_id,
        sg_list,
        opcode,
        send_flags: SendFlags::from_bits_retain(w.send_flags),
        // `__be32 imm_data` (network order in memory); `invalidate_rkey` is host order.
        imm_data: if matches!(opcode, WrOpcode::SendWithInv | WrOpcode::LocalInv) {
            w.imm_data
        } else {
            u32::from_be(w.imm_data)
        },
        ..Default::default()
    };
    // SAFETY: reading the union member the QP type / opcode selects, as providers do.
    unsafe {
        if opcode == WrOpcode::BindMw {
            let b = &w.ext.bind_mw;
            if b.mw.is_null() {
                return Err(EINVAL);
            }
            // Only the softrdma field is borrowed: the C header's rkey is written after the
            // post (note_binds).
            let mw = &*std::ptr::addr_of!((*b.mw.cast::<CMw>()).mw);
            s.bind_mw = Some(softrdma::BindMwWr {
                mw,
                rkey: b.rkey,
                bind_info: super::resources::bind_info(&b.bind_info),
            });
        } else if ud {
            let a = w.wr.ud;
            s.ah = super::objects::wrapper::<_, CAh>(a.ah).map(|c| &c.ah);
            s.remote_qpn = a.remote_qpn;
            s.remote_qkey = a.remote_qkey;
        } else if matches!(
            opcode,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        ) {
            let a = w.wr.atomic;
            s.remote_addr = a.remote_addr;
            s.rkey = a.rkey;
            s.compare_add = a.compare_add;
            s.swap = a.swap;
        } else {
            let r = w.wr.rdma;
            s.remote_addr = r.remote_addr;
            s.rkey = r.rkey;
        }
    }
    Ok(s)
}

/// Sets `mw->rkey` of the window of each posted BIND_MW request to the rkey it asked for
/// (the index stays), as `ibv_bind_mw` does for type 1 windows.
///
/// # Safety
/// `ptrs[i]` must be the C request `wrs[i]` was made from.
#[inline]
pub(crate) unsafe fn note_binds(wrs: &[SendWr<'_>], ptrs: &[*mut ibv_send_wr]) {
    for (w, &p) in wrs.iter().zip(ptrs) {
        if let Some(b) = &w.bind_mw {
            // SAFETY: p is the program's request, whose window send_wr found live; only the
            // C header's rkey is written (the softrdma field is what `b.mw` borrows).
            unsafe {
                let mw = (*p).ext.bind_mw.mw;
                std::ptr::addr_of_mut!((*mw).rkey).write(b.mw.rkey());
            }
        }
    }
}

/// `ops.post_send`.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let set_bad = |p: *mut ibv_send_wr| {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out pointer.
                unsafe { *bad_wr = p };
            }
        };
        // SAFETY: qp is NULL or a QP of this library.
        let Some(q) = (unsafe { super::objects::wrapper::<_, CQp>(qp) }) else {
            set_bad(wr);
            return EINVAL;
        };
        let ud = q.qp.qp_type() == softrdma::QpType::Ud;
        let mut arr: [SendWr<'_>; CHUNK] = [SendWr::default(); CHUNK];
        let mut ptrs: [*mut ibv_send_wr; CHUNK] = [std::ptr::null_mut(); CHUNK];
        let mut cur = wr;
        while !cur.is_null() {
            let mut n = 0;
            let mut bad = None;
            while n < CHUNK && !cur.is_null() {
                // SAFETY: cur is an element of the caller's list.
                let w = unsafe { &*cur };
                // SAFETY: as above.
                match unsafe { send_wr(w, ud) } {
                    Ok(s) => {
                        arr[n] = s;
                        ptrs[n] = cur;
                        n += 1;
                        cur = w.next;
                    }
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            if n > 0 {
                // SAFETY: the inline entries are the program's memory, readable as it
                // promised libibverbs.
                let r = unsafe { q.qp.post_send_raw_inline(&arr[..n]) };
                let posted = r.as_ref().map_or_else(|e| e.bad_wr, |()| n);
                // SAFETY: the posted requests are the program's, with their windows.
                unsafe { note_binds(&arr[..posted], &ptrs[..posted]) };
                if let Err(e) = r {
                    set_bad(ptrs[e.bad_wr]);
                    return e.errno();
                }
            }
            if let Some(e) = bad {
                set_bad(cur);
                return e;
            }
        }
        0
    })
}

/// Translates and posts a C receive list with `post`, the posting function of the QP or SRQ
/// the list is for; `None` (a NULL QP or SRQ) fails the whole list with EINVAL.
///
/// # Safety
/// `wr` must be a valid list.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: Option<impl Fn(&[RecvWr<'_>]) -> Result<(), softrdma::PostError>>,
) -> c_int {
    let set_bad = |p: *mut ibv_recv_wr| {
        if !bad_wr.is_null() {
            // SAFETY: bad_wr is the caller's out pointer.
            unsafe { *bad_wr = p };
        }
    };
    let Some(post) = post else {
        set_bad(wr);
        return EINVAL;
    };
    let mut arr: [RecvWr<'_>; CHUNK] = [RecvWr::default(); CHUNK];
    let mut ptrs: [*mut ibv_recv_wr; CHUNK] = [std::ptr::null_mut(); CHUNK];
    let mut cur = wr;
    while !cur.is_null() {
        let mut n = 0;
        let mut bad = None;
        while n < CHUNK && !cur.is_null() {
            // SAFETY: cur is an element of the caller's list.
            let w = unsafe { &*cur };
            // SAFETY: the caller's list entries name their sg arrays.
            match unsafe { sges(w.sg_list, w.num_sge) } {
                Ok(sg_list) => {
                    arr[n] = RecvWr {
                        wr_id: w.wr_id,
                        sg_list,
                    };
                    ptrs[n] = cur;
                    n += 1;
                    cur = w.next;
                }
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        if n > 0 {
            if let Err(e) = post(&arr[..n]) {
                set_bad(ptrs[e.bad_wr]);
                return e.errno();
            }
        }
        if let Some(e) = bad {
            set_bad(cur);
            return e;
        }
    }
    0
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is NULL or a QP of this library.
        let q = unsafe { super::objects::wrapper::<_, CQp>(qp) };
        // SAFETY: the caller's list.
        unsafe { post_recv_list(wr, bad_wr, q.map(|q| |w: &[RecvWr<'_>]| q.qp.post_recv(w))) }
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is NULL or an SRQ of this library.
        let s = unsafe { super::objects::wrapper::<_, CSrq>(srq) };
        // SAFETY: the caller's list.
        unsafe {
            post_recv_list(
                wr,
                bad_wr,
                s.map(|s| |w: &[RecvWr<'_>]| s.srq.post_srq_recv(w)),
            )
        }
    })
}

/// A softrdma completion in C form.
pub fn wc_to_c(w: &WorkCompletion, c: &mut ibv_wc) {
    c.wr_id = w.wr_id;
    c.status = w.status as u32;
    c.opcode = w.opcode as u32;
    c.vendor_err = w.vendor_err;
    c.byte_len = w.byte_len;
    c.imm_data = if w.wc_flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey
    } else {
        w.imm_data.to_be()
    };
    c.qp_num = w.qp_num;
    c.src_qp = w.src_qp;
    c.wc_flags = w.wc_flags.bits();
    c.pkey_index = w.pkey_index;
    c.slid = w.slid;
    c.sl = w.sl;
    c.dlid_path_bits = w.dlid_path_bits;
}

/// `ops.poll_cq`: up to `num_entries` completions into `wc`; the number, or -1 (errno set)
/// when the CQ overran.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: cq is NULL or a CQ of this library.
        let Some(c) = (unsafe { super::objects::wrapper::<_, CCq>(cq) }) else {
            crate::ffi::set_errno(EINVAL);
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            crate::ffi::set_errno(EINVAL);
            return -1;
        }
        let want = num_entries as usize;
        let mut buf = [WorkCompletion::default(); CHUNK];
        let mut got = 0usize;
        while got < want {
            let n = (want - got).min(CHUNK);
            match c.cq.poll(&mut buf[..n]) {
                Ok(k) => {
                    for (i, w) in buf[..k].iter().enumerate() {
                        // SAFETY: wc has num_entries slots (caller's contract).
                        wc_to_c(w, unsafe { &mut *wc.add(got + i) });
                    }
                    got += k;
                    if k < n {
                        break;
                    }
                }
                Err(e) => {
                    if got > 0 {
                        break;
                    }
                    crate::ffi::set_errno(e.errno());
                    return -1;
                }
            }
        }
        got as c_int
    })
}

/// `ops.req_notify_cq`: 0, or the errno. Arming a CQ without a completion channel is
/// accepted and does nothing, as rdma-core's providers do.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: cq is NULL or a CQ of this library.
        let Some(c) = (unsafe { super::objects::wrapper::<_, CCq>(cq) }) else {
            return EINVAL;
        };
        if c.c.channel.is_null() {
            return 0;
        }
        match c.cq.req_notify_cq(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}
