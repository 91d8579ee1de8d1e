//! The `rdma_verbs.h` helpers as methods of [`CmId`]: memory registration on the id's PD,
//! posts of one buffer or a list, and blocking completion waits on the CQs `create_qp` made.

use super::{CmId, IdData, RDMA_UDP_QKEY};
use crate::error::{Error, Result};
use crate::{
    AccessFlags, Ah, Buffer, Mr, RecvWr, SendFlags, SendWr, Sge, WorkCompletion, WrOpcode,
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
    /// Fails with `EINVAL` when the buffer is not inside `mr` or the id has no QP, and like
    /// [`crate::Qp::post_send`]. (librdmacm allows no region with `IBV_SEND_INLINE`;
    /// softrdma reads inline data through a region too, so pass it.)
    pub fn post_send(
        &self,
        context: u64,
        addr: u64,
        length: usize,
        mr: Option<&Mr>,
        flags: SendFlags,
    ) -> Result<()> {
        let Some(mr) = mr else {
            return Err(Error::invalid(
                "inline sends need the buffer's region on softrdma (pass the MR)",
            ));
        };
        self.post_sendv(context, &[Self::sge(addr, length, mr)?], flags)
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
