//! InfiniBand time encodings: the QP local ACK timeout, the RNR NAK timer code, and CM
//! timeouts (all IBA "4.096 µs × 2^t" or table encodings of 5-bit fields).
//!
//! The 5-bit fields hold values 0..=31. Functions taking an exponent clamp larger values to 31
//! (the largest encodable value) rather than failing; `rnr_timer` uses the low 5 bits, since its
//! code comes straight out of an AETH syndrome.

use core::time::Duration;

/// Largest value of a 5-bit IBA time field.
pub const MAX_TIME_EXP: u8 = 31;

/// 4.096 µs × 2^exp, exponent clamped to 31.
const fn iba_time(exp: u8) -> Duration {
    let exp = if exp > MAX_TIME_EXP {
        MAX_TIME_EXP
    } else {
        exp
    };
    Duration::from_nanos(4096u64 << exp)
}

/// QP local ACK timeout (`ibv_qp_attr.timeout`): 4.096 µs × 2^`exp`.
///
/// Returns `None` for `exp == 0`, which means "wait forever / no retransmit timer". Values
/// above 31 do not fit the 5-bit field and are treated as 31 (≈ 2.44 hours).
pub const fn local_ack_timeout(exp: u8) -> Option<Duration> {
    if exp == 0 {
        None
    } else {
        Some(iba_time(exp))
    }
}

/// RNR NAK timer (`min_rnr_timer` / AETH RNR code) in microseconds, indexed by the 5-bit code
/// (IBA table; code 0 is the longest, 655.36 ms). Code 25 is 61440 µs, the spec value (rxe's
/// table has the typo 61410).
pub const RNR_TIMER_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR back-off for an RNR timer `code`; only the low 5 bits of `code` are used. Never
/// fails.
pub const fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_USEC[(code & 0x1F) as usize] as u64)
}

/// A CM timeout field (REQ remote/local CM response timeout, packet life time, MRA service
/// timeout, ...): 4.096 µs × 2^`t`. Unlike the ACK timeout, 0 means 4.096 µs, not infinity.
/// Values above 31 are treated as 31. Never fails.
pub const fn cm_timeout(t: u8) -> Duration {
    iba_time(t)
}

/// Linux's millisecond approximation of a CM timeout, `cm_convert_to_ms`:
/// `1 << max(t − 8, 0)` ms (t = 20 → 4096 ms, exact 4.29 s). Values of `t` above 31 are treated
/// as 31. Never fails.
pub const fn cm_timeout_ms_linux(t: u8) -> u64 {
    let t = if t > MAX_TIME_EXP { MAX_TIME_EXP } else { t };
    1u64 << t.saturating_sub(8)
}
