//! ConnectReject (REJ): its view, the reason codes and its representation.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::{Error, Result};

/// Size of the private data of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Size of the additional rejection information (ARI) of a REJ.
pub const REJ_ARI_LEN: usize = 72;

/// Which message a REJ rejects (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageRejected {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// Anything else, e.g. a timeout of the active side (2).
    Other,
}

impl MessageRejected {
    /// Decodes the 2-bit value; fails with [`Error::Malformed`] on the reserved value 3.
    pub const fn from_bits(v: u8) -> Result<Self> {
        match v {
            0 => Ok(Self::Req),
            1 => Ok(Self::Rep),
            2 => Ok(Self::Other),
            _ => Err(Error::Malformed),
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
        }
    }
}

macro_rules! reject_reasons {
    ($( $(#[$doc:meta])* $name:ident = $v:expr, )*) => {
        /// The reason code of a REJ (IBTA table "Rejection Reason", Linux
        /// `enum ib_cm_rej_reason`).
        ///
        /// [`RejectReason::from_u16`] maps every defined code to its variant and anything else
        /// to `Unknown`, so `Unknown` never holds a defined code when built that way.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejectReason {
            $( $(#[$doc])* $name, )*
            /// A code this crate does not name (reserved or vendor specific).
            Unknown(u16),
        }

        impl RejectReason {
            /// Decodes a reason code (never fails: unknown codes become `Unknown`).
            pub const fn from_u16(v: u16) -> Self {
                match v {
                    $( $v => Self::$name, )*
                    other => Self::Unknown(other),
                }
            }

            /// The 16-bit wire value.
            pub const fn to_u16(self) -> u16 {
                match self {
                    $( Self::$name => $v, )*
                    Self::Unknown(v) => v,
                }
            }
        }
    };
}

reject_reasons! {
    /// 1: no QP available.
    NoQp = 1,
    /// 2: no EE context available.
    NoEec = 2,
    /// 3: no resources available.
    NoResources = 3,
    /// 4: timeout (the active side gave up waiting for a REP).
    Timeout = 4,
    /// 5: unsupported request.
    Unsupported = 5,
    /// 6: invalid communication ID.
    InvalidCommId = 6,
    /// 7: invalid communication instance.
    InvalidCommInstance = 7,
    /// 8: invalid service ID — nobody listens (rdma_cm: "connection refused").
    InvalidServiceId = 8,
    /// 9: invalid transport service type.
    InvalidTransportType = 9,
    /// 10: stale connection.
    StaleConn = 10,
    /// 11: RDC does not exist.
    RdcNotExist = 11,
    /// 12: primary remote port GID rejected.
    InvalidGid = 12,
    /// 13: primary remote port LID rejected.
    InvalidLid = 13,
    /// 14: invalid primary SL.
    InvalidSl = 14,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass = 15,
    /// 16: invalid primary hop limit.
    InvalidHopLimit = 16,
    /// 17: invalid primary packet rate.
    InvalidPacketRate = 17,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid = 18,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid = 19,
    /// 20: invalid alternate SL.
    InvalidAltSl = 20,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass = 21,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit = 22,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate = 23,
    /// 24: port CM redirection.
    PortCmRedirect = 24,
    /// 25: port redirection.
    PortRedirect = 25,
    /// 26: invalid path MTU.
    InvalidMtu = 26,
    /// 27: insufficient responder resources.
    InsufficientRespResources = 27,
    /// 28: consumer defined (rdma_reject).
    ConsumerDefined = 28,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry = 29,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId = 30,
    /// 31: invalid class version.
    InvalidClassVersion = 31,
    /// 32: invalid primary flow label.
    InvalidFlowLabel = 32,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel = 33,
    /// 35: vendor option not supported (ECE).
    VendorOptionNotSupported = 35,
}

cm_view! {
    /// A view of a ConnectReject (REJ, attribute 0x0012).
    RejPacket, private_data: 84;
    /// Local communication ID of the sender (0 when it rejects a REQ before having one).
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer (0 when unknown).
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Which message is rejected, raw 2 bits (see [`MessageRejected`]).
    message_rejected, set_message_rejected: u8 = (8, 0, 2);
    /// Length of the meaningful part of the ARI (7 bits).
    reject_info_length, set_reject_info_length: u8 = (9, 0, 7);
    /// Reason code, raw (see [`RejectReason`]).
    reason, set_reason: u16 = (10, 0, 16);
}

impl<T: AsRef<[u8]>> RejPacket<T> {
    /// The whole 72-byte additional rejection information field.
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[12..12 + REJ_ARI_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RejPacket<T> {
    /// The additional rejection information field, writable.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[12..12 + REJ_ARI_LEN]
    }
}

/// A ConnectReject (REJ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message_rejected: MessageRejected,
    /// Number of meaningful bytes in `ari` (at most [`REJ_ARI_LEN`]).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: RejectReason,
    /// Additional rejection information, all 72 bytes as on the wire.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Reads a REJ.
    ///
    /// Fails with [`Error::Truncated`] on a short view, and with [`Error::Malformed`] when
    /// "message rejected" holds the reserved value 3 or the reject info length exceeds 72.
    pub fn parse<T: AsRef<[u8]>>(p: &RejPacket<T>) -> Result<RejRepr> {
        p.check_len()?;
        let reject_info_length = p.reject_info_length();
        if usize::from(reject_info_length) > REJ_ARI_LEN {
            return Err(Error::Malformed);
        }
        Ok(RejRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_rejected: MessageRejected::from_bits(p.message_rejected())?,
            reject_info_length,
            reason: RejectReason::from_u16(p.reason()),
            ari: read_array(p.buffer.as_ref(), 12),
            private_data: read_array(p.buffer.as_ref(), 84),
        })
    }

    /// The meaningful part of the ARI (`reject_info_length` bytes, capped at 72).
    pub fn ari_info(&self) -> &[u8] {
        &self.ari[..usize::from(self.reject_info_length).min(REJ_ARI_LEN)]
    }

    /// Length of the CM data a REJ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REJ, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RejPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_rejected(self.message_rejected.bits());
        p.set_reject_info_length(self.reject_info_length);
        p.set_reason(self.reason.to_u16());
        p.ari_mut().copy_from_slice(&self.ari);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
