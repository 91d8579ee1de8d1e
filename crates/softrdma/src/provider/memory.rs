//! Reads and writes of memory the program shares with the device (registered memory): copies,
//! and the CRC-32 of such memory in place, for the ICRC of a packet whose payload goes to the
//! kernel straight from the program's memory (see `tx::TxBatch`).
//!
//! The program may read and write that memory while the device does (that is the device's
//! contract), so none of these accesses may be an ordinary Rust load or store, which racing
//! with another access would be undefined behaviour: they are relaxed atomic accesses or
//! `asm!` blocks, whose accesses are the hardware's (a race yields some mix of old and new
//! bytes, which is what a NIC's DMA gives a racing program too).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Copies of at least this many bytes to or from shared memory go through [`rep_movsb`].
#[cfg(target_arch = "x86_64")]
const ASM_COPY_MIN: usize = 128;

/// Copies `n` bytes from `src` to `dst` with one `rep movsb` (the CPU's fast string copy).
///
/// Why an instruction rather than `ptr::copy`: the memory may be read or written by the
/// program at the same time (that is the device's contract), and a plain copy racing with
/// another access is undefined behaviour in Rust's memory model, while word-by-word atomic
/// copies (the fallback below) run at a fraction of memory speed. An `asm!` block is opaque
/// to the compiler: its accesses are the hardware's, where a race yields some mix of old and
/// new bytes, which is what a NIC's DMA gives a racing program too.
///
/// # Safety
/// `src..src + n` valid for reads and `dst..dst + n` for writes for the whole call; the two
/// ranges do not overlap.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn rep_movsb(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller's contract; the direction flag is clear on entry to asm (the ABI),
    // and `rep movsb` changes no flags and touches no stack.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Copies `src` into memory the device shares, starting at `dst`.
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes for the whole call, and every concurrent
/// access to it must go through these routines (or be otherwise atomic).
pub(crate) unsafe fn copy_to_memory(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= ASM_COPY_MIN {
        // SAFETY: the caller's contract; `src` is a distinct live slice.
        unsafe { rep_movsb(dst, src.as_ptr(), src.len()) };
        return;
    }
    let mut i = 0;
    let n = src.len();
    // Bytes up to the first 8-aligned destination address.
    while i < n && !(dst as usize + i).is_multiple_of(8) {
        // SAFETY: in bounds per the caller's contract; AtomicU8 needs no alignment.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(src[i], Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        let w = u64::from_ne_bytes(src[i..i + 8].try_into().expect("8 bytes"));
        // SAFETY: dst + i is 8-aligned and in bounds per the caller's contract.
        unsafe { AtomicU64::from_ptr(dst.add(i).cast()) }.store(w, Ordering::Relaxed);
        i += 8;
    }
    while i < n {
        // SAFETY: as above.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(src[i], Ordering::Relaxed);
        i += 1;
    }
}

/// Copies memory the device shares, starting at `src`, into `dst`.
///
/// # Safety
/// `src..src + dst.len()` must be valid for reads for the whole call, and every concurrent
/// write to it must go through these routines (or be otherwise atomic).
pub(crate) unsafe fn copy_from_memory(src: *const u8, dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= ASM_COPY_MIN {
        // SAFETY: the caller's contract; `dst` is a distinct live slice.
        unsafe { rep_movsb(dst.as_mut_ptr(), src, dst.len()) };
        return;
    }
    let mut i = 0;
    let n = dst.len();
    let src = src.cast_mut();
    while i < n && !(src as usize + i).is_multiple_of(8) {
        // SAFETY: in bounds per the caller's contract; only loads are performed.
        dst[i] = unsafe { AtomicU8::from_ptr(src.add(i)) }.load(Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        // SAFETY: src + i is 8-aligned and in bounds per the caller's contract.
        let w = unsafe { AtomicU64::from_ptr(src.add(i).cast()) }.load(Ordering::Relaxed);
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: as above.
        dst[i] = unsafe { AtomicU8::from_ptr(src.add(i)) }.load(Ordering::Relaxed);
        i += 1;
    }
}

/// A hold on registered memory: one lease of its region (the count its deregistration waits
/// to see at zero), released when dropped. Keeps the memory a packet's gap reads valid until
/// the packet has gone (see `tx::TxBatch`).
pub(crate) struct Hold {
    leases: std::ptr::NonNull<AtomicU64>,
}

impl Hold {
    /// Takes over one lease counted in `leases`.
    ///
    /// # Safety
    /// `leases` counts a lease the caller hands over (it will not release it itself), and
    /// stays valid until that lease is released: the region's deregistration waits for it.
    pub(crate) unsafe fn from_lease(leases: std::ptr::NonNull<AtomicU64>) -> Hold {
        Hold { leases }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // SAFETY: valid until this lease is released (`from_lease`).
        unsafe { self.leases.as_ref() }.fetch_sub(1, Ordering::AcqRel);
    }
}

// SAFETY: a counter of atomic operations, which any thread may release.
unsafe impl Send for Hold {}

/// Whether [`crc32_of_memory`] runs at the speed of a CRC over an ordinary slice here (the
/// CPU has carry-less multiplication): otherwise it copies the memory through a buffer, and
/// sending a payload from the program's memory gains nothing over copying it into the packet.
pub(crate) fn crc32_in_place() -> bool {
    // (The standard library keeps what the CPU has: each check is a load.)
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CRC-32 (IEEE 802.3, the function of zlib and `crc32fast`) of `len` bytes of shared
/// memory at `src`, continuing from `crc`: the value `crc32fast::Hasher::finalize` gives for
/// the bytes hashed so far (0 for none). The result is what that hasher would give after
/// hashing these bytes too.
///
/// # Safety
/// `src..src + len` must be valid for reads for the whole call, and every concurrent write to
/// it must go through the routines of this module (or be otherwise atomic). A concurrent
/// write makes the result that of some mix of old and new bytes.
pub(crate) unsafe fn crc32_of_memory(crc: u32, src: *const u8, len: usize) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if len >= FOLD_MIN && crc32_in_place() {
        if len >= fold::WIDE_MIN && fold::wide() {
            // SAFETY: the caller's contract; the CPU has the features (checked).
            return unsafe { fold::crc32_wide(crc, src, len) };
        }
        // SAFETY: the caller's contract; the CPU has the features (checked above).
        return unsafe { fold::crc32(crc, src, len) };
    }
    // SAFETY: the caller's contract.
    unsafe { crc32_through_buffer(crc, src, len) }
}

/// Shorter memory is copied out and hashed: the folding loop starts with 64 bytes.
#[cfg(target_arch = "x86_64")]
const FOLD_MIN: usize = 64;

/// [`crc32_of_memory`] by copies of up to 4 KiB onto the stack.
///
/// # Safety
/// As [`crc32_of_memory`].
unsafe fn crc32_through_buffer(crc: u32, src: *const u8, len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    let mut buf = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len());
        // SAFETY: in bounds per the caller's contract.
        unsafe { copy_from_memory(src.add(done), &mut buf[..n]) };
        h.update(&buf[..n]);
        done += n;
    }
    h.finalize()
}

/// The CRC-32 folded 64 bytes at a time with carry-less multiplication (the method of Intel's
/// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", for the bit-reflected
/// polynomial), or 256 at a time in 512-bit registers where the CPU has AVX-512 and
/// VPCLMULQDQ, every load of the memory an `asm!` block.
///
/// Folding a 128-bit lane `D` bits on multiplies its low half by x^(D+32) and its high half
/// by x^(D-32), both modulo the polynomial and bit-reflected (shifted left once), and adds
/// the products to the lane `D` bits further.
#[cfg(target_arch = "x86_64")]
mod fold {
    use std::arch::x86_64::{
        __m128i, __m512i, _mm512_castsi512_si128, _mm512_clmulepi64_epi128,
        _mm512_extracti32x4_epi32, _mm512_set_epi64, _mm512_xor_si512, _mm_clmulepi64_si128,
        _mm_cvtsi32_si128, _mm_set_epi64x, _mm_storeu_si128, _mm_xor_si128,
    };

    /// Memory this long or longer is folded 256 bytes at a time where the CPU can.
    pub(super) const WIDE_MIN: usize = 512;

    /// x^(4·128+32) and x^(4·128-32) modulo the polynomial, bit-reflected: folding 512 bits on.
    const K1: i64 = 0x1_5444_2bd4;
    const K2: i64 = 0x1_c6e4_1596;
    /// x^(128+32) and x^(128-32) modulo the polynomial, bit-reflected: folding 128 bits on.
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;

    /// Folding 2,048 bits on (four 512-bit registers).
    const K2048_LO: i64 = 0x1_1542_778a;
    const K2048_HI: i64 = 0x1_322d_1430;

    /// Whether the CPU folds in 512-bit registers (AVX-512F and VPCLMULQDQ).
    pub(super) fn wide() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }

    /// 64 bytes of shared memory at `p`.
    ///
    /// # Safety
    /// `p..p + 64` valid for reads; the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load64(p: *const u8) -> __m512i {
        let v: __m512i;
        // SAFETY: the caller's contract; an unaligned 64-byte load, no flags, no stack.
        unsafe {
            std::arch::asm!(
                "vmovdqu64 {v}, [{p}]",
                p = in(reg) p,
                v = out(zmm_reg) v,
                options(nostack, preserves_flags, readonly, pure)
            );
        }
        v
    }

    /// [`fold_onto`] of every 128-bit lane of `a` onto the same lane of `b`.
    #[inline(always)]
    fn fold_onto_wide(a: __m512i, b: __m512i, keys: __m512i) -> __m512i {
        // SAFETY: `crc32_wide` enables AVX-512F and VPCLMULQDQ for its whole body, which
        // this is inlined into.
        unsafe {
            let lo = _mm512_clmulepi64_epi128(a, keys, 0x00);
            let hi = _mm512_clmulepi64_epi128(a, keys, 0x11);
            _mm512_xor_si512(_mm512_xor_si512(b, lo), hi)
        }
    }

    /// [`crc32`] 256 bytes at a time; `len` is at least 256.
    ///
    /// # Safety
    /// As [`super::crc32_of_memory`], and the CPU has AVX-512F, VPCLMULQDQ, PCLMULQDQ and
    /// SSE4.1.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) unsafe fn crc32_wide(crc: u32, mut p: *const u8, mut len: usize) -> u32 {
        debug_assert!(len >= 256);
        // SAFETY: every load is within `p..p + len` (the caller's contract).
        unsafe {
            let seed = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(!crc));
            let mut z0 = _mm512_xor_si512(load64(p), seed);
            let mut z1 = load64(p.add(64));
            let mut z2 = load64(p.add(128));
            let mut z3 = load64(p.add(192));
            p = p.add(256);
            len -= 256;
            let k2048 = _mm512_set_epi64(
                K2048_HI, K2048_LO, K2048_HI, K2048_LO, K2048_HI, K2048_LO, K2048_HI, K2048_LO,
            );
            while len >= 256 {
                z0 = fold_onto_wide(z0, load64(p), k2048);
                z1 = fold_onto_wide(z1, load64(p.add(64)), k2048);
                z2 = fold_onto_wide(z2, load64(p.add(128)), k2048);
                z3 = fold_onto_wide(z3, load64(p.add(192)), k2048);
                p = p.add(256);
                len -= 256;
            }
            let k512 = _mm512_set_epi64(K2, K1, K2, K1, K2, K1, K2, K1);
            let mut z = fold_onto_wide(z0, z1, k512);
            z = fold_onto_wide(z, z2, k512);
            z = fold_onto_wide(z, z3, k512);
            while len >= 64 {
                z = fold_onto_wide(z, load64(p), k512);
                p = p.add(64);
                len -= 64;
            }
            // The four lanes, 16 consecutive bytes each, folded into one as 128-bit blocks.
            let k3k4 = _mm_set_epi64x(K4, K3);
            let mut x = fold_onto(
                _mm512_castsi512_si128(z),
                _mm512_extracti32x4_epi32(z, 1),
                k3k4,
            );
            x = fold_onto(x, _mm512_extracti32x4_epi32(z, 2), k3k4);
            x = fold_onto(x, _mm512_extracti32x4_epi32(z, 3), k3k4);
            finish(x, p, len)
        }
    }

    /// 16 bytes of shared memory at `p`.
    ///
    /// # Safety
    /// `p..p + 16` valid for reads.
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m128i {
        let v: __m128i;
        // SAFETY: the caller's contract; an unaligned 16-byte load, no flags, no stack.
        unsafe {
            std::arch::asm!(
                "movdqu {v}, [{p}]",
                p = in(reg) p,
                v = out(xmm_reg) v,
                options(nostack, preserves_flags, readonly, pure)
            );
        }
        v
    }

    /// `a` folded onto `b`: a·x^k modulo the polynomial, added to `b`.
    #[inline(always)]
    fn fold_onto(a: __m128i, b: __m128i, keys: __m128i) -> __m128i {
        // SAFETY: `crc32` enables pclmulqdq for its whole body, which this is inlined into.
        unsafe {
            let lo = _mm_clmulepi64_si128(a, keys, 0x00);
            let hi = _mm_clmulepi64_si128(a, keys, 0x11);
            _mm_xor_si128(_mm_xor_si128(b, lo), hi)
        }
    }

    /// See [`super::crc32_of_memory`]; `len` is at least 64.
    ///
    /// # Safety
    /// As there, and the CPU has pclmulqdq and SSE4.1.
    #[target_feature(enable = "pclmulqdq", enable = "sse4.1")]
    pub(super) unsafe fn crc32(crc: u32, mut p: *const u8, mut len: usize) -> u32 {
        debug_assert!(len >= 64);
        // SAFETY: every load is of 16 bytes within `p..p + len` (the caller's contract).
        unsafe {
            let mut x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(!crc as i32));
            let mut x1 = load(p.add(16));
            let mut x2 = load(p.add(32));
            let mut x3 = load(p.add(48));
            p = p.add(64);
            len -= 64;
            let k1k2 = _mm_set_epi64x(K2, K1);
            while len >= 64 {
                x0 = fold_onto(x0, load(p), k1k2);
                x1 = fold_onto(x1, load(p.add(16)), k1k2);
                x2 = fold_onto(x2, load(p.add(32)), k1k2);
                x3 = fold_onto(x3, load(p.add(48)), k1k2);
                p = p.add(64);
                len -= 64;
            }
            let k3k4 = _mm_set_epi64x(K4, K3);
            let mut x = fold_onto(x0, x1, k3k4);
            x = fold_onto(x, x2, k3k4);
            x = fold_onto(x, x3, k3k4);
            finish(x, p, len)
        }
    }

    /// The CRC from 128 folded bits `x` and the `len` bytes left at `p`.
    ///
    /// # Safety
    /// `p..p + len` valid for reads; the CPU has PCLMULQDQ and SSE4.1 (the caller's).
    #[inline(always)]
    unsafe fn finish(mut x: __m128i, mut p: *const u8, mut len: usize) -> u32 {
        // SAFETY: the caller's contract.
        unsafe {
            let k3k4 = _mm_set_epi64x(K4, K3);
            while len >= 16 {
                x = fold_onto(x, load(p), k3k4);
                p = p.add(16);
                len -= 16;
            }
            // What is left: the CRC, from a zero register, of the 128 folded bits and then
            // of the last bytes (a zero register is a hasher's state of all ones).
            let mut folded = [0u8; 16];
            _mm_storeu_si128(folded.as_mut_ptr().cast(), x);
            let mut h = crc32fast::Hasher::new_with_initial(u32::MAX);
            h.update(&folded);
            let mut tail = [0u8; 16];
            super::copy_from_memory(p, &mut tail[..len]);
            h.update(&tail[..len]);
            h.finalize()
        }
    }
}

/// `PROCMAP_QUERY` (Linux 6.11): the mapping that covers an address, from an ioctl on
/// `/proc/self/maps`.
pub(crate) mod maps {
    use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
    use std::sync::atomic::{AtomicI32, Ordering};

    pub(crate) const READABLE: u64 = 0x01;
    pub(crate) const WRITABLE: u64 = 0x02;
    const SHARED: u64 = 0x08;

    /// `struct procmap_query` (`linux/fs.h`).
    #[repr(C)]
    #[derive(Default)]
    struct ProcmapQuery {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }

    /// `_IOWR('f', 17, struct procmap_query)`.
    const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
        | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
        | ((b'f' as libc::c_ulong) << 8)
        | 17;

    /// A mapping: where it ends, its permissions (`READABLE`...), and what backs it.
    pub(crate) struct Vma {
        pub(crate) end: u64,
        pub(crate) flags: u64,
        inode: u64,
        dev: (u32, u32),
        /// Whether `/proc/self/maps` names it, other than `[heap]`, `[stack]` or an
        /// anonymous mapping's own name (`[vvar]`, `[vdso]` and the like: the kernel's).
        special: bool,
    }

    impl Vma {
        /// Private anonymous memory of the program's (no file, not shared, not one of the
        /// kernel's special mappings, some of whose pages fault when read).
        pub(crate) fn private_anonymous(&self) -> bool {
            self.inode == 0 && self.dev == (0, 0) && self.flags & SHARED == 0 && !self.special
        }
    }

    /// The length of the name buffer of a query (a longer name fails the query, which then
    /// says nothing).
    const NAME_MAX: usize = 64;

    /// This process's `/proc/self/maps` (a raw descriptor, shared by every thread, never
    /// closed): `UNKNOWN` until first needed, `NONE` where the kernel has no `PROCMAP_QUERY`.
    static MAPS: AtomicI32 = AtomicI32::new(UNKNOWN);
    const UNKNOWN: i32 = -2;
    const NONE: i32 = -1;
    /// In a forked child, before any other thread exists: its own descriptor is opened at
    /// the next query. (The parent's stays open in the child.)
    extern "C" fn forked() {
        MAPS.store(UNKNOWN, Ordering::Release);
    }

    /// The descriptor to query, if the kernel answers queries.
    fn maps_fd() -> Option<i32> {
        let fd = MAPS.load(Ordering::Acquire);
        if fd != UNKNOWN {
            return (fd >= 0).then_some(fd);
        }
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler that only stores to an atomic.
        AT_FORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(forked));
        });
        let new = open().map_or(NONE, |f| f.into_raw_fd());
        match MAPS.compare_exchange(UNKNOWN, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => (new >= 0).then_some(new),
            Err(other) => {
                if new >= 0 {
                    // SAFETY: our own descriptor, which no one else saw.
                    unsafe { libc::close(new) };
                }
                (other >= 0).then_some(other)
            }
        }
    }

    /// The mapping that covers `addr`: `Some(None)` where none does, `None` where the kernel
    /// cannot say (no `PROCMAP_QUERY`).
    pub(crate) fn query(addr: usize) -> Option<Option<Vma>> {
        let fd = maps_fd()?;
        let mut name = [0u8; NAME_MAX];
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            vma_name_size: NAME_MAX as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: a query of the size it states, with a name buffer of the size it states; no
        // build id asked for.
        let r = unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q) };
        if r == 0 {
            let n = (q.vma_name_size as usize).min(NAME_MAX);
            let name = name[..n].split(|&b| b == 0).next().unwrap_or(&[]);
            let special = !(name.is_empty()
                || name == b"[heap]"
                || name == b"[stack]"
                || name.starts_with(b"[anon:"));
            return Some(Some(Vma {
                end: q.vma_end,
                flags: q.vma_flags,
                inode: q.inode,
                dev: (q.dev_major, q.dev_minor),
                special,
            }));
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT) => Some(None),
            _ => None,
        }
    }

    /// `/proc/self/maps`, if `PROCMAP_QUERY` works on it (asked about a mapping that
    /// certainly exists: this function's own code).
    fn open() -> Option<OwnedFd> {
        let f = std::fs::File::open("/proc/self/maps").ok()?;
        let fd = OwnedFd::from(f);
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: open as *const () as usize as u64,
            ..Default::default()
        };
        // SAFETY: as in `query`.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
        (r == 0 && q.vma_flags & READABLE != 0).then_some(fd)
    }
}

/// Populates the pages of `len` bytes at `start` as a read (or, with `write`, a write) would
/// fault them in, without touching the bytes (`madvise` `MADV_POPULATE_READ` or
/// `MADV_POPULATE_WRITE`); `false` where a page is not mapped (`ENOMEM`), not readable
/// (not writable, for a write: `EINVAL` or `EFAULT`). Only where [`on_demand_supported`].
pub(crate) fn populate_pages(start: *mut u8, len: usize, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    let page = page_size();
    let first = start as usize & !(page - 1);
    let Some(end) = (start as usize).checked_add(len) else {
        return false;
    };
    let Some(last) = end.checked_add(page - 1) else {
        return false;
    };
    let span = (last & !(page - 1)) - first;
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    // SAFETY: the advice populates page tables and neither reads nor writes the memory; any
    // address range is acceptable to the call (it fails on what is not mapped).
    unsafe { libc::madvise(std::ptr::without_provenance_mut(first), span, advice) == 0 }
}

/// Whether this kernel populates pages on request (`MADV_POPULATE_READ`/`_WRITE`, Linux
/// 5.14), which on-demand paging needs to fail an access to a page that is not there rather
/// than fault the process: found once, on a page of its own. (Without them, the device
/// offers no on-demand paging: no `odp_caps`, ON_DEMAND is `EOPNOTSUPP`.)
pub(crate) fn on_demand_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let page = page_size();
        // SAFETY: a fresh private anonymous page, advised, then unmapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return false;
            }
            let ok = libc::madvise(p, page, libc::MADV_POPULATE_WRITE) == 0;
            libc::munmap(p, page);
            ok
        }
    })
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 && (n as usize).is_power_of_two() => n as usize,
        _ => 4096,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random byte sequence.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn the_crc_of_memory_is_crc32fast_for_every_length_alignment_and_start() {
        let data = bytes(70_000, 7);
        let mut lens: Vec<usize> = (0..300).collect();
        lens.extend([
            511, 512, 513, 575, 576, 767, 768, 1023, 1024, 4095, 4096, 4097,
        ]);
        lens.extend([8192 + 13, 65_536, 69_000]);
        for (k, &len) in lens.iter().enumerate() {
            for at in [0usize, 1, 3, 8, 15] {
                let s = &data[at..at + len];
                let init = if k % 2 == 0 {
                    0
                } else {
                    0x1234_5678 ^ k as u32
                };
                let mut want = crc32fast::Hasher::new_with_initial(init);
                want.update(s);
                // SAFETY: `s` is a live slice nobody writes.
                let got = unsafe { crc32_of_memory(init, s.as_ptr(), s.len()) };
                assert_eq!(got, want.finalize(), "len {len} at {at}");
                // SAFETY: as above.
                let slow = unsafe { crc32_through_buffer(init, s.as_ptr(), s.len()) };
                assert_eq!(slow, got, "len {len} at {at}, through a buffer");
                #[cfg(target_arch = "x86_64")]
                if len >= 64 && crc32_in_place() {
                    // (The 128-bit fold too, where the wide one ran above.)
                    // SAFETY: as above; the CPU has the features.
                    let narrow = unsafe { fold::crc32(init, s.as_ptr(), s.len()) };
                    assert_eq!(narrow, got, "len {len} at {at}, 128 bits at a time");
                }
            }
        }
    }

    #[test]
    fn the_crc_of_memory_continues_a_hash_in_pieces() {
        let data = bytes(10_000, 3);
        let mut h = crc32fast::Hasher::new();
        h.update(&data);
        let whole = h.finalize();
        for cut in [0usize, 1, 63, 64, 4000, 9_999] {
            let mut h = crc32fast::Hasher::new();
            h.update(&data[..cut]);
            // SAFETY: a live slice nobody writes.
            let crc = unsafe { crc32_of_memory(h.finalize(), data[cut..].as_ptr(), 10_000 - cut) };
            assert_eq!(crc, whole, "cut at {cut}");
        }
    }
}
