//! Memory the device may touch while the program runs.
//!
//! The device reads and writes registered memory from its own threads, at times the program
//! does not control (an RDMA WRITE from a peer lands whenever it arrives). Ordinary Rust
//! references to such memory would be undefined behaviour the moment the device wrote while a
//! `&[u8]` was alive. softrdma therefore never creates references to registered memory:
//!
//! - the device copies in and out with `copy_to_memory` / `copy_from_memory`, which use
//!   relaxed atomic loads and stores of aligned 8-byte words (plain `mov` instructions on
//!   x86-64 and arm64), so concurrent access by the program through the same routines is a
//!   race in the RDMA sense (the bytes may be old or new) but never a data race in the Rust
//!   sense;
//! - [`Buffer`], the memory of the safe face, is reached only through those routines
//!   ([`Buffer::read`], [`Buffer::write`], ...), and is kept alive by every memory region
//!   registered on it, so it outlives every access the device makes.
//!
//! Memory registered through the faithful, `unsafe` face ([`crate::Pd::reg_mr`]) is the
//! caller's: the caller promises it stays allocated until the region is deregistered and that
//! its own accesses do not race with the device's, exactly the contract of `ibv_reg_mr`.

use crate::error::{Error, Result};
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The alignment of every [`Buffer`]: one page.
pub const BUFFER_ALIGN: usize = 4096;

/// Copies `src` into memory the device shares, starting at `dst`.
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes for the whole call, and every concurrent
/// access to it must go through these routines (or be otherwise atomic).
pub(crate) unsafe fn copy_to_memory(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    let n = src.len();
    // Bytes up to the first 8-aligned destination address.
    while i < n && (dst as usize + i) % 8 != 0 {
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
    let mut i = 0;
    let n = dst.len();
    let src = src.cast_mut();
    while i < n && (src as usize + i) % 8 != 0 {
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

/// Owned, zeroed, page-aligned memory that can be registered with the safe face
/// ([`crate::Pd::reg_buffer`]) and shared with the device while the program reads and writes it.
///
/// All access goes through copies (see the [module documentation](self)); there is no way to
/// borrow the bytes as a slice, because the device may change them at any moment. Share a
/// buffer between the program and its memory regions with `Arc<Buffer>`.
///
/// ```
/// use softrdma::Buffer;
/// let b = Buffer::new(64);
/// b.write(8, b"hello").unwrap();
/// let mut out = [0u8; 5];
/// b.read(8, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// assert!(b.write(62, b"xyz").is_err()); // past the end: EINVAL, nothing written
/// ```
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is only reached through atomic copies, so it may be shared and sent.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Allocates `len` zeroed bytes aligned to a page.
    ///
    /// # Panics
    /// Like `Vec`, aborts on allocation failure and panics if `len` overflows `isize`.
    pub fn new(len: usize) -> Buffer {
        if len == 0 {
            return Buffer {
                ptr: NonNull::<u64>::dangling().cast(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, BUFFER_ALIGN).expect("buffer size overflows");
        // SAFETY: layout has non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            alloc::handle_alloc_error(layout)
        };
        Buffer { ptr, len }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Buffer {
        let b = Buffer::new(data.len());
        // SAFETY: the buffer is fresh and exactly data.len() long.
        unsafe { copy_to_memory(b.ptr.as_ptr(), data) };
        b
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte, as work requests name it (`sge.addr`, `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// A raw pointer to the first byte. Reading or writing through it while the device may
    /// access the buffer is only sound with atomic operations.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(format!(
                "range {offset}+{len} is outside the {}-byte buffer",
                self.len
            ))),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    ///
    /// Fails with `EINVAL` (and copies nothing) when the range is outside the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: bounds checked; the buffer is alive while &self is.
        unsafe { copy_from_memory(self.ptr.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// Copies `src` into the buffer starting at `offset`.
    ///
    /// Fails with `EINVAL` (and copies nothing) when the range is outside the buffer.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked; the buffer is alive while &self is.
        unsafe { copy_to_memory(self.ptr.as_ptr().add(offset), src) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        let chunk = [byte; 256];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(chunk.len());
            // SAFETY: off + n <= len.
            unsafe { copy_to_memory(self.ptr.as_ptr().add(off), &chunk[..n]) };
            off += n;
        }
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // SAFETY: v is exactly len bytes.
        unsafe { copy_from_memory(self.ptr.as_ptr(), &mut v) };
        v
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64> {
        self.check(offset, 8)?;
        if offset % 8 != 0 {
            return Err(Error::invalid(format!(
                "offset {offset} is not 8-byte aligned"
            )));
        }
        // SAFETY: in bounds and 8-aligned (the buffer is page aligned); the memory lives as
        // long as &self and is only accessed atomically.
        Ok(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast()) })
    }

    /// Atomically reads the 8-byte word at `offset` (native byte order, as RDMA atomics
    /// operate on it).
    ///
    /// Fails with `EINVAL` when `offset` is not 8-aligned or the word is outside the buffer.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.word(offset)?.load(Ordering::SeqCst))
    }

    /// Atomically writes the 8-byte word at `offset`.
    ///
    /// Fails with `EINVAL` when `offset` is not 8-aligned or the word is outside the buffer.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.word(offset)?.store(value, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout = Layout::from_size_align(self.len, BUFFER_ALIGN).expect("checked at new");
            // SAFETY: allocated in `new` with this very layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_at_every_alignment() {
        let b = Buffer::new(100);
        for off in 0..20 {
            for len in 0..40 {
                let src: Vec<u8> = (0..len as u8)
                    .map(|x| x.wrapping_mul(7) ^ off as u8)
                    .collect();
                b.write(off, &src).unwrap();
                let mut dst = vec![0; len];
                b.read(off, &mut dst).unwrap();
                assert_eq!(dst, src);
            }
        }
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let b = Buffer::new(16);
        assert!(b.read(usize::MAX, &mut [0; 2]).is_err());
        assert!(b.write(15, &[1, 2]).is_err());
        assert!(b.load_u64(4).is_err());
        assert!(b.load_u64(16).is_err());
        b.store_u64(8, 42).unwrap();
        assert_eq!(b.load_u64(8).unwrap(), 42);
        let e = Buffer::new(0);
        assert!(e.is_empty());
        assert!(e.to_vec().is_empty());
    }

    #[test]
    fn fill_and_from_slice() {
        let b = Buffer::new(1000);
        b.fill(0xab);
        assert!(b.to_vec().iter().all(|&x| x == 0xab));
        assert_eq!(Buffer::from_slice(b"xyz").to_vec(), b"xyz");
        assert_eq!(b.addr() % BUFFER_ALIGN as u64, 0);
    }
}
