//! The Base Transport Header (BTH), the 12 bytes that start every RoCEv2 transport packet.
//!
//! ```text
//!  byte 0   | 1                    | 2..4  | 4               | 5..8    | 8          | 9..12
//!  OpCode   | SE|M|PadCnt(2)|TVer(4)| P_Key | FECN|BECN|resv6 | DestQP  | AckReq|resv7 | PSN
//! ```

use crate::field::{put_u16, put_u24, u16_at, u24_at};
use crate::opcode::{Opcode, BTH_LEN};
use crate::{Error, Result};

/// Length of the BTH in bytes (the opcode table's [`BTH_LEN`]).
pub const HEADER_LEN: usize = BTH_LEN;

/// The only transport header version defined; anything else is rejected.
pub const TVER: u8 = 0;

/// The default (full-membership) partition key every RoCE peer uses.
pub const DEFAULT_PKEY: u16 = 0xffff;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const CONG: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK: usize = 8;
    pub const PSN: usize = 9;

    pub const SE: u8 = 0x80;
    pub const MIG: u8 = 0x40;
    pub const PAD_MASK: u8 = 0x30;
    pub const PAD_SHIFT: u8 = 4;
    pub const TVER_MASK: u8 = 0x0f;
    pub const FECN: u8 = 0x80;
    pub const BECN: u8 = 0x40;
    pub const RESV6A: u8 = 0x3f;
    pub const ACK_REQ: u8 = 0x80;
    pub const RESV7: u8 = 0x7f;
}

/// A read/write view of a BTH at the start of a buffer.
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

    /// The OpCode field.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }

    /// The SE (solicited event) bit.
    pub fn solicited_event(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::SE != 0
    }

    /// The M (MigReq) bit.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & field::MIG != 0
    }

    /// The PadCnt field (0..=3): pad bytes between the payload and the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & field::PAD_MASK) >> field::PAD_SHIFT
    }

    /// The TVer field (transport header version, must be 0).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & field::TVER_MASK
    }

    /// The P_Key field.
    pub fn pkey(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::PKEY)
    }

    /// The FECN bit.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::CONG] & field::FECN != 0
    }

    /// The BECN bit.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::CONG] & field::BECN != 0
    }

    /// The six reserved bits after FECN/BECN (`resv6a`).
    pub fn resv6a(&self) -> u8 {
        self.buffer.as_ref()[field::CONG] & field::RESV6A
    }

    /// The DestQP field (24 bits).
    pub fn dest_qp(&self) -> u32 {
        u24_at(self.buffer.as_ref(), field::DEST_QP)
    }

    /// The AckReq bit.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK] & field::ACK_REQ != 0
    }

    /// The seven reserved bits after AckReq (`resv7`).
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK] & field::RESV7
    }

    /// The PSN field (24 bits).
    pub fn psn(&self) -> u32 {
        u24_at(self.buffer.as_ref(), field::PSN)
    }
}

fn set_bit(byte: &mut u8, mask: u8, on: bool) {
    if on {
        *byte |= mask;
    } else {
        *byte &= !mask;
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the OpCode field.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = value.0;
    }

    /// Sets the SE bit.
    pub fn set_solicited_event(&mut self, value: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], field::SE, value);
    }

    /// Sets the M (MigReq) bit.
    pub fn set_mig_req(&mut self, value: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], field::MIG, value);
    }

    /// Sets PadCnt; only the two low bits of `value` are used.
    pub fn set_pad_count(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::PAD_MASK) | ((value << field::PAD_SHIFT) & field::PAD_MASK);
    }

    /// Sets TVer; only the four low bits of `value` are used.
    pub fn set_tver(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::TVER_MASK) | (value & field::TVER_MASK);
    }

    /// Sets the P_Key field.
    pub fn set_pkey(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), field::PKEY, value);
    }

    /// Sets the FECN bit.
    pub fn set_fecn(&mut self, value: bool) {
        set_bit(&mut self.buffer.as_mut()[field::CONG], field::FECN, value);
    }

    /// Sets the BECN bit.
    pub fn set_becn(&mut self, value: bool) {
        set_bit(&mut self.buffer.as_mut()[field::CONG], field::BECN, value);
    }

    /// Sets the `resv6a` bits; only the six low bits of `value` are used.
    pub fn set_resv6a(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::CONG];
        *b = (*b & !field::RESV6A) | (value & field::RESV6A);
    }

    /// Sets DestQP; only the 24 low bits of `value` are used.
    pub fn set_dest_qp(&mut self, value: u32) {
        put_u24(self.buffer.as_mut(), field::DEST_QP, value);
    }

    /// Sets the AckReq bit.
    pub fn set_ack_req(&mut self, value: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ACK], field::ACK_REQ, value);
    }

    /// Sets the `resv7` bits; only the seven low bits of `value` are used.
    pub fn set_resv7(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::ACK];
        *b = (*b & !field::RESV7) | (value & field::RESV7);
    }

    /// Sets the PSN; only the 24 low bits of `value` are used.
    pub fn set_psn(&mut self, value: u32) {
        put_u24(self.buffer.as_mut(), field::PSN, value);
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The fields of a BTH. Reserved bits are not represented: they are ignored on parse and
/// written as zero on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE: the responder should raise a solicited completion event.
    pub solicited_event: bool,
    /// M: migration request (always false on RoCE).
    pub mig_req: bool,
    /// PadCnt (0..=3).
    pub pad_count: u8,
    /// P_Key (normally [`DEFAULT_PKEY`]).
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP (24 bits).
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
}

impl Repr {
    /// Reads a BTH. Fails with [`Error::Truncated`] when the view is shorter than
    /// [`HEADER_LEN`] and with [`Error::Malformed`] when TVer is not 0. The opcode is not
    /// validated here (see [`crate::roce::Packet::new_checked`]).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        match packet.buffer.as_ref().first_chunk::<HEADER_LEN>() {
            Some(b) => Repr::from_bytes(b),
            None => Err(Error::Truncated),
        }
    }

    /// [`Repr::parse`] of a BTH already known to be complete.
    #[inline]
    pub(crate) fn from_bytes(b: &[u8; HEADER_LEN]) -> Result<Repr> {
        let flags = b[field::FLAGS];
        if flags & field::TVER_MASK != TVER {
            return Err(Error::Malformed);
        }
        let cong = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let ack = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
        Ok(Repr {
            opcode: Opcode(b[field::OPCODE]),
            solicited_event: flags & field::SE != 0,
            mig_req: flags & field::MIG != 0,
            pad_count: (flags & field::PAD_MASK) >> field::PAD_SHIFT,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: cong & (u32::from(field::FECN) << 24) != 0,
            becn: cong & (u32::from(field::BECN) << 24) != 0,
            dest_qp: cong & 0x00ff_ffff,
            ack_req: ack & (u32::from(field::ACK_REQ) << 24) != 0,
            psn: ack & 0x00ff_ffff,
        })
    }

    /// The twelve header bytes [`Repr::emit`] writes.
    #[inline]
    pub(crate) fn to_bytes(self) -> [u8; HEADER_LEN] {
        let bit = |on: bool, mask: u8| if on { mask } else { 0 };
        let flags = bit(self.solicited_event, field::SE)
            | bit(self.mig_req, field::MIG)
            | ((self.pad_count << field::PAD_SHIFT) & field::PAD_MASK)
            | TVER;
        let cong = bit(self.fecn, field::FECN) | bit(self.becn, field::BECN);
        let ack = bit(self.ack_req, field::ACK_REQ);
        let pkey = self.pkey.to_be_bytes();
        let qp = self.dest_qp.to_be_bytes();
        let psn = self.psn.to_be_bytes();
        [
            self.opcode.0,
            flags,
            pkey[0],
            pkey[1],
            cong,
            qp[1],
            qp[2],
            qp[3],
            ack,
            psn[1],
            psn[2],
            psn[3],
        ]
    }

    /// The length of the emitted header, [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header, with TVer and reserved bits zero. Values wider than their field
    /// (PadCnt over 3, DestQP or PSN over 24 bits) are truncated to the field width.
    ///
    /// # Panics
    /// When the view was made with `new_unchecked` over fewer than [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&self.to_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY, SE, pad 3, pkey ffff, BECN, QP 0x000011, AckReq, PSN 0x123456.
    const BYTES: [u8; 12] = [
        0x04, 0xb0, 0xff, 0xff, 0x40, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56,
    ];

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: true,
            mig_req: false,
            pad_count: 3,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x123456,
        }
    }

    #[test]
    fn getters() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY);
        assert!(p.solicited_event());
        assert!(!p.mig_req());
        assert_eq!(p.pad_count(), 3);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0xffff);
        assert!(!p.fecn());
        assert!(p.becn());
        assert_eq!(p.resv6a(), 0);
        assert_eq!(p.dest_qp(), 0x11);
        assert!(p.ack_req());
        assert_eq!(p.resv7(), 0);
        assert_eq!(p.psn(), 0x123456);
    }

    #[test]
    fn parse_emit_golden() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
        let mut buf = [0xaau8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(repr().buffer_len(), 12);
    }

    #[test]
    fn setters_keep_neighbours() {
        let mut buf = [0xffu8; 12];
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.set_pad_count(1);
        p.set_tver(0);
        p.set_fecn(false);
        p.set_resv7(0);
        p.set_dest_qp(0x0123_4567);
        assert_eq!(p.pad_count(), 1);
        assert!(p.solicited_event() && p.mig_req() && p.becn() && p.ack_req());
        assert_eq!(p.resv6a(), 0x3f);
        assert_eq!(p.dest_qp(), 0x23_4567);
        assert_eq!(p.psn(), 0xff_ffff);
        p.set_resv6a(0);
        p.set_mig_req(false);
        p.set_psn(0x1_000_001);
        assert_eq!(p.psn(), 1);
        assert_eq!(p.resv6a(), 0);
        assert!(!p.mig_req());
    }

    #[test]
    fn reserved_bits_ignored_on_parse() {
        let mut b = BYTES;
        b[4] |= 0x3f;
        b[8] |= 0x7f;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            repr()
        );
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
    fn tver_nonzero_is_malformed() {
        for tver in 1..16u8 {
            let mut b = BYTES;
            b[1] = (b[1] & 0xf0) | tver;
            let p = Packet::new_checked(&b[..]).unwrap();
            assert_eq!(p.tver(), tver);
            assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        }
    }
}
