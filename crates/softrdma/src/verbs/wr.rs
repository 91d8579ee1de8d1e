//! The parts of work requests that memory regions and windows name too: scatter/gather
//! entries (`struct ibv_sge`), send opcodes and flags, the check of an entry count, and the
//! error of a post that stopped at a request.

use crate::error::{Error, Result};
use crate::verbs::cq::WcOpcode;
use softrdma_proto::transport as tp;
use softrdma_proto::QpType;

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
    /// [`crate::SendWr::imm_data`] (RC, UC).
    LocalInv = 7,
    /// `IBV_WR_BIND_MW`: binds the memory window of [`crate::SendWr::bind_mw`] (RC, UC).
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

    pub(crate) fn is_atomic(self) -> bool {
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

impl Sge {
    /// The same entry as the transport's [`tp::Sge`].
    pub(crate) fn to_transport(self) -> tp::Sge {
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
