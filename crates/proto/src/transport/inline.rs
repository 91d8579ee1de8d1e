//! [`InlineData`]: the bytes of an `IBV_SEND_INLINE` work request, copied at post time, held
//! in the value itself up to [`INLINE_IN_PLACE`] bytes so that small inline sends (the usual
//! reason for inline data) allocate nothing.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Bytes an [`InlineData`] holds without allocating.
pub const INLINE_IN_PLACE: usize = 64;

/// The data of an inline send: a byte string of any length (up to the QP's
/// `max_inline_data`, which the verbs layer checks).
///
/// Up to [`INLINE_IN_PLACE`] bytes are stored in the value itself; longer data lives in a
/// `Vec`. It dereferences to `[u8]`, and compares and prints as that slice. No operation
/// fails; data longer than [`INLINE_IN_PLACE`] allocates (and aborts as `Vec` does when
/// memory runs out).
#[derive(Clone)]
pub struct InlineData(Repr);

#[derive(Clone)]
enum Repr {
    /// The first `len` bytes of `data`.
    InPlace {
        len: u8,
        data: [u8; INLINE_IN_PLACE],
    },
    Heap(Vec<u8>),
}

impl InlineData {
    /// `len` zero bytes, to be filled through `DerefMut` (no allocation up to
    /// [`INLINE_IN_PLACE`] bytes).
    pub fn zeroed(len: usize) -> InlineData {
        if len <= INLINE_IN_PLACE {
            InlineData(Repr::InPlace {
                len: len as u8,
                data: [0; INLINE_IN_PLACE],
            })
        } else {
            InlineData(Repr::Heap(vec![0; len]))
        }
    }

    /// A copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> InlineData {
        let mut d = InlineData::zeroed(bytes.len());
        d.copy_from_slice(bytes);
        d
    }

    /// Whether the data lives in the value itself (no allocation).
    pub fn is_in_place(&self) -> bool {
        matches!(self.0, Repr::InPlace { .. })
    }
}

impl Deref for InlineData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::InPlace { len, data } => &data[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }
}

impl DerefMut for InlineData {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Repr::InPlace { len, data } => &mut data[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }
}

impl From<&[u8]> for InlineData {
    fn from(bytes: &[u8]) -> InlineData {
        InlineData::from_slice(bytes)
    }
}

impl From<Vec<u8>> for InlineData {
    /// Keeps the vector when it is longer than [`INLINE_IN_PLACE`] (no copy), copies it in
    /// place otherwise.
    fn from(v: Vec<u8>) -> InlineData {
        if v.len() <= INLINE_IN_PLACE {
            InlineData::from_slice(&v)
        } else {
            InlineData(Repr::Heap(v))
        }
    }
}

impl PartialEq for InlineData {
    fn eq(&self, other: &InlineData) -> bool {
        self[..] == other[..]
    }
}

impl Eq for InlineData {}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self[..], f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_data_stays_in_place_and_large_data_on_the_heap() {
        for len in [0, 1, 8, INLINE_IN_PLACE, INLINE_IN_PLACE + 1, 1024] {
            let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let d = InlineData::from_slice(&bytes);
            assert_eq!(&d[..], &bytes[..]);
            assert_eq!(d.is_in_place(), len <= INLINE_IN_PLACE, "{len}");
            assert_eq!(InlineData::from(bytes.clone()), d);
            assert_eq!(format!("{d:?}"), format!("{bytes:?}"));
        }
    }

    #[test]
    fn zeroed_is_writable_to_its_length() {
        let mut d = InlineData::zeroed(10);
        assert_eq!(d.len(), 10);
        d[9] = 7;
        assert_eq!(d[9], 7);
        assert!(d[..9].iter().all(|&b| b == 0));
    }
}
