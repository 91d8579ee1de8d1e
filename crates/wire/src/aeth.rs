//! The ACK Extended Transport Header (AETH) of acknowledgements and read responses.
//!
//! ```text
//! Syndrome (8) @0 | MSN (24) @1
//! ```
//!
//! The syndrome byte is `0 | type (2 bits) | value (5 bits)`:
//! type `00` is an ACK whose value is a credit count code, `01` an RNR NAK whose value is the
//! RNR timer code, `11` a NAK whose value is a [`NakCode`]; type `10` and a set top bit are
//! reserved.

use crate::field::{put_u24, u24_at};
use crate::{Error, Result};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 4;

/// The credit code meaning "no end-to-end credit information" (what rxe always sends).
pub const CREDIT_INVALID: u8 = 0x1f;

/// The receive-queue entries each credit code 0..=30 stands for (IBA 9.7.5.1 encodes the
/// count on a logarithmic scale; a responder advertises the largest code not above its
/// count).
const CREDIT_COUNTS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The credit code advertising `available` posted receive requests: the largest code whose
/// count does not exceed it ([`CREDIT_INVALID`] for `None`, a responder that cannot say,
/// such as one on a shared receive queue).
pub fn credit_code(available: Option<u32>) -> u8 {
    match available {
        None => CREDIT_INVALID,
        // (The counts rise: the codes whose count is at most `n` come first.)
        Some(n) => CREDIT_COUNTS.partition_point(|&c| c <= n).saturating_sub(1) as u8,
    }
}

/// The number of receive requests credit code `code` stands for; `None` for
/// [`CREDIT_INVALID`] (no end-to-end flow control information) and for values above it.
pub fn credit_count(code: u8) -> Option<u32> {
    CREDIT_COUNTS.get(usize::from(code)).copied()
}

mod field {
    pub const SYNDROME: usize = 0;
    pub const MSN: usize = 1;
}

const TYPE_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1f;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

/// The reason code of a NAK (syndrome type `11`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error (`0x60`): the requester must retransmit from the NAK's PSN.
    PsnSequenceError,
    /// Invalid request (`0x61`).
    InvalidRequest,
    /// Remote access error (`0x62`).
    RemoteAccessError,
    /// Remote operational error (`0x63`).
    RemoteOperationalError,
    /// Invalid RD request (`0x64`).
    InvalidRdRequest,
}

impl NakCode {
    /// The five-bit value of the code, 0..=4.
    #[inline]
    pub const fn value(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }

    /// The code with five-bit value `value`; fails with [`Error::Malformed`] for the
    /// reserved values 5..=31 (and anything larger).
    #[inline]
    pub const fn from_value(value: u8) -> Result<NakCode> {
        match value {
            0 => Ok(NakCode::PsnSequenceError),
            1 => Ok(NakCode::InvalidRequest),
            2 => Ok(NakCode::RemoteAccessError),
            3 => Ok(NakCode::RemoteOperationalError),
            4 => Ok(NakCode::InvalidRdRequest),
            _ => Err(Error::Malformed),
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a credit count code (0..=31, 31 = [`CREDIT_INVALID`]).
    Ack {
        /// The credit count code.
        credit: u8,
    },
    /// Receiver-not-ready NAK with the RNR timer code (0..=31) the requester must wait.
    RnrNak {
        /// The RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Decodes a syndrome byte. Fails with [`Error::Malformed`] when the top bit is set, the
    /// type is the reserved `10`, or a NAK code is reserved.
    #[inline]
    pub const fn from_byte(byte: u8) -> Result<Syndrome> {
        if byte & 0x80 != 0 {
            return Err(Error::Malformed);
        }
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => Ok(Syndrome::Ack { credit: value }),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak { timer: value }),
            TYPE_NAK => match NakCode::from_value(value) {
                Ok(c) => Ok(Syndrome::Nak(c)),
                Err(e) => Err(e),
            },
            _ => Err(Error::Malformed),
        }
    }

    /// Encodes the syndrome byte. Credit and timer codes are truncated to five bits.
    #[inline]
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit } => TYPE_ACK | (credit & VALUE_MASK),
            Syndrome::RnrNak { timer } => TYPE_RNR_NAK | (timer & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | code.value(),
        }
    }

    /// Whether this is a positive acknowledgement.
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

/// A read/write view of an AETH at the start of a buffer.
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

    /// The raw Syndrome byte (see [`Syndrome::from_byte`] to decode it).
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// MSN: the responder's message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        u24_at(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the raw Syndrome byte.
    pub fn set_syndrome(&mut self, value: u8) {
        self.buffer.as_mut()[field::SYNDROME] = value;
    }

    /// Sets the MSN; only the 24 low bits of `value` are used.
    pub fn set_msn(&mut self, value: u32) {
        put_u24(self.buffer.as_mut(), field::MSN, value);
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The decoded syndrome.
    pub syndrome: Syndrome,
    /// MSN (24 bits).
    pub msn: u32,
}

impl Repr {
    /// Reads an AETH. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`] and with [`Error::Malformed`] when the syndrome is reserved.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: Syndrome::from_byte(packet.syndrome())?,
            msn: packet.msn(),
        })
    }

    /// The length of the emitted header, [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header. An MSN wider than 24 bits is truncated.
    ///
    /// # Panics
    /// When the view was made with `new_unchecked` over fewer than [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_syndrome(self.syndrome.to_byte());
        packet.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Repr> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    #[test]
    fn golden_ack() {
        let b = [0x1f, 0x00, 0x01, 0x02];
        let r = parse(&b).unwrap();
        assert_eq!(
            r,
            Repr {
                syndrome: Syndrome::Ack {
                    credit: CREDIT_INVALID
                },
                msn: 0x102
            }
        );
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.syndrome(), 0x1f);
        assert_eq!(p.msn(), 0x102);
        let mut out = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn golden_rnr_and_naks() {
        let cases = [
            (0x2e, Syndrome::RnrNak { timer: 14 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
        ];
        for (byte, syn) in cases {
            let b = [byte, 0xab, 0xcd, 0xef];
            let r = parse(&b).unwrap();
            assert_eq!(r.syndrome, syn);
            assert_eq!(r.msn, 0xabcdef);
            assert!(!syn.is_ack());
            let mut out = [0u8; 4];
            r.emit(&mut Packet::new_unchecked(&mut out[..]));
            assert_eq!(out, b);
        }
    }

    #[test]
    fn every_syndrome_byte() {
        for byte in 0..=255u8 {
            let r = Syndrome::from_byte(byte);
            let valid = byte < 0x40 || (0x60..=0x64).contains(&byte);
            assert_eq!(r.is_ok(), valid, "syndrome {byte:#x}");
            if let Ok(s) = r {
                assert_eq!(s.to_byte(), byte);
            } else {
                assert_eq!(r.unwrap_err(), Error::Malformed);
                assert_eq!(parse(&[byte, 0, 0, 0]).unwrap_err(), Error::Malformed);
            }
        }
    }

    #[test]
    fn setters() {
        let mut b = [0u8; 4];
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_syndrome(0x61);
        p.set_msn(0xff12_3456);
        assert_eq!(p.msn(), 0x12_3456);
        assert_eq!(b, [0x61, 0x12, 0x34, 0x56]);
    }

    #[test]
    fn truncated_at_every_length() {
        let b = [0x1f, 0, 0, 1];
        for n in 0..HEADER_LEN {
            assert_eq!(Packet::new_checked(&b[..n]).unwrap_err(), Error::Truncated);
            assert_eq!(
                Repr::parse(&Packet::new_unchecked(&b[..n])).unwrap_err(),
                Error::Truncated
            );
        }
    }

    #[test]
    fn credit_codes_round_down_on_the_logarithmic_scale() {
        assert_eq!(credit_code(None), CREDIT_INVALID);
        assert_eq!(credit_code(Some(0)), 0);
        assert_eq!(credit_code(Some(4)), 4);
        assert_eq!(credit_code(Some(5)), 4);
        assert_eq!(credit_code(Some(6)), 5);
        assert_eq!(credit_code(Some(511)), 17);
        assert_eq!(credit_code(Some(512)), 18);
        assert_eq!(credit_code(Some(u32::MAX)), 30);
        for code in 0..=30u8 {
            assert_eq!(credit_code(credit_count(code)), code);
        }
        assert_eq!(credit_count(CREDIT_INVALID), None);
        assert_eq!(credit_count(0xff), None);
        // Every count up to past the largest code, and each code's neighbours: the largest
        // code whose count is at most n.
        let slow = |n: u32| CREDIT_COUNTS.iter().rposition(|&c| c <= n).unwrap() as u8;
        let edges = CREDIT_COUNTS
            .iter()
            .flat_map(|&c| [c.saturating_sub(1), c, c + 1]);
        for n in (0..70_000).chain(edges).chain([u32::MAX]) {
            assert_eq!(credit_code(Some(n)), slow(n), "{n}");
        }
    }
}
