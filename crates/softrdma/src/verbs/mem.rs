//! Memory the device may touch while the program runs.
//!
//! The device reads and writes registered memory from its own threads, at times the program
//! does not control (an RDMA WRITE from a peer lands whenever it arrives). An ordinary Rust
//! reference to memory the device may *write* would be undefined behaviour the moment the
//! device wrote while a `&[u8]` was alive. softrdma therefore reaches registered memory with
//! copies by default, and lends it as a slice only when nothing can write it.
//!
//! # Copies: always sound
//! - the device copies in and out with `copy_to_memory` / `copy_from_memory`, which use
//!   relaxed atomic loads and stores of aligned 8-byte words (plain `mov` instructions on
//!   x86-64 and arm64), so concurrent access by the program through the same routines is a
//!   race in the RDMA sense (the bytes may be old or new) but never a data race in the Rust
//!   sense;
//! - [`Buffer`], the memory of the safe face, is reached through those routines
//!   ([`Buffer::read`], [`Buffer::write`], ...), and is kept alive by every memory region
//!   registered on it, so it outlives every access the device makes.
//!
//! # Zero-copy access: only where it is sound
//! Two ways lend a [`Buffer`]'s bytes as a slice, each sound in safe code:
//!
//! - [`Buffer::as_mut_slice`] takes `&mut Buffer`, which proves nothing else can reach the
//!   memory: every memory region registered on a buffer holds an `Arc` to it, so a buffer you
//!   can borrow mutably (say through `Arc::get_mut`) is registered nowhere. Fill a buffer in
//!   place before registering it, or read it in place after deregistering.
//! - [`Buffer::view`] lends `&[u8]` (a [`BufferView`]) while the buffer is registered, as long
//!   as nothing can write it: the device writes registered memory only through regions that
//!   have `LOCAL_WRITE` (receives, READ responses and atomic results need it on the local
//!   key; `REMOTE_WRITE` and `REMOTE_ATOMIC` cannot be granted without it), so a buffer whose
//!   regions all lack `LOCAL_WRITE` — a send buffer, or one exposed to peers with
//!   `REMOTE_READ` only — is never written by the device. The buffer counts its regions with
//!   `LOCAL_WRITE` and its live views: [`Buffer::view`] fails with `EBUSY` while such a region
//!   exists, and registering such a region ([`crate::Pd::reg_buffer`]) fails with `EBUSY`
//!   while a view is alive. The program's own writes ([`Buffer::write`], [`Buffer::fill`],
//!   [`Buffer::store_u64`]) fail with `EBUSY` while a view is alive too. Reads by the device
//!   (a SEND from the buffer, a peer's RDMA READ) and by the program may go on: concurrent
//!   reads are no data race.
//!
//! A region's count is released when the region is deregistered, after the device has
//! finished every access through it (deregistration waits for them), so a view taken after
//! [`crate::Mr::dereg`] returns is sound.
//!
//! Memory registered through the faithful, `unsafe` face ([`crate::Pd::reg_mr`]) is the
//! caller's: the caller promises it stays allocated until the region is deregistered and that
//! its own accesses do not race with the device's, exactly the contract of `ibv_reg_mr`.
//! That includes registering a [`Buffer`]'s pointer that way: such a region is not counted.

use crate::error::{Error, Result};
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// One of the three counters packed in [`Buffer::state`]: 21 bits each.
const FIELD: u64 = (1 << 21) - 1;
/// Live [`BufferView`]s (bits 0..21).
const VIEW: u64 = 1;
/// The program's writes in progress (bits 21..42).
const WRITING: u64 = 1 << 21;
/// Live regions through which the device may write the buffer (bits 42..63).
const DEVICE: u64 = 1 << 42;

/// The alignment of every [`Buffer`]: one page.
pub const BUFFER_ALIGN: usize = 4096;

pub(crate) use crate::provider::memory::{copy_from_memory, copy_to_memory};

/// Owned, zeroed, page-aligned memory that can be registered with the safe face
/// ([`crate::Pd::reg_buffer`]) and shared with the device while the program reads and writes it.
///
/// Access goes through copies, or through a slice where that is sound ([`Buffer::view`],
/// [`Buffer::as_mut_slice`]; see the [module documentation](self)). Share a buffer between
/// the program and its memory regions with `Arc<Buffer>`.
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
    /// Live views, program writes in progress, and regions the device may write through,
    /// packed as [`VIEW`], [`WRITING`] and [`DEVICE`] counts.
    state: AtomicU64,
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
                state: AtomicU64::new(0),
            };
        }
        let layout = Layout::from_size_align(len, BUFFER_ALIGN).expect("buffer size overflows");
        // SAFETY: layout has non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            alloc::handle_alloc_error(layout)
        };
        Buffer {
            ptr,
            len,
            state: AtomicU64::new(0),
        }
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
    /// Fails with `EBUSY` (and copies nothing) while a [`BufferView`] of the buffer is alive.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        let _w = self.begin_write()?;
        // SAFETY: bounds checked; the buffer is alive while &self is.
        unsafe { copy_to_memory(self.ptr.as_ptr().add(offset), src) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    ///
    /// Fails with `EBUSY` (and writes nothing) while a [`BufferView`] of the buffer is alive.
    pub fn fill(&self, byte: u8) -> Result<()> {
        let _w = self.begin_write()?;
        let chunk = [byte; 256];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(chunk.len());
            // SAFETY: off + n <= len.
            unsafe { copy_to_memory(self.ptr.as_ptr().add(off), &chunk[..n]) };
            off += n;
        }
        Ok(())
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
        if !offset.is_multiple_of(8) {
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
    /// Fails with `EINVAL` when `offset` is not 8-aligned or the word is outside the buffer,
    /// `EBUSY` while a [`BufferView`] of the buffer is alive.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        let w = self.word(offset)?;
        let _w = self.begin_write()?;
        w.store(value, Ordering::SeqCst);
        Ok(())
    }
}

impl Buffer {
    /// Adds `one` to the counter it names if `allowed` says the current state permits it.
    fn count_in(&self, one: u64, allowed: impl Fn(u64) -> bool) -> bool {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (allowed(s) && (s / one) & FIELD != FIELD).then_some(s + one)
            })
            .is_ok()
    }

    fn begin_write(&self) -> Result<WriteGuard<'_>> {
        if self.count_in(WRITING, |s| s & FIELD == 0) {
            Ok(WriteGuard(self))
        } else {
            Err(Error::busy(
                "the buffer is lent as a slice (a BufferView is alive)",
            ))
        }
    }

    /// Counts a region through which the device may write the buffer (one with
    /// LOCAL_WRITE): fails with `EBUSY` while a view is alive.
    pub(crate) fn acquire_device_write(&self) -> Result<()> {
        if self.count_in(DEVICE, |s| s & FIELD == 0) {
            Ok(())
        } else {
            Err(Error::busy(
                "the buffer is lent as a slice (a BufferView is alive): it cannot be registered with LOCAL_WRITE",
            ))
        }
    }

    /// Releases a count of [`Buffer::acquire_device_write`], once the device is done with
    /// the region.
    pub(crate) fn release_device_write(&self) {
        self.state.fetch_sub(DEVICE, Ordering::AcqRel);
    }

    /// Lends the bytes as a shared slice, without a copy, while nothing can write them.
    ///
    /// Fails with `EBUSY` while a memory region with `LOCAL_WRITE` (hence any with
    /// `REMOTE_WRITE` or `REMOTE_ATOMIC`) is registered on the buffer with
    /// [`crate::Pd::reg_buffer`], or while one of the program's writes to it is in progress.
    /// While the view is alive, [`Buffer::write`], [`Buffer::fill`], [`Buffer::store_u64`]
    /// and registering a region with `LOCAL_WRITE` fail with `EBUSY`; reads, sends from the
    /// buffer and peers' RDMA READs go on. See the [module documentation](self).
    ///
    /// ```
    /// use softrdma::{Buffer, Error, ErrorKind};
    /// let b = Buffer::from_slice(b"payload");
    /// let v = b.view().unwrap();
    /// assert_eq!(&v[..], b"payload");
    /// assert_eq!(b.write(0, b"x").unwrap_err().kind(), ErrorKind::Busy);
    /// drop(v);
    /// b.write(0, b"P").unwrap();
    /// ```
    pub fn view(&self) -> Result<BufferView<'_>> {
        if self.count_in(VIEW, |s| s & !FIELD == 0) {
            Ok(BufferView(self))
        } else {
            Err(Error::busy(
                "the device or the program may write the buffer (a region with LOCAL_WRITE is registered on it, or a write is in progress)",
            ))
        }
    }

    /// The bytes as a mutable slice. `&mut Buffer` proves that nothing else reaches the
    /// memory: no memory region is registered on the buffer (each would hold an `Arc` to
    /// it) and no view is alive. Reach it through `Arc::get_mut` before registering or after
    /// deregistering.
    ///
    /// ```
    /// use softrdma::Buffer;
    /// use std::sync::Arc;
    /// let mut buf = Arc::new(Buffer::new(16));
    /// Arc::get_mut(&mut buf).unwrap().as_mut_slice()[..5].copy_from_slice(b"hello");
    /// assert_eq!(&buf.to_vec()[..5], b"hello");
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: len bytes allocated in `new`; `&mut self` excludes every other access
        // (regions hold an Arc, views borrow the buffer).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// One of the program's writes to a [`Buffer`] in progress: views wait for none, they fail.
struct WriteGuard<'a>(&'a Buffer);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_sub(WRITING, Ordering::AcqRel);
    }
}

/// A [`Buffer`]'s bytes lent as `&[u8]` ([`Buffer::view`]): while it is alive, nothing
/// writes the buffer. Dereferences to `[u8]`.
pub struct BufferView<'a>(&'a Buffer);

impl std::ops::Deref for BufferView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let b = self.0;
        if b.len == 0 {
            return &[];
        }
        // SAFETY: the allocation lives as long as the borrow of the buffer; while the view
        // is counted, no region the device writes through exists (none may be registered)
        // and the program's writes fail, so the bytes do not change while the slice lives.
        unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.len) }
    }
}

impl Drop for BufferView<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_sub(VIEW, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for BufferView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferView")
            .field("addr", &format_args!("{:#x}", self.0.addr()))
            .field("len", &self.0.len)
            .finish()
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
        b.fill(0xab).unwrap();
        assert!(b.to_vec().iter().all(|&x| x == 0xab));
        assert_eq!(Buffer::from_slice(b"xyz").to_vec(), b"xyz");
        assert_eq!(b.addr() % BUFFER_ALIGN as u64, 0);
    }
}
