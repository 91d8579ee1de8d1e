//! Work requests: `struct ibv_send_wr` and `struct ibv_recv_wr` with their typed
//! constructors, and the queued form of a receive request.

use crate::error::{Error, Result};
use crate::verbs::ah::Ah;
use crate::verbs::mr::{MrSlice, RemoteMr};
use crate::verbs::mw::BindMwWr;
use crate::verbs::wr::{SendFlags, Sge, WrOpcode};
use softrdma_proto::transport as tp;

/// `struct ibv_send_wr` (without `next`: [`crate::Qp::post_send`] takes a slice). The fields of the
/// `wr` union are flattened: `remote_addr`/`rkey` for RDMA and atomics, `compare_add`/`swap`
/// for atomics, `ah`/`remote_qpn`/`remote_qkey` for UD.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The local memory to send from (or, for READ and atomics, to write the result into).
    pub sg_list: &'a [Sge],
    /// The operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub send_flags: SendFlags,
    /// Immediate data (`*_WITH_IMM`), or the rkey to invalidate (`SEND_WITH_INV`,
    /// `LOCAL_INV`: `invalidate_rkey`).
    pub imm_data: u32,
    /// Remote address (RDMA, atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA, atomics).
    pub rkey: u32,
    /// Compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap value (CMP_AND_SWP).
    pub swap: u64,
    /// Address handle (UD).
    pub ah: Option<&'a Ah>,
    /// Destination QP number (UD).
    pub remote_qpn: u32,
    /// Destination Q_Key (UD).
    pub remote_qkey: u32,
    /// The window, new rkey and binding of a BIND_MW request.
    pub bind_mw: Option<BindMwWr<'a>>,
}

/// Typed constructors: work requests built from [`MrSlice`]s and a [`RemoteMr`], checked
/// where the faithful fields could be swapped or overrun silently. They fill the same
/// struct, so posting them takes the same path as any other request (no allocation).
///
/// ```
/// # use softrdma::*;
/// # use std::sync::Arc;
/// # let addr = softrdma::testing::unique_loopback_addr().into();
/// let ctx = Device::from_addr(addr).unwrap().open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let buf = Arc::new(Buffer::new(4096));
/// let mr = pd.reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits()).unwrap();
/// // What the peer sent us about its region (from its Mr::remote()).
/// let peer = RemoteMr { addr: 0x10000, len: 1024, rkey: 0x42 };
/// let src = [mr.slice(0..512).unwrap()];
/// let wr = SendWr::write(1, &src, peer.slice(512..).unwrap()).unwrap().signaled();
/// assert_eq!((wr.opcode, wr.remote_addr, wr.rkey), (WrOpcode::RdmaWrite, 0x10200, 0x42));
/// assert!(wr.send_flags.contains(SendFlags::SIGNALED));
/// // 1024 bytes do not fit the 512 left at the peer: refused before posting.
/// let too_long = [mr.slice(0..1024).unwrap()];
/// assert!(SendWr::write(2, &too_long, peer.slice(512..).unwrap()).is_err());
/// ```
impl<'a> SendWr<'a> {
    fn typed(wr_id: u64, local: &'a [MrSlice<'a>], opcode: WrOpcode) -> SendWr<'a> {
        SendWr {
            wr_id,
            sg_list: MrSlice::as_sges(local),
            opcode,
            ..Default::default()
        }
    }

    /// A SEND of the bytes of `local`, gathered in order.
    pub fn send(wr_id: u64, local: &'a [MrSlice<'a>]) -> SendWr<'a> {
        Self::typed(wr_id, local, WrOpcode::Send)
    }

    /// An RDMA WRITE of the bytes of `local` to the start of `remote`.
    ///
    /// Fails with `EINVAL` when they are longer than `remote`.
    pub fn write(wr_id: u64, local: &'a [MrSlice<'a>], remote: RemoteMr) -> Result<SendWr<'a>> {
        remote.check_fits(MrSlice::total(local), "an RDMA WRITE")?;
        let mut wr = Self::typed(wr_id, local, WrOpcode::RdmaWrite);
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        Ok(wr)
    }

    /// An RDMA READ of the start of `remote` into `local`, scattered in order (as many bytes
    /// as `local` holds).
    ///
    /// Fails with `EINVAL` when `local` is longer than `remote`.
    pub fn read(wr_id: u64, local: &'a [MrSlice<'a>], remote: RemoteMr) -> Result<SendWr<'a>> {
        remote.check_fits(MrSlice::total(local), "an RDMA READ")?;
        let mut wr = Self::typed(wr_id, local, WrOpcode::RdmaRead);
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        Ok(wr)
    }

    fn atomic(
        wr_id: u64,
        result: &'a MrSlice<'a>,
        remote: RemoteMr,
        opcode: WrOpcode,
    ) -> Result<SendWr<'a>> {
        if result.len() != 8 {
            return Err(Error::invalid(format!(
                "an atomic's result slice must be 8 bytes, not {}",
                result.len()
            )));
        }
        remote.check_fits(8, "an atomic")?;
        if !remote.addr.is_multiple_of(8) {
            return Err(Error::invalid(format!(
                "atomic remote address {:#x} is not 8-byte aligned",
                remote.addr
            )));
        }
        let mut wr = Self::typed(wr_id, std::slice::from_ref(result), opcode);
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        Ok(wr)
    }

    /// An atomic fetch-and-add of `add` to the 8-byte word at the start of `remote`; the old
    /// value lands in `result`.
    ///
    /// Fails with `EINVAL` when `result` is not 8 bytes, or `remote` is shorter than 8 bytes
    /// or not 8-byte aligned.
    pub fn fetch_add(
        wr_id: u64,
        result: &'a MrSlice<'a>,
        remote: RemoteMr,
        add: u64,
    ) -> Result<SendWr<'a>> {
        let mut wr = Self::atomic(wr_id, result, remote, WrOpcode::AtomicFetchAndAdd)?;
        wr.compare_add = add;
        Ok(wr)
    }

    /// An atomic compare-and-swap of the 8-byte word at the start of `remote`: `swap` is
    /// stored if it holds `compare`; the old value lands in `result`.
    ///
    /// Fails like [`SendWr::fetch_add`].
    pub fn compare_swap(
        wr_id: u64,
        result: &'a MrSlice<'a>,
        remote: RemoteMr,
        compare: u64,
        swap: u64,
    ) -> Result<SendWr<'a>> {
        let mut wr = Self::atomic(wr_id, result, remote, WrOpcode::AtomicCmpAndSwp)?;
        wr.compare_add = compare;
        wr.swap = swap;
        Ok(wr)
    }

    /// The same request with `flags` added.
    pub fn flags(mut self, flags: SendFlags) -> SendWr<'a> {
        self.send_flags |= flags;
        self
    }

    /// The same request with [`SendFlags::SIGNALED`]: it will produce a completion.
    pub fn signaled(self) -> SendWr<'a> {
        self.flags(SendFlags::SIGNALED)
    }

    /// The same SEND or RDMA WRITE carrying immediate data (`*_WITH_IMM`); other opcodes are
    /// left as they are, with `imm_data` set.
    pub fn with_imm(mut self, imm: u32) -> SendWr<'a> {
        self.opcode = match self.opcode {
            WrOpcode::Send => WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite => WrOpcode::RdmaWriteWithImm,
            o => o,
        };
        self.imm_data = imm;
        self
    }
}

/// `struct ibv_recv_wr` (without `next`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The memory to receive into.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive into `local`, scattered in order.
    pub fn new(wr_id: u64, local: &'a [MrSlice<'a>]) -> RecvWr<'a> {
        RecvWr {
            wr_id,
            sg_list: MrSlice::as_sges(local),
        }
    }
}

/// A receive work request as queued on a receive queue or SRQ: already the transport's
/// [`tp::RecvRequest`] (its list held in place up to [`tp::SG_INLINE`] entries), so the data
/// path only moves it out of the queue.
pub(crate) type RecvWqe = tp::RecvRequest;

/// The queued form of a posted receive request.
pub(crate) fn recv_wqe(wr: &RecvWr<'_>) -> RecvWqe {
    tp::RecvRequest {
        wr_id: wr.wr_id,
        sges: wr.sg_list.iter().map(|s| s.to_transport()).collect(),
    }
}
