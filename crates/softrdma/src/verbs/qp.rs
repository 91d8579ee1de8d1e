//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`,
//! `ibv_post_send`, `ibv_post_recv`, `ibv_attach_mcast`, `ibv_detach_mcast`).
//!
//! The state machine and its attribute-mask rules are the IBTA table held as data in
//! [`softrdma_proto::qp`]; this module checks the attribute *values* against the device, and
//! applies a change all at once or not at all.

use crate::error::{DestroyError, Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::provider::Engine;
use crate::verbs::ah::{AhAttr, AhInner};
use crate::verbs::cq::{Cq, CqInner, WcOpcode, WcStatus, WorkCompletion};
use crate::verbs::datapath::drive_and_send;
use crate::verbs::device::PORT_NUM;
use crate::verbs::event::{AsyncElement, EventTarget, EventType};
use crate::verbs::hold::Hold;
use crate::verbs::mr::{AccessFlags, KeyKind, MrSlice, RemoteMr};
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use crate::verbs::srq::{Srq, SrqInner};
use softrdma_proto::transport as tp;
use softrdma_proto::{check_modify_qp, Mtu, QpAttrMask, QpState, QpType};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// `struct ibv_qp_cap`: the sizes of a QP's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Most outstanding send work requests.
    pub max_send_wr: u32,
    /// Most outstanding receive work requests (0 with an SRQ).
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Most scatter/gather entries per receive work request (0 with an SRQ).
    pub max_recv_sge: u32,
    /// Most bytes of inline data per send work request.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`: what [`Pd::create_qp`] takes. The actual capabilities are
/// written back into `cap`.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Context value reported with the QP's asynchronous events.
    pub qp_context: u64,
    /// The CQ of the send queue.
    pub send_cq: &'a Cq,
    /// The CQ of the receive queue (may be the same as `send_cq`).
    pub recv_cq: &'a Cq,
    /// A shared receive queue to take receive requests from (RC and UD only).
    pub srq: Option<&'a Srq>,
    /// Requested capabilities, at least these on return.
    pub cap: QpCap,
    /// The transport service.
    pub qp_type: QpType,
    /// Whether every send work request generates a completion, signaled or not.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// Init attributes for a QP of `qp_type` with both queues on `cq` and the given sizes.
    pub fn new(qp_type: QpType, cq: &'a Cq, cap: QpCap) -> Self {
        QpInitAttr {
            qp_context: 0,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            qp_type,
            sq_sig_all: false,
        }
    }
}

/// `enum ibv_mig_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum MigState {
    /// `IBV_MIG_MIGRATED`.
    #[default]
    Migrated = 0,
    /// `IBV_MIG_REARM`.
    Rearm = 1,
    /// `IBV_MIG_ARMED`.
    Armed = 2,
}

/// `struct ibv_qp_attr`: QP attributes, for [`Qp::modify_qp`] (only the fields named by the
/// mask are read) and [`Qp::query_qp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to / the current state.
    pub qp_state: QpState,
    /// The state the caller believes the QP is in (with `CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (RC, UC).
    pub path_mtu: Mtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive queue PSN: the PSN the first expected request carries (24 bits).
    pub rq_psn: u32,
    /// Send queue PSN: the PSN of the first request sent (24 bits).
    pub sq_psn: u32,
    /// The peer's QP number (RC, UC).
    pub dest_qp_num: u32,
    /// What peers may do through this QP: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC
    /// ([`AccessFlags`] bits).
    pub qp_access_flags: u32,
    /// Queue sizes (query only; changing them is not supported).
    pub cap: QpCap,
    /// The primary path to the peer (RC, UC).
    pub ah_attr: AhAttr,
    /// The alternate path (stored, unused: RoCE has no path migration).
    pub alt_ah_attr: AhAttr,
    /// P_Key index (0).
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Raise `IBV_EVENT_SQ_DRAINED` when the send queue has drained in SQD.
    pub en_sqd_async_notify: bool,
    /// Whether the send queue is still draining (query only).
    pub sq_draining: bool,
    /// Outstanding RDMA READ/atomic requests this QP may initiate (RC).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests this QP accepts as a target (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code sent to peers (RC; 5 bits).
    pub min_rnr_timer: u8,
    /// The local port (1).
    pub port_num: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout, 0 = infinite (RC; 5 bits).
    pub timeout: u8,
    /// Retransmissions before `RETRY_EXC_ERR` (RC; 3 bits).
    pub retry_cnt: u8,
    /// RNR retries before `RNR_RETRY_EXC_ERR`, 7 = infinite (RC; 3 bits).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate ACK timeout.
    pub alt_timeout: u8,
    /// Rate limit in kbps (raw packet QPs; unused).
    pub rate_limit: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

/// What [`Qp::query_qp`] reports of the creation attributes (`struct ibv_qp_init_attr`
/// without the CQ and SRQ references).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitInfo {
    /// The QP's context value.
    pub qp_context: u64,
    /// The actual capabilities.
    pub cap: QpCap,
    /// The transport service.
    pub qp_type: QpType,
    /// Whether every send generates a completion.
    pub sq_sig_all: bool,
    /// Whether the QP takes its receives from an SRQ.
    pub has_srq: bool,
}

/// `struct ibv_sge`: a piece of registered memory, named by address, length and lkey.
///
/// `#[repr(C)]` with the C struct's layout, so an array of C `ibv_sge` can be read as a
/// slice of `Sge` without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// Address of the first byte (in the region's iova space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The local key of the memory region that holds it.
    pub lkey: u32,
}

/// `enum ibv_wr_opcode`, with the verbs numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive request at the peer.
    RdmaWriteWithImm = 1,
    /// `IBV_WR_SEND`.
    #[default]
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm = 3,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    AtomicCmpAndSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    AtomicFetchAndAdd = 6,
    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 memory window whose rkey is in
    /// [`SendWr::imm_data`] (RC, UC).
    LocalInv = 7,
    /// `IBV_WR_BIND_MW`: binds the memory window of [`SendWr::bind_mw`] (RC, UC).
    BindMw = 8,
    /// `IBV_WR_SEND_WITH_INV`.
    SendWithInv = 9,
    /// `IBV_WR_TSO` (not supported).
    Tso = 10,
}

impl WrOpcode {
    /// The completion opcode of a send work request of this kind.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::Tso => {
                WcOpcode::Send
            }
        }
    }

    fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// Whether QPs of `qp_type` can post this opcode.
    pub fn allowed_on(self, qp_type: QpType) -> bool {
        use WrOpcode::*;
        match qp_type {
            QpType::Rc => matches!(
                self,
                Send | SendWithImm
                    | SendWithInv
                    | RdmaWrite
                    | RdmaWriteWithImm
                    | RdmaRead
                    | AtomicCmpAndSwp
                    | AtomicFetchAndAdd
                    | LocalInv
                    | BindMw
            ),
            QpType::Uc => matches!(
                self,
                Send | SendWithImm | RdmaWrite | RdmaWriteWithImm | LocalInv | BindMw
            ),
            QpType::Ud => matches!(self, Send | SendWithImm),
            _ => false,
        }
    }
}

bitflags::bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier READs and atomics to finish first (RC).
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED`: generate a completion (when the QP is not `sq_sig_all`).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: ask for a solicited event at the receiver.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: copy the data at post time; the buffers are free on return.
        const INLINE = 1 << 3;
        /// `IBV_SEND_IP_CSUM` (not supported).
        const IP_CSUM = 1 << 4;
    }
}

/// `struct ibv_send_wr` (without `next`: [`Qp::post_send`] takes a slice). The fields of the
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
    pub ah: Option<&'a crate::Ah>,
    /// Destination QP number (UD).
    pub remote_qpn: u32,
    /// Destination Q_Key (UD).
    pub remote_qkey: u32,
    /// The window, new rkey and binding of a BIND_MW request.
    pub bind_mw: Option<crate::verbs::mw::BindMwWr<'a>>,
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
        if remote.addr % 8 != 0 {
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

/// A post that stopped at a work request it could not take (`bad_wr`): the requests before
/// it are posted, it and the ones after are not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostError {
    /// Index of the first request not posted.
    pub bad_wr: usize,
    /// Why.
    pub error: Error,
}

impl PostError {
    /// The errno rdma-core's post call would return.
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "work request {}: {}", self.bad_wr, self.error)
    }
}

impl std::error::Error for PostError {}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        e.error
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

impl Sge {
    /// The same entry as the transport's [`tp::Sge`].
    fn to_transport(self) -> tp::Sge {
        tp::Sge {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
        }
    }
}

/// Checks the number of scatter/gather entries against a limit (`EINVAL`).
pub(crate) fn check_sges(sges: &[Sge], max: u32, what: &str) -> Result<()> {
    if sges.len() > max as usize {
        return Err(Error::invalid(format!(
            "{} scatter/gather entries exceed {what} {max}",
            sges.len()
        )));
    }
    Ok(())
}

/// Requests posted in one call above which `post_send` transmits at once even while packets
/// are in flight.
const DOORBELL_BATCH: usize = 16;

/// Requests left unsent (while packets are in flight) at whose every multiple `post_send`
/// transmits at once: a full UDP GSO super-datagram of single-packet messages.
const DOORBELL_FLUSH: usize = 64;

/// A queue pair (`struct ibv_qp`).
///
/// Dropping the handle destroys the QP: queued work requests are discarded without
/// completions, as `ibv_destroy_qp` does.
pub struct Qp {
    pub(crate) inner: Arc<QpInner>,
}

pub(crate) struct QpState_ {
    pub(crate) attr: QpAttr,
    /// The transport, from RTR on (the send queue lives in it).
    pub(crate) transport: Option<tp::Qp>,
    /// The device engine, once the QP has reached RTR.
    pub(crate) engine: Option<Arc<Engine>>,
    pub(crate) rq: VecDeque<RecvWqe>,
    /// Address handles of UD sends not yet transmitted, by the handle given to the transport.
    pub(crate) ud_dests: HashMap<u64, Arc<AhInner>>,
    pub(crate) next_ud_dest: u64,
    pub(crate) mcast: Vec<Gid>,
    /// The last memory regions the data path used.
    pub(crate) mrs: crate::verbs::mr::MrCache,
}

pub(crate) struct QpInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) send_cq: Hold<CqInner>,
    pub(crate) recv_cq: Hold<CqInner>,
    pub(crate) srq: Option<Hold<SrqInner>>,
    pub(crate) qp_num: u32,
    /// Never reused: names the QP a type 2 memory window is bound to.
    pub(crate) uid: u64,
    pub(crate) qp_type: QpType,
    pub(crate) qp_context: u64,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: QpCap,
    pub(crate) state: Mutex<QpState_>,
    async_unacked: AtomicUsize,
    _count: CountGuard,
}

impl EventTarget for QpInner {
    fn unacked_events(&self) -> &AtomicUsize {
        &self.async_unacked
    }
}

impl Drop for Qp {
    /// A QP dropped without [`Qp::destroy`] first sends the ACK it may hold back for the
    /// program (see the engine's notes): the peer's SEND was delivered and must complete.
    fn drop(&mut self) {
        self.inner.release_held_ack();
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let res = &self.pd.shared().resources;
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.engine.take() {
            e.unregister(self.qp_num);
        }
        let engine = if st.mcast.is_empty() {
            None
        } else {
            self.pd.shared().engine_if_started()
        };
        for gid in st.mcast.drain(..) {
            res.mcast_detach(gid, self.qp_num);
            if let Some(e) = &engine {
                e.mcast_leave(&gid, self.qp_num);
            }
        }
        res.free_qpn(self.qp_num);
    }
}

static NEXT_QP_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn round_wr(req: u32, max: u32) -> u32 {
    req.max(1).next_power_of_two().min(max)
}

impl Pd {
    /// Creates a queue pair (`ibv_create_qp`) in RESET, writing the actual capabilities
    /// (at least those requested) back into `init_attr.cap`.
    ///
    /// Fails with `EOPNOTSUPP` for RAW_PACKET and XRC QPs; `EINVAL` for an SRQ on a QP that
    /// is not RC or UD, CQs or an SRQ of another device or PD, or a capability above the
    /// device's limits (`max_qp_wr`, `max_sge`, inline data); `ENOMEM` past `max_qp`.
    /// With an SRQ, `max_recv_wr` and `max_recv_sge` are ignored (and written back as 0).
    pub fn create_qp(&self, init_attr: &mut QpInitAttr<'_>) -> Result<Qp> {
        let shared = self.inner.shared().clone();
        let dev = &shared.attr;
        match init_attr.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            other => {
                return Err(Error::not_supported(format!(
                    "QP type {other:?} is not supported by the software device"
                )))
            }
        }
        if let Some(srq) = init_attr.srq {
            if !matches!(init_attr.qp_type, QpType::Rc | QpType::Ud) {
                return Err(Error::invalid(format!(
                    "an SRQ can only be used by RC and UD QPs, not {:?}",
                    init_attr.qp_type
                )));
            }
            if !Arc::ptr_eq(srq.inner.pd.arc(), &self.inner) {
                return Err(Error::invalid("the SRQ belongs to another PD"));
            }
        }
        for cq in [init_attr.send_cq, init_attr.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.ctx.shared, &shared) {
                return Err(Error::invalid("the CQ belongs to another device"));
            }
        }
        let c = init_attr.cap;
        let has_srq = init_attr.srq.is_some();
        let check = |what: &str, v: u32, max: u32| -> Result<()> {
            if v > max {
                Err(Error::invalid(format!(
                    "{what} {v} exceeds the device limit {max}"
                )))
            } else {
                Ok(())
            }
        };
        check("max_send_wr", c.max_send_wr, dev.max_qp_wr)?;
        check("max_send_sge", c.max_send_sge, dev.max_sge)?;
        check("max_inline_data", c.max_inline_data, dev.max_inline_data)?;
        if !has_srq {
            check("max_recv_wr", c.max_recv_wr, dev.max_qp_wr)?;
            check("max_recv_sge", c.max_recv_sge, dev.max_sge)?;
        }
        let cap = QpCap {
            max_send_wr: round_wr(c.max_send_wr, dev.max_qp_wr),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_wr: if has_srq {
                0
            } else {
                round_wr(c.max_recv_wr, dev.max_qp_wr)
            },
            max_recv_sge: if has_srq { 0 } else { c.max_recv_sge.max(1) },
            max_inline_data: if c.max_inline_data == 0 {
                0
            } else {
                c.max_inline_data
                    .div_ceil(64)
                    .saturating_mul(64)
                    .min(dev.max_inline_data)
            },
        };
        let count = Resources::acquire(&shared, Kind::Qp)?;
        let qp_num = shared.resources.alloc_qpn(shared.engine()?.slot())?;
        init_attr.cap = cap;
        let attr = QpAttr {
            cap,
            ..Default::default()
        };
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: Hold::new(&self.inner),
                send_cq: Hold::new(&init_attr.send_cq.inner),
                recv_cq: Hold::new(&init_attr.recv_cq.inner),
                srq: init_attr.srq.map(|s| Hold::new(&s.inner)),
                qp_num,
                uid: NEXT_QP_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                qp_type: init_attr.qp_type,
                qp_context: init_attr.qp_context,
                sq_sig_all: init_attr.sq_sig_all,
                cap,
                state: Mutex::new(QpState_ {
                    attr,
                    transport: None,
                    engine: None,
                    rq: VecDeque::new(),
                    ud_dests: HashMap::new(),
                    next_ud_dest: 1,
                    mcast: Vec::new(),
                    mrs: Default::default(),
                }),
                async_unacked: AtomicUsize::new(0),
                _count: count,
            }),
        })
    }
}

const QP_ACCESS_BITS: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits()
    | AccessFlags::REMOTE_ATOMIC.bits();

impl QpInner {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QpState_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flush_wc(&self, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode,
            qp_num: self.qp_num,
            ..Default::default()
        }
    }

    /// Completes every queued work request with `WR_FLUSH_ERR` (the SRQ, shared with other
    /// QPs, is left alone).
    fn flush(&self, st: &mut QpState_) {
        if let Some(t) = st.transport.as_mut() {
            t.set_error();
            while let Some(c) = t.poll_completion() {
                let cq = if c.is_recv {
                    &self.recv_cq
                } else {
                    &self.send_cq
                };
                cq.arc().push(
                    crate::verbs::datapath::to_wc(&c, self.qp_num, self.qp_type == QpType::Ud),
                    false,
                );
            }
        }
        st.ud_dests.clear();
        for w in st.rq.drain(..) {
            self.recv_cq
                .arc()
                .push(self.flush_wc(w.wr_id, WcOpcode::Recv), false);
        }
    }

    /// The transport configuration the QP's attributes describe.
    fn transport_config(&self, a: &QpAttr) -> tp::QpConfig {
        let mtu = if self.qp_type == QpType::Ud {
            self.pd.shared().device.active_mtu()
        } else {
            a.path_mtu
        };
        tp::QpConfig {
            qp_type: self.qp_type,
            qp_num: self.qp_num,
            dest_qp_num: a.dest_qp_num,
            path_mtu: mtu,
            sq_psn: a.sq_psn,
            rq_psn: a.rq_psn,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            qkey: a.qkey,
            access_flags: a.qp_access_flags,
            max_send_wr: self.cap.max_send_wr,
        }
    }

    pub(crate) fn raise(self: &Arc<Self>, ev: EventType) {
        self.pd.ctx.async_events.raise(
            ev,
            AsyncElement::Qp {
                qp_num: self.qp_num,
                qp_context: self.qp_context,
            },
            Some(self.clone() as Arc<dyn EventTarget>),
        );
    }
}

impl Qp {
    /// The QP number (`qp->qp_num`): 24 bits, unpredictable, unique on the device.
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num
    }

    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The current state (`qp->state`).
    pub fn state(&self) -> QpState {
        self.inner.lock().attr.qp_state
    }

    /// The `qp_context` given at creation.
    pub fn qp_context(&self) -> u64 {
        self.inner.qp_context
    }

    /// The actual capabilities.
    pub fn cap(&self) -> QpCap {
        self.inner.cap
    }

    /// Changes the QP's attributes and state (`ibv_modify_qp`), reading only the fields of
    /// `attr` named by `attr_mask` ([`QpAttrMask`] bits). All or nothing: on failure nothing
    /// changes.
    ///
    /// Moving to ERR completes every queued work request with `WR_FLUSH_ERR` (and, for a QP
    /// on an SRQ, raises `IBV_EVENT_QP_LAST_WQE_REACHED`); moving to RESET discards them
    /// without completions and forgets the attributes; RTS→SQD with `en_sqd_async_notify`
    /// raises `IBV_EVENT_SQ_DRAINED` once the send queue is idle.
    ///
    /// Fails with `EINVAL` for an invalid transition, a missing required or a forbidden
    /// attribute (the message names the transition and the bits), a `cur_qp_state` that is
    /// not the current state (RTS or SQD are accepted for a QP that moved to SQE unseen), or a value outside its range (port, P_Key index, address
    /// vector, RD atomic depths above the device's limits, 3- and 5-bit fields, access
    /// flags, a 24-bit QP number); `EOPNOTSUPP` for changing `cap`.
    pub fn modify_qp(&self, attr: &QpAttr, attr_mask: u32) -> Result<()> {
        let Some(mask) = QpAttrMask::from_bits(attr_mask) else {
            return Err(Error::invalid(format!(
                "unknown QP attribute mask bits {:#x}",
                attr_mask & !QpAttrMask::all().bits()
            )));
        };
        let inner = &self.inner;
        let shared = inner.pd.shared();
        let dev = &shared.attr;
        let mut st = inner.lock();
        let cur = st.attr.qp_state;
        let next = check_modify_qp(inner.qp_type, cur, mask, attr.qp_state, attr.cur_qp_state)
            .map_err(|e| Error::invalid(e.to_string()))?;

        // Values.
        let bad = |msg: String| Err(Error::invalid(msg));
        if mask.contains(QpAttrMask::PORT) && attr.port_num != PORT_NUM {
            return bad(format!(
                "port {} does not exist (the only port is 1)",
                attr.port_num
            ));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return bad(format!(
                "P_Key index {} is outside the table of 1 entry",
                attr.pkey_index
            ));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) && attr.qp_access_flags & !QP_ACCESS_BITS != 0 {
            return bad(format!(
                "qp_access_flags {:#x} has bits other than LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC",
                attr.qp_access_flags
            ));
        }
        if mask.contains(QpAttrMask::AV) {
            attr.ah_attr.validate(&shared.device)?;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            attr.alt_ah_attr.validate(&shared.device)?;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            let port_max = shared.device.active_mtu();
            if attr.path_mtu.bytes() > port_max.bytes() {
                return bad(format!(
                    "path MTU {} exceeds the port's active MTU {}",
                    attr.path_mtu.bytes(),
                    port_max.bytes()
                ));
            }
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return bad(format!("timeout {} is wider than 5 bits", attr.timeout));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return bad(format!(
                "min_rnr_timer {} is wider than 5 bits",
                attr.min_rnr_timer
            ));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return bad(format!("retry_cnt {} is wider than 3 bits", attr.retry_cnt));
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return bad(format!("rnr_retry {} is wider than 3 bits", attr.rnr_retry));
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && u32::from(attr.max_rd_atomic) > dev.max_qp_init_rd_atom
        {
            return bad(format!(
                "max_rd_atomic {} exceeds the device's max_qp_init_rd_atom {}",
                attr.max_rd_atomic, dev.max_qp_init_rd_atom
            ));
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > dev.max_qp_rd_atom
        {
            return bad(format!(
                "max_dest_rd_atomic {} exceeds the device's max_qp_rd_atom {}",
                attr.max_dest_rd_atomic, dev.max_qp_rd_atom
            ));
        }
        if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num > 0xff_ffff {
            return bad(format!(
                "dest_qp_num {:#x} is wider than 24 bits",
                attr.dest_qp_num
            ));
        }
        if mask.contains(QpAttrMask::CAP) && attr.cap != inner.cap {
            return Err(Error::not_supported(
                "resizing a QP's queues is not supported",
            ));
        }

        // Apply, all at once.
        // The device engine starts when the first QP of the device can receive.
        let engine = if next == QpState::Rtr && st.engine.is_none() {
            Some(shared.engine()?)
        } else {
            None
        };
        // An ACK held back for the program goes before the QP stops answering.
        let mut held_events = Vec::new();
        if matches!(next, QpState::Reset | QpState::Err) && next != cur {
            if let Some(e) = st.engine.clone() {
                held_events = crate::verbs::datapath::send_held_ack(&e, inner, &mut st);
            }
        }
        if next == QpState::Reset && cur != QpState::Reset {
            if let Some(e) = st.engine.take() {
                e.unregister(inner.qp_num);
            }
            st.transport = None;
            st.ud_dests.clear();
            st.rq.clear();
            st.attr = QpAttr {
                cap: inner.cap,
                ..Default::default()
            };
            return Ok(());
        }
        let a = &mut st.attr;
        if mask.contains(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            a.alt_ah_attr = attr.alt_ah_attr;
            a.alt_pkey_index = attr.alt_pkey_index;
            a.alt_port_num = attr.alt_port_num;
            a.alt_timeout = attr.alt_timeout;
        }
        if mask.contains(QpAttrMask::PATH_MIG_STATE) {
            a.path_mig_state = attr.path_mig_state;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xff_ffff;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xff_ffff;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if mask.contains(QpAttrMask::RATE_LIMIT) {
            a.rate_limit = attr.rate_limit;
        }
        a.qp_state = next;
        a.cur_qp_state = next;
        let notify_drained = next == QpState::Sqd && cur == QpState::Rts && a.en_sqd_async_notify;
        let cfg = inner.transport_config(a);
        if let Some(e) = engine {
            st.transport = Some(tp::Qp::new(cfg));
            e.register(
                inner.qp_num,
                Arc::downgrade(inner) as std::sync::Weak<dyn crate::provider::QpPort>,
            );
            st.engine = Some(e);
        } else if let Some(t) = st.transport.as_mut() {
            t.set_config(cfg);
        }
        if next == QpState::Err && cur != QpState::Err {
            inner.flush(&mut st);
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
            if inner.srq.is_some() {
                inner.raise(EventType::QpLastWqeReached);
            }
        } else if notify_drained {
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
            inner.raise(EventType::SqDrained);
        } else {
            drop(st);
            for e in held_events {
                inner.raise(e);
            }
        }
        Ok(())
    }

    /// The QP's current attributes and creation attributes (`ibv_query_qp`). The mask of
    /// verbs is only a hint, so every field is filled; values never set read as their
    /// defaults.
    pub fn query_qp(&self) -> Result<(QpAttr, QpInitInfo)> {
        let st = self.inner.lock();
        let i = &self.inner;
        Ok((
            st.attr,
            QpInitInfo {
                qp_context: i.qp_context,
                cap: i.cap,
                qp_type: i.qp_type,
                sq_sig_all: i.sq_sig_all,
                has_srq: i.srq.is_some(),
            },
        ))
    }

    /// The QP's transport counters: packets and bytes each way, retransmitted packets and
    /// go-back-N retries, retransmit timeouts, ACKs, NAKs by kind (PSN sequence, RNR, and
    /// the error NAKs: invalid request, remote access, remote operational), duplicate
    /// requests, READ/atomic replays, out-of-sequence and malformed packets, Q_Key
    /// violations and drops for want of a receive request. See [`crate::QpCounters`] for each.
    ///
    /// They count from the QP's move to RTR (all zero before) and only grow, through ERR
    /// too; a move to RESET starts them again from zero. Packets the device drops before
    /// they reach a QP (bad ICRC, unknown QP, wrong source) are in
    /// [`crate::Context::counters`] instead.
    ///
    /// ```
    /// # use softrdma::*;
    /// // A loopback device address of this run's own (see `softrdma::testing`).
    /// let addr = softrdma::testing::unique_loopback_addr().into();
    /// let ctx = Device::from_addr(addr).unwrap().open().unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let cq = ctx.create_cq(4, 0, None, 0).unwrap();
    /// let qp = pd
    ///     .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, QpCap::default()))
    ///     .unwrap();
    /// assert_eq!(qp.counters(), QpCounters::default());
    /// ```
    pub fn counters(&self) -> crate::QpCounters {
        self.inner
            .lock()
            .transport
            .as_ref()
            .map(|t| *t.stats())
            .unwrap_or_default()
    }

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
    pub fn bind_mw(&self, mw: &crate::Mw, bind: &crate::MwBind<'_>) -> Result<u32> {
        let info = &bind.bind_info;
        if mw.mw_type() != crate::MwType::Type1 {
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
        let rkey = crate::verbs::mw::inc_rkey(mw.rkey());
        let wr = SendWr {
            wr_id: bind.wr_id,
            opcode: WrOpcode::BindMw,
            send_flags: bind.send_flags,
            bind_mw: Some(crate::BindMwWr {
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
        let mut st = inner.lock();
        let mut result = Ok(());
        let mut posted = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { bad_wr: i, error };
            let state = st.attr.qp_state;
            if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
                result = Err(fail(Error::invalid(format!(
                    "cannot post sends to a QP in {state:?}"
                ))));
                break;
            }
            let (mut req, ah) = match self.check_send(wr, raw_inline) {
                Ok(x) => x,
                Err(e) => {
                    result = Err(fail(e));
                    break;
                }
            };
            if state == QpState::Err || st.transport.is_none() {
                inner
                    .send_cq
                    .arc()
                    .push(inner.flush_wc(wr.wr_id, wr.opcode.wc_opcode()), false);
                continue;
            }
            // A UD message longer than the path MTU completes without a packet (as rxe does,
            // IBA C10-93.1.1): it needs no destination entry.
            let oversize = inner.qp_type == QpType::Ud
                && req.length() > u64::from(inner.pd.shared().device.active_mtu().bytes());
            let ah = if oversize { None } else { ah };
            let handle = ah.map(|ah| {
                let h = st.next_ud_dest;
                st.next_ud_dest += 1;
                st.ud_dests.insert(h, ah);
                h
            });
            if let (Some(h), Some(ud)) = (handle, req.ud.as_mut()) {
                ud.dest = h;
            }
            let t = st.transport.as_mut().expect("checked above");
            if t.post_send(req).is_err() {
                if let Some(h) = handle {
                    st.ud_dests.remove(&h);
                }
                result = Err(fail(Error::no_memory(format!(
                    "the send queue is full ({} requests)",
                    inner.cap.max_send_wr
                ))));
                break;
            }
            if let (WrOpcode::BindMw, Some(b)) = (wr.opcode, &wr.bind_mw) {
                b.mw.set_posted_rkey((b.mw.inner.index << 8) | (b.rkey & 0xff));
            }
            posted += 1;
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
        let defer = st.transport.as_ref().is_some_and(|t| {
            let unsent = t.unsent_requests();
            let flush = t.knows_credits()
                && unsent / DOORBELL_FLUSH != unsent.saturating_sub(posted) / DOORBELL_FLUSH;
            t.awaiting_ack() && posted < DOORBELL_BATCH && !flush
        });
        if posted > 0 && !defer {
            if let Some(engine) = st.engine.clone() {
                let events = drive_and_send(&engine, inner, &mut st);
                drop(st);
                for e in events {
                    inner.raise(e);
                }
            }
        }
        result
    }

    fn check_send(
        &self,
        wr: &SendWr<'_>,
        raw_inline: bool,
    ) -> Result<(tp::SendRequest, Option<Arc<AhInner>>)> {
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
        let mut inline = None;
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
            inline = Some(if raw_inline {
                raw_inline_copy(wr.sg_list, length as usize)
            } else {
                self.copy_inline(wr.sg_list, length as usize)?
            });
        }
        if wr.opcode.is_atomic() {
            if wr.sg_list.len() != 1 || length != 8 {
                return Err(Error::invalid(
                    "an atomic needs exactly one 8-byte scatter/gather entry",
                ));
            }
            if wr.remote_addr % 8 != 0 {
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
            Some(a) if a.attr.grh.dgid.is_multicast() => crate::verbs::resources::MULTICAST_QPN,
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
        let req = tp::SendRequest {
            wr_id: wr.wr_id,
            op,
            sges: if local {
                tp::SgList::new()
            } else {
                wr.sg_list.iter().map(|s| s.to_transport()).collect()
            },
            inline: if local { None } else { inline },
            signaled: inner.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED),
            solicited: wr.send_flags.contains(SendFlags::SOLICITED),
            fence: wr.send_flags.contains(SendFlags::FENCE),
            ud: ah.as_ref().map(|_| tp::UdDest {
                dest: 0,
                remote_qpn,
                remote_qkey: wr.remote_qkey,
            }),
        };
        Ok((req, ah))
    }

    /// Copies the data of an INLINE send out of registered memory. Unlike rdma-core, which
    /// reads any address it is given and ignores the lkey, softrdma requires inline entries
    /// to lie inside a memory region of the QP's PD: that is what keeps the faithful face
    /// memory-safe.
    fn copy_inline(&self, sges: &[Sge], length: usize) -> Result<tp::InlineData> {
        let res = &self.inner.pd.shared().resources;
        let mut data = tp::InlineData::zeroed(length);
        let mut at = 0;
        for s in sges {
            let lease = res
                .check_access(
                    s.lkey,
                    KeyKind::Local,
                    self.inner.pd.arc(),
                    s.addr,
                    u64::from(s.length),
                    AccessFlags::empty(),
                    false,
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
        Ok(data)
    }

    /// Posts receive work requests (`ibv_post_recv`), in order, stopping at the first that
    /// cannot be posted. Allowed from INIT on; in ERR, requests are completed at once with
    /// `WR_FLUSH_ERR`.
    ///
    /// Fails, naming the index of that request, with `EINVAL` when the QP is in RESET or
    /// uses an SRQ (post to the SRQ instead), or a request has more than `max_recv_sge`
    /// entries; `ENOMEM` when the receive queue is full.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let inner = &self.inner;
        let mut st = inner.lock();
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { bad_wr: i, error };
            if inner.srq.is_some() {
                return Err(fail(Error::invalid(
                    "the QP takes its receives from an SRQ: use post_srq_recv",
                )));
            }
            let state = st.attr.qp_state;
            if state == QpState::Reset {
                return Err(fail(Error::invalid(
                    "cannot post receives to a QP in RESET",
                )));
            }
            check_sges(wr.sg_list, inner.cap.max_recv_sge, "max_recv_sge").map_err(fail)?;
            if state == QpState::Err {
                inner
                    .recv_cq
                    .arc()
                    .push(inner.flush_wc(wr.wr_id, WcOpcode::Recv), false);
                continue;
            }
            if st.rq.len() >= inner.cap.max_recv_wr as usize {
                return Err(fail(Error::no_memory(format!(
                    "the receive queue is full ({} requests)",
                    inner.cap.max_recv_wr
                ))));
            }
            st.rq.push_back(recv_wqe(wr));
        }
        // An RC requester may be waiting for the credits these receives make: tell it.
        let available = st.rq.len() as u32;
        let update = st
            .transport
            .as_mut()
            .is_some_and(|t| t.recv_posted(available));
        if update {
            if let Some(engine) = st.engine.clone() {
                let events = drive_and_send(&engine, inner, &mut st);
                drop(st);
                for e in events {
                    inner.raise(e);
                }
            }
        }
        Ok(())
    }

    /// Attaches the (UD) QP to the multicast group `gid` (`ibv_attach_mcast`); `lid` is
    /// ignored on RoCE. Attaching twice is allowed and still delivers one copy per message.
    ///
    /// The first QP of the device attached to a group makes the device join the IP group
    /// (starting the device engine if needed): from then on every UD SEND to the group that
    /// reaches this host — from this device, another device of this process or another
    /// process — is delivered to every attached QP of the device that is in RTR or later and
    /// whose Q_Key matches the DETH's, each copy taking a receive request of its own, except
    /// to the QP that sent it. A group of the other IP family than the device's address is
    /// recorded but receives nothing.
    ///
    /// Fails, changing nothing, with `EINVAL` for a QP that is not UD or a GID that is not
    /// multicast (IPv6 `ff00::/8` or IPv4-mapped 224.0.0.0/4); `ENOMEM` when the group already
    /// has the device's `max_mcast_qp_attach` QPs or the device its `max_mcast_grp` groups;
    /// `EADDRINUSE` when the device engine has to start and another process owns UDP port
    /// 4791 on the device address; and with the socket error when the IP group cannot be
    /// joined (say `ENOBUFS` past the kernel's `igmp_max_memberships`).
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::invalid(format!(
                "only UD QPs can join multicast groups, not {:?}",
                self.inner.qp_type
            )));
        }
        if !gid.is_multicast() {
            return Err(Error::invalid(format!("{gid} is not a multicast GID")));
        }
        let mut st = self.inner.lock();
        if st.mcast.contains(gid) {
            return Ok(());
        }
        let shared = self.inner.pd.shared();
        let qpn = self.inner.qp_num;
        shared.resources.mcast_attach(*gid, qpn, &shared.attr)?;
        // The QP's lock is held until the group is in its list: a datagram the new socket
        // receives meanwhile waits for it, then finds the QP attached.
        if let Err(e) = shared.engine().and_then(|e| e.mcast_join(gid, qpn)) {
            shared.resources.mcast_detach(*gid, qpn);
            return Err(e);
        }
        st.mcast.push(*gid);
        Ok(())
    }

    /// Detaches the QP from the multicast group `gid` (`ibv_detach_mcast`): once this returns
    /// the QP receives nothing more sent to the group. The last QP of the device to detach
    /// makes the device leave the IP group and close its socket for it.
    ///
    /// Fails with `EINVAL` when the QP is not attached to that group.
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let mut st = self.inner.lock();
        let Some(pos) = st.mcast.iter().position(|g| g == gid) else {
            return Err(Error::invalid(format!(
                "the QP is not attached to the multicast group {gid}"
            )));
        };
        st.mcast.swap_remove(pos);
        let shared = self.inner.pd.shared();
        shared.resources.mcast_detach(*gid, self.inner.qp_num);
        if let Some(e) = shared.engine_if_started() {
            e.mcast_leave(gid, self.inner.qp_num);
        }
        Ok(())
    }

    /// Destroys the QP (`ibv_destroy_qp`); queued work requests are discarded without
    /// completions.
    ///
    /// Fails with `EBUSY`, giving the QP back, while it is attached to a multicast group or
    /// an asynchronous event about it is not acknowledged.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<Qp>> {
        let groups = self.inner.lock().mcast.len();
        let events = self.inner.async_unacked.load(Ordering::Acquire);
        let why = if groups != 0 {
            format!("the QP is attached to {groups} multicast group(s)")
        } else if events != 0 {
            format!("{events} asynchronous event(s) about the QP are not acknowledged")
        } else {
            self.inner
                .pd
                .ctx
                .async_events
                .discard(&self.inner.async_unacked);
            // As ibv_destroy_qp returns only once the device is done with the QP: take it off
            // the engine, then wait for the engine thread to let go of a reference it may be
            // using right now (packet or timer processing; never long), so that the QP's
            // hold on its CQs, SRQ and PD is gone when this returns and they can be destroyed.
            // An ACK held back for the program goes first.
            self.inner.release_held_ack();
            let engine = self.inner.lock().engine.take();
            if let Some(e) = engine {
                e.unregister(self.inner.qp_num);
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while Arc::strong_count(&self.inner) > 1 && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            return Ok(());
        };
        Err(DestroyError {
            object: self,
            error: Error::new(ErrorKind::Busy, why),
        })
    }
}

/// Copies inline data from the entries' addresses (see [`Qp::post_send_raw_inline`]).
fn raw_inline_copy(sges: &[Sge], length: usize) -> tp::InlineData {
    let mut data = tp::InlineData::zeroed(length);
    let mut at = 0;
    for s in sges {
        let n = s.length as usize;
        // SAFETY: the caller of post_send_raw_inline promised n readable bytes at addr.
        let src = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, n) };
        data[at..at + n].copy_from_slice(src);
        at += n;
    }
    data
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &format_args!("{:#08x}", self.inner.qp_num))
            .field("qp_type", &self.inner.qp_type)
            .field("state", &self.state())
            .finish()
    }
}
