//! The Atomic Acknowledge Extended Transport Header (AtomicAckETH): the value the target
//! held before an atomic operation.
//!
//! ```text
//! Original Remote Data (64) @0
//! ```

use crate::field::{put_u64, u64_at};
use crate::{Error, Result};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 8;

mod field {
    pub const ORIG_DATA: usize = 0;
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

    /// Original Remote Data: the 8 bytes at the target before the atomic operation.
    pub fn orig_data(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::ORIG_DATA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the field described at [`Packet::orig_data`].
    pub fn set_orig_data(&mut self, value: u64) {
        put_u64(self.buffer.as_mut(), field::ORIG_DATA, value);
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
    /// Original Remote Data: the 8 bytes at the target before the atomic operation.
    pub orig_data: u64,
}

impl Repr {
    /// Reads the header. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`]; every bit pattern is otherwise valid.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            orig_data: packet.orig_data(),
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
        packet.set_orig_data(self.orig_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 8] = [0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10];

    fn repr() -> Repr {
        Repr {
            orig_data: 0xfedc_ba98_7654_3210,
        }
    }

    #[test]
    fn getters() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.orig_data(), 0xfedc_ba98_7654_3210);
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
        p.set_orig_data(0xfedc_ba98_7654_3210);
        assert_eq!(p.orig_data(), 0xfedc_ba98_7654_3210);
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
