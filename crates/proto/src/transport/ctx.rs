//! What the requester and the responder of one QP share: the configuration, the QP's
//! error state and its outputs (completions, events, counters). The [`super::Qp`] owns it
//! and lends it to each half in turn; neither half reaches the other's state.

use super::{Completion, QpConfig, QpEvent, QpStats, WcOpcode, WcStatus};
use std::collections::VecDeque;

/// The largest message (2^31 bytes).
pub(super) const MAX_MSG: u64 = 1 << 31;

/// The state and outputs shared by a QP's requester and responder.
#[derive(Debug)]
pub(super) struct QpCtx {
    /// The configuration (changed only by [`super::Qp::set_config`]).
    pub(super) cfg: QpConfig,
    /// The segment size: `cfg.path_mtu` in bytes, or the size set with
    /// [`super::Qp::set_segment`].
    pub(super) mtu: u32,
    /// The segment size set with [`super::Qp::set_segment`], which outlives reconfiguration.
    pub(super) segment: Option<u32>,
    /// The QP is in ERR. Either half moves it there with [`QpCtx::fail`]; the QP then flushes
    /// both halves (the send queue first, then a held receive request). The requester
    /// flushes its own queue at once when it fails a request.
    pub(super) error: bool,
    pub(super) completions: VecDeque<Completion>,
    pub(super) events: VecDeque<QpEvent>,
    pub(super) stats: QpStats,
}

impl QpCtx {
    pub(super) fn new(cfg: QpConfig) -> QpCtx {
        QpCtx {
            cfg,
            mtu: cfg.path_mtu.bytes(),
            segment: None,
            error: false,
            completions: VecDeque::with_capacity(64),
            events: VecDeque::new(),
            stats: QpStats::default(),
        }
    }

    /// Moves the QP to ERR (`event` raised when given) unless it is there already. The
    /// caller then returns without touching the other half's outputs: the [`super::Qp`]
    /// flushes both halves when it gets control back.
    pub(super) fn fail(&mut self, event: Option<QpEvent>) {
        if self.error {
            return;
        }
        self.error = true;
        if let Some(e) = event {
            self.events.push_back(e);
        }
    }

    /// Queues a receive-side completion.
    pub(super) fn push_recv_completion(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
    ) {
        self.completions.push_back(Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            is_recv: true,
            ..Completion::default()
        });
    }
}
