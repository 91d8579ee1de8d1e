//! The one error type of softrdma, carrying the errno that rdma-core would set.

use std::borrow::Cow;
use std::fmt;

/// What went wrong, as a category that maps one-to-one onto an errno value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument is out of range or inconsistent, or the call is not allowed in the
    /// object's current state (`EINVAL`).
    InvalidArgument,
    /// The object is still in use by others (child objects, unacknowledged events, multicast
    /// attachments) (`EBUSY`).
    Busy,
    /// The operation, QP type or option is not supported by the software device
    /// (`EOPNOTSUPP`).
    NotSupported,
    /// A queue is full or a device limit is reached (`ENOMEM`).
    NoMemory,
    /// A non-blocking call found nothing to return (`EAGAIN`).
    WouldBlock,
    /// The device does not exist or went away (`ENODEV`).
    NoDevice,
    /// The address is not a local address of any device (`EADDRNOTAVAIL`).
    AddrNotAvailable,
    /// The address or port is already used (`EADDRINUSE`).
    AddrInUse,
    /// The caller is not allowed to do this (`EPERM`).
    PermissionDenied,
    /// No data is available for the request, e.g. an empty GID entry (`ENODATA`).
    NoData,
    /// An operating-system call failed; the errno is the one the system returned.
    Os(i32),
    /// A work request completed with this non-success status (`EIO`); made by
    /// [`crate::WorkCompletion::ok`].
    Completion(softrdma_proto::transport::WcStatus),
}

impl ErrorKind {
    /// The errno value rdma-core would report for this kind of failure.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument => libc::EINVAL,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::NotSupported => libc::EOPNOTSUPP,
            ErrorKind::NoMemory => libc::ENOMEM,
            ErrorKind::WouldBlock => libc::EAGAIN,
            ErrorKind::NoDevice => libc::ENODEV,
            ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
            ErrorKind::AddrInUse => libc::EADDRINUSE,
            ErrorKind::PermissionDenied => libc::EPERM,
            ErrorKind::NoData => libc::ENODATA,
            ErrorKind::Os(e) => e,
            ErrorKind::Completion(_) => libc::EIO,
        }
    }
}

/// A failed verbs or connection-manager call: the errno rdma-core would set, and a sentence
/// that says what was wrong.
///
/// ```
/// use softrdma::{Error, ErrorKind};
/// let e = Error::new(ErrorKind::InvalidArgument, "cqe must be at least 1");
/// assert_eq!(e.errno(), libc::EINVAL);
/// assert_eq!(e.to_string(), "cqe must be at least 1 (EINVAL)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    msg: Cow<'static, str>,
}

impl Error {
    /// Creates an error of `kind` with an explanation.
    pub fn new(kind: ErrorKind, msg: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            msg: msg.into(),
        }
    }

    /// `EINVAL` with an explanation.
    pub fn invalid(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::InvalidArgument, msg)
    }

    /// `EBUSY` with an explanation.
    pub fn busy(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Busy, msg)
    }

    /// `EOPNOTSUPP` with an explanation.
    pub fn not_supported(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::NotSupported, msg)
    }

    /// `ENOMEM` with an explanation.
    pub fn no_memory(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::NoMemory, msg)
    }

    /// The error of the last failed system call, with what was being done.
    pub fn last_os_error(doing: impl Into<Cow<'static, str>>) -> Self {
        Self::from_io(std::io::Error::last_os_error(), doing)
    }

    /// Wraps an I/O error, keeping its errno.
    pub fn from_io(e: std::io::Error, doing: impl Into<Cow<'static, str>>) -> Self {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let kind = match errno {
            libc::EAGAIN => ErrorKind::WouldBlock,
            libc::EADDRINUSE => ErrorKind::AddrInUse,
            libc::EADDRNOTAVAIL => ErrorKind::AddrNotAvailable,
            libc::ENOMEM => ErrorKind::NoMemory,
            e => ErrorKind::Os(e),
        };
        Error::new(kind, format!("{}: {e}", doing.into()))
    }

    /// The category of the failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno rdma-core would set for this failure (`libc::EINVAL`, `libc::EBUSY`, ...).
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    /// The explanation, without the errno name.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// The status of the failed work completion this error stands for (from
    /// [`crate::WorkCompletion::ok`]), or `None` for any other error.
    pub fn wc_status(&self) -> Option<softrdma_proto::transport::WcStatus> {
        match self.kind {
            ErrorKind::Completion(s) => Some(s),
            _ => None,
        }
    }
}

/// The symbolic name of an errno value (`"EINVAL"`), or its number.
pub(crate) fn errno_name(errno: i32) -> Cow<'static, str> {
    let n = match errno {
        libc::EINVAL => "EINVAL",
        libc::EBUSY => "EBUSY",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOMEM => "ENOMEM",
        libc::EAGAIN => "EAGAIN",
        libc::ENODEV => "ENODEV",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EPERM => "EPERM",
        libc::ENODATA => "ENODATA",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EINTR => "EINTR",
        _ => return Cow::Owned(format!("errno {errno}")),
    };
    Cow::Borrowed(n)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.msg, errno_name(self.errno()))
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

/// The result type of softrdma.
pub type Result<T> = std::result::Result<T, Error>;

/// A destroy or deallocate call that failed: the error, and the object handed back intact so
/// that the caller can release what holds it and try again.
///
/// rdma-core returns an errno and leaves the object usable; owning the handle, Rust gives it
/// back here.
pub struct DestroyError<T> {
    /// The object that could not be destroyed, still valid.
    pub object: T,
    /// Why it could not be destroyed (usually `EBUSY`).
    pub error: Error,
}

impl<T> DestroyError<T> {
    /// The errno of the failure.
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }

    /// Gives back the object.
    pub fn into_inner(self) -> T {
        self.object
    }
}

impl<T> fmt::Debug for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestroyError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for DestroyError<T> {}

impl<T> From<DestroyError<T>> for Error {
    fn from(e: DestroyError<T>) -> Self {
        e.error
    }
}
