//! The objects behind the C pointers: each C-visible struct (`struct ibv_context`,
//! `ibv_pd`, …) is the first field of a private `#[repr(C)]` Rust struct that holds the
//! softrdma object, so a C pointer converts to its wrapper by a cast.
//!
//! The softrdma objects carry their wrapper's address as their context value (a CQ's
//! `cq_context`, a QP's `qp_context`, an SRQ's `srq_context`): completion events and
//! asynchronous events name the C object without a lookup. The program's own context
//! pointers live in the C headers (`cq->cq_context`, `qp->qp_context`, …).

use crate::abi::*;
use crate::revocable::{Pool, Revocable};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;
use std::sync::{Arc, Mutex};

/// A device (`struct ibv_device`). Devices live for the whole process (one per name), so
/// a context's `device` pointer stays valid whatever the program frees.
#[repr(C)]
pub struct CDevice {
    /// The C view.
    pub c: ibv_device,
    /// The softrdma device.
    pub dev: softrdma::Device,
}

/// An open device. The C pointer is `&v.vctx.context`; `v` is the 696-byte `verbs_context`
/// of rdma-core HEAD (see [`verbs_context_alloc`]).
#[repr(C)]
pub struct CContext {
    /// The C view (ends with the `ibv_context`).
    pub v: verbs_context_alloc,
    /// The softrdma context.
    pub ctx: Arc<softrdma::Context>,
    /// `cmd_fd`: a real descriptor (an eventfd nothing signals), so programs that poll or
    /// close-on-exec it find a valid one.
    pub cmd_fd: OwnedFd,
    /// Whether the context belongs to the connection manager (cached; `ibv_close_device`
    /// leaves it open).
    pub cm_owned: bool,
}

/// A protection domain.
#[repr(C)]
pub struct CPd {
    /// The C view.
    pub c: ibv_pd,
    /// The softrdma PD.
    pub pd: Arc<softrdma::Pd>,
    /// Whether the PD is the connection manager's default PD (cached; not deallocated).
    pub cm_owned: bool,
}

/// A memory region.
#[repr(C)]
pub struct CMr {
    /// The C view.
    pub c: ibv_mr,
    /// The softrdma region.
    pub mr: softrdma::Mr,
}

/// A memory window.
#[repr(C)]
pub struct CMw {
    /// The C view (`rkey` follows the binds posted on it).
    pub c: ibv_mw,
    /// The softrdma window.
    pub mw: softrdma::Mw,
}

/// A completion channel. Destroyed wrappers are kept for reuse, never freed
/// ([`COMP_CHANNELS`], see [`crate::revocable`]): a call on a channel that another thread
/// has just destroyed reads a valid wrapper.
#[repr(C)]
pub struct CChannel {
    /// The C view (`fd` is the softrdma channel's eventfd).
    pub c: ibv_comp_channel,
    /// The softrdma channel, until `ibv_destroy_comp_channel`.
    pub ch: Revocable<Arc<softrdma::CompChannel>>,
}

/// Destroyed completion channel wrappers, for the next channels.
pub static COMP_CHANNELS: Pool = Pool::new();

/// The slot of the completion channel behind a C pointer and the channel's context (`None`
/// for NULL), read through the raw pointer: no reference to the whole wrapper, whose header
/// another thread may rewrite when it reuses a destroyed wrapper.
///
/// # Safety
/// `p` must be NULL or a channel of this library (live or destroyed).
pub unsafe fn comp_channel<'a>(
    p: *mut ibv_comp_channel,
) -> Option<(&'a Revocable<Arc<softrdma::CompChannel>>, *mut ibv_context)> {
    if p.is_null() {
        return None;
    }
    let w = p.cast::<CChannel>();
    // SAFETY: caller's contract: the wrapper's memory is valid (never freed); the slot is
    // only ever reached through shared references, the context read by value.
    unsafe {
        Some((
            &*ptr::addr_of!((*w).ch),
            ptr::addr_of!((*w).c.context).read(),
        ))
    }
}

/// A completion queue; the softrdma CQ's `cq_context` is this wrapper's address.
#[repr(C)]
pub struct CCq {
    /// The C view.
    pub c: ibv_cq,
    /// Room for the `ibv_cq_ex` tail that `verbs::ex` fills for CQs it creates.
    pub ex: super::tails::CqExTail,
    /// The softrdma CQ.
    pub cq: Arc<softrdma::Cq>,
}

/// A shared receive queue; the softrdma SRQ's `srq_context` is this wrapper's address.
#[repr(C)]
pub struct CSrq {
    /// The C view.
    pub c: ibv_srq,
    /// The softrdma SRQ.
    pub srq: Arc<softrdma::Srq>,
}

/// A queue pair; the softrdma QP's `qp_context` is this wrapper's address.
#[repr(C)]
pub struct CQp {
    /// The C view.
    pub c: ibv_qp,
    /// Room for the `ibv_qp_ex` tail (`ibv_qp_to_qp_ex` points at `c`), see `verbs::ex`.
    pub ex: super::tails::QpExTail,
    /// The softrdma QP.
    pub qp: Arc<softrdma::Qp>,
}

/// An address handle.
#[repr(C)]
pub struct CAh {
    /// The C view.
    pub c: ibv_ah,
    /// The softrdma handle.
    pub ah: softrdma::Ah,
}

/// A zeroed value of a C struct (every C header here is valid all-zero: NULL pointers,
/// zero numbers, glibc's static mutex/cond initialisers are zero bytes).
pub fn zeroed<T>() -> T {
    // SAFETY: only used for the #[repr(C)] header structs of crate::abi, which are plain
    // integers, raw pointers, Option<fn> and pthread types, all valid as zero bytes.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

fn name_buf<const N: usize>(s: &str) -> [libc::c_char; N] {
    let mut b = [0 as libc::c_char; N];
    for (d, c) in b.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = c as libc::c_char;
    }
    b
}

/// The process-wide C device named `name` for `dev`, made on first use and never freed.
pub fn device_ptr(name: &str, dev: &softrdma::Device) -> *mut ibv_device {
    static DEVICES: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());
    let mut list = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = list.iter().find(|(n, _)| n == name) {
        return *p as *mut ibv_device;
    }
    let mut c: ibv_device = zeroed();
    c.node_type = softrdma::NodeType::Ca as i32;
    c.transport_type = dev.transport_type() as i32;
    c.name = name_buf(name);
    c.dev_name = name_buf(&format!("uverbs_{name}"));
    c.dev_path = name_buf(&format!("/sys/class/infiniband_verbs/uverbs_{name}"));
    c.ibdev_path = name_buf(&format!("/sys/class/infiniband/{name}"));
    let p = Box::into_raw(Box::new(CDevice {
        c,
        dev: dev.clone(),
    }));
    list.push((name.to_string(), p as usize));
    p.cast()
}

/// The wrapper of a C device pointer.
///
/// # Safety
/// `p` must come from [`device_ptr`] (or be NULL).
pub unsafe fn device_of<'a>(p: *mut ibv_device) -> Option<&'a CDevice> {
    // SAFETY: caller's contract; CDevice starts with the ibv_device.
    unsafe { p.cast::<CDevice>().as_ref() }
}

const CTX_OFFSET: usize = std::mem::offset_of!(CContext, v.vctx.context);

/// Makes the C context for `ctx` (device `dev`): fills `ops`, the `verbs_context` slots
/// (through `fill`, libibverbs' `fill_context`), the descriptors. Fails with the errno of `eventfd`.
pub fn new_context(
    dev: *mut ibv_device,
    ctx: Arc<softrdma::Context>,
    cm_owned: bool,
    fill: fn(&mut verbs_context),
) -> Result<*mut ibv_context, i32> {
    // SAFETY: plain eventfd(2).
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(crate::ffi::errno());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let cmd_fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut b = Box::new(CContext {
        v: zeroed(),
        ctx,
        cmd_fd,
        cm_owned,
    });
    {
        let c = &mut b.v.vctx.context;
        c.device = dev;
        c.cmd_fd = b.cmd_fd.as_raw_fd();
        c.async_fd = b.ctx.async_fd();
        c.num_comp_vectors = b.ctx.num_comp_vectors() as i32;
        c.abi_compat = usize::MAX as *mut libc::c_void;
    }
    b.v.vctx.sz = std::mem::size_of::<verbs_context_alloc>();
    fill(&mut b.v.vctx);
    let p = Box::into_raw(b);
    // SAFETY: p is a live CContext.
    Ok(unsafe { ptr::addr_of_mut!((*p).v.vctx.context) })
}

/// The wrapper of a C context pointer.
///
/// # Safety
/// `p` must come from [`new_context`] and not be closed (or be NULL).
pub unsafe fn context_of<'a>(p: *mut ibv_context) -> Option<&'a CContext> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller's contract: p is the ibv_context inside a CContext.
    unsafe { p.byte_sub(CTX_OFFSET).cast::<CContext>().as_ref() }
}

/// Frees a C context.
///
/// # Safety
/// `p` must come from [`new_context`]; it is invalid afterwards.
pub unsafe fn free_context(p: *mut ibv_context) {
    // SAFETY: caller's contract.
    drop(unsafe { Box::from_raw(p.byte_sub(CTX_OFFSET).cast::<CContext>()) });
}

/// The connection manager's contexts and default PDs already given C wrappers, by the
/// address of the softrdma object.
struct CmCache {
    contexts: HashMap<usize, usize>,
    pds: HashMap<usize, usize>,
}

fn cm_cache() -> std::sync::MutexGuard<'static, CmCache> {
    static C: std::sync::OnceLock<Mutex<CmCache>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        Mutex::new(CmCache {
            contexts: HashMap::new(),
            pds: HashMap::new(),
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

/// The C context of a softrdma context the connection manager opened: the same pointer for
/// the same `Arc`, made on first use and kept for the process (`ibv_close_device` on it does
/// nothing); `fill` fills a new one's slots as in [`new_context`]. Fails with the errno of
/// `eventfd`.
pub fn cm_context(
    ctx: &Arc<softrdma::Context>,
    fill: fn(&mut verbs_context),
) -> Result<*mut ibv_context, i32> {
    let key = Arc::as_ptr(ctx) as usize;
    let mut cache = cm_cache();
    if let Some(p) = cache.contexts.get(&key) {
        return Ok(*p as *mut ibv_context);
    }
    let dev = ctx.device();
    let d = device_ptr(dev.name(), dev);
    let p = new_context(d, ctx.clone(), true, fill)?;
    cache.contexts.insert(key, p as usize);
    Ok(p)
}

/// The C PD of a softrdma PD the connection manager allocated (its default PD) in the
/// C context `ctx`: the same pointer for the same `Arc`, kept for the process
/// (`ibv_dealloc_pd` on it does nothing).
pub fn cm_pd(ctx: *mut ibv_context, pd: &Arc<softrdma::Pd>) -> *mut ibv_pd {
    let key = Arc::as_ptr(pd) as usize;
    let mut cache = cm_cache();
    if let Some(p) = cache.pds.get(&key) {
        return *p as *mut ibv_pd;
    }
    let p = new_pd(ctx, pd.clone(), true);
    cache.pds.insert(key, p as usize);
    p
}

/// A new C PD for `pd` in context `ctx`.
pub fn new_pd(ctx: *mut ibv_context, pd: Arc<softrdma::Pd>, cm_owned: bool) -> *mut ibv_pd {
    static HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let mut c: ibv_pd = zeroed();
    c.context = ctx;
    c.handle = HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Box::into_raw(Box::new(CPd { c, pd, cm_owned })).cast()
}

/// Allocates a zeroed wrapper of type `T`, to be completed with [`finish`] once the softrdma
/// object (which takes the wrapper's address as its context) exists.
pub fn alloc_wrapper<T>() -> *mut MaybeUninit<T> {
    Box::into_raw(Box::<T>::new_uninit())
}

/// Writes `value` into a wrapper from [`alloc_wrapper`].
///
/// # Safety
/// `p` must come from `alloc_wrapper::<T>()` and not be finished or freed yet.
pub unsafe fn finish<T>(p: *mut MaybeUninit<T>, value: T) -> *mut T {
    // SAFETY: caller's contract.
    unsafe { (*p).write(value) }
}

/// Frees a wrapper from [`alloc_wrapper`] that was never finished.
///
/// # Safety
/// As for [`finish`].
pub unsafe fn abandon<T>(p: *mut MaybeUninit<T>) {
    // SAFETY: caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

/// Frees a finished wrapper.
///
/// # Safety
/// `p` must be a live wrapper made through [`alloc_wrapper`]/[`finish`] or `Box`.
pub unsafe fn free_wrapper<T>(p: *mut T) {
    // SAFETY: caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

/// Casts a C header pointer to its wrapper (`T` starts with the header).
///
/// # Safety
/// `p` must be NULL or point at the header of a live `T`.
pub unsafe fn wrapper<'a, H, T>(p: *mut H) -> Option<&'a T> {
    // SAFETY: caller's contract.
    unsafe { p.cast::<T>().as_ref() }
}

/// Destroys the softrdma object held in a wrapper's `Arc` field (located by `field`) with
/// `destroy`, then frees the wrapper; on failure the wrapper stays as it was and the errno
/// is returned. When the connection manager holds the object too, only the wrapper goes
/// (the CM's reference keeps the object).
///
/// `drop_rest` drops the wrapper's other fields that need it (say the `ex` tail of a QP or
/// CQ) just before the memory is freed.
///
/// # Safety
/// `w` must be a live boxed wrapper; `drop_rest` must drop exactly its fields other than
/// the `Arc` (and the C header, which needs no drop) that have drop glue.
pub unsafe fn destroy_arc<W, T>(
    w: *mut W,
    field: impl FnOnce(*mut W) -> *mut Arc<T>,
    drop_rest: impl FnOnce(*mut W),
    destroy: impl FnOnce(T) -> Result<(), softrdma::DestroyError<T>>,
) -> Result<(), i32> {
    let slot = field(w);
    // SAFETY: the slot holds an initialised Arc; it is written back or the wrapper freed.
    let arc = unsafe { ptr::read(slot) };
    let free = || {
        drop_rest(w);
        // SAFETY: the wrapper was boxed; its Arc has been moved out and drop_rest dropped
        // the rest (caller's contract).
        unsafe { std::alloc::dealloc(w.cast(), std::alloc::Layout::new::<W>()) }
    };
    match Arc::try_unwrap(arc) {
        Ok(obj) => match destroy(obj) {
            Ok(()) => {
                free();
                Ok(())
            }
            Err(e) => {
                let errno = e.error.errno();
                // SAFETY: the slot is vacant since the read above.
                unsafe { ptr::write(slot, Arc::new(e.object)) };
                Err(errno)
            }
        },
        Err(arc) => {
            drop(arc);
            free();
            Ok(())
        }
    }
}

/// Destroys the softrdma object held (not shared) in a wrapper's field with `destroy`, then
/// frees the wrapper; on failure the wrapper stays as it was and the errno is returned.
///
/// # Safety
/// `w` must be a live boxed wrapper whose fields other than `field` need no drop.
pub unsafe fn destroy_owned<W, T>(
    w: *mut W,
    field: impl FnOnce(*mut W) -> *mut T,
    destroy: impl FnOnce(T) -> Result<(), softrdma::DestroyError<T>>,
) -> Result<(), i32> {
    let slot = field(w);
    // SAFETY: the slot holds an initialised value; it is written back or the wrapper freed.
    let obj = unsafe { ptr::read(slot) };
    match destroy(obj) {
        Ok(()) => {
            // SAFETY: as in destroy_arc.
            unsafe { std::alloc::dealloc(w.cast(), std::alloc::Layout::new::<W>()) };
            Ok(())
        }
        Err(e) => {
            let errno = e.error.errno();
            // SAFETY: the slot is vacant since the read above.
            unsafe { ptr::write(slot, e.object) };
            Err(errno)
        }
    }
}
