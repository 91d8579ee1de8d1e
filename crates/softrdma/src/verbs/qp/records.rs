//! The work-request records of one RC QP (see `verbs::records`, which sends and takes them):
//! what it sent and waits to hear of, what waits behind them, and whose requests it refuses.

use crate::provider::wr_records::Record;
use softrdma_proto::transport as tp;
use std::collections::VecDeque;
use std::time::Instant;

/// The longest message that goes as a record (longer ones go as packets, in segments of the
/// lane's size).
pub(crate) const RECORD_MAX: u32 = 4096;

/// `QpConfig::access_flags`' REMOTE_WRITE bit (`IBV_ACCESS_REMOTE_WRITE`).
pub(crate) const REMOTE_WRITE: u32 = 2;

/// The records of one RC QP: what it sent and waits to hear of, what waits behind them, and
/// (receiving) whose requests it refuses.
#[derive(Default)]
pub(crate) struct Records {
    /// Whether records may go to the peer (looked at, and found so).
    pub(crate) ready: bool,
    /// The peer refused records: none go again (until RESET).
    pub(crate) refused: bool,
    /// The device's records generation when records were last found not ready (see
    /// [`Provider::records_generation`]): no look again until it changes.
    pub(crate) looked_at: Option<u64>,
    /// The sequence number of the next record.
    pub(crate) next_seq: u32,
    /// The current epoch (a bounce starts the next one).
    pub(crate) epoch: u32,
    /// Requests sent as records and not yet acknowledged, in order.
    pub(crate) sent: VecDeque<Sent>,
    /// Requests posted while records were outstanding: they go to the transport, in order,
    /// once those are acknowledged (or bounced, after them).
    pub(crate) waiting: VecDeque<tp::SendRequest>,
    /// Receiving: the peer's epoch whose requests are bounced (one was).
    pub(crate) bounced_epoch: Option<u32>,
    /// When the QP's timer must look at the records next (`None`: no need).
    pub(crate) deadline: Option<Instant>,
    /// The front of `sent` when the timer last looked (the same at the next look: expired).
    pub(crate) watched: Option<u32>,
    /// Answers not written yet (the lane back was full or gone for a moment).
    pub(crate) owed: Vec<Record>,
    /// A request came as a record since the last post (what is posted now is likely an
    /// answer to it; the transport's own sign of that, its MSN, does not see records).
    pub(crate) received: bool,
    /// Whether the last post of an RC request found nothing outstanding (see `post_send`).
    pub(crate) last_post_idle: bool,
    /// The ring of its own through which this QP sends its records to the connected QP, when
    /// the peer took one (see `provider::lanes::pair`).
    pub(crate) pair: Option<crate::provider::PairTx>,
    /// Whether a ring of its own was offered for this connection already (once only).
    pub(crate) pair_tried: bool,
}

/// Whether a request with `op` consumes a receive request of the peer.
#[inline]
pub(crate) fn consumes_receive(op: &tp::SendOp) -> bool {
    !matches!(op, tp::SendOp::RdmaWrite { .. })
}

/// A request sent as a record.
pub(crate) struct Sent {
    pub(crate) seq: u32,
    pub(crate) req: tp::SendRequest,
    pub(crate) len: u32,
}

impl Records {
    /// Whether requests posted now must wait behind records (sent or waiting).
    #[inline]
    pub(crate) fn holding(&self) -> bool {
        !self.sent.is_empty() || !self.waiting.is_empty()
    }

    /// Requests sent as records or waiting behind them (they count against `max_send_wr`).
    #[inline]
    pub(crate) fn outstanding(&self) -> usize {
        self.sent.len() + self.waiting.len()
    }

    /// Whether a request may be tried as a record at this post: records go to the peer, or
    /// they did not the last time it was looked at but the device's lanes changed since
    /// (`generation`: [`Provider::records_generation`]).
    #[inline]
    pub(crate) fn may_try(&self, generation: impl FnOnce() -> u64) -> bool {
        if self.ready {
            return true;
        }
        !self.refused && self.looked_at.is_none_or(|g| g != generation())
    }

    /// Records `req` (`len` bytes) as sent: [`try_send`] sent it just now.
    pub(crate) fn sent(&mut self, req: tp::SendRequest, len: u32) {
        let seq = self.next_seq.wrapping_sub(1);
        self.sent.push_back(Sent { seq, req, len });
    }

    /// Queues `req` behind the records (see [`Records::holding`]).
    pub(crate) fn wait(&mut self, req: tp::SendRequest) {
        self.waiting.push_back(req);
    }

    /// When the QP's timer must look at the records (for `drive`'s deadline).
    #[inline]
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether a request came as a record since the last call (see `received`).
    #[inline]
    pub(crate) fn take_received(&mut self) -> bool {
        std::mem::take(&mut self.received)
    }

    /// Forgets everything (RESET): no completions. The sequence numbers go on, in a new
    /// epoch: an answer to the QP's last connection that comes late matches nothing.
    pub(crate) fn reset(&mut self) {
        *self = Records {
            epoch: self.epoch.wrapping_add(1),
            next_seq: self.next_seq,
            ..Records::default()
        };
    }
}
