//! The per-QP transport state machine: the public face of [`Qp`], packet dispatch, error
//! handling and the helpers shared by the requester/completer ([`super::requester`]) and the
//! responder ([`super::responder`]).

use super::requester::SendQueue;
use super::responder::Responder;
use super::*;
use crate::psn::Psn;
use crate::qp::QpType;
use softrdma_wire::aeth::NakCode;
use softrdma_wire::opcode::{Class, Opcode, Transport as WireTransport};
use softrdma_wire::{bth, roce};
use std::collections::VecDeque;
use std::time::Instant;

/// Counters of one QP's transport, readable with [`Qp::stats`]. They only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Packets handed out by [`Qp::poll_transmit`].
    pub tx_packets: u64,
    /// Bytes of those packets (BTH through ICRC).
    pub tx_bytes: u64,
    /// Packets given to [`Qp::handle_packet`].
    pub rx_packets: u64,
    /// Bytes of those packets.
    pub rx_bytes: u64,
    /// Request packets sent again (PSN below the highest PSN already sent).
    pub retransmitted_packets: u64,
    /// Go-back-N restarts of the requester (timeout, sequence NAK, RNR, missing response).
    pub retries: u64,
    /// Retransmit-timer expiries with packets outstanding.
    pub timeouts: u64,
    /// Tail-loss probes: go-back-N resends after a short wait without ACK progress (a
    /// round-trip estimate, well before the local ACK timeout); they consume no retry.
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
    pub(super) cfg: QpConfig,
    pub(super) mtu: u32,
    pub(super) error: bool,
    pub(super) sq: SendQueue,
    pub(super) rsp: Responder,
    pub(super) completions: VecDeque<Completion>,
    pub(super) events: VecDeque<QpEvent>,
    pub(super) stats: QpStats,
    /// See [`Qp::set_hold_acks`].
    hold_acks: bool,
}

impl Qp {
    /// A QP in RTS with `cfg`.
    pub fn new(cfg: QpConfig) -> Qp {
        Qp {
            cfg,
            mtu: cfg.path_mtu.bytes(),
            error: false,
            sq: SendQueue::new(&cfg),
            rsp: Responder::new(&cfg),
            completions: VecDeque::with_capacity(64),
            events: VecDeque::new(),
            stats: QpStats::default(),
            hold_acks: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Takes new attributes while keeping the transport state: the owner creates the QP at
    /// RTR (so the responder can work) and calls this at RTR→RTS with the requester's
    /// attributes (`sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic`), and at
    /// RTS→RTS. The requester's next PSN becomes `cfg.sq_psn` if nothing was sent yet, the
    /// responder's expected PSN `cfg.rq_psn` if nothing was received yet; the retry counters
    /// restart from the new values.
    pub fn set_config(&mut self, cfg: QpConfig) {
        self.cfg = cfg;
        self.mtu = cfg.path_mtu.bytes();
        self.sq.reconfigure(&cfg);
        self.rsp.reconfigure(&cfg);
    }

    /// The counters.
    pub fn stats(&self) -> &QpStats {
        &self.stats
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
        if self.sq.wqes.len() >= self.cfg.max_send_wr.max(1) as usize {
            return Err(req);
        }
        if self.error {
            let c = Completion {
                wr_id: req.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: super::requester::wc_opcode(&req.op),
                ..Completion::default()
            };
            self.completions.push_back(c);
            return Ok(());
        }
        self.sq.push(req, self.mtu);
        Ok(())
    }

    /// Processes an arriving packet (BTH through ICRC, ICRC already verified).
    ///
    /// Never panics: packets that do not parse, are not for this QP (destination QP number,
    /// transport, P_Key) or do not fit the protocol state are dropped and counted in
    /// [`QpStats`].
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8], meta: &RxMeta, env: &mut dyn Env) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += packet.len() as u64;
        if self.error {
            return;
        }
        let Ok(view) = roce::Packet::new_checked(packet) else {
            self.stats.malformed += 1;
            return;
        };
        let Ok(repr) = roce::Repr::parse(&view) else {
            self.stats.malformed += 1;
            return;
        };
        let Ok(info) = repr.opcode_info() else {
            self.stats.malformed += 1;
            return;
        };
        let want = match self.cfg.qp_type {
            QpType::Rc => WireTransport::Rc,
            QpType::Uc => WireTransport::Uc,
            QpType::Ud => WireTransport::Ud,
            _ => {
                self.stats.malformed += 1;
                return;
            }
        };
        if info.transport != want
            || repr.bth.dest_qp != self.cfg.qp_num & 0xff_ffff
            || repr.bth.pkey & 0x7fff != bth::DEFAULT_PKEY & 0x7fff
        {
            self.stats.malformed += 1;
            return;
        }
        let payload = view.payload();
        match (self.cfg.qp_type, info.class) {
            (QpType::Rc, Class::Ack) => self.completer_packet(now, &repr, payload, env),
            (QpType::Rc, Class::Request) => self.rc_request(&repr, info, payload, env),
            (QpType::Uc, Class::Request) => self.uc_request(&repr, info, payload, env),
            (QpType::Ud, Class::Request) => self.ud_request(&repr, payload, meta, env),
            _ => self.stats.malformed += 1,
        }
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
        let t = if self.rsp.lone_positive_ack() {
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
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += t.len as u64;
        }
        t
    }

    /// Whether [`Qp::poll_transmit`] may have something to send (a cheap, conservative
    /// check: `true` can still be followed by `None`).
    pub fn has_pending_transmit(&self) -> bool {
        !self.rsp.out.is_empty()
            || (!self.error && self.sq.rnr_deadline.is_none() && self.sq.cur < self.sq.wqes.len())
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
        self.rsp.lone_positive_ack()
    }

    /// Whether a completion is waiting for [`Qp::poll_completion`].
    pub fn has_pending_completion(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Whether an RC requester has packets sent and not yet acknowledged: their ACK (or the
    /// retransmit timer) will bring the owner back to [`Qp::poll_transmit`], so an owner may
    /// leave newly posted requests queued until then and send them in one batch.
    pub fn awaiting_ack(&self) -> bool {
        self.cfg.qp_type == QpType::Rc && !self.error && self.sq.next_psn != self.sq.comp_psn
    }

    /// Send requests posted and not yet fully transmitted (the one being sent counts): what
    /// [`Qp::poll_transmit`] would start on now, or once the window, the credits or an
    /// outstanding READ let it.
    pub fn unsent_requests(&self) -> usize {
        self.sq.wqes.len().saturating_sub(self.sq.cur)
    }

    /// Whether an RC requester knows how many receives the responder has (end-to-end
    /// credits from its last ACK): false before the first ACK, and for responders that give
    /// no credit information (Linux rxe).
    pub fn knows_credits(&self) -> bool {
        self.sq.credit_limit.is_some()
    }

    /// The next work completion (send side and receive side, in the order they happened).
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// When [`Qp::handle_timeout`] must be called next (`None`: no timer running).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.error {
            return None;
        }
        [
            self.sq.retrans_deadline,
            self.sq.probe_deadline,
            self.sq.rnr_deadline,
            self.sq.credit_probe_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Tells an RC responder that its receive queue now holds `available` requests (the
    /// owner calls it after posting receives). If the last ACK advertised few credits (the
    /// requester may be waiting for them), an ACK of the last PSN received goes out with
    /// the new count: the unsolicited credit update of IBA 9.7.7.2. Returns `true` when it
    /// queued one (the owner then calls [`Qp::poll_transmit`]).
    pub fn recv_posted(&mut self, available: u32) -> bool {
        if self.cfg.qp_type != QpType::Rc || self.error {
            return false;
        }
        self.rsp.credit_update(available)
    }

    /// Runs the timers that expired by `now`: the RNR back-off (then the requester resends
    /// from the first unacknowledged PSN) and the retransmit timer (go-back-N, or
    /// `RETRY_EXC_ERR` and ERR when `retry_cnt` is used up).
    pub fn handle_timeout(&mut self, now: Instant, env: &mut dyn Env) {
        let _ = env;
        if self.error {
            return;
        }
        self.requester_timeout(now);
    }

    /// Moves the QP to ERR: every outstanding send request completes with `WR_FLUSH_ERR`
    /// (in order), pending responses are discarded and nothing more is sent or accepted.
    /// Receive requests belong to the owner, which flushes its receive queue; a receive
    /// request the responder was filling is completed here with `WR_FLUSH_ERR`.
    pub fn set_error(&mut self) {
        self.rsp.out.clear();
        self.enter_error(None);
    }

    /// Whether the QP is in ERR.
    pub fn is_error(&self) -> bool {
        self.error
    }

    /// Moves to ERR on the QP's own account (`event` raised when given): flushes the send
    /// queue (a request that failed keeps its status), completes a held receive request
    /// with `WR_FLUSH_ERR`, stops the timers. Responses already queued (e.g. the NAK that
    /// reports the error) are still sent.
    pub(super) fn enter_error(&mut self, event: Option<QpEvent>) {
        if self.error {
            return;
        }
        self.error = true;
        if let Some(e) = event {
            self.events.push_back(e);
        }
        self.flush_send_queue();
        if let Some(r) = self.rsp.recv.take() {
            self.push_recv_completion(r.req.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
        }
        self.rsp.cur = None;
    }

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

/// A BTH with this stack's constant fields.
pub(super) fn make_bth(
    opcode: Opcode,
    dest_qp: u32,
    psn: Psn,
    ack_req: bool,
    se: bool,
) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited_event: se,
        mig_req: false,
        pad_count: 0,
        pkey: bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: dest_qp & 0xff_ffff,
        ack_req,
        psn: psn.value(),
    }
}

/// Writes the headers of `repr` into `buf`, zeroes pad and ICRC, and returns the header
/// length and the total length; `None` when `buf` is too short or `repr` inconsistent.
pub(super) fn emit_headers(buf: &mut [u8], repr: &roce::Repr) -> Option<(usize, usize)> {
    let total = repr.buffer_len();
    if buf.len() < total {
        return None;
    }
    let hlen = repr.emit_header(buf).ok()?;
    buf.get_mut(hlen + repr.payload_len..total)?.fill(0);
    Some((hlen, total))
}

/// Total length of a scatter/gather list.
pub(super) fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Copies message bytes `[off, off + dst.len())` of a gather list into `dst`.
pub(super) fn gather(
    env: &mut dyn Env,
    sges: &[Sge],
    mut off: u64,
    dst: &mut [u8],
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for sge in sges {
        if done == dst.len() {
            break;
        }
        let len = u64::from(sge.length);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(dst.len() - done);
        env.read_local(sge, off as u32, &mut dst[done..done + n])?;
        done += n;
        off = 0;
    }
    if done == dst.len() {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

/// Copies `src` into message bytes `[off, off + src.len())` of a scatter list.
pub(super) fn scatter(
    env: &mut dyn Env,
    sges: &[Sge],
    mut off: u64,
    src: &[u8],
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for sge in sges {
        if done == src.len() {
            break;
        }
        let len = u64::from(sge.length);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(src.len() - done);
        env.write_local(sge, off as u32, &src[done..done + n])?;
        done += n;
        off = 0;
    }
    if done == src.len() {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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

    struct VecEnv {
        mem: HashMap<u32, Vec<u8>>,
    }

    impl Env for VecEnv {
        fn read_local(
            &mut self,
            sge: &Sge,
            offset: u32,
            dst: &mut [u8],
        ) -> Result<(), AccessError> {
            let m = self.mem.get(&sge.lkey).ok_or(AccessError::InvalidKey)?;
            let at = (sge.addr + u64::from(offset)) as usize;
            dst.copy_from_slice(m.get(at..at + dst.len()).ok_or(AccessError::OutOfBounds)?);
            Ok(())
        }
        fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
            let m = self.mem.get_mut(&sge.lkey).ok_or(AccessError::InvalidKey)?;
            let at = (sge.addr + u64::from(offset)) as usize;
            m.get_mut(at..at + src.len())
                .ok_or(AccessError::OutOfBounds)?
                .copy_from_slice(src);
            Ok(())
        }
        fn check_remote(&mut self, _: u32, _: u64, _: u64, _: bool) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn write_remote(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn read_remote(&mut self, _: u32, _: u64, _: &mut [u8]) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn atomic_remote(&mut self, _: u32, _: u64, _: AtomicOp) -> Result<u64, AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn take_recv(&mut self) -> Option<RecvRequest> {
            None
        }
    }

    #[test]
    fn gather_scatter_across_sges() {
        let mut env = VecEnv {
            mem: HashMap::from([(1, (0u8..100).collect()), (2, vec![0u8; 100])]),
        };
        let sges = [
            Sge {
                addr: 10,
                length: 3,
                lkey: 1,
            },
            Sge {
                addr: 0,
                length: 0,
                lkey: 1,
            },
            Sge {
                addr: 50,
                length: 5,
                lkey: 1,
            },
        ];
        let mut out = [0u8; 6];
        gather(&mut env, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [11, 12, 50, 51, 52, 53]);
        let mut big = [0u8; 8];
        assert_eq!(
            gather(&mut env, &sges, 1, &mut big),
            Err(AccessError::OutOfBounds)
        );
        let dst = [
            Sge {
                addr: 0,
                length: 2,
                lkey: 2,
            },
            Sge {
                addr: 10,
                length: 4,
                lkey: 2,
            },
        ];
        scatter(&mut env, &dst, 1, &[7, 8, 9]).unwrap();
        assert_eq!(&env.mem[&2][..3], &[0, 7, 0]);
        assert_eq!(&env.mem[&2][10..13], &[8, 9, 0]);
        let bad = [Sge {
            addr: 0,
            length: 4,
            lkey: 9,
        }];
        assert_eq!(
            scatter(&mut env, &bad, 0, &[1]),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(sge_total(&sges), 8);
    }
}
