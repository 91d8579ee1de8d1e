use core::fmt;

/// Why a buffer could not be read as (or written into) a packet.
///
/// Parsing in this crate never panics; every malformed input ends in one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer is shorter than the header, or than a length the header declares.
    Truncated,
    /// A field holds a value the format forbids: a wrong version, a pad count larger than the
    /// payload, a reserved opcode used where a real one is required, lengths that overflow.
    Malformed,
    /// The bytes are well formed but describe something this implementation does not handle
    /// (for example an RD or XRC opcode, or a management class other than CM).
    Unsupported,
    /// The invariant CRC carried by the packet does not match the one computed over it.
    BadIcrc,
}

/// The result type of this crate.
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "packet truncated",
            Error::Malformed => "malformed packet",
            Error::Unsupported => "unsupported packet",
            Error::BadIcrc => "invariant CRC mismatch",
        })
    }
}

impl std::error::Error for Error {}
