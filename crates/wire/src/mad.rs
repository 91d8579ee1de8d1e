//! Management datagrams (MADs): the 256-byte messages that InfiniBand management classes,
//! the connection manager among them, exchange on QP1 (the GSI).
//!
//! A MAD is a 24-byte common header followed by 232 bytes of class data:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | base version (1) |
//! | 1 | 1 | management class (0x07 for CM) |
//! | 2 | 1 | class version (2 for CM) |
//! | 3 | 1 | method (0x03 Send for every CM message) |
//! | 4 | 2 | status |
//! | 6 | 2 | class specific |
//! | 8 | 8 | transaction ID |
//! | 16 | 2 | attribute ID |
//! | 18 | 2 | reserved |
//! | 20 | 4 | attribute modifier |
//! | 24 | 232 | class data |
//!
//! Over RoCEv2 a MAD travels as the payload of a UD SEND-only packet from QP1 to QP1, with the
//! Q_Key [`GSI_QKEY`].
//!
//! ```
//! use softrdma_wire::mad::{self, Packet, Repr};
//! let repr = Repr {
//!     mgmt_class: mad::MGMT_CLASS_CM,
//!     class_version: mad::CM_CLASS_VERSION,
//!     method: mad::METHOD_SEND,
//!     status: 0,
//!     class_specific: 0,
//!     transaction_id: 0x2_0000_1234,
//!     attribute_id: mad::ATTR_CM_RTU,
//!     attribute_modifier: 0,
//! };
//! let mut buf = [0u8; mad::MAD_SIZE];
//! let mut pkt = Packet::new_unchecked(&mut buf[..]);
//! repr.emit(&mut pkt);
//! let pkt = Packet::new_checked(&buf[..]).unwrap();
//! assert_eq!(Repr::parse(&pkt).unwrap(), repr);
//! ```

use crate::{Error, Result};

/// Size of every MAD on the wire, header included.
pub const MAD_SIZE: usize = 256;
/// Size of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Size of the class data that follows the header.
pub const MAD_DATA_LEN: usize = MAD_SIZE - MAD_HEADER_LEN;

/// The only base version of InfiniBand MADs (OPA's 0x80 is not supported).
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the communication manager (IBA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;

/// Method Get (request an attribute).
pub const METHOD_GET: u8 = 0x01;
/// Method Set (write an attribute).
pub const METHOD_SET: u8 = 0x02;
/// Method Send: every CM message except ClassPortInfo uses it.
pub const METHOD_SEND: u8 = 0x03;
/// Method Trap.
pub const METHOD_TRAP: u8 = 0x05;
/// Method Report.
pub const METHOD_REPORT: u8 = 0x06;
/// Method TrapRepress.
pub const METHOD_TRAP_REPRESS: u8 = 0x07;
/// Method GetResp (response to Get or Set).
pub const METHOD_GET_RESP: u8 = 0x81;
/// Method ReportResp.
pub const METHOD_REPORT_RESP: u8 = 0x86;

/// Attribute ClassPortInfo (common to all classes).
pub const ATTR_CLASS_PORT_INFO: u16 = 0x0001;
/// CM attribute ConnectRequest (REQ).
pub const ATTR_CM_REQ: u16 = 0x0010;
/// CM attribute MsgRcptAck (MRA).
pub const ATTR_CM_MRA: u16 = 0x0011;
/// CM attribute ConnectReject (REJ).
pub const ATTR_CM_REJ: u16 = 0x0012;
/// CM attribute ConnectReply (REP).
pub const ATTR_CM_REP: u16 = 0x0013;
/// CM attribute ReadyToUse (RTU).
pub const ATTR_CM_RTU: u16 = 0x0014;
/// CM attribute DisconnectRequest (DREQ).
pub const ATTR_CM_DREQ: u16 = 0x0015;
/// CM attribute DisconnectReply (DREP).
pub const ATTR_CM_DREP: u16 = 0x0016;
/// CM attribute ServiceIDResReq (SIDR_REQ).
pub const ATTR_CM_SIDR_REQ: u16 = 0x0017;
/// CM attribute ServiceIDResReqResp (SIDR_REP).
pub const ATTR_CM_SIDR_REP: u16 = 0x0018;
/// CM attribute LoadAlternatePath (LAP); not used on RoCE and not decoded here.
pub const ATTR_CM_LAP: u16 = 0x0019;
/// CM attribute AlternatePathResponse (APR); not used on RoCE and not decoded here.
pub const ATTR_CM_APR: u16 = 0x001A;

/// The well-known Q_Key of the general services interface (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The queue pair number of the general services interface.
pub const GSI_QPN: u32 = 1;

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Range<usize> = 4..6;
    pub const CLASS_SPECIFIC: Range<usize> = 6..8;
    pub const TRANSACTION_ID: Range<usize> = 8..16;
    pub const ATTRIBUTE_ID: Range<usize> = 16..18;
    pub const RESERVED: Range<usize> = 18..20;
    pub const ATTRIBUTE_MODIFIER: Range<usize> = 20..24;
    pub const DATA: Range<usize> = super::MAD_HEADER_LEN..super::MAD_SIZE;
}

/// A zero-copy view of a 256-byte MAD.
///
/// Built with [`Packet::new_checked`], every accessor stays inside the buffer; with
/// [`Packet::new_unchecked`] accessors panic when the buffer is shorter than [`MAD_SIZE`].
/// Bytes beyond the first 256 are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking it holds a whole MAD.
    ///
    /// Fails with [`Error::Truncated`] when the buffer is shorter than [`MAD_SIZE`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds at least [`MAD_SIZE`] bytes ([`Error::Truncated`] if not).
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < MAD_SIZE {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Gives the underlying buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Base version (1 for InfiniBand MADs).
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }

    /// Management class (0x07 for CM).
    pub fn mgmt_class(&self) -> u8 {
        self.b()[field::MGMT_CLASS]
    }

    /// Class version (2 for CM).
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }

    /// Method (0x03 Send for CM messages).
    pub fn method(&self) -> u8 {
        self.b()[field::METHOD]
    }

    /// Status (0 in CM messages).
    pub fn status(&self) -> u16 {
        be16(&self.b()[field::STATUS])
    }

    /// Class-specific field (0 in CM messages).
    pub fn class_specific(&self) -> u16 {
        be16(&self.b()[field::CLASS_SPECIFIC])
    }

    /// Transaction ID, echoed by responses.
    pub fn transaction_id(&self) -> u64 {
        let b = &self.b()[field::TRANSACTION_ID];
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// Attribute ID (which CM message this is).
    pub fn attribute_id(&self) -> u16 {
        be16(&self.b()[field::ATTRIBUTE_ID])
    }

    /// The two reserved bytes after the attribute ID.
    pub fn reserved(&self) -> u16 {
        be16(&self.b()[field::RESERVED])
    }

    /// Attribute modifier (0 in CM messages, or the ECE modifier on recent Linux kernels).
    pub fn attribute_modifier(&self) -> u32 {
        let b = &self.b()[field::ATTRIBUTE_MODIFIER];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The 232 bytes of class data after the header.
    pub fn data(&self) -> &[u8] {
        &self.b()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the base version.
    pub fn set_base_version(&mut self, v: u8) {
        self.bm()[field::BASE_VERSION] = v;
    }

    /// Sets the management class.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.bm()[field::MGMT_CLASS] = v;
    }

    /// Sets the class version.
    pub fn set_class_version(&mut self, v: u8) {
        self.bm()[field::CLASS_VERSION] = v;
    }

    /// Sets the method.
    pub fn set_method(&mut self, v: u8) {
        self.bm()[field::METHOD] = v;
    }

    /// Sets the status.
    pub fn set_status(&mut self, v: u16) {
        self.bm()[field::STATUS].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the class-specific field.
    pub fn set_class_specific(&mut self, v: u16) {
        self.bm()[field::CLASS_SPECIFIC].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the transaction ID.
    pub fn set_transaction_id(&mut self, v: u64) {
        self.bm()[field::TRANSACTION_ID].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the attribute ID.
    pub fn set_attribute_id(&mut self, v: u16) {
        self.bm()[field::ATTRIBUTE_ID].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the reserved bytes after the attribute ID.
    pub fn set_reserved(&mut self, v: u16) {
        self.bm()[field::RESERVED].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the attribute modifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        self.bm()[field::ATTRIBUTE_MODIFIER].copy_from_slice(&v.to_be_bytes());
    }

    /// The class data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[field::DATA]
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// The common header of a MAD, as a plain value.
///
/// The base version is not represented: [`Repr::parse`] accepts only [`BASE_VERSION`] and
/// [`Repr::emit`] always writes it. The two reserved bytes are ignored by `parse` and written
/// as zero by `emit`. The class data is not part of the representation (see [`crate::cm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Management class ([`MGMT_CLASS_CM`] for CM).
    pub mgmt_class: u8,
    /// Class version ([`CM_CLASS_VERSION`] for CM).
    pub class_version: u8,
    /// Method ([`METHOD_SEND`] for CM messages).
    pub method: u8,
    /// Status word.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl Repr {
    /// Reads the header of a MAD.
    ///
    /// Fails with [`Error::Truncated`] when the buffer is shorter than [`MAD_SIZE`] and with
    /// [`Error::Unsupported`] when the base version is not [`BASE_VERSION`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        if packet.base_version() != BASE_VERSION {
            return Err(Error::Unsupported);
        }
        Ok(Repr {
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// The length of the whole MAD this header starts: always [`MAD_SIZE`].
    pub const fn buffer_len(&self) -> usize {
        MAD_SIZE
    }

    /// Writes the 24-byte header (the class data is left untouched).
    ///
    /// Panics if the view is shorter than [`MAD_SIZE`]; views from [`Packet::new_checked`]
    /// never are.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(BASE_VERSION);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_reserved(0);
        packet.set_attribute_modifier(self.attribute_modifier);
    }

    /// The header of a CM message: class [`MGMT_CLASS_CM`], version [`CM_CLASS_VERSION`],
    /// method [`METHOD_SEND`], zero status and attribute modifier.
    pub const fn cm(transaction_id: u64, attribute_id: u16) -> Repr {
        Repr {
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden() -> [u8; MAD_SIZE] {
        let mut b = [0u8; MAD_SIZE];
        b[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x02, 0xfc, 0x9f,
            0x33, 0x56, 0x00, 0x10, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef,
        ]);
        b[24] = 0xaa;
        b[255] = 0xbb;
        b
    }

    #[test]
    fn parse_golden_header() {
        let b = golden();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.base_version(), 1);
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.data().len(), MAD_DATA_LEN);
        assert_eq!(p.data()[0], 0xaa);
        assert_eq!(p.data()[231], 0xbb);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            r,
            Repr {
                mgmt_class: MGMT_CLASS_CM,
                class_version: CM_CLASS_VERSION,
                method: METHOD_SEND,
                status: 0x1234,
                class_specific: 0x5678,
                transaction_id: 0x0000_0002_fc9f_3356,
                attribute_id: ATTR_CM_REQ,
                attribute_modifier: 0xdead_beef,
            }
        );
        let mut out = [0u8; MAD_SIZE];
        out[24..].copy_from_slice(&b[24..]);
        let mut q = Packet::new_checked(&mut out[..]).unwrap();
        r.emit(&mut q);
        assert_eq!(out, b);
        assert_eq!(r.buffer_len(), MAD_SIZE);
    }

    #[test]
    fn setters_and_data_mut() {
        let mut b = [0xffu8; MAD_SIZE];
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        Repr::cm(7, ATTR_CM_DREP).emit(&mut p);
        p.data_mut().fill(0);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.transaction_id(), 7);
        assert_eq!(p.attribute_id(), ATTR_CM_DREP);
        assert!(p.data().iter().all(|&x| x == 0));
        assert_eq!(p.into_inner().len(), MAD_SIZE);
    }

    #[test]
    fn truncated_at_every_length() {
        let b = golden();
        for len in 0..MAD_SIZE {
            assert_eq!(Packet::new_checked(&b[..len]), Err(Error::Truncated));
            assert_eq!(
                Repr::parse(&Packet::new_unchecked(&b[..len])),
                Err(Error::Truncated)
            );
        }
        // Longer buffers are accepted; the tail is ignored.
        let mut long = [0u8; MAD_SIZE + 8];
        long[..MAD_SIZE].copy_from_slice(&b);
        let p = Packet::new_checked(&long[..]).unwrap();
        assert_eq!(p.data().len(), MAD_DATA_LEN);
    }

    #[test]
    fn wrong_base_version() {
        for v in [0u8, 2, 0x80, 0xff] {
            let mut b = golden();
            b[0] = v;
            let p = Packet::new_checked(&b[..]).unwrap();
            assert_eq!(Repr::parse(&p), Err(Error::Unsupported));
        }
    }
}
