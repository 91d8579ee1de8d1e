//! Queue-pair types, states, the `ibv_modify_qp` attribute mask and the IBTA QP state-transition
//! table that decides which attributes a modify call must and may carry.
//!
//! The table ([`TRANSITIONS`]) is held as plain data: one [`Transition`] row per valid
//! `(current state, next state)` pair, each with a required and an optional attribute mask per
//! [`QpType`]. It has the same meaning as the Linux kernel's `ib_modify_qp_is_ok` (which every
//! kernel provider, rxe included, runs before touching a QP), written out independently here with
//! [`QpAttrMask::STATE`] made explicit:
//!
//! * a row whose states differ **requires** `STATE` (without `STATE` in the mask `ibv_modify_qp`
//!   does not change the state at all);
//! * a row from a state to itself (`RESET->RESET`, `INIT->INIT`, `RTS->RTS`, `SQD->SQD`,
//!   `ERR->ERR`) lists `STATE` as **optional**; a modify whose mask lacks `STATE` is checked as
//!   exactly such a row (see [`next_state`]). Note `RTR->RTR` and `SQE->SQE` are not rows, so
//!   any modify of an RTR or SQE QP that does not change its state fails, even an empty mask.
//!
//! `RESET->ERR` is **not** a valid transition (the kernel table has no such row), although every
//! other state may move to ERR; every state, RESET included, may move to RESET.
//!
//! Every error of this module is reported to applications as `EINVAL` ([`ModifyQpError::errno`]),
//! as `ibv_modify_qp` does for an invalid state/attribute combination.

use core::fmt;

use QpState::{
    Err as ERR, Init as INIT, Reset as RESET, Rtr as RTR, Rts as RTS, Sqd as SQD, Sqe as SQE,
};

/// `EINVAL` on Linux: the errno every [`ModifyQpError`] maps to.
pub const EINVAL: i32 = 22;

/// Transport service type of a QP (`enum ibv_qp_type`), with the ibverbs numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpType {
    /// `IBV_QPT_RC` (2): reliable connected.
    Rc = 2,
    /// `IBV_QPT_UC` (3): unreliable connected.
    Uc = 3,
    /// `IBV_QPT_UD` (4): unreliable datagram.
    Ud = 4,
    /// `IBV_QPT_RAW_PACKET` (8): raw Ethernet packets.
    RawPacket = 8,
    /// `IBV_QPT_XRC_SEND` (9): XRC initiator (the kernel's `IB_QPT_XRC_INI`).
    XrcSend = 9,
    /// `IBV_QPT_XRC_RECV` (10): XRC target (the kernel's `IB_QPT_XRC_TGT`).
    XrcRecv = 10,
}

impl QpType {
    /// Every QP type, in ibverbs numeric order.
    pub const ALL: [QpType; 6] = [
        QpType::Rc,
        QpType::Uc,
        QpType::Ud,
        QpType::RawPacket,
        QpType::XrcSend,
        QpType::XrcRecv,
    ];

    /// Converts an `ibv_qp_type` value; returns `None` for any value that is not one of the six
    /// types above (e.g. `IBV_QPT_DRIVER` = 0xff, which this device does not implement).
    pub const fn from_raw(raw: u32) -> Option<QpType> {
        match raw {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            8 => Some(QpType::RawPacket),
            9 => Some(QpType::XrcSend),
            10 => Some(QpType::XrcRecv),
            _ => None,
        }
    }

    /// The `ibv_qp_type` numeric value. Never fails.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// The ibverbs name without the `IBV_QPT_` prefix (`"RC"`, `"RAW_PACKET"`, ...). Never fails.
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::RawPacket => "RAW_PACKET",
            QpType::XrcSend => "XRC_SEND",
            QpType::XrcRecv => "XRC_RECV",
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// State of a QP (`enum ibv_qp_state`), with the ibverbs numeric values 0..=6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// `IBV_QPS_RESET` (0): initial state of a new QP; all queued work dropped.
    Reset = 0,
    /// `IBV_QPS_INIT` (1): receives may be posted, nothing is processed.
    Init = 1,
    /// `IBV_QPS_RTR` (2): ready to receive.
    Rtr = 2,
    /// `IBV_QPS_RTS` (3): ready to send.
    Rts = 3,
    /// `IBV_QPS_SQD` (4): send queue drain(ing/ed).
    Sqd = 4,
    /// `IBV_QPS_SQE` (5): send queue error (UD/UC only).
    Sqe = 5,
    /// `IBV_QPS_ERR` (6): error; outstanding work is flushed.
    Err = 6,
}

impl QpState {
    /// Every state, in ibverbs numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// Converts an `ibv_qp_state` value; returns `None` for values above 6 (including
    /// `IBV_QPS_UNKNOWN` = 7, which is never a valid state to request).
    pub const fn from_raw(raw: u32) -> Option<QpState> {
        match raw {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// The `ibv_qp_state` numeric value. Never fails.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// The ibverbs name without the `IBV_QPS_` prefix (`"RESET"`, `"RTR"`, ...). Never fails.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

bitflags::bitflags! {
    /// The `attr_mask` of `ibv_modify_qp` (`enum ibv_qp_attr_mask`), bit for bit.
    ///
    /// Bits 21..=24 were kernel-internal (SMAC/VID) and never exposed by libibverbs; they have no
    /// name here. Build a mask from an application's raw value with
    /// [`QpAttrMask::from_bits_retain`] so that unknown bits survive and are reported as
    /// "not allowed" by [`check_modify`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: `qp_state` is valid (move to that state).
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`: `cur_qp_state` is valid (assume the QP is in that state).
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `en_sqd_async_notify` is valid.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`: `qp_access_flags` is valid.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`: `pkey_index` is valid.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`: `port_num` is valid.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`: `qkey` is valid.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: `ah_attr` (primary path address vector) is valid.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`: `path_mtu` is valid.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`: `timeout` (local ACK timeout) is valid.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`: `retry_cnt` is valid.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`: `rnr_retry` is valid.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`: `rq_psn` is valid.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic` is valid.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`: the alternate path attributes are valid.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer` is valid.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`: `sq_psn` is valid.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic` is valid.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`: `path_mig_state` is valid.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`: `cap` is valid (resize; never allowed by the transition table).
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`: `dest_qp_num` is valid.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`: `rate_limit` is valid (RAW_PACKET only).
        const RATE_LIMIT = 1 << 25;
    }
}

impl fmt::Display for QpAttrMask {
    /// Formats the mask as `NAME|NAME|...` (in bit order) using the ibverbs names without the
    /// `IBV_QP_` prefix, unknown bits as one trailing hex number, and the empty mask as `(none)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("(none)");
        }
        let mut first = true;
        for (name, _) in self.iter_names() {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
        }
        let unknown = self.bits() & !QpAttrMask::all().bits();
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
        }
        Ok(())
    }
}

/// Required and optional attributes of one transition for one QP type.
///
/// A mask passes iff it contains every bit of `required` and no bit outside
/// `required | optional`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttrRule {
    /// Bits that must be present.
    pub required: QpAttrMask,
    /// Bits that may be present.
    pub optional: QpAttrMask,
}

impl AttrRule {
    /// Bits that must be missing from `mask` for it to pass (required but not given). Never
    /// fails.
    pub const fn missing(&self, mask: QpAttrMask) -> QpAttrMask {
        QpAttrMask::from_bits_retain(self.required.bits() & !mask.bits())
    }

    /// Bits of `mask` that are neither required nor optional (including unknown bits). Never
    /// fails.
    pub const fn not_allowed(&self, mask: QpAttrMask) -> QpAttrMask {
        QpAttrMask::from_bits_retain(mask.bits() & !(self.required.bits() | self.optional.bits()))
    }
}

/// One row of the state-transition table: a valid `from -> to` move and its attribute rules
/// per QP type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transition {
    /// Current state (the QP's state, or `cur_qp_state` when `CUR_STATE` is given).
    pub from: QpState,
    /// Requested state (`qp_state` when `STATE` is given, else `from`).
    pub to: QpState,
    /// Rule for [`QpType::Rc`].
    pub rc: AttrRule,
    /// Rule for [`QpType::Uc`].
    pub uc: AttrRule,
    /// Rule for [`QpType::Ud`].
    pub ud: AttrRule,
    /// Rule for [`QpType::RawPacket`].
    pub raw_packet: AttrRule,
    /// Rule for [`QpType::XrcSend`].
    pub xrc_send: AttrRule,
    /// Rule for [`QpType::XrcRecv`].
    pub xrc_recv: AttrRule,
}

impl Transition {
    /// The attribute rule of this transition for `qp_type`. Never fails.
    pub const fn rule(&self, qp_type: QpType) -> AttrRule {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::RawPacket => self.raw_packet,
            QpType::XrcSend => self.xrc_send,
            QpType::XrcRecv => self.xrc_recv,
        }
    }
}

/// Builds a [`QpAttrMask`] in const context from flag names.
macro_rules! m {
    ($($flag:ident),* $(,)?) => {
        QpAttrMask::from_bits_retain(0 $(| QpAttrMask::$flag.bits())*)
    };
}

/// Builds an [`AttrRule`].
macro_rules! rule {
    (req [$($r:ident),*] opt [$($o:ident),*]) => {
        AttrRule { required: m!($($r),*), optional: m!($($o),*) }
    };
}

/// A row whose rule is the same for every QP type.
const fn uniform(from: QpState, to: QpState, r: AttrRule) -> Transition {
    Transition {
        from,
        to,
        rc: r,
        uc: r,
        ud: r,
        raw_packet: r,
        xrc_send: r,
        xrc_recv: r,
    }
}

/// Move to a different state, nothing but `STATE` accepted (`* -> RESET`, `* -> ERR`).
const fn plain_move(from: QpState, to: QpState) -> Transition {
    uniform(from, to, rule!(req[STATE] opt[]))
}

/// Stay in the same state, nothing but an optional `STATE` accepted.
const fn plain_stay(s: QpState) -> Transition {
    uniform(s, s, rule!(req[] opt[STATE]))
}

/// The QP state-transition table: every valid `(from, to)` pair with its required and optional
/// attribute masks per QP type. A pair not listed here is not a valid transition.
///
/// `STATE` is part of `required` when `from != to` and of `optional` when `from == to`.
pub const TRANSITIONS: &[Transition] = &[
    // ---- from RESET ----
    plain_stay(RESET),
    Transition {
        from: RESET,
        to: INIT,
        rc: rule!(req[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS] opt[]),
        uc: rule!(req[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS] opt[]),
        ud: rule!(req[STATE, PKEY_INDEX, PORT, QKEY] opt[]),
        raw_packet: rule!(req[STATE, PORT] opt[]),
        xrc_send: rule!(req[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS] opt[]),
        xrc_recv: rule!(req[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS] opt[]),
    },
    // ---- from INIT ----
    plain_move(INIT, RESET),
    plain_move(INIT, ERR),
    Transition {
        from: INIT,
        to: INIT,
        rc: rule!(req[] opt[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS]),
        uc: rule!(req[] opt[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS]),
        ud: rule!(req[] opt[STATE, PKEY_INDEX, PORT, QKEY]),
        raw_packet: rule!(req[] opt[STATE]),
        xrc_send: rule!(req[] opt[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS]),
        xrc_recv: rule!(req[] opt[STATE, PKEY_INDEX, PORT, ACCESS_FLAGS]),
    },
    Transition {
        from: INIT,
        to: RTR,
        rc: rule!(
            req[STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER]
            opt[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX]
        ),
        uc: rule!(
            req[STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN]
            opt[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX]
        ),
        ud: rule!(req[STATE] opt[PKEY_INDEX, QKEY]),
        raw_packet: rule!(req[STATE] opt[]),
        xrc_send: rule!(
            req[STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN]
            opt[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX]
        ),
        xrc_recv: rule!(
            req[STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER]
            opt[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX]
        ),
    },
    // ---- from RTR ----
    plain_move(RTR, RESET),
    plain_move(RTR, ERR),
    Transition {
        from: RTR,
        to: RTS,
        rc: rule!(
            req[STATE, TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]
        ),
        uc: rule!(
            req[STATE, SQ_PSN]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE]
        ),
        ud: rule!(req[STATE, SQ_PSN] opt[CUR_STATE, QKEY]),
        raw_packet: rule!(req[STATE] opt[RATE_LIMIT]),
        xrc_send: rule!(
            req[STATE, TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE]
        ),
        xrc_recv: rule!(
            req[STATE, TIMEOUT, SQ_PSN]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]
        ),
    },
    // ---- from RTS ----
    plain_move(RTS, RESET),
    plain_move(RTS, ERR),
    Transition {
        from: RTS,
        to: RTS,
        rc: rule!(
            req[]
            opt[STATE, CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE, MIN_RNR_TIMER]
        ),
        uc: rule!(req[] opt[STATE, CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE]),
        ud: rule!(req[] opt[STATE, CUR_STATE, QKEY]),
        raw_packet: rule!(req[] opt[STATE, RATE_LIMIT]),
        xrc_send: rule!(req[] opt[STATE, CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE]),
        xrc_recv: rule!(
            req[]
            opt[STATE, CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE, MIN_RNR_TIMER]
        ),
    },
    Transition {
        from: RTS,
        to: SQD,
        rc: rule!(req[STATE] opt[EN_SQD_ASYNC_NOTIFY]),
        uc: rule!(req[STATE] opt[EN_SQD_ASYNC_NOTIFY]),
        ud: rule!(req[STATE] opt[EN_SQD_ASYNC_NOTIFY]),
        raw_packet: rule!(req[STATE] opt[]),
        xrc_send: rule!(req[STATE] opt[EN_SQD_ASYNC_NOTIFY]),
        xrc_recv: rule!(req[STATE] opt[EN_SQD_ASYNC_NOTIFY]),
    },
    // ---- from SQD ----
    plain_move(SQD, RESET),
    plain_move(SQD, ERR),
    Transition {
        from: SQD,
        to: RTS,
        rc: rule!(
            req[STATE]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]
        ),
        uc: rule!(req[STATE] opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE]),
        ud: rule!(req[STATE] opt[CUR_STATE, QKEY]),
        raw_packet: rule!(req[STATE] opt[]),
        xrc_send: rule!(req[STATE] opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE]),
        xrc_recv: rule!(
            req[STATE]
            opt[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]
        ),
    },
    Transition {
        from: SQD,
        to: SQD,
        rc: rule!(
            req[]
            opt[
                STATE, PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC,
                MAX_DEST_RD_ATOMIC, ALT_PATH, ACCESS_FLAGS, PKEY_INDEX, MIN_RNR_TIMER,
                PATH_MIG_STATE
            ]
        ),
        uc: rule!(
            req[]
            opt[STATE, AV, ALT_PATH, ACCESS_FLAGS, PKEY_INDEX, PATH_MIG_STATE]
        ),
        ud: rule!(req[] opt[STATE, PKEY_INDEX, QKEY]),
        raw_packet: rule!(req[] opt[STATE]),
        xrc_send: rule!(
            req[]
            opt[
                STATE, PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC, ALT_PATH,
                ACCESS_FLAGS, PKEY_INDEX, PATH_MIG_STATE
            ]
        ),
        xrc_recv: rule!(
            req[]
            opt[
                STATE, PORT, AV, TIMEOUT, MAX_DEST_RD_ATOMIC, ALT_PATH, ACCESS_FLAGS,
                PKEY_INDEX, MIN_RNR_TIMER, PATH_MIG_STATE
            ]
        ),
    },
    // ---- from SQE ----
    plain_move(SQE, RESET),
    plain_move(SQE, ERR),
    Transition {
        from: SQE,
        to: RTS,
        rc: rule!(req[STATE] opt[]),
        uc: rule!(req[STATE] opt[CUR_STATE, ACCESS_FLAGS]),
        ud: rule!(req[STATE] opt[CUR_STATE, QKEY]),
        raw_packet: rule!(req[STATE] opt[]),
        xrc_send: rule!(req[STATE] opt[]),
        xrc_recv: rule!(req[STATE] opt[]),
    },
    // ---- from ERR ----
    plain_move(ERR, RESET),
    plain_stay(ERR),
];

/// Looks up the table row for `from -> to`; `None` means the transition is invalid for every
/// QP type.
pub fn transition(from: QpState, to: QpState) -> Option<&'static Transition> {
    TRANSITIONS.iter().find(|t| t.from == from && t.to == to)
}

/// Why `ibv_modify_qp` rejects a request. Every variant maps to `EINVAL`
/// ([`ModifyQpError::errno`]); the QP must be left unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModifyQpError {
    /// `from -> to` is not in the state-transition table.
    InvalidTransition {
        /// Type of the QP being modified.
        qp_type: QpType,
        /// Current state used for the lookup.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition is valid but the attribute mask is not: some required bits are missing
    /// and/or some bits are neither required nor optional.
    InvalidAttrMask {
        /// Type of the QP being modified.
        qp_type: QpType,
        /// Current state used for the lookup.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// Required bits that were not given (may be empty).
        missing: QpAttrMask,
        /// Given bits that are neither required nor optional, unknown bits included (may be
        /// empty).
        not_allowed: QpAttrMask,
    },
    /// `CUR_STATE` was given with a `cur_qp_state` that contradicts the QP's real state (see
    /// [`check_modify_qp`] for the accepted combinations).
    CurStateMismatch {
        /// Type of the QP being modified.
        qp_type: QpType,
        /// The `cur_qp_state` the caller asserted.
        cur_qp_state: QpState,
        /// The QP's actual state.
        actual: QpState,
    },
}

impl ModifyQpError {
    /// The errno an `ibv_modify_qp` failure of this kind returns: always [`EINVAL`].
    pub const fn errno(&self) -> i32 {
        EINVAL
    }
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModifyQpError::InvalidTransition { qp_type, from, to } => {
                write!(f, "{qp_type} {from}->{to} is not a valid transition")
            }
            ModifyQpError::InvalidAttrMask {
                qp_type,
                from,
                to,
                missing,
                not_allowed,
            } => {
                write!(f, "{qp_type} {from}->{to}:")?;
                if !missing.is_empty() {
                    write!(f, " missing {missing}")?;
                    if !not_allowed.is_empty() {
                        f.write_str(";")?;
                    }
                }
                if !not_allowed.is_empty() {
                    write!(f, " not allowed: {not_allowed}")?;
                }
                Ok(())
            }
            ModifyQpError::CurStateMismatch {
                qp_type,
                cur_qp_state,
                actual,
            } => write!(
                f,
                "{qp_type} QP: cur_qp_state {cur_qp_state} does not match the QP state {actual}"
            ),
        }
    }
}

impl std::error::Error for ModifyQpError {}

/// Checks an `ibv_modify_qp` attribute mask against the state-transition table, exactly as the
/// kernel's `ib_modify_qp_is_ok(current, next, qp_type, mask)` decides.
///
/// `current` is the state the lookup starts from (the QP's state, or `cur_qp_state` when
/// `CUR_STATE` is in the mask — [`check_modify_qp`] resolves that); `next` is the requested
/// state, which must equal `current` when `mask` lacks `STATE` ([`next_state`] computes it).
///
/// # Errors
/// * [`ModifyQpError::InvalidTransition`] when `current -> next` is not in [`TRANSITIONS`]
///   (e.g. `UD RESET->RTS`, `RESET->ERR`, or any modify of an RTR/SQE QP without a state
///   change);
/// * [`ModifyQpError::InvalidAttrMask`] when a required bit is missing (`STATE` itself when
///   `current != next`) or a bit outside `required | optional` — unknown bits included — is set.
///
/// `CUR_STATE` is only optional on rows leaving RTR, RTS, SQD or SQE, so it is rejected from
/// any other state, as the kernel's explicit pre-check does.
///
/// ```
/// use softrdma_proto::{check_modify, QpAttrMask as M, QpState, QpType};
///
/// let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
/// assert!(check_modify(QpType::Rc, QpState::Reset, QpState::Init, init).is_ok());
///
/// let err = check_modify(QpType::Rc, QpState::Init, QpState::Rtr, M::STATE | M::SQ_PSN)
///     .unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "RC INIT->RTR: missing AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN; \
///      not allowed: SQ_PSN"
/// );
/// assert_eq!(err.errno(), softrdma_proto::qp::EINVAL);
/// ```
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    next: QpState,
    mask: QpAttrMask,
) -> Result<(), ModifyQpError> {
    let Some(row) = transition(current, next) else {
        return Err(ModifyQpError::InvalidTransition {
            qp_type,
            from: current,
            to: next,
        });
    };
    let rule = row.rule(qp_type);
    let missing = rule.missing(mask);
    let not_allowed = rule.not_allowed(mask);
    if missing.is_empty() && not_allowed.is_empty() {
        Ok(())
    } else {
        Err(ModifyQpError::InvalidAttrMask {
            qp_type,
            from: current,
            to: next,
            missing,
            not_allowed,
        })
    }
}

/// The state a modify moves to: `qp_state` when `mask` has `STATE`, otherwise `current`
/// (a modify without `STATE` never changes the state). Never fails.
pub fn next_state(current: QpState, mask: QpAttrMask, qp_state: QpState) -> QpState {
    if mask.contains(QpAttrMask::STATE) {
        qp_state
    } else {
        current
    }
}

/// Full `ibv_modify_qp` state/mask validation from the caller's point of view; returns the
/// state the QP is in after the modify (`qp_state` with `STATE`, else `actual` unchanged).
///
/// * `actual` is the QP's real state; `qp_state` / `cur_qp_state` are the fields of
///   `struct ibv_qp_attr` (each only read when its mask bit is set).
/// * The lookup state is `cur_qp_state` when `CUR_STATE` is set (as the kernel providers do),
///   else `actual`; the target is [`next_state`]. Then [`check_modify`] applies; the table only
///   lets `CUR_STATE` through on transitions leaving RTR, RTS, SQD or SQE.
/// * Stricter than the kernel (which trusts `cur_qp_state` blindly): `cur_qp_state` must equal
///   `actual`, except that a caller may still say RTS or SQD after the QP has moved on its own
///   to SQE (a UD/UC send error the caller has not yet seen) — the very race `CUR_STATE` exists
///   for.
///
/// # Errors
/// [`ModifyQpError::CurStateMismatch`] for a contradicting `cur_qp_state` (checked after the
/// table, so a `CUR_STATE` that is not allowed at all is reported as "not allowed"), and
/// everything [`check_modify`] returns. All map to `EINVAL`.
pub fn check_modify_qp(
    qp_type: QpType,
    actual: QpState,
    mask: QpAttrMask,
    qp_state: QpState,
    cur_qp_state: QpState,
) -> Result<QpState, ModifyQpError> {
    let from = if mask.contains(QpAttrMask::CUR_STATE) {
        cur_qp_state
    } else {
        actual
    };
    let to = next_state(from, mask, qp_state);
    check_modify(qp_type, from, to, mask)?;
    if from != actual && !cur_state_compatible(from, actual) {
        return Err(ModifyQpError::CurStateMismatch {
            qp_type,
            cur_qp_state: from,
            actual,
        });
    }
    // Without STATE the state never changes, even if CUR_STATE named another one.
    Ok(next_state(actual, mask, qp_state))
}

/// Whether a caller asserting `assumed` may be acting on a QP that is really in `actual`
/// (the QP moved to SQE asynchronously after the caller last saw RTS or SQD).
fn cur_state_compatible(assumed: QpState, actual: QpState) -> bool {
    matches!(
        (assumed, actual),
        (QpState::Rts, QpState::Sqe) | (QpState::Sqd, QpState::Sqe)
    )
}
