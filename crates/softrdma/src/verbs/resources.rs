//! The per-device state every context opened on the same device shares ([`DeviceShared`]:
//! the device, its attributes, its engine), with its resource tables: memory keys, QP
//! numbers, multicast groups and object counts.
//!
//! Keys and QP numbers come from the operating system's CSPRNG (`getrandom`), so that a peer
//! cannot guess another connection's rkey or QP number from its own.

use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::provider::Provider;
use crate::verbs::device::{device_attr, Device, DeviceAttr};
use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

/// The per-device state every context on the same address shares.
pub(crate) struct DeviceShared {
    pub(crate) device: Device,
    pub(crate) attr: DeviceAttr,
    pub(crate) resources: Resources,
    /// How many receive queues this process spreads its RC and UC QPs of the device over
    /// (see [`crate::Context::set_receive_queues`]).
    queues: AtomicU8,
    /// The RC and UC QPs created so far (which queue the next one takes).
    spread: AtomicU32,
    /// Queues that could not start (bit per queue): their QPs go to queue 0.
    failed: AtomicU32,
}

impl DeviceShared {
    /// The device engine (its UDP socket and progress thread), started on first use.
    ///
    /// Fails with `EADDRINUSE` when a socket that does not share it (another user's process,
    /// another program, a kernel RoCE device) holds UDP port 4791 on the device's address.
    pub(crate) fn engine(&self) -> Result<Arc<dyn Provider>> {
        crate::provider::open(self.device.addr(), self.device.ifindex())
    }

    /// The engine if it has started.
    pub(crate) fn engine_if_started(&self) -> Option<Arc<dyn Provider>> {
        crate::provider::if_open(self.device.addr())
    }

    /// Receive queue `queue` of the device (0: [`DeviceShared::engine`]), started on first use;
    /// fails like [`DeviceShared::engine`].
    pub(crate) fn engine_queue(&self, queue: u8) -> Result<Arc<dyn Provider>> {
        crate::provider::open_queue(self.device.addr(), self.device.ifindex(), queue)
    }

    /// The receive queue a new QP of type `qp_type` takes: RC and UC QPs in turn over the
    /// device's queues, UD QPs queue 0 (which holds the multicast groups).
    pub(crate) fn pick_queue(&self, qp_type: crate::QpType) -> u8 {
        let n = u32::from(self.queues.load(Ordering::Relaxed).max(1));
        if n == 1 || !matches!(qp_type, crate::QpType::Rc | crate::QpType::Uc) {
            return 0;
        }
        let q = (self.spread.fetch_add(1, Ordering::Relaxed) % n) as u8;
        if self.failed.load(Ordering::Relaxed) & (1 << q) != 0 {
            return 0;
        }
        q
    }

    /// Records that receive queue `queue` could not start: later QPs that would take it
    /// take queue 0 without trying again.
    pub(crate) fn queue_failed(&self, queue: u8) {
        self.failed
            .fetch_or(1 << u32::from(queue), Ordering::Relaxed);
    }

    /// Sets how many receive queues later RC and UC QPs are spread over.
    pub(crate) fn set_queues(&self, n: u8) -> Result<()> {
        if n == 0 || n > crate::provider::MAX_QUEUES {
            return Err(Error::invalid(format!(
                "{n} receive queues: a device has 1 to {} in a process",
                crate::provider::MAX_QUEUES
            )));
        }
        self.queues.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// How many receive queues later RC and UC QPs are spread over.
    pub(crate) fn queues(&self) -> u8 {
        self.queues.load(Ordering::Relaxed)
    }
}

static SHARED: OnceLock<Mutex<HashMap<IpAddr, Weak<DeviceShared>>>> = OnceLock::new();

impl DeviceShared {
    /// The live shared state of `dev`, created on first open.
    pub(crate) fn get(dev: &Device) -> Arc<DeviceShared> {
        let map = SHARED.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(&dev.info.addr).and_then(Weak::upgrade) {
            return s;
        }
        let attr = device_attr(dev);
        let s = Arc::new(DeviceShared {
            device: dev.clone(),
            resources: Resources::new(&attr),
            attr,
            queues: AtomicU8::new(crate::provider::default_queues()),
            spread: AtomicU32::new(0),
            failed: AtomicU32::new(0),
        });
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(dev.info.addr, Arc::downgrade(&s));
        s
    }
}

/// A kind of object whose number per device is limited by [`DeviceAttr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Pd,
    Mr,
    Cq,
    Qp,
    Srq,
    Ah,
    Mw,
}

pub(crate) struct Resources {
    limits: [u32; 7],
    counts: [AtomicU32; 7],
    /// Memory regions by lkey and by rkey.
    lkeys: RwLock<HashMap<u32, Entry>>,
    rkeys: RwLock<HashMap<u32, Entry>>,
    /// Memory windows by index (the upper 24 bits of their rkeys, which no region's rkey
    /// shares). Lock order: `lkeys`, `rkeys`, `mws`.
    mws: RwLock<HashMap<u32, Entry>>,
    /// QP numbers in use.
    qpns: Mutex<std::collections::HashSet<u32>>,
    /// Multicast groups and the QP numbers attached to each.
    mcast: Mutex<HashMap<Gid, Vec<u32>>>,
}

use crate::gid::random_u32;

/// A memory region or window as the key tables hold it: type-erased, because the tables sit
/// below the objects they hold (a region holds its PD, which holds its context, which holds
/// this state). Each lookup names the type it expects (`MrInner`, `MwInner`) and finds
/// nothing of another type.
type Entry = Arc<dyn Any + Send + Sync>;

/// The entry as the type the caller expects, if it is one.
fn typed<T: Any + Send + Sync>(e: &Entry) -> Option<Arc<T>> {
    e.clone().downcast::<T>().ok()
}

/// The first QP number handed to ordinary QPs (0 and 1 are the special QPs; IBTA reserves
/// the first few, and rxe starts at 16).
pub(crate) const MIN_QPN: u32 = 16;
pub(crate) use crate::provider::MULTICAST_QPN;

/// Holds one unit of a counted resource until dropped.
#[derive(Debug)]
pub(crate) struct CountGuard {
    shared: Arc<DeviceShared>,
    kind: Kind,
}

impl Drop for CountGuard {
    fn drop(&mut self) {
        self.shared.resources.counts[self.kind as usize].fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Resources {
    pub(crate) fn new(attr: &DeviceAttr) -> Self {
        Resources {
            limits: [
                attr.max_pd,
                attr.max_mr,
                attr.max_cq,
                attr.max_qp,
                attr.max_srq,
                attr.max_ah,
                attr.max_mw,
            ],
            counts: Default::default(),
            lkeys: RwLock::new(HashMap::new()),
            rkeys: RwLock::new(HashMap::new()),
            mws: RwLock::new(HashMap::new()),
            qpns: Mutex::new(Default::default()),
            mcast: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one unit of `kind`, failing with `ENOMEM` when the device limit is reached.
    pub(crate) fn acquire(shared: &Arc<DeviceShared>, kind: Kind) -> Result<CountGuard> {
        let r = &shared.resources;
        let limit = r.limits[kind as usize];
        let c = &r.counts[kind as usize];
        let mut cur = c.load(Ordering::Acquire);
        loop {
            if cur >= limit {
                return Err(Error::no_memory(format!(
                    "the device already has the most {kind:?} objects it allows ({limit})"
                )));
            }
            match c.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Ok(CountGuard {
                        shared: shared.clone(),
                        kind,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Picks an unused, unpredictable QP number in `MIN_QPN..MULTICAST_QPN` whose bits
    /// 16..23 are `slot`, the process's slot on the shared device (the device steers packets
    /// to processes by that byte); 2^16 numbers per process, less those taken.
    ///
    /// Fails with `ENOMEM` when no number is free (which the QP limit prevents in practice).
    pub(crate) fn alloc_qpn(&self, slot: u8) -> Result<u32> {
        let mut used = self.qpns.lock().unwrap_or_else(|p| p.into_inner());
        let base = u32::from(slot) << 16;
        for _ in 0..(1 << 20) {
            let qpn = base | (random_u32() & 0xffff);
            if (MIN_QPN..MULTICAST_QPN).contains(&qpn) && used.insert(qpn) {
                return Ok(qpn);
            }
        }
        Err(Error::no_memory("no free QP number in this process's slot"))
    }

    /// Returns a QP number to the pool.
    pub(crate) fn free_qpn(&self, qpn: u32) {
        self.qpns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
    }

    /// Enters a memory region under fresh, unpredictable, distinct, non-zero keys, which the
    /// closure receives to build the region with.
    pub(crate) fn insert_mr<M: Any + Send + Sync>(
        &self,
        build: impl FnOnce(u32, u32) -> Arc<M>,
    ) -> Arc<M> {
        let mut lkeys = self.lkeys.write().unwrap_or_else(|p| p.into_inner());
        let mut rkeys = self.rkeys.write().unwrap_or_else(|p| p.into_inner());
        let mws = self.mws.read().unwrap_or_else(|p| p.into_inner());
        let (lkey, rkey) = loop {
            let l = random_u32();
            let r = random_u32();
            if l != 0
                && r != 0
                && l != r
                && !lkeys.contains_key(&l)
                && !rkeys.contains_key(&r)
                && !mws.contains_key(&(r >> 8))
            {
                break (l, r);
            }
        };
        let mr = build(lkey, rkey);
        lkeys.insert(lkey, mr.clone());
        rkeys.insert(rkey, mr.clone());
        mr
    }

    /// Removes a memory region's keys: from now on no lookup finds it.
    pub(crate) fn remove_mr(&self, lkey: u32, rkey: u32) {
        self.lkeys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lkey);
        self.rkeys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&rkey);
    }

    /// The region registered under `lkey`.
    pub(crate) fn mr_by_lkey<M: Any + Send + Sync>(&self, lkey: u32) -> Option<Arc<M>> {
        self.lkeys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lkey)
            .and_then(typed)
    }

    /// The lkey of the first region for which `pred` holds, if any (a walk over every
    /// region: for the rare post that names no region).
    pub(crate) fn lkey_where<M: Any + Send + Sync>(
        &self,
        pred: impl Fn(&M) -> bool,
    ) -> Option<u32> {
        self.lkeys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, m)| m.downcast_ref::<M>().is_some_and(&pred))
            .map(|(k, _)| *k)
    }

    /// The region registered under `rkey`.
    pub(crate) fn mr_by_rkey<M: Any + Send + Sync>(&self, rkey: u32) -> Option<Arc<M>> {
        self.rkeys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rkey)
            .and_then(typed)
    }

    /// Enters a memory window under a fresh, unpredictable index (the upper 24 bits of its
    /// rkeys) that no other window and no region's rkey uses; the closure builds the window
    /// from the index.
    pub(crate) fn insert_mw<W: Any + Send + Sync>(
        &self,
        build: impl FnOnce(u32) -> Arc<W>,
    ) -> Arc<W> {
        let rkeys = self.rkeys.read().unwrap_or_else(|p| p.into_inner());
        let mut mws = self.mws.write().unwrap_or_else(|p| p.into_inner());
        let index = loop {
            let i = random_u32() >> 8;
            if i != 0
                && !mws.contains_key(&i)
                && !(0..=0xff).any(|k| rkeys.contains_key(&((i << 8) | k)))
            {
                break i;
            }
        };
        let mw = build(index);
        mws.insert(index, mw.clone());
        mw
    }

    /// Removes a memory window: from now on no rkey finds it.
    pub(crate) fn remove_mw(&self, index: u32) {
        self.mws
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&index);
    }

    /// The memory window whose rkeys have `index` in their upper 24 bits.
    pub(crate) fn mw_by_index<W: Any + Send + Sync>(&self, index: u32) -> Option<Arc<W>> {
        self.mws
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
            .and_then(typed)
    }

    /// Adds `qpn` to the group `gid`, within the device's multicast limits (`ENOMEM`).
    pub(crate) fn mcast_attach(&self, gid: Gid, qpn: u32, attr: &DeviceAttr) -> Result<()> {
        let mut groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        if !groups.contains_key(&gid) && groups.len() >= attr.max_mcast_grp as usize {
            return Err(Error::no_memory(format!(
                "the device already has {} multicast groups (max_mcast_grp)",
                attr.max_mcast_grp
            )));
        }
        let total: usize = groups.values().map(Vec::len).sum();
        if total >= attr.max_total_mcast_qp_attach as usize {
            return Err(Error::no_memory(
                "the device has max_total_mcast_qp_attach attachments",
            ));
        }
        let members = groups.entry(gid).or_default();
        if members.len() >= attr.max_mcast_qp_attach as usize {
            return Err(Error::no_memory(format!(
                "the group {gid} already has {} QPs (max_mcast_qp_attach)",
                attr.max_mcast_qp_attach
            )));
        }
        members.push(qpn);
        Ok(())
    }

    /// Removes `qpn` from the group `gid` (no-op if absent).
    pub(crate) fn mcast_detach(&self, gid: Gid, qpn: u32) {
        let mut groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = groups.get_mut(&gid) {
            m.retain(|&q| q != qpn);
            if m.is_empty() {
                groups.remove(&gid);
            }
        }
    }

    /// The QP numbers attached to the group `gid`.
    #[allow(dead_code)]
    pub(crate) fn mcast_members(&self, gid: &Gid) -> Vec<u32> {
        self.mcast
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(gid)
            .cloned()
            .unwrap_or_default()
    }
}
