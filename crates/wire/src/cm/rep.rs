//! ConnectReply (REP): its view and its representation.

use super::bits::{cm_view, read_array, CM_DATA_LEN};
use crate::Result;

/// Size of the private data of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;

cm_view! {
    /// A view of a ConnectReply (REP, attribute 0x0013).
    RepPacket, private_data: 36;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer (the REQ's local comm ID).
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Local Q_Key.
    local_qkey, set_local_qkey: u32 = (8, 0, 32);
    /// Sender's QP number (24 bits).
    local_qpn, set_local_qpn: u32 = (12, 0, 24);
    /// ECE vendor ID, high byte.
    vendor_id_high, set_vendor_id_high: u8 = (15, 0, 8);
    /// Local EE context number (24 bits).
    local_eecn, set_local_eecn: u32 = (16, 0, 24);
    /// ECE vendor ID, middle byte.
    vendor_id_mid, set_vendor_id_mid: u8 = (19, 0, 8);
    /// Starting PSN of the sender's send queue (24 bits).
    starting_psn, set_starting_psn: u32 = (20, 0, 24);
    /// ECE vendor ID, low byte.
    vendor_id_low, set_vendor_id_low: u8 = (23, 0, 8);
    /// Responder resources.
    responder_resources, set_responder_resources: u8 = (24, 0, 8);
    /// Initiator depth.
    initiator_depth, set_initiator_depth: u8 = (25, 0, 8);
    /// Target ACK delay (5-bit IBA time).
    target_ack_delay, set_target_ack_delay: u8 = (26, 0, 5);
    /// Failover accepted (2 bits).
    failover_accepted, set_failover_accepted: u8 = (26, 5, 2);
    /// End-to-end flow control.
    end_to_end_flow_control, set_end_to_end_flow_control: bool = (26, 7, 1);
    /// RNR retry count (3 bits).
    rnr_retry_count, set_rnr_retry_count: u8 = (27, 0, 3);
    /// The sender's QP uses a shared receive queue.
    srq, set_srq: bool = (27, 3, 1);
    /// GUID of the sender's channel adapter.
    local_ca_guid, set_local_ca_guid: u64 = (28, 0, 64);
}

/// A ConnectReply (REP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// ECE vendor ID (24 bits: high, middle and low bytes at offsets 15, 19 and 23).
    pub vendor_id: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Reads a REP. Fails with [`Error::Truncated`](crate::Error::Truncated) on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &RepPacket<T>) -> Result<RepRepr> {
        p.check_len()?;
        Ok(RepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            local_eecn: p.local_eecn(),
            starting_psn: p.starting_psn(),
            vendor_id: u32::from(p.vendor_id_high()) << 16
                | u32::from(p.vendor_id_mid()) << 8
                | u32::from(p.vendor_id_low()),
            responder_resources: p.responder_resources(),
            initiator_depth: p.initiator_depth(),
            target_ack_delay: p.target_ack_delay(),
            failover_accepted: p.failover_accepted(),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            rnr_retry_count: p.rnr_retry_count(),
            srq: p.srq(),
            local_ca_guid: p.local_ca_guid(),
            private_data: read_array(p.buffer.as_ref(), 36),
        })
    }

    /// Length of the CM data a REP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REP, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RepPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_vendor_id_high((self.vendor_id >> 16) as u8);
        p.set_local_eecn(self.local_eecn);
        p.set_vendor_id_mid((self.vendor_id >> 8) as u8);
        p.set_starting_psn(self.starting_psn);
        p.set_vendor_id_low(self.vendor_id as u8);
        p.set_responder_resources(self.responder_resources);
        p.set_initiator_depth(self.initiator_depth);
        p.set_target_ack_delay(self.target_ack_delay);
        p.set_failover_accepted(self.failover_accepted);
        p.set_end_to_end_flow_control(self.end_to_end_flow_control);
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_srq(self.srq);
        p.set_local_ca_guid(self.local_ca_guid);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}
