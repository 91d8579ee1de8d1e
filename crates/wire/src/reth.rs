//! The RDMA Extended Transport Header (RETH): the remote buffer of an RDMA WRITE or READ.
//!
//! ```text
//! VA (64) @0 | R_Key (32) @8 | DMA Length (32) @12
//! ```

use crate::field::{put_u32, put_u64, u32_at, u64_at};
use crate::{Error, Result};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 16;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
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

    /// VA: the remote virtual address.
    pub fn va(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::VA)
    }

    /// R_Key: the remote key of the target memory region.
    pub fn rkey(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::RKEY)
    }

    /// DMA Length: the total length of the RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::DMA_LEN)
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

    /// Sets the field described at [`Packet::dma_len`].
    pub fn set_dma_len(&mut self, value: u32) {
        put_u32(self.buffer.as_mut(), field::DMA_LEN, value);
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
    /// VA: the remote virtual address.
    pub va: u64,
    /// R_Key: the remote key of the target memory region.
    pub rkey: u32,
    /// DMA Length: the total length of the RDMA operation in bytes.
    pub dma_len: u32,
}

impl Repr {
    /// Reads the header. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`]; every bit pattern is otherwise valid.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
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
        packet.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];

    fn repr() -> Repr {
        Repr {
            va: 0x0000_7f12_3456_789a,
            rkey: 0xdead_beef,
            dma_len: 0x0001_0000,
        }
    }

    #[test]
    fn getters() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.va(), 0x0000_7f12_3456_789a);
        assert_eq!(p.rkey(), 0xdead_beef);
        assert_eq!(p.dma_len(), 0x0001_0000);
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
        p.set_va(0x0000_7f12_3456_789a);
        p.set_rkey(0xdead_beef);
        p.set_dma_len(0x0001_0000);
        assert_eq!(p.va(), 0x0000_7f12_3456_789a);
        assert_eq!(p.rkey(), 0xdead_beef);
        assert_eq!(p.dma_len(), 0x0001_0000);
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
