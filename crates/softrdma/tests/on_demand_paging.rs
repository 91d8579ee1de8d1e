//! On-demand paging over real UDP sockets on loopback (two devices of this test's own):
//! regions registered with ON_DEMAND over memory that is mapped, unmapped and mapped again
//! after registration, implicit regions over the whole address space, `Pd::advise_mr`, and
//! the statuses of accesses to pages that are not there.

#[path = "common/pair.rs"]
mod pair;

use pair::*;
use softrdma::*;

fn x() -> &'static str {
    &pair_addrs().0
}

fn y() -> &'static str {
    &pair_addrs().1
}

const ODP_ALL: u32 = ALL | AccessFlags::ON_DEMAND.bits();

fn page() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `n` pages of fresh anonymous memory of this test's own, unmapped when dropped. A "hole"
/// is an inaccessible page mapped over one of them (`PROT_NONE`, its contents gone): to the
/// device as good as unmapped, while the address range stays reserved, so that no other test
/// of this binary (they run in parallel) gets a mapping there.
struct Pages {
    base: *mut u8,
    n: usize,
}

impl Pages {
    fn new(n: usize) -> Pages {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * page(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Pages { base: p.cast(), n }
    }

    fn at(&self, i: usize) -> *mut u8 {
        assert!(i < self.n);
        self.base.wrapping_add(i * page())
    }

    fn addr(&self, i: usize) -> u64 {
        self.at(i) as u64
    }

    /// Maps a fresh page with protection `prot` over page `i` (no access to it is in
    /// progress).
    fn map(&self, i: usize, prot: libc::c_int) {
        // SAFETY: MAP_FIXED over a page of our own reservation, which nothing references.
        let p = unsafe {
            libc::mmap(
                self.at(i).cast(),
                page(),
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p, self.at(i).cast());
    }

    /// Page `i` becomes a hole.
    fn unmap(&self, i: usize) {
        self.map(i, libc::PROT_NONE);
    }

    /// Page `i` is mapped again, zeroed.
    fn remap(&self, i: usize) {
        self.map(i, libc::PROT_READ | libc::PROT_WRITE);
    }

    /// Page `i` becomes read-only (its contents kept).
    fn read_only(&self, i: usize) {
        // SAFETY: a page of our own.
        assert_eq!(
            unsafe { libc::mprotect(self.at(i).cast(), page(), libc::PROT_READ) },
            0
        );
    }

    /// Reads `len` bytes at page `i`, offset `off` (mapped, and no access in progress).
    fn read(&self, i: usize, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: mapped memory of our own that the device is not writing now.
        unsafe { std::slice::from_raw_parts(self.at(i).add(off), len) }.to_vec()
    }

    /// Whether page `i` is resident (`mincore`).
    fn resident(&self, i: usize) -> bool {
        let mut v = 0u8;
        // SAFETY: one page of our own, one byte of output.
        assert_eq!(
            unsafe { libc::mincore(self.at(i).cast(), page(), &mut v) },
            0
        );
        v & 1 != 0
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: our whole reservation.
        unsafe { libc::munmap(self.base.cast(), self.n * page()) };
    }
}

#[test]
fn the_device_reports_on_demand_paging_for_every_operation() {
    let ctx = Device::from_addr(ip(x())).unwrap().open().unwrap();
    let odp = ctx.query_device().unwrap().odp_caps;
    assert_eq!(odp.general_caps, OdpGeneralCaps::all());
    assert_eq!(odp.rc_odp_caps, OdpTransportCaps::all());
    assert!(odp
        .uc_odp_caps
        .contains(OdpTransportCaps::SEND | OdpTransportCaps::RECV | OdpTransportCaps::WRITE));
    assert!(odp
        .ud_odp_caps
        .contains(OdpTransportCaps::SEND | OdpTransportCaps::RECV));
}

#[test]
fn a_peer_reaches_pages_mapped_after_registration_and_fails_where_none_are() {
    let mem = Pages::new(4);
    mem.unmap(1);
    mem.unmap(2);
    let (a, b) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    // Registered over a hole: with ON_DEMAND nothing is checked now.
    // SAFETY: our mapping, outliving the region; no page goes while an access is in
    // progress.
    let mr = unsafe { b.pd.reg_mr(mem.at(0), 4 * page(), ODP_ALL) }.unwrap();
    let data = pattern(4096, 3);
    a.buf.write(0, &data).unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(0), mr.rkey(), 4096),
        WcStatus::Success
    );
    assert_eq!(mem.read(0, 0, 4096), data);
    // A READ of the mapped last page.
    a.buf.write(0, &[0; 64]).unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaRead, mem.addr(3), mr.rkey(), 64),
        WcStatus::Success
    );
    assert_eq!(
        a.buf.to_vec()[..64].to_vec(),
        vec![0u8; 64],
        "fresh pages read as zero"
    );
    // A WRITE that ends in the hole: a remote access error, as outside the region.
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(1) - 64, mr.rkey(), 128),
        WcStatus::RemAccessErr
    );

    // The page mapped again is reached through the same region.
    mem.remap(1);
    let (a, b2) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    let mr2 = unsafe { b2.pd.reg_mr(mem.at(0), 4 * page(), ODP_ALL) }.unwrap();
    a.buf.write(0, &data).unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(1), mr2.rkey(), 4096),
        WcStatus::Success
    );
    assert_eq!(mem.read(1, 0, 4096), data);
    // A READ from the page still unmapped.
    assert_eq!(
        rdma(&a, WrOpcode::RdmaRead, mem.addr(2), mr2.rkey(), 8),
        WcStatus::RemAccessErr
    );
    drop((mr, b, mr2, b2));
}

#[test]
fn a_peer_reads_a_read_only_page_and_may_not_write_it() {
    let mem = Pages::new(1);
    let data = pattern(256, 5);
    // SAFETY: our page, not accessed by the device now.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mem.at(0), data.len()) };
    mem.read_only(0);
    let (a, b) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    // SAFETY: as above.
    let mr = unsafe { b.pd.reg_mr(mem.at(0), page(), ODP_ALL) }.unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaRead, mem.addr(0), mr.rkey(), 256),
        WcStatus::Success
    );
    assert_eq!(a.buf.to_vec()[..256], data[..]);
    // A WRITE would fault the process on a page it cannot write: it fails instead.
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(0), mr.rkey(), 8),
        WcStatus::RemAccessErr
    );
    assert_eq!(mem.read(0, 0, 256), data);
}

#[test]
fn pages_unmapped_between_two_writes_fail_the_second() {
    // The first WRITE (many packets) has its pages checked ahead; once it is done the
    // program may unmap them, and the next WRITE there (a short one, which goes as a
    // same-host record, or a packet) must fail, not find them checked.
    let mem = Pages::new(4);
    let (a, b) = pair_on(x(), y(), QpType::Rc, 4 * page(), &Opts::default());
    // SAFETY: as above.
    let mr = unsafe { b.pd.reg_mr(mem.at(0), 4 * page(), ODP_ALL) }.unwrap();
    let len = 4 * page();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(0), mr.rkey(), len),
        WcStatus::Success
    );
    mem.unmap(1);
    for _ in 0..2 {
        assert_eq!(
            rdma(&a, WrOpcode::RdmaWrite, mem.addr(0), mr.rkey(), 8),
            WcStatus::Success
        );
    }
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, mem.addr(1) + 8, mr.rkey(), 8),
        WcStatus::RemAccessErr
    );
    drop((mr, b));
}

#[test]
fn local_accesses_to_unmapped_pages_fail_with_a_protection_error() {
    let mem = Pages::new(2);
    mem.unmap(1);
    let (a, b) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    // SAFETY: as above.
    let mr = unsafe { a.pd.reg_mr(mem.at(0), 2 * page(), ODP_ALL) }.unwrap();
    // A SEND from the mapped page arrives; one from the unmapped page fails locally.
    b.post_recv(1, 0, 4096);
    // SAFETY: our mapped page, not being accessed by the device.
    unsafe { std::ptr::write_bytes(mem.at(0), 0x5a, 32) };
    let ok = [Sge {
        addr: mem.addr(0),
        length: 32,
        lkey: mr.lkey(),
    }];
    send(&a, 1, WrOpcode::Send, &ok, |_| {});
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let got = b.wait(1)[0];
    assert_eq!((got.status, got.byte_len), (WcStatus::Success, 32));
    assert_eq!(b.buf.to_vec()[..32].to_vec(), vec![0x5a; 32]);
    b.post_recv(2, 0, 4096);
    let bad = [Sge {
        addr: mem.addr(1),
        length: 32,
        lkey: mr.lkey(),
    }];
    send(&a, 2, WrOpcode::Send, &bad, |_| {});
    assert_eq!(a.wait(1)[0].status, WcStatus::LocProtErr);
}

#[test]
fn an_implicit_region_covers_the_whole_address_space() {
    let (a, b) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    // SAFETY: implicit on-demand paging; the target below is our own live allocation.
    let mr = unsafe { b.pd.reg_mr(std::ptr::null_mut(), usize::MAX, ODP_ALL) }.unwrap();
    assert_eq!((mr.addr(), mr.iova(), mr.length()), (0, 0, u64::MAX));
    let target = Buffer::new(4096);
    let data = pattern(1000, 9);
    a.buf.write(0, &data).unwrap();
    assert_eq!(
        rdma(
            &a,
            WrOpcode::RdmaWrite,
            target.addr() + 100,
            mr.rkey(),
            1000
        ),
        WcStatus::Success
    );
    assert_eq!(target.to_vec()[100..1100], data[..]);
    // Atomics too.
    target.store_u64(0, 40).unwrap();
    send(&a, 6, WrOpcode::AtomicFetchAndAdd, &[a.sge(0, 8)], |w| {
        w.remote_addr = target.addr();
        w.rkey = mr.rkey();
        w.compare_add = 2;
    });
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(target.load_u64(0).unwrap(), 42);
    assert_eq!(a.buf.load_u64(0).unwrap(), 40, "the value before");
    // Address 0's page is never mapped.
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, 64, mr.rkey(), 8),
        WcStatus::RemAccessErr
    );
    // The whole address space only with ON_DEMAND, from address 0, not zero-based.
    let nul = std::ptr::null_mut();
    let e = unsafe { b.pd.reg_mr(nul, usize::MAX, ALL) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let zb = ODP_ALL | AccessFlags::ZERO_BASED.bits();
    let e = unsafe { b.pd.reg_mr(nul, usize::MAX, zb) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = unsafe { b.pd.reg_mr_iova(nul, usize::MAX, 4096, ODP_ALL) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn advise_mr_populates_on_demand_ranges_and_checks_its_arguments() {
    let ctx = Device::from_addr(ip(x())).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let other = ctx.alloc_pd().unwrap();
    let mem = Pages::new(4);
    mem.unmap(1);
    // SAFETY: as above.
    let mr = unsafe { pd.reg_mr(mem.at(0), 4 * page(), ODP_ALL) }.unwrap();
    let ro = AccessFlags::ON_DEMAND.bits() | AccessFlags::REMOTE_READ.bits();
    // SAFETY: as above.
    let read_only = unsafe { pd.reg_mr(mem.at(0), page(), ro) }.unwrap();
    let b = std::sync::Arc::new(Buffer::new(4096));
    let pinned = pd.reg_buffer(&b, ALL).unwrap();
    let sge = |addr: u64, length: u32, lkey: u32| Sge { addr, length, lkey };
    let page = page() as u32;
    let errno =
        |advice, flags, list: &[Sge]| pd.advise_mr(advice, flags, list).map_err(|e| e.errno());
    const FLUSH: u32 = ADVISE_MR_FLAG_FLUSH;

    // The pages are populated: fresh, untouched pages become resident.
    assert!(!mem.resident(2) && !mem.resident(3));
    let two = [
        sge(mem.addr(2), 64, mr.lkey()),
        sge(mem.addr(3), 64, mr.lkey()),
    ];
    assert_eq!(errno(AdviseMr::PrefetchWrite, FLUSH, &two), Ok(()));
    assert!(mem.resident(2) && mem.resident(3));
    assert_eq!(
        errno(AdviseMr::Prefetch, 0, &[sge(mem.addr(0), page, mr.lkey())]),
        Ok(())
    );
    // A hole, or a range past the region: a hint passes over them; with FLUSH, EFAULT,
    // unless NO_FAULT.
    let hole = [sge(mem.addr(0), 3 * page, mr.lkey())];
    let past = [sge(mem.addr(3), 2 * page, mr.lkey())];
    for list in [&hole, &past] {
        assert_eq!(errno(AdviseMr::Prefetch, 0, list), Ok(()));
        assert_eq!(errno(AdviseMr::Prefetch, FLUSH, list), Err(libc::EFAULT));
        assert_eq!(
            errno(AdviseMr::PrefetchWrite, FLUSH, list),
            Err(libc::EFAULT)
        );
        assert_eq!(errno(AdviseMr::PrefetchNoFault, FLUSH, list), Ok(()));
    }
    // Arguments, checked whatever the flags.
    let one = [sge(mem.addr(0), 64, mr.lkey())];
    assert_eq!(errno(AdviseMr::Prefetch, 0, &[]), Err(libc::EINVAL));
    assert_eq!(
        errno(AdviseMr::Prefetch, 2, &one),
        Err(libc::EINVAL),
        "unknown flag"
    );
    let pinned_sge = [sge(b.addr(), 64, pinned.lkey())];
    for flags in [0, FLUSH] {
        assert_eq!(
            errno(AdviseMr::Prefetch, flags, &pinned_sge),
            Err(libc::EINVAL),
            "not ON_DEMAND"
        );
        let ro_sge = [sge(mem.addr(0), 64, read_only.lkey())];
        assert_eq!(errno(AdviseMr::Prefetch, flags, &ro_sge), Ok(()));
        assert_eq!(
            errno(AdviseMr::PrefetchWrite, flags, &ro_sge),
            Err(libc::EPERM)
        );
        assert_eq!(
            other
                .advise_mr(AdviseMr::Prefetch, flags, &one)
                .map_err(|e| e.errno()),
            Err(libc::EINVAL),
            "a region of another PD"
        );
    }
    assert_eq!(AdviseMr::from_raw(3), None);
}
