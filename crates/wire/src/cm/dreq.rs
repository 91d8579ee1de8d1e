//! DisconnectRequest (DREQ) and DisconnectReply (DREP): their views and representations.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::Result;

/// Size of the private data of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Size of the private data of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

cm_view! {
    /// A view of a DisconnectRequest (DREQ, attribute 0x0015).
    DreqPacket, private_data: 12;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// The peer's QPN (or EECN), 24 bits.
    remote_qpn_eecn, set_remote_qpn_eecn: u32 = (8, 0, 24);
}

/// A DisconnectRequest (DREQ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN or EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Reads a DREQ. Fails with [`Error::Truncated`](crate::Error::Truncated) on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &DreqPacket<T>) -> Result<DreqRepr> {
        p.check_len()?;
        Ok(DreqRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn_eecn: p.remote_qpn_eecn(),
            private_data: read_array(p.buffer.as_ref(), 12),
        })
    }

    /// Length of the CM data a DREQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the DREQ, zeroing the reserved byte. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DreqPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn_eecn(self.remote_qpn_eecn);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

cm_view! {
    /// A view of a DisconnectReply (DREP, attribute 0x0016).
    DrepPacket, private_data: 8;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
}

/// A DisconnectReply (DREP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl DrepRepr {
    /// Reads a DREP. Fails with [`Error::Truncated`](crate::Error::Truncated) on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &DrepPacket<T>) -> Result<DrepRepr> {
        p.check_len()?;
        Ok(DrepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: read_array(p.buffer.as_ref(), 8),
        })
    }

    /// Length of the CM data a DREP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the DREP. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DrepPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
