//! The Datagram Extended Transport Header (DETH) of UD packets.
//!
//! ```text
//! Q_Key (32) @0 | reserved (8) @4 | SrcQP (24) @5
//! ```

use crate::field::{put_u24, put_u32, u24_at, u32_at};
use crate::{Error, Result};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 8;

mod field {
    pub const QKEY: usize = 0;
    pub const SRC_QP: usize = 5;
    pub const RESERVED: usize = 4;
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

    /// Q_Key: the queue key the destination QP must hold.
    pub fn qkey(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::QKEY)
    }

    /// SrcQP: the sending queue pair number (24 bits).
    pub fn src_qp(&self) -> u32 {
        u24_at(self.buffer.as_ref(), field::SRC_QP)
    }

    /// The reserved byte (sent as zero, ignored on receive).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the field described at [`Packet::qkey`].
    pub fn set_qkey(&mut self, value: u32) {
        put_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Sets the field described at [`Packet::src_qp`]. Only the 24 low bits of `value` are used.
    pub fn set_src_qp(&mut self, value: u32) {
        put_u24(self.buffer.as_mut(), field::SRC_QP, value);
    }

    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESERVED] = value;
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The fields of the header. Reserved bits are ignored on parse and written as zero on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key: the queue key the destination QP must hold.
    pub qkey: u32,
    /// SrcQP: the sending queue pair number (24 bits).
    pub src_qp: u32,
}

impl Repr {
    /// Reads the header. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`]; every bit pattern is otherwise valid.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    /// The length of the emitted header, [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of the view. Fields wider than the wire field are truncated to it.
    ///
    /// # Panics
    /// When the view was made with `new_unchecked` over fewer than [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_reserved(0);
        packet.set_qkey(self.qkey);
        packet.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

    fn repr() -> Repr {
        Repr {
            qkey: 0x8001_0000,
            src_qp: 1,
        }
    }

    #[test]
    fn getters() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.qkey(), 0x8001_0000);
        assert_eq!(p.src_qp(), 1);
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
        p.set_qkey(0x8001_0000);
        p.set_src_qp(1);
        assert_eq!(p.qkey(), 0x8001_0000);
        assert_eq!(p.src_qp(), 1);
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

    #[test]
    fn reserved_ignored_on_parse_and_zeroed_on_emit() {
        let mut b = BYTES;
        b[field::RESERVED] = 0xff;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.reserved(), 0xff);
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        repr().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(b, BYTES);
    }
}
