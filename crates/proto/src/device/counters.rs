//! What a [`Device`](super::Device) counts: packets received and sealed, and every drop by
//! its reason.

/// Why a [`Device`](super::Device) dropped a datagram (or why its owner did, after routing:
/// [`DropReason::WrongSource`], and [`DropReason::UnknownQp`] for a QP that cannot take
/// packets yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Too short for a BTH, or for its opcode's headers plus the ICRC; an opcode outside the
    /// opcode table; a pad longer than the bytes before the ICRC. Counted in
    /// [`DeviceCounters::malformed`].
    Malformed,
    /// The ICRC does not match the one computed over the pseudo-header and the packet.
    /// Counted in [`DeviceCounters::icrc_errors`].
    Icrc,
    /// A RoCEv2 congestion notification packet (opcode `0x81`) with a good ICRC: counted in
    /// [`DeviceCounters::cnp_received`], then dropped (softrdma does no congestion control).
    Cnp,
    /// No QP with the packet's destination QP number is registered (or the owner's QP cannot
    /// take packets). Counted in [`DeviceCounters::unknown_qp`].
    UnknownQp,
    /// An RC or UC QP got a packet from another address than its peer's (decided by the
    /// owner, counted through [`Device::count_drop`](super::Device::count_drop)). Counted in
    /// [`DeviceCounters::wrong_source`].
    WrongSource,
    /// A packet to QP 1 that is not a MAD as the GSI takes it: not a UD SEND_ONLY, a P_Key of
    /// another partition, a Q_Key other than 0x80010000, or a payload shorter than 256 bytes.
    /// Counted in [`DeviceCounters::gsi_dropped`].
    BadMad,
}

/// Counters of a [`Device`](super::Device). Every datagram handed to
/// [`Device::handle_datagram`](super::Device::handle_datagram) is counted in exactly one of
/// `probes_received`, `malformed`, `icrc_errors`, `cnp_received` and `rx_packets`; of the
/// `rx_packets`, those for no registered QP are also counted in `unknown_qp`, and bad MADs
/// in `gsi_dropped`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Packets whose headers and ICRC checked out.
    pub rx_packets: u64,
    /// Bytes of those packets (BTH through ICRC).
    pub rx_bytes: u64,
    /// Empty datagrams: the liveness probes of softrdma peers.
    pub probes_received: u64,
    /// See [`DropReason::Malformed`].
    pub malformed: u64,
    /// See [`DropReason::Icrc`].
    pub icrc_errors: u64,
    /// IPv4 packets accepted through a solved identification (another stack's packets; a
    /// 16-bit check, see [`softrdma_wire::icrc::ident`]).
    pub icrc_ident_solved: u64,
    /// See [`DropReason::Cnp`].
    pub cnp_received: u64,
    /// See [`DropReason::UnknownQp`].
    pub unknown_qp: u64,
    /// See [`DropReason::WrongSource`].
    pub wrong_source: u64,
    /// See [`DropReason::BadMad`].
    pub gsi_dropped: u64,
    /// Packets given their ICRC by [`Device::seal`](super::Device::seal).
    pub sealed_packets: u64,
    /// Bytes of those packets (BTH through ICRC).
    pub sealed_bytes: u64,
    /// Packets [`Device::seal`](super::Device::seal) refused (shorter than a BTH plus an
    /// ICRC, or too long for the length fields).
    pub seal_errors: u64,
}

impl DeviceCounters {
    /// Counts `n` packets dropped for `reason` in the counter the reason names. Never fails.
    pub fn count_drop(&mut self, reason: DropReason, n: u64) {
        let c = match reason {
            DropReason::Malformed => &mut self.malformed,
            DropReason::Icrc => &mut self.icrc_errors,
            DropReason::Cnp => &mut self.cnp_received,
            DropReason::UnknownQp => &mut self.unknown_qp,
            DropReason::WrongSource => &mut self.wrong_source,
            DropReason::BadMad => &mut self.gsi_dropped,
        };
        *c = c.saturating_add(n);
    }
}
