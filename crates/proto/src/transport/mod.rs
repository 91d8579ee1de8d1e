//! The InfiniBand transport of one queue pair, sans IO: RC (requester, completer and
//! responder, as rxe splits them), UC and UD.
//!
//! A [`Qp`] is driven by its owner (softrdma's device engine, or a simulated network in the
//! tests) with four kinds of input — posted send requests ([`Qp::post_send`]), arriving packets
//! ([`Qp::handle_packet`]), the passing of time ([`Qp::handle_timeout`]) and state changes
//! ([`Qp::set_error`]) — and yields packets to send ([`Qp::poll_transmit`]), work completions
//! ([`Qp::poll_completion`]), asynchronous events ([`Qp::poll_event`]) and the next deadline
//! ([`Qp::poll_timeout`]). It never reads a clock, opens a socket or spawns a thread: the
//! same inputs give the same outputs.
//!
//! Memory is reached through the [`Env`] the owner passes in, which names registered memory
//! by lkey/rkey and performs the access checks (key, PD, bounds, access flags) in one place;
//! receive requests are taken from the owner too ([`Env::take_recv`]), so the receive queue
//! can be the QP's own or a shared one.

mod ctx;
mod inline;
mod io;
mod qp;
mod requester;
mod responder;
mod sendq;
mod sglist;
mod stats;

pub use inline::{InlineData, INLINE_IN_PLACE};
pub use qp::Qp;
pub use sglist::{SgList, Sge, SG_INLINE};
pub use stats::QpStats;

use crate::mtu::Mtu;
use crate::qp::QpType;

/// What a send request does, with the operands of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data (host-order value; goes on the wire big-endian).
    SendWithImm(u32),
    /// SEND that invalidates `rkey` at the responder.
    SendWithInv(u32),
    /// RDMA WRITE to `remote_addr` under `rkey`.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data (consumes a receive request at the responder).
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ of the gather list's total length from `remote_addr`.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare-and-swap at `remote_addr` (8-byte aligned); the original value lands
    /// in the single 8-byte local entry.
    CmpAndSwp {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store if equal.
        swap: u64,
    },
    /// 64-bit fetch-and-add at `remote_addr` (8-byte aligned).
    FetchAndAdd {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
    /// Bind a memory window (`IBV_WR_BIND_MW`, and `ibv_bind_mw` for type 1): a local
    /// operation, carried out by the owner ([`Env::bind_mw`]) when the request reaches the
    /// head of the send queue, completing in order with `IBV_WC_BIND_MW`.
    BindMw(MwBind),
    /// Invalidate `rkey` locally (`IBV_WR_LOCAL_INV`): a local operation carried out by the
    /// owner ([`Env::local_invalidate`]), completing in order with `IBV_WC_LOCAL_INV`.
    LocalInv(u32),
}

/// The operands of a memory window bind ([`SendOp::BindMw`]), as the owner interprets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwBind {
    /// The owner's handle of the window.
    pub mw: u64,
    /// The rkey asked for (the window keeps its index; the low 8 bits are the new key).
    pub rkey: u32,
    /// The local key of the memory region to bind to (unused when `length` is 0).
    pub lkey: u32,
    /// The first address of the window, in the region's address space.
    pub addr: u64,
    /// The window's length (0 unbinds a type 1 window).
    pub length: u64,
    /// `ibv_access_flags` of the window (REMOTE_READ/WRITE/ATOMIC, ZERO_BASED).
    pub access: u32,
}

/// Where a UD send goes. `dest` is an opaque handle of the owner's (an address handle); it
/// comes back in [`Transmit::ud_dest`] so the owner knows where to send the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The owner's handle of the destination address.
    pub dest: u64,
    /// The destination QP number.
    pub remote_qpn: u32,
    /// The Q_Key to put in the DETH (a value with the top bit set means "use the QP's own
    /// Q_Key", the privileged-Q_Key rule).
    pub remote_qkey: u32,
}

impl SendOp {
    /// The opcode of the work completion of a request with this operation
    /// (`IBV_WC_SEND` for every SEND, `IBV_WC_RDMA_WRITE` for every WRITE, ...). Never fails.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::CmpAndSwp { .. } => WcOpcode::CompSwap,
            SendOp::FetchAndAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
        }
    }
}

/// A posted send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The local memory: gathered for SEND/WRITE, scattered into for READ and atomics (held
    /// in place up to [`SG_INLINE`] entries).
    pub sges: SgList,
    /// Data copied at post time (`IBV_SEND_INLINE`; held in place up to
    /// [`INLINE_IN_PLACE`] bytes); when present, `sges` is not read.
    pub inline: Option<InlineData>,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
    /// Ask for a solicited event at the receiver.
    pub solicited: bool,
    /// Wait for earlier READs and atomics before starting (`IBV_SEND_FENCE`).
    pub fence: bool,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest>,
}

/// Why [`Qp::post_send_with`] queued nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostSendError<E> {
    /// `max_send_wr` requests are outstanding (the fill function was not called).
    QueueFull,
    /// The fill function failed with this error.
    Rejected(E),
}

impl Default for SendRequest {
    /// A blank request: a SEND of nothing with `wr_id` 0, unsignaled, no flags.
    fn default() -> SendRequest {
        SendRequest {
            wr_id: 0,
            op: SendOp::Send,
            sges: SgList::new(),
            inline: None,
            signaled: false,
            solicited: false,
            fence: false,
            ud: None,
        }
    }
}

impl SendRequest {
    /// Total message length: the inline data's or the gather list's.
    pub fn length(&self) -> u64 {
        match &self.inline {
            Some(d) => d.len() as u64,
            None => self.sges.total_length(),
        }
    }
}

/// A receive work request, as the owner hands it over from a receive queue or SRQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where received data goes (held in place up to [`SG_INLINE`] entries).
    pub sges: SgList,
}

/// `enum ibv_wc_status`, with the verbs numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message was longer than the receive buffer (or than the
    /// device allows).
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error (e.g. a UD send larger than
    /// the path MTU).
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR`.
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: a local key, PD, bounds or access check failed.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP entered ERR before the request was done.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: the responder answered with the wrong kind of packet.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: a protection error on data the peer sent.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid (too long for its
    /// receive buffer, unsupported opcode, …).
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the responder refused the rkey, bounds or access.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no acknowledgement after `retry_cnt` retransmissions.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the responder had no receive posted after `rnr_retry`
    /// tries.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`.
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR`.
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR`.
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr = 21,
}

impl WcStatus {
    /// A short description (`ibv_wc_status_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum ibv_wc_opcode`, with the verbs numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    #[default]
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv = 6,
    /// `IBV_WC_RECV`: a receive request consumed by a SEND.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive request consumed by an RDMA WRITE with
    /// immediate.
    RecvRdmaWithImm = 129,
}

/// A work completion produced by the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes received (UD: including the 40-byte GRH area), read or written.
    pub byte_len: u32,
    /// Immediate data of a SEND/WRITE with immediate (host order).
    pub imm_data: Option<u32>,
    /// The rkey a SEND with invalidate named.
    pub invalidated_rkey: Option<u32>,
    /// UD receives: the sender's QP number.
    pub src_qp: u32,
    /// Whether the completion belongs to the receive queue (else the send queue).
    pub is_recv: bool,
    /// Whether the message that produced a receive completion asked for a solicited event.
    pub solicited: bool,
}

/// An asynchronous event about the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// `IBV_EVENT_COMM_EST`: the first request arrived while the QP was in RTR.
    CommEst,
    /// `IBV_EVENT_QP_FATAL`: the QP went to ERR on its own.
    Fatal,
    /// `IBV_EVENT_QP_REQ_ERR`: an invalid request arrived; the QP went to ERR.
    ReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`: a remote access violation; the QP went to ERR.
    AccessErr,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
}

/// Why an access to registered memory was refused; see [`Env`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No region has that key, or it belongs to another PD.
    InvalidKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region lacks the access flag the operation needs.
    AccessDenied,
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned,
}

/// The atomic operation of [`Env::atomic_remote`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Compare-and-swap.
    CmpAndSwp {
        /// Compared with the current value.
        compare: u64,
        /// Stored if equal.
        swap: u64,
    },
    /// Fetch-and-add.
    FetchAndAdd {
        /// Added.
        add: u64,
    },
}

/// The owner's side of a [`Qp`]: registered memory and receive requests.
///
/// Every method checks the key, the QP's PD, the bounds and the access flags; the transport
/// turns refusals into the statuses and NAKs of the specification (local key →
/// `LOC_PROT_ERR`; remote key → remote-access NAK → `REM_ACCESS_ERR` at the requester).
pub trait Env {
    /// Copies `dst.len()` bytes from local memory at `sge.addr + offset` (no access flag
    /// needed to read local memory).
    fn read_local(&mut self, sge: &Sge, offset: u32, dst: &mut [u8]) -> Result<(), AccessError>;
    /// Copies `src` into local memory at `sge.addr + offset` (needs LOCAL_WRITE).
    fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError>;
    /// Checks that `rkey` allows `len` bytes at `va` with `remote_write` / READ access, before
    /// a WRITE or READ starts (len 0 always passes).
    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> Result<(), AccessError>;
    /// Copies `src` into remote-accessible memory at `va` under `rkey` (REMOTE_WRITE).
    fn write_remote(&mut self, rkey: u32, va: u64, src: &[u8]) -> Result<(), AccessError>;
    /// Copies remote-accessible memory at `va` under `rkey` into `dst` (REMOTE_READ).
    fn read_remote(&mut self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), AccessError>;
    /// Performs an atomic on the 8-byte word at `va` under `rkey` (REMOTE_ATOMIC), atomically
    /// with respect to every other atomic of the device, and returns the original value.
    fn atomic_remote(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError>;
    /// Carries out a memory window bind that reached the head of the send queue; the error
    /// is the status the request completes with (`MW_BIND_ERR`), after which the QP goes to
    /// ERR. The default refuses every bind.
    fn bind_mw(&mut self, bind: &MwBind) -> Result<(), WcStatus> {
        let _ = bind;
        Err(WcStatus::MwBindErr)
    }
    /// Invalidates `rkey` for a LOCAL_INV request that reached the head of the send queue;
    /// the error is the status the request completes with. The default refuses.
    fn local_invalidate(&mut self, rkey: u32) -> Result<(), WcStatus> {
        let _ = rkey;
        Err(WcStatus::LocQpOpErr)
    }
    /// Invalidates `rkey` for an arriving SEND with invalidate; an error makes the responder
    /// NAK the SEND as an invalid request (`REM_INV_REQ_ERR` on both sides). The default
    /// refuses.
    fn remote_invalidate(&mut self, rkey: u32) -> Result<(), AccessError> {
        let _ = rkey;
        Err(AccessError::InvalidKey)
    }
    /// Takes the next receive request of the QP's receive queue or SRQ, if any.
    fn take_recv(&mut self) -> Option<RecvRequest>;
    /// Receive requests posted to the QP's own receive queue and not yet consumed: the
    /// end-to-end credits an RC responder advertises in its ACKs (IBA 9.7.7.2), so that the
    /// requester does not start more SENDs than there are receives and answer RNR. `None`
    /// (the default) when the QP cannot say, as on a shared receive queue, which the spec
    /// makes advertise "no credit information".
    fn recv_available(&self) -> Option<u32> {
        None
    }
}

/// The connection-level attributes of a QP, as `ibv_modify_qp` sets them by the time it
/// reaches RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// The transport service (RC, UC or UD).
    pub qp_type: QpType,
    /// This QP's number.
    pub qp_num: u32,
    /// The peer's QP number (RC, UC).
    pub dest_qp_num: u32,
    /// Path MTU (RC, UC; UD uses it as the message limit).
    pub path_mtu: Mtu,
    /// First PSN the requester sends.
    pub sq_psn: u32,
    /// First PSN the responder expects.
    pub rq_psn: u32,
    /// Local ACK timeout exponent (0 = no timer).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR`: verbs gives 0..=7 (7 is seven retries, not
    /// infinite); the sans-IO transport takes any count (simulations use more).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this QP may have.
    pub max_rd_atomic: u8,
    /// READ/atomic responder resources.
    pub max_dest_rd_atomic: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// What peers may do: REMOTE_WRITE (2), REMOTE_READ (4), REMOTE_ATOMIC (8) bits.
    pub access_flags: u32,
    /// Most outstanding send requests.
    pub max_send_wr: u32,
}

/// A packet the transport wants sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written at the start of the buffer: BTH through pad, with 4 more bytes reserved
    /// for the ICRC (which the owner computes over the IP and UDP headers it adds).
    pub len: usize,
    /// For UD, the destination handle of the send request; `None` for RC/UC (the connected
    /// peer).
    pub ud_dest: Option<u64>,
}

/// What the owner knows of an arriving packet besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// The 40-byte GRH area for UD receives: 20 zero bytes and the IPv4 header, or the IPv6
    /// header.
    pub grh: [u8; 40],
}

#[cfg(test)]
mod tests;
