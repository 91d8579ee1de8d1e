//! Helpers shared by every C entry point: `errno`, panic containment, C strings.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in set_errno.
    unsafe { *libc::__errno_location() }
}

/// Runs `f`, turning a panic into `on_panic` with `errno = EIO`, so that no unwind crosses
/// the C boundary (a panic inside softrdma is a bug; the caller gets an error, not an abort).
#[inline]
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// For functions that return 0 or -1 with errno: runs `f`; `Err(errno)` sets errno and
/// gives -1.
#[inline]
pub fn ret_neg1(f: impl FnOnce() -> Result<(), i32>) -> libc::c_int {
    guard(-1, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// For functions that return 0 or a positive errno value (most `ibv_*` destroy/modify
/// calls): runs `f`; `Err(errno)` gives errno (and sets it too, as rdma-core often does).
#[inline]
pub fn ret_errno(f: impl FnOnce() -> Result<(), i32>) -> libc::c_int {
    guard(libc::EIO, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    })
}

/// For functions that return a pointer, NULL with errno on failure.
#[inline]
pub fn ret_ptr<T>(f: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    guard(std::ptr::null_mut(), || match f() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// A `'static` NUL-terminated C string from a literal.
#[macro_export]
macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const libc::c_char
    };
}
