//! Verifying the ICRC of an IPv4 packet whose Identification field is unknown.
//!
//! The ICRC covers the IPv4 Identification unmasked, but a UDP socket does not show it to
//! the receiver. softrdma sends with `IP_PMTUDISC_DO`, so its packets carry identification 0
//! and a receiver can rebuild the header exactly. Other stacks do not: the Linux kernel's
//! rxe, for one, gives every packet an identification from `__ip_select_ident` (e.g. 0x5cf5).
//!
//! # The method
//! CRC-32 is affine over GF(2): for messages of one length, flipping a set of message bits
//! XORs the CRC with the XOR of the effects of the single bits, and the effect of a bit
//! depends only on its distance from the end of the message. So, with `D_j` the effect of
//! bit `j` of the identification (a 32-bit vector, computed from the CRC table and a power
//! of the shift operator `x^(8k) mod P`),
//!
//! ```text
//! icrc(ident) = icrc(0) XOR  SUM_j ident_j * D_j        (j = 0..16)
//! ```
//!
//! Given the ICRC a packet carries and the ICRC computed with identification 0, their XOR
//! (the *syndrome*) must be a combination of the 16 `D_j`. [`IdentBasis`] holds the `D_j`
//! of one message length in echelon form and solves the 32 equations in 16 unknowns by
//! elimination. The `D_j` are linearly independent (a nonzero combination is an error
//! burst of at most 16 bits, which CRC-32 always detects), so a solution, when one exists,
//! is unique: it is the identification the sender used.
//!
//! # What this verifies
//! A packet that verifies with identification 0 got the full 32-bit check. A packet that
//! verifies only with a solved identification got a 16-bit check: the syndrome of a
//! corrupted packet is, for practical purposes, a uniformly random 32-bit value, and it lies
//! in the 16-dimensional span of the `D_j` with probability `2^16 / 2^32 = 2^-16`. A
//! receiver that tries identification 0 first and then solves therefore accepts a corrupted
//! packet with probability about 2^-16 (one in 65,536), whoever sent it — softrdma peers
//! included, since nothing tells the receiver which identification a sender uses.
//!
//! That rate is an average over corruptions. Errors that CRC-32 detects for certain stay
//! detected: a corruption that, together with the identification, fits in 32 consecutive
//! bits cannot pass. But for a few distances between the error and the identification, some
//! single-byte errors pass the 16-bit check: of the 4,299 distances from 1 to 4,299 bytes
//! after the identification, 4,294 let no single-byte error through; 116 bytes after it (82
//! bytes into the payload of an RC SEND) 15 of the 255 possible byte errors pass, and at
//! 1,799, 2,252, 2,559 and 3,348 bytes 1 to 3 do. Ethernet's FCS and the UDP checksum
//! (which the kernel verifies before a socket sees the datagram, when the sender set it)
//! stand in front of the ICRC on a real link.

use std::collections::HashMap;

/// The reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xedb8_8320;

/// `a * b mod P`, both polynomials in the reflected representation (bit 31 is `x^0`).
fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m: u32 = 1 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `x^(8 * bytes) mod P`: the operator that advances a CRC register over `bytes` zero bytes.
fn zeros_op(bytes: u64) -> u32 {
    // x^(2^k) mod P, starting at x^8 (k = 3), squared as needed.
    let mut sq: u32 = mult_mod_p(1 << 30, 1 << 30); // x^2
    sq = mult_mod_p(sq, sq); // x^4
    sq = mult_mod_p(sq, sq); // x^8
    let mut p: u32 = 1 << 31; // x^0
    let mut n = bytes;
    while n != 0 {
        if n & 1 != 0 {
            p = mult_mod_p(sq, p);
        }
        n >>= 1;
        if n != 0 {
            sq = mult_mod_p(sq, sq);
        }
    }
    p
}

/// The CRC register after one byte `b` fed into a zero register (the table entry).
fn table(b: u8) -> u32 {
    let mut c = u32::from(b);
    for _ in 0..8 {
        c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
    }
    c
}

/// The effect on the ICRC of each of the 16 bits of an IPv4 identification, for packets
/// with a given number of ICRC-covered bytes after the identification field, in a form
/// ready to solve for the identification. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentBasis {
    /// `effect[j]`: how bit `j` (value `1 << j`) of the identification changes the ICRC.
    effect: [u32; 16],
    /// Echelon form: (vector, its pivot bit, the identification bits it combines).
    rows: [(u32, u32, u16); 16],
    len: usize,
}

impl IdentBasis {
    /// The basis for packets in which `after_ident` ICRC-covered bytes follow the
    /// identification field: the rest of the IP header after it (14 bytes without options),
    /// the UDP header (8) and the transport packet from the BTH through the pad.
    pub fn new(after_ident: usize) -> IdentBasis {
        // The low byte of the identification is the last of the two (big-endian), followed
        // by `after_ident` bytes; the high byte by one more.
        let op_low = zeros_op(after_ident as u64);
        let op_high = mult_mod_p(zeros_op(1), op_low);
        let mut effect = [0u32; 16];
        for (j, e) in effect.iter_mut().enumerate() {
            *e = if j < 8 {
                mult_mod_p(op_low, table(1 << j))
            } else {
                mult_mod_p(op_high, table(1 << (j - 8)))
            };
        }
        let mut rows = [(0u32, 0u32, 0u16); 16];
        let mut len = 0;
        for (j, &e) in effect.iter().enumerate() {
            let (mut v, mut combo) = (e, 1u16 << j);
            for &(r, pivot, c) in &rows[..len] {
                if v & pivot != 0 {
                    v ^= r;
                    combo ^= c;
                }
            }
            if v != 0 {
                // The highest set bit; later rows are reduced by this one, so reducing in
                // row order clears each pivot for good.
                let pivot = 1u32 << (31 - v.leading_zeros());
                rows[len] = (v, pivot, combo);
                len += 1;
            }
        }
        IdentBasis { effect, rows, len }
    }

    /// The syndrome (XOR of the ICRC with identification `ident` and that with 0) an
    /// identification produces.
    pub fn syndrome(&self, ident: u16) -> u32 {
        self.effect
            .iter()
            .enumerate()
            .filter(|(j, _)| ident & (1 << j) != 0)
            .fold(0, |acc, (_, e)| acc ^ e)
    }

    /// The identification whose syndrome is `syndrome`, if there is one (it is then unique).
    /// `solve(0)` is `Some(0)`.
    pub fn solve(&self, syndrome: u32) -> Option<u16> {
        let mut s = syndrome;
        let mut ident = 0u16;
        for &(r, pivot, c) in &self.rows[..self.len] {
            if s & pivot != 0 {
                s ^= r;
                ident ^= c;
            }
        }
        (s == 0).then_some(ident)
    }
}

/// [`IdentBasis`] values cached by length, for a receiver that solves for the
/// identification of many packets.
#[derive(Debug, Default, Clone)]
pub struct IdentSolver {
    cache: HashMap<usize, IdentBasis>,
}

impl IdentSolver {
    /// The most lengths kept; the cache is emptied when it would grow beyond.
    pub const MAX_CACHED: usize = 4096;

    /// An empty solver.
    pub fn new() -> IdentSolver {
        IdentSolver::default()
    }

    /// The basis for `after_ident` covered bytes after the identification (see
    /// [`IdentBasis::new`]), computed once per length.
    pub fn basis(&mut self, after_ident: usize) -> &IdentBasis {
        if self.cache.len() >= Self::MAX_CACHED && !self.cache.contains_key(&after_ident) {
            self.cache.clear();
        }
        self.cache
            .entry(after_ident)
            .or_insert_with(|| IdentBasis::new(after_ident))
    }

    /// [`IdentBasis::solve`] for that length.
    pub fn solve(&mut self, after_ident: usize, syndrome: u32) -> Option<u16> {
        self.basis(after_ident).solve(syndrome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crc32fast::Hasher;

    fn crc(bytes: &[u8]) -> u32 {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finalize()
    }

    #[test]
    fn effects_match_direct_crc() {
        for len in [0usize, 1, 2, 13, 100, 1077] {
            let b = IdentBasis::new(len);
            let mut msg = vec![0x5au8; 20 + 2 + len];
            msg[20..22].fill(0);
            let base = crc(&msg);
            for ident in [1u16, 0x80, 0x100, 0x8000, 0x5cf5, 0xffff] {
                msg[20..22].copy_from_slice(&ident.to_be_bytes());
                let s = crc(&msg) ^ base;
                assert_eq!(b.syndrome(ident), s, "len {len} ident {ident:#x}");
                assert_eq!(b.solve(s), Some(ident));
            }
            assert_eq!(b.solve(0), Some(0));
            assert_eq!(b.len, 16, "the 16 effects are independent");
        }
    }

    #[test]
    fn zeros_op_matches_shifting() {
        let mut r = 0x1234_5678u32;
        for k in 0..40u64 {
            assert_eq!(mult_mod_p(zeros_op(k), 0x1234_5678), r, "k {k}");
            r = (r >> 8) ^ table((r & 0xff) as u8);
        }
        let _ = zeros_op(u64::MAX);
    }

    #[test]
    fn solver_cache_is_bounded() {
        let mut s = IdentSolver::new();
        for len in 0..IdentSolver::MAX_CACHED + 10 {
            let b = s.basis(len).clone();
            assert_eq!(b.solve(b.syndrome(len as u16)), Some(len as u16));
        }
        assert!(s.cache.len() <= IdentSolver::MAX_CACHED);
    }
}
