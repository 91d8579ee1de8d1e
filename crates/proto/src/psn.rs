//! 24-bit packet sequence numbers and their wrap-around arithmetic.
//!
//! PSNs live on a circle of 2^24 values. Two PSNs are compared by the sign of their 24-bit
//! difference, exactly like rxe's `psn_compare(a, b) = (s32)((a - b) << 8)`: `a` is after `b`
//! when `a` is less than 2^23 steps ahead of `b`, before it when it is less than 2^23 steps
//! behind. This is why [`Psn`] implements neither `Ord` nor `PartialOrd`: the relation is not a
//! total order (it is not transitive around the circle, and two PSNs exactly 2^23 apart each
//! compare as *before* the other). Use [`cmp_psn`] / [`Psn::is_before`] and friends, which name
//! what they do.

use core::cmp::Ordering;
use core::fmt;

/// Largest PSN value, 2^24 − 1.
pub const MAX_PSN: u32 = 0xFF_FFFF;

/// Mask selecting the 24 PSN bits of a `u32`.
pub const PSN_MASK: u32 = MAX_PSN;

/// A 24-bit packet sequence number. The inner value is always `<= MAX_PSN`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// PSN 0xFFFFFF, the last before the wrap.
    pub const MAX: Psn = Psn(MAX_PSN);

    /// Makes a PSN from the low 24 bits of `raw`; higher bits are silently discarded (as the
    /// kernel does for an oversized `sq_psn` / `rq_psn`). Never fails.
    pub const fn new(raw: u32) -> Psn {
        Psn(raw & PSN_MASK)
    }

    /// The PSN as a `u32` in `0..=MAX_PSN`. Never fails.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The following PSN, `(psn + 1) mod 2^24`. Never fails (0xFFFFFF wraps to 0).
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// The preceding PSN, `(psn − 1) mod 2^24`. Never fails (0 wraps to 0xFFFFFF).
    #[must_use]
    pub const fn prev(self) -> Psn {
        self.sub(1)
    }

    /// `(psn + n) mod 2^24`. Never fails; any `n` is accepted and taken modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `(psn − n) mod 2^24`. Never fails; any `n` is accepted and taken modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// Forward distance from `self` to `later`: how many [`Psn::next`] steps lead from `self`
    /// to `later`, in `0..=MAX_PSN`. Never fails (a `later` that is actually behind gives a
    /// large value; use [`Psn::diff`] for a signed answer).
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & PSN_MASK
    }

    /// Signed 24-bit difference `self − other` in `-2^23..2^23`, i.e. rxe's
    /// `psn_compare(self, other) >> 8`. Positive means `self` is after `other`. Never fails;
    /// PSNs exactly 2^23 apart give `-2^23` in both directions.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Circular comparison; see [`cmp_psn`]. Never fails.
    pub fn cmp_psn(self, other: Psn) -> Ordering {
        cmp_psn(self, other)
    }

    /// `true` if `self` comes strictly before `other` on the circle (`diff < 0`).
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// `true` if `self` comes before or equals `other` (`diff <= 0`).
    pub const fn is_before_or_eq(self, other: Psn) -> bool {
        self.diff(other) <= 0
    }

    /// `true` if `self` comes strictly after `other` (`diff > 0`).
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// `true` if `self` comes after or equals `other` (`diff >= 0`).
    pub const fn is_after_or_eq(self, other: Psn) -> bool {
        self.diff(other) >= 0
    }
}

/// Compares two PSNs on the 24-bit circle with rxe's rule `(s32)((a − b) << 8)`: `Less` when
/// `a` is before `b`, `Greater` when after, `Equal` only when they are equal. Never fails, but
/// is not a total order (see the module documentation): for PSNs exactly 2^23 apart both
/// `cmp_psn(a, b)` and `cmp_psn(b, a)` are `Less`.
pub fn cmp_psn(a: Psn, b: Psn) -> Ordering {
    a.diff(b).cmp(&0)
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Display for Psn {
    /// Formats as six hex digits, e.g. `0x123456`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}
