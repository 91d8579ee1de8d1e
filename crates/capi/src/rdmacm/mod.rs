//! librdmacm: the `rdma_*` entry points (exported as `softrdma_rdma_<name>`, reached through
//! `librdmacm.so.1`'s jumps) over [`softrdma::rdma_cm`].
//!
//! Objects handed to C:
//! - [`CChannel`]: `struct rdma_event_channel` (the fd of a [`EventChannel`]) first.
//! - [`CId`]: `struct rdma_cm_id` first, then the [`CmId`] and the C layer's bookkeeping. The
//!   header's fields (`verbs`, `port_num`, the addresses, `qp`, the CQs …) are refreshed
//!   after every call on the id and whenever one of its events is delivered, because C
//!   programs read them directly (`rdma_get_local_addr` is an inline function).
//! - [`CEvent`]: `struct rdma_cm_event` first, then the [`CmEvent`] it acknowledges and the
//!   private data its `param` points into (valid until `rdma_ack_cm_event`).
//!
//! The QPs, CQs, completion channels, PDs and SRQs the connection manager creates for an id
//! are made through the C verbs layer, so they are ordinary C objects (`cq_context == id`
//! for the CQs, as `rdma_verbs.h`'s helpers assert).

mod addrinfo;
mod glue;
mod qp;
mod rsocket;
mod sa;

use crate::abi::*;
use crate::ffi::{guard, ret_neg1};
use crate::revocable::{Late, Pool, Revocable};
use libc::{c_char, c_int, c_void, sockaddr};
use softrdma::rdma_cm::{
    CmEvent, CmEventType, CmId, ConnParam, EventChannel, EventInfo, JoinMcAttrEx, PortSpace,
};
use softrdma::QpType;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

pub use addrinfo::*;
pub use qp::*;
pub use rsocket::*;

pub(crate) use sa::Res;

/// The errno of a failure of the Rust library.
pub(crate) fn err(e: softrdma::Error) -> i32 {
    e.errno()
}

/// `struct rdma_event_channel` and the channel behind it.
///
/// Destroyed wrappers are kept for reuse, never freed (see [`crate::revocable`]): a call on a
/// channel that another thread has just destroyed reads a valid wrapper.
#[repr(C)]
pub struct CChannel {
    hdr: rdma_event_channel,
    chan: Revocable<EventChannel>,
}

/// Destroyed event channel wrappers, for the next channels.
static CM_CHANNELS: Pool = Pool::new();

impl CChannel {
    fn new_raw(chan: EventChannel) -> *mut rdma_event_channel {
        let fd = chan.fd();
        if let Some(w) = CM_CHANNELS.take::<CChannel>() {
            // SAFETY: the pool holds destroyed CChannels, whose memory is never freed.
            unsafe {
                (*w).hdr.fd = fd;
                (*w).chan.restore(chan);
            }
            return w as *mut rdma_event_channel;
        }
        let b = Box::new(CChannel {
            hdr: rdma_event_channel { fd },
            chan: Revocable::new(chan),
        });
        Box::into_raw(b) as *mut rdma_event_channel
    }

    /// The channel behind a C pointer (a handle the caller holds, so that the channel lives
    /// as long as the call even if another thread destroys it meanwhile).
    ///
    /// Fails with [`Late`] when the channel was destroyed.
    ///
    /// # Safety
    /// `p` must come from [`CChannel::new_raw`] (live or destroyed).
    unsafe fn get(p: *mut rdma_event_channel) -> Result<EventChannel, Late> {
        (*(p as *mut CChannel)).chan.get()
    }

    /// The channel of a C pointer that may be NULL, for calls that take one (`EBADF` for a
    /// destroyed channel, as rdma-core's write to its closed descriptor fails).
    ///
    /// # Safety
    /// As for [`CChannel::get`], or NULL.
    unsafe fn get_opt(p: *mut rdma_event_channel) -> Res<Option<EventChannel>> {
        if p.is_null() {
            return Ok(None);
        }
        CChannel::get(p).map(Some).map_err(|_| libc::EBADF)
    }

    /// Destroys the channel behind `p`: the wrapper gives it up (its descriptor closes once
    /// no id and no waiting call holds it) and goes to the pool. A second destruction does
    /// nothing.
    ///
    /// # Safety
    /// As for [`CChannel::get`].
    unsafe fn destroy_raw(p: *mut rdma_event_channel) {
        let w = p as *mut CChannel;
        if let Some(ch) = (*w).chan.revoke((*w).hdr.fd) {
            drop(ch);
            CM_CHANNELS.put(w);
        }
    }
}

/// The C layer's own state of an id (behind its lock).
pub(crate) struct IdExtra {
    /// `id->event` of a synchronous id: the event its last call produced.
    sync_event: *mut CEvent,
    /// The send CQ and its channel were made by `rdma_create_qp`.
    cm_send_cq: bool,
    /// The receive CQ and its channel were made by `rdma_create_qp`.
    cm_recv_cq: bool,
    /// A passive `rdma_create_ep`: the PD and QP attributes `rdma_get_request` uses.
    ep: Option<(*mut ibv_pd, ibv_qp_init_attr)>,
    /// A synchronous id's private channel (`id->channel`), freed with the id.
    own_chan: *mut rdma_event_channel,
}

/// `struct rdma_cm_id`, the [`CmId`] behind it and the C layer's state.
#[repr(C)]
pub struct CId {
    hdr: rdma_cm_id,
    id: CmId,
    extra: Mutex<IdExtra>,
    /// The path record `route.path_rec` points to once the route is known.
    path: ibv_sa_path_rec,
}

// SAFETY: the raw pointers in IdExtra are C objects used under the lock or by the C
// program's own rules (an id is not destroyed while another thread uses it).
unsafe impl Send for IdExtra {}

impl CId {
    fn extra(&self) -> MutexGuard<'_, IdExtra> {
        self.extra.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `struct rdma_cm_event` with the event it acknowledges and its private data.
#[repr(C)]
pub struct CEvent {
    hdr: rdma_cm_event,
    /// The event from a channel (acknowledged when this is freed); None for a synchronous
    /// id's `id->event`.
    ev: Option<CmEvent>,
    pdata: Vec<u8>,
}

/// The C ids by their [`CmId`].
fn ids() -> MutexGuard<'static, HashMap<CmId, usize>> {
    static IDS: OnceLock<Mutex<HashMap<CmId, usize>>> = OnceLock::new();
    IDS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn lookup(id: &CmId) -> *mut CId {
    ids()
        .get(id)
        .map_or(std::ptr::null_mut(), |p| *p as *mut CId)
}

/// The C id of an id pointer from C.
///
/// Fails with `EINVAL` for NULL.
unsafe fn cid<'a>(id: *mut rdma_cm_id) -> Res<&'a mut CId> {
    if id.is_null() {
        Err(libc::EINVAL)
    } else {
        Ok(&mut *(id as *mut CId))
    }
}

fn qp_type_c(t: QpType) -> u32 {
    t as u32
}

/// Makes the C id for `id` (its channel: `chan`, or for a synchronous id a private one) and
/// registers it.
fn new_cid(id: CmId, context: *mut c_void, chan: *mut rdma_event_channel) -> *mut CId {
    let own_chan = if chan.is_null() {
        CChannel::new_raw(id.channel())
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, zero numbers).
    let mut hdr: rdma_cm_id = unsafe { std::mem::zeroed() };
    hdr.channel = if chan.is_null() { own_chan } else { chan };
    hdr.context = context;
    hdr.ps = u32::from(id.ps().to_u16());
    hdr.qp_type = qp_type_c(id.qp_type());
    let c = Box::into_raw(Box::new(CId {
        hdr,
        id: id.clone(),
        extra: Mutex::new(IdExtra {
            sync_event: std::ptr::null_mut(),
            cm_send_cq: false,
            cm_recv_cq: false,
            ep: None,
            own_chan,
        }),
        // SAFETY: all-zero is a valid path record.
        path: unsafe { std::mem::zeroed() },
    }));
    ids().insert(id, c as usize);
    // SAFETY: just made.
    unsafe { refresh(&mut *c) };
    c
}

/// Brings the header's fields the Rust id knows up to date: device, port, addresses, path.
fn refresh(c: &mut CId) {
    let id = &c.id;
    let ctx = id.verbs();
    c.hdr.verbs = ctx.as_ref().map_or(std::ptr::null_mut(), glue::context_of);
    if !c.hdr.verbs.is_null() && c.hdr.pd.is_null() {
        c.hdr.pd = glue::default_pd(c.hdr.verbs);
    }
    c.hdr.port_num = id.port_num();
    let (src, dst) = (id.local_addr(), id.peer_addr());
    c.hdr.route.addr.src = sa::to_c_or_zero(src);
    if dst.is_some() {
        c.hdr.route.addr.dst = sa::to_c_or_zero(dst);
    }
    if let (Some(s), Some(d), Some(ctx)) = (src, dst, ctx) {
        let gid = |ip| ibv_gid {
            raw: softrdma::Gid::from_ip(ip).raw,
        };
        c.path.sgid = gid(s.ip());
        c.path.dgid = gid(d.ip());
        c.path.pkey = 0xffff;
        c.path.hop_limit = 64;
        c.path.reversible = 1;
        c.path.numb_path = 1;
        c.path.mtu = softrdma::Mtu::for_link_mtu(ctx.device().netdev_mtu()).map_or(3, |m| m as u8);
        c.path.mtu_selector = 2;
        c.path.rate_selector = 2;
        c.path.packet_life_time_selector = 2;
        c.path.packet_life_time = 14;
        c.hdr.route.addr.addr.ibaddr = rdma_ib_addr {
            sgid: c.path.sgid,
            dgid: c.path.dgid,
            pkey: 0xffff,
        };
        c.hdr.route.path_rec = &mut c.path;
        c.hdr.route.num_paths = 1;
    }
}

/// After the CM moved the id's QP (RTR/RTS on connect, accept and the active side's
/// ESTABLISHED, ERR on REJECTED and disconnect), the C QP's `state` follows, as
/// `ibv_modify_qp` keeps it. Only at those moments, where librdmacm itself modifies
/// `id->qp`; under the id's lock, which `rdma_destroy_qp` takes to clear `id->qp`.
fn sync_qp_state(c: &mut CId) {
    let _g = c.extra.lock().unwrap_or_else(|p| p.into_inner());
    if c.hdr.qp.is_null() {
        return;
    }
    if let Some(q) = c.id.qp() {
        // SAFETY: id->qp is the live QP the CM made for the id (cleared under this lock
        // before it is destroyed).
        unsafe { (*c.hdr.qp).state = q.state() as u32 };
    }
}

/// For a synchronous id: makes `id->event` the event its last call produced (freeing the
/// one before).
fn set_sync_event(c: &mut CId) {
    if !c.id.is_sync() {
        return;
    }
    let Some(info) = c.id.event() else {
        return;
    };
    let me = c as *mut CId as *mut rdma_cm_id;
    let ev = make_event(&info, me, std::ptr::null_mut(), None);
    let old = std::mem::replace(&mut c.extra().sync_event, ev);
    c.hdr.event = ev as *mut rdma_cm_event;
    if !old.is_null() {
        // SAFETY: made by make_event, owned by the id.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// After a call on an id: refresh its fields and its `id->event`.
fn after_call(c: &mut CId) {
    refresh(c);
    set_sync_event(c);
}

/// A C event for `info`, keeping `ev` (acknowledged when the C event is freed).
fn make_event(
    info: &EventInfo,
    id: *mut rdma_cm_id,
    listen_id: *mut rdma_cm_id,
    ev: Option<CmEvent>,
) -> *mut CEvent {
    // SAFETY: all-zero is a valid rdma_cm_event.
    let mut hdr: rdma_cm_event = unsafe { std::mem::zeroed() };
    hdr.id = id;
    hdr.listen_id = listen_id;
    hdr.event = info.event as u32;
    hdr.status = info.status;
    let mut b = Box::new(CEvent {
        hdr,
        ev,
        pdata: Vec::new(),
    });
    match (info.event, &info.ud) {
        (CmEventType::User, _) => b.hdr.param.arg = info.arg,
        (CmEventType::MulticastJoin | CmEventType::MulticastError, ud) => {
            // SAFETY: all-zero is a valid rdma_ud_param.
            let mut p: rdma_ud_param = unsafe { std::mem::zeroed() };
            p.private_data = info.arg as usize as *const c_void;
            if let Some(ud) = ud {
                p.ah_attr = glue::ah_attr_to_c(&ud.ah_attr);
                p.qp_num = ud.qp_num;
                p.qkey = ud.qkey;
            }
            b.hdr.param.ud = p;
        }
        (_, Some(ud)) => {
            b.pdata = ud.private_data.clone();
            // SAFETY: all-zero is a valid rdma_ud_param.
            let mut p: rdma_ud_param = unsafe { std::mem::zeroed() };
            p.private_data = pdata_ptr(&b.pdata);
            p.private_data_len = b.pdata.len().min(255) as u8;
            p.ah_attr = glue::ah_attr_to_c(&ud.ah_attr);
            p.qp_num = ud.qp_num;
            p.qkey = ud.qkey;
            b.hdr.param.ud = p;
        }
        (_, None) => {
            let cp = &info.param;
            b.pdata = cp.private_data.clone();
            b.hdr.param.conn = rdma_conn_param {
                private_data: pdata_ptr(&b.pdata),
                private_data_len: b.pdata.len().min(255) as u8,
                responder_resources: cp.responder_resources,
                initiator_depth: cp.initiator_depth,
                flow_control: u8::from(cp.flow_control),
                retry_count: cp.retry_count,
                rnr_retry_count: cp.rnr_retry_count,
                srq: u8::from(cp.srq),
                qp_num: cp.qp_num,
            };
        }
    }
    Box::into_raw(b)
}

fn pdata_ptr(v: &[u8]) -> *const c_void {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr() as *const c_void
    }
}

/// Reads a C `rdma_conn_param`; NULL gives librdmacm's defaults (the device's maximum
/// resources and depth, 7 retries).
unsafe fn read_conn_param(p: *const rdma_conn_param) -> ConnParam {
    if p.is_null() {
        return ConnParam {
            responder_resources: RDMA_MAX_RESP_RES,
            initiator_depth: RDMA_MAX_RESP_RES,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
    }
    let p = &*p;
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into()).to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }
}

/// `rdma_create_event_channel`: a channel with a pollable descriptor.
///
/// Fails with NULL and the errno of `eventfd`.
#[export_name = "softrdma_rdma_create_event_channel"]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    crate::ffi::ret_ptr(|| Ok(CChannel::new_raw(EventChannel::new().map_err(err)?)))
}

/// `rdma_destroy_event_channel`: closes the channel (its descriptor stays open while ids
/// still use it). A later `rdma_get_cm_event` on it (another thread's, as rping's at exit)
/// waits as one already waiting does: forever on a blocking descriptor, `EBADF` on a
/// non-blocking one; other calls given it fail with `EBADF`.
#[export_name = "softrdma_rdma_destroy_event_channel"]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        if !channel.is_null() {
            CChannel::destroy_raw(channel);
        }
    })
}

/// `rdma_create_id`: a new id on `channel` (NULL: synchronous).
///
/// Fails with -1 and `EINVAL` for a NULL `id` or an unknown port space.
#[export_name = "softrdma_rdma_create_id"]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    ret_neg1(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let ps = u16::try_from(ps)
            .ok()
            .and_then(PortSpace::from_u16)
            .ok_or(libc::EINVAL)?;
        let ch = CChannel::get_opt(channel)?;
        let new = CmId::create(ch.as_ref(), 0, ps).map_err(err)?;
        *id = new_cid(new, context, channel) as *mut rdma_cm_id;
        Ok(())
    })
}

/// `rdma_destroy_id`: waits until the id's delivered events are acknowledged, then frees it.
///
/// Fails with -1 and `EINVAL` for NULL.
#[export_name = "softrdma_rdma_destroy_id"]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        ids().remove(&c.id);
        c.id.clone().destroy();
        let b = Box::from_raw(c as *mut CId);
        let x = b.extra.into_inner().unwrap_or_else(|p| p.into_inner());
        if !x.sync_event.is_null() {
            drop(Box::from_raw(x.sync_event));
        }
        if !x.own_chan.is_null() {
            CChannel::destroy_raw(x.own_chan);
        }
        Ok(())
    })
}

/// `rdma_get_cm_event`: the next event of `channel` (blocking unless its fd is
/// `O_NONBLOCK`). A CONNECT_REQUEST brings a new id (the listener's context and channel).
///
/// Fails with -1 and `EINVAL` for NULL arguments, `EAGAIN` when non-blocking and empty.
#[export_name = "softrdma_rdma_get_cm_event"]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ret_neg1(|| {
        if channel.is_null() || event.is_null() {
            return Err(libc::EINVAL);
        }
        // The channel is held for the wait, not borrowed from its wrapper: a program may
        // destroy the channel while a thread of its own waits on it (rping does, at exit).
        // With librdmacm that thread stays blocked in read(2) on the closed descriptor; here
        // it stays blocked on the channel, which lives as long as the wait (the wrapper, kept
        // for reuse, may hold another channel by then). A channel destroyed before this call:
        // the call waits as it would have had it come a moment earlier (see
        // crate::revocable).
        let chan = CChannel::get(channel).map_err(Late::wait)?;
        loop {
            let ev = chan.get_cm_event().map_err(err)?;
            let listen = ev.listen_id.as_ref().map_or(std::ptr::null_mut(), lookup);
            let mut c = lookup(&ev.id);
            if c.is_null() {
                if ev.event != CmEventType::ConnectRequest || listen.is_null() {
                    // An event of an id C never saw (destroyed meanwhile): dropped.
                    ev.ack();
                    continue;
                }
                let l = &*listen;
                c = new_cid(ev.id.clone(), l.hdr.context, l.hdr.channel);
            }
            let c = &mut *c;
            refresh(c);
            if matches!(
                ev.event,
                CmEventType::Established
                    | CmEventType::Rejected
                    | CmEventType::ConnectError
                    | CmEventType::Unreachable
            ) {
                sync_qp_state(c);
            }
            let info = ev.info();
            let e = make_event(
                &info,
                c as *mut CId as *mut rdma_cm_id,
                listen as *mut rdma_cm_id,
                Some(ev),
            );
            *event = e as *mut rdma_cm_event;
            return Ok(());
        }
    })
}

/// `rdma_ack_cm_event`: frees an event (and its private data).
///
/// Fails with -1 and `EINVAL` for NULL.
#[export_name = "softrdma_rdma_ack_cm_event"]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ret_neg1(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let e = event as *mut CEvent;
        if (*e).ev.is_none() {
            // A synchronous id's id->event: the id frees it.
            return Ok(());
        }
        drop(Box::from_raw(e));
        Ok(())
    })
}

/// `rdma_event_str`: the event's name, or "UNKNOWN EVENT".
#[export_name = "softrdma_rdma_event_str"]
pub unsafe extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    const NAMES: [*const c_char; 19] = [
        crate::cstr!("RDMA_CM_EVENT_ADDR_RESOLVED"),
        crate::cstr!("RDMA_CM_EVENT_ADDR_ERROR"),
        crate::cstr!("RDMA_CM_EVENT_ROUTE_RESOLVED"),
        crate::cstr!("RDMA_CM_EVENT_ROUTE_ERROR"),
        crate::cstr!("RDMA_CM_EVENT_CONNECT_REQUEST"),
        crate::cstr!("RDMA_CM_EVENT_CONNECT_RESPONSE"),
        crate::cstr!("RDMA_CM_EVENT_CONNECT_ERROR"),
        crate::cstr!("RDMA_CM_EVENT_UNREACHABLE"),
        crate::cstr!("RDMA_CM_EVENT_REJECTED"),
        crate::cstr!("RDMA_CM_EVENT_ESTABLISHED"),
        crate::cstr!("RDMA_CM_EVENT_DISCONNECTED"),
        crate::cstr!("RDMA_CM_EVENT_DEVICE_REMOVAL"),
        crate::cstr!("RDMA_CM_EVENT_MULTICAST_JOIN"),
        crate::cstr!("RDMA_CM_EVENT_MULTICAST_ERROR"),
        crate::cstr!("RDMA_CM_EVENT_ADDR_CHANGE"),
        crate::cstr!("RDMA_CM_EVENT_TIMEWAIT_EXIT"),
        crate::cstr!("RDMA_CM_EVENT_ADDRINFO_RESOLVED"),
        crate::cstr!("RDMA_CM_EVENT_ADDRINFO_ERROR"),
        crate::cstr!("RDMA_CM_EVENT_USER"),
    ];
    NAMES
        .get(event as usize)
        .copied()
        .unwrap_or(crate::cstr!("UNKNOWN EVENT"))
}

/// Runs `f` on the id and refreshes its fields (and a synchronous id's event) afterwards,
/// whether it failed or not.
unsafe fn on_id(id: *mut rdma_cm_id, f: impl FnOnce(&mut CId) -> Res) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        let r = f(c);
        after_call(c);
        r
    })
}

/// `rdma_bind_addr`: binds the id to a local address (port 0: an ephemeral one).
///
/// Fails with -1 and `EINVAL` (NULL, bad family, wrong state), `EADDRINUSE`,
/// `EADDRNOTAVAIL`.
#[export_name = "softrdma_rdma_bind_addr"]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    on_id(id, |c| {
        let a = sa::from_c(addr)?;
        c.id.bind_addr(a).map_err(err)
    })
}

/// `rdma_resolve_addr`: resolves `dst` (binding to `src` first if given); ADDR_RESOLVED
/// follows.
///
/// Fails with -1 and `EINVAL` (NULL, bad family, wrong state) or the errno of the
/// resolution on a synchronous id.
#[export_name = "softrdma_rdma_resolve_addr"]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    on_id(id, |c| {
        let dst = sa::from_c(dst_addr)?;
        let src = if src_addr.is_null() {
            None
        } else {
            Some(sa::from_c(src_addr)?)
        };
        c.hdr.route.addr.dst = sa::to_c(&dst).0;
        c.id.resolve_addr(src, dst, timeout_ms.max(0) as u32)
            .map_err(err)
    })
}

/// `rdma_resolve_route`: ROUTE_RESOLVED follows.
///
/// Fails with -1 and `EINVAL` before the address is resolved.
#[export_name = "softrdma_rdma_resolve_route"]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    on_id(id, |c| {
        c.id.resolve_route(timeout_ms.max(0) as u32).map_err(err)
    })
}

/// `rdma_listen`: CONNECT_REQUEST events follow (an unbound id binds to the wildcard). An id
/// bound to the wildcard listens on every device `ibv_get_device_list` lists, those of
/// `SOFTRDMA_DEVICES` too, which start first (their engines start here if they do not run
/// yet; one that cannot start is skipped, as softrdma's wildcard listen skips a device where
/// another process listens).
///
/// Fails with -1 and `EINVAL` in the wrong state, `EADDRINUSE`.
#[export_name = "softrdma_rdma_listen"]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    on_id(id, |c| {
        // (A wildcard listener starts these before the host's other devices: a program told
        // to use one may have told its peer the port already, as qperf's server does.)
        let first: Vec<_> = crate::verbs::env_devices()
            .into_iter()
            .map(|(_, ip)| ip)
            .collect();
        c.id.listen_starting(backlog, &first).map_err(err)
    })
}

/// `rdma_connect`: sends the connection request (UD: the SIDR request).
///
/// Fails with -1 and `EINVAL` (wrong state, no QP and no `qp_num`, too much private data),
/// or on a synchronous id the errno of the failure (`ECONNREFUSED`, `ETIMEDOUT`).
#[export_name = "softrdma_rdma_connect"]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    on_id(id, |c| {
        if conn_param.is_null() && c.hdr.qp.is_null() && c.id.qp_type() != QpType::Ud {
            return Err(libc::EINVAL);
        }
        let r = c.id.connect(&read_conn_param(conn_param)).map_err(err);
        sync_qp_state(c);
        r
    })
}

/// `rdma_establish`: completes a connection whose id has no QP (after CONNECT_RESPONSE).
///
/// Fails with -1 and `EINVAL` when the id has a QP or no response is pending.
#[export_name = "softrdma_rdma_establish"]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    on_id(id, |c| c.id.establish().map_err(err))
}

/// `rdma_accept`: accepts the connection request of this id.
///
/// Fails with -1 and `EINVAL` (not a request, no QP and no `qp_num`, bad parameters).
#[export_name = "softrdma_rdma_accept"]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    on_id(id, |c| {
        let mut p = read_conn_param(conn_param);
        if conn_param.is_null() {
            p.retry_count = 0;
        }
        let r = c.id.accept(&p).map_err(err);
        sync_qp_state(c);
        r
    })
}

unsafe fn pdata<'a>(p: *const c_void, len: u8) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p as *const u8, len.into())
    }
}

/// `rdma_reject`: rejects the connection request of this id.
///
/// Fails with -1 and `EINVAL` when the id is not a pending request.
#[export_name = "softrdma_rdma_reject"]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    on_id(id, |c| {
        c.id.reject(pdata(private_data, private_data_len))
            .map_err(err)
    })
}

/// `rdma_reject_ece`: rejects with reason 35 (vendor option not supported).
///
/// Fails like `rdma_reject`.
#[export_name = "softrdma_rdma_reject_ece"]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    on_id(id, |c| {
        c.id.reject_ece(pdata(private_data, private_data_len))
            .map_err(err)
    })
}

/// `rdma_set_local_ece`: ECE is not supported by the software device.
///
/// Fails with -1 and `EINVAL` for NULL arguments, else `EOPNOTSUPP`.
#[export_name = "softrdma_rdma_set_local_ece"]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    ret_neg1(|| {
        cid(id)?;
        if ece.is_null() {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}

/// `rdma_get_remote_ece`: ECE is not supported by the software device.
///
/// Fails with -1 and `EINVAL` for NULL arguments, else `EOPNOTSUPP`.
#[export_name = "softrdma_rdma_get_remote_ece"]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    rdma_set_local_ece(id, ece)
}

/// `rdma_disconnect`: moves the QP to ERR and disconnects; DISCONNECTED follows.
///
/// Fails with -1 and `EINVAL` when the id is not connected.
#[export_name = "softrdma_rdma_disconnect"]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    on_id(id, |c| {
        let r = c.id.disconnect().map_err(err);
        sync_qp_state(c);
        r
    })
}

/// `rdma_notify`: `IBV_EVENT_COMM_EST` establishes a passive connection whose RTU is
/// missing; other events are ignored.
///
/// Fails with -1 and `EISCONN` when already established, `EINVAL` otherwise.
#[export_name = "softrdma_rdma_notify"]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: u32) -> c_int {
    const IBV_EVENT_COMM_EST: u32 = softrdma::EventType::CommEst as u32;
    on_id(id, |c| {
        if event != IBV_EVENT_COMM_EST {
            return Ok(());
        }
        c.id.notify(softrdma::EventType::CommEst).map_err(err)
    })
}

/// `rdma_set_option`: TOS, REUSEADDR, AFONLY, ACK_TIMEOUT.
///
/// Fails with -1 and `EINVAL` (NULL, wrong length, wrong state), `ENOSYS` (unknown
/// option), `EOPNOTSUPP` (`RDMA_OPTION_IB_PATH`).
#[export_name = "softrdma_rdma_set_option"]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    on_id(id, |c| {
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        let v = std::slice::from_raw_parts(optval as *const u8, optlen);
        c.id.set_option_raw(level, optname, v).map_err(err)
    })
}

/// `rdma_migrate_id`: moves the id (and its pending events) to `channel`; NULL makes it
/// synchronous.
///
/// Fails with -1 and `EINVAL` for NULL `id`, or an id already synchronous with no channel.
#[export_name = "softrdma_rdma_migrate_id"]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        let ch = CChannel::get_opt(channel)?;
        c.id.migrate_id(ch.as_ref()).map_err(err)?;
        let old = std::mem::replace(&mut c.extra().own_chan, std::ptr::null_mut());
        if channel.is_null() {
            let own = CChannel::new_raw(c.id.channel());
            c.extra().own_chan = own;
            c.hdr.channel = own;
        } else {
            c.hdr.channel = channel;
        }
        if !old.is_null() {
            CChannel::destroy_raw(old);
        }
        Ok(())
    })
}

/// `rdma_init_qp_attr`: the attributes and mask the CM would use to move a QP to
/// `qp_attr->qp_state` (INIT, RTR or RTS).
///
/// Fails with -1 and `EINVAL` (NULL, another state, parameters not known yet).
#[export_name = "softrdma_rdma_init_qp_attr"]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ret_neg1(|| {
        let c = cid(id)?;
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        let state = softrdma::QpState::from_raw((*qp_attr).qp_state).ok_or(libc::EINVAL)?;
        let (a, m) = c.id.init_qp_attr(state).map_err(err)?;
        glue::qp_attr_to_c(&a, qp_attr);
        *qp_attr_mask = m.bits() as c_int;
        Ok(())
    })
}

/// `rdma_get_src_port`: the local port in network byte order (0 while unbound).
#[export_name = "softrdma_rdma_get_src_port"]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || cid(id).map_or(0, |c| c.id.src_port().to_be()))
}

/// `rdma_get_dst_port`: the peer's port in network byte order (0 while unknown).
#[export_name = "softrdma_rdma_get_dst_port"]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || cid(id).map_or(0, |c| c.id.dst_port().to_be()))
}

/// `rdma_get_devices`: a NULL-terminated array of the opened contexts of every device (those
/// of the `SOFTRDMA_DEVICES` addresses too, as `ibv_get_device_list` lists them).
///
/// Fails with NULL and the errno of the device list (`ENOMEM`).
#[export_name = "softrdma_rdma_get_devices"]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    crate::ffi::ret_ptr(|| {
        let mut list = softrdma::rdma_cm::get_devices().map_err(err)?;
        for (_, ip) in crate::verbs::env_devices() {
            if !list.iter().any(|c| c.device().addr() == ip) {
                if let Ok(c) = softrdma::rdma_cm::device_context(ip) {
                    list.push(c);
                }
            }
        }
        let arr = libc::calloc(list.len() + 1, std::mem::size_of::<*mut ibv_context>())
            as *mut *mut ibv_context;
        if arr.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, ctx) in list.iter().enumerate() {
            *arr.add(i) = glue::context_of(ctx);
        }
        if !num_devices.is_null() {
            *num_devices = list.len() as c_int;
        }
        Ok(arr)
    })
}

/// `rdma_free_devices`: frees the array (the contexts stay open).
#[export_name = "softrdma_rdma_free_devices"]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    libc::free(list as *mut c_void);
}

/// `rdma_join_multicast`: joins the group at `addr` as a full member; MULTICAST_JOIN
/// follows with `context` in `param.ud.private_data`.
///
/// Fails with -1 and `EINVAL` (NULL, bad family, unbound id), `EADDRINUSE` (joined).
#[export_name = "softrdma_rdma_join_multicast"]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    on_id(id, |c| {
        let a = sa::from_c(addr)?;
        c.id.join_multicast(a.ip(), context as usize as u64)
            .map_err(err)
    })
}

/// `rdma_join_multicast_ex`: joins with join flags (send-only full member).
///
/// Fails with -1 and `ENOTSUP` for unknown `comp_mask` bits, `EINVAL` (no address, missing
/// or unknown join flags, bad family).
#[export_name = "softrdma_rdma_join_multicast_ex"]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    on_id(id, |c| {
        if mc_join_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let m = &*mc_join_attr;
        let addr = if m.comp_mask & softrdma::rdma_cm::RDMA_CM_JOIN_MC_ATTR_ADDRESS != 0 {
            Some(sa::from_c(m.addr)?.ip())
        } else {
            None
        };
        let attr = JoinMcAttrEx {
            comp_mask: m.comp_mask,
            join_flags: m.join_flags,
            addr,
        };
        c.id.join_multicast_ex(&attr, context as usize as u64)
            .map_err(err)
    })
}

/// `rdma_leave_multicast`: leaves the group (waiting for its events to be acknowledged).
///
/// Fails with -1 and `EINVAL` (NULL, bad family), `EADDRNOTAVAIL` (not joined).
#[export_name = "softrdma_rdma_leave_multicast"]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    on_id(id, |c| {
        let a = sa::from_c(addr)?;
        c.id.leave_multicast(a.ip()).map_err(err)
    })
}
