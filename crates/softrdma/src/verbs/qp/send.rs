//! `ibv_post_send` and `ibv_bind_mw`: the checks of a send work request, its transport
//! form, and the doorbell that hands posted requests to the data path.

use super::{Qp, QpState_};
use crate::error::{Error, Result};
use crate::verbs::ah::AhInner;
use crate::verbs::datapath::drive_and_send;
use crate::verbs::mr::{AccessFlags, KeyKind, MrCache};
use crate::verbs::mw::{inc_rkey, BindMwWr, Mw, MwBind, MwType};
use crate::verbs::records;
use crate::verbs::requests::SendWr;
use crate::verbs::resources::MULTICAST_QPN;
use crate::verbs::wr::{check_sges, PostError, SendFlags, Sge, WrOpcode};
use softrdma_proto::transport as tp;
use softrdma_proto::{QpState, QpType};
use std::sync::Arc;

/// Requests posted in one call above which `post_send` transmits at once even while packets
/// are in flight.
const DOORBELL_BATCH: usize = 16;

/// Requests left unsent (while packets are in flight) at whose every multiple `post_send`
/// transmits at once: a full UDP GSO super-datagram of single-packet messages.
const DOORBELL_FLUSH: usize = 64;

/// Sends a UC or UD QP holds back for a batch (see `post_send_impl`) at most: the next post
/// transmits them all.
const UNRELIABLE_BATCH: usize = 64;

/// The longest UC or UD message held for a batch. Batched, larger messages outran a
/// receiver that the scheduler stopped for a few ms on 2 cores and overflowed its socket
/// (`ib_send_bw -c UD` over the wire, 8 bytes / 256 / 1 KiB / 2 KiB: messages lost in 0 / 0
/// / 4 / 7 runs of 10), where one system call a message paced the sender below that.
const UNRELIABLE_BATCH_MAX_LEN: u64 = 256;

impl Qp {
    /// Posts send work requests (`ibv_post_send`), in order, stopping at the first that
    /// cannot be posted. In ERR, requests are accepted and completed at once with
    /// `WR_FLUSH_ERR`.
    ///
    /// Fails, naming the index of that request, with `EINVAL` when the QP is in RESET, INIT
    /// or RTR, the opcode is not one the QP type allows (or is not supported: TSO), a
    /// BIND_MW request has no `bind_mw` (or no region but an address or length), there are
    /// more than `max_send_sge` entries, the message exceeds 2^31
    /// bytes, inline data exceeds `max_inline_data` or is used with READ or atomics, an inline
    /// entry is not inside a memory region of the QP's PD, an atomic is not exactly one
    /// 8-byte aligned 8-byte entry, or a UD request has no address handle of the QP's PD;
    /// `ENOMEM` when the send queue is full.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.post_send_impl(wrs, false)
    }

    /// Binds a type 1 memory window (`ibv_bind_mw`): posts a bind on the send queue, carried
    /// out in order with the requests before it and completing with `IBV_WC_BIND_MW`
    /// (`MW_BIND_ERR` if the bind breaks a rule: see [`crate::Mw`]), and returns the new rkey,
    /// which is also [`crate::Mw::rkey`] from now on: the same index, the key byte plus one
    /// (`ibv_inc_rkey`). A zero length with no region unbinds the window. If the bind
    /// completes in error, the window keeps its old rkey (the program undoes the update, as
    /// with rdma-core).
    ///
    /// Fails, posting nothing, with `EINVAL` for a window that is not type 1, a bind without
    /// a region but with an address or length, ZERO_BASED access, or anything
    /// [`Qp::post_send`] refuses; `EPERM` for a region of another PD than the window.
    pub fn bind_mw(&self, mw: &Mw, bind: &MwBind<'_>) -> Result<u32> {
        let info = &bind.bind_info;
        if mw.mw_type() != MwType::Type1 {
            return Err(Error::invalid("ibv_bind_mw binds type 1 windows only"));
        }
        if info.mr.is_none() && (info.addr != 0 || info.length != 0) {
            return Err(Error::invalid(
                "a bind without a memory region must have address and length 0",
            ));
        }
        if info
            .mr
            .is_some_and(|m| !Arc::ptr_eq(m.inner.pd.arc(), mw.inner.pd.arc()))
        {
            return Err(Error::permission(
                "the memory region belongs to another PD than the window",
            ));
        }
        if info.mw_access_flags & AccessFlags::ZERO_BASED.bits() != 0 {
            return Err(Error::invalid("a type 1 window cannot be zero-based"));
        }
        let rkey = inc_rkey(mw.rkey());
        let wr = SendWr {
            wr_id: bind.wr_id,
            opcode: WrOpcode::BindMw,
            send_flags: bind.send_flags,
            bind_mw: Some(BindMwWr {
                mw,
                rkey,
                bind_info: *info,
            }),
            ..Default::default()
        };
        self.post_send(&[wr]).map_err(|e| e.error)?;
        Ok(rkey)
    }

    /// [`Qp::post_send`] with rdma-core's rule for `IBV_SEND_INLINE`: the data of an inline
    /// request is copied from the addresses of its entries whether or not they lie in a
    /// memory region (the lkey is ignored), as a C program expects of libibverbs.
    ///
    /// Fails as [`Qp::post_send`] does, except for unregistered inline entries.
    ///
    /// # Safety
    /// Each entry of every INLINE request must name `length` readable bytes at `addr`.
    pub unsafe fn post_send_raw_inline(
        &self,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), PostError> {
        self.post_send_impl(wrs, true)
    }

    fn post_send_impl(
        &self,
        wrs: &[SendWr<'_>],
        raw_inline: bool,
    ) -> std::result::Result<(), PostError> {
        let inner = &self.inner;
        let queue_full = || {
            Error::no_memory(format!(
                "the send queue is full ({} requests)",
                inner.cap.max_send_wr
            ))
        };
        let mut st = inner.lock();
        let mut result = Ok(());
        // Requests handed to the transport by this call (not those sent as records).
        let mut posted_transport = 0;
        // Whether every request posted is a short SEND, and where the last one goes (see the
        // UC/UD batching below).
        let mut only_sends = true;
        let mut last_dest = None;
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { bad_wr: i, error };
            let state = st.attr.qp_state;
            if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
                result = Err(fail(Error::invalid(format!(
                    "cannot post sends to a QP in {state:?}"
                ))));
                break;
            }
            if state == QpState::Err || st.transport.is_none() {
                // Checked all the same (a bad request fails as on a live QP), then flushed.
                let scratch = &mut tp::SendRequest::default();
                if let Err(e) = self.fill_send(wr, raw_inline, scratch, &mut st.mrs) {
                    result = Err(fail(e));
                    break;
                }
                inner
                    .send_cq
                    .arc()
                    .push(inner.flush_wc(wr.wr_id, wr.opcode.wc_opcode()), false);
                continue;
            }
            // An RC request to a QP of this host may go as a work-request record; while
            // records are outstanding, every request waits behind them (see `records`).
            if inner.qp_type == QpType::Rc {
                let holding = st.records.holding();
                let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
                let candidate = matches!(
                    wr.opcode,
                    WrOpcode::Send
                        | WrOpcode::SendWithImm
                        | WrOpcode::RdmaWrite
                        | WrOpcode::RdmaWriteWithImm
                ) && len <= u64::from(crate::verbs::qp::records::RECORD_MAX);
                // (Checked before the request is filled apart from the send queue: a stream,
                // whose transport is busy, posts in place.)
                // Only a request that waits for its answer goes as a record: one that answers
                // what came from the peer since this QP last sent (a ping-pong, an RPC), or
                // one posted, like the one before it, with nothing else outstanding (post,
                // wait for the completion, post again). A stream stays with the transport,
                // whose runs and coalesced ACKs it needs (a record held it up until its
                // acknowledgement came: 8-byte WRITE streams lost a sixth of their rate).
                let idle = !holding && st.transport.as_ref().is_some_and(records::transport_idle);
                let in_turn = std::mem::replace(&mut st.records.last_post_idle, idle);
                let answer = st.records.received
                    || in_turn
                    || st
                        .transport
                        .as_ref()
                        .is_some_and(|t| t.received_since_sent());
                let may_try = candidate
                    && idle
                    && answer
                    && st
                        .records
                        .may_try(|| st.engine.as_ref().map_or(0, |e| e.records_generation()));
                if holding || may_try {
                    if holding && st.records.outstanding() >= inner.cap.max_send_wr as usize {
                        result = Err(fail(queue_full()));
                        break;
                    }
                    let mut req = tp::SendRequest::default();
                    if let Err(e) = self.fill_send(wr, raw_inline, &mut req, &mut st.mrs) {
                        result = Err(fail(e));
                        break;
                    }
                    if candidate && records::try_send(inner, &mut st, &req, len as u32) {
                        st.records.sent(req, len as u32);
                    } else if st.records.holding() {
                        st.records.wait(req);
                    } else {
                        let t = st.transport.as_mut().expect("checked above");
                        if t.post_send(req).is_err() {
                            result = Err(fail(queue_full()));
                            break;
                        }
                        posted_transport += 1;
                    }
                    if let (WrOpcode::BindMw, Some(b)) = (wr.opcode, &wr.bind_mw) {
                        b.mw.set_posted_rkey((b.mw.inner.index << 8) | (b.rkey & 0xff));
                    }
                    continue;
                }
            }
            let QpState_ {
                transport,
                ud_dests,
                next_ud_dest,
                mrs,
                ..
            } = &mut *st;
            let t = transport.as_mut().expect("checked above");
            // The request is written straight into its slot in the send queue.
            let queued = t.post_send_with(|req| {
                let ah = self.fill_send(wr, raw_inline, req, mrs)?;
                // A UD message longer than the path MTU completes without a packet (as rxe
                // does, IBA C10-93.1.1): it needs no destination entry.
                let oversize = inner.qp_type == QpType::Ud
                    && req.length() > u64::from(inner.pd.shared().device.active_mtu().bytes());
                if let (Some(ah), false) = (ah, oversize) {
                    let h = *next_ud_dest;
                    *next_ud_dest += 1;
                    ud_dests.insert(h, ah);
                    if let Some(ud) = req.ud.as_mut() {
                        ud.dest = h;
                    }
                }
                Ok(())
            });
            match queued {
                Ok(()) => {}
                Err(tp::PostSendError::Rejected(e)) => {
                    result = Err(fail(e));
                    break;
                }
                Err(tp::PostSendError::QueueFull) => {
                    result = Err(fail(queue_full()));
                    break;
                }
            }
            if let (WrOpcode::BindMw, Some(b)) = (wr.opcode, &wr.bind_mw) {
                b.mw.set_posted_rkey((b.mw.inner.index << 8) | (b.rkey & 0xff));
            }
            only_sends &= matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm)
                && wr.sg_list.iter().map(|s| u64::from(s.length)).sum::<u64>()
                    <= UNRELIABLE_BATCH_MAX_LEN;
            last_dest = match inner.qp_type {
                QpType::Ud => wr
                    .ah
                    .map(|ah| (ah.inner.attr.grh.dgid.to_ip(), wr.remote_qpn)),
                _ => Some((st.attr.ah_attr.grh.dgid.to_ip(), st.attr.dest_qp_num)),
            };
            posted_transport += 1;
        }
        // Doorbell batching: while an RC QP waits for the ACK of packets in flight, the ACK's
        // arrival (or the retransmit timer) transmits what was queued, in one batch with it;
        // a QP with nothing in flight transmits at once. So does a QP that knows the
        // responder's receives (credits) whose queue of unsent requests has just grown past a
        // multiple of DOORBELL_FLUSH: held until the next ACK, a queue filled one post at a
        // time reached the responder only once it had run out of work, and the pipeline
        // drained at every round (8-byte SENDs, 128 deep: 1.0 M/s before, 1.35 M/s with
        // this). Without credits (before the first ACK) it waits: a burst sent blind meets
        // an empty receive queue with RNR NAKs.
        //
        // An answer goes at once, though: a post that finds nothing else unsent, at most one
        // request waiting for its ACK, and a message received since the QP last sent. A peer
        // whose ACK of the last message comes after its answer (a softrdma peer holding it
        // until its next poll did, before it sent it in the answer's batch) had each next
        // message of a ping-pong wait for that ACK: over the wire, `perf send --lat`, 8 bytes
        // one way, 5.44 -> 5.27 us (medians of ten interleaved runs). A burst posted one at a
        // time, or a stream both ways (several requests in flight), is batched as before
        // (`benches/msg_cost` over the wire: 870 ns a message either way).
        // Answers to records held for what the program answers, when that went another way.
        if !st.records.owed.is_empty() {
            if let Some(engine) = st.engine.clone() {
                records::write_answers(&*engine, inner.qp_num, &mut st);
            }
        }
        // (A request that came as a same-host record is not in the transport's count.)
        let received_record = st.records.take_received();
        // (Nothing to decide when every request went as a record.)
        let defer = posted_transport > 0
            && st.transport.as_ref().is_some_and(|t| {
                let unsent = t.unsent_requests();
                let flush = t.knows_credits()
                    && unsent / DOORBELL_FLUSH
                        != unsent.saturating_sub(posted_transport) / DOORBELL_FLUSH;
                let answer = unsent == posted_transport
                    && t.sent_requests() <= 1
                    && (t.received_since_sent() || received_record);
                t.awaiting_ack() && !answer && posted_transport < DOORBELL_BATCH && !flush
            });
        // UC and UD have no ACK to wait for, so without this each post went out alone: one
        // `sendmmsg` a message, whose system call on loopback also runs the receiver's side of
        // the network stack (`ib_send_bw -c UD -s 8` over the wire, one post at a time: 0.21 M
        // msg/s, RC 1.15 with its ACK-paced batches). Unless SOFTRDMA_UNRELIABLE_BATCH=0
        // (see `Engine::note_held_send`), SENDs of up to
        // UNRELIABLE_BATCH_MAX_LEN bytes posted one call at a time are held for the next post,
        // up to UNRELIABLE_BATCH, and go together at the program's next CQ poll (any, empty
        // or not), when it arms a CQ or waits for an event, at a CM call, when the QP changes
        // state or goes, or else within the hand-off period (0.5 ms), from the progress thread
        // (`Provider::note_held_send`). A program that sleeps on completion events (it armed
        // a CQ and has not polled since), or SOFTRDMA_POLL_HANDOFF_US=0, sends each at once.
        // Not RDMA WRITEs: a program may wait for one by spinning on memory, polling nothing. Not to a
        // peer reached by a same-host lane, where a packet costs no system call: holding only
        // adds the note and the flush (`ib_send_lat -c UD` over a lane, 8 bytes: 0.9 -> 1.4
        // us one way when held).
        let hold_unreliable = !defer
            && posted_transport > 0
            && only_sends
            && matches!(inner.qp_type, QpType::Uc | QpType::Ud)
            && last_dest.is_some_and(|(ip, qpn)| {
                st.engine.as_ref().is_some_and(|e| !e.lane_is_up(ip, qpn))
            })
            && st
                .transport
                .as_ref()
                .is_some_and(|t| !t.is_error() && t.unsent_requests() < UNRELIABLE_BATCH)
            && st
                .engine
                .as_ref()
                .is_some_and(|e| e.note_held_send(inner.qp_num));
        if posted_transport > 0 && !defer && !hold_unreliable {
            if let Some(engine) = st.engine.clone() {
                let events = drive_and_send(&*engine, inner, &mut st);
                drop(st);
                for e in events {
                    inner.raise(e);
                }
            }
        }
        result
    }

    /// Checks `wr` and writes it into `req` (a blank request, maybe the send queue's own
    /// slot); returns the address handle of a UD send. Fails, with `req` partly written,
    /// on a request rdma-core would refuse (`EINVAL`).
    fn fill_send(
        &self,
        wr: &SendWr<'_>,
        raw_inline: bool,
        req: &mut tp::SendRequest,
        mrs: &mut MrCache,
    ) -> Result<Option<Arc<AhInner>>> {
        let inner = &self.inner;
        let qp_type = inner.qp_type;
        if !wr.opcode.allowed_on(qp_type) {
            return Err(Error::invalid(format!(
                "opcode {:?} cannot be posted on a {qp_type:?} QP",
                wr.opcode
            )));
        }
        check_sges(wr.sg_list, inner.cap.max_send_sge, "max_send_sge")?;
        let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if length > 1 << 31 {
            return Err(Error::invalid(format!(
                "the message of {length} bytes exceeds max_msg_sz (2^31)"
            )));
        }
        if wr.send_flags.contains(SendFlags::IP_CSUM) {
            return Err(Error::invalid("IP checksum offload is not supported"));
        }
        let mut inline = false;
        if wr.send_flags.contains(SendFlags::INLINE) {
            if wr.opcode == WrOpcode::RdmaRead || wr.opcode.is_atomic() {
                return Err(Error::invalid(
                    "inline data cannot be used with READ or atomics",
                ));
            }
            if length > u64::from(inner.cap.max_inline_data) {
                return Err(Error::invalid(format!(
                    "{length} bytes of inline data exceed max_inline_data {}",
                    inner.cap.max_inline_data
                )));
            }
            inline = true;
        }
        if wr.opcode.is_atomic() {
            if wr.sg_list.len() != 1 || length != 8 {
                return Err(Error::invalid(
                    "an atomic needs exactly one 8-byte scatter/gather entry",
                ));
            }
            if !wr.remote_addr.is_multiple_of(8) {
                return Err(Error::invalid(format!(
                    "atomic remote address {:#x} is not 8-byte aligned",
                    wr.remote_addr
                )));
            }
        }
        let mut ah = None;
        if qp_type == QpType::Ud {
            let Some(a) = wr.ah else {
                return Err(Error::invalid("a UD send needs an address handle"));
            };
            if !Arc::ptr_eq(a.inner.pd.arc(), inner.pd.arc()) {
                return Err(Error::invalid("the address handle belongs to another PD"));
            }
            if wr.remote_qpn > 0xff_ffff {
                return Err(Error::invalid("remote_qpn is wider than 24 bits"));
            }
            ah = Some(a.inner.clone());
        }
        // A UD SEND to a multicast GID goes to the multicast QP number (IBA 10.5.2.5),
        // whatever the request names.
        let remote_qpn = match &ah {
            Some(a) if a.attr.grh.dgid.is_multicast() => MULTICAST_QPN,
            _ => wr.remote_qpn,
        };
        let op = match wr.opcode {
            WrOpcode::Send => tp::SendOp::Send,
            WrOpcode::SendWithImm => tp::SendOp::SendWithImm(wr.imm_data),
            WrOpcode::SendWithInv => tp::SendOp::SendWithInv(wr.imm_data),
            WrOpcode::RdmaWrite => tp::SendOp::RdmaWrite {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
            },
            WrOpcode::RdmaWriteWithImm => tp::SendOp::RdmaWriteWithImm {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                imm: wr.imm_data,
            },
            WrOpcode::RdmaRead => tp::SendOp::RdmaRead {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
            },
            WrOpcode::AtomicCmpAndSwp => tp::SendOp::CmpAndSwp {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                compare: wr.compare_add,
                swap: wr.swap,
            },
            WrOpcode::AtomicFetchAndAdd => tp::SendOp::FetchAndAdd {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                add: wr.compare_add,
            },
            WrOpcode::LocalInv => tp::SendOp::LocalInv(wr.imm_data),
            WrOpcode::BindMw => {
                let Some(b) = &wr.bind_mw else {
                    return Err(Error::invalid("a BIND_MW request needs bind_mw"));
                };
                let info = &b.bind_info;
                if info.mr.is_none() && (info.addr != 0 || info.length != 0) {
                    return Err(Error::invalid(
                        "a bind without a memory region must have address and length 0",
                    ));
                }
                tp::SendOp::BindMw(info.to_transport(b.mw, b.rkey))
            }
            other => return Err(Error::invalid(format!("opcode {other:?} is not supported"))),
        };
        let local = matches!(op, tp::SendOp::BindMw(_) | tp::SendOp::LocalInv(_));
        if inline && !local {
            let data = req.inline.insert(tp::InlineData::zeroed(length as usize));
            if raw_inline {
                raw_inline_copy(wr.sg_list, data);
            } else {
                self.copy_inline(wr.sg_list, data, mrs)?;
            }
        }
        if !local {
            for s in wr.sg_list {
                req.sges.push(s.to_transport());
            }
        }
        req.wr_id = wr.wr_id;
        req.op = op;
        req.signaled = inner.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        req.solicited = wr.send_flags.contains(SendFlags::SOLICITED);
        req.fence = wr.send_flags.contains(SendFlags::FENCE);
        req.ud = ah.as_ref().map(|_| tp::UdDest {
            dest: 0,
            remote_qpn,
            remote_qkey: wr.remote_qkey,
        });
        Ok(ah)
    }

    /// Copies the data of an INLINE send out of registered memory. Unlike rdma-core, which
    /// reads any address it is given and ignores the lkey, softrdma requires inline entries
    /// to lie inside a memory region of the QP's PD: that is what keeps the faithful face
    /// memory-safe.
    /// The region of each entry is looked up through the QP's cache of the last one found
    /// (`mrs`, as the data path does), not the device's table each time.
    fn copy_inline(&self, sges: &[Sge], data: &mut [u8], mrs: &mut MrCache) -> Result<()> {
        let res = &self.inner.pd.shared().resources;
        let mut at = 0;
        for s in sges {
            let lease = res
                .check_access_cached(
                    mrs,
                    s.lkey,
                    KeyKind::Local,
                    self.inner.pd.arc(),
                    s.addr,
                    u64::from(s.length),
                    AccessFlags::empty(),
                    false,
                    crate::verbs::mr::SpanUse::None,
                )
                .map_err(|e| {
                    Error::invalid(format!(
                        "inline entry {:#x}+{} is not in a memory region of the QP's PD ({e:?})",
                        s.addr, s.length
                    ))
                })?;
            let n = s.length as usize;
            lease.read(0, &mut data[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

/// Copies inline data from the entries' addresses (see [`Qp::post_send_raw_inline`]). An
/// entry of no bytes is skipped whatever its address (UCX's inline sends name a null one).
fn raw_inline_copy(sges: &[Sge], data: &mut [u8]) {
    let mut at = 0;
    for s in sges {
        let n = s.length as usize;
        if n == 0 {
            continue;
        }
        // SAFETY: the caller of post_send_raw_inline promised n readable bytes at addr (not
        // null, then).
        let src = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, n) };
        data[at..at + n].copy_from_slice(src);
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of no bytes at a null or dangling address are skipped (a slice at a null
    /// pointer is undefined behaviour even when empty); the others are copied in order.
    #[test]
    fn raw_inline_copy_skips_entries_of_no_bytes() {
        let a = *b"abc";
        let b = *b"defgh";
        let sges = [
            Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            Sge {
                addr: a.as_ptr() as u64,
                length: 3,
                lkey: 0,
            },
            Sge {
                addr: 1,
                length: 0,
                lkey: 0,
            },
            Sge {
                addr: b.as_ptr() as u64,
                length: 5,
                lkey: 0,
            },
        ];
        let mut data = [0u8; 8];
        raw_inline_copy(&sges, &mut data);
        assert_eq!(&data, b"abcdefgh");
    }
}
