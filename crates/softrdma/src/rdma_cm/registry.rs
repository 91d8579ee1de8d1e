//! What the connection manager keeps per process: the devices it uses, the port table, every
//! id, the wildcard listeners, the registry of listeners and connections by device, and the
//! entry point the provider calls when a device engine starts ([`engine_started`]).

use super::event::{CmEventType, ConnParam};
use super::objects::{CmId, IdInner, IdState};
use super::qp_state::qp_to_err;
use super::RDMA_MAX_RESP_RES;
use crate::error::{Error, ErrorKind, Result};
use crate::provider::Provider;
use crate::{Context, Device, Pd};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Contexts and default PDs of the devices the connection manager uses, one per device
/// (`rdma_get_devices`; `rdma_create_qp` with no PD uses the device's default PD).
pub(super) struct DeviceRes {
    pub(super) ctx: Arc<Context>,
    pub(super) pd: Arc<Pd>,
}

pub(super) fn device_res(addr: IpAddr) -> Result<(Arc<Context>, Arc<Pd>)> {
    static DEVS: OnceLock<Mutex<HashMap<IpAddr, DeviceRes>>> = OnceLock::new();
    let mut m = DEVS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = m.get(&addr) {
        return Ok((d.ctx.clone(), d.pd.clone()));
    }
    let ctx = Arc::new(Device::from_addr(addr)?.open()?);
    let pd = Arc::new(ctx.alloc_pd()?);
    m.insert(
        addr,
        DeviceRes {
            ctx: ctx.clone(),
            pd: pd.clone(),
        },
    );
    Ok((ctx, pd))
}

/// The opened contexts of every RDMA device (`rdma_get_devices`); they stay open for the
/// life of the process, as librdmacm keeps them.
///
/// Fails like [`crate::get_device_list`] and [`Device::open`].
pub fn get_devices() -> Result<Vec<Arc<Context>>> {
    crate::get_device_list()?
        .into_iter()
        .map(|d| device_res(d.addr()).map(|(c, _)| c))
        .collect()
}

/// The context the connection manager opened for the device of the local address `addr`
/// (the one ids bound there use; opened on first use and kept for the life of the
/// process, as [`get_devices`] keeps its contexts), for listing a device that
/// [`get_devices`] does not (a loopback alias such as 127.0.0.2).
///
/// Fails like [`Device::from_addr`] (`EADDRNOTAVAIL` for an address of another machine) and
/// [`Device::open`].
pub fn device_context(addr: IpAddr) -> Result<Arc<Context>> {
    device_res(addr).map(|(c, _)| c)
}

/// Opens, as [`device_context`] does, the device of the local address `addr` and starts its
/// engine (its socket and progress thread) now, rather than at its first QP or id: from then
/// on an id listening on the wildcard address listens on this device too (a device where
/// another process listens on that service is skipped, as the wildcard listen skips it).
/// For a device that the host's address list does not give (a loopback alias such as
/// 127.0.0.2, which the drop-in librdmacm lists from `SOFTRDMA_DEVICES`).
///
/// Fails like [`device_context`], and with the error of starting the engine (`EADDRINUSE`
/// when the device's port cannot be shared).
pub fn start_device(addr: IpAddr) -> Result<Arc<Context>> {
    let (ctx, _) = device_res(addr)?;
    ctx.inner.shared.engine()?;
    Ok(ctx)
}

/// Bound ports per port space: (port space, port) → the ids bound there.
pub(super) type PortTable = HashMap<(u16, u16), Vec<PortUse>>;

/// An id's use of a port, as the port checks need it: kept here, under the table's lock,
/// so that checking a port never takes another id's lock (an id checking one holds its own:
/// two ids checking each other's ports at once would wait for each other for ever).
pub(super) struct PortUse {
    pub(super) id: Weak<IdInner>,
    /// The address the id is bound to (unspecified: every device).
    pub(super) ip: IpAddr,
    pub(super) afonly: bool,
    pub(super) reuseaddr: bool,
    /// Whether the id listens.
    pub(super) listening: bool,
}

impl PortUse {
    /// Whether this is the use of id `i`.
    pub(super) fn is(&self, i: &Arc<IdInner>) -> bool {
        std::ptr::eq(self.id.as_ptr(), Arc::as_ptr(i))
    }
}

/// Runs `f` on id `i`'s use of port `port` of its port space, if it has one there.
pub(super) fn update_port_use(i: &Arc<IdInner>, port: u16, f: impl FnOnce(&mut PortUse)) {
    let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(u) = t
        .get_mut(&(i.ps.to_u16(), port))
        .and_then(|v| v.iter_mut().find(|u| u.is(i)))
    {
        f(u);
    }
}

pub(super) fn ports() -> &'static Mutex<PortTable> {
    static P: OnceLock<Mutex<PortTable>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Every live id, for device-wide events (DEVICE_REMOVAL).
pub(super) fn all_ids() -> &'static Mutex<Vec<Weak<IdInner>>> {
    static A: OnceLock<Mutex<Vec<Weak<IdInner>>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(Vec::new()))
}

/// Simulates the removal of the device at `addr` (a NIC unplugged, an rxe link deleted),
/// for testing how an application handles it: every rdma_cm id bound to the device gets
/// RDMA_CM_EVENT_DEVICE_REMOVAL (after which it must be destroyed), its connection is
/// dropped without a DREQ and its QP moved to the error state (flushing its work), and every
/// context of the device opened by the connection manager gets `IBV_EVENT_DEVICE_FATAL`.
/// Wildcard listeners are not bound to one device and get nothing, as in Linux. The device
/// itself stays usable for new ids: this is an injected fault, not a real removal. Returns
/// the number of ids notified.
pub fn inject_device_removal(addr: IpAddr) -> usize {
    let ids: Vec<CmId> = {
        let mut a = all_ids().lock().unwrap_or_else(|p| p.into_inner());
        a.retain(|w| w.strong_count() > 0);
        a.iter()
            .filter_map(Weak::upgrade)
            .map(|inner| CmId { inner })
            .collect()
    };
    let mut n = 0;
    for id in ids {
        let (qp, conn, engine) = {
            let mut s = id.inner.lock();
            let bound = s.ctx.as_ref().is_some_and(|c| c.device().addr() == addr);
            if !bound || s.state == IdState::Gone {
                continue;
            }
            s.state = IdState::Disconnected;
            s.conn_error = true;
            (s.qp.clone(), s.conn, s.engine.clone())
        };
        if let Some(qp) = qp {
            qp_to_err(&qp);
        }
        if let (Some(conn), Some(engine)) = (conn, engine) {
            // The device is gone: its CM forgets the connection (no DREQ reaches the peer
            // from a removed device; the peer's QP times out or its CM sees nothing).
            registry().conns.remove(&(addr, conn.0));
            id.inner.lock().conn = None;
            engine.with_cm(|g, _| g.cm.abandon(conn));
        }
        id.post(CmEventType::DeviceRemoval, 0, ConnParam::default(), None);
        n += 1;
    }
    if let Ok((ctx, _)) = device_res(addr) {
        ctx.inner.async_events.raise(
            crate::EventType::DeviceFatal,
            crate::AsyncElement::Device,
            None,
        );
    }
    n
}

/// Wildcard listeners by service ID: engines started after `rdma_listen` listen for them too.
pub(super) type Wildcards = Mutex<Vec<(u64, Weak<IdInner>)>>;

pub(super) fn wildcards() -> &'static Wildcards {
    static W: OnceLock<Wildcards> = OnceLock::new();
    W.get_or_init(|| Mutex::new(Vec::new()))
}

/// A device engine has started: it listens for the wildcard listeners of its family.
pub(super) fn engine_started(engine: &Arc<dyn Provider>) {
    let ip = engine.local().ip();
    let live: Vec<(u64, Arc<IdInner>)> = {
        let mut w = wildcards().lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|(_, l)| l.strong_count() > 0);
        w.iter()
            .filter_map(|(sid, l)| l.upgrade().map(|l| (*sid, l)))
            .collect()
    };
    for (sid, l) in live {
        let fits = {
            let s = l.lock();
            s.state == IdState::Listen
                && s.src
                    .is_some_and(|a| a.is_ipv4() == ip.is_ipv4() || !s.afonly)
        };
        if !fits {
            continue;
        }
        let mut r = registry();
        let list = r.listeners.entry((ip, sid)).or_default();
        list.retain(|w| w.strong_count() > 0);
        if list
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&l)))
        {
            continue;
        }
        let first = list.is_empty();
        list.push(Arc::downgrade(&l));
        drop(r);
        if first {
            if let Err(err) = engine.cm_listen(sid) {
                // Another process listens on the service on this device: the wildcard
                // listener does not get it there.
                tracing::debug!(error = %err, ip = %engine.local().ip(), "wildcard listen");
            }
        }
    }
}

/// Connection-manager ids by (device address, communication ID), and listeners by
/// (device address, service ID).
#[derive(Default)]
pub(super) struct Registry {
    pub(super) conns: HashMap<(IpAddr, u32), Weak<IdInner>>,
    /// Listening ids by (device address, service ID): the device's CM listens on the service
    /// ID while this list is not empty.
    pub(super) listeners: HashMap<(IpAddr, u64), Vec<Weak<IdInner>>>,
}

impl Registry {
    /// Takes the listening id `inner` off the listeners of service `sid` (and the ids gone
    /// meanwhile); returns the device addresses where nobody listens on it any more.
    pub(super) fn forget_listener(&mut self, sid: u64, inner: &Arc<IdInner>) -> Vec<IpAddr> {
        let mut idle = Vec::new();
        for ((ip, s2), v) in self.listeners.iter_mut() {
            if *s2 != sid {
                continue;
            }
            v.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(inner)));
            if v.is_empty() {
                idle.push(*ip);
            }
        }
        for ip in &idle {
            self.listeners.remove(&(*ip, sid));
        }
        idle
    }
}

pub(super) fn registry_mutex() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default()))
}

/// Registry keys of ids dropped while the registry was locked (see `IdInner::drop`).
pub(super) fn orphans() -> &'static Mutex<Vec<(IpAddr, u32)>> {
    static O: OnceLock<Mutex<Vec<(IpAddr, u32)>>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(Vec::new()))
}

pub(super) fn registry() -> std::sync::MutexGuard<'static, Registry> {
    let mut r = registry_mutex().lock().unwrap_or_else(|p| p.into_inner());
    let keys = std::mem::take(&mut *orphans().lock().unwrap_or_else(|p| p.into_inner()));
    for key in keys {
        // Only a dead entry: the key may name a newer id by now.
        if r.conns.get(&key).is_some_and(|w| w.strong_count() == 0) {
            r.conns.remove(&key);
        }
    }
    r
}

pub(super) fn random_psn() -> u32 {
    crate::gid::random_u32() & 0xff_ffff
}

pub(super) fn resources(p: u8, max: u32) -> u8 {
    if p == RDMA_MAX_RESP_RES {
        max.min(255) as u8
    } else {
        p
    }
}

pub(super) fn errno_err(errno: i32, msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::Os(errno), msg)
}
