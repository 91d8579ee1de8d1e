//! [`SgList`]: a scatter/gather list that holds up to [`SG_INLINE`] entries in place and
//! spills to the heap only beyond, so that posting a work request with a short list (nearly
//! every one: one entry is the common case) allocates nothing.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// A piece of local registered memory (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Address of the first byte, in the region's iova space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// Entries an [`SgList`] holds without allocating.
pub const SG_INLINE: usize = 4;

/// A scatter/gather list of [`Sge`]s: the entries of one work request.
///
/// Up to [`SG_INLINE`] entries are stored in the value itself; a longer list lives in a
/// `Vec`. Which one is an implementation detail: the list dereferences to `[Sge]`, compares
/// and prints as that slice, and is built from a slice, an array, a `Vec` or an
/// iterator. No operation fails; growing past [`SG_INLINE`] entries allocates (and aborts or
/// panics as `Vec` does when memory runs out).
#[derive(Clone)]
pub struct SgList(Repr);

#[derive(Clone)]
enum Repr {
    /// The first `len` entries of `sges` are the list.
    Inline { len: u8, sges: [Sge; SG_INLINE] },
    /// More than [`SG_INLINE`] entries (or once had: the list never moves back).
    Heap(Vec<Sge>),
}

/// An all-zero entry, the filler of unused inline slots.
const ZERO: Sge = Sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

impl SgList {
    /// An empty list (no allocation).
    pub const fn new() -> SgList {
        SgList(Repr::Inline {
            len: 0,
            sges: [ZERO; SG_INLINE],
        })
    }

    /// A list of the one entry `sge` (no allocation).
    pub const fn one(sge: Sge) -> SgList {
        let mut sges = [ZERO; SG_INLINE];
        sges[0] = sge;
        SgList(Repr::Inline { len: 1, sges })
    }

    /// A copy of `sges`; allocates only when it has more than [`SG_INLINE`] entries.
    pub fn from_slice(sges: &[Sge]) -> SgList {
        if sges.len() <= SG_INLINE {
            let mut inline = [ZERO; SG_INLINE];
            inline[..sges.len()].copy_from_slice(sges);
            SgList(Repr::Inline {
                len: sges.len() as u8,
                sges: inline,
            })
        } else {
            SgList(Repr::Heap(sges.to_vec()))
        }
    }

    /// Appends `sge`; moves the list to the heap when it grows past [`SG_INLINE`] entries.
    pub fn push(&mut self, sge: Sge) {
        match &mut self.0 {
            Repr::Inline { len, sges } if usize::from(*len) < SG_INLINE => {
                sges[usize::from(*len)] = sge;
                *len += 1;
            }
            Repr::Inline { sges, .. } => {
                let mut v = Vec::with_capacity(2 * SG_INLINE);
                v.extend_from_slice(sges);
                v.push(sge);
                self.0 = Repr::Heap(v);
            }
            Repr::Heap(v) => v.push(sge),
        }
    }

    /// Removes every entry, keeping any heap storage for reuse.
    pub fn clear(&mut self) {
        match &mut self.0 {
            Repr::Inline { len, .. } => *len = 0,
            Repr::Heap(v) => v.clear(),
        }
    }

    /// The entries, as a slice.
    pub fn as_slice(&self) -> &[Sge] {
        match &self.0 {
            Repr::Inline { len, sges } => &sges[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }

    /// The entries, as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [Sge] {
        match &mut self.0 {
            Repr::Inline { len, sges } => &mut sges[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }

    /// Whether the entries are on the heap (the list has, or once had, more than
    /// [`SG_INLINE`] of them).
    pub fn spilled(&self) -> bool {
        matches!(self.0, Repr::Heap(_))
    }

    /// Total length in bytes of all entries.
    pub fn total_length(&self) -> u64 {
        self.iter().map(|s| u64::from(s.length)).sum()
    }
}

impl Default for SgList {
    fn default() -> SgList {
        SgList::new()
    }
}

impl Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        self.as_slice()
    }
}

impl DerefMut for SgList {
    fn deref_mut(&mut self) -> &mut [Sge] {
        self.as_mut_slice()
    }
}

impl AsRef<[Sge]> for SgList {
    fn as_ref(&self) -> &[Sge] {
        self.as_slice()
    }
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for SgList {
    fn eq(&self, other: &SgList) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for SgList {}

impl PartialEq<[Sge]> for SgList {
    fn eq(&self, other: &[Sge]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<Vec<Sge>> for SgList {
    fn eq(&self, other: &Vec<Sge>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl From<&[Sge]> for SgList {
    /// See [`SgList::from_slice`].
    fn from(sges: &[Sge]) -> SgList {
        SgList::from_slice(sges)
    }
}

impl<const N: usize> From<[Sge; N]> for SgList {
    /// The entries of the array; allocates only when `N` exceeds [`SG_INLINE`].
    fn from(sges: [Sge; N]) -> SgList {
        SgList::from_slice(&sges)
    }
}

impl From<Vec<Sge>> for SgList {
    /// Takes over the `Vec` when it has more than [`SG_INLINE`] entries; copies them in
    /// place (and frees the `Vec`) otherwise.
    fn from(sges: Vec<Sge>) -> SgList {
        if sges.len() <= SG_INLINE {
            SgList::from_slice(&sges)
        } else {
            SgList(Repr::Heap(sges))
        }
    }
}

impl From<SgList> for Vec<Sge> {
    /// The entries as a `Vec` (allocates unless the list had already spilled).
    fn from(sges: SgList) -> Vec<Sge> {
        match sges.0 {
            Repr::Inline { len, sges } => sges[..usize::from(len)].to_vec(),
            Repr::Heap(v) => v,
        }
    }
}

impl FromIterator<Sge> for SgList {
    /// Collects the entries; allocates only past [`SG_INLINE`] of them.
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> SgList {
        let mut list = SgList::new();
        list.extend(iter);
        list
    }
}

impl Extend<Sge> for SgList {
    fn extend<I: IntoIterator<Item = Sge>>(&mut self, iter: I) {
        for sge in iter {
            self.push(sge);
        }
    }
}

impl<'a> IntoIterator for &'a SgList {
    type Item = &'a Sge;
    type IntoIter = std::slice::Iter<'a, Sge>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u32) -> Sge {
        Sge {
            addr: u64::from(i) * 0x100,
            length: i,
            lkey: i + 7,
        }
    }

    #[test]
    fn inline_up_to_capacity_then_heap() {
        let mut l = SgList::new();
        assert!(l.is_empty());
        for i in 0..SG_INLINE as u32 {
            l.push(sge(i));
            assert!(!l.spilled());
        }
        l.push(sge(99));
        assert!(l.spilled());
        let want: Vec<Sge> = (0..SG_INLINE as u32).map(sge).chain([sge(99)]).collect();
        assert_eq!(l.as_slice(), &want[..]);
        assert_eq!(l, want);
        l.clear();
        assert!(l.is_empty());
    }

    #[test]
    fn constructors_agree() {
        for n in 0..=SG_INLINE as u32 + 2 {
            let v: Vec<Sge> = (0..n).map(sge).collect();
            let a = SgList::from_slice(&v);
            let b = SgList::from(v.clone());
            let c: SgList = v.iter().copied().collect();
            assert_eq!(a, b);
            assert_eq!(a, c);
            assert_eq!(a.len(), n as usize);
            assert_eq!(a.spilled(), n as usize > SG_INLINE);
            assert_eq!(b.spilled(), n as usize > SG_INLINE);
            assert_eq!(a.total_length(), u64::from(n * n.saturating_sub(1) / 2));
            assert_eq!(Vec::from(a), v);
        }
        assert_eq!(SgList::one(sge(3)), SgList::from([sge(3)]));
        assert_eq!(
            format!("{:?}", SgList::one(sge(1))),
            format!("{:?}", [sge(1)])
        );
    }

    #[test]
    fn small() {
        // Inline storage plus a length and a tag; no bigger than that.
        assert!(std::mem::size_of::<SgList>() <= SG_INLINE * 16 + 8);
    }
}
