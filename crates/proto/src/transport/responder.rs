//! The receive side of a QP: the RC responder (PSN check, duplicates and responder
//! resources, opcode sequence, access, RNR, length, execution, ACK/NAK/READ response/atomic
//! ACK generation), the UC responder (drop the rest of a message on a gap) and UD receive.
//!
//! Responses are queued in `out` in PSN order and turned into packets by
//! [`Responder::poll_transmit`]; READ response data is read from memory only then, straight
//! into the packet buffer.
//!
//! [`Responder`] owns all of this state. Its [`super::Qp`] lends it the shared [`QpCtx`]
//! (configuration, error state, completions, events, counters) for each call; it never sees
//! the requester. Its face to the QP: [`Responder::handle_packet`] (request-class packets),
//! [`Responder::poll_transmit`], [`Responder::credit_update`], [`Responder::flush`] and a few
//! queries.

use super::ctx::{QpCtx, MAX_MSG};
use super::io::{emit_headers, make_bth, scatter, sge_total};
use super::*;
use crate::psn::Psn;
use crate::qp::QpType;
use softrdma_wire::aeth::{self, NakCode, Syndrome};
use softrdma_wire::opcode::{Opcode, OpcodeInfo, Operation, Position};
use softrdma_wire::{atomic_ack_eth, roce};
use std::collections::VecDeque;

/// `QpConfig::access_flags` bits.
const REMOTE_WRITE: u32 = 2;
const REMOTE_READ: u32 = 4;
const REMOTE_ATOMIC: u32 = 8;

/// The GRH area at the start of every UD receive buffer.
const GRH_LEN: u64 = 40;

/// A receive request the responder is filling.
#[derive(Debug)]
struct HeldRecv {
    req: RecvRequest,
    cap: u64,
}

/// A multi-packet SEND or WRITE in progress.
#[derive(Debug, Clone, Copy)]
struct InMsg {
    write: bool,
    offset: u64,
    va: u64,
    rkey: u32,
    dma_len: u64,
}

/// A responder resource: what a duplicate READ or atomic is answered from.
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u64,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A response waiting for [`super::Qp::poll_transmit`].
#[derive(Debug, Clone, Copy)]
enum Out {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        remaining: u64,
        first: bool,
        msn: u32,
    },
}

/// Responder state.
#[derive(Debug)]
pub(super) struct Responder {
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    cur: Option<InMsg>,
    recv: Option<HeldRecv>,
    uc_drop: bool,
    res: VecDeque<Resource>,
    res_cap: usize,
    out: VecDeque<Out>,
    comm_est: bool,
    received_any: bool,
    /// End-to-end credits advertised by the last positive ACK and not yet used since (RC,
    /// own receive queue); `None` before the first such ACK or without credit information.
    credits_left: Option<u32>,
    /// Whether the last positive ACK queued acknowledges an RDMA WRITE without immediate (a
    /// request the program here sees no completion for; see [`Responder::acks_one_sided`]).
    one_sided_ack: bool,
}

/// A responder sends an unsolicited credit update when receives are posted while fewer than
/// this many advertised credits are left (the requester may be about to wait for them).
const CREDIT_UPDATE_BELOW: u32 = 16;

impl Responder {
    pub(super) fn new(cfg: &QpConfig) -> Responder {
        let res_cap = usize::from(cfg.max_dest_rd_atomic.max(1));
        Responder {
            epsn: Psn::new(cfg.rq_psn),
            msn: 0,
            nak_sent: false,
            cur: None,
            recv: None,
            uc_drop: false,
            res: VecDeque::with_capacity(res_cap),
            res_cap,
            out: VecDeque::with_capacity(64),
            comm_est: false,
            received_any: false,
            credits_left: None,
            one_sided_ack: false,
        }
    }

    pub(super) fn reconfigure(&mut self, cfg: &QpConfig) {
        if !self.received_any {
            self.epsn = Psn::new(cfg.rq_psn);
        }
        self.res_cap = usize::from(cfg.max_dest_rd_atomic.max(1));
        while self.res.len() > self.res_cap {
            self.res.pop_front();
        }
    }

    fn add_resource(&mut self, r: Resource) {
        if self.res.len() >= self.res_cap {
            self.res.pop_front();
        }
        self.res.push_back(r);
    }

    /// Queues an ACK, merging it into a positive ACK still waiting at the back of the queue
    /// (ACKs are cumulative).
    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Out::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.out.back_mut()
        {
            if psn.is_after_or_eq(*p) {
                *p = psn;
                *m = msn;
                return;
            }
        }
        self.out.push_back(Out::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credit: aeth::CREDIT_INVALID,
            },
            msn,
        });
    }

    /// Queues an ACK of the last PSN received carrying the credits (the count is filled in
    /// when it is sent) if the last advertised count was low and `available` is more, unless
    /// a positive ACK waits already (it will carry the count). Returns whether it queued one.
    pub(super) fn credit_update(&mut self, available: u32) -> bool {
        let Some(left) = self.credits_left else {
            return false;
        };
        if left >= CREDIT_UPDATE_BELOW || available <= left {
            return false;
        }
        // A positive ACK waiting already (held back by the owner until it next posts or
        // polls) carries the count when it goes: no second ACK, and nothing to send now. (A
        // program that reposts each receive as it takes it, before its answer, sent an ACK of
        // its own ahead of every answer: ib_send_lat -r 2 over the wire, 7.0 -> 10.5 us.)
        if self.lone_positive_ack() {
            return false;
        }
        // One update until the next ACK (which sets the count it advertises).
        self.credits_left = Some(available);
        self.push_ack(self.epsn.sub(1));
        true
    }

    /// Whether the only response waiting is one positive ACK (which requests may overtake,
    /// and an owner may hold back: see [`super::Qp::set_hold_acks`]).
    pub(super) fn lone_positive_ack(&self) -> bool {
        self.out.len() == 1
            && matches!(
                self.out.front(),
                Some(Out::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                })
            )
    }

    /// Whether the positive ACK waiting acknowledges an RDMA WRITE without immediate: the
    /// program here gets no completion for it, and its peer may be waiting on memory for an
    /// answer rather than polling.
    pub(super) fn acks_one_sided(&self) -> bool {
        self.one_sided_ack && self.lone_positive_ack()
    }

    /// Messages taken so far (the MSN, modulo 2^24).
    pub(super) fn msn(&self) -> u32 {
        self.msn
    }

    /// Whether a response waits to be sent.
    pub(super) fn has_pending_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// Drops every response waiting (the owner moved the QP to ERR).
    pub(super) fn discard_responses(&mut self) {
        self.out.clear();
    }

    /// The QP went to ERR: completes a held receive request with `WR_FLUSH_ERR` and forgets
    /// the message in progress. Responses already queued are still sent.
    pub(super) fn flush(&mut self, ctx: &mut QpCtx) {
        if let Some(r) = self.recv.take() {
            ctx.push_recv_completion(r.req.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
        }
        self.cur = None;
    }

    fn push_nak(&mut self, psn: Psn, syndrome: Syndrome) {
        self.out.push_back(Out::Ack {
            psn,
            syndrome,
            msn: self.msn,
        });
    }
}

/// Whether a SEND/WRITE packet of `n` payload bytes fits its position.
fn len_ok(position: Position, n: u64, mtu: u64) -> bool {
    match position {
        Position::First | Position::Middle => n == mtu,
        Position::Last => n >= 1 && n <= mtu,
        Position::Only => n <= mtu,
    }
}

impl Responder {
    fn note_request(&mut self, ctx: &mut QpCtx) {
        self.received_any = true;
        if !self.comm_est {
            self.comm_est = true;
            ctx.events.push_back(QpEvent::CommEst);
        }
    }

    /// RC class C error: NAK `code` for `psn`, ERR with `event`.
    fn rc_fail(&mut self, ctx: &mut QpCtx, psn: Psn, code: NakCode, event: QpEvent) {
        self.push_nak(psn, Syndrome::Nak(code));
        ctx.stats.note_err_nak(code, true);
        ctx.fail(Some(event));
    }

    /// Completes the held receive request with an error status.
    fn fail_recv(&mut self, ctx: &mut QpCtx, status: WcStatus, opcode: WcOpcode) {
        if let Some(r) = self.recv.take() {
            ctx.push_recv_completion(r.req.wr_id, status, opcode, 0);
        }
    }

    /// Takes a receive request unless one is held; `false` when none is available.
    fn ensure_recv(&mut self, env: &mut dyn Env) -> bool {
        if self.recv.is_some() {
            return true;
        }
        match env.take_recv() {
            Some(req) => {
                if let Some(n) = self.credits_left.as_mut() {
                    *n = n.saturating_sub(1);
                }
                let cap = sge_total(&req.sges);
                self.recv = Some(HeldRecv { req, cap });
                true
            }
            None => false,
        }
    }

    /// A request-class packet of this QP's transport (RC, UC or UD).
    pub(super) fn handle_packet(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        payload: &[u8],
        meta: &RxMeta,
        env: &mut dyn Env,
    ) {
        match ctx.cfg.qp_type {
            QpType::Rc => self.rc_request(ctx, repr, info, payload, env),
            QpType::Uc => self.uc_request(ctx, repr, info, payload, env),
            QpType::Ud => self.ud_request(ctx, repr, payload, meta, env),
            _ => ctx.stats.malformed += 1,
        }
    }

    /// An RC request packet.
    fn rc_request(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        let psn = Psn::new(repr.bth.psn);
        let diff = psn.diff(self.epsn);
        if diff > 0 {
            ctx.stats.out_of_sequence += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                let e = self.epsn;
                self.push_nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
                ctx.stats.seq_naks_sent += 1;
            }
            return;
        }
        if diff < 0 {
            ctx.stats.duplicates += 1;
            self.rc_duplicate(ctx, repr, info, psn, env);
            return;
        }
        self.nak_sent = false;
        self.note_request(ctx);
        // Opcode sequence.
        let op = info.operation;
        let seq_ok = match (self.cur, info.position) {
            (Some(m), Position::Middle | Position::Last) => {
                (op == Operation::RdmaWrite && m.write) || (op == Operation::Send && !m.write)
            }
            (None, Position::First | Position::Only) => true,
            _ => false,
        };
        if !seq_ok {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        match op {
            Operation::Send => self.rc_send(ctx, repr, info, psn, payload, env),
            Operation::RdmaWrite => self.rc_write(ctx, repr, info, psn, payload, env),
            Operation::RdmaReadRequest => self.rc_read(ctx, repr, psn, env),
            Operation::CompareSwap | Operation::FetchAdd => self.rc_atomic(ctx, repr, op, psn, env),
            _ => self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr),
        }
    }

    fn rc_send(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        psn: Psn,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        let n = payload.len() as u64;
        if !len_ok(info.position, n, u64::from(ctx.mtu)) {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        if info.position.is_start() {
            if !self.ensure_recv(env) {
                self.rnr_nak(ctx, psn);
                return;
            }
            self.cur = Some(InMsg {
                write: false,
                offset: 0,
                va: 0,
                rkey: 0,
                dma_len: 0,
            });
        }
        let (Some(mut m), Some(held)) = (self.cur, self.recv.as_ref()) else {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        };
        if m.offset + n > held.cap {
            self.fail_recv(ctx, WcStatus::LocLenErr, WcOpcode::Recv);
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        if n > 0 && scatter(env, &held.req.sges, m.offset, payload).is_err() {
            self.fail_recv(ctx, WcStatus::LocProtErr, WcOpcode::Recv);
            self.rc_fail(ctx, psn, NakCode::RemoteOperationalError, QpEvent::Fatal);
            return;
        }
        m.offset += n;
        if info.position.is_end() {
            if let Some(i) = repr.ieth {
                // SEND with invalidate: the rkey is invalidated before the receive completes;
                // one that cannot be is an invalid request (class J), completing the
                // receive in error too.
                if env.remote_invalidate(i.rkey).is_err() {
                    self.fail_recv(ctx, WcStatus::RemInvReqErr, WcOpcode::Recv);
                    self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
                    return;
                }
            }
        }
        self.epsn = psn.next();
        if info.position.is_end() {
            self.cur = None;
            self.finish_send(ctx, repr, m.offset);
        } else {
            self.cur = Some(m);
        }
        if repr.bth.ack_req {
            self.one_sided_ack = false;
            self.push_ack(psn);
        }
    }

    /// The receive completion of a SEND (RC/UC), MSN bump.
    fn finish_send(&mut self, ctx: &mut QpCtx, repr: &roce::Repr, len: u64) {
        self.msn = (self.msn + 1) & 0xff_ffff;
        if let Some(r) = self.recv.take() {
            ctx.completions.push_back(Completion {
                wr_id: r.req.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: len as u32,
                imm_data: repr.immdt.map(|i| i.imm_data),
                invalidated_rkey: repr.ieth.map(|i| i.rkey),
                src_qp: 0,
                is_recv: true,
                solicited: repr.bth.solicited_event,
            });
        }
    }

    /// The receive completion of a WRITE with immediate (RC/UC), MSN bump.
    fn finish_write(&mut self, ctx: &mut QpCtx, repr: &roce::Repr, len: u64) {
        self.msn = (self.msn + 1) & 0xff_ffff;
        if repr.immdt.is_none() {
            return;
        }
        if let Some(r) = self.recv.take() {
            ctx.completions.push_back(Completion {
                wr_id: r.req.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: len as u32,
                imm_data: repr.immdt.map(|i| i.imm_data),
                invalidated_rkey: None,
                src_qp: 0,
                is_recv: true,
                solicited: repr.bth.solicited_event,
            });
        }
    }

    fn rnr_nak(&mut self, ctx: &mut QpCtx, psn: Psn) {
        let timer = ctx.cfg.min_rnr_timer & 0x1f;
        self.push_nak(psn, Syndrome::RnrNak { timer });
        ctx.stats.rnr_naks_sent += 1;
    }

    fn rc_write(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        psn: Psn,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        if ctx.cfg.access_flags & REMOTE_WRITE == 0 {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        let n = payload.len() as u64;
        if !len_ok(info.position, n, u64::from(ctx.mtu)) {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        let mut m = match (info.position.is_start(), repr.reth, self.cur) {
            (true, Some(r), _) => InMsg {
                write: true,
                offset: 0,
                va: r.va,
                rkey: r.rkey,
                dma_len: u64::from(r.dma_len),
            },
            (false, _, Some(m)) => m,
            _ => {
                self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
                return;
            }
        };
        let end = info.position.is_end();
        if m.offset + n > m.dma_len || (end && m.offset + n != m.dma_len) {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        if info.consumes_recv_wqe && !self.ensure_recv(env) {
            self.rnr_nak(ctx, psn);
            return;
        }
        if info.position.is_start() && env.check_remote(m.rkey, m.va, m.dma_len, true).is_err() {
            self.rc_fail(ctx, psn, NakCode::RemoteAccessError, QpEvent::AccessErr);
            return;
        }
        if n > 0
            && env
                .write_remote(m.rkey, m.va.wrapping_add(m.offset), payload)
                .is_err()
        {
            self.rc_fail(ctx, psn, NakCode::RemoteAccessError, QpEvent::AccessErr);
            return;
        }
        m.offset += n;
        self.epsn = psn.next();
        if end {
            self.cur = None;
            self.finish_write(ctx, repr, m.dma_len);
        } else {
            self.cur = Some(m);
        }
        if repr.bth.ack_req {
            self.one_sided_ack = repr.immdt.is_none();
            self.push_ack(psn);
        }
    }

    fn rc_read(&mut self, ctx: &mut QpCtx, repr: &roce::Repr, psn: Psn, env: &mut dyn Env) {
        let Some(r) = repr.reth else {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        };
        let len = u64::from(r.dma_len);
        if ctx.cfg.access_flags & REMOTE_READ == 0 || len > MAX_MSG {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        if env.check_remote(r.rkey, r.va, len, false).is_err() {
            self.rc_fail(ctx, psn, NakCode::RemoteAccessError, QpEvent::AccessErr);
            return;
        }
        let mtu = u64::from(ctx.mtu);
        let npkts = if len == 0 {
            1
        } else {
            len.div_ceil(mtu) as u32
        };
        let last = psn.add(npkts - 1);
        self.add_resource(Resource::Read {
            first: psn,
            last,
            va: r.va,
            rkey: r.rkey,
            len,
        });
        self.msn = (self.msn + 1) & 0xff_ffff;
        self.out.push_back(Out::Read {
            psn,
            va: r.va,
            rkey: r.rkey,
            remaining: len,
            first: true,
            msn: self.msn,
        });
        self.epsn = last.next();
    }

    fn rc_atomic(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        op: Operation,
        psn: Psn,
        env: &mut dyn Env,
    ) {
        let Some(a) = repr.atomic_eth else {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        };
        if ctx.cfg.access_flags & REMOTE_ATOMIC == 0 || a.va % 8 != 0 {
            self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
            return;
        }
        let aop = if op == Operation::CompareSwap {
            AtomicOp::CmpAndSwp {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAndAdd { add: a.swap_add }
        };
        let orig = match env.atomic_remote(a.rkey, a.va, aop) {
            Ok(v) => v,
            Err(AccessError::Misaligned) => {
                self.rc_fail(ctx, psn, NakCode::InvalidRequest, QpEvent::ReqErr);
                return;
            }
            Err(_) => {
                self.rc_fail(ctx, psn, NakCode::RemoteAccessError, QpEvent::AccessErr);
                return;
            }
        };
        self.msn = (self.msn + 1) & 0xff_ffff;
        self.add_resource(Resource::Atomic { psn, orig });
        self.out.push_back(Out::AtomicAck {
            psn,
            orig,
            msn: self.msn,
        });
        self.epsn = psn.next();
    }

    /// A request whose PSN is below the expected one: re-ACK SEND/WRITE, replay READ and
    /// atomic from the resources, drop the rest. A READ is replayed only if its range still
    /// passes the check of a new one (`Env::check_remote`: the region may be gone, or an
    /// on-demand region's pages, since the READ was first answered); else the duplicate is
    /// dropped.
    fn rc_duplicate(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        psn: Psn,
        env: &mut dyn Env,
    ) {
        match info.operation {
            Operation::Send | Operation::RdmaWrite => {
                let last_good = self.epsn.prev();
                self.push_ack(last_good);
            }
            Operation::RdmaReadRequest => {
                let Some(r) = repr.reth else { return };
                let (va, len) = (r.va, u64::from(r.dma_len));
                let found = self.res.iter().rev().find_map(|res| match *res {
                    Resource::Read {
                        first,
                        last,
                        va: rva,
                        rkey,
                        len: rlen,
                    } if psn.is_after_or_eq(first)
                        && psn.is_before_or_eq(last)
                        && rkey == r.rkey
                        && va >= rva
                        && va.saturating_add(len) <= rva.saturating_add(rlen) =>
                    {
                        Some(())
                    }
                    _ => None,
                });
                if found.is_some() && env.check_remote(r.rkey, va, len, false).is_ok() {
                    ctx.stats.read_replays += 1;
                    self.out.push_back(Out::Read {
                        psn,
                        va,
                        rkey: r.rkey,
                        remaining: len,
                        first: true,
                        msn: self.msn,
                    });
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let found = self.res.iter().rev().find_map(|res| match *res {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = found {
                    ctx.stats.atomic_replays += 1;
                    self.out.push_back(Out::AtomicAck {
                        psn,
                        orig,
                        msn: self.msn,
                    });
                }
            }
            _ => {}
        }
    }

    /// Drops the rest of the current UC message (its receive request is kept).
    fn uc_drop_msg(&mut self) {
        self.cur = None;
        self.uc_drop = true;
    }

    /// A UC request packet.
    fn uc_request(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        info: &OpcodeInfo,
        payload: &[u8],
        env: &mut dyn Env,
    ) {
        let psn = Psn::new(repr.bth.psn);
        let diff = psn.diff(self.epsn);
        if diff < 0 && self.received_any {
            // Stale (UC has no retransmission; only a duplicating network makes these).
            ctx.stats.out_of_sequence += 1;
            return;
        }
        let start = info.position.is_start();
        if diff != 0 || self.uc_drop {
            if start {
                self.cur = None;
                self.uc_drop = false;
            } else {
                self.uc_drop_msg();
                self.epsn = psn.next();
                self.received_any = true;
                ctx.stats.out_of_sequence += 1;
                return;
            }
        }
        self.epsn = psn.next();
        self.note_request(ctx);
        let op = info.operation;
        if start {
            self.cur = None;
        } else {
            match self.cur {
                Some(m) if m.write == (op == Operation::RdmaWrite) => {}
                _ => {
                    self.uc_drop_msg();
                    ctx.stats.out_of_sequence += 1;
                    return;
                }
            }
        }
        let n = payload.len() as u64;
        if !len_ok(info.position, n, u64::from(ctx.mtu)) {
            self.uc_drop_msg();
            ctx.stats.malformed += 1;
            return;
        }
        match op {
            Operation::Send => {
                if start {
                    if !self.ensure_recv(env) {
                        ctx.stats.no_recv_drops += 1;
                        self.uc_drop_msg();
                        return;
                    }
                    self.cur = Some(InMsg {
                        write: false,
                        offset: 0,
                        va: 0,
                        rkey: 0,
                        dma_len: 0,
                    });
                }
                let (Some(mut m), Some(held)) = (self.cur, self.recv.as_ref()) else {
                    self.uc_drop_msg();
                    return;
                };
                if m.offset + n > held.cap {
                    self.fail_recv(ctx, WcStatus::LocLenErr, WcOpcode::Recv);
                    self.uc_drop_msg();
                    return;
                }
                if n > 0 && scatter(env, &held.req.sges, m.offset, payload).is_err() {
                    self.fail_recv(ctx, WcStatus::LocProtErr, WcOpcode::Recv);
                    self.uc_drop_msg();
                    return;
                }
                m.offset += n;
                if info.position.is_end() {
                    self.cur = None;
                    self.finish_send(ctx, repr, m.offset);
                } else {
                    self.cur = Some(m);
                }
            }
            Operation::RdmaWrite => {
                if ctx.cfg.access_flags & REMOTE_WRITE == 0 {
                    self.uc_drop_msg();
                    return;
                }
                let mut m = match (start, repr.reth, self.cur) {
                    (true, Some(r), _) => InMsg {
                        write: true,
                        offset: 0,
                        va: r.va,
                        rkey: r.rkey,
                        dma_len: u64::from(r.dma_len),
                    },
                    (false, _, Some(m)) => m,
                    _ => {
                        self.uc_drop_msg();
                        return;
                    }
                };
                let end = info.position.is_end();
                if m.offset + n > m.dma_len
                    || (end && m.offset + n != m.dma_len)
                    || (start && env.check_remote(m.rkey, m.va, m.dma_len, true).is_err())
                {
                    self.uc_drop_msg();
                    return;
                }
                if info.consumes_recv_wqe && !self.ensure_recv(env) {
                    ctx.stats.no_recv_drops += 1;
                    self.uc_drop_msg();
                    return;
                }
                if n > 0
                    && env
                        .write_remote(m.rkey, m.va.wrapping_add(m.offset), payload)
                        .is_err()
                {
                    self.uc_drop_msg();
                    return;
                }
                m.offset += n;
                if end {
                    self.cur = None;
                    self.finish_write(ctx, repr, m.dma_len);
                } else {
                    self.cur = Some(m);
                }
            }
            _ => {
                ctx.stats.malformed += 1;
                self.uc_drop_msg();
            }
        }
    }

    /// A UD SEND.
    fn ud_request(
        &mut self,
        ctx: &mut QpCtx,
        repr: &roce::Repr,
        payload: &[u8],
        meta: &RxMeta,
        env: &mut dyn Env,
    ) {
        let Some(d) = repr.deth else {
            ctx.stats.malformed += 1;
            return;
        };
        if d.qkey != ctx.cfg.qkey {
            ctx.stats.qkey_violations += 1;
            return;
        }
        let Some(req) = env.take_recv() else {
            ctx.stats.no_recv_drops += 1;
            return;
        };
        let need = GRH_LEN + payload.len() as u64;
        let status = if need > sge_total(&req.sges) {
            WcStatus::LocLenErr
        } else if scatter(env, &req.sges, 0, &meta.grh).is_err()
            || (!payload.is_empty() && scatter(env, &req.sges, GRH_LEN, payload).is_err())
        {
            WcStatus::LocProtErr
        } else {
            WcStatus::Success
        };
        let ok = status == WcStatus::Success;
        ctx.completions.push_back(Completion {
            wr_id: req.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: if ok { need as u32 } else { 0 },
            imm_data: if ok {
                repr.immdt.map(|i| i.imm_data)
            } else {
                None
            },
            invalidated_rkey: None,
            src_qp: d.src_qp,
            is_recv: true,
            solicited: repr.bth.solicited_event,
        });
    }

    /// The responder half of [`super::Qp::poll_transmit`].
    pub(super) fn poll_transmit(
        &mut self,
        ctx: &mut QpCtx,
        buf: &mut [u8],
        env: &mut dyn Env,
    ) -> Option<Transmit> {
        let mtu = u64::from(ctx.mtu);
        let dest_qp = ctx.cfg.dest_qp_num;
        loop {
            let front = *self.out.front()?;
            match front {
                Out::Ack { psn, syndrome, msn } => {
                    // A positive ACK carries the receives left now (end-to-end credits).
                    let syndrome = match syndrome {
                        Syndrome::Ack { .. } => {
                            let code = aeth::credit_code(env.recv_available());
                            self.credits_left = aeth::credit_count(code);
                            Syndrome::Ack { credit: code }
                        }
                        other => other,
                    };
                    let repr = roce::Repr {
                        bth: make_bth(Opcode::RC_ACKNOWLEDGE, dest_qp, psn, false, false),
                        aeth: Some(aeth::Repr { syndrome, msn }),
                        ..roce::Repr::default()
                    };
                    let (_, total) = emit_headers(buf, &repr)?;
                    self.out.pop_front();
                    if syndrome.is_ack() {
                        ctx.stats.acks_sent += 1;
                    }
                    return Some(Transmit {
                        len: total,
                        ud_dest: None,
                    });
                }
                Out::AtomicAck { psn, orig, msn } => {
                    let repr = roce::Repr {
                        bth: make_bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest_qp, psn, false, false),
                        aeth: Some(aeth::Repr {
                            syndrome: Syndrome::Ack {
                                credit: aeth::CREDIT_INVALID,
                            },
                            msn,
                        }),
                        atomic_ack_eth: Some(atomic_ack_eth::Repr { orig_data: orig }),
                        ..roce::Repr::default()
                    };
                    let (_, total) = emit_headers(buf, &repr)?;
                    self.out.pop_front();
                    return Some(Transmit {
                        len: total,
                        ud_dest: None,
                    });
                }
                Out::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first,
                    msn,
                } => {
                    let n = remaining.min(mtu);
                    let last = remaining <= mtu;
                    let opcode = match (first, last) {
                        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    };
                    let aeth = (first || last).then_some(aeth::Repr {
                        syndrome: Syndrome::Ack {
                            credit: aeth::CREDIT_INVALID,
                        },
                        msn,
                    });
                    let repr = roce::Repr {
                        bth: make_bth(opcode, dest_qp, psn, false, false),
                        aeth,
                        payload_len: n as usize,
                        ..roce::Repr::default()
                    };
                    let (hlen, total) = emit_headers(buf, &repr)?;
                    let n = n as usize;
                    if n > 0 && env.read_remote(rkey, va, &mut buf[hlen..hlen + n]).is_err() {
                        // The memory went away under a READ being answered.
                        self.out.pop_front();
                        self.out.push_front(Out::Ack {
                            psn,
                            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                            msn,
                        });
                        ctx.stats.note_err_nak(NakCode::RemoteAccessError, true);
                        ctx.fail(Some(QpEvent::AccessErr));
                        continue;
                    }
                    if last {
                        self.out.pop_front();
                    } else if let Some(Out::Read {
                        psn: p,
                        va: v,
                        remaining: r,
                        first: f,
                        ..
                    }) = self.out.front_mut()
                    {
                        *p = psn.next();
                        *v = va.wrapping_add(n as u64);
                        *r = remaining - n as u64;
                        *f = false;
                    }
                    return Some(Transmit {
                        len: total,
                        ud_dest: None,
                    });
                }
            }
        }
    }
}
