//! The QP's attribute structs: its queue sizes (`struct ibv_qp_cap`), what creation takes
//! (`struct ibv_qp_init_attr`), what `ibv_modify_qp` and `ibv_query_qp` exchange
//! (`struct ibv_qp_attr`) and what a query reports of the creation.

use crate::verbs::ah::AhAttr;
use crate::verbs::cq::Cq;
use crate::verbs::srq::Srq;
use softrdma_proto::{Mtu, QpState, QpType};

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

/// `struct ibv_qp_init_attr`: what [`crate::Pd::create_qp`] takes. The actual capabilities are
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

/// `struct ibv_qp_attr`: QP attributes, for [`crate::Qp::modify_qp`] (only the fields named by the
/// mask are read) and [`crate::Qp::query_qp`].
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
    /// ([`crate::AccessFlags`] bits).
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

/// What [`crate::Qp::query_qp`] reports of the creation attributes (`struct ibv_qp_init_attr`
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
