//! The send side of a QP: the requester (segmentation, PSN assignment, AckReq, window,
//! READ/atomic depth, fence, go-back-N) and the completer (ACK coalescing, READ responses,
//! atomic ACKs, NAKs, retransmit and RNR timers, in-order completions).
//!
//! State is kept rxe-style: `comp_psn` is the first PSN not yet acknowledged (or, inside a
//! READ, the next response PSN expected), `next_psn` the PSN of the next packet to send,
//! `high_psn` one past the highest PSN ever sent. A retry rewinds `next_psn` to `comp_psn`
//! and the cursor to the work request holding it (mid-message for SEND/WRITE; a READ is
//! resumed with a shorter request).
//!
//! [`Requester`] owns all of this state. Its [`super::Qp`] lends it the shared [`QpCtx`]
//! (configuration, error state, completions, counters) for each call; it never sees the
//! responder. Its face to the QP: [`Requester::post`], [`Requester::handle_packet`] (ACK-class
//! packets), [`Requester::poll_transmit`], [`Requester::handle_timeout`],
//! [`Requester::flush_send_queue`] and a few read-only queries.

use super::ctx::{QpCtx, MAX_MSG};
use super::io::{emit_headers, gather, make_bth, scatter, sge_total};
use super::sendq::{SendQueue, Slot};
use super::*;
use crate::psn::Psn;
use crate::qp::QpType;
use crate::timer::{local_ack_timeout, rnr_timer};
use softrdma_wire::aeth::{self, NakCode, Syndrome};
use softrdma_wire::opcode::Opcode;
use softrdma_wire::{atomic_eth, deth, ieth, immdt, reth, roce};
use std::time::{Duration, Instant};

/// Most unacknowledged PSNs the requester lets out (`RXE_MAX_UNACKED_PSNS`).
const WINDOW: u32 = 128;
/// Most packets between two AckReq bits inside a long message.
const MAX_PKT_PER_ACK: u32 = 64;
/// With the send window full, an ACK is asked for every `cwnd / FULL_WINDOW_ACKS` packets
/// (every packet while the window is under 16): about `FULL_WINDOW_ACKS` requests are in
/// flight at once, and each ACK opens the window by `cwnd / FULL_WINDOW_ACKS` packets.
/// (Asking on every packet sent into a full window, as before, had the responder answer
/// nearly every packet of a long stream: 1 MiB WRITEs over the wire, 2 cores, drew 100,000
/// ACKs for 130,000 packets; with 16, 17,000, and WRITE and SEND gained 5-15%:
/// BENCHMARKS.md, "ACK requests in a full window".)
const FULL_WINDOW_ACKS: u32 = 16;
/// At the end of a message with a plain RDMA WRITE queued right behind it (nothing that could
/// hold the sending back: no credits to wait for, no fence, no local operation, no drain),
/// an ACK is asked for only if this many packets went without one: the WRITE's own request
/// acknowledges both. (Where every packet is its own datagram, as over IPv4 between hosts,
/// a stream of 4 KiB WRITEs drew an ACK for every packet: BENCHMARKS.md, "ACK requests in a
/// stream of messages".)
const MESSAGE_ACKS_APART: u32 = 8;
/// The shortest tail-loss probe interval.
const PROBE_MIN: Duration = Duration::from_micros(50);
/// The probe interval before any round trip was measured.
pub(super) const PROBE_INITIAL: Duration = Duration::from_millis(1);
/// The longest probe interval (short of the local ACK timeout): a round-trip estimate
/// inflated by a stalled thread, or doubled by probes without answer, still probes this
/// often (two packets each).
const PROBE_MAX: Duration = Duration::from_millis(10);
/// Most doublings of the probe interval without progress.
const PROBE_MAX_BACKOFF: u32 = 5;
/// The smallest send window a loss shrinks the requester's to, in PSNs.
const CWND_MIN: u32 = 8;

/// What a work request does on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    Atomic,
    /// A local operation (memory window bind, local invalidate): no packet, no PSN.
    Local,
}

impl Kind {
    fn of(op: &SendOp) -> Kind {
        match op {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => Kind::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => Kind::Write,
            SendOp::RdmaRead { .. } => Kind::Read,
            SendOp::CmpAndSwp { .. } | SendOp::FetchAndAdd { .. } => Kind::Atomic,
            SendOp::BindMw(_) | SendOp::LocalInv(_) => Kind::Local,
        }
    }

    fn is_rd_atomic(self) -> bool {
        matches!(self, Kind::Read | Kind::Atomic)
    }
}

/// A posted send request and its transmission state.
#[derive(Debug)]
struct Wqe {
    req: SendRequest,
    kind: Kind,
    len: u64,
    /// PSNs the request takes (READ: one per response packet).
    npkts: u32,
    first_psn: Psn,
    last_psn: Psn,
    /// PSNs assigned (first packet sent at least once).
    started: bool,
    /// Counted in `rd_outstanding`.
    rd_counted: bool,
    /// UC/UD: sent, waiting for in-order retirement.
    done: bool,
    /// The error it will complete with when the QP flushes.
    status: Option<WcStatus>,
    /// For a message that consumes a receive request at the responder (SEND, WRITE with
    /// immediate): its number among such messages, from 1, given when it starts; else 0.
    rwqe_seq: u32,
}

impl Slot for Wqe {
    /// An empty slot: a signal-less SEND of nothing, not started.
    fn blank() -> Wqe {
        Wqe {
            req: SendRequest::default(),
            kind: Kind::Send,
            len: 0,
            npkts: 0,
            first_psn: Psn::ZERO,
            last_psn: Psn::ZERO,
            started: false,
            rd_counted: false,
            done: false,
            status: None,
            rwqe_seq: 0,
        }
    }

    /// Makes a used slot [`Slot::blank`] again, in place: a long scatter/gather list keeps
    /// its heap memory for the next request (inline data on the heap is freed).
    #[inline]
    fn reset(&mut self) {
        // Every field named (no `..`): a field added to either struct must be reset here.
        let Wqe {
            req:
                SendRequest {
                    wr_id,
                    op,
                    sges,
                    inline,
                    signaled,
                    solicited,
                    fence,
                    ud,
                },
            kind,
            len,
            npkts,
            first_psn,
            last_psn,
            started,
            rd_counted,
            done,
            status,
            rwqe_seq,
        } = self;
        *wr_id = 0;
        *op = SendOp::Send;
        sges.clear();
        *inline = None;
        *signaled = false;
        *solicited = false;
        *fence = false;
        *ud = None;
        *kind = Kind::Send;
        *len = 0;
        *npkts = 0;
        *first_psn = Psn::ZERO;
        *last_psn = Psn::ZERO;
        *started = false;
        *rd_counted = false;
        *done = false;
        *status = None;
        *rwqe_seq = 0;
    }
}

impl Wqe {
    /// Whether the message consumes a receive request at the responder.
    fn consumes_recv(&self) -> bool {
        matches!(
            self.req.op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::SendWithInv(_)
                | SendOp::RdmaWriteWithImm { .. }
        )
    }
}

/// Send queue, requester and completer state.
#[derive(Debug)]
pub(super) struct Requester {
    wqes: SendQueue<Wqe>,
    /// Index in `wqes` of the request being sent.
    cur: usize,
    /// Bytes of `wqes[cur]` already covered by sent packets.
    offset: u64,
    next_psn: Psn,
    comp_psn: Psn,
    high_psn: Psn,
    sent_any: bool,
    noack: u32,
    rd_outstanding: u32,
    retry_left: u8,
    rnr_left: u8,
    /// The `comp_psn` of the last go-back-N restart, to start only one per point.
    retry_mark: Option<Psn>,
    pub(super) retrans_deadline: Option<Instant>,
    /// Tail-loss probe: when, with packets outstanding and no ACK progress, the requester
    /// resends from `comp_psn` without waiting for the local ACK timeout (see
    /// [`Requester::probe_interval`]). Set when a packet goes out, moved on progress.
    probe_deadline: Option<Instant>,
    /// Probes since the last progress (each doubles the next interval).
    probes: u32,
    /// The packets a probe still has to send, by PSN: the first unacknowledged one and the
    /// last one sent.
    probe_psns: [Option<Psn>; 2],
    /// The packet being built is a probe's: it asks for an ACK (and the window does not
    /// hold it back).
    probe_ack_req: bool,
    /// The first PSN a probe sent again, until an ACK moves `comp_psn`: an ACK of exactly
    /// that PSN, short of `high_psn`, restarts the sending after it (the responder was
    /// waiting for that packet, and dropped what followed it).
    probe_sent: Option<Psn>,
    /// The last PSN of a READ whose first probe asked for that packet only (see
    /// [`Requester::probe`]), until progress or a restart: a response there that comes out of
    /// order (the probe's answer, or the original one) sends the READ again from `comp_psn`,
    /// as a probe would have, without counting a retry.
    read_probe: Option<Psn>,
    /// The send window in PSNs ([`CWND_MIN`]..=[`WINDOW`]): halved by each go-back-N
    /// restart (sequence NAK, missing response), set to [`CWND_MIN`] by a timeout (a probe,
    /// which may be spurious on a busy host, leaves it),
    /// grown back as ACKs come (doubling per round trip below `ssthresh`, one PSN per
    /// window above). Every unacknowledged PSN is resent on a go-back-N restart (a
    /// responder drops what follows a gap), so a window far beyond the round trip costs a
    /// window of resends per loss; lossless, it stays at [`WINDOW`].
    cwnd: u32,
    ssthresh: u32,
    /// PSNs acknowledged toward the next one-PSN growth above `ssthresh`.
    cwnd_acc: u32,
    /// Smoothed round-trip time and its variation (RFC 6298), from ACKs of fresh packets, in
    /// nanoseconds (shifts instead of the divisions of `Duration` on every ACK).
    srtt: Option<u64>,
    rttvar: u64,
    /// The packet being timed for the next round-trip sample: its last PSN and send time
    /// (cleared by any go-back-N restart: Karn's rule).
    rtt_sample: Option<(Psn, Instant)>,
    rnr_deadline: Option<Instant>,
    /// The `rwqe_seq` of the last message that consumes a receive request to have started.
    rwqe_started: u32,
    /// The `rwqe_seq` of the last such message completed.
    rwqe_retired: u32,
    /// End-to-end credits (RC): the highest `rwqe_seq` the responder has receives for, from
    /// its last ACK; `None` while it gives no credit information (rxe never does).
    credit_limit: Option<u32>,
    /// The PSN of the ACK that set `credit_limit` (older ACKs do not change it); `None`
    /// before the first ACK, while the responder's receives are unknown: until then one
    /// message that consumes a receive is in flight at a time (a burst sent blind meets an
    /// empty receive queue, and every RNR NAK resends all that followed the message).
    credit_psn: Option<Psn>,
    /// With no credit left and nothing outstanding: when the requester sends one message
    /// anyway, unless an ACK brings credits first (see [`CREDIT_PROBE_DELAY`]).
    credit_probe_at: Option<Instant>,
    /// Whether the responder sends unsolicited credit updates: `Some(true)` once one was
    /// seen (a repeated ACK of the same PSN with more credits), `Some(false)` once a wait of
    /// [`CREDIT_PROBE_DELAY_UPDATES`] ran out without one, `None` before either. A requester
    /// out of credits waits [`CREDIT_PROBE_DELAY`] before it probes a responder known to
    /// send none, [`CREDIT_PROBE_DELAY_UPDATES`] otherwise.
    peer_updates_credits: Option<bool>,
    /// The owner's packets travel a path that loses none (see
    /// [`super::Qp::set_lossless_path`]): no tail-loss probes.
    lossless: bool,
    /// The QP is in SQD: no request from this number on (in the order of posting) begins
    /// (see [`super::Qp::set_draining`]).
    drain_limit: Option<u64>,
}

/// How long a requester with no credit left and nothing outstanding waits before it sends
/// one message anyway to a responder known to send no unsolicited credit updates: that
/// message meets either a receive (and its ACK brings credits) or an RNR NAK — which on
/// rdma_cm connections (min_rnr_timer 0) costs 655 ms, hence the wait first.
pub(super) const CREDIT_PROBE_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a requester with no credit left and nothing outstanding waits before it probes
/// a responder that may send unsolicited credit updates (softrdma's does, as its application
/// posts receives): the update comes when the application reposts, so the probe is only for
/// an update lost on the way. Probing after [`CREDIT_PROBE_DELAY`] instead would meet the
/// empty queue of a receiver whose thread was merely descheduled for a millisecond, and the
/// RNR NAK's wait is far longer (655 ms on rdma_cm QPs: 1 run in 3 of `softrdma perf send -s 8`
/// on a busy 2-core machine lost that much at its first credit wait).
pub(super) const CREDIT_PROBE_DELAY_UPDATES: std::time::Duration =
    std::time::Duration::from_millis(100);

fn npkts(len: u64, mtu: u64) -> u32 {
    if len == 0 {
        1
    } else {
        len.div_ceil(mtu).min(u64::from(u32::MAX)) as u32
    }
}

impl Requester {
    pub(super) fn new(cfg: &QpConfig) -> Requester {
        let psn = Psn::new(cfg.sq_psn);
        Requester {
            wqes: SendQueue::new(cfg.max_send_wr as usize),
            cur: 0,
            offset: 0,
            next_psn: psn,
            comp_psn: psn,
            high_psn: psn,
            sent_any: false,
            noack: 0,
            rd_outstanding: 0,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            retry_mark: None,
            retrans_deadline: None,
            probe_deadline: None,
            probes: 0,
            probe_psns: [None; 2],
            probe_ack_req: false,
            probe_sent: None,
            read_probe: None,
            cwnd: WINDOW,
            ssthresh: WINDOW,
            cwnd_acc: 0,
            srtt: None,
            rttvar: 0,
            rtt_sample: None,
            rnr_deadline: None,
            rwqe_started: 0,
            rwqe_retired: 0,
            credit_limit: None,
            credit_psn: None,
            credit_probe_at: None,
            peer_updates_credits: None,
            lossless: false,
            drain_limit: None,
        }
    }

    pub(super) fn reconfigure(&mut self, cfg: &QpConfig) {
        if !self.sent_any {
            let psn = Psn::new(cfg.sq_psn);
            self.next_psn = psn;
            self.comp_psn = psn;
            self.high_psn = psn;
        }
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
    }

    /// Queues a send request (see [`super::Qp::post_send`]): gives it back when
    /// `max_send_wr` requests are outstanding; in ERR completes it at once with
    /// `WR_FLUSH_ERR`.
    #[allow(clippy::result_large_err)]
    pub(super) fn post(&mut self, ctx: &mut QpCtx, req: SendRequest) -> Result<(), SendRequest> {
        if self.is_full(ctx) {
            return Err(req);
        }
        match self.post_with(ctx, |r| {
            *r = req;
            Ok::<(), std::convert::Infallible>(())
        }) {
            Ok(()) => Ok(()),
            Err(PostSendError::QueueFull | PostSendError::Rejected(_)) => {
                unreachable!("checked above; the fill cannot fail")
            }
        }
    }

    /// Whether `max_send_wr` requests are outstanding.
    fn is_full(&self, ctx: &QpCtx) -> bool {
        self.wqes.len() >= ctx.cfg.max_send_wr.max(1) as usize
    }

    /// Queues a send request that `fill` writes in place (see [`super::Qp::post_send_with`]).
    pub(super) fn post_with<T, E>(
        &mut self,
        ctx: &mut QpCtx,
        fill: impl FnOnce(&mut SendRequest) -> Result<T, E>,
    ) -> Result<T, PostSendError<E>> {
        if self.is_full(ctx) {
            return Err(PostSendError::QueueFull);
        }
        let mtu = ctx.mtu;
        let w = self.wqes.push();
        let out = match fill(&mut w.req) {
            Ok(out) => out,
            Err(e) => {
                self.wqes.pop_back();
                return Err(PostSendError::Rejected(e));
            }
        };
        if ctx.error {
            ctx.completions.push_back(Completion {
                wr_id: w.req.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: w.req.op.wc_opcode(),
                ..Completion::default()
            });
            self.wqes.pop_back();
            return Ok(out);
        }
        let kind = Kind::of(&w.req.op);
        let len = match kind {
            Kind::Local => 0,
            Kind::Atomic => 8,
            // Scattered into the gather list; inline data has no meaning here.
            Kind::Read => sge_total(&w.req.sges),
            _ => w.req.length(),
        };
        w.kind = kind;
        w.len = len;
        w.npkts = match kind {
            Kind::Local => 0,
            Kind::Atomic => 1,
            _ => npkts(len, u64::from(mtu)),
        };
        Ok(out)
    }

    /// Whether a request packet may be ready to go (the cursor is on a request, or a probe
    /// waits, and no RNR wait holds it back); the QP's error state is the caller's to check.
    /// Whether [`Requester::poll_transmit`] would look at anything: a probe, or a request at
    /// the cursor. When not, it returns `None` and changes nothing.
    #[inline]
    pub(super) fn has_work(&self) -> bool {
        self.cur < self.wqes.len() || self.probe_psns.iter().any(Option::is_some)
    }

    pub(super) fn may_transmit(&self) -> bool {
        self.rnr_deadline.is_none()
            && (self.cur < self.wqes.len() || self.probe_psns.iter().any(Option::is_some))
    }

    /// See [`super::Qp::set_lossless_path`].
    pub(super) fn set_lossless(&mut self, ctx: &QpCtx, on: bool, now: Instant) {
        if on == self.lossless {
            return;
        }
        self.lossless = on;
        self.probe_deadline = if !on && self.outstanding() && self.rnr_deadline.is_none() {
            self.probe_interval(ctx).map(|d| now + d)
        } else {
            None
        };
    }

    /// See [`super::Qp::set_draining`]: the limit is the first request not begun.
    pub(super) fn set_draining(&mut self, on: bool) {
        self.drain_limit = on.then(|| {
            let first = (0..self.wqes.len())
                .find(|&i| !self.wqes[i].started)
                .unwrap_or(self.wqes.len());
            self.wqes.seq(first)
        });
    }

    /// See [`super::Qp::allow_begin`].
    pub(super) fn allow_begin(&mut self, n: u64) {
        if let Some(l) = self.drain_limit.as_mut() {
            *l += n;
        }
    }

    /// Whether no request has begun and not completed, and none may begin while draining:
    /// nothing before the cursor, and the request at it (if any) not begun and held back.
    pub(super) fn drained(&self) -> bool {
        self.cur == 0
            && self.wqes.get(0).is_none_or(|w| {
                !w.started && self.drain_limit.is_none_or(|l| self.wqes.seq(0) >= l)
            })
    }

    /// Whether packets were sent and not all acknowledged yet.
    pub(super) fn awaiting_ack(&self) -> bool {
        self.next_psn != self.comp_psn
    }

    /// Requests sent (every packet at least once) and not yet completed.
    pub(super) fn sent_requests(&self) -> usize {
        self.cur.min(self.wqes.len())
    }

    /// Requests posted and not yet fully transmitted.
    pub(super) fn unsent_requests(&self) -> usize {
        self.wqes.len().saturating_sub(self.cur)
    }

    /// A message that consumed a receive request at the responder went past the transport
    /// and completed (see [`super::Qp::bypass_consumed_receive`]): counted as started and
    /// retired, so that the credits the responder advertised last cover one message fewer.
    pub(super) fn bypass_consumed_receive(&mut self) {
        self.rwqe_started = self.rwqe_started.wrapping_add(1);
        self.rwqe_retired = self.rwqe_retired.wrapping_add(1);
    }

    /// Whether the last ACK told how many receives the responder has.
    pub(super) fn knows_credits(&self) -> bool {
        self.credit_limit.is_some()
    }

    /// The earliest of the requester's timers (retransmit, probe, RNR, credit probe).
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        // (The earliest of four; asked after every drive of the QP.)
        let mut next = self.retrans_deadline;
        for d in [self.probe_deadline, self.rnr_deadline, self.credit_probe_at]
            .into_iter()
            .flatten()
        {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        next
    }

    fn outstanding(&self) -> bool {
        self.sent_any && self.comp_psn.is_before(self.high_psn)
    }
}

impl Requester {
    /// Completes the oldest request with `status` (no completion for a successful
    /// unsignaled one).
    fn complete_front(&mut self, ctx: &mut QpCtx, status: WcStatus) {
        // Read where it lies, then dropped from the queue (never moved out).
        let Some(w) = self.wqes.front() else {
            return;
        };
        if w.rd_counted {
            self.rd_outstanding = self.rd_outstanding.saturating_sub(1);
        }
        if w.rwqe_seq != 0 {
            self.rwqe_retired = w.rwqe_seq;
        }
        if status != WcStatus::Success || w.req.signaled {
            ctx.completions.push_back(Completion {
                wr_id: w.req.wr_id,
                status,
                opcode: w.req.op.wc_opcode(),
                byte_len: if status == WcStatus::Success {
                    w.len as u32
                } else {
                    0
                },
                ..Completion::default()
            });
        }
        self.wqes.pop_front();
        self.cur = self.cur.saturating_sub(1);
        // Local operations carried out already complete as soon as everything before them
        // has (they wait for no acknowledgement).
        if self
            .wqes
            .front()
            .is_some_and(|f| f.kind == Kind::Local && f.started)
        {
            self.complete_front(ctx, WcStatus::Success);
        }
    }

    /// Retires the UC/UD requests that were sent, oldest first.
    fn pop_done(&mut self, ctx: &mut QpCtx) {
        while self.wqes.front().is_some_and(|w| w.done) {
            self.complete_front(ctx, WcStatus::Success);
        }
    }

    /// Marks request `idx` failed with `status`, moves the QP to ERR and flushes the send
    /// queue at once (the QP flushes the responder's side when it gets control back).
    fn fail_wqe(&mut self, ctx: &mut QpCtx, idx: usize, status: WcStatus) {
        if let Some(w) = self.wqes.get_mut(idx) {
            w.status = Some(status);
        }
        if !ctx.error {
            ctx.fail(None);
            self.flush_send_queue(ctx);
        }
    }

    /// Completes every queued request: failed ones with their status, the rest with
    /// `WR_FLUSH_ERR`; stops the timers. Calling it again does nothing more.
    pub(super) fn flush_send_queue(&mut self, ctx: &mut QpCtx) {
        while let Some(w) = self.wqes.front() {
            ctx.completions.push_back(Completion {
                wr_id: w.req.wr_id,
                status: w.status.unwrap_or(WcStatus::WrFlushErr),
                opcode: w.req.op.wc_opcode(),
                ..Completion::default()
            });
            self.wqes.pop_front();
        }
        self.cur = 0;
        self.offset = 0;
        self.rd_outstanding = 0;
        self.retrans_deadline = None;
        self.probe_deadline = None;
        self.probe_psns = [None; 2];
        self.rnr_deadline = None;
    }

    /// Why a request cannot be sent on this QP at all, if it cannot.
    fn check_wqe(&self, ctx: &QpCtx, w: &Wqe) -> Option<WcStatus> {
        if w.len > MAX_MSG {
            return Some(WcStatus::LocLenErr);
        }
        match ctx.cfg.qp_type {
            QpType::Ud => {
                if w.req.ud.is_none() || !matches!(w.req.op, SendOp::Send | SendOp::SendWithImm(_))
                {
                    return Some(WcStatus::LocQpOpErr);
                }
            }
            QpType::Uc => {
                if w.kind.is_rd_atomic() || matches!(w.req.op, SendOp::SendWithInv(_)) {
                    return Some(WcStatus::LocQpOpErr);
                }
            }
            QpType::Rc => {}
            _ => return Some(WcStatus::LocQpOpErr),
        }
        if w.kind == Kind::Atomic && !w.req.sges.is_empty() && sge_total(&w.req.sges) < 8 {
            return Some(WcStatus::LocLenErr);
        }
        None
    }

    /// The requester half of [`super::Qp::poll_transmit`]: a probe's packets first, then the
    /// next packet at the cursor.
    pub(super) fn poll_transmit(
        &mut self,
        ctx: &mut QpCtx,
        now: Instant,
        buf: &mut [u8],
        env: &mut dyn Env,
    ) -> Option<Transmit> {
        while let Some(psn) = self.probe_psns.iter_mut().find_map(Option::take) {
            if ctx.error || self.rnr_deadline.is_some() {
                self.probe_psns = [None; 2];
                break;
            }
            if !self.outstanding() || psn.is_before(self.comp_psn) || !psn.is_before(self.high_psn)
            {
                continue;
            }
            // Send the packet at `psn` as it was sent, asking for an ACK, and put the cursor
            // back where it was.
            let saved = (self.cur, self.offset, self.next_psn, self.noack);
            self.reposition(ctx, psn);
            let started = self.wqes.get(self.cur).is_some_and(|w| w.started);
            let t = if started {
                self.probe_ack_req = true;
                let t = self.next_request_packet(ctx, now, buf, env);
                self.probe_ack_req = false;
                t
            } else {
                None
            };
            (self.cur, self.offset, self.next_psn, self.noack) = saved;
            if t.is_some() {
                return t;
            }
        }
        self.next_request_packet(ctx, now, buf, env)
    }

    /// Builds the packet at the cursor and moves the cursor past it.
    fn next_request_packet(
        &mut self,
        ctx: &mut QpCtx,
        now: Instant,
        buf: &mut [u8],
        env: &mut dyn Env,
    ) -> Option<Transmit> {
        loop {
            if ctx.error || self.rnr_deadline.is_some() {
                return None;
            }
            let rc = ctx.cfg.qp_type == QpType::Rc;
            let ud = ctx.cfg.qp_type == QpType::Ud;
            let mtu = u64::from(ctx.mtu);
            let idx = self.cur;
            let w = self.wqes.get(idx)?;
            // (In SQD what has begun goes on, and nothing new begins.)
            if self.offset == 0
                && !w.started
                && self.drain_limit.is_some_and(|l| self.wqes.seq(idx) >= l)
            {
                return None;
            }
            if w.kind == Kind::Local {
                if self.local_op(ctx, idx, env) {
                    continue;
                }
                return None;
            }
            if rc && !self.probe_ack_req && self.comp_psn.distance_to(self.next_psn) >= self.cwnd {
                return None;
            }
            let offset = self.offset;
            if offset == 0 && !w.started {
                if let Some(status) = self.check_wqe(ctx, w) {
                    self.fail_wqe(ctx, idx, status);
                    return None;
                }
                if ud && w.len > mtu {
                    // C10-93.1.1 as rxe reads it: emit nothing, report no error.
                    ctx.stats.ud_oversize += 1;
                    let w = &mut self.wqes[idx];
                    w.started = true;
                    w.done = true;
                    self.cur += 1;
                    self.pop_done(ctx);
                    continue;
                }
                if w.req.fence && self.wqes.iter().take(idx).any(|x| x.kind.is_rd_atomic()) {
                    return None;
                }
                // End-to-end credits: a message that needs a receive at the responder starts
                // only if the responder advertised one for it, or, with none advertised and
                // nothing outstanding, after CREDIT_PROBE_DELAY without a credit update (one
                // message at a time, whose ACK brings news). Before the first ACK the
                // receives are unknown: one such message at a time, so the first ACK tells.
                if rc && w.consumes_recv() {
                    if self.credit_psn.is_none() && self.rwqe_started != self.rwqe_retired {
                        ctx.stats.credit_waits += 1;
                        return None;
                    }
                    if let Some(limit) = self.credit_limit {
                        let seq = self.rwqe_started.wrapping_add(1);
                        if (seq.wrapping_sub(limit) as i32) > 0 {
                            if self.outstanding() {
                                ctx.stats.credit_waits += 1;
                                return None;
                            }
                            match self.credit_probe_at {
                                None => {
                                    ctx.stats.credit_waits += 1;
                                    let delay = if self.peer_updates_credits == Some(false) {
                                        CREDIT_PROBE_DELAY
                                    } else {
                                        CREDIT_PROBE_DELAY_UPDATES
                                    };
                                    self.credit_probe_at = Some(now + delay);
                                    return None;
                                }
                                Some(t) if now < t => return None,
                                Some(_) => {
                                    // The wait ran out with no update: unless one was ever
                                    // seen, this responder sends none; probe early from now.
                                    if self.peer_updates_credits != Some(true) {
                                        self.peer_updates_credits = Some(false);
                                    }
                                    self.credit_probe_at = None
                                }
                            }
                        }
                    }
                }
            }
            if w.kind.is_rd_atomic()
                && !w.rd_counted
                && self.rd_outstanding >= u32::from(ctx.cfg.max_rd_atomic.max(1))
            {
                return None;
            }

            // Build the packet.
            let psn = self.next_psn;
            let remaining = w.len.saturating_sub(offset);
            let first = offset == 0;
            let (n, last) = match w.kind {
                Kind::Send | Kind::Write => {
                    let n = remaining.min(mtu);
                    (n, offset + n >= w.len)
                }
                Kind::Read | Kind::Atomic | Kind::Local => (0, true),
            };
            let consumed = match w.kind {
                Kind::Read => npkts(remaining, mtu),
                _ => 1,
            };
            let noack = self.noack + 1;
            let after = psn.add(consumed);
            // An ACK is asked for at the end of each message (unless a plain WRITE follows
            // at once: MESSAGE_ACKS_APART), every MAX_PKT_PER_ACK packets, on a packet that
            // fills the window if the last request for an ACK went out cwnd /
            // FULL_WINDOW_ACKS packets ago or more (the ACKs of those in flight move the
            // window on meanwhile), and at the end of a resent tail: the ACK that moves the
            // window on comes without a probe.
            let end_asks = last
                && (noack >= MESSAGE_ACKS_APART
                    || self.drain_limit.is_some()
                    || !self.wqes.get(idx + 1).is_some_and(|n| {
                        matches!(n.req.op, SendOp::RdmaWrite { .. }) && !n.req.fence
                    }));
            let ack_req = rc
                && (end_asks
                    || self.probe_ack_req
                    || noack >= MAX_PKT_PER_ACK
                    || (self.comp_psn.distance_to(after) >= self.cwnd
                        && noack >= (self.cwnd / FULL_WINDOW_ACKS).max(1))
                    || (self.sent_any && after == self.high_psn));
            let se = w.req.solicited && last;
            let base: u8 = match ctx.cfg.qp_type {
                QpType::Rc => 0x00,
                QpType::Uc => 0x20,
                _ => 0x60,
            };
            let mut repr = roce::Repr {
                payload_len: n as usize,
                ..roce::Repr::default()
            };
            let mut dest_qp = ctx.cfg.dest_qp_num;
            let mut ud_dest = None;
            let op: u8 = match (w.kind, w.req.op) {
                (Kind::Send, op) if ud => {
                    let d = w.req.ud.unwrap_or(UdDest {
                        dest: 0,
                        remote_qpn: 0,
                        remote_qkey: 0,
                    });
                    dest_qp = d.remote_qpn;
                    ud_dest = Some(d.dest);
                    let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                        ctx.cfg.qkey
                    } else {
                        d.remote_qkey
                    };
                    repr.deth = Some(deth::Repr {
                        qkey,
                        src_qp: ctx.cfg.qp_num & 0xff_ffff,
                    });
                    if let SendOp::SendWithImm(imm) = op {
                        repr.immdt = Some(immdt::Repr { imm_data: imm });
                        0x05
                    } else {
                        0x04
                    }
                }
                (Kind::Send, op) => match (first, last) {
                    (true, false) => 0x00,
                    (false, false) => 0x01,
                    (f, true) => {
                        let (plain, imm_op, inv_op) = if f {
                            (0x04, 0x05, 0x17)
                        } else {
                            (0x02, 0x03, 0x16)
                        };
                        match op {
                            SendOp::SendWithImm(imm) => {
                                repr.immdt = Some(immdt::Repr { imm_data: imm });
                                imm_op
                            }
                            SendOp::SendWithInv(rkey) => {
                                repr.ieth = Some(ieth::Repr { rkey });
                                inv_op
                            }
                            _ => plain,
                        }
                    }
                },
                (Kind::Write, op) => {
                    let (remote_addr, rkey, imm) = match op {
                        SendOp::RdmaWrite { remote_addr, rkey } => (remote_addr, rkey, None),
                        SendOp::RdmaWriteWithImm {
                            remote_addr,
                            rkey,
                            imm,
                        } => (remote_addr, rkey, Some(imm)),
                        _ => (0, 0, None),
                    };
                    if first {
                        repr.reth = Some(reth::Repr {
                            va: remote_addr,
                            rkey,
                            dma_len: w.len as u32,
                        });
                    }
                    if last {
                        repr.immdt = imm.map(|imm_data| immdt::Repr { imm_data });
                    }
                    match (first, last, imm.is_some()) {
                        (true, false, _) => 0x06,
                        (false, false, _) => 0x07,
                        (false, true, false) => 0x08,
                        (false, true, true) => 0x09,
                        (true, true, false) => 0x0a,
                        (true, true, true) => 0x0b,
                    }
                }
                (Kind::Read, op) => {
                    let (remote_addr, rkey) = match op {
                        SendOp::RdmaRead { remote_addr, rkey } => (remote_addr, rkey),
                        _ => (0, 0),
                    };
                    repr.reth = Some(reth::Repr {
                        va: remote_addr.wrapping_add(offset),
                        rkey,
                        dma_len: remaining as u32,
                    });
                    0x0c
                }
                (Kind::Atomic, op) => match op {
                    SendOp::CmpAndSwp {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => {
                        repr.atomic_eth = Some(atomic_eth::Repr {
                            va: remote_addr,
                            rkey,
                            swap_add: swap,
                            compare,
                        });
                        0x13
                    }
                    SendOp::FetchAndAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => {
                        repr.atomic_eth = Some(atomic_eth::Repr {
                            va: remote_addr,
                            rkey,
                            swap_add: add,
                            compare: 0,
                        });
                        0x14
                    }
                    _ => 0x14,
                },
                // Carried out by `local_op`, never built into a packet.
                (Kind::Local, _) => return None,
            };
            let opcode = Opcode(if ud { op | 0x60 } else { base | op });
            repr.bth = make_bth(opcode, dest_qp, psn, ack_req, se);
            let (hlen, total) = emit_headers(buf, &repr)?;
            let n = n as usize;
            let filled = if n == 0 {
                Ok(())
            } else {
                let dst = &mut buf[hlen..hlen + n];
                match &w.req.inline {
                    Some(d) => match d.get(offset as usize..offset as usize + n) {
                        Some(src) => {
                            dst.copy_from_slice(src);
                            Ok(())
                        }
                        None => Err(AccessError::OutOfBounds),
                    },
                    None => gather(env, &w.req.sges, offset, dst),
                }
            };
            if filled.is_err() {
                self.fail_wqe(ctx, idx, WcStatus::LocProtErr);
                return None;
            }

            // Commit.
            let w = &mut self.wqes[idx];
            if !w.started {
                w.started = true;
                w.first_psn = psn;
                w.last_psn = psn.add(w.npkts - 1);
                if rc && w.consumes_recv() {
                    self.rwqe_started = self.rwqe_started.wrapping_add(1);
                    w.rwqe_seq = self.rwqe_started;
                }
            }
            if w.kind.is_rd_atomic() && !w.rd_counted {
                w.rd_counted = true;
                self.rd_outstanding += 1;
            }
            if last && !rc {
                w.done = true;
            }
            self.noack = if ack_req { 0 } else { noack };
            if self.sent_any && psn.is_before(self.high_psn) {
                ctx.stats.retransmitted_packets += 1;
            } else if rc && ack_req && !self.lossless && self.rtt_sample.is_none() {
                // (A lossless path sends no probes, the round trip's only use: none is
                // timed, and the estimate of the lossy path stays for when it comes back.)
                self.rtt_sample = Some((psn.add(consumed - 1), now));
            }
            self.next_psn = psn.add(consumed);
            if !self.sent_any || self.next_psn.is_after(self.high_psn) {
                self.high_psn = self.next_psn;
            }
            self.sent_any = true;
            if last {
                self.cur += 1;
                self.offset = 0;
            } else {
                self.offset = offset + n as u64;
            }
            if rc {
                if self.retrans_deadline.is_none() {
                    self.retrans_deadline = local_ack_timeout(ctx.cfg.timeout).map(|d| now + d);
                }
                if self.probe_deadline.is_none() {
                    self.probe_deadline = self.probe_interval(ctx).map(|d| now + d);
                }
            } else {
                self.pop_done(ctx);
            }
            return Some(Transmit {
                len: total,
                ud_dest,
            });
        }
    }

    /// Carries out the local operation at the cursor (memory window bind, local
    /// invalidate), once: it takes no PSN (its range is empty: `last_psn` is the PSN before
    /// `first_psn`, so the ACK of everything sent before it retires it) and completes as
    /// soon as every request before it has. Returns `false` when the cursor must stay (a
    /// fence waits for READs/atomics before it) or the operation failed (the QP is in ERR
    /// and it completes with its status).
    fn local_op(&mut self, ctx: &mut QpCtx, idx: usize, env: &mut dyn Env) -> bool {
        let w = &self.wqes[idx];
        if !w.started {
            if ctx.cfg.qp_type == QpType::Ud {
                self.fail_wqe(ctx, idx, WcStatus::LocQpOpErr);
                return false;
            }
            if w.req.fence && self.wqes.iter().take(idx).any(|x| x.kind.is_rd_atomic()) {
                return false;
            }
            let r = match w.req.op {
                SendOp::BindMw(b) => env.bind_mw(&b),
                SendOp::LocalInv(rkey) => env.local_invalidate(rkey),
                _ => Err(WcStatus::LocQpOpErr),
            };
            if let Err(status) = r {
                self.fail_wqe(ctx, idx, status);
                return false;
            }
            let psn = self.next_psn;
            let w = &mut self.wqes[idx];
            w.started = true;
            w.done = true;
            w.first_psn = psn;
            w.last_psn = psn.sub(1);
        }
        self.cur = idx + 1;
        self.offset = 0;
        if idx == 0 {
            self.complete_front(ctx, WcStatus::Success);
        } else if ctx.cfg.qp_type != QpType::Rc {
            self.pop_done(ctx);
        }
        true
    }

    /// Puts the cursor on PSN `psn` (which must be `comp_psn` or later).
    fn reposition(&mut self, ctx: &mut QpCtx, psn: Psn) {
        let mtu = u64::from(ctx.mtu);
        let mut idx = self.wqes.len();
        let mut offset = 0;
        for (i, w) in self.wqes.iter().enumerate() {
            if !w.started {
                idx = i;
                break;
            }
            if psn.is_after_or_eq(w.first_psn) && psn.is_before_or_eq(w.last_psn) {
                idx = i;
                offset = match w.kind {
                    Kind::Atomic => 0,
                    _ => (u64::from(w.first_psn.distance_to(psn)) * mtu).min(w.len),
                };
                break;
            }
        }
        self.cur = idx;
        self.offset = offset;
        self.next_psn = psn;
    }

    /// A loss seen by a go-back-N restart: halves the send window (a timeout: to the least).
    fn on_loss(&mut self, timeout: bool) {
        let half = (self.cwnd / 2).max(CWND_MIN);
        self.ssthresh = half;
        self.cwnd = if timeout { CWND_MIN } else { half };
        self.cwnd_acc = 0;
    }

    /// `acked` more PSNs were acknowledged: grows the send window.
    fn grow_window(&mut self, acked: u32) {
        let sq = self;
        if sq.cwnd < sq.ssthresh {
            sq.cwnd = (sq.cwnd + acked).min(sq.ssthresh);
        } else if sq.cwnd < WINDOW {
            sq.cwnd_acc += acked;
            if sq.cwnd_acc >= sq.cwnd {
                sq.cwnd_acc -= sq.cwnd;
                sq.cwnd += 1;
            }
        }
    }

    /// Go-back-N: resend from `comp_psn`; the local ACK timer restarts with the resend.
    fn rewind(&mut self, ctx: &mut QpCtx, now: Instant) {
        self.go_back(ctx, now);
        self.retrans_deadline = None;
        ctx.stats.retries += 1;
    }

    /// Puts the cursor back on `comp_psn` and marks the restart.
    fn go_back(&mut self, ctx: &mut QpCtx, _now: Instant) {
        let psn = self.comp_psn;
        // The first packet sent again asks for an ACK: those asked for past the gap went
        // with the packets the responder dropped.
        self.noack = MAX_PKT_PER_ACK;
        self.reposition(ctx, psn);
        self.retry_mark = Some(psn);
        self.read_probe = None;
        self.rtt_sample = None;
        self.probe_deadline = None;
        self.probe_psns = [None; 2];
    }

    /// The interval of the next tail-loss probe: twice the smoothed round trip, or the
    /// round trip plus four times its variation if more, at least [`PROBE_MIN`]
    /// ([`PROBE_INITIAL`] before a round trip was measured), doubled for each probe since
    /// the last progress, at most [`PROBE_MAX`] and never past the local ACK timeout
    /// (`None` when the QP has no timer, timeout 0, and so no probes either).
    fn probe_interval(&self, ctx: &QpCtx) -> Option<Duration> {
        if self.lossless {
            return None;
        }
        let limit = local_ack_timeout(ctx.cfg.timeout)?;
        let base = match self.srtt {
            Some(s) => (s * 2)
                .max(s.saturating_add(self.rttvar * 4))
                .max(PROBE_MIN.as_nanos() as u64),
            None => PROBE_INITIAL.as_nanos() as u64,
        };
        let d = base.saturating_mul(1 << self.probes.min(PROBE_MAX_BACKOFF));
        Some(Duration::from_nanos(d.min(PROBE_MAX.as_nanos() as u64)).min(limit))
    }

    /// Starts a retry (timeout, sequence NAK, missing response), consuming `retry_cnt`; when
    /// none is left the oldest request fails with `RETRY_EXC_ERR`. 7 is seven retries, as
    /// the IBTA spec and hardware have it (only the RNR retry count has an infinite value, 7;
    /// Linux rxe treats a retry_cnt of 7 as infinite too, which makes a dead peer undetectable
    /// for rping and every rdma_cm user, which all pass 7).
    fn start_retry(&mut self, ctx: &mut QpCtx, now: Instant, timeout: bool) {
        if !timeout && self.retry_mark == Some(self.comp_psn) {
            return;
        }
        if !self.outstanding() {
            return;
        }
        if self.retry_left == 0 {
            self.fail_wqe(ctx, 0, WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        self.on_loss(timeout);
        self.rewind(ctx, now);
    }

    fn on_progress(&mut self, ctx: &mut QpCtx, now: Instant, acked: u32) {
        self.grow_window(acked);
        self.retry_left = ctx.cfg.retry_cnt;
        self.rnr_left = ctx.cfg.rnr_retry;
        self.retry_mark = None;
        self.read_probe = None;
        if self
            .rtt_sample
            .is_some_and(|(psn, _)| psn.is_before(self.comp_psn))
        {
            // Acknowledged by a later ACK than its own: no sample (that ACK's wait is not
            // a round trip).
            self.rtt_sample = None;
        }
        self.probes = 0;
        let outstanding = self.outstanding();
        let probed = self.probe_sent.take();
        if outstanding && probed.is_some_and(|p| p.next() == self.comp_psn) {
            // The ACK a probe drew stops short of the last PSN sent: the responder took
            // what it was waiting for and dropped what followed; send the rest again.
            self.go_back(ctx, now);
        }
        self.retrans_deadline = if outstanding {
            local_ack_timeout(ctx.cfg.timeout).map(|d| now + d)
        } else {
            None
        };
        self.probe_deadline = if outstanding {
            self.probe_interval(ctx).map(|d| now + d)
        } else {
            None
        };
        if self.next_psn.is_before(self.comp_psn) {
            let psn = self.comp_psn;
            self.reposition(ctx, psn);
        }
    }

    /// The response to the packet at `psn` came (its own ACK, READ response or ATOMIC
    /// ACK): a round-trip sample if that packet is being timed.
    fn rtt_answer(&mut self, now: Instant, psn: Psn) {
        if let Some((p, sent)) = self.rtt_sample {
            if p == psn {
                self.rtt_sample = None;
                self.rtt_update(now.saturating_duration_since(sent));
            }
        }
    }

    /// Takes a round-trip sample (RFC 6298's smoothing).
    fn rtt_update(&mut self, r: Duration) {
        // (Under 2^40 ns, about 18 minutes, so that the sums below cannot overflow.)
        let r = u64::try_from(r.as_nanos()).unwrap_or(u64::MAX).min(1 << 40);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    /// Everything before `upto` has been acknowledged: completes SEND/WRITE requests that
    /// end before it. Returns `true` when a READ/atomic before `upto` still misses its
    /// response (the caller retries).
    fn advance(&mut self, ctx: &mut QpCtx, now: Instant, upto: Psn) -> bool {
        let before = self.comp_psn;
        let mut blocked = false;
        while let Some(f) = self.wqes.front() {
            if !f.started {
                break;
            }
            if f.last_psn.is_before(upto) {
                if f.kind.is_rd_atomic() {
                    blocked = true;
                    break;
                }
                let next = f.last_psn.next();
                if next.is_after(self.comp_psn) {
                    self.comp_psn = next;
                }
                self.complete_front(ctx, WcStatus::Success);
            } else {
                if !f.kind.is_rd_atomic() && upto.is_after(self.comp_psn) {
                    self.comp_psn = upto;
                }
                break;
            }
        }
        if !blocked
            && self.wqes.front().is_none_or(|f| !f.started)
            && upto.is_after(self.comp_psn)
            && upto.is_before_or_eq(self.high_psn)
        {
            self.comp_psn = upto;
        }
        if self.comp_psn.is_after(before) {
            let acked = before.distance_to(self.comp_psn);
            self.on_progress(ctx, now, acked);
        }
        blocked
    }

    /// An ACK-class packet (RC): ACK/NAK, READ response or ATOMIC ACK (the completer).
    pub(super) fn handle_packet(
        &mut self,
        ctx: &mut QpCtx,
        now: Instant,
        repr: &roce::Repr,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        let psn = Psn::new(repr.bth.psn);
        if !self.sent_any || !psn.is_before(self.high_psn) {
            ctx.stats.malformed += 1;
            return;
        }
        let Some(aeth) = repr.aeth else {
            // READ_RESPONSE_MIDDLE
            self.on_read_response(ctx, now, psn, payload, env);
            return;
        };
        match repr.bth.opcode {
            Opcode::RC_ACKNOWLEDGE => match aeth.syndrome {
                Syndrome::Ack { credit } => {
                    ctx.stats.acks_received += 1;
                    self.rtt_answer(now, psn);
                    let upto = psn.next();
                    if upto.is_after(self.comp_psn) && self.advance(ctx, now, upto) {
                        self.start_retry(ctx, now, false);
                    }
                    self.update_credits(ctx, psn, credit);
                }
                Syndrome::RnrNak { timer } => {
                    ctx.stats.rnr_naks_received += 1;
                    self.on_rnr_nak(ctx, now, psn, timer);
                }
                Syndrome::Nak(NakCode::PsnSequenceError) => {
                    ctx.stats.seq_naks_received += 1;
                    if psn.is_before(self.comp_psn) {
                        return;
                    }
                    self.advance(ctx, now, psn);
                    if self.rnr_deadline.is_none() {
                        let before = ctx.stats.retries;
                        self.start_retry(ctx, now, false);
                        if ctx.stats.retries != before {
                            // The responder NAKs a gap once: if the first packet of the
                            // resend is lost too, it drops everything until a probe. That
                            // packet goes out twice (the copy asks for an ACK; a duplicate
                            // only draws one).
                            self.probe_psns = [Some(self.comp_psn), None];
                        }
                    }
                }
                Syndrome::Nak(code) => {
                    ctx.stats.note_err_nak(code, false);
                    if psn.is_before(self.comp_psn) {
                        return;
                    }
                    self.advance(ctx, now, psn);
                    let status = match code {
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::RemInvRdReqErr,
                    };
                    self.fail_wqe(ctx, 0, status);
                }
            },
            Opcode::RC_ATOMIC_ACKNOWLEDGE => {
                let orig = repr.atomic_ack_eth.map_or(0, |a| a.orig_data);
                self.on_atomic_ack(ctx, now, psn, orig, env);
            }
            _ => self.on_read_response(ctx, now, psn, payload, env),
        }
    }

    /// Records the end-to-end credits of an ACK for `psn`: the responder has `credit`
    /// receives beyond those taken by the messages that started at or before `psn`.
    fn update_credits(&mut self, ctx: &mut QpCtx, psn: Psn, credit: u8) {
        if ctx.cfg.qp_type != QpType::Rc {
            return;
        }
        if self.credit_psn.is_some_and(|p| psn.is_before(p)) {
            return;
        }
        let again = self.credit_psn == Some(psn);
        let before = self.credit_limit;
        self.credit_psn = Some(psn);
        self.credit_probe_at = None;
        let Some(free) = aeth::credit_count(credit) else {
            self.credit_limit = None;
            return;
        };
        let mut taken = self.rwqe_retired;
        for w in self.wqes.iter() {
            if !w.started || w.first_psn.is_after(psn) {
                break;
            }
            if w.rwqe_seq != 0 {
                taken = w.rwqe_seq;
            }
        }
        let limit = taken.wrapping_add(free);
        if again && before.is_some_and(|b| (limit.wrapping_sub(b) as i32) > 0) {
            self.peer_updates_credits = Some(true);
        }
        self.credit_limit = Some(limit);
    }

    fn on_rnr_nak(&mut self, ctx: &mut QpCtx, now: Instant, psn: Psn, timer: u8) {
        if psn.is_before(self.comp_psn) || self.rnr_deadline.is_some() {
            return;
        }
        self.advance(ctx, now, psn);
        if self.rnr_left == 0 {
            self.fail_wqe(ctx, 0, WcStatus::RnrRetryExcErr);
            return;
        }
        if self.rnr_left != 7 {
            self.rnr_left -= 1;
        }
        self.rnr_deadline = Some(now + rnr_timer(timer));
        self.retrans_deadline = None;
        self.probe_deadline = None;
    }

    /// Common checks of a READ response / ATOMIC ACK at `psn`: implicit ACK of what
    /// precedes it, then it must be the next response expected. Returns `false` (after
    /// starting a retry or counting a duplicate) when it is not.
    fn response_in_order(&mut self, ctx: &mut QpCtx, now: Instant, psn: Psn) -> bool {
        if psn.is_before(self.comp_psn) {
            return false;
        }
        let blocked = self.advance(ctx, now, psn);
        if psn != self.comp_psn && self.read_probe == Some(psn) {
            // What the READ's probe asked for came, and responses before it did not: the
            // READ goes again from the first one missing: a loss, so the window halves and
            // the local ACK timer restarts with the resend, as on a restart, but as a probe's
            // resend it counts no retry.
            self.on_loss(false);
            self.go_back(ctx, now);
            self.retrans_deadline = None;
            return false;
        }
        if blocked || psn != self.comp_psn {
            self.start_retry(ctx, now, false);
            return false;
        }
        true
    }

    fn on_read_response(
        &mut self,
        ctx: &mut QpCtx,
        now: Instant,
        psn: Psn,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        if !self.response_in_order(ctx, now, psn) {
            return;
        }
        self.rtt_answer(now, psn);
        let mtu = u64::from(ctx.mtu);
        let Some(f) = self.wqes.front() else {
            ctx.stats.malformed += 1;
            return;
        };
        if f.kind != Kind::Read || !f.started || psn.is_after(f.last_psn) {
            ctx.stats.malformed += 1;
            return;
        }
        let off = u64::from(f.first_psn.distance_to(psn)) * mtu;
        let expect = f.len.saturating_sub(off).min(mtu);
        if payload.len() as u64 != expect {
            ctx.stats.malformed += 1;
            return;
        }
        if !payload.is_empty() && scatter(env, &f.req.sges, off, payload).is_err() {
            self.fail_wqe(ctx, 0, WcStatus::LocProtErr);
            return;
        }
        let last = psn == f.last_psn;
        self.comp_psn = psn.next();
        if last {
            self.complete_front(ctx, WcStatus::Success);
        }
        self.on_progress(ctx, now, 1);
    }

    fn on_atomic_ack(
        &mut self,
        ctx: &mut QpCtx,
        now: Instant,
        psn: Psn,
        orig: u64,
        env: &mut dyn Env,
    ) {
        if !self.response_in_order(ctx, now, psn) {
            return;
        }
        self.rtt_answer(now, psn);
        let Some(f) = self.wqes.front() else {
            ctx.stats.malformed += 1;
            return;
        };
        if f.kind != Kind::Atomic || !f.started || f.first_psn != psn {
            ctx.stats.malformed += 1;
            return;
        }
        if !f.req.sges.is_empty() {
            let bytes = orig.to_ne_bytes();
            if scatter(env, &f.req.sges, 0, &bytes).is_err() {
                self.fail_wqe(ctx, 0, WcStatus::LocProtErr);
                return;
            }
        }
        self.comp_psn = psn.next();
        self.complete_front(ctx, WcStatus::Success);
        self.on_progress(ctx, now, 1);
    }

    /// The timer half of [`super::Qp::handle_timeout`].
    pub(super) fn handle_timeout(&mut self, ctx: &mut QpCtx, now: Instant) {
        if self.rnr_deadline.is_some_and(|d| d <= now) {
            self.rnr_deadline = None;
            if self.outstanding() {
                self.rewind(ctx, now);
            }
        }
        if self.retrans_deadline.is_some_and(|d| d <= now) {
            self.retrans_deadline = None;
            if self.outstanding() {
                ctx.stats.timeouts += 1;
                self.start_retry(ctx, now, true);
                return;
            }
        }
        if self.probe_deadline.is_some_and(|d| d <= now) {
            self.probe_deadline = None;
            if self.outstanding() && self.rnr_deadline.is_none() && !ctx.error {
                self.probe(ctx, now);
            }
        }
    }

    /// Tail-loss probe: no ACK moved `comp_psn` for a probe interval while packets are
    /// outstanding, so the last of them, or the ACK of them, or the NAK of a gap among them
    /// was lost (a responder NAKs a gap once, then drops what follows until the missing PSN
    /// arrives). Sends two packets again, each asking for an ACK: the first unacknowledged
    /// one and the last one sent. Whatever the responder lacks, one of them gets an answer:
    /// the first is the PSN a responder that lost it waits for (and its ACK, or the ACK a
    /// duplicate gets, moves `comp_psn`); the last completes a lost tail, or draws the NAK
    /// of a gap before it (a go-back-N from there, as any sequence NAK). The cursor and the
    /// local ACK timer are left alone and `retry_cnt` is not consumed: a probe is no retry
    /// in the IBTA sense (a requester may resend what is unacknowledged; a responder
    /// answers duplicates with ACKs), so a dead peer still gets RETRY_EXC_ERR after exactly
    /// `retry_cnt` + 1 local ACK timeouts.
    ///
    /// When the first unacknowledged PSN lies in a READ, the first probe since the last
    /// progress sends that READ's last PSN instead: a READ request sent again at a PSN asks
    /// for the response from there to the READ's end (up to 2 GiB; at a 1 MiB READ's first
    /// PSN, 256 packets of 4 KiB), and a probe that fires while those responses wait unread
    /// in this host's socket (a requester descheduled for a moment on a busy host) would have
    /// the responder send them all again: into the same socket, which overflows and loses
    /// some, and the next probe doubles them again (perftest's `ib_read_bw` on 2 cores: 522
    /// probes, 2,685 READs answered again, 3.7 times the data sent, 425 MB/s). The last PSN
    /// asks for one packet, and its response comes after whatever the responder sent before
    /// (in order, on one path; a responder that restarts its answer at a duplicate's PSN, as
    /// rxe does, costs one restart more): it completes the READ when the rest arrived, and
    /// arrives out of order when a response before it was lost, which sends the READ again
    /// from `comp_psn` as the probe would have (no retry counted: `read_probe`; the window
    /// halves, as after any loss). The probe also lifts the one-restart-per-PSN guard, since
    /// the restart that set it may have lost its own responses. A later probe with still no
    /// progress sends the first PSN as for any other request (a responder that lost the READ
    /// request, or whose one NAK of the gap was lost, waits for exactly that PSN).
    fn probe(&mut self, ctx: &mut QpCtx, now: Instant) {
        ctx.stats.probes += 1;
        self.probes = self.probes.saturating_add(1);
        self.rtt_sample = None;
        let read_end = self
            .wqes
            .iter()
            .find(|w| {
                w.started
                    && self.comp_psn.is_after_or_eq(w.first_psn)
                    && self.comp_psn.is_before_or_eq(w.last_psn)
            })
            .filter(|w| w.kind == Kind::Read && w.last_psn != self.comp_psn && self.probes == 1)
            .map(|w| w.last_psn);
        self.read_probe = read_end;
        if read_end.is_some() {
            // (Any response out of order may restart the READ again: the restart that set
            // the guard may have lost its own responses. And the response to a READ's last
            // PSN moves `comp_psn` past the READ only when all of it arrived: nothing after
            // it was dropped for want of the probed PSN, so no `probe_sent`.)
            self.retry_mark = None;
        }
        self.probe_sent = read_end.is_none().then_some(self.comp_psn);
        let first = read_end.unwrap_or(self.comp_psn);
        let last = self.high_psn.sub(1);
        self.probe_psns = [Some(first), (last != first).then_some(last)];
        self.probe_deadline = self.probe_interval(ctx).map(|d| now + d);
    }
}
