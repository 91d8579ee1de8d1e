//! The device's packet counters ([`DeviceCounters`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Per-device packet counters, readable with [`crate::Context::counters`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tx_packets: AtomicU64,
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) tx_errors: AtomicU64,
    pub(crate) rx_packets: AtomicU64,
    pub(crate) rx_bytes: AtomicU64,
    pub(crate) icrc_errors: AtomicU64,
    pub(crate) icrc_ident_solved: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) cnp_received: AtomicU64,
    pub(crate) unknown_qp: AtomicU64,
    pub(crate) wrong_source: AtomicU64,
    pub(crate) fault_drops: AtomicU64,
    pub(crate) fault_dups: AtomicU64,
    pub(crate) fault_corrupts: AtomicU64,
    pub(crate) mcast_tx_packets: AtomicU64,
    pub(crate) mcast_rx_packets: AtomicU64,
    pub(crate) icmp_errors: AtomicU64,
    pub(crate) probes_sent: AtomicU64,
    pub(crate) probes_received: AtomicU64,
    pub(crate) misrouted: AtomicU64,
    pub(crate) same_host_packets: AtomicU64,
    pub(crate) wr_records: AtomicU64,
    pub(crate) tx_in_place_bytes: AtomicU64,
    pub(crate) tx_gso_numbered: AtomicU64,
}

/// A snapshot of a device's packet counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// Packets handed to the kernel.
    pub tx_packets: u64,
    /// Bytes of those packets (UDP payload).
    pub tx_bytes: u64,
    /// Packets the kernel refused to send.
    pub tx_errors: u64,
    /// Packets received with a good ICRC.
    pub rx_packets: u64,
    /// Bytes of those packets (UDP payload).
    pub rx_bytes: u64,
    /// Packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// IPv4 packets (counted in `rx_packets` too) whose ICRC matched not with
    /// identification 0, as softrdma peers send, but with the identification solved from it:
    /// packets from another stack, such as Linux rxe. They got a 16-bit check instead of a
    /// 32-bit one (see the engine's ICRC notes).
    pub icrc_ident_solved: u64,
    /// Packets dropped as malformed (too short, bad headers, unknown opcode).
    pub malformed: u64,
    /// RoCEv2 Congestion Notification Packets (opcode `0x81`, with a good ICRC) received and
    /// dropped: softrdma does no congestion control (no DCQCN), so they change nothing.
    pub cnp_received: u64,
    /// Packets for a QP that does not exist or is not ready.
    pub unknown_qp: u64,
    /// RC/UC packets dropped because they did not come from the connected peer.
    pub wrong_source: u64,
    /// Packets dropped by fault injection.
    pub fault_drops: u64,
    /// Packets duplicated by fault injection.
    pub fault_dups: u64,
    /// Packets corrupted by fault injection.
    pub fault_corrupts: u64,
    /// UD packets sent to an IP multicast group (also counted in `tx_packets` once sent).
    pub mcast_tx_packets: u64,
    /// Packets received with a good ICRC on the device's multicast group sockets (also
    /// counted in `rx_packets`), whatever number of attached QPs got a copy.
    pub mcast_rx_packets: u64,
    /// ICMP errors the kernel reported for datagrams the device sent (read from the
    /// socket's error queue): port unreachable when no RoCEv2 device listens at a peer,
    /// host or network unreachable. CM requests to a refusing peer end at once.
    pub icmp_errors: u64,
    /// Liveness probes sent: an empty datagram to each peer with an established connection,
    /// every [`PROBE_INTERVAL`], so that a peer whose device went away (its process died
    /// without disconnecting) draws an ICMP port unreachable and its connections end.
    pub probes_sent: u64,
    /// Liveness probes (empty datagrams) received and dropped.
    pub probes_received: u64,
    /// Packets this process received for a QP of another process sharing the device (the
    /// steering program was stale, say after a process died) and forwarded to it over a
    /// host-local socket: one extra hop, nothing lost. Packets for a process that is gone
    /// count in `unknown_qp`.
    pub misrouted: u64,
    /// Packets sent through a same-host lane (also counted in `tx_packets`): to a device of
    /// this host, through shared memory instead of the network stack (see the provider's
    /// notes; `SOFTRDMA_TRANSPORT=wire` turns lanes off).
    pub same_host_packets: u64,
    /// Work-request records sent through a same-host lane (also counted in `tx_packets` and
    /// `same_host_packets`): short RC requests, and their acknowledgements, carried between
    /// two QPs of this host without RoCE packets (`SOFTRDMA_WR_RECORDS=0` turns them off).
    pub wr_records: u64,
    /// Of `wr_records`, those that went through a QP pair's ring of its own rather than the
    /// device's lane (`SOFTRDMA_PAIR_RINGS=0` turns those rings off): the peer's CQ poll
    /// finds them without the device's receive path.
    pub pair_records: u64,
    /// Payload bytes that the kernel took straight from the program's registered memory
    /// (also counted in `tx_bytes`): RC and UC request payloads of at least 1 KiB sent on the
    /// wire, whose ICRC was computed over that memory in place, with no copy into a packet
    /// first (`SOFTRDMA_TX_GATHER=0` turns this off; a capture or fault injection copies
    /// them in).
    pub tx_in_place_bytes: u64,
    /// Datagrams sent toward another host over IPv4 as part of a UDP GSO message with an
    /// IPv4 identification other than 0 (the kernel numbers a message's datagrams 0, 1, 2,
    /// ...; each was sealed with its number; also counted in `tx_packets`). 0 with
    /// `SOFTRDMA_GSO_NUMBERED=0` or `SOFTRDMA_NO_GSO`, and toward loopback addresses.
    pub tx_gso_numbered: u64,
}

/// How often a device probes the peers it has connections with (see
/// [`DeviceCounters::probes_sent`]).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

impl DeviceCounters {
    /// Adds `other`'s counts to these (a device's receive queues' counters summed).
    pub(crate) fn add(&mut self, other: &DeviceCounters) {
        self.tx_packets += other.tx_packets;
        self.tx_bytes += other.tx_bytes;
        self.tx_errors += other.tx_errors;
        self.rx_packets += other.rx_packets;
        self.rx_bytes += other.rx_bytes;
        self.icrc_errors += other.icrc_errors;
        self.icrc_ident_solved += other.icrc_ident_solved;
        self.malformed += other.malformed;
        self.cnp_received += other.cnp_received;
        self.unknown_qp += other.unknown_qp;
        self.wrong_source += other.wrong_source;
        self.fault_drops += other.fault_drops;
        self.fault_dups += other.fault_dups;
        self.fault_corrupts += other.fault_corrupts;
        self.mcast_tx_packets += other.mcast_tx_packets;
        self.mcast_rx_packets += other.mcast_rx_packets;
        self.icmp_errors += other.icmp_errors;
        self.probes_sent += other.probes_sent;
        self.probes_received += other.probes_received;
        self.misrouted += other.misrouted;
        self.same_host_packets += other.same_host_packets;
        self.wr_records += other.wr_records;
        self.pair_records += other.pair_records;
        self.tx_in_place_bytes += other.tx_in_place_bytes;
        self.tx_gso_numbered += other.tx_gso_numbered;
    }
}

impl Counters {
    /// A snapshot of the counters.
    pub(crate) fn snapshot(&self) -> DeviceCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceCounters {
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            tx_errors: g(&self.tx_errors),
            rx_packets: g(&self.rx_packets),
            rx_bytes: g(&self.rx_bytes),
            icrc_errors: g(&self.icrc_errors),
            icrc_ident_solved: g(&self.icrc_ident_solved),
            malformed: g(&self.malformed),
            cnp_received: g(&self.cnp_received),
            unknown_qp: g(&self.unknown_qp),
            wrong_source: g(&self.wrong_source),
            fault_drops: g(&self.fault_drops),
            fault_dups: g(&self.fault_dups),
            fault_corrupts: g(&self.fault_corrupts),
            mcast_tx_packets: g(&self.mcast_tx_packets),
            mcast_rx_packets: g(&self.mcast_rx_packets),
            icmp_errors: g(&self.icmp_errors),
            probes_sent: g(&self.probes_sent),
            probes_received: g(&self.probes_received),
            misrouted: g(&self.misrouted),
            same_host_packets: g(&self.same_host_packets),
            wr_records: g(&self.wr_records),
            pair_records: 0,
            tx_in_place_bytes: g(&self.tx_in_place_bytes),
            tx_gso_numbered: g(&self.tx_gso_numbered),
        }
    }
}
