//! The transport's view of one QP's memory and receive queue ([`QpEnv`]: the checks of
//! keys, bounds and access on every copy, deferred copies for the copy engines), and the
//! translation of the transport's completions into work completions ([`to_wc`]). Used by the
//! data path (packets through the transport) and by work-request records (`verbs::records`).

use crate::verbs::copy::Batch;
use crate::verbs::cq::WorkCompletion;
use crate::verbs::mr::{AccessError as MrAccessError, AccessFlags, KeyKind, SpanUse};
use crate::verbs::pd::PdInner;
use crate::verbs::qp::QpInner;
use crate::verbs::requests::RecvWqe;
use crate::verbs::resources::Resources;
use crate::verbs::srq::SrqInner;
use softrdma_proto::transport::{
    AccessError, AtomicOp, Completion, Env, MwBind, RecvRequest, Sge, WcStatus,
};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    /// The address range of the slot of a transmit batch that the packet being built goes
    /// into, when its payload may stay in the program's memory (see [`QpEnv::gaps`]).
    pub(crate) gather: Option<(usize, usize)>,
    /// The pieces of the payload of the packet being built that stay in the program's memory
    /// (request payloads of at least [`GATHER_MIN`] bytes, while `gather` is set): the kernel
    /// reads them in place when the packet goes (`provider::TxBatch::commit_gapped`).
    pub(crate) gaps: crate::provider::PacketGaps,
}

thread_local! {
    /// The deferred copies' batch of this thread, kept between runs for its room.
    static BATCH: std::cell::Cell<Batch> = std::cell::Cell::new(Batch::default());
}

impl QpEnv<'_> {
    /// Starts deferring payload copies (when copy engines are on).
    pub(crate) fn start_deferring(&mut self) {
        if self.defer.is_none() && crate::verbs::copy::deferring() {
            self.defer = Some(BATCH.take());
        }
    }

    /// Makes the deferred writes (receiving; all done on return), before an access that may
    /// read what they write; deferring goes on. (Deferred reads into a ring's room need no
    /// such care: nothing reads the room before publication.)
    #[inline]
    pub(crate) fn run_deferred(&mut self) {
        if let Some(b) = self.defer.as_mut().filter(|_| !self.defer_reads) {
            b.run();
        }
    }

    /// Makes every deferred copy now (before a ring's room is published); deferring goes on.
    #[inline]
    pub(crate) fn make_deferred(&mut self) {
        if let Some(b) = self.defer.as_mut() {
            b.run();
        }
        self.build_mark = 0;
    }

    /// Makes the deferred copies and stops deferring.
    pub(crate) fn stop_deferring(&mut self) {
        if let Some(mut b) = self.defer.take() {
            b.run();
            BATCH.set(b);
        }
    }

    /// A packet is being built from here on: the copies it defers come after this mark.
    #[inline]
    pub(crate) fn mark_build(&mut self) {
        self.build_mark = self.defer.as_ref().map_or(0, Batch::len);
    }

    /// The packet being built is abandoned (an access refused midway, or not sent): forgets
    /// the copies it deferred into its room, which the next packet takes.
    #[inline]
    pub(crate) fn abandon_build(&mut self) {
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

/// The span of an access to a scatter/gather entry at `offset`: its first access (offset 0:
/// every use of an entry by a request or receive starts there) populates the whole entry's
/// pages, the later ones find them populated (see [`SpanUse`]).
fn entry_span(sge: &Sge, offset: u32) -> SpanUse {
    if offset == 0 {
        SpanUse::Begin {
            start: sge.addr,
            len: u64::from(sge.length),
        }
    } else {
        SpanUse::Within
    }
}

fn map_err(e: MrAccessError) -> AccessError {
    match e {
        MrAccessError::InvalidKey | MrAccessError::WrongPd => AccessError::InvalidKey,
        // (An on-demand region's unmapped pages fail as memory outside a region does: a NIC
        // whose page fault cannot be resolved reports a protection error.)
        MrAccessError::OutOfBounds | MrAccessError::NotMapped => AccessError::OutOfBounds,
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
            gather: None,
            gaps: Default::default(),
        }
    }

    /// A lease of `len` bytes at `va` under `key` (see [`Resources::check_access_cached`];
    /// `span`: which of an on-demand region's pages to populate).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lease(
        &mut self,
        key: u32,
        kind: KeyKind,
        va: u64,
        len: usize,
        need: AccessFlags,
        atomic: bool,
        span: SpanUse,
    ) -> std::result::Result<crate::verbs::mr::MrLease, AccessError> {
        let r = self.res.check_access_cached(
            self.mrs, key, kind, self.pd, va, len as u64, need, atomic, span,
        );
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

impl QpEnv<'_> {
    /// [`Env::write_remote`] of a whole WRITE that no `check_remote` announced (a same-host
    /// record): the pages of an on-demand region are checked for it alone.
    pub(crate) fn write_remote_whole(
        &mut self,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        self.write_remote_in(rkey, va, src, SpanUse::None)
    }

    fn write_remote_in(
        &mut self,
        rkey: u32,
        va: u64,
        src: &[u8],
        span: SpanUse,
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
            span,
        )?;
        self.write_from(l, src);
        Ok(())
    }

    /// Puts a receive request taken with [`Env::take_recv`] back at the head of its queue
    /// (the QP's, or its SRQ's).
    pub(crate) fn put_back_recv(&mut self, w: RecvRequest) {
        match self.srq {
            Some(srq) => srq
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .queue
                .push_front(w),
            None => self.rq.push_front(w),
        }
    }
}

/// Request payload pieces shorter than this are copied into the packet even where they could
/// stay in the program's memory ([`QpEnv::gaps`]): a piece costs the kernel an iovec, and a
/// copy of a few hundred bytes is cheaper than the bookkeeping.
pub(crate) const GATHER_MIN: usize = 1024;

/// Copies shorter than this are made on the spot even while deferring: handing a few bytes
/// to a batch costs more than copying them. (A short read into a packet's room needs no
/// order with the deferred reads; a short write is made at once only while no write waits
/// before it, which might cover the same bytes.)
pub(crate) const DEFER_MIN: usize = 256;

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
                entry_span(sge, offset),
            )
            .inspect_err(|_| {
                self.abandon_build();
                // (The packet is not sent: what it left in place is released.)
                self.gaps.clear();
            })?;
        if let Some((slot, end)) = self.gather {
            let at = dst.as_ptr() as usize;
            if dst.len() >= GATHER_MIN
                && at >= slot
                && at + dst.len() <= end
                && self.gaps.has_room()
            {
                // (The payload's bytes in the slot stay as they are: the batch sends the
                // region's in their place.)
                let src = l.as_ptr().cast_const();
                self.gaps.push(at - slot, src, dst.len(), l.into_hold());
                return Ok(());
            }
        }
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
            entry_span(sge, offset),
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
        // (The check at a READ's or WRITE's first packet: its span is the message's.)
        self.lease(
            rkey,
            KeyKind::Remote,
            va,
            len as usize,
            need,
            false,
            SpanUse::Message,
        )
        .map(drop)
    }

    fn write_remote(
        &mut self,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> std::result::Result<(), AccessError> {
        // (A packet of the message whose first packet's check_remote kept the span.)
        self.write_remote_in(rkey, va, src, SpanUse::Within)
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
                SpanUse::Within,
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
            SpanUse::None,
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
