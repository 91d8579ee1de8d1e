//! A single-producer, single-consumer ring of packets in memory that two processes map (a
//! memfd): the same-host lane's data path.
//!
//! Layout of the mapping: a header page, then `cap` bytes of records (`cap` a power of two).
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic (`u64`, [`MAGIC`]) |
//! | 8 | `cap` (`u64`) |
//! | 128 | `tail`: bytes taken, published by the consumer (`u64`, its own cache line) |
//! | 192 | `sleeping`: the consumer is about to sleep or sleeps (`u32`) |
//! | 256 | `closed`: the consumer reads no more (`u32`; a QP pair's ring, see `super::pair`) |
//!
//! A record starts on a 64-byte boundary with a 16-byte header: the packet's length (`u32`),
//! 4 bytes unused, and the record's *sequence word* (`u64`), then the packet; a record never
//! wraps: when the next one does not fit before the end, the producer writes [`PAD`] as the
//! length and goes on at offset 0. The producer publishes a record by storing, last, its
//! position in the ring's byte count plus one as its sequence word: the consumer looks at the
//! record at its own position and takes it when the word says that position. (A word left
//! from the ring's previous lap, or the zeros of a fresh one, never does.) So a small record
//! crosses from one process to the other as one cache line, the one the consumer polls;
//! there is no `head` word to poll first (`scripts/probes/ring_pingpong.rs`: 111 ns one way
//! with a `head` word, 81 with sequence words).
//!
//! **Trust.** Each side keeps its own position in its own memory and reads the other's from
//! the mapping as untrusted input: a length or a position that does not add up makes the
//! ring [`Corrupt`] (the lane is closed), never an access outside the mapping. The producer
//! never writes a record between publishing it and the consumer releasing it, so the bytes a
//! consumer reads do not change under it unless the peer process (a process of the same user)
//! misbehaves; then it gets garbage bytes, which the packet checks treat as any datagram.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The first eight bytes of a ring's mapping (the layout's version: a process of another
/// layout refuses the ring, and its packets take the wire).
pub(crate) const MAGIC: u64 = u64::from_be_bytes(*b"srdmaRN2");
/// Bytes before the records.
const HEADER: usize = 4096;
const TAIL_AT: usize = 128;
const SLEEPING_AT: usize = 192;
const CLOSED_AT: usize = 256;
/// Bytes of a record's header.
const REC_HEADER: u64 = 16;
/// Where a record's sequence word is, from its start.
const SEQ_AT: u64 = 8;
/// The length word of a padding record: the rest of the ring up to its end is empty.
const PAD: u32 = u32::MAX;
/// Records start on this boundary.
const ALIGN: u64 = 64;

/// A ring's positions or lengths did not add up: the peer wrote nonsense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// A shared mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access to shared fields goes through atomics,
// and record bytes are written only by the producer before publication.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Mapping {
    fn map(fd: &OwnedFd, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh shared mapping of `len` bytes of `fd`; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os_error("mmap(lane ring)"));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    #[inline]
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off.is_multiple_of(8));
        // SAFETY: callers pass aligned offsets inside the mapping (the header's fixed fields,
        // a record's sequence word).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    #[inline]
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.len && off.is_multiple_of(4));
        // SAFETY: callers pass aligned offsets inside the mapping.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
}

/// The producer's end of a ring.
pub(crate) struct Producer {
    map: Arc<Mapping>,
    cap: u64,
    /// Bytes written (this side's own count).
    head: u64,
    /// The consumer's `tail` as last read.
    tail: u64,
    /// The padding before, and the size of, the record reserved last and not committed.
    reserved: Option<(u64, usize)>,
    /// The positions of the records (padding included) committed and not yet published, in
    /// order: kept here rather than read back from the mapping, which the peer can write.
    unpublished: Vec<u64>,
    /// `head` as of the last [`Producer::publish`], for [`Watch`].
    published: Arc<AtomicU64>,
}

/// A view of a ring's progress from outside its producer (see [`Producer::watch`]): whether
/// the consumer has taken everything published so far.
pub(crate) struct Watch {
    map: Arc<Mapping>,
    published: Arc<AtomicU64>,
}

impl Watch {
    /// Whether the consumer has released every record published so far (it took them all).
    /// A consumer position that makes no sense reads as "not yet".
    #[inline]
    pub(crate) fn consumed(&self) -> bool {
        let head = self.published.load(Ordering::Acquire);
        self.map.u64_at(TAIL_AT).load(Ordering::Acquire) == head
    }
}

/// The consumer's end of a ring.
pub(crate) struct Consumer {
    map: Arc<Mapping>,
    cap: u64,
    /// Bytes taken (this side's own count).
    tail: u64,
}

#[inline]
fn align(n: u64) -> u64 {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

impl Producer {
    /// A new ring of `cap` bytes of records (a power of two, at least 64 KiB) in a fresh
    /// memfd, and that memfd (to hand to the consumer). Fails with the errno of
    /// `memfd_create`, `ftruncate` or `mmap`.
    pub(crate) fn create(cap: usize) -> Result<(Producer, OwnedFd)> {
        assert!(cap.is_power_of_two() && cap >= 1 << 16);
        // SAFETY: a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"softrdma-lane".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os_error("memfd_create"));
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = HEADER + cap;
        // SAFETY: plain ftruncate on our memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Error::last_os_error("ftruncate(lane ring)"));
        }
        let map = Arc::new(Mapping::map(&fd, len)?);
        map.u64_at(0).store(MAGIC, Ordering::Relaxed);
        map.u64_at(8).store(cap as u64, Ordering::Release);
        Ok((
            Producer {
                map,
                cap: cap as u64,
                head: 0,
                tail: 0,
                reserved: None,
                unpublished: Vec::with_capacity(256),
                published: Arc::new(AtomicU64::new(0)),
            },
            fd,
        ))
    }

    /// Writes `pkt` as the next record (not yet visible: see [`Producer::publish`]).
    /// Returns `Ok(false)` when the ring has no room for it now; `Err(Corrupt)` when the
    /// consumer's position makes no sense.
    pub(crate) fn push(&mut self, pkt: &[u8]) -> std::result::Result<bool, Corrupt> {
        let Some(buf) = self.reserve(pkt.len())? else {
            return Ok(false);
        };
        buf.copy_from_slice(pkt);
        self.commit(pkt.len());
        Ok(true)
    }

    /// Room for the next record, of up to `max` bytes: the bytes to write it into, in the
    /// ring itself (nothing changes until [`Producer::commit`]; a new reservation replaces
    /// one not committed). `Ok(None)` when the ring has no room for `max` bytes now;
    /// `Err(Corrupt)` when the consumer's position makes no sense.
    pub(crate) fn reserve(
        &mut self,
        max: usize,
    ) -> std::result::Result<Option<&mut [u8]>, Corrupt> {
        let need = align(REC_HEADER + max as u64);
        if need > self.cap / 4 {
            return Ok(None);
        }
        let pos = self.head & (self.cap - 1);
        let pad = if self.cap - pos < need {
            self.cap - pos
        } else {
            0
        };
        // (One line more than the record stays free: the slot after the last record, see
        // `publish`.)
        if self.head + pad + need + ALIGN - self.tail > self.cap {
            let t = self.map.u64_at(TAIL_AT).load(Ordering::Acquire);
            if t < self.tail || t > self.head {
                return Err(Corrupt);
            }
            self.tail = t;
            if self.head + pad + need + ALIGN - self.tail > self.cap {
                return Ok(None);
            }
        }
        self.reserved = Some((pad, max));
        let at = HEADER as u64 + ((self.head + pad) & (self.cap - 1)) + REC_HEADER;
        // SAFETY: the record lies inside the data area (it fits before the end, checked
        // above), in bytes the consumer has released and will not read before they are
        // published; the borrow of `self` keeps anything else from writing them meanwhile.
        Ok(Some(unsafe {
            std::slice::from_raw_parts_mut(self.map.ptr.add(at as usize), max)
        }))
    }

    /// Queues the record reserved last (see [`Producer::reserve`]) as `len` bytes long
    /// (`len` at most what was reserved; not yet visible: see [`Producer::publish`]). Without
    /// a reservation, does nothing.
    pub(crate) fn commit(&mut self, len: usize) {
        let Some((pad, max)) = self.reserved.take() else {
            return;
        };
        debug_assert!(len <= max);
        let len = len.min(max);
        let data = HEADER as u64;
        if pad != 0 {
            let pos = self.head & (self.cap - 1);
            self.map
                .u32_at((data + pos) as usize)
                .store(PAD, Ordering::Relaxed);
            self.unpublished.push(self.head);
            self.head += pad;
        }
        let at = data + (self.head & (self.cap - 1));
        self.map
            .u32_at(at as usize)
            .store(len as u32, Ordering::Relaxed);
        self.unpublished.push(self.head);
        self.head += align(REC_HEADER + len as u64);
    }

    /// Makes what was pushed visible to the consumer (the sequence word of each record, in
    /// order, with release ordering: its bytes are written before). Returns whether the
    /// consumer sleeps (then the caller wakes it; the flag is cleared here).
    pub(crate) fn publish(&mut self) -> bool {
        if !self.unpublished.is_empty() {
            // The slot after the last record (free: `reserve` keeps a line between the
            // producer and the consumer) may hold a word of an earlier lap, payload bytes
            // that could happen to read as its position: zeroed first, so that the consumer,
            // done with these records, finds it unpublished (ordered by the releases below).
            let at = HEADER as u64 + (self.head & (self.cap - 1)) + SEQ_AT;
            self.map.u64_at(at as usize).store(0, Ordering::Relaxed);
        }
        for &pos in &self.unpublished {
            let at = HEADER as u64 + (pos & (self.cap - 1)) + SEQ_AT;
            self.map
                .u64_at(at as usize)
                .store(pos + 1, Ordering::Release);
        }
        self.unpublished.clear();
        self.published.store(self.head, Ordering::Release);
        // Pairs with the consumer's fence in `arm`: either it sees the new record, or this
        // sees its flag.
        fence(Ordering::SeqCst);
        let s = self.map.u32_at(SLEEPING_AT);
        s.load(Ordering::Relaxed) != 0 && s.swap(0, Ordering::AcqRel) != 0
    }

    /// Whether the consumer said it sleeps (waits for a wake-up) at its last look: a hint,
    /// read without ordering (the flag is set and cleared by [`Producer::publish`] and the
    /// consumer's `arm` with the fences that matter).
    #[inline]
    pub(crate) fn consumer_sleeps(&self) -> bool {
        self.map.u32_at(SLEEPING_AT).load(Ordering::Relaxed) != 0
    }

    /// Writes `len` as the length of the record committed last (tests of a reader that
    /// finds nonsense).
    #[cfg(test)]
    pub(crate) fn corrupt_last_length_for_test(&mut self, len: u32) {
        if let Some(&pos) = self.unpublished.last() {
            let at = HEADER as u64 + (pos & (self.cap - 1));
            self.map.u32_at(at as usize).store(len, Ordering::Relaxed);
        }
    }

    /// Waits up to `wait` for room for a record of `max` bytes, yielding the processor
    /// meanwhile (the caller publishes first, so that the consumer can make room); whether
    /// there is room now (`false` too when the consumer's position makes no sense).
    pub(crate) fn wait_for_room(&mut self, max: usize, wait: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + wait;
        loop {
            match self.reserve(max) {
                Ok(Some(_)) => return true,
                Ok(None) if std::time::Instant::now() < end => std::thread::yield_now(),
                _ => return false,
            }
        }
    }

    /// A [`Watch`] of this ring: whether its consumer has taken all that was published.
    pub(crate) fn watch(&self) -> Watch {
        Watch {
            map: self.map.clone(),
            published: self.published.clone(),
        }
    }

    /// Whether the consumer said it reads no more ([`Consumer::close`]).
    #[inline]
    pub(crate) fn closed(&self) -> bool {
        self.map.u32_at(CLOSED_AT).load(Ordering::Acquire) != 0
    }
}

impl Consumer {
    /// Maps the ring in `fd` (from its producer). Fails with `EINVAL` when the memfd is not
    /// a ring (size, magic, capacity), or the errno of `fstat`/`mmap`.
    pub(crate) fn open(fd: &OwnedFd) -> Result<Consumer> {
        // SAFETY: stat is plain data; fstat writes it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::last_os_error("fstat(lane ring)"));
        }
        let len = st.st_size as usize;
        if !(HEADER + (1 << 16)..=HEADER + (1 << 30)).contains(&len) {
            return Err(Error::invalid(format!("a lane ring of {len} bytes")));
        }
        let map = Arc::new(Mapping::map(fd, len)?);
        let cap = map.u64_at(8).load(Ordering::Acquire);
        if map.u64_at(0).load(Ordering::Relaxed) != MAGIC
            || !cap.is_power_of_two()
            || cap as usize != len - HEADER
        {
            return Err(Error::invalid("not a lane ring".to_string()));
        }
        let tail = map.u64_at(TAIL_AT).load(Ordering::Acquire);
        Ok(Consumer { map, cap, tail })
    }

    /// This side's position: records from here on are not taken yet.
    #[inline]
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }

    /// Whether the record at `pos` is published (its sequence word says `pos`, read with
    /// acquire ordering: its bytes are visible).
    #[inline]
    fn published(&self, pos: u64) -> bool {
        let at = HEADER as u64 + (pos & (self.cap - 1)) + SEQ_AT;
        self.map.u64_at(at as usize).load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Whether published records wait.
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.published(self.tail)
    }

    /// The record at `pos` (a position from [`Consumer::tail`] or a previous call) if it is
    /// published, and the position after it. `Err(Corrupt)` when the producer's lengths or
    /// positions do not add up (a record longer than the producer ever writes, or past the
    /// end of the ring).
    #[inline]
    pub(crate) fn record_at(
        &self,
        mut pos: u64,
    ) -> std::result::Result<Option<(&[u8], u64)>, Corrupt> {
        loop {
            if pos & (ALIGN - 1) != 0 || pos.wrapping_sub(self.tail) > self.cap {
                return Err(Corrupt);
            }
            if !self.published(pos) {
                return Ok(None);
            }
            let off = pos & (self.cap - 1);
            let at = HEADER as u64 + off;
            let len = self.map.u32_at(at as usize).load(Ordering::Relaxed);
            if len == PAD {
                pos += self.cap - off;
                continue;
            }
            let need = align(REC_HEADER + u64::from(len));
            if need > self.cap - off || need > self.cap / 4 {
                return Err(Corrupt);
            }
            // SAFETY: the record lies inside the data area (checked against cap and off),
            // published by the producer (its sequence word read with Acquire) and not
            // released.
            let pkt = unsafe {
                std::slice::from_raw_parts(
                    self.map.ptr.add((at + REC_HEADER) as usize),
                    len as usize,
                )
            };
            return Ok(Some((pkt, pos + need)));
        }
    }

    /// Gives the records before `pos` back to the producer.
    #[inline]
    pub(crate) fn release(&mut self, pos: u64) {
        self.tail = pos;
        self.map.u64_at(TAIL_AT).store(pos, Ordering::Release);
    }

    /// About to sleep: asks the producer for a wake-up. Returns `false` (and asks for none)
    /// when records wait already.
    pub(crate) fn arm(&self) -> bool {
        let s = self.map.u32_at(SLEEPING_AT);
        s.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.pending() {
            s.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Awake again: no wake-up needed.
    pub(crate) fn disarm(&self) {
        let s = self.map.u32_at(SLEEPING_AT);
        if s.load(Ordering::Relaxed) != 0 {
            s.store(0, Ordering::Relaxed);
        }
    }

    /// Tells the producer that nothing more is read ([`Producer::closed`]).
    pub(crate) fn close(&self) {
        self.map.u32_at(CLOSED_AT).store(1, Ordering::Release);
    }

    /// A [`Peek`] at this ring, for a look without this end (see [`Peek::published`]).
    pub(crate) fn peek(&self) -> Peek {
        Peek {
            map: self.map.clone(),
            cap: self.cap,
        }
    }
}

/// Whether a ring holds a published record at a position, read without its consumer (a
/// reader that holds the consumer elsewhere, behind a lock, looks first with this).
pub(crate) struct Peek {
    map: Arc<Mapping>,
    cap: u64,
}

impl Peek {
    /// Tells the producer that nothing more is read (as [`Consumer::close`]).
    pub(crate) fn close(&self) {
        self.map.u32_at(CLOSED_AT).store(1, Ordering::Release);
    }

    /// Whether the record at `pos` is published (as [`Consumer::pending`] at that position).
    #[inline]
    pub(crate) fn published(&self, pos: u64) -> bool {
        let at = HEADER as u64 + (pos & (self.cap - 1)) + SEQ_AT;
        self.map.u64_at(at as usize).load(Ordering::Acquire) == pos.wrapping_add(1)
    }
}

/// Wakes a sleeping consumer: one byte on the bell (a full bell has wake-ups pending already).
pub(crate) fn ring_bell(bell: &OwnedFd) {
    // SAFETY: one byte from a live buffer to a socket we own.
    unsafe {
        libc::send(
            bell.as_raw_fd(),
            [1u8].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(c: &mut Consumer) -> Vec<Vec<u8>> {
        let mut pos = c.tail();
        let mut out = Vec::new();
        while let Some((p, next)) = c.record_at(pos).unwrap() {
            out.push(p.to_vec());
            pos = next;
        }
        c.release(pos);
        out
    }

    #[test]
    fn records_cross_in_order_and_wrap() {
        let (mut p, fd) = Producer::create(1 << 16).unwrap();
        let mut c = Consumer::open(&fd).unwrap();
        let mut want = Vec::new();
        let mut got = Vec::new();
        for i in 0..2000u32 {
            let pkt: Vec<u8> = (0..(i % 4200)).map(|b| (b ^ i) as u8).collect();
            while !p.push(&pkt).unwrap() {
                p.publish();
                got.extend(drain(&mut c));
            }
            want.push(pkt);
            if i % 7 == 0 {
                p.publish();
                got.extend(drain(&mut c));
            }
        }
        p.publish();
        got.extend(drain(&mut c));
        assert_eq!(got.len(), want.len());
        assert!(got == want);
    }

    #[test]
    fn a_reserved_record_is_written_in_place_and_shrunk_on_commit() {
        let (mut p, fd) = Producer::create(1 << 16).unwrap();
        let mut c = Consumer::open(&fd).unwrap();
        let mut want = Vec::new();
        for i in 0..300u32 {
            let len = (i as usize * 37) % 3000;
            let buf = p.reserve(4000).unwrap().expect("room");
            for (k, b) in buf[..len].iter_mut().enumerate() {
                *b = (k as u32 ^ i) as u8;
            }
            if i % 5 == 4 {
                // Abandoned: not committed, never seen.
                let _ = p.reserve(4000).unwrap();
                continue;
            }
            p.commit(len);
            want.push((0..len).map(|k| (k as u32 ^ i) as u8).collect::<Vec<u8>>());
            p.publish();
            let got = drain(&mut c);
            assert_eq!(got.len(), 1);
            assert!(got[0] == *want.last().unwrap(), "record {i}");
        }
        // A commit without a reservation does nothing.
        assert!(p.push(b"x").unwrap());
        p.publish();
        assert_eq!(drain(&mut c), vec![b"x".to_vec()]);
        p.commit(10);
        p.publish();
        assert!(drain(&mut c).is_empty());
    }

    #[test]
    fn payload_of_an_earlier_lap_that_reads_as_a_position_is_never_taken() {
        // Every 8 bytes of every payload say "position + 1" for some position of the next
        // laps: a record start of a later lap that lands on such bytes must still wait for
        // its own publication.
        let cap = 1u64 << 16;
        let (mut p, fd) = Producer::create(cap as usize).unwrap();
        let mut c = Consumer::open(&fd).unwrap();
        for round in 0..400u64 {
            // Sizes that shift the record starts from lap to lap.
            let len = 200 + (round * 328) % 3900;
            let mut pkt = vec![0u8; len as usize];
            // Where the record will start, and so where each payload word lies.
            let off = p.head & (cap - 1);
            let need = align(REC_HEADER + len);
            let start = if cap - off < need {
                p.head + cap - off
            } else {
                p.head
            };
            for (k, w) in pkt.chunks_exact_mut(8).enumerate() {
                let at = start + REC_HEADER + 8 * k as u64;
                if at % ALIGN == SEQ_AT {
                    // The sequence word of the slot at `at - 8` one lap later.
                    w.copy_from_slice(&(at - SEQ_AT + cap + 1).to_le_bytes());
                }
            }
            assert!(
                p.push(&pkt).unwrap(),
                "round {round}: the drained ring has room"
            );
            // Before publication, nothing is taken.
            assert_eq!(drain(&mut c).len(), 0, "round {round}");
            p.publish();
            let d = drain(&mut c);
            assert_eq!(d.len(), 1, "round {round}");
            assert!(d[0] == pkt);
        }
    }

    #[test]
    fn a_full_ring_refuses_until_released() {
        let (mut p, fd) = Producer::create(1 << 16).unwrap();
        let mut c = Consumer::open(&fd).unwrap();
        let pkt = [7u8; 4000];
        let mut n = 0;
        while p.push(&pkt).unwrap() {
            n += 1;
        }
        assert_eq!(n, (1 << 16) / 4032);
        p.publish();
        assert_eq!(drain(&mut c).len(), n);
        assert!(p.push(&pkt).unwrap());
    }

    #[test]
    fn sleeping_consumer_is_woken_once() {
        let (mut p, fd) = Producer::create(1 << 16).unwrap();
        let c = Consumer::open(&fd).unwrap();
        assert!(c.arm());
        p.push(b"x").unwrap();
        assert!(p.publish());
        p.push(b"y").unwrap();
        assert!(!p.publish());
        assert!(!c.arm(), "records wait: no sleep");
    }

    #[test]
    fn nonsense_from_the_peer_is_corrupt_not_a_crash() {
        let (mut p, fd) = Producer::create(1 << 16).unwrap();
        let c = Consumer::open(&fd).unwrap();
        p.push(&[1u8; 100]).unwrap();
        p.publish();
        // A length longer than any record the producer writes.
        c.map.u32_at(HEADER).store(60_000, Ordering::Relaxed);
        assert_eq!(c.record_at(0), Err(Corrupt));
        // A length past the end of the ring: the record at its last 64 bytes says 100.
        let last = (1u64 << 16) - 64;
        c.map
            .u32_at(HEADER + last as usize)
            .store(100, Ordering::Relaxed);
        c.map
            .u64_at(HEADER + last as usize + SEQ_AT as usize)
            .store(last + 1, Ordering::Relaxed);
        assert_eq!(c.record_at(last), Err(Corrupt));
        // A position the consumer never reached (misaligned, or a lap ahead).
        assert_eq!(c.record_at(8), Err(Corrupt));
        assert_eq!(c.record_at(1 << 40), Err(Corrupt));
        // A sequence word of another position: not published, not corrupt.
        c.map.u32_at(HEADER).store(100, Ordering::Relaxed);
        c.map
            .u64_at(HEADER + SEQ_AT as usize)
            .store((1 << 16) + 1, Ordering::Relaxed);
        assert_eq!(c.record_at(0), Ok(None));
        assert!(!c.pending());
        // A tail the producer never gave.
        c.map.u64_at(TAIL_AT).store(1 << 40, Ordering::Relaxed);
        let big = [0u8; 4000];
        let mut r = Ok(true);
        for _ in 0..100 {
            r = p.push(&big);
            if r != Ok(true) {
                break;
            }
        }
        assert_eq!(r, Err(Corrupt));
    }

    proptest::proptest! {
        /// Any interleaving of pushes, reservations (committed shorter, or abandoned),
        /// publications and partial drains delivers exactly the committed records, in order,
        /// never more than published, and the ring never refuses what fits.
        #[test]
        fn any_interleaving_delivers_what_was_committed_in_order(
            ops in proptest::collection::vec((0u8..5, 0usize..9000), 1..400)
        ) {
            let (mut p, fd) = Producer::create(1 << 16).unwrap();
            let mut c = Consumer::open(&fd).unwrap();
            let mut committed: std::collections::VecDeque<Vec<u8>> = Default::default();
            let mut published = 0usize;
            let mut seq = 0u32;
            for (op, len) in ops {
                let len = len % 5000;
                let rec: Vec<u8> = (0..len).map(|k| (k as u32 ^ seq) as u8).collect();
                match op {
                    0 => {
                        if p.push(&rec).unwrap() {
                            committed.push_back(rec);
                            seq += 1;
                        }
                    }
                    1 => {
                        if let Some(buf) = p.reserve(len + 100).unwrap() {
                            buf[..len].copy_from_slice(&rec);
                            p.commit(len);
                            committed.push_back(rec);
                            seq += 1;
                        }
                    }
                    2 => {
                        // Reserved, written, abandoned (replaced by the next reservation).
                        if let Some(buf) = p.reserve(len).unwrap() {
                            buf.fill(0xee);
                        }
                    }
                    3 => {
                        p.publish();
                        published = committed.len();
                    }
                    _ => {
                        // Take up to `len % 7` records of what is published.
                        let mut pos = c.tail();
                        for _ in 0..len % 7 {
                            let Some((got, next)) = c.record_at(pos).unwrap() else {
                                break;
                            };
                            proptest::prop_assert!(published > 0, "a record before publication");
                            let want = committed.pop_front().unwrap();
                            published -= 1;
                            proptest::prop_assert_eq!(got, &want[..]);
                            pos = next;
                        }
                        c.release(pos);
                    }
                }
            }
            p.publish();
            let got = drain(&mut c);
            proptest::prop_assert_eq!(got.len(), committed.len());
            for (g, w) in got.iter().zip(committed.iter()) {
                proptest::prop_assert_eq!(g, w);
            }
        }
    }

    #[test]
    fn a_memfd_that_is_not_a_ring_is_refused() {
        let (_p, fd) = Producer::create(1 << 16).unwrap();
        // SAFETY: test: overwrite the magic through a second mapping.
        let m = Mapping::map(&fd, HEADER).unwrap();
        m.u64_at(0).store(0, Ordering::Relaxed);
        assert!(Consumer::open(&fd).is_err());
    }
}
