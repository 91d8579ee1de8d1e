//! The send queue's storage: posted requests in order, each in a slot that never moves.
//!
//! A send request is a few hundred bytes (its scatter/gather list and up to 64 bytes of
//! inline data are held in place). A `VecDeque` moved each one in when it was posted (built
//! on the stack, then copied into the queue) and out again when it completed; at millions of
//! messages a second those copies, and the stalls of reading back what was just stored in
//! pieces, were a tenth of the posting thread's time. Here the owner fills the request in
//! its slot ([`SendQueue::push`]), and completing it reads it where it is
//! ([`SendQueue::pop_front`] only moves the head). A slot keeps the heap memory of a long
//! scatter/gather list for the next request that lands in it.

use std::fmt;
use std::ops::{Index, IndexMut};

/// What a [`SendQueue`] holds: an entry that can be made blank in place.
pub(super) trait Slot {
    /// A blank entry (what a new slot holds).
    fn blank() -> Self;
    /// Makes a used entry blank again, in place, keeping any memory it can reuse.
    fn reset(&mut self);
}

/// A ring of slots (a power of two of them) that grows by doubling when full.
pub(super) struct SendQueue<T> {
    slots: Vec<T>,
    head: usize,
    len: usize,
    /// Requests dropped from the front so far (see [`SendQueue::seq`]).
    popped: u64,
}

/// Slots a new queue starts with at most (it grows as needed, up to what the QP allows).
/// Few: the slots are written when made (a blank request each, ~300 bytes), and a host with
/// ten thousand connections should not hold megabytes of empty send queues.
const INITIAL_SLOTS: usize = 8;

impl<T: Slot> SendQueue<T> {
    /// An empty queue sized for `expected` requests at a time (at most [`INITIAL_SLOTS`]
    /// slots to start with).
    pub(super) fn new(expected: usize) -> SendQueue<T> {
        let n = expected.clamp(1, INITIAL_SLOTS).next_power_of_two();
        SendQueue {
            slots: (0..n).map(|_| T::blank()).collect(),
            head: 0,
            len: 0,
            popped: 0,
        }
    }

    /// The `i`-th request's number in the order of posting (the first ever posted is 0).
    #[inline]
    pub(super) fn seq(&self, i: usize) -> u64 {
        self.popped + i as u64
    }

    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.head + i) & (self.slots.len() - 1)
    }

    /// Requests queued.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The `i`-th request from the oldest.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        if i < self.len {
            Some(&self.slots[self.slot(i)])
        } else {
            None
        }
    }

    /// The `i`-th request from the oldest.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i < self.len {
            let s = self.slot(i);
            Some(&mut self.slots[s])
        } else {
            None
        }
    }

    /// The oldest request.
    #[inline]
    pub(super) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// The requests, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len).map(move |i| &self.slots[self.slot(i)])
    }

    /// Appends a request and returns its slot, made blank ([`Slot::reset`]) for the caller
    /// to fill in place. Grows the ring when it is full (never fails).
    #[inline]
    pub(super) fn push(&mut self) -> &mut T {
        if self.len == self.slots.len() {
            self.grow();
        }
        let s = self.slot(self.len);
        self.len += 1;
        let w = &mut self.slots[s];
        w.reset();
        w
    }

    /// Takes back the request [`SendQueue::push`] appended last.
    pub(super) fn pop_back(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// Drops the oldest request (its slot is reset when next used). Does nothing on an
    /// empty queue.
    #[inline]
    pub(super) fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
            self.popped += 1;
        }
    }

    /// Doubles the slots, the requests keeping their order (the only time they move).
    #[cold]
    fn grow(&mut self) {
        let n = self.slots.len();
        let mut slots = std::mem::take(&mut self.slots);
        slots.rotate_left(self.head);
        slots.extend((0..n).map(|_| T::blank()));
        self.slots = slots;
        self.head = 0;
    }
}

impl<T: Slot> Index<usize> for SendQueue<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        self.get(i).expect("send queue index out of range")
    }
}

impl<T: Slot> IndexMut<usize> for SendQueue<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        self.get_mut(i).expect("send queue index out of range")
    }
}

impl<T: Slot + fmt::Debug> fmt::Debug for SendQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in request: an id, and heap memory a reset keeps.
    #[derive(Debug)]
    struct Req {
        wr_id: u64,
        started: bool,
        list: Vec<u32>,
    }

    impl Slot for Req {
        fn blank() -> Req {
            Req {
                wr_id: 0,
                started: false,
                list: Vec::new(),
            }
        }
        fn reset(&mut self) {
            self.wr_id = 0;
            self.started = false;
            self.list.clear();
        }
    }

    fn ids(q: &SendQueue<Req>) -> Vec<u64> {
        q.iter().map(|w| w.wr_id).collect()
    }

    #[test]
    fn keeps_order_across_wrap_and_growth() {
        let mut q = SendQueue::<Req>::new(2);
        let mut next = 0u64;
        let mut want = std::collections::VecDeque::new();
        // Push and pop in an uneven rhythm so the head wraps, then grow while wrapped.
        for round in 0..200u64 {
            for _ in 0..(round % 5) {
                q.push().wr_id = next;
                want.push_back(next);
                next += 1;
            }
            for _ in 0..(round % 3) {
                q.pop_front();
                want.pop_front();
            }
            assert_eq!(q.len(), want.len());
            assert_eq!(ids(&q), want.iter().copied().collect::<Vec<_>>());
            assert_eq!(q.front().map(|w| w.wr_id), want.front().copied());
            for (i, id) in want.iter().enumerate() {
                assert_eq!(q[i].wr_id, *id);
            }
            assert!(q.get(want.len()).is_none());
        }
        assert!(q.slots.len() > 2, "never grew");
    }

    #[test]
    fn a_reused_slot_starts_blank_and_keeps_its_memory() {
        let mut q = SendQueue::<Req>::new(1);
        let w = q.push();
        w.wr_id = 7;
        w.started = true;
        w.list.extend([1, 2, 3]);
        let cap = w.list.capacity();
        q.pop_front();
        let w = q.push();
        assert_eq!((w.wr_id, w.started, w.list.len()), (0, false, 0));
        assert_eq!(w.list.capacity(), cap);
        q.pop_back();
        assert_eq!(q.len(), 0);
        q.pop_front();
        assert_eq!(q.len(), 0);
    }
}
