//! The per-QP transport state machine: the public face of [`Qp`]. A QP owns its
//! requester/completer ([`Requester`]), its responder ([`Responder`]) and what the two share
//! ([`QpCtx`]: configuration, error state, completions, events, counters); it dispatches
//! arriving packets to one or the other, merges their outgoing packets, and moves both to
//! ERR together.

use super::ctx::QpCtx;
use super::requester::Requester;
use super::responder::Responder;
use super::*;
use crate::qp::QpType;
use softrdma_wire::opcode::{Class, Transport as WireTransport};
use softrdma_wire::{bth, roce};
use std::time::Instant;

/// One queue pair's transport: see the [module documentation](super).
///
/// Behaviour, per transport:
/// * **RC**: as Linux rxe — segmentation at the path MTU, AckReq on the last packet of each
///   message and every 64 packets, a window of 128 unacknowledged PSNs, `max_rd_atomic`
///   outstanding READ/atomics, coalesced ACKs, go-back-N from the first unacknowledged PSN
///   on timeout / PSN-sequence NAK / missing READ response, RNR back-off, duplicate
///   handling with responder resources (`max_dest_rd_atomic` READ/atomic entries).
/// * **UC**: the same packets without ACK, READ or atomics; a PSN gap drops the rest of the
///   current message (its receive request is kept for the next message); sends complete
///   when transmitted.
/// * **UD**: one SEND packet per message with a DETH; longer than the MTU → completed
///   successfully without emitting a packet (rxe's reading of C10-93.1.1); receives get the
///   40-byte GRH area first and need a matching Q_Key.
#[derive(Debug)]
pub struct Qp {
    pub(super) ctx: QpCtx,
    pub(super) requester: Requester,
    pub(super) responder: Responder,
    /// See [`Qp::set_hold_acks`].
    hold_acks: bool,
    /// Both halves were flushed after the QP went to ERR.
    flushed: bool,
    /// The responder's message count when the requester last sent a packet (see
    /// [`Qp::received_since_sent`]).
    msn_at_send: u32,
}

impl Qp {
    /// A QP in RTS with `cfg`.
    pub fn new(cfg: QpConfig) -> Qp {
        Qp {
            ctx: QpCtx::new(cfg),
            requester: Requester::new(&cfg),
            responder: Responder::new(&cfg),
            hold_acks: false,
            flushed: false,
            msn_at_send: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.ctx.cfg
    }

    /// Takes new attributes while keeping the transport state: the owner creates the QP at
    /// RTR (so the responder can work) and calls this at RTR→RTS with the requester's
    /// attributes (`sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic`), and at
    /// RTS→RTS. The requester's next PSN becomes `cfg.sq_psn` if nothing was sent yet, the
    /// responder's expected PSN `cfg.rq_psn` if nothing was received yet; the retry counters
    /// restart from the new values.
    pub fn set_config(&mut self, cfg: QpConfig) {
        self.ctx.cfg = cfg;
        self.ctx.mtu = self.ctx.segment.unwrap_or(cfg.path_mtu.bytes());
        self.requester.reconfigure(&cfg);
        self.responder.reconfigure(&cfg);
    }

    /// Segments messages into packets of `bytes` of payload instead of the path MTU, and
    /// takes packets of that size (`None`: the path MTU again). For two ends that agree on it
    /// out of band, both the same: softrdma uses it between two QPs of one host, whose
    /// packets never cross a network. An RC or UC QP only, set before anything is sent or
    /// received; `bytes` is clamped to 256..=65536 and kept across [`Qp::set_config`].
    /// Never fails.
    pub fn set_segment(&mut self, bytes: Option<u32>) {
        self.ctx.segment = bytes.map(|b| b.clamp(256, 65536));
        self.ctx.mtu = self.ctx.segment.unwrap_or(self.ctx.cfg.path_mtu.bytes());
    }

    /// The segment size in bytes: the path MTU, or what [`Qp::set_segment`] set. A buffer
    /// for [`Qp::poll_transmit`] needs this plus 64 bytes.
    pub fn segment(&self) -> u32 {
        self.ctx.mtu
    }

    /// The counters.
    pub fn stats(&self) -> &QpStats {
        &self.ctx.stats
    }

    /// Queues a send request. Fails, giving it back, when `max_send_wr` requests are
    /// outstanding (posted and not yet completed). On a QP in ERR the request is accepted and
    /// completes at once with `WR_FLUSH_ERR`.
    ///
    /// Problems with the request itself (bad lkey, an operation the transport lacks, a
    /// message over 2^31 bytes) are reported by its completion, not here.
    // The request is given back whole on the (cold) full-queue path; boxing it would cost an
    // allocation per post, which its inline scatter/gather list is there to avoid.
    #[allow(clippy::result_large_err)]
    pub fn post_send(&mut self, req: SendRequest) -> Result<(), SendRequest> {
        self.requester.post(&mut self.ctx, req)
    }

    /// Queues a send request that `fill` writes in place, as [`Qp::post_send`] queues one
    /// given by value, without moving it: `fill` gets a blank request (a signal-less SEND of
    /// nothing, `wr_id` 0) in the queue's own slot, and what it returns is returned.
    ///
    /// Fails with [`PostSendError::QueueFull`], without calling `fill`, when `max_send_wr`
    /// requests are outstanding; with [`PostSendError::Rejected`] when `fill` fails (nothing
    /// is queued). On a QP in ERR the request completes at once with `WR_FLUSH_ERR`.
    pub fn post_send_with<T, E>(
        &mut self,
        fill: impl FnOnce(&mut SendRequest) -> Result<T, E>,
    ) -> Result<T, PostSendError<E>> {
        self.requester.post_with(&mut self.ctx, fill)
    }

    /// Processes an arriving packet (BTH through ICRC, ICRC already verified).
    ///
    /// Never panics: packets that do not parse, are not for this QP (destination QP number,
    /// transport, P_Key) or do not fit the protocol state are dropped and counted in
    /// [`QpStats`].
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8], meta: &RxMeta, env: &mut dyn Env) {
        let ctx = &mut self.ctx;
        ctx.stats.rx_packets += 1;
        ctx.stats.rx_bytes += packet.len() as u64;
        if ctx.error {
            return;
        }
        let Ok((repr, payload)) = roce::Repr::parse_packet(packet) else {
            ctx.stats.malformed += 1;
            return;
        };
        let Ok(info) = repr.opcode_info() else {
            ctx.stats.malformed += 1;
            return;
        };
        let want = match ctx.cfg.qp_type {
            QpType::Rc => WireTransport::Rc,
            QpType::Uc => WireTransport::Uc,
            QpType::Ud => WireTransport::Ud,
            _ => {
                ctx.stats.malformed += 1;
                return;
            }
        };
        if info.transport != want
            || repr.bth.dest_qp != ctx.cfg.qp_num & 0xff_ffff
            || repr.bth.pkey & 0x7fff != bth::DEFAULT_PKEY & 0x7fff
        {
            ctx.stats.malformed += 1;
            return;
        }
        match info.class {
            Class::Ack if ctx.cfg.qp_type == QpType::Rc => {
                self.requester.handle_packet(ctx, now, &repr, payload, env)
            }
            Class::Request => self
                .responder
                .handle_packet(ctx, &repr, info, payload, meta, env),
            _ => ctx.stats.malformed += 1,
        }
        self.settle();
    }

    /// Writes the next packet to send into `buf` (at least MTU + 64 bytes; a smaller buffer
    /// makes the QP wait), or returns `None` when there is nothing to send right now.
    ///
    /// Responses (ACKs, NAKs, READ responses, atomic ACKs) go first, then requests — except
    /// a lone positive ACK, which goes after the requests ready with it: it carries nothing
    /// the peer waits for as urgently as a new request, and a request that answers what was
    /// just received (a ping-pong, an RPC) then reaches the peer one packet sooner. While
    /// [`Qp::set_hold_acks`] is on, that ACK is not sent at all. The packet is written from
    /// `buf[0]`: BTH, extended headers, payload, zero pad, and 4 zero bytes for the ICRC,
    /// which the owner computes; [`Transmit::len`] counts all of them.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        env: &mut dyn Env,
    ) -> Option<Transmit> {
        let t = if self.responder.lone_positive_ack() {
            match self.requester_transmit(now, buf, env) {
                Some(t) => Some(t),
                None if self.hold_acks => None,
                None => self.responder_transmit(buf, env),
            }
        } else {
            match self.responder_transmit(buf, env) {
                Some(t) => Some(t),
                None => self.requester_transmit(now, buf, env),
            }
        };
        if let Some(t) = &t {
            self.ctx.stats.tx_packets += 1;
            self.ctx.stats.tx_bytes += t.len as u64;
        }
        t
    }

    /// Whether [`Qp::poll_transmit`] may have something to send (a cheap, conservative
    /// check: `true` can still be followed by `None`).
    pub fn has_pending_transmit(&self) -> bool {
        self.responder.has_pending_transmit() || (!self.ctx.error && self.requester.may_transmit())
    }

    /// Tells an RC requester whether its packets (and the ACKs that answer them) now travel
    /// a path that loses none, such as a ring in memory shared with a peer on the same host
    /// (`false` at creation). On such a path it sends no tail-loss probes: an ACK that is
    /// late comes from a peer that is slow (descheduled), not from a loss, and a probe would
    /// only resend what the peer already has, or start a go-back-N of the whole window when
    /// the probe's duplicate ACK comes back first. The retransmit timer stays: a path that
    /// closes (its peer gone) loses what it held, and the local ACK timeout resends that on
    /// the next path. Switched back off with packets outstanding, the probe timer starts
    /// again from `now`. Never fails; does nothing on UC and UD.
    pub fn set_lossless_path(&mut self, on: bool, now: Instant) {
        if self.ctx.cfg.qp_type == QpType::Rc {
            self.requester.set_lossless(&self.ctx, on, now);
        }
    }

    /// Holds back (`true`) or lets go (`false`) a positive ACK that is the only response
    /// waiting: an owner whose application is about to see the completions of what the ACK
    /// acknowledges, and is likely to answer on this QP at once, holds it so that the answer
    /// goes first and the ACK after it, in the same batch. The owner must let go and call
    /// [`Qp::poll_transmit`] again soon ([`Qp::has_held_ack`] tells whether one is held):
    /// the peer's requester waits for it. NAKs, READ responses and atomic ACKs are never
    /// held, and an ACK queued behind them goes with them.
    pub fn set_hold_acks(&mut self, hold: bool) {
        self.hold_acks = hold;
    }

    /// Whether a positive ACK is the only response waiting (held, or about to be sent after
    /// the requests).
    pub fn has_held_ack(&self) -> bool {
        self.responder.lone_positive_ack()
    }

    /// Whether the positive ACK waiting alone (see [`Qp::has_held_ack`]) acknowledges an RDMA
    /// WRITE without immediate, a request the program here sees no completion for.
    pub fn held_ack_is_one_sided(&self) -> bool {
        self.responder.acks_one_sided()
    }

    /// Counts, in [`Qp::stats`], a message that the owner carried to or from the peer QP
    /// past the transport (`sent`, or received), `bytes` long, as the packet it stands for
    /// would be counted: an acknowledgement (`ack`) or a request. softrdma's verbs layer
    /// carries short requests between two QPs of one host that way. A request sent counts
    /// for [`Qp::received_since_sent`] as one the transport sent. Never fails.
    pub fn count_bypass(&mut self, sent: bool, bytes: usize, ack: bool) {
        if sent && !ack {
            // (A request went: what the responder took so far is answered.)
            self.msn_at_send = self.responder.msn();
        }
        let s = &mut self.ctx.stats;
        if sent {
            s.tx_packets += 1;
            s.tx_bytes += bytes as u64;
            s.acks_sent += u64::from(ack);
        } else {
            s.rx_packets += 1;
            s.rx_bytes += bytes as u64;
            s.acks_received += u64::from(ack);
        }
    }

    /// Tells an RC requester that a message which consumed a receive request at the
    /// responder (a SEND, a WRITE with immediate) went to the peer past the transport and
    /// completed (see [`Qp::count_bypass`]): the end-to-end credits the responder advertised
    /// count it, so the requester starts one message fewer on them than it would have.
    /// Never fails; does nothing on UC and UD.
    pub fn bypass_consumed_receive(&mut self) {
        if self.ctx.cfg.qp_type == QpType::Rc {
            self.requester.bypass_consumed_receive();
        }
    }

    /// Whether a completion is waiting for [`Qp::poll_completion`].
    pub fn has_pending_completion(&self) -> bool {
        !self.ctx.completions.is_empty()
    }

    /// Whether an RC requester has packets sent and not yet acknowledged: their ACK (or the
    /// retransmit timer) will bring the owner back to [`Qp::poll_transmit`], so an owner may
    /// leave newly posted requests queued until then and send them in one batch.
    pub fn awaiting_ack(&self) -> bool {
        self.ctx.cfg.qp_type == QpType::Rc && !self.ctx.error && self.requester.awaiting_ack()
    }

    /// Whether the responder took a whole message (SEND, WRITE, READ or atomic request) from
    /// the peer since the requester last sent a packet: what is posted now is likely an
    /// answer to it.
    pub fn received_since_sent(&self) -> bool {
        self.responder.msn() != self.msn_at_send
    }

    /// Send requests posted and not yet fully transmitted (the one being sent counts): what
    /// [`Qp::poll_transmit`] would start on now, or once the window, the credits or an
    /// outstanding READ let it.
    pub fn unsent_requests(&self) -> usize {
        self.requester.unsent_requests()
    }

    /// Send requests whose packets were all sent and which have not completed yet (an RC
    /// requester's waiting for their ACK or READ responses).
    pub fn sent_requests(&self) -> usize {
        self.requester.sent_requests()
    }

    /// Moves the send queue in and out of draining (`on`: the QP went to SQD; off: back to
    /// RTS). While draining, the requests that have begun (packets sent, or the one being
    /// sent) go on to complete, with their retransmissions and ACKs, and none posted or
    /// queued behind them begins; the responder works as in RTS. See [`Qp::is_drained`].
    pub fn set_draining(&mut self, on: bool) {
        self.requester.set_draining(on);
    }

    /// While draining, lets `n` more of the requests held back begin all the same, the
    /// oldest first: requests that had begun elsewhere before the QP went to SQD and are
    /// handed to the transport now (a same-host path that gave them back).
    pub fn allow_begin(&mut self, n: u64) {
        self.requester.allow_begin(n);
    }

    /// Whether the send queue has no request begun and not completed, and none that may
    /// still begin (what `IBV_EVENT_SQ_DRAINED` announces once a draining queue gets there).
    pub fn is_drained(&self) -> bool {
        self.requester.drained()
    }

    /// Whether an RC requester knows how many receives the responder has (end-to-end
    /// credits from its last ACK): false before the first ACK, and for responders that give
    /// no credit information (Linux rxe).
    pub fn knows_credits(&self) -> bool {
        self.requester.knows_credits()
    }

    /// The next work completion (send side and receive side, in the order they happened).
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.ctx.completions.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.ctx.events.pop_front()
    }

    /// When [`Qp::handle_timeout`] must be called next (`None`: no timer running).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.ctx.error {
            return None;
        }
        self.requester.next_timeout()
    }

    /// Tells an RC responder that its receive queue now holds `available` requests (the
    /// owner calls it after posting receives). If the last ACK advertised few credits (the
    /// requester may be waiting for them), an ACK of the last PSN received goes out with
    /// the new count: the unsolicited credit update of IBA 9.7.7.2. Returns `true` when it
    /// queued one (the owner then calls [`Qp::poll_transmit`]).
    pub fn recv_posted(&mut self, available: u32) -> bool {
        if self.ctx.cfg.qp_type != QpType::Rc || self.ctx.error {
            return false;
        }
        self.responder.credit_update(available)
    }

    /// Runs the timers that expired by `now`: the RNR back-off (then the requester resends
    /// from the first unacknowledged PSN) and the retransmit timer (go-back-N, or
    /// `RETRY_EXC_ERR` and ERR when `retry_cnt` is used up).
    pub fn handle_timeout(&mut self, now: Instant, env: &mut dyn Env) {
        let _ = env;
        if self.ctx.error {
            return;
        }
        self.requester.handle_timeout(&mut self.ctx, now);
        self.settle();
    }

    /// Moves the QP to ERR: every outstanding send request completes with `WR_FLUSH_ERR`
    /// (in order), pending responses are discarded and nothing more is sent or accepted.
    /// Receive requests belong to the owner, which flushes its receive queue; a receive
    /// request the responder was filling is completed here with `WR_FLUSH_ERR`.
    pub fn set_error(&mut self) {
        self.responder.discard_responses();
        self.ctx.fail(None);
        self.settle();
    }

    /// Whether the QP is in ERR.
    pub fn is_error(&self) -> bool {
        self.ctx.error
    }

    /// The requester half of [`Qp::poll_transmit`], then [`Qp::settle`].
    #[inline]
    fn requester_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        env: &mut dyn Env,
    ) -> Option<Transmit> {
        // (Nothing to look at: the call would return `None` and change nothing. A lone ACK
        // asks the requester first, nearly always in vain.)
        if !self.requester.has_work() {
            self.settle();
            return None;
        }
        let t = self.requester.poll_transmit(&mut self.ctx, now, buf, env);
        if t.is_some() {
            self.msn_at_send = self.responder.msn();
        }
        self.settle();
        t
    }

    /// The responder half of [`Qp::poll_transmit`], then [`Qp::settle`].
    #[inline]
    fn responder_transmit(&mut self, buf: &mut [u8], env: &mut dyn Env) -> Option<Transmit> {
        let t = self.responder.poll_transmit(&mut self.ctx, buf, env);
        self.settle();
        t
    }

    /// After either half ran: if it moved the QP to ERR ([`QpCtx::fail`]), flushes the
    /// send queue (every outstanding request completes, a failed one with its status, the
    /// rest with `WR_FLUSH_ERR`, in order), then completes a held receive request with
    /// `WR_FLUSH_ERR`, and stops the timers. Responses already queued (e.g. the NAK that
    /// reports the error) are still sent.
    #[inline]
    fn settle(&mut self) {
        if self.ctx.error && !self.flushed {
            self.flushed = true;
            self.requester.flush_send_queue(&mut self.ctx);
            self.responder.flush(&mut self.ctx);
        }
    }
}
