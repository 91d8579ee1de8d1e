//! Deterministic pseudo-randomness for the CM: a splitmix64 generator and a keyed bijection
//! of `u32` used to turn a cyclic counter into unique, hard-to-guess communication IDs.

/// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed 64-bit generator. Not
/// cryptographic; the owner seeds it from the OS so values differ between runs.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}

/// A bijection of `u32` keyed by two words: every step (xor with a constant, multiplication
/// by an odd constant, xor-shift right) is invertible, so distinct inputs give distinct
/// outputs. Used as `comm_id = permute(index)`, which makes IDs unique for 2^32 allocations
/// while not revealing the next one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permutation {
    k0: u32,
    k1: u32,
    m0: u32,
    m1: u32,
}

impl Permutation {
    pub(crate) fn new(rng: &mut SplitMix64) -> Self {
        Permutation {
            k0: rng.next_u32(),
            k1: rng.next_u32(),
            m0: rng.next_u32() | 1,
            m1: rng.next_u32() | 1,
        }
    }

    pub(crate) fn apply(&self, x: u32) -> u32 {
        let mut x = x ^ self.k0;
        x = x.wrapping_mul(self.m0);
        x ^= x >> 16;
        x = x.wrapping_mul(self.m1);
        x ^= x >> 13;
        x ^= self.k1;
        x = x.wrapping_mul(0x2C1B_3C6D);
        x ^ (x >> 15)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of splitmix64 seeded with 0 (reference implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn permutation_is_injective_on_a_range() {
        let mut r = SplitMix64::new(42);
        let p = Permutation::new(&mut r);
        let set: HashSet<u32> = (0..200_000u32).map(|i| p.apply(i)).collect();
        assert_eq!(set.len(), 200_000);
    }
}
