//! Short RC work requests between two QPs of this host as records in a same-host lane's ring,
//! not as packets through the transport.
//!
//! Between two processes of one host a lane carries RoCE packets: every message is built into
//! a packet by the sending transport, taken apart by the receiving one, and answered by an ACK
//! packet built and taken apart in turn. For a short SEND or RDMA WRITE that is most of the
//! time a message takes (an 8-byte ping-pong spent about 7,500 instructions a round trip on
//! each side). Here such a request crosses the ring as a *record*
//! ([`crate::provider::wr_records`]): the work request and its payload, carried out by the
//! receiving side itself (the receive request consumed and completed, or the WRITE made), and
//! acknowledged by a record back, from which the sender completes it.
//!
//! The transport stays the authority for everything else, so no verbs semantic is built
//! twice:
//! - **Only the plain case goes as a record.** A request goes as a record only when the QP is
//!   in RTS, nothing of it is in flight (no packet, no other record), the request waits for
//!   its answer (it answers what came from the peer, or it was posted, like the one before
//!   it, with nothing outstanding: see `post_send`), and the peer's process said it takes
//!   records (and a lane back is up for the answers). READs, atomics, binds, invalidations,
//!   messages over `RECORD_MAX` (4 KiB), streams, and whatever is posted while a record is
//!   outstanding wait for it (in order) and go to the transport.
//! - **Credits and held acknowledgements as the transport's.** The receives that records
//!   take count against the transport's end-to-end credits; the acknowledgement of a WRITE
//!   that a polling application thread took waits for what the program answers, as the
//!   transport's ACK of such a WRITE does.
//! - **Anything but the plain case is refused, not handled.** The receiving side takes a
//!   record only when it has a receive request that holds the message, the keys and access
//!   rights allow the WRITE, and its QP is in RTS; otherwise it answers with a *bounce*, and
//!   the sender gives that request and everything after it to its transport, as packets.
//!   The packet path then gives exactly what it always gives: RNR and its retries, remote
//!   access and length errors, their completion statuses, ERR and flush. Once a record of an
//!   epoch bounced, the receiver takes none of that epoch after it (they come again as
//!   packets); the sender starts a new epoch.
//! - **Order** holds because the ring is in order and the two paths never overlap: records
//!   go only while the transport is idle, and nothing reaches the transport while records
//!   are outstanding.
//! - **A peer that stops answering** (its process died with the ring) is treated as the
//!   transport treats a peer that sends no ACK: once the local ACK timeout times
//!   `retry_cnt + 1` has passed (checked by the QP's timer), the oldest request completes with
//!   `RETRY_EXC_ERR` and the QP goes to ERR. A request is never sent twice (as a record and
//!   again as packets) unless its record was bounced, so nothing is delivered twice.
//! - `SOFTRDMA_WR_RECORDS=0` turns records off (in the receiving process: it says so when a
//!   lane comes up); so do `SOFTRDMA_TRANSPORT=wire`, a packet capture and fault injection.

use crate::provider::wr_records::{Kind, Record, HEADER};
use crate::provider::{DirectTx, PairTx, Provider};
use crate::verbs::env::{to_wc, QpEnv};
use crate::verbs::mr::{AccessFlags, KeyKind, MrCache, MrLease};
use crate::verbs::qp::records::{consumes_receive, Records, REMOTE_WRITE};
use crate::verbs::qp::{QpInner, QpState_};
use softrdma_proto::transport::{self as tp, Completion, Env, WcOpcode, WcStatus};
use softrdma_proto::QpState;
use std::time::{Duration, Instant};

/// Whether the transport `t` has nothing in flight or queued (a record may go now).
#[inline]
pub(crate) fn transport_idle(t: &tp::Qp) -> bool {
    !t.is_error()
        && t.unsent_requests() == 0
        && t.sent_requests() == 0
        && !t.has_pending_completion()
}

/// How long the peer may leave records unanswered before the oldest completes with
/// `RETRY_EXC_ERR`: the local ACK timeout times `retry_cnt + 1`, as the transport would wait
/// for an ACK (`None`: timeout 0, no limit).
fn patience(attr: &crate::verbs::qp::QpAttr) -> Option<Duration> {
    softrdma_proto::timer::local_ack_timeout(attr.timeout)
        .map(|t| t * (u32::from(attr.retry_cnt) + 1))
}

/// Sends `req` (checked and filled, `len` bytes) as a record when it may go as one (see the
/// module's notes) and returns `true`: the caller then hands it to [`Records::sent`].
/// `false`: it did not go, and the caller queues it (behind the records, or to the
/// transport).
pub(crate) fn try_send(qp: &QpInner, st: &mut QpState_, req: &tp::SendRequest, len: u32) -> bool {
    let kind = match req.op {
        tp::SendOp::Send => Kind::Send,
        tp::SendOp::SendWithImm(_) => Kind::SendWithImm,
        tp::SendOp::RdmaWrite { .. } => Kind::Write,
        tp::SendOp::RdmaWriteWithImm { .. } => Kind::WriteWithImm,
        _ => return false,
    };
    let (imm, remote_addr, rkey) = match req.op {
        tp::SendOp::SendWithImm(imm) => (imm, 0, 0),
        tp::SendOp::RdmaWrite { remote_addr, rkey } => (0, remote_addr, rkey),
        tp::SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => (imm, remote_addr, rkey),
        _ => (0, 0, 0),
    };
    let QpState_ {
        attr,
        transport,
        engine,
        mrs,
        records: r,
        timer_at,
        ..
    } = st;
    if attr.qp_state != QpState::Rts {
        return false;
    }
    // One record at a time: records are for requests that wait for their answer (a
    // ping-pong, an RPC). A stream is faster as packets, which the transport builds in runs
    // into the ring and whose ACKs it coalesces (4 KiB WRITEs: 3.2 M/s as packets, 2.1 as
    // records), and whose end-to-end credits keep SENDs from outrunning the receives posted
    // (records have none: such a SEND bounces into the transport's RNR back-off).
    // (Nothing waits behind a record and nothing is in the transport either: see `post_send`,
    // which asks no more of a request posted behind one.)
    if r.holding() {
        return false;
    }
    let (Some(t), Some(engine)) = (transport.as_ref(), engine.as_ref()) else {
        return false;
    };
    if !transport_idle(t) {
        return false;
    }
    let peer = attr.ah_attr.grh.dgid.to_ip();
    let dest = attr.dest_qp_num;
    // (While a capture or fault injection runs: packets only.)
    if !engine.lanes_direct() {
        return false;
    }
    if !r.ready {
        // (The generation first: a change after it is seen at the next post.)
        let generation = engine.records_generation();
        if !engine.records_ready(peer, dest) {
            r.looked_at = Some(generation);
            return false;
        }
        r.ready = true;
    }
    // (Borrowed in place, not taken out and put back: `PairTx` is some hundred bytes, two
    // copies a request.)
    let Some(mut lane) = record_out(
        &**engine,
        &mut r.pair,
        &mut r.pair_tried,
        peer,
        dest,
        qp.qp_num,
    ) else {
        r.ready = false;
        r.looked_at = Some(engine.records_generation());
        return false;
    };
    let n = len as usize;
    let seq = r.next_seq;
    // The acknowledgement held for the program's answer goes in it when it is a SEND and the
    // only answer owed (see `provider::wr_records`). Other answers owed go before the
    // request: the peer completes its own requests before it takes this one, as a NIC's ACK
    // comes before the program's answer (a program that waits on one completion channel for
    // both its CQs may take the first event for its send CQ's).
    let carried = match r.owed.as_slice() {
        [a] if a.kind == Kind::Ack && Record::may_carry_ack(kind) => Some((a.seq, a.epoch)),
        _ => None,
    };
    let written = if carried.is_none() {
        emit_answers(&mut lane, &r.owed, false, transport.as_mut())
    } else {
        0
    };
    let sent = 'request: {
        let Some(buf) = lane.reserve(HEADER + n) else {
            // A full ring: the receiver is behind; the transport waits for room its own way.
            break 'request false;
        };
        let payload = &mut buf[HEADER..HEADER + n];
        match &req.inline {
            Some(data) => payload.copy_from_slice(&data[..n]),
            None => {
                let n = payload.len();
                let read = |l: &MrLease, r: std::ops::Range<usize>| l.read(0, &mut payload[r]);
                if !copy_sges(qp, mrs, &req.sges, n, AccessFlags::empty(), read) {
                    // (The transport completes it with the status the wire gives.)
                    break 'request false;
                }
            }
        }
        Record {
            kind,
            solicited: req.solicited,
            dest_qpn: dest,
            seq,
            epoch: r.epoch,
            src_qpn: qp.qp_num,
            imm,
            remote_addr,
            rkey,
            len,
            ack: carried,
        }
        .emit(buf);
        lane.commit_record(HEADER + n);
        true
    };
    lane.finish();
    if let (true, Some(t)) = (sent, transport.as_mut()) {
        t.count_bypass(true, HEADER + n, false);
    }
    let answered = written + usize::from(sent && carried.is_some());
    r.owed.drain(..answered);
    // Nothing left to flush for this QP (unless its transport holds an ACK too): the
    // device's next look at held acknowledgements need not lock it (some 280 instructions a
    // round trip of a ping-pong).
    if answered > 0 && r.owed.is_empty() && !transport.as_ref().is_some_and(|t| t.has_held_ack()) {
        engine.forget_held_ack(qp.qp_num);
    }
    if !sent {
        return false;
    }
    r.next_seq = seq.wrapping_add(1);
    // (What came from the peer is answered.)
    r.received = false;
    // The QP's timer looks at the records from time to time while they are in use (see
    // `on_timer`).
    if r.deadline.is_none() {
        if let Some(p) = patience(attr) {
            let now = Instant::now();
            let d = now + p;
            r.deadline = Some(d);
            arm(&**engine, qp.qp_num, timer_at, d, now);
        }
    }
    true
}

/// The QP's timer came (`now`): when the oldest record was outstanding at the last look too
/// (a whole period of patience), it completes with `RETRY_EXC_ERR` and the QP goes to ERR
/// (`drive` then flushes the rest); answers owed are written (what still does not fit has
/// the timer come again soon: `write_answers`).
pub(crate) fn on_timer(engine: &dyn Provider, qp: &QpInner, st: &mut QpState_, now: Instant) {
    if !st.records.owed.is_empty() {
        write_answers(engine, qp.qp_num, st);
    }
    if st.records.deadline.is_none_or(|d| d > now) {
        return;
    }
    let front = st.records.sent.front().map(|s| s.seq);
    let expired = front.is_some() && front == st.records.watched;
    st.records.watched = front;
    st.records.deadline = if front.is_some() || st.records.ready {
        patience(&st.attr).map(|p| now + p)
    } else {
        None
    };
    if !expired {
        return;
    }
    if let Some(s) = st.records.sent.pop_front() {
        tracing::debug!(
            qpn = qp.qp_num,
            seq = s.seq,
            "a work-request record went unanswered"
        );
        complete_send(qp, &s.req, WcStatus::RetryExcErr, 0);
    }
    flush(qp, &mut st.records);
    if let Some(t) = st.transport.as_mut() {
        t.set_error();
    }
}

/// Completes every request sent as a record or waiting behind them with `WR_FLUSH_ERR`, in
/// order (the QP went to ERR).
pub(crate) fn flush(qp: &QpInner, r: &mut Records) {
    for s in r.sent.drain(..) {
        complete_send(qp, &s.req, WcStatus::WrFlushErr, 0);
    }
    for req in r.waiting.drain(..) {
        complete_send(qp, &req, WcStatus::WrFlushErr, 0);
    }
    r.deadline = None;
    r.watched = None;
}

/// Pushes the send completion of `req` with `status` (`byte_len` bytes) to the QP's send CQ.
fn complete_send(qp: &QpInner, req: &tp::SendRequest, status: WcStatus, byte_len: u32) {
    let c = Completion {
        wr_id: req.wr_id,
        status,
        opcode: req.op.wc_opcode(),
        byte_len,
        ..Completion::default()
    };
    qp.send_cq.arc().push(to_wc(&c, qp.qp_num, false), false);
}

/// Has the engine run the QP's timers by `at` at the latest: the engine is told only when the
/// deadline it holds (`timer_at`) is later, or has passed (taken by the engine already).
fn arm(engine: &dyn Provider, qpn: u32, timer_at: &mut Option<Instant>, at: Instant, now: Instant) {
    if timer_at.is_none_or(|held| held > at || held <= now) {
        engine.set_timer(qpn, Some(at));
        *timer_at = Some(at);
    }
}

/// What [`receive`] leaves for its caller to do once it has run.
#[derive(Default)]
pub(crate) struct Received {
    /// Requests went to the transport: drive the QP.
    pub(crate) drive: bool,
    /// A receive from the SRQ took it below its limit.
    pub(crate) srq_limit_hit: bool,
}

/// Takes a run of records `recs` from the QP's peer (under the QP's lock `st`): requests are
/// carried out or bounced, answers complete or give back what this side sent. Writes the
/// answers it owes into the lane back.
pub(crate) fn receive(
    engine: &dyn Provider,
    qp: &QpInner,
    st: &mut QpState_,
    recs: &[&[u8]],
) -> Received {
    let mut out = Received::default();
    for p in recs {
        let Some((rec, payload)) = Record::parse(p) else {
            continue;
        };
        if let Some(t) = st.transport.as_mut() {
            t.count_bypass(false, p.len(), rec.kind == Kind::Ack);
        }
        // (An acknowledgement a SEND carries answers this side's records sent before it.)
        if let Some((seq, epoch)) = rec.ack {
            out.drive |= on_ack(qp, st, seq, epoch);
        }
        match rec.kind {
            Kind::Ack => out.drive |= on_ack(qp, st, rec.seq, rec.epoch),
            Kind::Bounce | Kind::Refuse => out.drive |= on_bounce(st, &rec),
            _ => {
                if st.records.bounced_epoch == Some(rec.epoch) {
                    // (Its sender sends it again, as packets, with the one bounced.)
                    continue;
                }
                // A device that injects faults or captures sends packets only (it sends no
                // records: see `try_send`), and takes none either: bounced, the request comes
                // again as packets, whose ACKs its faults and its capture see.
                let answer = if engine.lanes_direct()
                    && take(qp, st, &rec, payload, &mut out.srq_limit_hit)
                {
                    st.records.received = true;
                    Kind::Ack
                } else {
                    tracing::debug!(
                        qpn = qp.qp_num,
                        seq = rec.seq,
                        "a work-request record bounced"
                    );
                    st.records.bounced_epoch = Some(rec.epoch);
                    Kind::Bounce
                };
                // (One ACK for a run of requests: the last one's.)
                let owed = &mut st.records.owed;
                match owed.last_mut() {
                    Some(a)
                        if answer == Kind::Ack && a.kind == Kind::Ack && a.epoch == rec.epoch =>
                    {
                        a.seq = rec.seq;
                    }
                    _ => owed.push(Record::answer(answer, &rec)),
                }
            }
        }
    }
    if st.records.owed.is_empty() {
        return out;
    }
    // The acknowledgement of what an application thread took (it polls its CQ) is held, as
    // the transport holds such an ACK: it goes in what the program answers when that is a
    // SEND, just before it otherwise (`try_send`), or at the thread's next empty poll, or
    // from the progress thread. A SEND ping-pong then sends no acknowledgement record either
    // way (acknowledged at once, each side wrote one and took one a round trip, some 1,000
    // instructions of its 4,000). And a peer that waits for the completion of its WRITE and
    // then spins on its memory for the answer (ib_write_lat) gets both together while it
    // still polls; acknowledged at once, it stopped polling before the answer came, which
    // then waited in its ring for its progress thread: 300 µs instead of 1. (Bounces go at
    // once: the peer's requests behind the one bounced wait for it.)
    if crate::provider::holding_acks(true) && st.records.owed.iter().all(|a| a.kind == Kind::Ack) {
        engine.note_held_ack(qp.qp_num);
        return out;
    }
    write_answers(engine, qp.qp_num, st);
    out
}

/// Writes the answers owed into the lane back to the peer, in order; what does not fit waits
/// for the QP's timer.
pub(crate) fn write_answers(engine: &dyn Provider, qpn: u32, st: &mut QpState_) {
    let peer = st.attr.ah_attr.grh.dgid.to_ip();
    let dest = st.attr.dest_qp_num;
    let done = match record_out(
        engine,
        &mut st.records.pair,
        &mut st.records.pair_tried,
        peer,
        dest,
        qpn,
    ) {
        Some(mut out) => {
            let done = emit_answers(&mut out, &st.records.owed, true, st.transport.as_mut());
            out.finish();
            done
        }
        None => 0,
    };
    let r = &mut st.records;
    r.owed.drain(..done);
    if !r.owed.is_empty() {
        tracing::debug!(
            qpn,
            owed = r.owed.len(),
            "work-request answers wait for the lane back"
        );
        let now = Instant::now();
        let soon = now + Duration::from_millis(1);
        if r.deadline.is_none_or(|d| d > soon) {
            r.deadline = Some(soon);
        }
        arm(engine, qpn, &mut st.timer_at, soon, now);
    }
}

/// Writes the answers `owed` into `lane` (the lane back to the peer), in order, as many as fit
/// (with `wait`, a full ring is waited on, 1 ms at most, before giving up), and counts them
/// on the transport `t`. Returns how many went.
fn emit_answers(
    lane: &mut RecordOut<'_>,
    owed: &[Record],
    wait: bool,
    mut t: Option<&mut tp::Qp>,
) -> usize {
    let mut done = 0;
    for a in owed {
        // (Reserved once when there is room, as nearly always.)
        if let Some(buf) = lane.reserve(HEADER) {
            a.emit(buf);
        } else {
            if !wait || !lane.wait_for_room(HEADER, Duration::from_millis(1)) {
                break;
            }
            let Some(buf) = lane.reserve(HEADER) else {
                break;
            };
            a.emit(buf);
        }
        lane.commit_record(HEADER);
        done += 1;
        if let Some(t) = t.as_deref_mut() {
            t.count_bypass(true, HEADER, a.kind == Kind::Ack);
        }
    }
    done
}

/// Where a QP's records go now: the ring of its own to the peer QP (see
/// `provider::lanes::pair`) while that may take them, the device's lane to the peer's process
/// otherwise. Offers the QP a ring of its own the first time (once per connection), drops
/// one that can take nothing any more. `None`: no lane is up to the peer.
fn record_out<'a>(
    engine: &'a dyn Provider,
    pair: &'a mut Option<PairTx>,
    pair_tried: &mut bool,
    peer: std::net::IpAddr,
    dest: u32,
    qpn: u32,
) -> Option<RecordOut<'a>> {
    if pair.as_ref().is_some_and(PairTx::dead) {
        *pair = None;
    }
    if pair.is_none() && !*pair_tried {
        *pair_tried = true;
        *pair = engine.offer_pair(peer, dest, qpn);
    }
    if let Some(p) = pair.as_mut().filter(|p| p.writable()) {
        return Some(RecordOut::Pair(p));
    }
    engine.direct_lane(peer, dest).map(RecordOut::Lane)
}

/// A way out for records ([`record_out`]).
enum RecordOut<'a> {
    /// The QP's ring of its own.
    Pair(&'a mut PairTx),
    /// The device's lane to the peer's process.
    Lane(DirectTx<'a>),
}

impl RecordOut<'_> {
    #[inline]
    fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        match self {
            RecordOut::Pair(p) => p.reserve(max),
            RecordOut::Lane(l) => l.reserve(max),
        }
    }

    #[inline]
    fn commit_record(&mut self, len: usize) {
        match self {
            RecordOut::Pair(p) => p.commit_record(len),
            RecordOut::Lane(l) => l.commit_record(len),
        }
    }

    fn wait_for_room(&mut self, max: usize, wait: Duration) -> bool {
        match self {
            RecordOut::Pair(p) => p.wait_for_room(max, wait),
            RecordOut::Lane(l) => l.wait_for_room(max, wait),
        }
    }

    /// Makes what was written visible (waking the reader when it sleeps).
    #[inline]
    fn finish(self) {
        match self {
            RecordOut::Pair(p) => p.publish(),
            // (Published when dropped.)
            RecordOut::Lane(l) => drop(l),
        }
    }
}

/// Goes through the registered memory of `sges` for a record's payload of `len` bytes, with
/// the checks the transport's gather and scatter make (local key, PD, bounds, and the access
/// `need`: LOCAL_WRITE to write) through the QP's cache of the last region found (`mrs`),
/// without the rest of a `QpEnv`; `copy` gets each entry's lease and the payload's range
/// for it. `false`: an entry failed its checks (nothing more is copied).
#[inline]
fn copy_sges(
    qp: &QpInner,
    mrs: &mut MrCache,
    sges: &[tp::Sge],
    len: usize,
    need: AccessFlags,
    mut copy: impl FnMut(&MrLease, std::ops::Range<usize>),
) -> bool {
    let res = &qp.pd.shared().resources;
    let pd = qp.pd.arc();
    let mut at = 0;
    for sge in sges {
        if at == len {
            break;
        }
        let k = (sge.length as usize).min(len - at);
        if k == 0 {
            continue;
        }
        let lease = res.check_access_cached(
            mrs,
            sge.lkey,
            KeyKind::Local,
            pd,
            sge.addr,
            k as u64,
            need,
            false,
            crate::verbs::mr::SpanUse::None,
        );
        let Ok(l) = lease else {
            return false;
        };
        copy(&l, at..at + k);
        at += k;
    }
    true
}

/// Carries out the request `rec` (its payload `payload`) when it is the plain case: the QP in
/// RTS, from its peer, a receive request that holds the message (SEND, WRITE with immediate),
/// the rkey and the QP's access rights allowing the WRITE. Returns whether it did; otherwise
/// nothing was changed (a receive request taken is put back).
fn take(
    qp: &QpInner,
    st: &mut QpState_,
    rec: &Record,
    payload: &[u8],
    srq_limit_hit: &mut bool,
) -> bool {
    let QpState_ {
        attr,
        transport,
        rq,
        mrs,
        ..
    } = st;
    let ok_state = attr.qp_state == QpState::Rts
        && rec.src_qpn == attr.dest_qp_num
        && transport.as_ref().is_some_and(|t| !t.is_error());
    if !ok_state {
        return false;
    }
    let write = matches!(rec.kind, Kind::Write | Kind::WriteWithImm);
    if write && attr.qp_access_flags & REMOTE_WRITE == 0 {
        return false;
    }
    let needs_recv = rec.kind != Kind::Write;
    let wqe = if needs_recv {
        let mut env = QpEnv::of(qp, rq, mrs);
        let Some(w) = env.take_recv() else {
            return false;
        };
        *srq_limit_hit |= env.srq_limit_hit;
        if w.sges.total_length() < u64::from(rec.len) && rec.kind != Kind::WriteWithImm {
            env.put_back_recv(w);
            return false;
        }
        Some(w)
    } else {
        None
    };
    let done = if write {
        QpEnv::of(qp, rq, mrs)
            .write_remote_whole(rec.rkey, rec.remote_addr, payload)
            .is_ok()
    } else {
        let w = wqe.as_ref().expect("a SEND took a receive request");
        let write = |l: &MrLease, r: std::ops::Range<usize>| l.write(0, &payload[r]);
        copy_sges(
            qp,
            mrs,
            &w.sges,
            payload.len(),
            AccessFlags::LOCAL_WRITE,
            write,
        )
    };
    if !done {
        if let Some(w) = wqe {
            QpEnv::of(qp, rq, mrs).put_back_recv(w);
        }
        return false;
    }
    if let Some(w) = wqe {
        let c = Completion {
            wr_id: w.wr_id,
            status: WcStatus::Success,
            opcode: if write {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            },
            byte_len: rec.len,
            imm_data: matches!(rec.kind, Kind::SendWithImm | Kind::WriteWithImm).then_some(rec.imm),
            invalidated_rkey: None,
            src_qp: 0,
            is_recv: true,
            solicited: rec.solicited,
        };
        qp.recv_cq
            .arc()
            .push(to_wc(&c, qp.qp_num, false), rec.solicited);
    }
    true
}

/// The peer carried out this side's records of `epoch` up to `seq`: they complete (the
/// signaled ones on the send CQ). When none is left, what waited behind them goes to the
/// transport; returns whether anything did.
fn on_ack(qp: &QpInner, st: &mut QpState_, seq: u32, epoch: u32) -> bool {
    let r = &mut st.records;
    if epoch != r.epoch {
        return false;
    }
    while let Some(s) = r.sent.front() {
        // (Sequence numbers wrap: "at or before" in the usual serial arithmetic.)
        if seq.wrapping_sub(s.seq) as i32 >= 0 {
            let s = r.sent.pop_front().expect("a front");
            if consumes_receive(&s.req.op) {
                // (The transport's end-to-end credits count the receive it took.)
                if let Some(t) = st.transport.as_mut() {
                    t.bypass_consumed_receive();
                }
            }
            if s.req.signaled {
                complete_send(qp, &s.req, WcStatus::Success, s.len);
            }
        } else {
            break;
        }
    }
    r.watched = None;
    if r.sent.is_empty() && !r.waiting.is_empty() {
        release(st);
        return true;
    }
    false
}

/// The peer bounced (or refused) this side's record `rec.seq` and everything after it in the
/// epoch: a new epoch starts, and they all (with what waited behind them) go to the
/// transport, in order. Returns whether anything did.
fn on_bounce(st: &mut QpState_, rec: &Record) -> bool {
    let r = &mut st.records;
    if rec.epoch != r.epoch {
        return false;
    }
    r.epoch = r.epoch.wrapping_add(1);
    if rec.kind == Kind::Refuse {
        r.refused = true;
        r.ready = false;
    }
    let sent = std::mem::take(&mut r.sent);
    let begun = sent.len() as u64;
    for (i, s) in sent.into_iter().enumerate() {
        r.waiting.insert(i, s.req);
    }
    r.watched = None;
    if r.waiting.is_empty() {
        return false;
    }
    release(st);
    // In SQD the requests sent as records had begun: they go on as packets (those posted
    // behind them wait for RTS).
    if st.attr.qp_state == QpState::Sqd {
        if let Some(t) = st.transport.as_mut() {
            t.allow_begin(begun);
        }
    }
    true
}

/// Hands what waits behind the records to the transport, in order (nothing is outstanding as a
/// record now).
fn release(st: &mut QpState_) {
    let Some(t) = st.transport.as_mut() else {
        return;
    };
    while let Some(req) = st.records.waiting.pop_front() {
        if let Err(req) = t.post_send(req) {
            // (Cannot happen: the records counted against the same limit.)
            st.records.waiting.push_front(req);
            break;
        }
    }
}
