//! Sans-IO state machines of softrdma: the InfiniBand transport (RC, UC, UD) and the
//! connection manager, driven by packets, posted work and the current time, with no sockets,
//! threads or clock reads of their own.
//!
//! Modules:
//! * [`qp`]: QP types and states, the `ibv_modify_qp` attribute mask and the state-transition
//!   table ([`check_modify`]);
//! * [`psn`]: 24-bit packet sequence numbers with circular comparison;
//! * [`mtu`]: IB path MTU and its derivation from the link MTU;
//! * [`timer`]: IBA time encodings (ACK timeout, RNR timer, CM timeouts);
//! * [`transport`]: the RC/UC/UD transport of one QP (requester, completer, responder);
//! * [`cm`]: the IB connection manager (REQ/REP/RTU, DREQ/DREP, REJ, MRA, SIDR) of a device;
//! * [`device`]: one RoCEv2 device between a UDP socket and its QPs: ICRC checks and seals,
//!   routing by QP number, QP 1 framing, timers per QP and the held-ACK policy.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod device;
pub mod mtu;
pub mod psn;
pub mod qp;
pub mod timer;
pub mod transport;

pub use mtu::Mtu;
pub use psn::{cmp_psn, Psn, MAX_PSN};
pub use qp::{
    check_modify, check_modify_qp, next_state, AttrRule, ModifyQpError, QpAttrMask, QpState,
    QpType, Transition, TRANSITIONS,
};
pub use timer::{cm_timeout, cm_timeout_ms_linux, local_ack_timeout, rnr_timer, RNR_TIMER_USEC};
