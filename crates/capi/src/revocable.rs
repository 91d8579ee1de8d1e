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
//! A wait that finds its channel destroyed (`rdma_get_cm_event`, `ibv_get_cq_event`) on a
//! blocking descriptor waits as if it had come a moment before the destruction: as nothing
//! can arrive on a destroyed channel, until the process ends (what a thread already blocked
//! in `read(2)` on rdma-core's closed descriptor does; with rdma-core a call that comes later
//! gets `EBADF`, on which rping's CM thread calls `exit(-1)` while `main` returns). Such a
//! thread cannot be joined or cancelled: a program that destroys a channel must stop the
//! threads that use it first. On a descriptor that was non-blocking the call fails with
//! `EBADF` (what `read(2)` on the closed descriptor returns), as do the other calls given a
//! destroyed channel. A call that comes after the wrapper was reused for a new channel
//! reads that channel, as a call on reused memory does with rdma-core.

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
        loop {
            std::thread::park();
        }
    }
}

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
        let mut taken = None;
        let Ok(_) = self.revoke_with::<std::convert::Infallible>(fd, |v| {
            taken = Some(v);
            Ok(())
        });
        taken
    }

    /// Makes the slot live again with `v` (a pooled wrapper takes a new channel).
    pub fn restore(&self, v: T) {
        *self.lock() = State::Live(v);
    }

    /// Takes the object out if `destroy` accepts it, recording whether `fd` is non-blocking
    /// as [`Revocable::revoke`] does. `destroy` runs under the slot's lock, so no other
    /// thread sees the slot destroyed while the destruction may still fail; when it fails it
    /// gives the object back with the error, and the slot stays as it was.
    ///
    /// Returns `Ok(true)` when destroyed, `Ok(false)` when destroyed already, `Err` with
    /// `destroy`'s error otherwise.
    pub fn revoke_with<E>(
        &self,
        fd: RawFd,
        destroy: impl FnOnce(T) -> Result<(), (T, E)>,
    ) -> Result<bool, E> {
        let mut g = self.lock();
        if let State::Destroyed { .. } = *g {
            return Ok(false);
        }
        let nonblocking = nonblocking(fd);
        let State::Live(v) = std::mem::replace(&mut *g, State::Destroyed { nonblocking }) else {
            unreachable!("checked live above, under the same lock");
        };
        match destroy(v) {
            Ok(()) => Ok(true),
            Err((v, e)) => {
                *g = State::Live(v);
                Err(e)
            }
        }
    }
}

/// Whether `fd` is open and `O_NONBLOCK`.
fn nonblocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags (an invalid one gives -1).
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Destroyed wrappers of one kind, kept for the next wrapper of that kind (their memory is
/// never freed, so a late call on a destroyed channel reads a valid wrapper).
pub struct Pool {
    free: Mutex<Vec<Kept>>,
}

/// A wrapper kept in a [`Pool`].
struct Kept(*mut ());

// SAFETY: a kept wrapper is memory no thread owns until `Pool::take` hands it out.
unsafe impl Send for Kept {}

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
            .map(|k| k.0.cast::<W>())
    }

    /// Keeps a destroyed wrapper for reuse.
    pub fn put<W>(&self, w: *mut W) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Kept(w.cast()));
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
    fn a_destruction_that_fails_leaves_the_slot_live() {
        let s = Revocable::new(3u32);
        // (-1: no descriptor; taken as blocking.)
        assert_eq!(s.revoke_with(-1, |v| Err((v, "busy"))), Err("busy"));
        assert_eq!(s.get(), Ok(3));
        assert_eq!(
            s.revoke_with::<()>(-1, |v| {
                assert_eq!(v, 3);
                Ok(())
            }),
            Ok(true)
        );
        assert_eq!(s.get(), Err(Late { nonblocking: false }));
        assert_eq!(s.revoke_with::<()>(-1, |_| panic!("not called")), Ok(false));
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
