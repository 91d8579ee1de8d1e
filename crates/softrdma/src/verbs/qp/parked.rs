//! Packets of a UC or UD QP that found its receive queue empty, kept until receives are
//! posted (see `verbs::datapath::feed`).
//!
//! A NIC drops such a packet (UD and UC have no RNR NAK). softrdma's sender can outrun a
//! receiving program for a moment (on a loaded machine the program is descheduled while its
//! device keeps delivering), so a receive queue that runs dry for a millisecond would lose a
//! burst; a bounded store behind the queue takes the burst instead, as a NIC's receive buffer
//! would, and hands it to the receives as they are posted, in order. Beyond the bound
//! packets are dropped as before (counted in the QP's `no_recv_drops`).

use std::collections::VecDeque;
use std::net::IpAddr;

/// Packets kept at most per QP.
pub(crate) const PARK_MAX_PACKETS: usize = 65_536;
/// Bytes kept at most per QP (packets as received: BTH through ICRC).
pub(crate) const PARK_MAX_BYTES: usize = 8 << 20;

/// One kept packet and the addresses it came from and to (a UD receive's GRH).
pub(crate) struct ParkedPacket {
    pub(crate) data: Vec<u8>,
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
}

/// The packets a UC or UD QP keeps, oldest first.
#[derive(Default)]
pub(crate) struct Parked {
    pkts: VecDeque<ParkedPacket>,
    bytes: usize,
}

impl Parked {
    /// Whether none is kept.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.pkts.is_empty()
    }

    /// How many are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pkts.len()
    }

    /// Keeps a copy of `pkt`; `false` (nothing kept) when the bound is reached.
    pub(crate) fn push(&mut self, pkt: &[u8], src: IpAddr, dst: IpAddr) -> bool {
        if self.pkts.len() >= PARK_MAX_PACKETS || self.bytes + pkt.len() > PARK_MAX_BYTES {
            return false;
        }
        self.bytes += pkt.len();
        self.pkts.push_back(ParkedPacket {
            data: pkt.to_vec(),
            src,
            dst,
        });
        true
    }

    /// The oldest kept packet.
    pub(crate) fn front(&self) -> Option<&ParkedPacket> {
        self.pkts.front()
    }

    /// Takes the oldest kept packet.
    pub(crate) fn pop(&mut self) -> Option<ParkedPacket> {
        let p = self.pkts.pop_front()?;
        self.bytes -= p.data.len();
        Some(p)
    }

    /// Forgets every kept packet (the QP left RTS/RTR or went away).
    pub(crate) fn clear(&mut self) {
        self.pkts.clear();
        self.bytes = 0;
    }
}

/// Whether `pkt` (from its BTH) needs a receive request of its QP to be taken: the first
/// packet of a SEND, an RDMA WRITE with immediate data.
#[inline]
pub(crate) fn needs_receive(pkt: &[u8]) -> bool {
    pkt.first().is_some_and(|&op| {
        softrdma_wire::opcode::Opcode::from(op)
            .info()
            .is_some_and(|i| i.consumes_recv_wqe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_packets_in_order_within_its_bounds() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let mut p = Parked::default();
        assert!(p.is_empty());
        for i in 0..PARK_MAX_PACKETS {
            assert!(p.push(&(i as u32).to_le_bytes(), ip, ip));
        }
        assert!(!p.push(&[1, 2, 3, 4], ip, ip), "full: packets");
        assert_eq!(p.pop().unwrap().data, 0u32.to_le_bytes());
        assert_eq!(p.front().unwrap().data, 1u32.to_le_bytes());
        assert_eq!(p.len(), PARK_MAX_PACKETS - 1);
        p.clear();
        assert!(p.is_empty());
        let big = vec![0u8; PARK_MAX_BYTES / 2 + 1];
        assert!(p.push(&big, ip, ip));
        assert!(!p.push(&big, ip, ip), "full: bytes");
        assert!(p.push(&[0; 16], ip, ip));
    }

    #[test]
    fn only_the_packets_that_take_a_receive_need_one() {
        // UD SEND only (0x64), UC SEND first (0x20) and only with immediate (0x25), UC RDMA
        // WRITE only with immediate (0x2b): yes. UC SEND middle (0x21), UC RDMA WRITE only
        // (0x2a), nothing at all: no.
        for op in [0x64u8, 0x20, 0x25, 0x2b] {
            assert!(needs_receive(&[op, 0, 0, 0]), "{op:#x}");
        }
        for op in [0x21u8, 0x2a] {
            assert!(!needs_receive(&[op, 0, 0, 0]), "{op:#x}");
        }
        assert!(!needs_receive(&[]));
    }
}
