//! Channel wrappers that stay readable after they are destroyed.
//!
//! A C program may call `rdma_get_cm_event` or `ibv_get_cq_event` on a channel that another
//! of its threads has just destroyed: rping does at exit (its CM thread loops on the event
//! channel while `main` tears it down; rdma-core later fixed rping to join the thread
//! first). With rdma-core that call reads the freed struct. Here it must not read freed
//! memory: a channel wrapper's memory is never handed back to the allocator. Destroying a
//! channel [revokes](Revocable::revoke) the object inside it and puts the wrapper on its
//! kind's [`Pool`], from which the next channel of that kind is made.
//!
//! A call that finds its channel destroyed behaves as the same call made a moment before
//! the destruction: on a blocking descriptor it waits, and as nothing can arrive on a
//! destroyed channel it waits until the process ends (what a thread blocked in `read(2)` on
//! rdma-core's closed descriptor does); on a descriptor that was non-blocking it fails with
//! `EBADF` (what `read(2)` on the closed descriptor returns). A call that comes after the
//! wrapper was reused for a new channel reads that channel, as a call on reused memory does
//! with rdma-core.

use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};

/// An object that [`Revocable::revoke`] can take out of its wrapper while other threads
/// may still look at it.
pub struct Revocable<T> {
    state: Mutex<State<T>>,
}

enum State<T> {
    Live(T),
    Destroyed { nonblocking: bool },
}

/// A call on a destroyed channel; [`Late::wait`] does what it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Late {
    /// The channel's descriptor was `O_NONBLOCK` when it was destroyed.
    pub nonblocking: bool,
}

impl Late {
    /// Waits as a call on the destroyed channel would: never returns when the descriptor was
    /// blocking; gives `EBADF` when it was non-blocking.
    pub fn wait(self) -> i32 {
        if self.nonblocking {
            return libc::EBADF;
        }
        LATE_WAITERS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        loop {
            std::thread::park();
        }
    }
}

/// Threads that have called [`Late::wait`] on a blocking channel (they wait until the
/// process ends); the tests read it.
pub static LATE_WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl<T: Clone> Revocable<T> {
    /// A live slot holding `v`.
    pub fn new(v: T) -> Self {
        Revocable {
            state: Mutex::new(State::Live(v)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A clone of the object (its handle: the caller holds it for a wait).
    ///
    /// Fails with [`Late`] once the slot was revoked.
    pub fn get(&self) -> Result<T, Late> {
        match &*self.lock() {
            State::Live(v) => Ok(v.clone()),
            State::Destroyed { nonblocking } => Err(Late {
                nonblocking: *nonblocking,
            }),
        }
    }

    /// Takes the object out, recording whether `fd` (its descriptor, still open) is
    /// non-blocking for the calls that come later. `None` when already revoked.
    pub fn revoke(&self, fd: RawFd) -> Option<T> {
        // SAFETY: F_GETFL reads the flags of a descriptor the object still holds open.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let nonblocking = fl >= 0 && fl & libc::O_NONBLOCK != 0;
        let mut g = self.lock();
        if let State::Destroyed { .. } = *g {
            return None;
        }
        match std::mem::replace(&mut *g, State::Destroyed { nonblocking }) {
            State::Live(v) => Some(v),
            State::Destroyed { .. } => None,
        }
    }

    /// Makes the slot live again with `v` (a destruction that failed gives its object back;
    /// a pooled wrapper takes a new channel).
    pub fn restore(&self, v: T) {
        *self.lock() = State::Live(v);
    }
}

/// Destroyed wrappers of one kind, kept for the next wrapper of that kind (their memory is
/// never freed, so a late call on a destroyed channel reads a valid wrapper).
pub struct Pool {
    free: Mutex<Vec<usize>>,
}

impl Pool {
    /// An empty pool.
    pub const fn new() -> Pool {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    /// A destroyed wrapper to reuse, if there is one.
    pub fn take<W>(&self) -> Option<*mut W> {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .map(|p| p as *mut W)
    }

    /// Keeps a destroyed wrapper for reuse.
    pub fn put<W>(&self, w: *mut W) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(w as usize);
    }
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_slot_says_how_its_descriptor_was() {
        let (r, w) = {
            let mut fds = [0; 2];
            // SAFETY: pipe writes two descriptors into the array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            (fds[0], fds[1])
        };
        let s = Revocable::new(7u32);
        assert_eq!(s.get(), Ok(7));
        assert_eq!(s.revoke(r), Some(7));
        assert_eq!(s.get(), Err(Late { nonblocking: false }));
        assert_eq!(s.revoke(r), None, "a second revoke takes nothing");
        assert_eq!(s.get(), Err(Late { nonblocking: false }));
        s.restore(8);
        assert_eq!(s.get(), Ok(8));
        // SAFETY: r is the pipe's read end, open.
        unsafe { libc::fcntl(r, libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(s.revoke(r), Some(8));
        assert_eq!(s.get(), Err(Late { nonblocking: true }));
        assert_eq!(s.get().unwrap_err().wait(), libc::EBADF);
        // SAFETY: both descriptors are the test's own.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn a_pool_gives_back_what_it_kept() {
        let p = Pool::new();
        assert_eq!(p.take::<u64>(), None);
        let b = Box::into_raw(Box::new(5u64));
        p.put(b);
        let t = p.take::<u64>().unwrap();
        assert_eq!(t, b);
        assert_eq!(p.take::<u64>(), None);
        // SAFETY: b came from Box::into_raw above and is not used after.
        drop(unsafe { Box::from_raw(t) });
    }
}
