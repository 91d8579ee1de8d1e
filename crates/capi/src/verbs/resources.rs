//! PDs, memory regions, completion channels, CQs, SRQs, address handles, multicast and
//! asynchronous events.

use super::device::ctx;
use super::objects::{self, CAh, CChannel, CContext, CCq, CMr, CMw, CPd, CQp, CSrq};
use crate::abi::*;
use crate::ffi::{guard, ret_errno, ret_neg1, ret_ptr, set_errno};
use crate::revocable::Revocable;
use libc::{c_int, c_uint, c_void, size_t, EBADF, EINVAL, EOPNOTSUPP};
use std::sync::{Arc, Mutex};

/// `ibv_alloc_pd`: a new PD; NULL with errno (EINVAL for NULL, ENOMEM past `max_pd`).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    ret_ptr(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        let pd = c.alloc_pd().map_err(|e| e.errno())?;
        Ok(objects::new_pd(context, Arc::new(pd), false))
    })
}

/// `ibv_dealloc_pd`: 0, or the errno (EINVAL for NULL, EBUSY while objects use it). The
/// connection manager's default PD is left alone.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live PD.
        let w = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        if w.cm_owned {
            return Ok(());
        }
        // Other handles of the PD (an id's, say) must not hide that objects still use it:
        // rdma-core's answer is EBUSY then, not a PD freed under the C QP that names it.
        if w.pd.in_use() {
            return Err(libc::EBUSY);
        }
        // SAFETY: a live boxed CPd.
        unsafe {
            objects::destroy_arc(
                pd.cast::<CPd>(),
                |w| std::ptr::addr_of_mut!((*w).pd),
                |_| {},
                |p| p.dealloc(),
            )
        }
    })
}

/// Access bits `ibv_reg_mr` drops when the device does not know them (rdma-core's
/// `IBV_ACCESS_OPTIONAL_RANGE`; softrdma knows RELAXED_ORDERING).
fn strip_optional(access: u32) -> u32 {
    let keep = softrdma::AccessFlags::RELAXED_ORDERING.bits();
    access & !(IBV_ACCESS_OPTIONAL_RANGE as u32) | (access & keep)
}

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: u32,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: NULL or a live PD.
    let w = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
    // (A null address is implicit on-demand paging's: the whole address space.)
    let implicit_odp =
        length == usize::MAX && access & softrdma::AccessFlags::ON_DEMAND.bits() != 0;
    if addr.is_null() && length > 0 && !implicit_odp {
        return Err(EINVAL);
    }
    // SAFETY: the program registers its own memory, with ibv_reg_mr's contract.
    let mr = unsafe {
        w.pd.reg_mr_iova(addr.cast(), length, iova, strip_optional(access))
    }
    .map_err(|e| e.errno())?;
    let c = ibv_mr {
        context: w.c.context,
        pd,
        addr,
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    Ok(Box::into_raw(Box::new(CMr { c, mr })).cast())
}

/// `ibv_reg_mr@IBVERBS_1.1`: registers `length` bytes at `addr`; NULL with errno (EINVAL
/// for NULL, zero length, bad access bits; ENOMEM past `max_mr`). With
/// `IBV_ACCESS_ON_DEMAND` the range need not be mapped (each access populates its pages and
/// fails where they are not mapped), and a NULL `addr` with `SIZE_MAX` bytes registers the
/// whole address space (implicit on-demand paging); see `softrdma::Pd::reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    ret_ptr(|| unsafe { reg(pd, addr, length, addr as u64, access as u32) })
}

/// `ibv_reg_mr_iova@IBVERBS_1.7`: as `ibv_reg_mr`, addressed from `iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    ret_ptr(|| unsafe { reg(pd, addr, length, iova, access as u32) })
}

/// `ibv_reg_mr_iova2@IBVERBS_1.8` (behind the `ibv_reg_mr` macro with optional access
/// bits): as `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    ret_ptr(|| unsafe { reg(pd, addr, length, iova, access) })
}

/// `ibv_reg_dmabuf_mr@IBVERBS_1.12`: NULL with EOPNOTSUPP (no dma-buf on softrdma).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: size_t,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, offset, length, iova, fd, access);
    set_errno(EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `IBV_REREG_MR_ERR_INPUT`.
const REREG_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`.
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: softrdma cannot change a region in place: `IBV_REREG_MR_ERR_INPUT`
/// (errno EINVAL) for NULL or unknown flags, else `IBV_REREG_MR_ERR_CMD` with EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> c_int {
    let _ = (pd, addr, length, access);
    // IBV_REREG_MR_CHANGE_TRANSLATION | _PD | _ACCESS.
    if mr.is_null() || flags & !7 != 0 || flags == 0 {
        set_errno(EINVAL);
        return REREG_ERR_INPUT;
    }
    set_errno(EOPNOTSUPP);
    REREG_ERR_CMD
}

/// `ibv_dereg_mr`: 0, or the errno (EINVAL for NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ret_errno(|| {
        if mr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: a live boxed CMr, given up by the program.
        unsafe {
            objects::destroy_owned(
                mr.cast::<CMr>(),
                |w| std::ptr::addr_of_mut!((*w).mr),
                |m| m.dereg(),
            )
        }
    })
}

/// `ops.alloc_mw` (`ibv_alloc_mw`): a window of type 1 or 2 (type 2 is 2B: tied to the QP
/// that binds it); NULL with errno (EINVAL for a NULL PD or another type, ENOMEM past
/// `max_mw`).
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    ret_ptr(|| {
        // SAFETY: NULL or a live PD.
        let w = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        let t = softrdma::MwType::from_raw(mw_type).ok_or(EINVAL)?;
        let mw = w.pd.alloc_mw(t).map_err(|e| e.errno())?;
        let c = ibv_mw {
            // SAFETY: pd is live.
            context: unsafe { (*pd).context },
            pd,
            rkey: mw.rkey(),
            handle: 0,
            type_: mw_type,
        };
        Ok(Box::into_raw(Box::new(CMw { c, mw })).cast())
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`): 0 (a bound window is unbound), or EINVAL for NULL.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        if mw.is_null() {
            return EINVAL;
        }
        // SAFETY: a live boxed CMw, given up by the program.
        let b = unsafe { Box::from_raw(mw.cast::<CMw>()) };
        match b.mw.dealloc() {
            Ok(()) => 0,
            Err(e) => e.error.errno(),
        }
    })
}

/// The softrdma form of a C `ibv_mw_bind_info` (`Err(EINVAL)` never: a NULL region is
/// `None`).
///
/// # Safety
/// `i.mr` must be NULL or a live region of this library.
pub(crate) unsafe fn bind_info<'a>(i: &ibv_mw_bind_info) -> softrdma::MwBindInfo<'a> {
    softrdma::MwBindInfo {
        // SAFETY: caller's contract.
        mr: unsafe { objects::wrapper::<_, CMr>(i.mr) }.map(|w| &w.mr),
        addr: i.addr,
        length: i.length,
        mw_access_flags: i.mw_access_flags,
    }
}

/// `ops.bind_mw` (`ibv_bind_mw`, after its inline checks): posts the bind of a type 1 window
/// and sets `mw->rkey` to the new rkey (key byte plus one); 0, or the errno (EINVAL for
/// NULL arguments, a type 2 window or ZERO_BASED access; EPERM for a region of another PD;
/// what `ibv_post_send` would return). The outcome comes as an `IBV_WC_BIND_MW`
/// completion; after an error completion the program restores `mw->rkey`, as with
/// rdma-core.
pub unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        let bind = bind.cast::<ibv_mw_bind>();
        // SAFETY: NULL or live objects of this library / the program's struct.
        let (Some(q), Some(m), Some(b)) = (unsafe {
            (
                objects::wrapper::<_, CQp>(qp),
                mw.cast::<CMw>().as_mut(),
                bind.as_ref(),
            )
        }) else {
            return EINVAL;
        };
        let mb = softrdma::MwBind {
            wr_id: b.wr_id,
            send_flags: softrdma::SendFlags::from_bits_retain(b.send_flags),
            // SAFETY: the program's region pointer (NULL or live).
            bind_info: unsafe { bind_info(&b.bind_info) },
        };
        match q.qp.bind_mw(&m.mw, &mb) {
            Ok(rkey) => {
                m.c.rkey = rkey;
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_create_comp_channel@IBVERBS_1.0`: a channel whose `fd` is a real eventfd (readable
/// while events wait; O_NONBLOCK makes `ibv_get_cq_event` fail with EAGAIN); NULL with
/// errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    ret_ptr(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        let ch = c.create_comp_channel().map_err(|e| e.errno())?;
        let hdr = ibv_comp_channel {
            context,
            fd: ch.fd(),
            refcnt: 0,
        };
        if let Some(w) = objects::COMP_CHANNELS.take::<CChannel>() {
            // SAFETY: the pool holds destroyed CChannels, whose memory is never freed.
            unsafe {
                (*w).c = hdr;
                (*w).ch.restore(Arc::new(ch));
            }
            return Ok(w.cast());
        }
        Ok(Box::into_raw(Box::new(CChannel {
            c: hdr,
            ch: Revocable::new(Arc::new(ch)),
        }))
        .cast())
    })
}

/// `ibv_destroy_comp_channel@IBVERBS_1.0`: 0, or the errno (EINVAL for NULL, EBUSY while a
/// CQ uses it, EBADF when destroyed already). A later `ibv_get_cq_event` on it (another
/// thread's) waits as one already waiting does: forever on a blocking descriptor, `EBADF`
/// on a non-blocking one.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    ret_errno(|| {
        if channel.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: a channel of this library (live or destroyed: the memory stays).
        let (slot, _) = unsafe { objects::comp_channel(channel) }.ok_or(EINVAL)?;
        // SAFETY: as above; the descriptor's number, read through the raw pointer.
        let fd = unsafe { std::ptr::addr_of!((*channel).fd).read() };
        // (Under the slot's lock: a thread that looks meanwhile waits, and never sees the
        // channel destroyed when the destruction fails.)
        let destroyed = slot.revoke_with(fd, |arc| match Arc::try_unwrap(arc) {
            Ok(ch) => ch
                .destroy()
                .map_err(|e| (Arc::new(e.object), e.error.errno())),
            // A thread waiting on the channel holds it too: unless a CQ uses it, the channel
            // goes with that thread's handle.
            Err(arc) if arc.cqs() > 0 => Err((arc, libc::EBUSY)),
            Err(_) => Ok(()),
        })?;
        if !destroyed {
            return Err(EBADF);
        }
        objects::COMP_CHANNELS.put(channel.cast::<CChannel>());
        Ok(())
    })
}

/// Creates a CQ of `cqe` entries in `context`, its softrdma `cq_context` the wrapper's
/// address (shared by `ibv_create_cq` and the extended API). Fails with EINVAL for NULL,
/// negative values, a channel of another context; softrdma's errno otherwise.
///
/// # Safety
/// `context`/`channel` must be NULL or live objects of this library.
pub unsafe fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, i32> {
    // SAFETY: caller's contract.
    let c = unsafe { ctx(context) }?;
    // SAFETY: as above.
    let w = unsafe { objects::comp_channel(channel) };
    if cqe < 0 || comp_vector < 0 {
        return Err(EINVAL);
    }
    let ch = match w {
        Some((_, ctx)) if ctx != context => return Err(EINVAL),
        // A destroyed channel: EBADF, as the kernel answers for its closed descriptor.
        Some((slot, _)) => Some(slot.get().map_err(|_| EBADF)?),
        None => None,
    };
    let w = objects::alloc_wrapper::<CCq>();
    match c.create_cq(cqe as u32, w as u64, ch.as_deref(), comp_vector as u32) {
        Ok(cq) => {
            let mut hdr: ibv_cq = objects::zeroed();
            hdr.context = context;
            hdr.channel = channel;
            hdr.cq_context = cq_context;
            hdr.handle = w as usize as u32;
            hdr.cqe = cq.cqe() as c_int;
            // SAFETY: w is unfinished.
            let p = unsafe {
                objects::finish(
                    w,
                    CCq {
                        c: hdr,
                        ex: Default::default(),
                        cq: Arc::new(cq),
                    },
                )
            };
            Ok(p.cast())
        }
        Err(e) => {
            // SAFETY: w is unfinished.
            unsafe { objects::abandon(w) };
            Err(e.errno())
        }
    }
}

/// `ibv_create_cq`: a CQ with at least `cqe` entries (`cq->cqe` says how many); NULL with
/// errno (EINVAL for NULL, cqe out of 1..=max_cqe, a bad comp_vector or channel).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded.
    ret_ptr(|| unsafe { create_cq(context, cqe, cq_context, channel, comp_vector) })
}

/// `ibv_resize_cq`: softrdma CQs keep their size: 0 when the CQ already holds `cqe`
/// entries, EOPNOTSUPP to grow it, EINVAL for NULL or `cqe` < 1.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live CQ.
        let w = unsafe { objects::wrapper::<_, CCq>(cq) }.ok_or(EINVAL)?;
        if cqe < 1 {
            return Err(EINVAL);
        }
        if cqe as u32 <= w.cq.cqe() {
            Ok(())
        } else {
            Err(EOPNOTSUPP)
        }
    })
}

/// `ibv_destroy_cq`: 0, or the errno (EINVAL for NULL; EBUSY while a QP uses it). Waits,
/// as rdma-core does, until the completion and asynchronous events taken about the CQ are
/// all acknowledged.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ret_errno(|| {
        if cq.is_null() {
            return Err(EINVAL);
        }
        // As rdma-core: wait until the program acknowledged every event it took about the
        // CQ (another thread may be about to), unless a QP uses it (EBUSY at once).
        // SAFETY: a live boxed CCq.
        if let Some(w) = unsafe { objects::wrapper::<_, CCq>(cq) } {
            w.cq.wait_events_acked();
        }
        // SAFETY: a live boxed CCq.
        unsafe {
            objects::destroy_arc(
                cq.cast::<CCq>(),
                |w| std::ptr::addr_of_mut!((*w).cq),
                |w| std::ptr::drop_in_place(std::ptr::addr_of_mut!((*w).ex)),
                |c| c.destroy(),
            )
        }
    })
}

/// `ibv_get_cq_event`: waits for a completion event on `channel` (EAGAIN at once when its
/// fd is O_NONBLOCK) and names the CQ and its `cq_context`; 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ret_neg1(|| {
        // SAFETY: NULL or a channel of this library (live or destroyed).
        let (slot, _) = unsafe { objects::comp_channel(channel) }.ok_or(EINVAL)?;
        if cq.is_null() || cq_context.is_null() {
            return Err(EINVAL);
        }
        // Held for the wait (not borrowed from the wrapper), as rdma_get_cm_event holds its
        // channel: a channel destroyed while a thread waits on it leaves that thread waiting;
        // a call that comes after the destruction waits as if it had come a moment before
        // (see crate::revocable).
        let chan = slot.get().map_err(crate::revocable::Late::wait)?;
        let ev = chan.get_cq_event().map_err(|e| e.errno())?;
        let w = ev.cq_context() as usize as *mut CCq;
        // SAFETY: the event's CQ is live until its events are acknowledged (destroy fails
        // before); out pointers are the caller's.
        unsafe {
            *cq = w.cast();
            *cq_context = (*w).c.cq_context;
        }
        Ok(())
    })
}

/// `ibv_ack_cq_events`: acknowledges `nevents` events of `cq` (NULL ignored).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        // SAFETY: NULL or a live CQ.
        if let Some(w) = unsafe { objects::wrapper::<_, CCq>(cq) } {
            w.cq.ack_cq_events(nevents);
        }
    })
}

/// `ibv_create_srq`: an SRQ with at least the asked size (written back); NULL with errno
/// (EINVAL for NULL or limits out of range).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ret_ptr(|| {
        // SAFETY: NULL or a live PD.
        let p = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        if srq_init_attr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's attr.
        let ia = unsafe { &mut *srq_init_attr };
        let w = objects::alloc_wrapper::<CSrq>();
        let mut init = softrdma::SrqInitAttr {
            srq_context: w as u64,
            attr: softrdma::SrqAttr {
                max_wr: ia.attr.max_wr,
                max_sge: ia.attr.max_sge,
                srq_limit: ia.attr.srq_limit,
            },
        };
        match p.pd.create_srq(&mut init) {
            Ok(srq) => {
                ia.attr.max_wr = init.attr.max_wr;
                ia.attr.max_sge = init.attr.max_sge;
                let mut hdr: ibv_srq = objects::zeroed();
                hdr.context = p.c.context;
                hdr.srq_context = ia.srq_context;
                hdr.pd = pd;
                hdr.handle = w as usize as u32;
                // SAFETY: w is unfinished.
                let s = unsafe {
                    objects::finish(
                        w,
                        CSrq {
                            c: hdr,
                            srq: Arc::new(srq),
                        },
                    )
                };
                Ok(s.cast())
            }
            Err(e) => {
                // SAFETY: w is unfinished.
                unsafe { objects::abandon(w) };
                Err(e.errno())
            }
        }
    })
}

/// `ibv_modify_srq`: 0, or the errno (EINVAL for NULL, an unknown or empty mask, a bad
/// size or limit).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    srq_attr: *mut ibv_srq_attr,
    srq_attr_mask: c_int,
) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live SRQ.
        let w = unsafe { objects::wrapper::<_, CSrq>(srq) }.ok_or(EINVAL)?;
        if srq_attr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's attr.
        let a = unsafe { &*srq_attr };
        let attr = softrdma::SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        w.srq
            .modify_srq(&attr, srq_attr_mask as u32)
            .map_err(|e| e.errno())
    })
}

/// `ibv_query_srq`: 0, or the errno (EINVAL for NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live SRQ.
        let w = unsafe { objects::wrapper::<_, CSrq>(srq) }.ok_or(EINVAL)?;
        if srq_attr.is_null() {
            return Err(EINVAL);
        }
        let a = w.srq.query_srq().map_err(|e| e.errno())?;
        // SAFETY: the caller's attr.
        unsafe {
            srq_attr.write(ibv_srq_attr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: a.srq_limit,
            })
        };
        Ok(())
    })
}

/// `ibv_destroy_srq`: 0, or the errno (EINVAL for NULL, EBUSY while QPs use it).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ret_errno(|| {
        if srq.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: a live boxed CSrq.
        unsafe {
            objects::destroy_arc(
                srq.cast::<CSrq>(),
                |w| std::ptr::addr_of_mut!((*w).srq),
                |_| {},
                |s| s.destroy(),
            )
        }
    })
}

fn new_ah(pd: *mut ibv_pd, p: &CPd, ah: softrdma::Ah) -> *mut ibv_ah {
    static HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let c = ibv_ah {
        context: p.c.context,
        pd,
        handle: HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    Box::into_raw(Box::new(CAh { c, ah })).cast()
}

/// `ibv_create_ah`: NULL with errno (EINVAL for NULL or an address vector the device
/// cannot reach: no GRH, bad port or GID index).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ret_ptr(|| {
        // SAFETY: NULL or a live PD.
        let p = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        if attr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's attr.
        let a = super::qp::ah_attr_from_c(unsafe { &*attr });
        let ah = p.pd.create_ah(&a).map_err(|e| e.errno())?;
        Ok(new_ah(pd, p, ah))
    })
}

/// `ibv_destroy_ah`: 0, or the errno (EINVAL for NULL).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ret_errno(|| {
        if ah.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: a live boxed CAh, given up by the program.
        unsafe {
            objects::destroy_owned(
                ah.cast::<CAh>(),
                |w| std::ptr::addr_of_mut!((*w).ah),
                |a| a.destroy(),
            )
        }
    })
}

/// The 40-byte GRH area of a receive buffer.
unsafe fn grh40<'a>(grh: *const c_void) -> Option<&'a [u8; 40]> {
    // SAFETY: the caller passes the start of a UD receive buffer (40 bytes at least).
    unsafe { grh.cast::<[u8; 40]>().as_ref() }
}

/// `ibv_init_ah_from_wc`: the address vector answering a UD receive; 0, or -1 with errno
/// (EINVAL: NULL, bad port, no GRH).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        // SAFETY: the caller's GRH area.
        let g = unsafe { grh40(grh) }.ok_or(EINVAL)?;
        if wc.is_null() || ah_attr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's wc.
        let w = wc_from_c(unsafe { &*wc });
        let a = c.init_ah_from_wc(port_num, &w, g).map_err(|e| e.errno())?;
        // SAFETY: the caller's attr.
        unsafe { ah_attr.write(super::qp::ah_attr_to_c(&a)) };
        Ok(())
    })
}

/// `ibv_create_ah_from_wc`: NULL with errno (as `ibv_init_ah_from_wc` and `ibv_create_ah`).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    ret_ptr(|| {
        // SAFETY: NULL or a live PD.
        let p = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        // SAFETY: the caller's GRH area.
        let g = unsafe { grh40(grh) }.ok_or(EINVAL)?;
        if wc.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: the caller's wc.
        let w = wc_from_c(unsafe { &*wc });
        let ah =
            p.pd.create_ah_from_wc(port_num, &w, g)
                .map_err(|e| e.errno())?;
        Ok(new_ah(pd, p, ah))
    })
}

/// `ibv_attach_mcast`: 0, or the errno (EINVAL for NULL, a non-UD QP, a non-multicast GID).
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live QP.
        let w = unsafe { objects::wrapper::<_, CQp>(qp) }.ok_or(EINVAL)?;
        // SAFETY: the caller's gid.
        let g = unsafe { gid.as_ref() }.ok_or(EINVAL)?;
        // SAFETY: any bytes are a valid raw GID.
        let g = softrdma::Gid {
            raw: unsafe { g.raw },
        };
        w.qp.attach_mcast(&g, lid).map_err(|e| e.errno())
    })
}

/// `ibv_detach_mcast`: 0, or the errno (EINVAL for NULL or a group not attached).
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live QP.
        let w = unsafe { objects::wrapper::<_, CQp>(qp) }.ok_or(EINVAL)?;
        // SAFETY: the caller's gid.
        let g = unsafe { gid.as_ref() }.ok_or(EINVAL)?;
        // SAFETY: any bytes are a valid raw GID.
        let g = softrdma::Gid {
            raw: unsafe { g.raw },
        };
        w.qp.detach_mcast(&g, lid).map_err(|e| e.errno())
    })
}

/// Asynchronous events handed to the program and not yet acknowledged, by (type, element),
/// so that `ibv_ack_async_event` (which only gets the C struct) releases the right one.
static PENDING: Mutex<Vec<((u32, usize), softrdma::AsyncEvent)>> = Mutex::new(Vec::new());

fn event_key(e: &ibv_async_event) -> (u32, usize) {
    // SAFETY: the union's pointer-sized view covers every member's bytes we wrote.
    let el = unsafe { e.element.cq } as usize;
    (e.event_type, el)
}

/// `ibv_get_async_event`: waits for the next asynchronous event of `context` (EAGAIN at
/// once when `async_fd` is O_NONBLOCK); 0, or -1 with errno. The element is the C object
/// (QP, CQ, SRQ) or the port number.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ret_neg1(|| {
        // SAFETY: NULL or a live context.
        let c = unsafe { ctx(context) }?;
        if event.is_null() {
            return Err(EINVAL);
        }
        let ev = c.get_async_event().map_err(|e| e.errno())?;
        let mut out = ibv_async_event {
            element: ibv_async_event_element {
                wq: std::ptr::null_mut(),
            },
            event_type: ev.event_type() as u32,
        };
        match ev.element() {
            softrdma::AsyncElement::Qp { qp_context, .. } => {
                out.element.qp = qp_context as usize as *mut ibv_qp
            }
            softrdma::AsyncElement::Cq { cq_context } => {
                out.element.cq = cq_context as usize as *mut ibv_cq
            }
            softrdma::AsyncElement::Srq { srq_context } => {
                out.element.srq = srq_context as usize as *mut ibv_srq
            }
            softrdma::AsyncElement::Port(p) => out.element.port_num = c_int::from(p),
            softrdma::AsyncElement::Device => {}
        }
        PENDING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((event_key(&out), ev));
        // SAFETY: the caller's struct.
        unsafe { event.write(out) };
        Ok(())
    })
}

/// `ibv_ack_async_event`: acknowledges an event from `ibv_get_async_event` (unknown or
/// NULL ignored).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        // SAFETY: NULL or the caller's event.
        let Some(e) = (unsafe { event.as_ref() }) else {
            return;
        };
        let key = event_key(e);
        let ev = {
            let mut p = PENDING.lock().unwrap_or_else(|p| p.into_inner());
            p.iter().position(|(k, _)| *k == key).map(|i| p.remove(i).1)
        };
        if let Some(ev) = ev {
            ev.ack();
        }
    })
}

/// The wrapper of a context (for `verbs::ex`).
///
/// # Safety
/// As [`objects::context_of`].
pub unsafe fn context_wrapper<'a>(p: *mut ibv_context) -> Option<&'a CContext> {
    // SAFETY: forwarded.
    unsafe { objects::context_of(p) }
}

/// A C completion in softrdma form (the inverse of [`super::datapath::wc_to_c`]).
pub fn wc_from_c(c: &ibv_wc) -> softrdma::WorkCompletion {
    let flags = softrdma::WcFlags::from_bits_retain(c.wc_flags);
    softrdma::WorkCompletion {
        wr_id: c.wr_id,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        imm_data: u32::from_be(c.imm_data),
        invalidated_rkey: c.imm_data,
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
        ..Default::default()
    }
}

/// `verbs_context.advise_mr` (`ibv_advise_mr`): populates the pages of the entries' ranges of
/// on-demand regions (`IBV_ADVISE_MR_ADVICE_PREFETCH`, `_PREFETCH_WRITE`, `_PREFETCH_NO_FAULT`)
/// before returning. Returns 0; `EINVAL` for a NULL PD or list, no entries, unknown flags
/// (checked before the advice, as the kernel does), an lkey of no on-demand region of the PD;
/// `EOPNOTSUPP` for another advice; `EPERM` for PREFETCH_WRITE on a region without
/// LOCAL_WRITE; with `IBV_ADVISE_MR_FLAG_FLUSH`, `EFAULT` for a range outside its region or
/// pages not mapped (see `softrdma::Pd::advise_mr`).
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    ret_errno(|| {
        // SAFETY: NULL or a live PD.
        let w = unsafe { objects::wrapper::<_, CPd>(pd) }.ok_or(EINVAL)?;
        if sg_list.is_null() || num_sge == 0 || flags & !softrdma::ADVISE_MR_FLAG_FLUSH != 0 {
            return Err(EINVAL);
        }
        let advice = softrdma::AdviseMr::from_raw(advice).ok_or(EOPNOTSUPP)?;
        let n = c_int::try_from(num_sge).map_err(|_| EINVAL)?;
        // SAFETY: the program's array of num_sge entries.
        let sges = unsafe { sges(sg_list, n) }?;
        w.pd.advise_mr(advice, flags, sges).map_err(|e| e.errno())
    })
}

/// The C scatter/gather list as softrdma entries.
///
/// # Safety
/// `sg` must point at `n` entries (when `n > 0`).
pub(super) unsafe fn sges<'a>(sg: *mut ibv_sge, n: c_int) -> Result<&'a [softrdma::Sge], i32> {
    if n < 0 || (n > 0 && sg.is_null()) {
        return Err(EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: softrdma::Sge is #[repr(C)] with ibv_sge's layout; the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(sg.cast::<softrdma::Sge>(), n as usize) })
}
