//! Use counting between verbs objects: a child holds its parent with a [`Hold`], and a parent
//! whose count is not zero refuses to be destroyed (`EBUSY`), as rdma-core's objects do.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An object that counts the objects using it.
pub(crate) trait Counted {
    fn users(&self) -> &AtomicUsize;
}

/// A counted reference from a child to its parent; dropping it releases the parent.
pub(crate) struct Hold<T: Counted>(Arc<T>);

impl<T: Counted> Hold<T> {
    pub(crate) fn new(target: &Arc<T>) -> Self {
        target.users().fetch_add(1, Ordering::AcqRel);
        Hold(target.clone())
    }

    pub(crate) fn arc(&self) -> &Arc<T> {
        &self.0
    }
}

impl<T: Counted> Deref for Hold<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Counted> Drop for Hold<T> {
    fn drop(&mut self) {
        self.0.users().fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many objects use `t` now.
pub(crate) fn users_of<T: Counted>(t: &T) -> usize {
    t.users().load(Ordering::Acquire)
}
