//! The `rdma_verbs.h` helpers as methods of [`CmId`]: memory registration on the id's PD,
//! posts of one buffer or a list, and blocking completion waits on the CQs `create_qp` made.

use super::objects::{CmId, IdData};
use super::RDMA_UDP_QKEY;
use crate::error::{Error, Result};
use crate::{
    AccessFlags, Ah, Buffer, Mr, MrSlice, RecvWr, RemoteMr, SendFlags, SendWr, Sge, WorkCompletion,
    WrOpcode,
};
use std::sync::Arc;

impl CmId {
    fn need<T: Clone>(&self, f: impl Fn(&IdData) -> Option<T>, what: &str) -> Result<T> {
        f(&self.inner.lock()).ok_or_else(|| Error::invalid(format!("the id has no {what}")))
    }

    fn reg(&self, buf: &Arc<Buffer>, access: AccessFlags) -> Result<Mr> {
        self.need(|s| s.pd.clone(), "PD (rdma_create_qp first)")?
            .reg_buffer(buf, access.bits())
    }

    /// Registers `buf` for sends and receives (`rdma_reg_msgs`: LOCAL_WRITE) on the id's PD.
    ///
    /// Fails with `EINVAL` when the id has no PD yet (no QP or SRQ), and like
    /// [`crate::Pd::reg_buffer`].
    pub fn reg_msgs(&self, buf: &Arc<Buffer>) -> Result<Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE)
    }

    /// Registers `buf` as the target of the peer's RDMA READs (`rdma_reg_read`).
    ///
    /// Fails like [`CmId::reg_msgs`].
    pub fn reg_read(&self, buf: &Arc<Buffer>) -> Result<Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
    }

    /// Registers `buf` as the target of the peer's RDMA WRITEs (`rdma_reg_write`).
    ///
    /// Fails like [`CmId::reg_msgs`].
    pub fn reg_write(&self, buf: &Arc<Buffer>) -> Result<Mr> {
        self.reg(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
    }

    /// Deregisters a region (`rdma_dereg_mr`).
    ///
    /// Fails like [`Mr::dereg`] (`EINVAL` while memory windows are bound to it).
    pub fn dereg_mr(mr: Mr) -> Result<()> {
        mr.dereg().map_err(|e| e.error)
    }

    fn sge(addr: u64, length: usize, mr: &Mr) -> Result<Sge> {
        let end = addr.checked_add(length as u64);
        if addr < mr.iova() || end.is_none_or(|e| e > mr.iova() + mr.length()) {
            return Err(Error::invalid("the buffer is not inside the memory region"));
        }
        Ok(Sge {
            addr,
            length: length as u32,
            lkey: mr.lkey(),
        })
    }

    /// Posts one receive of `length` bytes at `addr` in `mr` (`rdma_post_recv`); `context`
    /// comes back as the completion's wr_id. Goes to the id's SRQ when it has one.
    ///
    /// Fails with `EINVAL` when the buffer is not inside `mr` or the id has no QP or SRQ, and
    /// like [`crate::Qp::post_recv`].
    pub fn post_recv(&self, context: u64, addr: u64, length: usize, mr: &Mr) -> Result<()> {
        self.post_recvv(context, &[Self::sge(addr, length, mr)?])
    }

    /// Posts one receive scattering into `sgl` (`rdma_post_recvv`).
    ///
    /// Fails like [`CmId::post_recv`].
    pub fn post_recvv(&self, context: u64, sgl: &[Sge]) -> Result<()> {
        let wr = [RecvWr {
            wr_id: context,
            sg_list: sgl,
        }];
        let (qp, srq) = {
            let s = self.inner.lock();
            (s.qp.clone(), s.srq.clone())
        };
        match (srq, qp) {
            (Some(srq), _) => srq.post_srq_recv(&wr).map_err(Error::from),
            (None, Some(qp)) => qp.post_recv(&wr).map_err(Error::from),
            (None, None) => Err(Error::invalid("the id has no QP")),
        }
    }

    fn post_one(&self, wr: SendWr<'_>) -> Result<()> {
        self.need(|s| s.qp.clone(), "QP")?
            .post_send(&[wr])
            .map_err(Error::from)
    }

    /// Sends `length` bytes at `addr` in `mr` (`rdma_post_send`).
    ///
    /// As in librdmacm, `mr` may be `None` with [`SendFlags::INLINE`]: the data is copied at
    /// post time and no lkey is needed. softrdma still only reads registered memory through
    /// this safe call, so the bytes must lie in some memory region of the id's PD (found by
    /// address); to send bytes that are registered nowhere, use [`CmId::send_inline`].
    ///
    /// Fails with `EINVAL` when the buffer is not inside `mr` (or, with `None`, the flags lack
    /// INLINE or no region of the id's PD holds it) or the id has no QP, and like
    /// [`crate::Qp::post_send`].
    pub fn post_send(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: Option<&Mr>,
        flags: SendFlags,
    ) -> Result<()> {
        let sge = match mr {
            Some(mr) => Self::sge(addr, length, mr)?,
            None => {
                if !flags.contains(SendFlags::INLINE) {
                    return Err(Error::invalid(
                        "a send without a memory region needs IBV_SEND_INLINE",
                    ));
                }
                let pd = self.need(|s| s.pd.clone(), "QP")?;
                let lkey = pd.lkey_covering(addr, length as u64).ok_or_else(|| {
                    Error::invalid(format!(
                        "{addr:#x}+{length} is in no memory region of the id's PD: \
                         use CmId::send_inline for unregistered bytes"
                    ))
                })?;
                Sge {
                    addr,
                    length: u32::try_from(length)
                        .map_err(|_| Error::invalid("the send is longer than 2^32 bytes"))?,
                    lkey,
                }
            }
        };
        self.post_sendv(context, &[sge], flags)
    }

    /// Sends the gathered `sgl` (`rdma_post_sendv`).
    ///
    /// Fails like [`CmId::post_send`].
    pub fn post_sendv(&self, context: u64, sgl: &[Sge], flags: SendFlags) -> Result<()> {
        self.post_one(SendWr {
            wr_id: context,
            sg_list: sgl,
            opcode: WrOpcode::Send,
            send_flags: flags,
            ..Default::default()
        })
    }

    /// Sends `length` bytes at `addr` on a UD id to the QP `remote_qpn` behind `ah`, with
    /// Q_Key [`RDMA_UDP_QKEY`] (`rdma_post_ud_send`).
    ///
    /// Fails like [`CmId::post_send`].
    #[allow(clippy::too_many_arguments)]
    pub fn post_ud_send(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: &Mr,
        flags: SendFlags,
        ah: &Ah,
        remote_qpn: u32,
    ) -> Result<()> {
        let sg = [Self::sge(addr, length, mr)?];
        self.post_one(SendWr {
            wr_id: context,
            sg_list: &sg,
            opcode: WrOpcode::Send,
            send_flags: flags,
            ah: Some(ah),
            remote_qpn,
            remote_qkey: RDMA_UDP_QKEY,
            ..Default::default()
        })
    }

    /// RDMA-reads `length` bytes from the peer's `remote_addr` under `rkey` into `addr`
    /// (`rdma_post_read`).
    ///
    /// Fails like [`CmId::post_send`].
    #[allow(clippy::too_many_arguments)]
    pub fn post_read(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: &Mr,
        flags: SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let sg = [Self::sge(addr, length, mr)?];
        self.post_readv(context, &sg, flags, remote_addr, rkey)
    }

    /// RDMA-reads into the scattered `sgl` (`rdma_post_readv`).
    ///
    /// Fails like [`CmId::post_send`].
    pub fn post_readv(
        &self,
        context: u64,
        sgl: &[Sge],
        flags: SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        self.post_rdma(WrOpcode::RdmaRead, context, sgl, flags, remote_addr, rkey)
    }

    fn post_rdma(
        &self,
        opcode: WrOpcode,
        context: u64,
        sgl: &[Sge],
        flags: SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        self.post_one(SendWr {
            wr_id: context,
            sg_list: sgl,
            opcode,
            send_flags: flags,
            remote_addr,
            rkey,
            ..Default::default()
        })
    }

    /// RDMA-writes `length` bytes at `addr` to the peer's `remote_addr` under `rkey`
    /// (`rdma_post_write`).
    ///
    /// Fails like [`CmId::post_send`].
    #[allow(clippy::too_many_arguments)]
    pub fn post_write(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: &Mr,
        flags: SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let sg = [Self::sge(addr, length, mr)?];
        self.post_writev(context, &sg, flags, remote_addr, rkey)
    }

    /// RDMA-writes the gathered `sgl` (`rdma_post_writev`).
    ///
    /// Fails like [`CmId::post_send`].
    pub fn post_writev(
        &self,
        context: u64,
        sgl: &[Sge],
        flags: SendFlags,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        self.post_rdma(WrOpcode::RdmaWrite, context, sgl, flags, remote_addr, rkey)
    }

    /// Posts a SEND of the bytes of `src` (the typed `rdma_post_send`); `context` comes back
    /// as the completion's wr_id.
    ///
    /// Fails with `EINVAL` when the id has no QP, and like [`crate::Qp::post_send`].
    ///
    /// ```no_run
    /// # use softrdma::{Buffer, SendFlags, rdma_cm::CmId};
    /// # use std::sync::Arc;
    /// # fn f(id: &CmId) -> softrdma::Result<()> {
    /// let buf = Arc::new(Buffer::from_slice(b"hello, peer"));
    /// let mr = id.reg_msgs(&buf)?;
    /// id.send(1, &mr.slice(..)?, SendFlags::SIGNALED)?;
    /// id.get_send_comp()?.check()?;
    /// # Ok(()) }
    /// ```
    pub fn send(&self, context: u64, src: &MrSlice<'_>, flags: SendFlags) -> Result<()> {
        self.post_sendv(context, &[src.sge()], flags)
    }

    /// Sends `data` as inline data: the bytes are copied when the request is posted, so they
    /// need no memory region and are free again on return (`rdma_post_send` with
    /// `IBV_SEND_INLINE` and no region). [`SendFlags::INLINE`] is added to `flags`.
    ///
    /// Fails with `EINVAL` when `data` is longer than the QP's `max_inline_data` (ask for it
    /// in the capabilities of `create_qp`) or the id has no QP, and like
    /// [`crate::Qp::post_send`].
    pub fn send_inline(&self, context: u64, data: &[u8], flags: SendFlags) -> Result<()> {
        let qp = self.need(|s| s.qp.clone(), "QP")?;
        let sge = [Sge {
            addr: data.as_ptr() as u64,
            length: u32::try_from(data.len())
                .map_err(|_| Error::invalid("inline data longer than 2^32 bytes"))?,
            lkey: 0,
        }];
        let wr = SendWr {
            wr_id: context,
            sg_list: &sge,
            opcode: WrOpcode::Send,
            send_flags: flags | SendFlags::INLINE,
            ..Default::default()
        };
        // SAFETY: the request is INLINE, so its one entry is read during the call only, and
        // it names the bytes of `data`, readable for the whole call.
        unsafe { qp.post_send_raw_inline(&[wr]) }.map_err(Error::from)
    }

    /// Posts a receive into `dst` (the typed `rdma_post_recv`); goes to the id's SRQ when it
    /// has one.
    ///
    /// Fails like [`CmId::post_recv`].
    pub fn recv(&self, context: u64, dst: &MrSlice<'_>) -> Result<()> {
        self.post_recvv(context, &[dst.sge()])
    }

    /// RDMA-writes the bytes of `src` to the start of `dst`, the peer's region (the typed
    /// `rdma_post_write`).
    ///
    /// Fails with `EINVAL` when `src` is longer than `dst`, and like [`CmId::post_send`].
    ///
    /// ```no_run
    /// # use softrdma::{Buffer, RemoteMr, SendFlags, rdma_cm::CmId};
    /// # use std::sync::Arc;
    /// # fn f(id: &CmId) -> softrdma::Result<()> {
    /// // The peer's region, from the private data of its accept.
    /// let peer = RemoteMr::from_bytes(&id.event().unwrap().param.private_data)?;
    /// let buf = Arc::new(Buffer::from_slice(&[7; 4096]));
    /// let mr = id.reg_msgs(&buf)?;
    /// id.write(1, &mr.slice(..1024)?, peer.slice(2048..)?, SendFlags::SIGNALED)?;
    /// id.get_send_comp()?.check()?;
    /// # Ok(()) }
    /// ```
    pub fn write(
        &self,
        context: u64,
        src: &MrSlice<'_>,
        dst: RemoteMr,
        flags: SendFlags,
    ) -> Result<()> {
        let wr = SendWr::write(context, std::slice::from_ref(src), dst)?.flags(flags);
        self.post_one(wr)
    }

    /// RDMA-reads the start of `src`, the peer's region, into `dst` (as many bytes as `dst`
    /// holds; the typed `rdma_post_read`).
    ///
    /// Fails with `EINVAL` when `dst` is longer than `src`, and like [`CmId::post_send`].
    pub fn read(
        &self,
        context: u64,
        dst: &MrSlice<'_>,
        src: RemoteMr,
        flags: SendFlags,
    ) -> Result<()> {
        let wr = SendWr::read(context, std::slice::from_ref(dst), src)?.flags(flags);
        self.post_one(wr)
    }

    fn get_comp(&self, send: bool) -> Result<WorkCompletion> {
        self.get_comp_until(send, None)
    }

    /// [`CmId::get_send_comp`] or [`CmId::get_recv_comp`], waiting until `deadline` at most.
    pub(super) fn get_comp_until(
        &self,
        send: bool,
        deadline: Option<std::time::Instant>,
    ) -> Result<WorkCompletion> {
        let (cq, ch) = {
            let s = self.inner.lock();
            if send {
                (s.send_cq.clone(), s.send_cq_channel.clone())
            } else {
                (s.recv_cq.clone(), s.recv_cq_channel.clone())
            }
        };
        let (Some(cq), Some(ch)) = (cq, ch) else {
            return Err(Error::invalid(
                "the id has no CQ with a channel made by rdma_create_qp",
            ));
        };
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            if cq.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            cq.req_notify_cq(false)?;
            if cq.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            let ev = match deadline {
                None => ch.get_cq_event()?,
                Some(d) => {
                    ch.get_cq_event_timeout(d.saturating_duration_since(std::time::Instant::now()))?
                }
            };
            if !ev.is_for(&cq) || ev.cq_context() != self.inner.context {
                return Err(Error::invalid(
                    "a CQ event for another CQ on the id's channel",
                ));
            }
            cq.ack_cq_events(1);
        }
    }

    /// Waits for the next send completion (`rdma_get_send_comp`), sleeping on the send CQ's
    /// channel.
    ///
    /// As in librdmacm, a completion that reports a failed operation is still `Ok`: check
    /// its status, or make it an error with [`WorkCompletion::ok`]
    /// (`id.get_send_comp()?.check()?`).
    ///
    /// Fails with `EINVAL` when `create_qp` made no send CQ for the id, and like
    /// [`crate::Cq::poll`].
    pub fn get_send_comp(&self) -> Result<WorkCompletion> {
        self.get_comp(true)
    }

    /// Waits for the next receive completion (`rdma_get_recv_comp`).
    ///
    /// Fails like [`CmId::get_send_comp`].
    pub fn get_recv_comp(&self) -> Result<WorkCompletion> {
        self.get_comp(false)
    }
}
