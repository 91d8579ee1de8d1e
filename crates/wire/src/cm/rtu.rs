//! ReadyToUse (RTU): its view and its representation.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::Result;

/// Size of the private data of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;

cm_view! {
    /// A view of a ReadyToUse (RTU, attribute 0x0014).
    RtuPacket, private_data: 8;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
}

/// A ReadyToUse (RTU) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl RtuRepr {
    /// Reads an RTU. Fails with [`Error::Truncated`](crate::Error::Truncated) on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &RtuPacket<T>) -> Result<RtuRepr> {
        p.check_len()?;
        Ok(RtuRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: read_array(p.buffer.as_ref(), 8),
        })
    }

    /// Length of the CM data an RTU occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the RTU. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RtuPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
