//! The timer table of a device: one deadline per QP number (QP 1 stands for the connection
//! manager), the earliest found without a scan, and the due ones handed out in order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

/// One deadline per QP number.
///
/// A deadline replaced or cleared leaves a stale entry in the heap, skipped when it comes to
/// the top and swept out (in place) when stale entries outnumber live ones; so setting a
/// deadline allocates nothing once the table has grown to its working size.
#[derive(Debug, Default)]
pub struct TimerTable {
    deadlines: HashMap<u32, Instant>,
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
}

impl TimerTable {
    /// An empty table.
    pub fn new() -> TimerTable {
        TimerTable::default()
    }

    /// Sets (`Some`) or clears (`None`) the deadline of QP `qpn`, replacing the one it had.
    /// Never fails.
    pub fn set(&mut self, qpn: u32, deadline: Option<Instant>) {
        match deadline {
            Some(d) => {
                if self.deadlines.insert(qpn, d) != Some(d) {
                    self.heap.push(Reverse((d, qpn)));
                }
            }
            None => {
                self.deadlines.remove(&qpn);
            }
        }
        self.tidy();
    }

    /// The deadline of QP `qpn`, if it has one.
    pub fn get(&self, qpn: u32) -> Option<Instant> {
        self.deadlines.get(&qpn).copied()
    }

    /// The earliest deadline of all, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes the QPs whose deadline is at or before `now` out of the table and appends their
    /// numbers to `due`, earliest deadline first (equal deadlines by QP number); returns how
    /// many. The owner runs each one's timers and sets its next deadline. Calling it early
    /// or twice is harmless. `due` is the caller's, so that a reused vector costs nothing.
    pub fn handle_timeout(&mut self, now: Instant, due: &mut Vec<u32>) -> usize {
        let mut n = 0;
        while let Some(&Reverse((t, qpn))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if self.deadlines.get(&qpn) == Some(&t) {
                self.deadlines.remove(&qpn);
                due.push(qpn);
                n += 1;
            }
        }
        self.tidy();
        n
    }

    /// The number of QPs with a deadline.
    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// Whether no QP has a deadline.
    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }

    fn live(&self, t: Instant, qpn: u32) -> bool {
        self.deadlines.get(&qpn) == Some(&t)
    }

    /// Keeps the heap's top live and its stale entries fewer than about twice the live ones.
    fn tidy(&mut self) {
        if self.heap.len() > 2 * self.deadlines.len() + 32 {
            // In place: the vector keeps its allocation both ways.
            let mut v = std::mem::take(&mut self.heap).into_vec();
            v.retain(|Reverse((t, q))| self.deadlines.get(q) == Some(t));
            v.sort_unstable();
            v.dedup();
            self.heap = BinaryHeap::from(v);
        }
        while let Some(&Reverse((t, qpn))) = self.heap.peek() {
            if self.live(t, qpn) {
                break;
            }
            self.heap.pop();
        }
    }
}
