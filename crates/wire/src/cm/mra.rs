//! MsgRcptAck (MRA): its view and its representation.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::{Error, Result};

/// Size of the private data of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

/// Which message an MRA acknowledges (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageMraed {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// A LAP (2).
    Lap,
}

impl MessageMraed {
    /// Decodes the 2-bit value; fails with [`Error::Malformed`] on the reserved value 3.
    pub const fn from_bits(v: u8) -> Result<Self> {
        match v {
            0 => Ok(Self::Req),
            1 => Ok(Self::Rep),
            2 => Ok(Self::Lap),
            _ => Err(Error::Malformed),
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Lap => 2,
        }
    }
}

cm_view! {
    /// A view of a MsgRcptAck (MRA, attribute 0x0011).
    MraPacket, private_data: 10;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Which message is acknowledged, raw 2 bits (see [`MessageMraed`]).
    message_mraed, set_message_mraed: u8 = (8, 0, 2);
    /// Service timeout (5-bit IBA time) the peer should wait for.
    service_timeout, set_service_timeout: u8 = (9, 0, 5);
}

/// A MsgRcptAck (MRA) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message_mraed: MessageMraed,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Reads an MRA.
    ///
    /// Fails with [`Error::Truncated`] on a short view and [`Error::Malformed`] when the
    /// "message MRAed" field holds the reserved value 3.
    pub fn parse<T: AsRef<[u8]>>(p: &MraPacket<T>) -> Result<MraRepr> {
        p.check_len()?;
        Ok(MraRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_mraed: MessageMraed::from_bits(p.message_mraed())?,
            service_timeout: p.service_timeout(),
            private_data: read_array(p.buffer.as_ref(), 10),
        })
    }

    /// Length of the CM data an MRA occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the MRA, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut MraPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_mraed(self.message_mraed.bits());
        p.set_service_timeout(self.service_timeout);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
