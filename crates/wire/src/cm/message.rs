//! [`Message`]: any CM message, decoded from and written into a MAD by attribute ID.

use super::bits::CM_DATA_LEN;
use super::dreq::{DrepPacket, DrepRepr, DreqPacket, DreqRepr};
use super::mra::{MraPacket, MraRepr};
use super::rej::{RejPacket, RejRepr};
use super::rep::{RepPacket, RepRepr};
use super::req::{ReqPacket, ReqRepr};
use super::rtu::{RtuPacket, RtuRepr};
use super::sidr::{SidrRepPacket, SidrRepRepr, SidrReqPacket, SidrReqRepr};
use crate::mad;
use crate::{Error, Result};

/// Any CM message this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
}

impl Message {
    /// Decodes the CM message carried by a MAD.
    ///
    /// Fails with [`Error::Truncated`] when the MAD is shorter than 256 bytes; with
    /// [`Error::Unsupported`] when the base version is not 1, the class is not CM (0x07), the
    /// class version is not 2, the method is not Send, or the attribute is not one of the nine
    /// messages decoded here (LAP, APR and ClassPortInfo included); and with
    /// [`Error::Malformed`] when a field holds a value the format forbids (see each `Repr`'s
    /// `parse`). The MAD's status, class-specific, reserved and attribute modifier fields are
    /// not checked.
    pub fn parse<T: AsRef<[u8]>>(mad: &mad::Packet<T>) -> Result<Message> {
        mad.check_len()?;
        if mad.base_version() != mad::BASE_VERSION
            || mad.mgmt_class() != mad::MGMT_CLASS_CM
            || mad.class_version() != mad::CM_CLASS_VERSION
            || mad.method() != mad::METHOD_SEND
        {
            return Err(Error::Unsupported);
        }
        Self::parse_data(mad.attribute_id(), mad.data())
    }

    /// Decodes the CM data `data` of a message whose MAD attribute ID is `attribute_id`.
    ///
    /// Fails with [`Error::Truncated`] when `data` is shorter than [`CM_DATA_LEN`],
    /// [`Error::Unsupported`] on an attribute ID not decoded here and [`Error::Malformed`] on a
    /// forbidden field value.
    pub fn parse_data(attribute_id: u16, data: &[u8]) -> Result<Message> {
        Ok(match attribute_id {
            mad::ATTR_CM_REQ => Message::Req(ReqRepr::parse(&ReqPacket::new_checked(data)?)?),
            mad::ATTR_CM_MRA => Message::Mra(MraRepr::parse(&MraPacket::new_checked(data)?)?),
            mad::ATTR_CM_REJ => Message::Rej(RejRepr::parse(&RejPacket::new_checked(data)?)?),
            mad::ATTR_CM_REP => Message::Rep(RepRepr::parse(&RepPacket::new_checked(data)?)?),
            mad::ATTR_CM_RTU => Message::Rtu(RtuRepr::parse(&RtuPacket::new_checked(data)?)?),
            mad::ATTR_CM_DREQ => Message::Dreq(DreqRepr::parse(&DreqPacket::new_checked(data)?)?),
            mad::ATTR_CM_DREP => Message::Drep(DrepRepr::parse(&DrepPacket::new_checked(data)?)?),
            mad::ATTR_CM_SIDR_REQ => {
                Message::SidrReq(SidrReqRepr::parse(&SidrReqPacket::new_checked(data)?)?)
            }
            mad::ATTR_CM_SIDR_REP => {
                Message::SidrRep(SidrRepRepr::parse(&SidrRepPacket::new_checked(data)?)?)
            }
            _ => return Err(Error::Unsupported),
        })
    }

    /// The MAD attribute ID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(_) => mad::ATTR_CM_REQ,
            Message::Mra(_) => mad::ATTR_CM_MRA,
            Message::Rej(_) => mad::ATTR_CM_REJ,
            Message::Rep(_) => mad::ATTR_CM_REP,
            Message::Rtu(_) => mad::ATTR_CM_RTU,
            Message::Dreq(_) => mad::ATTR_CM_DREQ,
            Message::Drep(_) => mad::ATTR_CM_DREP,
            Message::SidrReq(_) => mad::ATTR_CM_SIDR_REQ,
            Message::SidrRep(_) => mad::ATTR_CM_SIDR_REP,
        }
    }

    /// The conventional short name of the message ("REQ", "SIDR_REP", …).
    pub const fn name(&self) -> &'static str {
        match self {
            Message::Req(_) => "REQ",
            Message::Mra(_) => "MRA",
            Message::Rej(_) => "REJ",
            Message::Rep(_) => "REP",
            Message::Rtu(_) => "RTU",
            Message::Dreq(_) => "DREQ",
            Message::Drep(_) => "DREP",
            Message::SidrReq(_) => "SIDR_REQ",
            Message::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Length of the CM data every message occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the CM data (the 232 bytes after the MAD header) into `data`.
    ///
    /// Fails with [`Error::Truncated`] when `data` is shorter than [`CM_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        if data.len() < CM_DATA_LEN {
            return Err(Error::Truncated);
        }
        match self {
            Message::Req(r) => r.emit(&mut ReqPacket::new_unchecked(data)),
            Message::Mra(r) => r.emit(&mut MraPacket::new_unchecked(data)),
            Message::Rej(r) => r.emit(&mut RejPacket::new_unchecked(data)),
            Message::Rep(r) => r.emit(&mut RepPacket::new_unchecked(data)),
            Message::Rtu(r) => r.emit(&mut RtuPacket::new_unchecked(data)),
            Message::Dreq(r) => r.emit(&mut DreqPacket::new_unchecked(data)),
            Message::Drep(r) => r.emit(&mut DrepPacket::new_unchecked(data)),
            Message::SidrReq(r) => r.emit(&mut SidrReqPacket::new_unchecked(data)),
            Message::SidrRep(r) => r.emit(&mut SidrRepPacket::new_unchecked(data)),
        }
        Ok(())
    }

    /// Writes a whole 256-byte CM MAD: base version 1, class CM, class version 2, method Send,
    /// status 0, the given transaction ID, this message's attribute ID, attribute modifier 0,
    /// then the message. To set another attribute modifier, emit a [`mad::Repr`] and
    /// [`Message::emit`] into [`mad::Packet::data_mut`] instead.
    ///
    /// Fails with [`Error::Truncated`] when `buf` is shorter than [`mad::MAD_SIZE`].
    pub fn emit_mad(&self, transaction_id: u64, buf: &mut [u8]) -> Result<()> {
        let mut packet = mad::Packet::new_checked(buf)?;
        mad::Repr::cm(transaction_id, self.attribute_id()).emit(&mut packet);
        self.emit(packet.data_mut())
    }
}
