//! ServiceIDResReq (SIDR_REQ) and ServiceIDResReqResp (SIDR_REP): their views, the SIDR
//! status and their representations.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::{Error, Result};

/// Size of the private data of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Size of the private data of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Size of the additional information of a SIDR_REP.
pub const SIDR_REP_ADDITIONAL_INFO_LEN: usize = 72;

/// Status of a SIDR_REP (8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported (nobody listens).
    Unsupported,
    /// 2: rejected by the service provider.
    Reject,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect; the additional information holds ClassPortInfo.
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Any other value.
    Unknown(u8),
}

impl SidrStatus {
    /// Decodes a status byte (never fails: unknown values become `Unknown`).
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::Unsupported,
            2 => Self::Reject,
            3 => Self::NoQp,
            4 => Self::Redirect,
            5 => Self::UnsupportedVersion,
            other => Self::Unknown(other),
        }
    }

    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Unsupported => 1,
            Self::Reject => 2,
            Self::NoQp => 3,
            Self::Redirect => 4,
            Self::UnsupportedVersion => 5,
            Self::Unknown(v) => v,
        }
    }
}

cm_view! {
    /// A view of a ServiceIDResReq (SIDR_REQ, attribute 0x0017).
    SidrReqPacket, private_data: 16;
    /// Request ID chosen by the sender.
    request_id, set_request_id: u32 = (0, 0, 32);
    /// Partition key.
    partition_key, set_partition_key: u16 = (4, 0, 16);
    /// Service ID to resolve.
    service_id, set_service_id: u64 = (8, 0, 64);
}

/// A ServiceIDResReq (SIDR_REQ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (rdma_cm puts its 36-byte header first, see [`crate::cma`]).
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Reads a SIDR_REQ. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &SidrReqPacket<T>) -> Result<SidrReqRepr> {
        p.check_len()?;
        Ok(SidrReqRepr {
            request_id: p.request_id(),
            partition_key: p.partition_key(),
            service_id: p.service_id(),
            private_data: read_array(p.buffer.as_ref(), 16),
        })
    }

    /// Length of the CM data a SIDR_REQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the SIDR_REQ, zeroing the reserved bytes. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SidrReqPacket<T>) {
        p.clear();
        p.set_request_id(self.request_id);
        p.set_partition_key(self.partition_key);
        p.set_service_id(self.service_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

cm_view! {
    /// A view of a ServiceIDResReqResp (SIDR_REP, attribute 0x0018).
    SidrRepPacket, private_data: 96;
    /// Request ID of the SIDR_REQ answered.
    request_id, set_request_id: u32 = (0, 0, 32);
    /// Status, raw (see [`SidrStatus`]).
    status, set_status: u8 = (4, 0, 8);
    /// Length of the meaningful part of the additional information.
    additional_info_length, set_additional_info_length: u8 = (5, 0, 8);
    /// ECE vendor ID, high 16 bits.
    vendor_id_high, set_vendor_id_high: u16 = (6, 0, 16);
    /// QPN of the service (24 bits).
    qpn, set_qpn: u32 = (8, 0, 24);
    /// ECE vendor ID, low byte.
    vendor_id_low, set_vendor_id_low: u8 = (11, 0, 8);
    /// Service ID resolved.
    service_id, set_service_id: u64 = (12, 0, 64);
    /// Q_Key of the service's QP.
    qkey, set_qkey: u32 = (20, 0, 32);
}

impl<T: AsRef<[u8]>> SidrRepPacket<T> {
    /// The whole 72-byte additional information field.
    pub fn additional_info(&self) -> &[u8] {
        &self.buffer.as_ref()[24..24 + SIDR_REP_ADDITIONAL_INFO_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SidrRepPacket<T> {
    /// The additional information field, writable.
    pub fn additional_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[24..24 + SIDR_REP_ADDITIONAL_INFO_LEN]
    }
}

/// A ServiceIDResReqResp (SIDR_REP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Number of meaningful bytes in `additional_info` (at most 72).
    pub additional_info_length: u8,
    /// ECE vendor ID (24 bits: high 16 at offset 6, low 8 at offset 11).
    pub vendor_id: u32,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information, all 72 bytes as on the wire.
    pub additional_info: [u8; SIDR_REP_ADDITIONAL_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Reads a SIDR_REP.
    ///
    /// Fails with [`Error::Truncated`] on a short view and [`Error::Malformed`] when the
    /// additional information length exceeds 72.
    pub fn parse<T: AsRef<[u8]>>(p: &SidrRepPacket<T>) -> Result<SidrRepRepr> {
        p.check_len()?;
        let additional_info_length = p.additional_info_length();
        if usize::from(additional_info_length) > SIDR_REP_ADDITIONAL_INFO_LEN {
            return Err(Error::Malformed);
        }
        Ok(SidrRepRepr {
            request_id: p.request_id(),
            status: SidrStatus::from_u8(p.status()),
            additional_info_length,
            vendor_id: u32::from(p.vendor_id_high()) << 8 | u32::from(p.vendor_id_low()),
            qpn: p.qpn(),
            service_id: p.service_id(),
            qkey: p.qkey(),
            additional_info: read_array(p.buffer.as_ref(), 24),
            private_data: read_array(p.buffer.as_ref(), 96),
        })
    }

    /// Length of the CM data a SIDR_REP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the SIDR_REP. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SidrRepPacket<T>) {
        p.clear();
        p.set_request_id(self.request_id);
        p.set_status(self.status.to_u8());
        p.set_additional_info_length(self.additional_info_length);
        p.set_vendor_id_high((self.vendor_id >> 8) as u16);
        p.set_qpn(self.qpn);
        p.set_vendor_id_low(self.vendor_id as u8);
        p.set_service_id(self.service_id);
        p.set_qkey(self.qkey);
        p.additional_info_mut()
            .copy_from_slice(&self.additional_info);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
