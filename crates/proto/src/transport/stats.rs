//! The counters of one QP's transport ([`QpStats`]), kept by the [`Qp`](super::Qp) and
//! counted by its requester and responder.

use softrdma_wire::aeth::NakCode;

/// Counters of one QP's transport, readable with [`Qp::stats`](super::Qp::stats). They only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Packets handed out by [`Qp::poll_transmit`](super::Qp::poll_transmit).
    pub tx_packets: u64,
    /// Bytes of those packets (BTH through ICRC).
    pub tx_bytes: u64,
    /// Packets given to [`Qp::handle_packet`](super::Qp::handle_packet).
    pub rx_packets: u64,
    /// Bytes of those packets.
    pub rx_bytes: u64,
    /// Request packets sent again (PSN below the highest PSN already sent).
    pub retransmitted_packets: u64,
    /// Go-back-N restarts of the requester (timeout, sequence NAK, RNR, missing response).
    pub retries: u64,
    /// Retransmit-timer expiries with packets outstanding.
    pub timeouts: u64,
    /// Tail-loss probes: after a short wait without ACK progress (a round-trip estimate, well
    /// before the local ACK timeout), the first unacknowledged packet (for a READ partly
    /// answered, first its last packet) and the last one sent go again, asking for an ACK;
    /// they consume no retry.
    pub probes: u64,
    /// Times the requester held a new SEND back because the responder's end-to-end credits
    /// (the receives it advertised in its ACKs) were used up; it goes on when an ACK brings
    /// more.
    pub credit_waits: u64,
    /// Positive ACKs (ACKNOWLEDGE with an ACK syndrome) sent by the responder.
    pub acks_sent: u64,
    /// Positive ACKs received by the completer.
    pub acks_received: u64,
    /// PSN-sequence-error NAKs sent.
    pub seq_naks_sent: u64,
    /// PSN-sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent (no receive request available).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Invalid-request / remote-access / remote-operational NAKs sent.
    pub err_naks_sent: u64,
    /// Invalid-request / remote-access / remote-operational NAKs received.
    pub err_naks_received: u64,
    /// Of `err_naks_sent`: invalid-request NAKs (`0x61`: opcode or length not allowed).
    pub inv_req_naks_sent: u64,
    /// Of `err_naks_received`: invalid-request NAKs.
    pub inv_req_naks_received: u64,
    /// Of `err_naks_sent`: remote-access NAKs (`0x62`: bad rkey, bounds or access rights).
    pub access_naks_sent: u64,
    /// Of `err_naks_received`: remote-access NAKs.
    pub access_naks_received: u64,
    /// Of `err_naks_sent`: remote-operational NAKs (`0x63`).
    pub op_naks_sent: u64,
    /// Of `err_naks_received`: remote-operational NAKs.
    pub op_naks_received: u64,
    /// Duplicate requests seen by the responder (PSN below the expected PSN).
    pub duplicates: u64,
    /// READ requests answered again from the responder resources.
    pub read_replays: u64,
    /// ATOMIC results sent again from the responder resources.
    pub atomic_replays: u64,
    /// Requests dropped because their PSN was ahead of the expected one (RC) or because the
    /// rest of their message was being dropped (UC).
    pub out_of_sequence: u64,
    /// Packets that could not be parsed or were not for this QP / transport, and ACK-class
    /// packets that matched nothing; dropped.
    pub malformed: u64,
    /// UD packets dropped for a wrong Q_Key.
    pub qkey_violations: u64,
    /// UC/UD packets dropped for want of a receive request.
    pub no_recv_drops: u64,
    /// UD sends longer than the MTU, completed without emitting anything (as rxe does).
    pub ud_oversize: u64,
}

impl std::ops::AddAssign for QpStats {
    /// Adds every counter of `o` (the total over several QPs).
    fn add_assign(&mut self, o: QpStats) {
        // Destructured, so that a counter added later cannot be forgotten here.
        let QpStats {
            tx_packets,
            tx_bytes,
            rx_packets,
            rx_bytes,
            retransmitted_packets,
            retries,
            timeouts,
            probes,
            credit_waits,
            acks_sent,
            acks_received,
            seq_naks_sent,
            seq_naks_received,
            rnr_naks_sent,
            rnr_naks_received,
            err_naks_sent,
            err_naks_received,
            inv_req_naks_sent,
            inv_req_naks_received,
            access_naks_sent,
            access_naks_received,
            op_naks_sent,
            op_naks_received,
            duplicates,
            read_replays,
            atomic_replays,
            out_of_sequence,
            malformed,
            qkey_violations,
            no_recv_drops,
            ud_oversize,
        } = o;
        self.tx_packets += tx_packets;
        self.tx_bytes += tx_bytes;
        self.rx_packets += rx_packets;
        self.rx_bytes += rx_bytes;
        self.retransmitted_packets += retransmitted_packets;
        self.retries += retries;
        self.timeouts += timeouts;
        self.probes += probes;
        self.credit_waits += credit_waits;
        self.acks_sent += acks_sent;
        self.acks_received += acks_received;
        self.seq_naks_sent += seq_naks_sent;
        self.seq_naks_received += seq_naks_received;
        self.rnr_naks_sent += rnr_naks_sent;
        self.rnr_naks_received += rnr_naks_received;
        self.err_naks_sent += err_naks_sent;
        self.err_naks_received += err_naks_received;
        self.inv_req_naks_sent += inv_req_naks_sent;
        self.inv_req_naks_received += inv_req_naks_received;
        self.access_naks_sent += access_naks_sent;
        self.access_naks_received += access_naks_received;
        self.op_naks_sent += op_naks_sent;
        self.op_naks_received += op_naks_received;
        self.duplicates += duplicates;
        self.read_replays += read_replays;
        self.atomic_replays += atomic_replays;
        self.out_of_sequence += out_of_sequence;
        self.malformed += malformed;
        self.qkey_violations += qkey_violations;
        self.no_recv_drops += no_recv_drops;
        self.ud_oversize += ud_oversize;
    }
}

impl QpStats {
    /// Counts an error NAK (not a PSN-sequence or RNR NAK) sent or received, in the total
    /// and by kind.
    pub(super) fn note_err_nak(&mut self, code: NakCode, sent: bool) {
        let (total, inv, access, op) = if sent {
            (
                &mut self.err_naks_sent,
                &mut self.inv_req_naks_sent,
                &mut self.access_naks_sent,
                &mut self.op_naks_sent,
            )
        } else {
            (
                &mut self.err_naks_received,
                &mut self.inv_req_naks_received,
                &mut self.access_naks_received,
                &mut self.op_naks_received,
            )
        };
        *total += 1;
        match code {
            NakCode::InvalidRequest => *inv += 1,
            NakCode::RemoteAccessError => *access += 1,
            NakCode::RemoteOperationalError => *op += 1,
            NakCode::PsnSequenceError | NakCode::InvalidRdRequest => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_add_up_field_by_field() {
        let a = QpStats {
            tx_packets: 3,
            credit_waits: 1,
            ud_oversize: 2,
            ..QpStats::default()
        };
        let mut sum = a;
        sum += QpStats {
            tx_packets: 4,
            probes: 5,
            ud_oversize: 1,
            ..QpStats::default()
        };
        assert_eq!(
            sum,
            QpStats {
                tx_packets: 7,
                credit_waits: 1,
                probes: 5,
                ud_oversize: 3,
                ..QpStats::default()
            }
        );
    }
}
