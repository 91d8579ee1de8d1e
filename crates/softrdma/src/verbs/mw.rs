//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`,
//! `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`): remote access to part of a memory region
//! under a key of its own, granted and revoked without registering memory.
//!
//! A window's rkey is its index (upper 24 bits, fixed for its life) and a key byte (lower 8
//! bits) chosen at each bind, so an rkey handed out before a rebind or an invalidation stops
//! working. Type 1 windows are bound with [`crate::Qp::bind_mw`] (a send-queue operation
//! whose new key byte is the old one plus one) and unbound by a zero-length bind; type 2
//! windows (type 2B: tied to the QP that bound them) are bound with a BIND_MW work request
//! naming the whole new rkey and unbound by LOCAL_INV or a peer's SEND with invalidate.
//!
//! Binds and invalidations are carried out in send-queue order by the data path, as
//! [`Resources::execute_bind`] and [`Resources::invalidate`]; the responder checks a
//! window's rkey in [`Resources::check_window`] (key, PD, type-2 QP, window bounds and
//! access), then the access goes through the region's own check and lease, so a window
//! never reaches memory its region would not, and never after the region is deregistered.
//! A bound window holds its region; [`crate::Mr::dereg`] refuses (`EINVAL`) while any is
//! bound.

use crate::error::{DestroyError, Error, Result};
use crate::verbs::hold::Hold;
use crate::verbs::mr::{check_region, AccessError, AccessFlags, Mr, MrInner, MrLease};
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use crate::verbs::wr::SendFlags;
use softrdma_proto::transport::{MwBind as TpBind, WcStatus};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with [`crate::Qp::bind_mw`], usable from any QP of the PD,
    /// unbound by a zero-length bind; never invalidated.
    Type1 = 1,
    /// `IBV_MW_TYPE_2`: bound with an `IBV_WR_BIND_MW` work request, reachable only through
    /// the QP that bound it (type 2B), invalidated by LOCAL_INV or SEND with invalidate.
    Type2 = 2,
}

impl MwType {
    /// The type with the verbs number `n` (`None` for anything but 1 and 2).
    pub fn from_raw(n: u32) -> Option<MwType> {
        match n {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
}

/// A memory window (`struct ibv_mw`).
///
/// Dropping it deallocates it, like [`Mw::dealloc`]: a bound window is unbound and its rkey
/// stops working.
pub struct Mw {
    pub(crate) inner: Arc<MwInner>,
}

pub(crate) struct MwInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) mw_type: MwType,
    /// The upper 24 bits of every rkey of the window.
    pub(crate) index: u32,
    /// Never reused: tells this window from a later one with the same index.
    uid: u64,
    /// The rkey as the program sees it (`mw->rkey`): the one its last posted bind asked for.
    posted_rkey: AtomicU32,
    state: Mutex<MwState>,
    _count: CountGuard,
}

struct MwState {
    /// The rkey that reaches the window now.
    rkey: u32,
    bound: Option<Binding>,
}

/// What a bound window grants.
struct Binding {
    /// The region, held (its `windows` count includes this binding).
    mr: Arc<MrInner>,
    /// First address of the window in the region's address space.
    addr: u64,
    length: u64,
    access: AccessFlags,
    /// Type 2: the QP that bound it (its `uid`).
    qp: Option<u64>,
}

impl Drop for Binding {
    fn drop(&mut self) {
        self.mr.windows.fetch_sub(1, Ordering::AcqRel);
    }
}

static NEXT_MW_UID: AtomicU64 = AtomicU64::new(1);

/// Access flags a bind may ask for: the remote ones, ZERO_BASED, and LOCAL_WRITE and
/// MW_BIND, which mean nothing for a window and are ignored.
const MW_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND)
    .union(AccessFlags::ZERO_BASED);

impl Pd {
    /// Allocates a memory window (`ibv_alloc_mw`), unbound: a type 1 window's rkey reaches
    /// nothing until [`crate::Qp::bind_mw`] binds it; a type 2 window waits for a BIND_MW
    /// work request.
    ///
    /// Fails with `ENOMEM` when the device already has `max_mw` windows.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let shared = self.inner.shared().clone();
        let count = Resources::acquire(&shared, Kind::Mw)?;
        let pd = Hold::new(&self.inner);
        let key = (crate::gid::random_u32() & 0xff) as u8;
        let inner = shared.resources.insert_mw(|index| {
            let rkey = (index << 8) | u32::from(key);
            Arc::new(MwInner {
                pd,
                mw_type,
                index,
                uid: NEXT_MW_UID.fetch_add(1, Ordering::Relaxed),
                posted_rkey: AtomicU32::new(rkey),
                state: Mutex::new(MwState { rkey, bound: None }),
                _count: count,
            })
        });
        Ok(Mw { inner })
    }
}

impl MwInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, MwState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle a bind request names the window by: its uid and index.
    pub(crate) fn handle(&self) -> u64 {
        (self.uid << 32) | u64::from(self.index)
    }
}

impl Mw {
    /// The rkey (`mw->rkey`): the one the last bind posted on it asked for (a type 1
    /// window's is updated by [`crate::Qp::bind_mw`] when it posts; a type 2 window's by a
    /// posted BIND_MW request). Peers reach the window with it once that bind is done.
    pub fn rkey(&self) -> u32 {
        self.inner.posted_rkey.load(Ordering::Acquire)
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.inner.mw_type
    }

    /// Whether the window belongs to `pd`.
    pub fn in_pd(&self, pd: &Pd) -> bool {
        Arc::ptr_eq(self.inner.pd.arc(), &pd.inner)
    }

    /// Whether a bind is in force now (a bind that completed and was not undone).
    pub fn is_bound(&self) -> bool {
        self.inner.lock().bound.is_some()
    }

    /// Deallocates the window (`ibv_dealloc_mw`); a bound window is unbound first, so its
    /// rkey stops working and its region may be deregistered.
    ///
    /// Never fails; the `Result` keeps the verbs contract.
    pub fn dealloc(self) -> std::result::Result<(), DestroyError<Mw>> {
        Ok(())
    }

    pub(crate) fn set_posted_rkey(&self, rkey: u32) {
        self.inner.posted_rkey.store(rkey, Ordering::Release);
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let m = &self.inner;
        m.pd.shared().resources.remove_mw(m.index);
        m.lock().bound = None;
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.inner.mw_type)
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .finish()
    }
}

/// `struct ibv_mw_bind_info`: what a bind grants.
#[derive(Debug, Clone, Copy, Default)]
pub struct MwBindInfo<'a> {
    /// The region to bind to (`None` with `length` 0: unbind a type 1 window).
    pub mr: Option<&'a Mr>,
    /// The window's first address, in the region's address space (its iova).
    pub addr: u64,
    /// The window's length; 0 unbinds a type 1 window.
    pub length: u64,
    /// `ibv_access_flags`: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED (type 2).
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind`: a type 1 bind ([`crate::Qp::bind_mw`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct MwBind<'a> {
    /// Returned in the completion (`IBV_WC_BIND_MW`).
    pub wr_id: u64,
    /// SIGNALED and FENCE are honoured.
    pub send_flags: SendFlags,
    /// What to bind.
    pub bind_info: MwBindInfo<'a>,
}

/// The `bind_mw` member of a BIND_MW work request ([`crate::SendWr::bind_mw`]).
#[derive(Debug, Clone, Copy)]
pub struct BindMwWr<'a> {
    /// The window.
    pub mw: &'a Mw,
    /// The rkey the window gets: its index stays, the low 8 bits are taken.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: MwBindInfo<'a>,
}

impl MwBindInfo<'_> {
    /// The transport's form of a bind of `mw` to this, under `rkey`.
    pub(crate) fn to_transport(self, mw: &Mw, rkey: u32) -> TpBind {
        TpBind {
            mw: mw.inner.handle(),
            rkey,
            lkey: self.mr.map_or(0, |m| m.lkey()),
            addr: self.addr,
            length: if self.mr.is_some() { self.length } else { 0 },
            access: self.mw_access_flags,
        }
    }
}

/// The rkey after `rkey` (`ibv_inc_rkey`): the same index, the key byte plus one.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl Resources {
    /// Carries out a bind that reached the head of the send queue of the QP `qp` (in `pd`):
    /// every rule of IBA 10.6.7 as Linux rxe applies them. Fails with `MW_BIND_ERR` for a
    /// window deallocated since, of another PD than the QP (C10-72) or the region, a type 1
    /// window asked for ZERO_BASED, a type 2 window already bound or bound with no region
    /// or length, a region that is gone, ZERO_BASED or lacks MW_BIND (C10-73), remote write
    /// or atomic access on a region without LOCAL_WRITE (C10-74), a window outside the
    /// region (C10-75), or an unknown access bit.
    pub(crate) fn execute_bind(
        &self,
        b: &TpBind,
        pd: &Arc<PdInner>,
        qp: u64,
    ) -> std::result::Result<(), WcStatus> {
        const ERR: std::result::Result<(), WcStatus> = Err(WcStatus::MwBindErr);
        let index = (b.mw & 0xffff_ffff) as u32;
        let Some(mw) = self
            .mw_by_index::<MwInner>(index)
            .filter(|m| m.uid == b.mw >> 32)
        else {
            return ERR;
        };
        if !Arc::ptr_eq(mw.pd.arc(), pd) {
            return ERR;
        }
        let Some(access) = AccessFlags::from_bits(b.access) else {
            return ERR;
        };
        if !MW_ACCESS.contains(access) {
            return ERR;
        }
        let zero_based = access.contains(AccessFlags::ZERO_BASED);
        let type2 = mw.mw_type == MwType::Type2;
        if !type2 && zero_based {
            return ERR;
        }
        let mr = if b.length > 0 {
            let Some(mr) = self.mr_by_lkey::<MrInner>(b.lkey) else {
                return ERR;
            };
            if !Arc::ptr_eq(mr.pd.arc(), mw.pd.arc())
                || !mr.access.contains(AccessFlags::MW_BIND)
                || mr.access.contains(AccessFlags::ZERO_BASED)
                || (access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                    && !mr.access.contains(AccessFlags::LOCAL_WRITE))
                || !mr.covers(b.addr, b.length)
            {
                return ERR;
            }
            Some(mr)
        } else {
            None
        };
        if type2 && mr.is_none() {
            return ERR;
        }
        let mut st = mw.lock();
        if type2 && st.bound.is_some() {
            return ERR;
        }
        st.rkey = (mw.index << 8) | (b.rkey & 0xff);
        st.bound = mr.map(|mr| {
            mr.windows.fetch_add(1, Ordering::AcqRel);
            Binding {
                mr,
                addr: b.addr,
                length: b.length,
                access,
                qp: type2.then_some(qp),
            }
        });
        Ok(())
    }

    /// Invalidates the type 2 window `rkey` names, for a QP in `pd` (`qp`: the QP a SEND
    /// with invalidate arrived on, which must be the one that bound the window; `None` for
    /// LOCAL_INV). Fails when no window has that rkey now (a region's rkey included: regions
    /// cannot be invalidated), the window is type 1 (o10-37.2.26), unbound, of another PD or
    /// bound through another QP.
    pub(crate) fn invalidate(
        &self,
        rkey: u32,
        pd: &Arc<PdInner>,
        qp: Option<u64>,
    ) -> std::result::Result<(), ()> {
        let mw = self.mw_by_index::<MwInner>(rkey >> 8).ok_or(())?;
        if mw.mw_type != MwType::Type2 || !Arc::ptr_eq(mw.pd.arc(), pd) {
            return Err(());
        }
        let mut st = mw.lock();
        match &st.bound {
            Some(b) if st.rkey == rkey && (qp.is_none() || b.qp == qp) => {}
            _ => return Err(()),
        }
        st.bound = None;
        Ok(())
    }

    /// The check of a remote access through a window: `rkey` must be the window's current
    /// rkey, the window bound, in `pd`, bound by the QP `qp` if type 2, granting `needed`,
    /// with `va..va + len` inside it (from 0 for a ZERO_BASED window); then the region's
    /// own check (PD, bounds, alignment, deregistration) takes the lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_window(
        &self,
        rkey: u32,
        pd: &Arc<PdInner>,
        qp: u64,
        va: u64,
        len: u64,
        needed: AccessFlags,
        atomic: bool,
    ) -> std::result::Result<MrLease, AccessError> {
        let mw = self
            .mw_by_index::<MwInner>(rkey >> 8)
            .ok_or(AccessError::InvalidKey)?;
        let (mr, mr_va) = {
            let st = mw.lock();
            let b = st.bound.as_ref().ok_or(AccessError::InvalidKey)?;
            if st.rkey != rkey {
                return Err(AccessError::InvalidKey);
            }
            if !Arc::ptr_eq(mw.pd.arc(), pd) {
                return Err(AccessError::WrongPd);
            }
            if b.qp.is_some_and(|q| q != qp) {
                return Err(AccessError::InvalidKey);
            }
            if !b.access.contains(needed) {
                return Err(AccessError::AccessDenied);
            }
            let base = if b.access.contains(AccessFlags::ZERO_BASED) {
                0
            } else {
                b.addr
            };
            let end = va.checked_add(len).ok_or(AccessError::OutOfBounds)?;
            if va < base || end > base + b.length {
                return Err(AccessError::OutOfBounds);
            }
            (b.mr.clone(), b.addr + (va - base))
        };
        // (The window's access, checked above, says what the access does to the memory.)
        let write = crate::verbs::mr::writes(needed, atomic);
        check_region(
            &mr,
            pd,
            mr_va,
            len,
            AccessFlags::empty(),
            atomic,
            write,
            Some((mr_va, len)),
        )
    }
}

impl Error {
    /// `EPERM` with `msg`.
    pub(crate) fn permission(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
        Error::new(crate::ErrorKind::PermissionDenied, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Buffer, Context};

    const ALL: u32 = AccessFlags::LOCAL_WRITE.bits()
        | AccessFlags::REMOTE_WRITE.bits()
        | AccessFlags::REMOTE_READ.bits()
        | AccessFlags::REMOTE_ATOMIC.bits()
        | AccessFlags::MW_BIND.bits();
    const RW: u32 = AccessFlags::REMOTE_WRITE.bits() | AccessFlags::REMOTE_READ.bits();

    /// A context of its own, two PDs, and a 4 KiB region in the first with every access.
    fn setup() -> (Context, Pd, Pd, Arc<Buffer>, Mr) {
        let (ctx, pd, other) = crate::testing::context_with_two_pds();
        let buf = Arc::new(Buffer::new(4096));
        let mr = pd.reg_buffer(&buf, ALL).unwrap();
        (ctx, pd, other, buf, mr)
    }

    fn bind(mw: &Mw, mr: &Mr, off: u64, len: u64, access: u32, key: u32) -> TpBind {
        MwBindInfo {
            mr: Some(mr),
            addr: mr.iova() + off,
            length: len,
            mw_access_flags: access,
        }
        .to_transport(mw, key)
    }

    /// The rules a type 2 window adds: it answers only the QP that bound it, only in its
    /// PD, and only invalidations through that QP (remote) or its PD (local) undo it.
    #[test]
    fn type2_windows_answer_only_their_qp_and_pd() {
        let (ctx, pd, other, _buf, mr) = setup();
        let res = &ctx.inner.shared.resources;
        let mw = pd.alloc_mw(MwType::Type2).unwrap();
        let k = inc_rkey(mw.rkey());
        let b = bind(&mw, &mr, 0, 1024, RW, k);
        assert_eq!(
            res.execute_bind(&b, &other.inner, 7),
            Err(WcStatus::MwBindErr),
            "a QP of another PD (C10-72)"
        );
        res.execute_bind(&b, &pd.inner, 7).unwrap();
        let w = AccessFlags::REMOTE_WRITE;
        let check = |rkey, pd: &Pd, qp, va, len, need| {
            res.check_window(rkey, &pd.inner, qp, va, len, need, false)
                .map(drop)
        };
        let base = mr.iova();
        assert_eq!(check(k, &pd, 7, base, 1024, w), Ok(()));
        assert_eq!(
            check(k, &pd, 8, base, 8, w),
            Err(AccessError::InvalidKey),
            "another QP (type 2B)"
        );
        assert_eq!(check(k, &other, 7, base, 8, w), Err(AccessError::WrongPd));
        assert_eq!(
            check(k ^ 1, &pd, 7, base, 8, w),
            Err(AccessError::InvalidKey),
            "another key byte"
        );
        assert_eq!(
            check(k, &pd, 7, base + 1020, 8, w),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            check(k, &pd, 7, base, 8, AccessFlags::REMOTE_ATOMIC),
            Err(AccessError::AccessDenied)
        );
        assert_eq!(
            res.invalidate(k, &pd.inner, Some(8)),
            Err(()),
            "a SEND with invalidate on another QP"
        );
        assert_eq!(res.invalidate(k, &other.inner, None), Err(()));
        assert_eq!(res.invalidate(mr.rkey(), &pd.inner, None), Err(()));
        assert_eq!(mr.bound_windows(), 1);
        res.invalidate(k, &pd.inner, Some(7)).unwrap();
        assert_eq!(mr.bound_windows(), 0);
        assert_eq!(res.invalidate(k, &pd.inner, Some(7)), Err(()), "twice");
        assert_eq!(check(k, &pd, 7, base, 8, w), Err(AccessError::InvalidKey));
    }

    /// Type 1 windows answer any QP of their PD and cannot be invalidated; the window may
    /// not extend past its region, whose PD must be the window's.
    #[test]
    fn type1_windows_and_region_rules() {
        let (ctx, pd, other, buf, mr) = setup();
        let res = &ctx.inner.shared.resources;
        let foreign = other.reg_buffer(&buf, ALL).unwrap();
        let mw = pd.alloc_mw(MwType::Type1).unwrap();
        let k = inc_rkey(mw.rkey());
        let err = Err(WcStatus::MwBindErr);
        assert_eq!(
            res.execute_bind(&bind(&mw, &foreign, 0, 8, RW, k), &pd.inner, 1),
            err
        );
        assert_eq!(
            res.execute_bind(&bind(&mw, &mr, 4000, 200, RW, k), &pd.inner, 1),
            err
        );
        assert_eq!(
            res.execute_bind(&bind(&mw, &mr, 0, 8, 1 << 15, k), &pd.inner, 1),
            err,
            "unknown access bit"
        );
        res.execute_bind(&bind(&mw, &mr, 0, 4096, RW, k), &pd.inner, 1)
            .unwrap();
        let w = AccessFlags::REMOTE_WRITE;
        for qp in [1, 2, 3] {
            assert!(res
                .check_window(k, &pd.inner, qp, mr.iova(), 8, w, false)
                .is_ok());
        }
        assert_eq!(res.invalidate(k, &pd.inner, None), Err(()));
        assert_eq!(res.invalidate(k, &pd.inner, Some(1)), Err(()));
    }
}
