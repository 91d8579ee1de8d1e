//! Memory regions (`ibv_reg_mr`, `ibv_dereg_mr`) and the one place where the data path checks
//! every access to registered memory.

use crate::error::{DestroyError, Error, Result};
use crate::provider::memory::{maps, on_demand_supported, page_size, populate_pages};
use crate::verbs::hold::Hold;
use crate::verbs::mem::{copy_from_memory, copy_to_memory, Buffer};
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use crate::verbs::wr::Sge;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

bitflags::bitflags! {
    /// `enum ibv_access_flags`: what may be done to a memory region (and, on a QP, what a
    /// remote peer may do).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, READ
        /// responses, atomic results).
        const LOCAL_WRITE = 1 << 0;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into it.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from it.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may perform atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to it ([`crate::Mw`]).
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: keys address the region from 0, not from its address.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging. The range need not be mapped when it
        /// is registered; each operation of the device checks the pages it touches first,
        /// and fails as an access outside the region does where they are not mapped (or not
        /// writable, for a write). See [`Pd::reg_mr`].
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`: the memory is backed by huge pages (a hint; accepted).
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_FLUSH_GLOBAL` (accepted, no effect: FLUSH is not supported).
        const FLUSH_GLOBAL = 1 << 8;
        /// `IBV_ACCESS_FLUSH_PERSISTENT` (accepted, no effect).
        const FLUSH_PERSISTENT = 1 << 9;
        /// `IBV_ACCESS_RELAXED_ORDERING`: an optional hint, accepted and ignored.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// Checks the rules of `ibv_reg_mr`: no unknown bits (`EINVAL`), REMOTE_WRITE and
    /// REMOTE_ATOMIC only with LOCAL_WRITE (`EINVAL`), ON_DEMAND only where the kernel lets
    /// it work (`EOPNOTSUPP`; see `provider::memory::on_demand_supported`).
    pub(crate) fn check_for_mr(self, raw: u32) -> Result<()> {
        if AccessFlags::from_bits(raw).is_none() {
            return Err(Error::invalid(format!(
                "unknown access flag bits {:#x}",
                raw & !AccessFlags::all().bits()
            )));
        }
        if self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !self.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::invalid(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        if self.contains(AccessFlags::ON_DEMAND) && !on_demand_supported() {
            return Err(Error::not_supported(
                "on-demand paging needs MADV_POPULATE_READ/WRITE (Linux 5.14)",
            ));
        }
        Ok(())
    }
}

/// A registered memory region (`struct ibv_mr`).
///
/// Dropping it deregisters it, like [`Mr::dereg`]; either way, once deregistration returns the
/// device no longer touches the memory and no key finds it.
pub struct Mr {
    pub(crate) inner: Arc<MrInner>,
}

const REVOKED: u64 = 1 << 63;

pub(crate) struct MrInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    /// Where the region starts as the keys address it (`iova`; 0 for ZERO_BASED).
    pub(crate) iova: u64,
    /// The host address of the first byte.
    host: *mut u8,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
    /// Registered with ON_DEMAND: every operation checks its pages first, and an access fails
    /// where they are not mapped ([`accessible`]).
    on_demand: bool,
    /// The memory of the safe face, kept alive by the region.
    backing: Option<Arc<Buffer>>,
    /// Whether the region counts as a way for the device to write `backing` (it has
    /// LOCAL_WRITE): released by deregistration, once the device is done with it.
    device_writes: bool,
    /// Accesses in progress, and whether the region is deregistered.
    leases: AtomicU64,
    /// Memory windows bound to the region (deregistration fails while there are any).
    pub(crate) windows: AtomicU32,
    _count: CountGuard,
}

impl MrInner {
    /// Whether `len` bytes at `va` (iova space) lie inside the region (`false` when the end
    /// overflows).
    #[inline]
    pub(crate) fn covers(&self, va: u64, len: u64) -> bool {
        va >= self.iova
            && va
                .checked_add(len)
                .is_some_and(|e| e <= self.iova + self.length)
    }

    /// The host address `off` bytes into the region. (An implicit on-demand region's `host`
    /// is null: its offsets are addresses, of memory the program exposed to the device.)
    fn host_at(&self, off: usize) -> *mut u8 {
        if self.host.is_null() {
            std::ptr::with_exposed_provenance_mut(off)
        } else {
            self.host.wrapping_add(off)
        }
    }
}

// SAFETY: `host` is only dereferenced through the atomic copy routines of `mem`, under a lease
// that deregistration waits for; the memory is either owned (`_backing`) or promised alive by
// the caller of the unsafe registration until deregistration returns.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Pd {
    /// Registers `length` bytes at `addr` (`ibv_reg_mr`); the keys address them from `addr`.
    ///
    /// With ON_DEMAND in `access` (on-demand paging, `IBV_ACCESS_ON_DEMAND`) the range need
    /// not be mapped now: each operation checks the pages it touches before it touches them
    /// (see `accessible`: `PROCMAP_QUERY`, or `madvise` `MADV_POPULATE_READ`/`_WRITE` as a page
    /// fault would populate them) and fails where they are not mapped, or not writable for a
    /// write, as an access outside the region does (`LOC_PROT_ERR` for a local access, a remote access error for a peer's). A null
    /// `addr` with a `length` of `usize::MAX` registers the whole address space (implicit
    /// on-demand paging): the keys then address every byte at its own address.
    ///
    /// Fails with `EINVAL` for a zero length, an address range that overflows, a length above
    /// the device's `max_mr_size` (the whole address space of implicit on-demand paging
    /// aside), implicit on-demand paging with ZERO_BASED or an iova other than 0, unknown
    /// access bits or REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE; `ENOMEM` past `max_mr`.
    ///
    /// # Safety
    /// `addr..addr + length` must stay allocated until the region is deregistered (dropped
    /// or [`Mr::dereg`]), and the program's own accesses to it must not race with the
    /// device's (wait for the completions, as with any RDMA stack). The memory is read and
    /// written only with atomic word copies, so it may be shared with other threads that use
    /// atomics too. With ON_DEMAND the range may be unmapped, mapped again or protected at
    /// will while the device does not access it: not while an operation of this process that
    /// names it is outstanding, nor while a peer may access it (a READ, WRITE or atomic aimed
    /// at it). An access finds a page missing when it begins and fails; a page unmapped while
    /// an access is in progress faults the process, where a NIC's page-fault handling would
    /// fail the access. (Freeing memory a peer may write is a bug anyway: without the unmap,
    /// the write would land in memory put to another use.)
    pub unsafe fn reg_mr(&self, addr: *mut u8, length: usize, access: u32) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { self.reg_mr_iova(addr, length, addr as u64, access) }
    }

    /// Registers `length` bytes at `addr`, which the keys address from `iova`
    /// (`ibv_reg_mr_iova`); with ZERO_BASED in `access`, from 0 whatever `iova` is.
    ///
    /// Fails as [`Pd::reg_mr`] does.
    ///
    /// # Safety
    /// As for [`Pd::reg_mr`].
    pub unsafe fn reg_mr_iova(
        &self,
        addr: *mut u8,
        length: usize,
        iova: u64,
        access: u32,
    ) -> Result<Mr> {
        self.register(addr, length, iova, access, None)
    }

    /// Registers a whole [`Buffer`] (the safe face of `ibv_reg_mr`); the region keeps the
    /// buffer alive, so the device can never touch freed memory.
    ///
    /// Fails as [`Pd::reg_mr`] does (an empty buffer is `EINVAL`), and with `EBUSY` when
    /// `access` has LOCAL_WRITE while a [`crate::verbs::mem::BufferView`] of the buffer is alive
    /// (the device could then write bytes lent as a slice).
    pub fn reg_buffer(&self, buf: &Arc<Buffer>, access: u32) -> Result<Mr> {
        self.register(
            buf.as_ptr(),
            buf.len(),
            buf.addr(),
            access,
            Some(buf.clone()),
        )
    }

    fn register(
        &self,
        addr: *mut u8,
        length: usize,
        iova: u64,
        raw_access: u32,
        backing: Option<Arc<Buffer>>,
    ) -> Result<Mr> {
        let access = AccessFlags::from_bits_truncate(raw_access);
        access.check_for_mr(raw_access)?;
        let shared = self.inner.shared().clone();
        let len = length as u64;
        if len == 0 {
            return Err(Error::invalid("a memory region cannot be empty"));
        }
        let on_demand = access.contains(AccessFlags::ON_DEMAND);
        let implicit = on_demand && addr.is_null() && length == usize::MAX;
        if implicit && (access.contains(AccessFlags::ZERO_BASED) || iova != 0) {
            return Err(Error::invalid(
                "implicit on-demand paging addresses every byte at its own address: no \
                 ZERO_BASED, iova 0",
            ));
        }
        if len > shared.attr.max_mr_size && !implicit {
            return Err(Error::invalid(format!(
                "length {len} exceeds the device's max_mr_size {}",
                shared.attr.max_mr_size
            )));
        }
        if (addr as u64).checked_add(len).is_none() {
            return Err(Error::invalid("the address range overflows"));
        }
        let iova = if access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            iova
        };
        if iova.checked_add(len).is_none() {
            return Err(Error::invalid("the iova range overflows"));
        }
        let count = Resources::acquire(&shared, Kind::Mr)?;
        // A region the device may write through makes the buffer's bytes unlendable (see
        // `mem`): count it, or fail while a view is alive.
        let device_writes = access.contains(AccessFlags::LOCAL_WRITE) && backing.is_some();
        if device_writes {
            if let Some(b) = &backing {
                b.acquire_device_write()?;
            }
        }
        let pd = Hold::new(&self.inner);
        let inner = shared.resources.insert_mr(|lkey, rkey| {
            Arc::new(MrInner {
                pd,
                lkey,
                rkey,
                iova,
                host: addr,
                length: len,
                access,
                on_demand,
                backing,
                device_writes,
                leases: AtomicU64::new(0),
                windows: AtomicU32::new(0),
                _count: count,
            })
        });
        Ok(Mr { inner })
    }
}

/// `enum ibv_advise_mr_advice`: what [`Pd::advise_mr`] does to the pages of on-demand
/// regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AdviseMr {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: populate the pages for reading.
    Prefetch = 0,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: populate the pages for writing.
    PrefetchWrite = 1,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: populate what is mapped already, and leave
    /// the rest without failing.
    PrefetchNoFault = 2,
}

impl AdviseMr {
    /// The advice of its C value, if it is one.
    pub fn from_raw(raw: u32) -> Option<AdviseMr> {
        match raw {
            0 => Some(AdviseMr::Prefetch),
            1 => Some(AdviseMr::PrefetchWrite),
            2 => Some(AdviseMr::PrefetchNoFault),
            _ => None,
        }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH`: [`Pd::advise_mr`] reports ranges it could not populate
/// (without it, as a NIC that prefetches in the background, it does not; it populates before
/// returning either way).
pub const ADVISE_MR_FLAG_FLUSH: u32 = 1 << 0;

impl Pd {
    /// Populates the pages of ranges of on-demand regions of this PD ahead of the accesses
    /// that will need them (`ibv_advise_mr`), each entry a range of the region its lkey
    /// names. The regions are checked first, for every entry; then the pages are populated,
    /// before the call returns. Without [`ADVISE_MR_FLAG_FLUSH`] the advice is a hint, as a
    /// NIC that prefetches in the background makes it: ranges outside their region and pages
    /// that are not mapped are passed over, and the call succeeds. With FLUSH, such a range
    /// fails the call with `EFAULT` (the entries before it populated), except under
    /// PrefetchNoFault, which populates what it can and succeeds either way.
    ///
    /// Fails with `EINVAL` for no entries, flag bits other than FLUSH, an lkey that names no
    /// region of this PD or a region not registered with ON_DEMAND; `EPERM` for PrefetchWrite
    /// on a region without LOCAL_WRITE; `EOPNOTSUPP` where the device offers no on-demand
    /// paging; `EFAULT` as above.
    pub fn advise_mr(&self, advice: AdviseMr, flags: u32, sg_list: &[Sge]) -> Result<()> {
        if flags & !ADVISE_MR_FLAG_FLUSH != 0 {
            return Err(Error::invalid(format!(
                "unknown ibv_advise_mr flag bits {:#x}",
                flags & !ADVISE_MR_FLAG_FLUSH
            )));
        }
        if sg_list.is_empty() {
            return Err(Error::invalid("ibv_advise_mr needs at least one entry"));
        }
        if !on_demand_supported() {
            return Err(Error::not_supported(
                "the device offers no on-demand paging",
            ));
        }
        let write = advice == AdviseMr::PrefetchWrite;
        let res = &self.inner.shared().resources;
        let mut regions = Vec::with_capacity(sg_list.len());
        for (i, sge) in sg_list.iter().enumerate() {
            let mr = res
                .mr_by_lkey::<MrInner>(sge.lkey)
                .filter(|m| Arc::ptr_eq(m.pd.arc(), &self.inner))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "entry {i}: lkey {:#x} names no region of this PD",
                        sge.lkey
                    ))
                })?;
            if !mr.on_demand {
                return Err(Error::invalid(format!(
                    "entry {i}: the region was not registered with ON_DEMAND"
                )));
            }
            if write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::new(
                    crate::error::ErrorKind::PermissionDenied,
                    format!("entry {i}: PREFETCH_WRITE on a region without LOCAL_WRITE"),
                ));
            }
            regions.push(mr);
        }
        let strict = flags & ADVISE_MR_FLAG_FLUSH != 0 && advice != AdviseMr::PrefetchNoFault;
        let fault = |i: usize, sge: &Sge, what: &str| {
            Error::new(
                crate::error::ErrorKind::Os(libc::EFAULT),
                format!("entry {i}: {:#x}+{} {what}", sge.addr, sge.length),
            )
        };
        for (i, (sge, mr)) in sg_list.iter().zip(&regions).enumerate() {
            let len = u64::from(sge.length);
            if !mr.covers(sge.addr, len) {
                if strict {
                    return Err(fault(i, sge, "is outside its region"));
                }
                continue;
            }
            let start = mr.host_at((sge.addr - mr.iova) as usize);
            if populate_pages(start, len as usize, write) {
                continue;
            }
            if strict {
                return Err(fault(i, sge, "has pages that are not mapped"));
            }
            // Page by page, so that what is mapped around what is not is populated.
            let page = page_size() as u64;
            let mut at = 0;
            while at < len {
                let k = (page - (start as u64 + at) % page).min(len - at);
                populate_pages(start.wrapping_add(at as usize), k as usize, write);
                at += k;
            }
        }
        Ok(())
    }
}

impl Pd {
    /// The lkey of a region of this PD that covers `addr..addr + len` (iova space), if any.
    pub(crate) fn lkey_covering(&self, addr: u64, len: u64) -> Option<u32> {
        self.inner
            .shared()
            .resources
            .lkey_where(|m: &MrInner| Arc::ptr_eq(m.pd.arc(), &self.inner) && m.covers(addr, len))
    }
}

impl Mr {
    /// The local key, named in scatter/gather entries (`mr->lkey`).
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    /// The remote key, given to peers for RDMA READ, WRITE and atomics (`mr->rkey`).
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    /// The host address of the first byte (`mr->addr`).
    pub fn addr(&self) -> u64 {
        self.inner.host as u64
    }

    /// Where the keys address the first byte: `addr` unless registered with an iova or
    /// ZERO_BASED.
    pub fn iova(&self) -> u64 {
        self.inner.iova
    }

    /// The length in bytes (`mr->length`).
    pub fn length(&self) -> u64 {
        self.inner.length
    }

    /// The access flags it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// Whether the region belongs to `pd`.
    pub fn in_pd(&self, pd: &Pd) -> bool {
        Arc::ptr_eq(self.inner.pd.arc(), &pd.inner)
    }

    /// Deregisters the region (`ibv_dereg_mr`): removes its keys, then waits for any access
    /// the device has in progress, so that the memory is the caller's again on return.
    ///
    /// Fails with `EINVAL`, giving the region back untouched, while memory windows are bound
    /// to it (IBA 10.6.7.2.6; Linux rxe's errno): invalidate, rebind or deallocate them
    /// first. Dropping the region instead deregisters it anyway, and the windows bound to it
    /// then refuse every access, as their memory is gone.
    pub fn dereg(self) -> std::result::Result<(), DestroyError<Mr>> {
        let n = self.inner.windows.load(Ordering::Acquire);
        if n != 0 {
            return Err(DestroyError {
                object: self,
                error: Error::invalid(format!("{n} memory window(s) are bound to the region")),
            });
        }
        Ok(())
    }

    /// How many memory windows are bound to the region now.
    pub fn bound_windows(&self) -> u32 {
        self.inner.windows.load(Ordering::Acquire)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let m = &self.inner;
        m.pd.shared().resources.remove_mr(m.lkey, m.rkey);
        m.leases.fetch_or(REVOKED, Ordering::AcqRel);
        while m.leases.load(Ordering::Acquire) & !REVOKED != 0 {
            std::thread::yield_now();
        }
        // No access is in progress and no key finds the region: the device can no longer
        // write the buffer through it.
        if m.device_writes {
            if let Some(b) = &m.backing {
                b.release_device_write();
            }
        }
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("length", &self.length())
            .field("lkey", &format_args!("{:#010x}", self.lkey()))
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .field("access", &self.access())
            .finish()
    }
}

/// Resolves `range` against a length, checking it lies inside (`EINVAL`).
fn resolve(range: impl RangeBounds<u64>, len: u64, what: &str) -> Result<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(Error::invalid(format!(
            "range {:?}..{:?} is outside the {len}-byte {what}",
            range.start_bound(),
            range.end_bound()
        ))),
    }
}

/// A range of a local memory region: what a work request names as local memory (a
/// scatter/gather entry), typed so that it cannot outlive or leave its region.
///
/// Made by [`Mr::slice`] (offsets from the region's start) and [`MrSlice::slice`]; it
/// borrows the [`Mr`], so the region cannot be deregistered while a slice of it is in use.
/// It only names memory (address, length, lkey) and never touches it: the device checks
/// every access, as for any scatter/gather entry. `#[repr(transparent)]` over [`Sge`], so a
/// list of slices is a scatter/gather list with no copy ([`MrSlice::as_sges`]).
///
/// ```
/// # use softrdma::*;
/// # use std::sync::Arc;
/// # let addr = softrdma::testing::unique_loopback_addr().into();
/// let ctx = Device::from_addr(addr).unwrap().open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let buf = Arc::new(Buffer::new(4096));
/// let mr = pd.reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits()).unwrap();
/// let header = mr.slice(0..64).unwrap();
/// let body = mr.slice(64..).unwrap();
/// assert_eq!((body.addr(), body.len(), body.lkey()), (mr.iova() + 64, 4032, mr.lkey()));
/// assert_eq!(header.slice(8..16).unwrap().addr(), mr.iova() + 8);
/// assert!(mr.slice(4000..5000).is_err()); // past the end: EINVAL
/// // Two slices are a scatter/gather list for SendWr::send, RecvWr::new, ...
/// let list = [header, body];
/// assert_eq!(MrSlice::as_sges(&list)[1].length, 4032);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct MrSlice<'a> {
    sge: Sge,
    _mr: PhantomData<&'a Mr>,
}

impl Mr {
    /// The bytes `range` (offsets from the region's first byte) as a typed local slice.
    ///
    /// Fails with `EINVAL` when the range is not inside the region or is longer than a
    /// scatter/gather entry can name (`u32::MAX` bytes).
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<MrSlice<'_>> {
        let (s, e) = resolve(range, self.length(), "memory region")?;
        let length = u32::try_from(e - s).map_err(|_| {
            Error::invalid(format!(
                "{} bytes exceed what one scatter/gather entry can name",
                e - s
            ))
        })?;
        Ok(MrSlice {
            sge: Sge {
                addr: self.iova() + s,
                length,
                lkey: self.lkey(),
            },
            _mr: PhantomData,
        })
    }

    /// The whole region as peers name it: its iova, length and rkey, to hand to the peer
    /// (say as private data, [`RemoteMr::to_bytes`]) for its RDMA READs and WRITEs.
    pub fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.iova(),
            len: self.length(),
            rkey: self.rkey(),
        }
    }
}

impl<'a> MrSlice<'a> {
    /// The address of the first byte, as the region's keys name it.
    pub fn addr(&self) -> u64 {
        self.sge.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.sge.length as usize
    }

    /// Whether the slice has no bytes.
    pub fn is_empty(&self) -> bool {
        self.sge.length == 0
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.sge.lkey
    }

    /// The slice as a scatter/gather entry of the faithful face.
    pub fn sge(&self) -> Sge {
        self.sge
    }

    /// A sub-range (offsets from this slice's first byte).
    ///
    /// Fails with `EINVAL` when `range` is not inside the slice.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<MrSlice<'a>> {
        let (s, e) = resolve(range, u64::from(self.sge.length), "slice")?;
        Ok(MrSlice {
            sge: Sge {
                addr: self.sge.addr + s,
                length: (e - s) as u32,
                lkey: self.sge.lkey,
            },
            _mr: PhantomData,
        })
    }

    /// A list of slices as a scatter/gather list, without a copy.
    pub fn as_sges<'s>(slices: &'s [MrSlice<'a>]) -> &'s [Sge] {
        // SAFETY: MrSlice is #[repr(transparent)] over Sge (its other field is a ZST).
        unsafe { std::slice::from_raw_parts(slices.as_ptr().cast::<Sge>(), slices.len()) }
    }

    /// The total length of a list of slices.
    pub(crate) fn total(slices: &[MrSlice<'_>]) -> u64 {
        slices.iter().map(|s| u64::from(s.sge.length)).sum()
    }
}

impl From<MrSlice<'_>> for Sge {
    fn from(s: MrSlice<'_>) -> Sge {
        s.sge
    }
}

/// A peer's memory region, or part of one, as RDMA READ, WRITE and atomics name it: address
/// (in the region's iova space), length and rkey.
///
/// The owner makes it with [`Mr::remote`] and sends it over, e.g. in the private data of
/// `rdma_connect`/`rdma_accept` as [`RemoteMr::to_bytes`]; the peer reads it back with
/// [`RemoteMr::from_bytes`] and names parts of it with the checked [`RemoteMr::slice`].
/// The peer's device checks every access against the region (a bad one completes with
/// `REM_ACCESS_ERR`); the length here lets the local side refuse a too long READ or WRITE
/// at post time instead.
///
/// ```
/// use softrdma::RemoteMr;
/// let r = RemoteMr { addr: 0x7f00_0000_1000, len: 4096, rkey: 0x1234 };
/// let wire = r.to_bytes();
/// assert_eq!(wire.len(), RemoteMr::ENCODED_LEN);
/// // Private data may arrive padded: trailing bytes are ignored.
/// let mut padded = wire.to_vec();
/// padded.resize(56, 0);
/// assert_eq!(RemoteMr::from_bytes(&padded).unwrap(), r);
/// assert!(RemoteMr::from_bytes(&wire[..10]).is_err());
/// let tail = r.slice(4000..).unwrap();
/// assert_eq!((tail.addr, tail.len, tail.rkey), (0x7f00_0000_1000 + 4000, 96, 0x1234));
/// assert!(r.slice(..4097).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteMr {
    /// The address of the first byte, in the region's iova space.
    pub addr: u64,
    /// The length in bytes.
    pub len: u64,
    /// The region's remote key.
    pub rkey: u32,
}

impl RemoteMr {
    /// The length of [`RemoteMr::to_bytes`]: address, length and rkey, big-endian.
    pub const ENCODED_LEN: usize = 20;

    /// The region as 20 bytes (address, length, rkey; big-endian), e.g. for private data.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0; Self::ENCODED_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// Reads a region written by [`RemoteMr::to_bytes`] from the first 20 bytes of `bytes`
    /// (the rest, say private-data padding, is ignored).
    ///
    /// Fails with `EINVAL` when `bytes` is shorter than 20 bytes or the range it names
    /// overflows the address space.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteMr> {
        let Some(b) = bytes.get(..Self::ENCODED_LEN) else {
            return Err(Error::invalid(format!(
                "a RemoteMr takes {} bytes, not {}",
                Self::ENCODED_LEN,
                bytes.len()
            )));
        };
        let r = RemoteMr {
            addr: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            len: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[16..].try_into().expect("4 bytes")),
        };
        if r.addr.checked_add(r.len).is_none() {
            return Err(Error::invalid("the remote range overflows"));
        }
        Ok(r)
    }

    /// A sub-range (offsets from `addr`).
    ///
    /// Fails with `EINVAL` when `range` is not inside the region.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteMr> {
        let (s, e) = resolve(range, self.len, "remote region")?;
        Ok(RemoteMr {
            addr: self
                .addr
                .checked_add(s)
                .ok_or_else(|| Error::invalid("the remote range overflows"))?,
            len: e - s,
            rkey: self.rkey,
        })
    }

    /// Checks that an operation of `len` bytes fits the region (`EINVAL` otherwise).
    pub(crate) fn check_fits(&self, len: u64, what: &str) -> Result<()> {
        if len > self.len {
            return Err(Error::invalid(format!(
                "{what} of {len} bytes does not fit the {}-byte remote region",
                self.len
            )));
        }
        Ok(())
    }
}

/// Which key names the memory: a local key in one of our own work requests, or a remote key
/// in a peer's request.
#[allow(dead_code)] // Remote is used by the responder of the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Local,
    Remote,
}

/// Why an access to registered memory was refused. The data path turns it into
/// `IBV_WC_LOC_PROT_ERR` for a local key and into a remote-access NAK (the requester's
/// `IBV_WC_REM_ACCESS_ERR`) for a remote one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessError {
    /// No region has that key (or it was deregistered).
    InvalidKey,
    /// The region belongs to another protection domain than the QP's.
    WrongPd,
    /// The range is not inside the region (or its end overflows).
    OutOfBounds,
    /// The region was not registered with the access the operation needs.
    AccessDenied,
    /// An atomic operation on an address that is not 8-byte aligned.
    Misaligned,
    /// An on-demand region's pages there are not mapped (or not writable, for a write).
    NotMapped,
}

/// Whether an access that needs `needed` (or is an atomic) writes the memory.
pub(crate) fn writes(needed: AccessFlags, atomic: bool) -> bool {
    atomic
        || needed.intersects(
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
}

/// Whether the device may access `len` bytes at `start` (writing them if `write`) without
/// faulting the process: pages that are not mapped, or not readable (writable), are not. Where
/// the kernel answers `PROCMAP_QUERY` on `/proc/self/maps` (Linux 6.11), one query per mapping
/// in the range: a private anonymous mapping with the permissions passes as is (a page the
/// access touches first is allocated by the fault, as for any memory of the process), other
/// mappings (files, which fault beyond their end, shared memory, the kernel's special
/// mappings) have their pages populated ([`populate_pages`]). Elsewhere every page is
/// populated: a walk of the range's pages, some 90 ns a page here, where a query costs about
/// as much as a whole mapping. (Not seen by the query: guard regions installed inside an
/// anonymous mapping with `MADV_GUARD_INSTALL`, Linux 6.13, which fault the process where a
/// NIC would fail the access.)
fn accessible(start: *mut u8, len: usize, write: bool) -> bool {
    #[cfg(test)]
    tests::POPULATED.with(|c| c.borrow_mut().push((start as u64, len as u64)));
    if len == 0 {
        return true;
    }
    let Some(end) = (start as usize).checked_add(len) else {
        return false;
    };
    let mut at = start as usize;
    while at < end {
        let Some(vma) = maps::query(at) else {
            return populate_pages(std::ptr::without_provenance_mut(at), end - at, write);
        };
        let Some(vma) = vma else {
            return false; // nothing mapped there
        };
        let need = maps::READABLE | if write { maps::WRITABLE } else { 0 };
        if vma.flags & need != need {
            return false;
        }
        let upto = vma.end.min(end as u64) as usize;
        if !vma.private_anonymous()
            && !populate_pages(std::ptr::without_provenance_mut(at), upto - at, write)
        {
            return false;
        }
        at = upto;
    }
    true
}

/// An access to registered memory in progress: the region cannot finish deregistering until
/// the lease is dropped, so the memory is valid for its whole life.
pub(crate) struct MrLease {
    /// The region. Not an `Arc` (two atomic operations fewer per access): a lease is taken
    /// only while the region is not revoked, and the region's `Mr` (which holds an `Arc` to
    /// it) waits in its `drop` until no lease is left, so the region outlives every lease.
    mr: std::ptr::NonNull<MrInner>,
    /// Host address of the first byte of the leased range.
    start: *mut u8,
    len: usize,
}

impl Resources {
    /// [`Resources::check_access_cached`] with no cache (tests).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_access(
        &self,
        key: u32,
        kind: KeyKind,
        pd: &Arc<PdInner>,
        va: u64,
        len: u64,
        needed: AccessFlags,
        atomic: bool,
    ) -> std::result::Result<MrLease, AccessError> {
        self.check_access_cached(
            &mut MrCache::default(),
            key,
            kind,
            pd,
            va,
            len,
            needed,
            atomic,
            SpanUse::None,
        )
    }

    /// The one check of every access to registered memory: `key` must name a live region of
    /// the right kind, in `pd`, covering `va..va + len`, registered with every flag of
    /// `needed` (for a local key, only LOCAL_WRITE is ever needed; local reads are always
    /// allowed). Atomic operations additionally pass `atomic = true` for the 8-byte alignment
    /// rule.
    ///
    /// Through a cache of the last region of each kind (per QP, `cache`): the data path and
    /// inline sends find the region of the next access without the key table's lock. A
    /// cached region that was deregistered fails its lease and is looked up again, so the
    /// cache never extends a region's life as far as accesses go.
    ///
    /// For an on-demand region, `span` says which pages to populate (see [`SpanUse`]): the
    /// cache also keeps, per kind, the range populated for the operation in progress, which
    /// its later packets need not populate again.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn check_access_cached(
        &self,
        cache: &mut MrCache,
        key: u32,
        kind: KeyKind,
        pd: &Arc<PdInner>,
        va: u64,
        len: u64,
        needed: AccessFlags,
        atomic: bool,
        span: SpanUse,
    ) -> std::result::Result<MrLease, AccessError> {
        let (slot, spans) = match kind {
            KeyKind::Local => (&mut cache.local, &mut cache.local_span),
            KeyKind::Remote => (&mut cache.remote, &mut cache.remote_span),
        };
        // (Regions pinned as usual take the short way: the data path's every access.)
        let check = |mr: &Arc<MrInner>, spans: &mut Option<OdpSpan>| {
            if mr.on_demand {
                check_with_span(mr, pd, va, len, needed, atomic, span, spans)
            } else {
                check_region(mr, pd, va, len, needed, atomic, false, None)
            }
        };
        if let Some((k, mr)) = slot {
            if *k == key {
                match check(mr, spans) {
                    Err(AccessError::InvalidKey) => {} // deregistered: look it up again
                    r => return r,
                }
            }
        }
        let mr = match kind {
            KeyKind::Local => self.mr_by_lkey::<MrInner>(key),
            KeyKind::Remote => self.mr_by_rkey::<MrInner>(key),
        }
        .ok_or(AccessError::InvalidKey)?;
        let r = check(&mr, spans);
        *slot = Some((key, mr));
        r
    }
}

/// Which pages of an on-demand region an access populates ([`Resources::check_access_cached`]).
///
/// The program may unmap an on-demand region's pages between operations, but not while an
/// operation that accesses them is in progress ([`Pd::reg_mr`]): pages populated for an
/// operation stay there until it ends. So an operation's accesses populate its pages ahead
/// in growing chunks, and its later packets skip the system call where they fall inside: the
/// first access of a scatter/gather entry populates four times its own length, the check of
/// a READ's or WRITE's message at its first packet the message's pages, and each access that continues right after the chunk populates twice as much again, up to
/// [`SPAN_MAX`] at a time and never past the entry or message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpanUse {
    /// Populate the pages of this access.
    None,
    /// The first access of an operation that will access at most `len` bytes at `start`
    /// (iova space).
    Begin { start: u64, len: u64 },
    /// A later access of the operation whose span was kept.
    Within,
    /// The check of a whole READ or WRITE message at its first packet (no data access): its
    /// pages are populated up to [`SPAN_MAX`] bytes, and kept as the message's span.
    Message,
}

/// The most bytes one access populates ahead (see [`SpanUse`]).
pub(crate) const SPAN_MAX: u64 = 4 << 20;

/// Pages populated for the operation in progress (`start..end` of one region, for reads or
/// writes), and how far the operation may reach (`limit`).
pub(crate) struct OdpSpan {
    mr: Arc<MrInner>,
    start: u64,
    end: u64,
    limit: u64,
    write: bool,
}

/// [`check_region`], populating an on-demand region's pages as `span` says.
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn check_with_span(
    mr: &Arc<MrInner>,
    pd: &Arc<PdInner>,
    va: u64,
    len: u64,
    needed: AccessFlags,
    atomic: bool,
    span: SpanUse,
    kept: &mut Option<OdpSpan>,
) -> std::result::Result<MrLease, AccessError> {
    let write = writes(needed, atomic);
    let own = Some((va, len));
    let Some(end) = va.checked_add(len) else {
        return Err(AccessError::OutOfBounds);
    };
    let region_end = mr.iova.saturating_add(mr.length);
    // The chunk to populate ahead from `va`, and where the operation ends.
    let (chunk, limit) = match span {
        SpanUse::None => return check_region(mr, pd, va, len, needed, atomic, write, own),
        SpanUse::Message => {
            *kept = None;
            let to = va.saturating_add(len.min(SPAN_MAX));
            let l = check_region(mr, pd, va, len, needed, atomic, write, Some((va, to - va)))?;
            *kept = Some(OdpSpan {
                mr: mr.clone(),
                start: va,
                end: to,
                limit: end,
                write,
            });
            return Ok(l);
        }
        SpanUse::Begin { start, len: whole } => {
            *kept = None;
            let limit = start.saturating_add(whole).min(region_end);
            (len.saturating_mul(4), limit)
        }
        SpanUse::Within => match kept.as_ref() {
            Some(s) if Arc::ptr_eq(&s.mr, mr) && (s.write || !write) => {
                if va >= s.start && end <= s.end {
                    return check_region(mr, pd, va, len, needed, atomic, write, None);
                }
                if va != s.end {
                    return check_region(mr, pd, va, len, needed, atomic, write, own);
                }
                ((s.end - s.start).saturating_mul(2), s.limit)
            }
            _ => return check_region(mr, pd, va, len, needed, atomic, write, own),
        },
    };
    let to = va
        .saturating_add(chunk.min(SPAN_MAX))
        .min(limit)
        .max(end)
        .min(region_end.max(end));
    match check_region(mr, pd, va, len, needed, atomic, write, Some((va, to - va))) {
        Ok(l) => {
            *kept = Some(OdpSpan {
                mr: mr.clone(),
                start: va,
                end: to,
                limit,
                write,
            });
            Ok(l)
        }
        // Pages ahead are not mapped: perhaps not the access's own.
        Err(AccessError::NotMapped) if to > end => {
            *kept = None;
            check_region(mr, pd, va, len, needed, atomic, write, own)
        }
        Err(e) => {
            *kept = None;
            Err(e)
        }
    }
}

/// The last region found for each kind of key, per QP, and the on-demand pages populated
/// for the operation in progress of each kind ([`SpanUse`]).
#[derive(Default)]
pub(crate) struct MrCache {
    local: Option<(u32, Arc<MrInner>)>,
    remote: Option<(u32, Arc<MrInner>)>,
    local_span: Option<OdpSpan>,
    remote_span: Option<OdpSpan>,
}

/// Checks PD, access, alignment and bounds of an access to `mr`, and takes a lease on it.
///
/// For an on-demand region, first populates the pages of `populate` (a range in iova space,
/// inside the region; `None`: populated for the operation already), writable if `write`
/// (see [`writes`]), and fails with `NotMapped` where they are not mapped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_region(
    mr: &Arc<MrInner>,
    pd: &Arc<PdInner>,
    va: u64,
    len: u64,
    needed: AccessFlags,
    atomic: bool,
    write: bool,
    populate: Option<(u64, u64)>,
) -> std::result::Result<MrLease, AccessError> {
    if !Arc::ptr_eq(mr.pd.arc(), pd) {
        return Err(AccessError::WrongPd);
    }
    if !mr.access.contains(needed) {
        return Err(AccessError::AccessDenied);
    }
    if atomic && (!va.is_multiple_of(8) || len != 8) {
        return Err(AccessError::Misaligned);
    }
    if !mr.covers(va, len) {
        return Err(AccessError::OutOfBounds);
    }
    let off = (va - mr.iova) as usize;
    // The offset is inside the region (checked above), hence inside the allocation.
    let start = mr.host_at(off);
    if atomic && !(start as usize).is_multiple_of(8) {
        return Err(AccessError::Misaligned);
    }
    if let (true, Some((at, n))) = (mr.on_demand, populate) {
        if !accessible(mr.host_at((at - mr.iova) as usize), n as usize, write) {
            return Err(AccessError::NotMapped);
        }
    }
    let prev = mr.leases.fetch_add(1, Ordering::AcqRel);
    if prev & REVOKED != 0 {
        mr.leases.fetch_sub(1, Ordering::AcqRel);
        return Err(AccessError::InvalidKey);
    }
    Ok(MrLease {
        mr: std::ptr::NonNull::from(&**mr),
        start,
        len: len as usize,
    })
}

impl MrLease {
    /// Length of the leased range.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Host address of the leased range's first byte (valid for reads and writes of
    /// [`MrLease::len`] bytes while the lease lives).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.start
    }

    /// Copies `src` into the leased range at `offset`.
    ///
    /// # Panics
    /// If the copy does not fit the lease: callers size their copies from the lease.
    #[allow(dead_code)]
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(
            offset <= self.len && src.len() <= self.len - offset,
            "write outside the lease"
        );
        // SAFETY: in bounds of a live, leased region (deregistration waits for us).
        unsafe { copy_to_memory(self.start.add(offset), src) }
    }

    /// Copies from the leased range at `offset` into `dst`.
    ///
    /// # Panics
    /// If the copy does not fit the lease.
    #[allow(dead_code)]
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset <= self.len && dst.len() <= self.len - offset,
            "read outside the lease"
        );
        // SAFETY: as in `write`.
        unsafe { copy_from_memory(self.start.add(offset), dst) }
    }

    /// The 8-byte word of an atomic lease, for compare-and-swap and fetch-and-add.
    #[allow(dead_code)]
    pub(crate) fn atomic_word(&self) -> &AtomicU64 {
        assert!(
            self.len == 8 && (self.start as usize).is_multiple_of(8),
            "not an atomic lease"
        );
        // SAFETY: aligned, in bounds and alive for the lease's life, which bounds the borrow.
        unsafe { AtomicU64::from_ptr(self.start.cast()) }
    }
}

impl MrLease {
    /// The lease as a [`Hold`](crate::provider::memory::Hold), which the provider keeps until
    /// a packet that reads the leased memory in place has gone.
    pub(crate) fn into_hold(self) -> crate::provider::memory::Hold {
        // SAFETY: the region outlives its leases (see the field), and this one is handed
        // over: not released here.
        let leases = std::ptr::NonNull::from(&unsafe { self.mr.as_ref() }.leases);
        std::mem::forget(self);
        // SAFETY: as above.
        unsafe { crate::provider::memory::Hold::from_lease(leases) }
    }
}

impl Drop for MrLease {
    fn drop(&mut self) {
        // SAFETY: the region outlives its leases (see the field).
        unsafe { self.mr.as_ref() }
            .leases
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// A registered region to lease in other modules' unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// A context, a PD and a registered 4 KiB buffer.
    pub(crate) struct Region {
        ctx: crate::Context,
        pd: Pd,
        _other: Pd,
        _buf: Arc<crate::Buffer>,
        mr: Mr,
    }

    impl Region {
        pub(crate) fn new() -> Region {
            let (ctx, pd, _other) = crate::testing::context_with_two_pds();
            let buf = Arc::new(crate::Buffer::new(4096));
            let mr = pd.reg_buffer(&buf, 1).unwrap();
            Region {
                ctx,
                pd,
                _other,
                _buf: buf,
                mr,
            }
        }
    }

    /// A lease of the region's first 8 bytes.
    pub(crate) fn lease_of(r: &Region) -> MrLease {
        r.ctx
            .inner
            .shared
            .resources
            .check_access(
                r.mr.lkey(),
                KeyKind::Local,
                &r.pd.inner,
                r.mr.iova(),
                8,
                AccessFlags::empty(),
                false,
            )
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Buffer;

    thread_local! {
        /// The ranges this thread's accesses checked (`accessible`), in order.
        pub(super) static POPULATED: std::cell::RefCell<Vec<(u64, u64)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    fn populated() -> Vec<(u64, u64)> {
        POPULATED.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }

    /// An access of `len` bytes at `va` to `mr` through `cache` (a local write, or a remote
    /// one), as the data path makes it.
    #[allow(clippy::too_many_arguments)]
    fn touch(
        pd: &Pd,
        cache: &mut MrCache,
        mr: &Mr,
        kind: KeyKind,
        va: u64,
        len: u64,
        span: SpanUse,
    ) -> std::result::Result<(), AccessError> {
        let (key, need) = match kind {
            KeyKind::Local => (mr.lkey(), AccessFlags::LOCAL_WRITE),
            KeyKind::Remote => (mr.rkey(), AccessFlags::REMOTE_WRITE),
        };
        let res = &pd.inner.shared().resources;
        res.check_access_cached(cache, key, kind, &pd.inner, va, len, need, false, span)
            .map(drop)
    }

    #[test]
    fn procmap_query_tells_mappings_and_their_permissions() {
        let heap = Box::new([0u8; 64]);
        let Some(vma) = maps::query(heap.as_ptr() as usize) else {
            eprintln!("skipped: this kernel has no PROCMAP_QUERY (Linux 6.11)");
            return;
        };
        let vma = vma.expect("the heap is mapped");
        assert!(vma.flags & (maps::READABLE | maps::WRITABLE) == maps::READABLE | maps::WRITABLE);
        assert!(vma.private_anonymous() && vma.end > heap.as_ptr() as u64);
        assert!(maps::query(64).unwrap().is_none(), "page 0 is never mapped");
        let code = maps::query(setup as *const () as usize).unwrap().unwrap();
        assert!(code.flags & maps::WRITABLE == 0 && !code.private_anonymous());
        // The kernel's special mappings go the careful way.
        let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
        if vdso != 0 {
            assert!(!maps::query(vdso).unwrap().unwrap().private_anonymous());
        }
        // Private anonymous memory is checked without populating; read-only is refused for
        // writes; and a hole refused either way.
        let page = page_size();
        // SAFETY: a fresh mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        assert!(accessible(p, 2 * page, false) && !accessible(p, 2 * page, true));
        // SAFETY: the second page of our mapping.
        assert_eq!(
            unsafe { libc::mprotect(p.add(page).cast(), page, libc::PROT_NONE) },
            0
        );
        assert!(accessible(p, page, false) && !accessible(p, page + 1, false));
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), 2 * page) };
        populated();
    }

    #[test]
    fn a_forked_child_queries_its_own_mappings() {
        if maps::query(setup as *const () as usize).is_none() {
            return; // no PROCMAP_QUERY here
        }
        // SAFETY: the child only maps a page, queries and exits (glibc's fork hands it a
        // usable malloc).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: a fresh mapping the parent does not have.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page_size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let seen = p != libc::MAP_FAILED
                && matches!(maps::query(p as usize), Some(Some(v)) if v.private_anonymous());
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if seen { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:#x}"
        );
    }

    #[test]
    fn an_operation_populates_its_on_demand_pages_ahead_in_growing_chunks() {
        let (_ctx, pd, _other) = setup();
        let page = page_size();
        const N: usize = 64;
        // SAFETY: a fresh private anonymous mapping of our own, unmapped at the end.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                N * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let at = |i: usize| base as u64 + (i * page) as u64;
        // Page 40 is a hole (inaccessible; the range stays ours).
        // SAFETY: a page of our mapping.
        assert_eq!(
            unsafe { libc::mprotect(at(40) as *mut _, page, libc::PROT_NONE) },
            0
        );
        let access = ALL | AccessFlags::ON_DEMAND.bits();
        // SAFETY: our mapping outlives the region (dropped below).
        let mr = unsafe { pd.reg_mr(base.cast(), N * page, access) }.unwrap();
        let mut cache = MrCache::default();
        let p = page as u64;
        let mut go = |va, len, span| touch(&pd, &mut cache, &mr, KeyKind::Local, va, len, span);
        populated();
        // An entry of 32 pages, a page a packet: 4 pages, then 8, then 16 (the entry's end
        // bounds the last), each chunk at the packet that continues past the one before.
        let entry = SpanUse::Begin {
            start: at(0),
            len: 32 * p,
        };
        go(at(0), p, entry).unwrap();
        for i in 1..32 {
            go(at(i), p, SpanUse::Within).unwrap();
        }
        assert_eq!(
            populated(),
            vec![
                (at(0), 4 * p),
                (at(4), 8 * p),
                (at(12), 16 * p),
                (at(28), 4 * p)
            ]
        );
        // An access outside the last chunk that does not continue it (a retransmission from
        // the middle; past the entry) populates its own pages only.
        go(at(2), p, SpanUse::Within).unwrap();
        go(at(33), p, SpanUse::Within).unwrap();
        assert_eq!(populated(), vec![(at(2), p), (at(33), p)]);
        // A chunk ahead over the hole: the access's own pages, and no span kept.
        let entry = SpanUse::Begin {
            start: at(38),
            len: 8 * p,
        };
        go(at(38), p, entry).unwrap();
        assert_eq!(populated(), vec![(at(38), 4 * p), (at(38), p)]);
        assert_eq!(go(at(39), p, SpanUse::Within), Ok(()));
        assert_eq!(go(at(40), 64, SpanUse::Within), Err(AccessError::NotMapped));
        // A new operation's span replaces the last: the pages of the old are populated again.
        let entry = SpanUse::Begin {
            start: at(50),
            len: p,
        };
        go(at(50), p, entry).unwrap();
        go(at(0), p, SpanUse::Within).unwrap();
        assert_eq!(
            populated(),
            vec![(at(39), p), (at(40), 64), (at(50), p), (at(0), p)]
        );
        // A message's check populates the message (up to SPAN_MAX), and its packets inside
        // it nothing; one over the hole fails.
        let remote = |va, len, span| {
            touch(
                &pd,
                &mut MrCache::default(),
                &mr,
                KeyKind::Remote,
                va,
                len,
                span,
            )
        };
        assert_eq!(remote(at(41), 20 * p, SpanUse::Message), Ok(()));
        assert_eq!(
            remote(at(30), 20 * p, SpanUse::Message),
            Err(AccessError::NotMapped)
        );
        assert_eq!(populated(), vec![(at(41), 20 * p), (at(30), 20 * p)]);
        let mut cache = MrCache::default();
        let mut msg = |va, len, span| touch(&pd, &mut cache, &mr, KeyKind::Remote, va, len, span);
        msg(at(0), 16 * p, SpanUse::Message).unwrap();
        for i in 0..16 {
            msg(at(i), p, SpanUse::Within).unwrap();
        }
        assert_eq!(populated(), vec![(at(0), 16 * p)]);
        drop(mr);
        // SAFETY: our mapping, no region on it any more.
        unsafe { libc::munmap(base, N * page) };
    }

    fn setup() -> (crate::Context, Pd, Pd) {
        crate::testing::context_with_two_pds()
    }

    const ALL: u32 = AccessFlags::LOCAL_WRITE.bits()
        | AccessFlags::REMOTE_WRITE.bits()
        | AccessFlags::REMOTE_READ.bits()
        | AccessFlags::REMOTE_ATOMIC.bits();

    #[test]
    fn check_access_checks_key_pd_bounds_access_and_alignment_in_one_place() {
        let (ctx, pd, other) = setup();
        let res = &ctx.inner.shared.resources;
        let b = Arc::new(Buffer::new(64));
        let mr = pd
            .reg_buffer(
                &b,
                (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).bits(),
            )
            .unwrap();
        let base = mr.iova();
        let check = |key, kind, pd: &Pd, va, len, need, atomic| {
            res.check_access(key, kind, &pd.inner, va, len, need, atomic)
                .map(|_| ())
        };
        let none = AccessFlags::empty();
        assert_eq!(
            check(mr.lkey(), KeyKind::Local, &pd, base, 64, none, false),
            Ok(())
        );
        assert_eq!(
            check(mr.rkey(), KeyKind::Local, &pd, base, 8, none, false),
            Err(AccessError::InvalidKey),
            "an rkey is not an lkey"
        );
        assert_eq!(
            check(mr.lkey(), KeyKind::Remote, &pd, base, 8, none, false),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            check(mr.lkey(), KeyKind::Local, &other, base, 8, none, false),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            check(mr.lkey(), KeyKind::Local, &pd, base + 1, 64, none, false),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            check(mr.lkey(), KeyKind::Local, &pd, base - 1, 1, none, false),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            check(mr.lkey(), KeyKind::Local, &pd, u64::MAX, 2, none, false),
            Err(AccessError::OutOfBounds)
        );
        let rr = AccessFlags::REMOTE_READ;
        assert_eq!(
            check(mr.rkey(), KeyKind::Remote, &pd, base, 8, rr, false),
            Ok(())
        );
        let rw = AccessFlags::REMOTE_WRITE;
        assert_eq!(
            check(mr.rkey(), KeyKind::Remote, &pd, base, 8, rw, false),
            Err(AccessError::AccessDenied)
        );
        let atomic_mr = pd.reg_buffer(&b, ALL).unwrap();
        let ra = AccessFlags::REMOTE_ATOMIC;
        let k = atomic_mr.rkey();
        assert_eq!(
            check(k, KeyKind::Remote, &pd, base + 8, 8, ra, true),
            Ok(())
        );
        assert_eq!(
            check(k, KeyKind::Remote, &pd, base + 4, 8, ra, true),
            Err(AccessError::Misaligned)
        );
        assert_eq!(
            check(k, KeyKind::Remote, &pd, base + 8, 4, ra, true),
            Err(AccessError::Misaligned)
        );
        let lkey = mr.lkey();
        drop(mr);
        assert_eq!(
            check(lkey, KeyKind::Local, &pd, base, 8, none, false),
            Err(AccessError::InvalidKey),
            "deregistered"
        );
    }

    #[test]
    fn leases_copy_within_the_region_and_atomics_work_on_the_word() {
        let (ctx, pd, _) = setup();
        let res = &ctx.inner.shared.resources;
        let b = Arc::new(Buffer::new(64));
        let mr = pd.reg_buffer(&b, ALL).unwrap();
        let lease = res
            .check_access(
                mr.rkey(),
                KeyKind::Remote,
                &pd.inner,
                mr.iova() + 16,
                16,
                AccessFlags::REMOTE_WRITE,
                false,
            )
            .unwrap();
        lease.write(3, b"abc");
        let mut out = [0u8; 3];
        lease.read(3, &mut out);
        assert_eq!(&out, b"abc");
        assert_eq!(&b.to_vec()[19..22], b"abc");
        drop(lease);
        let a = res
            .check_access(
                mr.rkey(),
                KeyKind::Remote,
                &pd.inner,
                mr.iova() + 8,
                8,
                AccessFlags::REMOTE_ATOMIC,
                true,
            )
            .unwrap();
        a.atomic_word().fetch_add(5, Ordering::SeqCst);
        assert_eq!(b.load_u64(8).unwrap(), 5);
    }

    #[test]
    fn deregistration_waits_for_accesses_in_progress() {
        let (ctx, pd, _) = setup();
        let b = Arc::new(Buffer::new(64));
        let mr = pd.reg_buffer(&b, ALL).unwrap();
        let lease = ctx
            .inner
            .shared
            .resources
            .check_access(
                mr.lkey(),
                KeyKind::Local,
                &pd.inner,
                mr.iova(),
                8,
                AccessFlags::LOCAL_WRITE,
                false,
            )
            .unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            mr.dereg().unwrap();
            d2.store(true, Ordering::SeqCst);
        });
        // The deregistering thread cannot finish while the lease is held; give it every
        // chance to (a correctness check, not a timing one: it must still be waiting).
        for _ in 0..1000 {
            std::thread::yield_now();
        }
        assert!(!done.load(Ordering::SeqCst));
        lease.write(0, &[1; 8]);
        drop(lease);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}
