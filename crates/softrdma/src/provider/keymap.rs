//! Maps keyed by a QP number: the engine looks one up for every run of packets it receives
//! and sets a deadline in another at every drive of a QP, so the key is hashed with one
//! multiplication instead of SipHash (about 120 instructions a round trip of a ping-pong).
//!
//! The keys are this device's own QP numbers, never chosen by a peer (a peer's packets only
//! look keys up), so a hash that an attacker could aim collisions at costs nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a QP number, with [`QpnHasher`].
pub(crate) type QpnMap<V> = HashMap<u32, V, BuildHasherDefault<QpnHasher>>;

/// Fibonacci hashing of a `u32` key: the key times 2^64/φ, high half folded onto the low
/// (hashbrown takes its bucket from the low bits and its tag from the top seven).
#[derive(Default, Clone, Copy)]
pub(crate) struct QpnHasher(u64);

impl Hasher for QpnHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    /// Other keys (not used by [`QpnMap`]): byte by byte, same mixing.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_numbers_spread_over_buckets_and_tags() {
        // QP numbers of one process share their slot byte and often run in sequence: the
        // low bits (bucket) and top seven (tag) must still vary.
        let mut buckets = std::collections::HashSet::new();
        let mut tags = std::collections::HashSet::new();
        for n in 0..256u32 {
            let mut h = QpnHasher::default();
            h.write_u32(0x00ab_0000 | n);
            let v = h.finish();
            buckets.insert(v & 255);
            tags.insert(v >> 57);
        }
        assert!(buckets.len() > 150, "{} buckets of 256", buckets.len());
        assert!(tags.len() > 60, "{} tags of 128", tags.len());
        let mut m: QpnMap<u32> = QpnMap::default();
        for n in 0..1000 {
            m.insert(n * 7919, n);
        }
        assert!((0..1000).all(|n| m.get(&(n * 7919)) == Some(&n)));
    }
}
