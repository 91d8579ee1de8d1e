//! The held-ACK policy of a device, as a decision its owner asks for.
//!
//! An application thread that receives for itself (it polled an empty CQ that is not armed
//! for an event, and the progress thread has handed it the socket) holds the positive ACK
//! of what it receives: the program sees the completion, and what it answers on that QP
//! goes out first with the ACK right behind, in one batch — one packet less before the peer
//! has its answer ([`Qp::set_hold_acks`]). A QP left holding one after such a drive is noted
//! here, and its ACK goes at the latest when:
//! * that thread, or another, next polls an empty CQ of the device, or the progress thread
//!   next wakes: every noted QP ([`HeldAcks::take_all`]);
//! * the QP is driven for another reason (a post_send), leaves RTS for RESET or ERR, or is
//!   destroyed or dropped: that QP ([`HeldAcks::release`]).
//!
//! The progress thread and posting threads never hold an ACK.

use crate::transport::Qp;

/// Who is receiving (and so driving the QPs it receives for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receiver {
    /// The device's progress thread, or any thread not receiving for itself (posting,
    /// timers, releasing held ACKs).
    Progress,
    /// An application thread that polled an empty CQ and receives for itself; `busy` when
    /// that CQ is not armed for an event (the program polls rather than sleeps).
    AppPoll {
        /// The CQ polled was not armed for an event.
        busy: bool,
    },
}

/// The held-ACK policy and the QPs holding one back.
#[derive(Debug, Default)]
pub struct HeldAcks {
    /// Holding is on: the progress thread hands the socket to polling application threads
    /// (a hand-off period above zero). Without the hand-off nobody holds.
    enabled: bool,
    /// QPs noted as holding an ACK, each once.
    qpns: Vec<u32>,
}

impl HeldAcks {
    /// The policy of a device whose progress thread hands the socket to polling application
    /// threads (`handoff`, a hand-off period above zero) or not; no QP noted.
    pub fn new(handoff: bool) -> HeldAcks {
        HeldAcks {
            enabled: handoff,
            qpns: Vec::new(),
        }
    }

    /// Whether QPs driven for packets `receiver` received hold their positive ACK: only for
    /// a busy-polling application thread, and only with the hand-off on.
    pub fn should_hold(&self, receiver: Receiver) -> bool {
        self.enabled && receiver == Receiver::AppPoll { busy: true }
    }

    /// Before driving QP `qp` for what `receiver` received: sets its transport's hold as the
    /// policy says and returns it (pass it to [`HeldAcks::end_drive`]).
    pub fn begin_drive(&self, qp: &mut Qp, receiver: Receiver) -> bool {
        let hold = self.should_hold(receiver);
        qp.set_hold_acks(hold);
        hold
    }

    /// After driving QP `qpn` (its `poll_transmit` returned `None`) with hold `hold`: lets go
    /// of the hold and, when the transport is left with a positive ACK unsent, notes the QP.
    /// Returns whether it was noted.
    pub fn end_drive(&mut self, qpn: u32, qp: &mut Qp, hold: bool) -> bool {
        if !hold {
            return false;
        }
        qp.set_hold_acks(false);
        if qp.has_held_ack() {
            self.note(qpn);
            return true;
        }
        false
    }

    /// Notes that QP `qpn` holds a positive ACK back (once, however often noted).
    pub fn note(&mut self, qpn: u32) {
        if !self.qpns.contains(&qpn) {
            self.qpns.push(qpn);
        }
    }

    /// Whether any QP is noted (the cheap check before [`HeldAcks::take_all`]).
    pub fn any(&self) -> bool {
        !self.qpns.is_empty()
    }

    /// Every noted QP, in the order noted, appended to `out` and forgotten here: a CQ was
    /// polled empty or the progress thread woke, and their ACKs go now (the owner drives each
    /// one whose transport still [`Qp::has_held_ack`]). Returns how many.
    pub fn take_all(&mut self, out: &mut Vec<u32>) -> usize {
        let n = self.qpns.len();
        out.append(&mut self.qpns);
        n
    }

    /// QP `qpn` is driven for another reason, leaves RTS, or goes away: forgets it; returns
    /// whether it was noted. Its ACK goes with that drive (the owner drives it when the
    /// transport still [`Qp::has_held_ack`]).
    pub fn release(&mut self, qpn: u32) -> bool {
        match self.qpns.iter().position(|&q| q == qpn) {
            Some(i) => {
                self.qpns.remove(i);
                true
            }
            None => false,
        }
    }
}
