//! The data path of one QP, between its sans-IO transport and the provider: [`drive`], which
//! runs the transport (in the view of memory and receive queue of `verbs::env`) and hands
//! its packets to the provider's transmit batch, its completions to the CQs and its events
//! to the QP; and the QP's face to the provider ([`QpPort`]: packets, timeouts, held ACKs).

use crate::provider::Provider;
use crate::provider::{
    holding_acks, receiving_for_poller, with_tx, Delivery, QpPort, TxBatch, Via, PKT_BUF, WR_RECORD,
};
use crate::verbs::cq::WorkCompletion;
pub(crate) use crate::verbs::env::to_wc;
use crate::verbs::env::{QpEnv, DEFER_MIN};
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::qp::parked::needs_receive;
use crate::verbs::qp::{QpInner, QpState_};
use crate::verbs::records;
use softrdma_proto::device::grh_for;
use softrdma_proto::transport::{QpEvent, RxMeta};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an RC QP that finds its same-host lane's ring full waits for room before it
/// leaves the rest to the ACKs of what the ring holds (see [`drive`]).
const FULL_RING_WAIT: Duration = Duration::from_micros(50);

/// How much of a run into a same-host lane's ring is made visible at a time while the
/// receiver is awake (at least; a packet is never split; the copies of the part are made
/// first, without the copy engines when the part is small): a large message's first segments
/// reach a polling receiver while the rest are still copied in, instead of all at the end
/// of the run (up to 64 segments of nearly 64 KiB). Two processes pinned, 2 cores,
/// `perf OP --lat -s 1048576` one way: SEND 118-147 -> 75-90 µs, WRITE 42-65 -> 22-26, READ
/// 68-71 -> 53-58 (BENCHMARKS.md, "A large message over a lane").
const PUBLISH_BYTES: usize = 64 * 1024;

/// Runs a QP's transport until it has nothing more to say right now: transmits into `tx`
/// (flushing full batches), delivers completions to the CQs, raises events, and records the
/// next deadline. Called with the QP's lock held, by the posting thread or the progress
/// thread.
pub(crate) fn drive(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
    now: Instant,
    tx: &mut TxBatch,
) -> Vec<EventType> {
    let mut events = Vec::new();
    let QpState_ {
        transport,
        rq,
        ud_dests,
        attr,
        mrs,
        timer_at,
        parked,
        records,
        tx_at_completion,
        ..
    } = st;
    let Some(t) = transport.as_mut() else {
        return events;
    };
    let mut env = QpEnv::of(qp, rq, mrs);
    let src = engine.local().ip();
    let peer = attr.ah_attr.grh.dgid.to_ip();
    // An application thread receiving for itself holds the ACK of what it received: the
    // program sees the completion sooner. What it answers on this QP (post_send drives the
    // QP) goes out first with the ACK right behind, in one batch; if it answers nothing, the
    // ACK goes when the thread next polls an empty CQ, or from the progress thread once the
    // program has not polled for `SOFTRDMA_ACK_HOLD_US` (see `provider::progress`; the
    // progress thread holds the ACKs of what it takes for a polling program the same way).
    // A trade-off, measured over the wire (interleaved,
    // 8 bytes one way, medians): holding it past the answer until that next poll (or sending
    // it in a second system call right after the answer) made a peer that waits for the
    // completion of each send wait for it (ib_send_lat 8.0 us, 5.87 with the ACK in the
    // answer's batch), while a peer that does not wait gains from taking the answer alone
    // (`softrdma perf send --lat` 5.20 us against 5.66 in one batch).
    //
    // Over a same-host lane an ACK costs a record in a ring, not a system call: the ACK of a
    // SEND goes at once, before the program sees the completion, so that a peer waiting for
    // the completion of what it sent (perftest's latency tests wait for each one) has it as
    // soon as it has the answer (ib_send_lat 1.16 -> 0.89 us against holding it until the
    // next poll; `softrdma perf send --lat` 0.90 -> 0.84). The ACK of an RDMA WRITE is held
    // like over the wire, to go right behind the answer: the program gets no completion for
    // a WRITE and may be waiting on memory, and so may its peer. ib_write_lat polls its send
    // CQ for the completion of its WRITE, then spins on its buffer for the peer's; with the
    // ACK at once (before the peer's answer), the answer landed in a ring nobody was reading
    // (the program no longer polled; the progress thread still left the device to it) until
    // the hand-off ended: 590-800 us a WRITE, 1.2-1.8 with the ACK behind the answer.
    // (Each path below sets it on the transport before it transmits.) With
    // `SOFTRDMA_ACK_HOLD_US=0` a program's poll holds the ACKs of a lane's packets only (that
    // knob models a wire peer that acknowledges at once; a lane's peer is always softrdma).
    let hold = match (holding_acks(true), holding_acks(false)) {
        (true, false) => engine.lane_is_up(peer, attr.dest_qp_num),
        (lane, _) => lane,
    };
    // Whether payloads may stay in the program's memory (see below), once asked.
    let mut gather = None;
    // An RC or UC QP whose peer is reached by a same-host lane writes its packets straight
    // into the lane's ring (one copy less than through the batch), in runs of up to 64,
    // while nothing waits in the batch before them.
    let mut direct = matches!(
        qp.qp_type,
        softrdma_proto::QpType::Rc | softrdma_proto::QpType::Uc
    ) && engine.lanes_direct();
    loop {
        // Nothing to send (a cheap check that never misses a packet): the call that would
        // find nothing (both halves of the transport, and a ring reservation) is skipped.
        if !t.has_pending_transmit() {
            break;
        }
        if direct && tx.is_empty() {
            let Some(mut lane) = engine.direct_lane(peer, attr.dest_qp_num) else {
                direct = false;
                t.set_lossless_path(false, now);
                continue;
            };
            // A same-host ring loses nothing: a late ACK is a peer descheduled for a moment,
            // and tail-loss probes only resent what it had (a go-back-N of the window when
            // the probe's duplicate ACK came first). Measured, 8-byte SENDs over a lane, 2
            // cores: one run in eight lost a third of its rate that way (927 probes, 6,921
            // packets resent).
            t.set_lossless_path(true, now);
            t.set_hold_acks(hold && t.held_ack_is_one_sided());
            let room = t.segment() as usize + 128;
            // The payload copies of the run are made together (spread over the copy
            // engines when large) before the ring is published.
            env.start_deferring();
            env.defer_reads = env.defer.is_some();
            // Up to 64 packets, then the lane goes back for others (and this QP's run
            // goes on with another).
            let mut idle = false;
            let mut n = 0;
            let mut unpublished = 0;
            while n < 64 {
                let Some(buf) = lane.reserve(room) else {
                    // A full ring: the receiver is behind. An RC QP with packets in flight
                    // waits a moment for room (the receiver, running, takes a packet in a
                    // few µs), then stops: their ACKs bring it back as the receiver drains
                    // the ring. (The batch would wait for room, then send the rest on the
                    // wire, where it overtakes what the ring holds: sequence NAKs and
                    // go-back-N, over and over once the receiver falls behind.) Otherwise
                    // (UC, which has no ACKs, or a ring filled by other QPs) the rest goes
                    // through the batch.
                    if qp.qp_type == softrdma_proto::QpType::Rc && t.awaiting_ack() {
                        // (Waiting publishes what was committed: its copies first.)
                        env.make_deferred();
                        unpublished = 0;
                        if lane.wait_for_room(room, FULL_RING_WAIT) {
                            continue;
                        }
                        idle = true;
                    } else {
                        // (The rest may take the wire.)
                        direct = false;
                        t.set_lossless_path(false, now);
                    }
                    break;
                };
                n += 1;
                env.mark_build();
                let Some(out) = t.poll_transmit(now, buf, &mut env) else {
                    idle = true;
                    env.abandon_build();
                    break;
                };
                // (An RC/UC packet never names a UD destination.)
                if out.len <= room && out.ud_dest.is_none() {
                    lane.commit(out.len);
                    if !t.has_pending_transmit() {
                        idle = true;
                        break;
                    }
                    unpublished += out.len;
                    // (A sleeping receiver is woken once, at the end of the run: a wake-up
                    // is a system call, and a thread woken takes a while to run. Its run's
                    // copies are then made together, shared with the copy engines.)
                    if unpublished >= PUBLISH_BYTES && !lane.receiver_sleeps() {
                        env.make_deferred();
                        lane.publish();
                        unpublished = 0;
                    }
                } else {
                    // Not sent: its room is reserved again for the next packet.
                    env.abandon_build();
                }
            }
            env.stop_deferring();
            env.defer_reads = false;
            drop(lane);
            if idle {
                break;
            }
            continue;
        }
        if tx.is_full() {
            engine.send(tx);
        }
        let room = t.segment() as usize + 128;
        // (Through the batch, after a lane run that stopped: the ACK is held again.)
        t.set_hold_acks(hold);
        // Request payloads of RC and UC packets that go on the wire stay in the program's
        // memory until the packet goes: the ICRC is computed over that memory and the kernel
        // copies it from there (one copy of the payload less). Asked once per drive, and only
        // with a request to send (the answer may take the lanes' lock; an ACK needs none).
        if gather.is_none() && t.unsent_requests() > 0 {
            gather = Some(
                matches!(
                    qp.qp_type,
                    softrdma_proto::QpType::Rc | softrdma_proto::QpType::Uc
                ) && engine.may_gather(peer, attr.dest_qp_num),
            );
        }
        let slot = tx.slot_of(room);
        env.gather = (gather == Some(true))
            .then(|| (slot.as_ptr() as usize, slot.as_ptr() as usize + slot.len()));
        env.gaps.clear();
        let Some(out) = t.poll_transmit(now, slot, &mut env) else {
            break;
        };
        let dst = match out.ud_dest {
            Some(h) => match ud_dests.remove(&h) {
                Some(ah) => ah.attr.grh.dgid.to_ip(),
                None => continue,
            },
            None => peer,
        };
        if out.len < 4 || out.len > room.max(PKT_BUF) {
            continue;
        }
        tx.commit_gapped(out.len, src, dst, &mut env.gaps);
    }
    env.gather = None;
    env.gaps.clear();
    let srq_limit_hit = env.srq_limit_hit;
    drop(env);
    if hold {
        t.set_hold_acks(false);
        if t.has_held_ack() {
            engine.note_held_ack(qp.qp_num);
        }
    }
    // The packets go out before the completions become visible: an application that reacts
    // to a completion (say, disconnects) cannot overtake the ACK of what it received (a
    // held ACK goes before anything else this QP sends, and before the QP leaves RTS).
    if t.has_pending_completion() {
        engine.send(tx);
    }
    // (The completions taken, and whether they were one successful RDMA WRITE.)
    let mut completions = 0u32;
    let mut write_done = false;
    while let Some(c) = t.poll_completion() {
        completions += 1;
        write_done = completions == 1
            && c.opcode == softrdma_proto::transport::WcOpcode::RdmaWrite
            && c.status == softrdma_proto::transport::WcStatus::Success;
        let wc = to_wc(&c, qp.qp_num, qp.qp_type == softrdma_proto::QpType::Ud);
        let cq = if c.is_recv { &qp.recv_cq } else { &qp.send_cq };
        cq.arc().push(wc, c.solicited);
    }
    // A lone RDMA WRITE of a polling program completed (the only completion of this drive,
    // with nothing else outstanding) and nothing came from the peer since it was sent: the
    // program may now spin on its memory for the peer's answer, calling nothing, while the
    // progress thread leaves the device to its polls. A softrdma peer sends its answer ahead
    // of the ACK, so the answer is taken here already; a peer that acknowledges at once (a
    // NIC, the kernel's rxe) sends it later, and the progress thread must watch for it
    // (`Provider::watch_for_spinner`). Not for a peer reached by a same-host lane, always a
    // softrdma QP: there the progress thread would poll the lanes on the core the program
    // spins on. Not when more than 8 packets went since the previous completion (the WRITE,
    // ACKs, a resend): that is a stream's signaled WRITE, one completion for many
    // (ib_write_bw -s 8 over the wire lost half its rate to the progress thread's wake-ups).
    // Whether or not ACKs are held: with `SOFTRDMA_ACK_HOLD_US=0` on both sides, nothing
    // watched and `ib_write_lat` over the wire waited for the hand-off at every turn (2 cores:
    // t_typical 861 us, 53 with the watch).
    let sent_since = if completions > 0 {
        let tx = t.stats().tx_packets;
        let n = tx.wrapping_sub(*tx_at_completion);
        *tx_at_completion = tx;
        n
    } else {
        u64::MAX
    };
    if write_done
        && sent_since <= 8
        && receiving_for_poller()
        && qp.qp_type == softrdma_proto::QpType::Rc
        && !t.received_since_sent()
        && t.sent_requests() == 0
        && t.unsent_requests() == 0
        && !engine.lane_is_up(peer, attr.dest_qp_num)
    {
        engine.watch_for_spinner();
    }
    while let Some(e) = t.poll_event() {
        events.push(match e {
            // The first packet of the connection: "communication established" is the event
            // of a QP that receives while still in RTR (the passive side of a connection
            // before the RTU). A QP already in RTS gets no event.
            QpEvent::CommEst if attr.qp_state != softrdma_proto::QpState::Rtr => continue,
            QpEvent::CommEst => EventType::CommEst,
            QpEvent::Fatal => EventType::QpFatal,
            QpEvent::ReqErr => EventType::QpReqErr,
            QpEvent::AccessErr => EventType::QpAccessErr,
            QpEvent::SqDrained => EventType::SqDrained,
        });
    }
    if t.is_error() && attr.qp_state != softrdma_proto::QpState::Err {
        attr.qp_state = softrdma_proto::QpState::Err;
        attr.cur_qp_state = softrdma_proto::QpState::Err;
        // The transport flushed the send queue; flush our receive queue too (packets kept
        // for it are dropped, as the transport drops what comes now), and the requests sent
        // as records or waiting behind them.
        records::flush(qp, records);
        parked.clear();
        for w in rq.drain(..) {
            qp.recv_cq.arc().push(
                WorkCompletion {
                    wr_id: w.wr_id,
                    status: crate::verbs::cq::WcStatus::WrFlushErr,
                    opcode: crate::verbs::cq::WcOpcode::Recv,
                    qp_num: qp.qp_num,
                    ..Default::default()
                },
                false,
            );
        }
    }
    // The engine's timer table (a lock and a map update) is told only of a deadline earlier
    // than the one it holds for this QP, or once that one has passed: a later deadline
    // (nearly every packet moves the retransmit or probe deadline on) waits until the one
    // held comes, when the QP finds nothing due and hands over its real deadline. A timer
    // early is harmless (every deadline is checked against `now`); one late would not be.
    let want = match (t.poll_timeout(), records.deadline()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let keep = match *timer_at {
        Some(held) => held > now && want.is_none_or(|w| held <= w),
        None => want.is_none(),
    };
    if !keep {
        engine.set_timer(qp.qp_num, want);
        *timer_at = want;
    }
    if srq_limit_hit {
        raise_srq_limit(qp);
    }
    if st.sq_drained() {
        events.push(EventType::SqDrained);
    }
    events
}

impl QpPort for QpInner {
    fn receive(
        self: Arc<Self>,
        engine: &dyn Provider,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Delivery {
        let qp = &self;
        let st = qp.lock();
        if st.transport.is_none() {
            return Delivery::NotReady;
        }
        match via {
            Via::Unicast => {
                if matches!(
                    qp.qp_type,
                    softrdma_proto::QpType::Rc | softrdma_proto::QpType::Uc
                ) && st.attr.ah_attr.grh.dgid.to_ip() != src.ip()
                {
                    return Delivery::WrongSource;
                }
            }
            Via::Group(gid) => {
                if !st.mcast.contains(&gid) {
                    return Delivery::NotReady;
                }
            }
        }
        if pkts.first().is_some_and(|p| p.first() == Some(&WR_RECORD)) {
            // (A run from a lane is records only, or packets only.)
            receive_records(engine, qp, st, pkts, tx);
        } else {
            feed(engine, qp, st, pkts, src, dst, now, tx);
        }
        Delivery::Delivered
    }

    fn attach_pair(
        self: Arc<Self>,
        _engine: &dyn Provider,
        src: SocketAddr,
        src_qpn: u32,
        p: Arc<crate::provider::PairRx>,
    ) -> bool {
        if self.qp_type != softrdma_proto::QpType::Rc {
            return false;
        }
        let (engine, old) = {
            let mut st = self.lock();
            let connected = matches!(
                st.attr.qp_state,
                softrdma_proto::QpState::Rtr
                    | softrdma_proto::QpState::Rts
                    | softrdma_proto::QpState::Sqd
            ) && st.attr.dest_qp_num == src_qpn
                && st.attr.ah_attr.grh.dgid.to_ip() == src.ip();
            let Some(engine) = st.engine.clone().filter(|_| connected) else {
                return false;
            };
            (engine, st.pair_in.replace(p.clone()))
        };
        if let Some(old) = old {
            old.close();
        }
        // (The CQs' lists are taken with no QP lock held: a poll holds its CQ's list while it
        // takes records, which locks the QP.)
        let recv = self.recv_cq.arc();
        let port: std::sync::Weak<dyn QpPort> = Arc::downgrade(&self) as std::sync::Weak<QpInner>;
        recv.add_pair(&engine, &p, port.clone());
        let send = self.send_cq.arc();
        if !Arc::ptr_eq(recv, send) {
            send.add_pair(&engine, &p, port);
        }
        true
    }

    fn on_timeout(self: Arc<Self>, engine: &dyn Provider, now: Instant, tx: &mut TxBatch) {
        let qp = &self;
        let events = {
            let mut st = qp.lock();
            records::on_timer(engine, qp, &mut st, now);
            {
                let QpState_ {
                    transport, rq, mrs, ..
                } = &mut *st;
                let mut env = QpEnv::of(qp, rq, mrs);
                if let Some(t) = transport.as_mut() {
                    t.handle_timeout(now, &mut env);
                }
                if env.srq_limit_hit {
                    raise_srq_limit(qp);
                }
            }
            let ev = drive(engine, qp, &mut st, now, tx);
            send_in_order(engine, tx);
            ev
        };
        for e in events {
            qp.raise(e);
        }
    }

    fn release_held_ack(self: Arc<Self>) -> bool {
        QpInner::release_held_ack(&self)
    }
}

/// Hands a run of work-request records to QP `qp` (whose lock `st` is, checked for a
/// transport and the source) ([`records::receive`]), drives the QP when
/// requests went to its transport, releases the lock and raises the resulting events.
fn receive_records(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    mut st: std::sync::MutexGuard<'_, QpState_>,
    recs: &[&[u8]],
    tx: &mut TxBatch,
) {
    let got = records::receive(engine, qp, &mut st, recs);
    let events = if got.drive {
        // (The time handed with records is not read: see `provider::rx`.)
        let ev = drive(engine, qp, &mut st, Instant::now(), tx);
        send_in_order(engine, tx);
        ev
    } else if st.sq_drained() {
        // (The answer to the last record of a draining send queue.)
        vec![EventType::SqDrained]
    } else {
        Vec::new()
    };
    drop(st);
    for e in events {
        qp.raise(e);
    }
    if got.srq_limit_hit {
        raise_srq_limit(qp);
    }
}

/// Hands packets from `src` to `dst` to the transport of `qp` (whose lock `st` is, checked
/// for a transport), drives the QP, releases the lock and raises the resulting events.
#[allow(clippy::too_many_arguments)]
fn feed(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    mut st: std::sync::MutexGuard<'_, QpState_>,
    pkts: &[&[u8]],
    src: SocketAddr,
    dst: IpAddr,
    now: Instant,
    tx: &mut TxBatch,
) {
    let srq_limit_hit;
    let events = {
        {
            let QpState_ {
                transport,
                rq,
                mrs,
                parked,
                ..
            } = &mut *st;
            let mut env = QpEnv::of(qp, rq, mrs);
            if let Some(t) = transport.as_mut() {
                // Only a UD receive gets the GRH (its first 40 bytes): built for UD only.
                let ud = qp.qp_type == softrdma_proto::QpType::Ud;
                // A UC or UD QP with its own receive queue keeps what needs a receive while
                // the queue is empty, and what comes behind it, until receives are posted
                // (`verbs::qp::parked`).
                let keeps = matches!(
                    qp.qp_type,
                    softrdma_proto::QpType::Uc | softrdma_proto::QpType::Ud
                ) && qp.srq.is_none();
                let mut meta = RxMeta { grh: [0; 40] };
                // The payload copies of the run are made together, spread over the copy
                // engines when large, before anything else sees the memory (`drive`'s
                // ACKs and completions below). Not for a run of short packets (an answer
                // and an ACK), whose copies are made on the spot anyway.
                if pkts.len() > 1 && pkts.iter().any(|p| p.len() >= DEFER_MIN) {
                    env.start_deferring();
                }
                for pkt in pkts {
                    if keeps
                        && !t.is_error()
                        && (!parked.is_empty() || (env.rq.is_empty() && needs_receive(pkt)))
                        && parked.push(pkt, src.ip(), dst)
                    {
                        continue;
                    }
                    if ud {
                        meta.grh = grh_for(src.ip(), dst, pkt.len());
                    }
                    let at = pkt.as_ptr() as usize;
                    env.packet = (at, at + pkt.len());
                    t.handle_packet(now, pkt, &meta, &mut env);
                }
                env.stop_deferring();
            }
            srq_limit_hit = env.srq_limit_hit;
        }
        let ev = drive(engine, qp, &mut st, now, tx);
        send_in_order(engine, tx);
        drop(st);
        ev
    };
    if srq_limit_hit {
        raise_srq_limit(qp);
    }
    for e in events {
        qp.raise(e);
    }
}

/// Sends `tx` now if it holds RC or UC packets (see [`TxBatch::has_ordered`]): called by a
/// thread that drove a QP on behalf of the device (a packet or a timer), before it lets go
/// of the QP, so that the QP's packets leave in the order they were built.
#[inline]
fn send_in_order(engine: &dyn Provider, tx: &mut TxBatch) {
    if tx.has_ordered() {
        engine.send(tx);
    }
}

/// Hands the packets `qp` keeps (`verbs::qp::parked`) to its transport while its receive
/// queue has requests for them (or they need none), in order; drives the QP if any went.
/// Called with the QP's lock `st` held, after receives were posted; returns the events to
/// raise once the lock is released.
pub(crate) fn take_parked(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
) -> Vec<EventType> {
    let now = Instant::now();
    let mut taken = 0;
    {
        let QpState_ {
            transport,
            rq,
            mrs,
            parked,
            ..
        } = &mut *st;
        let Some(t) = transport.as_mut() else {
            return Vec::new();
        };
        let ud = qp.qp_type == softrdma_proto::QpType::Ud;
        let mut env = QpEnv::of(qp, rq, mrs);
        let mut meta = RxMeta { grh: [0; 40] };
        while let Some(p) = parked.front() {
            if env.rq.is_empty() && needs_receive(&p.data) {
                break;
            }
            let Some(p) = parked.pop() else { break };
            if ud {
                meta.grh = grh_for(p.src, p.dst, p.data.len());
            }
            let at = p.data.as_ptr() as usize;
            env.packet = (at, at + p.data.len());
            t.handle_packet(now, &p.data, &meta, &mut env);
            taken += 1;
        }
    }
    if taken == 0 {
        return Vec::new();
    }
    with_tx(|tx| {
        let ev = drive(engine, qp, st, now, tx);
        engine.send(tx);
        ev
    })
}

/// Sends the positive ACK the transport of `qp` holds back, if it holds one, and the sends a
/// UC or UD QP holds for a batch (`post_send`), with the QP's lock `st` held; returns the
/// events to raise once the lock is released.
pub(crate) fn send_held_ack(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
) -> (bool, Vec<EventType>) {
    let unreliable = matches!(
        qp.qp_type,
        softrdma_proto::QpType::Uc | softrdma_proto::QpType::Ud
    );
    if !st.records.owed.is_empty() {
        records::write_answers(engine, qp.qp_num, st);
    }
    if !st
        .transport
        .as_ref()
        .is_some_and(|t| t.has_held_ack() || (unreliable && t.unsent_requests() > 0))
    {
        return (false, Vec::new());
    }
    (true, drive_and_send(engine, qp, st))
}

/// Drives the QP (lock `st` held) from the calling thread and sends what it produced now;
/// returns the events to raise once the lock is released.
pub(crate) fn drive_and_send(
    engine: &dyn Provider,
    qp: &Arc<QpInner>,
    st: &mut QpState_,
) -> Vec<EventType> {
    with_tx(|tx| {
        let ev = drive(engine, qp, st, Instant::now(), tx);
        engine.send(tx);
        ev
    })
}

impl QpInner {
    /// Sends the positive ACK this QP's transport holds back, if any (see [`drive`]), and
    /// the sends it holds for a batch; returns whether it held any.
    pub(crate) fn release_held_ack(self: &Arc<Self>) -> bool {
        let (held, events) = {
            let mut st = self.lock();
            match st.engine.clone() {
                Some(e) => send_held_ack(&*e, self, &mut st),
                None => (false, Vec::new()),
            }
        };
        for e in events {
            self.raise(e);
        }
        held
    }
}

/// Raises `IBV_EVENT_SRQ_LIMIT_REACHED` for the QP's SRQ (the limit disarmed itself).
fn raise_srq_limit(qp: &Arc<QpInner>) {
    if let Some(srq) = &qp.srq {
        qp.pd.ctx.async_events.raise(
            EventType::SrqLimitReached,
            AsyncElement::Srq {
                srq_context: srq.srq_context,
            },
            Some(srq.arc().clone() as Arc<dyn EventTarget>),
        );
    }
}
