//! The Atomic Extended Transport Header (AtomicETH) of COMPARE_SWAP and FETCH_ADD.
//!
//! The header is 28 bytes long, so the two 64-bit operands are *not* 8-byte aligned inside
//! the packet: Swap (or Add) data sits at offset 12 and Compare data at offset 20. For
//! FETCH_ADD the addend goes in `swap_add` and `compare` is ignored.
//!
//! ```text
//! VA (64) @0 | R_Key (32) @8 | Swap/Add Data (64) @12 | Compare Data (64) @20
//! ```

use crate::field::{put_u32, put_u64, u32_at, u64_at};
use crate::{Error, Result};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 28;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}

/// A read/write view of the header at the start of a buffer.
///
/// Getters and setters index the buffer directly: on a view made with
/// [`Packet::new_unchecked`] over fewer than [`HEADER_LEN`] bytes they panic. Views made with
/// [`Packet::new_checked`] never panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer, failing with [`Error::Truncated`] when it is shorter than
    /// [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`Error::Truncated`] when the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// VA: the remote virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::VA)
    }

    /// R_Key: the remote key of the target memory region.
    pub fn rkey(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::RKEY)
    }

    /// Swap (COMPARE_SWAP) or Add (FETCH_ADD) Data.
    pub fn swap_add(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// Compare Data (COMPARE_SWAP only).
    pub fn compare(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the field described at [`Packet::va`].
    pub fn set_va(&mut self, value: u64) {
        put_u64(self.buffer.as_mut(), field::VA, value);
    }

    /// Sets the field described at [`Packet::rkey`].
    pub fn set_rkey(&mut self, value: u32) {
        put_u32(self.buffer.as_mut(), field::RKEY, value);
    }

    /// Sets the field described at [`Packet::swap_add`].
    pub fn set_swap_add(&mut self, value: u64) {
        put_u64(self.buffer.as_mut(), field::SWAP_ADD, value);
    }

    /// Sets the field described at [`Packet::compare`].
    pub fn set_compare(&mut self, value: u64) {
        put_u64(self.buffer.as_mut(), field::COMPARE, value);
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The fields of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// VA: the remote virtual address of the 8-byte target.
    pub va: u64,
    /// R_Key: the remote key of the target memory region.
    pub rkey: u32,
    /// Swap (COMPARE_SWAP) or Add (FETCH_ADD) Data.
    pub swap_add: u64,
    /// Compare Data (COMPARE_SWAP only).
    pub compare: u64,
}

impl Repr {
    /// Reads the header. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`]; every bit pattern is otherwise valid.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    /// The length of the emitted header, [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of the view.
    ///
    /// # Panics
    /// When the view was made with `new_unchecked` over fewer than [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 28] = [
        0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x10, 0x08, 0x00, 0x00, 0x03, 0x04, 0x11, 0x22, 0x33,
        0x44, 0x55, 0x66, 0x77, 0x88, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    ];

    fn repr() -> Repr {
        Repr {
            va: 0x0040_1008,
            rkey: 0x0304,
            swap_add: 0x1122_3344_5566_7788,
            compare: 0x0102_0304_0506_0708,
        }
    }

    #[test]
    fn getters() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.va(), 0x0040_1008);
        assert_eq!(p.rkey(), 0x0304);
        assert_eq!(p.swap_add(), 0x1122_3344_5566_7788);
        assert_eq!(p.compare(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn parse_emit_golden() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        let mut buf = [0xa5u8; HEADER_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(repr().buffer_len(), HEADER_LEN);
        assert_eq!(p.into_inner(), &BYTES[..]);
    }

    #[test]
    fn setters_round_trip() {
        let mut buf = [0u8; HEADER_LEN + 3];
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.set_va(0x0040_1008);
        p.set_rkey(0x0304);
        p.set_swap_add(0x1122_3344_5566_7788);
        p.set_compare(0x0102_0304_0506_0708);
        assert_eq!(p.va(), 0x0040_1008);
        assert_eq!(p.rkey(), 0x0304);
        assert_eq!(p.swap_add(), 0x1122_3344_5566_7788);
        assert_eq!(p.compare(), 0x0102_0304_0506_0708);
        assert_eq!(&buf[..HEADER_LEN], &BYTES[..]);
        assert_eq!(&buf[HEADER_LEN..], &[0, 0, 0]);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Packet::new_checked(&BYTES[..n]).unwrap_err(),
                Error::Truncated
            );
            assert_eq!(
                Repr::parse(&Packet::new_unchecked(&BYTES[..n])).unwrap_err(),
                Error::Truncated
            );
        }
    }
}
