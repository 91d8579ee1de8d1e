//! The data path of one QP, between its sans-IO transport and the provider: the transport's
//! view of memory and receive queue ([`QpEnv`]); [`drive`], which runs the transport and hands
//! its packets to the provider's transmit batch, its completions to the CQs and its events
//! to the QP; and the QP's face to the provider ([`QpPort`]: packets, timeouts, held ACKs).

use crate::provider::Provider;
use crate::provider::{holding_acks, with_tx, Delivery, QpPort, TxBatch, Via, PKT_BUF};
use crate::verbs::copy::Batch;
use crate::verbs::cq::WorkCompletion;
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::mr::{AccessError as MrAccessError, AccessFlags, KeyKind};
use crate::verbs::pd::PdInner;
use crate::verbs::qp::parked::needs_receive;
use crate::verbs::qp::{QpInner, QpState_};
use crate::verbs::requests::RecvWqe;
use crate::verbs::resources::Resources;
use crate::verbs::srq::SrqInner;
use softrdma_proto::device::grh_for;
use softrdma_proto::transport::{
    AccessError, AtomicOp, Completion, Env, MwBind, QpEvent, RecvRequest, RxMeta, Sge, WcStatus,
};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The memory and receive queue of one QP, as its transport sees them.
pub(crate) struct QpEnv<'a> {
    pub(crate) res: &'a Resources,
    pub(crate) pd: &'a Arc<PdInner>,
    pub(crate) rq: &'a mut VecDeque<RecvWqe>,
    pub(crate) srq: Option<&'a SrqInner>,
    /// SRQ limit event to raise once the QP lock is released.
    pub(crate) srq_limit_hit: bool,
    /// The QP's cache of memory regions.
    pub(crate) mrs: &'a mut crate::verbs::mr::MrCache,
    /// The QP's `uid` (type 2 memory windows are bound to it).
    pub(crate) qp_uid: u64,
    /// Payload copies deferred to be made together ([`crate::verbs::copy`]), while a run of
    /// packets is received or built into a same-host lane's ring.
    pub(crate) defer: Option<Batch>,
    /// Whether reads of memory are deferred (building packets into a lane's ring) rather
    /// than writes (receiving).
    pub(crate) defer_reads: bool,
    /// The packet being received (its address range): only copies from its bytes are
    /// deferred (the transport also writes bytes of its own, an atomic's original value or
    /// a GRH, which do not outlive the call).
    pub(crate) packet: (usize, usize),
    /// The number of deferred copies before the packet being built ([`QpEnv::mark_build`]).
    build_mark: usize,
}

thread_local! {
    /// The deferred copies' batch of this thread, kept between runs for its room.
    static BATCH: std::cell::Cell<Batch> = std::cell::Cell::new(Batch::default());
}

impl QpEnv<'_> {
    /// Starts deferring payload copies (when copy engines are on).
    fn start_deferring(&mut self) {
        if self.defer.is_none() && crate::verbs::copy::deferring() {
            self.defer = Some(BATCH.take());
        }
    }

    /// Makes the deferred writes (receiving; all done on return), before an access that may
    /// read what they write; deferring goes on. (Deferred reads into a ring's room need no
    /// such care: nothing reads the room before publication.)
    #[inline]
    fn run_deferred(&mut self) {
        if let Some(b) = self.defer.as_mut().filter(|_| !self.defer_reads) {
            b.run();
        }
    }

    /// Makes every deferred copy now (before a ring's room is published); deferring goes on.
    #[inline]
    fn make_deferred(&mut self) {
        if let Some(b) = self.defer.as_mut() {
            b.run();
        }
        self.build_mark = 0;
    }

    /// Makes the deferred copies and stops deferring.
    fn stop_deferring(&mut self) {
        if let Some(mut b) = self.defer.take() {
            b.run();
            BATCH.set(b);
        }
    }

    /// A packet is being built from here on: the copies it defers come after this mark.
    #[inline]
    fn mark_build(&mut self) {
        self.build_mark = self.defer.as_ref().map_or(0, Batch::len);
    }

    /// The packet being built is abandoned (an access refused midway, or not sent): forgets
    /// the copies it deferred into its room, which the next packet takes.
    #[inline]
    fn abandon_build(&mut self) {
        if let Some(b) = self.defer.as_mut().filter(|_| self.defer_reads) {
            b.truncate(self.build_mark);
        }
    }
}

impl Drop for QpEnv<'_> {
    #[inline]
    fn drop(&mut self) {
        // (Nearly always nothing deferred: the check stays inline.)
        if self.defer.is_some() {
            if std::thread::panicking() {
                // (The ring's room may be published or gone by now: nothing is copied late.)
                if let Some(b) = self.defer.as_mut() {
                    b.forget();
                }
            }
            self.stop_deferring();
        }
    }
}

fn map_err(e: MrAccessError) -> AccessError {
    match e {
        MrAccessError::InvalidKey | MrAccessError::WrongPd => AccessError::InvalidKey,
        MrAccessError::OutOfBounds => AccessError::OutOfBounds,
        MrAccessError::AccessDenied => AccessError::AccessDenied,
        MrAccessError::Misaligned => AccessError::Misaligned,
    }
}

impl<'a> QpEnv<'a> {
    /// The environment of `qp`'s transport: its receive queue `rq` and memory-region cache
    /// `mrs` (both under the QP's lock), its PD's memory and its SRQ.
    pub(crate) fn of(
        qp: &'a QpInner,
        rq: &'a mut VecDeque<RecvWqe>,
        mrs: &'a mut crate::verbs::mr::MrCache,
    ) -> QpEnv<'a> {
        QpEnv {
            res: &qp.pd.shared().resources,
            pd: qp.pd.arc(),
            rq,
            srq: qp.srq.as_deref(),
            srq_limit_hit: false,
            mrs,
            qp_uid: qp.uid,
            defer: None,
            defer_reads: false,
            packet: (0, 0),
            build_mark: 0,
        }
    }

    pub(super) fn lease(
        &mut self,
        key: u32,
        kind: KeyKind,
        va: u64,
        len: usize,
        need: AccessFlags,
        atomic: bool,
    ) -> std::result::Result<crate::verbs::mr::MrLease, AccessError> {
        let r = self
            .res
            .check_access_cached(self.mrs, key, kind, self.pd, va, len as u64, need, atomic);
        match r {
            // Not a region's rkey: perhaps a memory window's (never cached: a window can be
            // rebound or invalidated under the same region).
            Err(MrAccessError::InvalidKey) if kind == KeyKind::Remote => self
                .res
                .check_window(key, self.pd, self.qp_uid, va, len as u64, need, atomic)
                .map_err(map_err),
            r => r.map_err(map_err),
        }
    }
}

/// Copies shorter than this are made on the spot even while deferring: handing a few bytes
/// to a batch costs more than copying them. (A short read into a packet's room needs no
/// order with the deferred reads; a short write is made at once only while no write waits
/// before it, which might cover the same bytes.)
const DEFER_MIN: usize = 256;

impl QpEnv<'_> {
    /// Copies the leased memory into `dst` (bytes of a packet being built), or defers the
    /// copy ([`QpEnv::defer`]).
    #[inline]
    fn read_into(&mut self, l: crate::verbs::mr::MrLease, dst: &mut [u8]) {
        match &mut self.defer {
            // SAFETY: `dst` is in the room of a lane's ring reserved for the packet being
            // built, which stays reserved (unpublished, untouched by others) until the batch
            // runs, before publication; `drive` forgets the copies of a packet it drops.
            Some(b) if self.defer_reads && dst.len() >= DEFER_MIN => unsafe {
                b.push(dst.as_mut_ptr(), l.as_ptr(), dst.len(), l)
            },
            _ => {
                // (Writes deferred before are made first: this may read what they write.)
                self.run_deferred();
                l.read(0, dst);
            }
        }
    }

    /// Copies `src` (bytes of an arriving packet) into the leased memory, or defers the copy
    /// ([`QpEnv::defer`]).
    #[inline]
    fn write_from(&mut self, l: crate::verbs::mr::MrLease, src: &[u8]) {
        match &mut self.defer {
            // SAFETY: `src` is a packet of the run being fed, which stays valid until `feed`
            // returns (it runs the batch first); the leased range stays registered with the
            // lease, and other accesses of this QP to memory run the batch first.
            Some(b)
                if !self.defer_reads
                    && (src.len() >= DEFER_MIN || b.len() > 0)
                    && (src.as_ptr() as usize) >= self.packet.0
                    && (src.as_ptr() as usize) + src.len() <= self.packet.1 =>
            unsafe { b.push(l.as_ptr(), src.as_ptr(), src.len(), l) },
            _ => {
                self.run_deferred();
                l.write(0, src);
            }
        }
    }
}

impl Env for QpEnv<'_> {
    fn read_local(
        &mut self,
        sge: &Sge,
        offset: u32,
        dst: &mut [u8],
    ) -> std::result::Result<(), AccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let va = sge.addr.wrapping_add(u64::from(offset));
        let l = self
            .lease(
                sge.lkey,
                KeyKind::Local,
                va,
                dst.len(),
                AccessFlags::empty(),
                false,
            )
            .inspect_err(|_| self.abandon_build())?;
        self.read_into(l, dst);
        Ok(())
    }

    fn write_local(
        &mut self,
        sge: &Sge,
        offset: u32,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let va = sge.addr.wrapping_add(u64::from(offset));
        let l = self.lease(
            sge.lkey,
            KeyKind::Local,
            va,
            src.len(),
            AccessFlags::LOCAL_WRITE,
            false,
        )?;
        self.write_from(l, src);
        Ok(())
    }

    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> std::result::Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        let need = if write {
            AccessFlags::REMOTE_WRITE
        } else {
            AccessFlags::REMOTE_READ
        };
        self.lease(rkey, KeyKind::Remote, va, len as usize, need, false)
            .map(drop)
    }

    fn write_remote(
        &mut self,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let l = self.lease(
            rkey,
            KeyKind::Remote,
            va,
            src.len(),
            AccessFlags::REMOTE_WRITE,
            false,
        )?;
        self.write_from(l, src);
        Ok(())
    }

    fn read_remote(
        &mut self,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), AccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let l = self
            .lease(
                rkey,
                KeyKind::Remote,
                va,
                dst.len(),
                AccessFlags::REMOTE_READ,
                false,
            )
            .inspect_err(|_| self.abandon_build())?;
        self.read_into(l, dst);
        Ok(())
    }

    fn atomic_remote(
        &mut self,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> std::result::Result<u64, AccessError> {
        self.run_deferred();
        let l = self.lease(
            rkey,
            KeyKind::Remote,
            va,
            8,
            AccessFlags::REMOTE_ATOMIC,
            true,
        )?;
        let w = l.atomic_word();
        Ok(match op {
            AtomicOp::CmpAndSwp { compare, swap } => {
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAndAdd { add } => w.fetch_add(add, Ordering::SeqCst),
        })
    }

    fn bind_mw(&mut self, bind: &MwBind) -> std::result::Result<(), WcStatus> {
        self.run_deferred();
        self.res.execute_bind(bind, self.pd, self.qp_uid)
    }

    fn local_invalidate(&mut self, rkey: u32) -> std::result::Result<(), WcStatus> {
        self.run_deferred();
        self.res
            .invalidate(rkey, self.pd, None)
            .map_err(|()| WcStatus::LocQpOpErr)
    }

    fn remote_invalidate(&mut self, rkey: u32) -> std::result::Result<(), AccessError> {
        self.run_deferred();
        self.res
            .invalidate(rkey, self.pd, Some(self.qp_uid))
            .map_err(|()| AccessError::InvalidKey)
    }

    fn take_recv(&mut self) -> Option<RecvRequest> {
        // The queued request is already in the transport's form: a move, no allocation.
        match self.srq {
            Some(srq) => {
                let mut st = srq.state.lock().unwrap_or_else(|p| p.into_inner());
                let w = st.queue.pop_front();
                if w.is_some()
                    && st.attr.srq_limit != 0
                    && (st.queue.len() as u32) < st.attr.srq_limit
                {
                    st.attr.srq_limit = 0;
                    self.srq_limit_hit = true;
                }
                w
            }
            None => self.rq.pop_front(),
        }
    }

    fn recv_available(&self) -> Option<u32> {
        match self.srq {
            Some(_) => None,
            None => Some(self.rq.len().min(u32::MAX as usize) as u32),
        }
    }
}

pub(crate) fn to_wc(c: &Completion, qp_num: u32, ud: bool) -> WorkCompletion {
    use crate::verbs::cq::WcFlags;
    let mut flags = WcFlags::empty();
    if c.imm_data.is_some() {
        flags |= WcFlags::WITH_IMM;
    }
    if c.invalidated_rkey.is_some() {
        flags |= WcFlags::WITH_INV;
    }
    if ud && c.is_recv && c.status == softrdma_proto::transport::WcStatus::Success {
        flags |= WcFlags::GRH;
    }
    WorkCompletion {
        wr_id: c.wr_id,
        status: c.status,
        opcode: c.opcode,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_data: c.imm_data.unwrap_or(0),
        invalidated_rkey: c.invalidated_rkey.unwrap_or(0),
        qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        ..Default::default()
    }
}

/// How long an RC QP that finds its same-host lane's ring full waits for room before it
/// leaves the rest to the ACKs of what the ring holds (see [`drive`]).
const FULL_RING_WAIT: Duration = Duration::from_micros(50);

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
    // ACK goes when the thread next polls an empty CQ, or when the progress thread next
    // wakes (`Engine::flush_held_acks`). A trade-off, measured over the wire (interleaved,
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
    // (Each path below sets it on the transport before it transmits.)
    let hold = holding_acks();
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
        let Some(out) = t.poll_transmit(now, tx.slot_of(room), &mut env) else {
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
        tx.commit(out.len, src, dst);
    }
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
    while let Some(c) = t.poll_completion() {
        let wc = to_wc(&c, qp.qp_num, qp.qp_type == softrdma_proto::QpType::Ud);
        let cq = if c.is_recv { &qp.recv_cq } else { &qp.send_cq };
        cq.arc().push(wc, c.solicited);
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
        // for it are dropped, as the transport drops what comes now).
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
    let want = t.poll_timeout();
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
        feed(engine, qp, st, pkts, src, dst, now, tx);
        Delivery::Delivered
    }

    fn on_timeout(self: Arc<Self>, engine: &dyn Provider, now: Instant, tx: &mut TxBatch) {
        let qp = &self;
        let events = {
            let mut st = qp.lock();
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
            drive(engine, qp, &mut st, now, tx)
        };
        for e in events {
            qp.raise(e);
        }
    }

    fn release_held_ack(self: Arc<Self>) {
        QpInner::release_held_ack(&self);
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
                // ACKs and completions below).
                if pkts.len() > 1 {
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
) -> Vec<EventType> {
    let unreliable = matches!(
        qp.qp_type,
        softrdma_proto::QpType::Uc | softrdma_proto::QpType::Ud
    );
    if !st
        .transport
        .as_ref()
        .is_some_and(|t| t.has_held_ack() || (unreliable && t.unsent_requests() > 0))
    {
        return Vec::new();
    }
    drive_and_send(engine, qp, st)
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
    /// the sends it holds for a batch.
    pub(crate) fn release_held_ack(self: &Arc<Self>) {
        let events = {
            let mut st = self.lock();
            match st.engine.clone() {
                Some(e) => send_held_ack(&*e, self, &mut st),
                None => Vec::new(),
            }
        };
        for e in events {
            self.raise(e);
        }
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
