//! The BTH opcode table of the RC, UC and UD transports.
//!
//! An [`Opcode`] is the first byte of the base transport header. Its top three bits name the
//! transport ([`Transport`]), the low five bits the operation. Everything the rest of the
//! stack needs to know about an opcode (which extended transport headers follow the BTH and
//! in which order, whether a payload follows, where the packet sits inside a message, who
//! consumes it) is kept as data in [`OPCODE_TABLE`]; [`Opcode::info`] finds the entry of an
//! opcode in constant time.
//!
//! Only the opcodes softrdma implements are in the table: every RC, UC and UD opcode of the
//! IBTA specification, plus RC `ATOMIC_WRITE`. RD, XRC, CNP, `FLUSH`, reserved and
//! vendor-specific opcodes have no entry: [`Opcode::info`] returns `None` and
//! [`Opcode::lookup`] fails with [`Error::Unsupported`].

use crate::{Error, Result};
use core::fmt;

/// Length of the base transport header in bytes, where every extension header's offset starts
/// ([`crate::bth::HEADER_LEN`] is this value; it lives here because the opcode table lays out
/// the headers that follow the BTH, below the BTH's own module).
pub const BTH_LEN: usize = 12;

/// The transport service an opcode belongs to (the top three bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (`000`).
    Rc,
    /// Unreliable Connected (`001`).
    Uc,
    /// Reliable Datagram (`010`); not supported by softrdma or rxe.
    Rd,
    /// Unreliable Datagram (`011`).
    Ud,
    /// Congestion Notification Packet (`100`); RoCEv2 CNPs use opcode `0x81`.
    Cnp,
    /// Extended Reliable Connected (`101`).
    Xrc,
    /// Reserved transport value (`110`).
    Reserved,
    /// Manufacturer-specific opcodes (`111`).
    Vendor,
}

impl Transport {
    /// The transport encoded in the top three bits of `opcode`. Never fails: every byte maps
    /// to some transport value.
    pub const fn of(opcode: u8) -> Transport {
        match opcode >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            6 => Transport::Reserved,
            _ => Transport::Vendor,
        }
    }
}

/// An extended transport header that may follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA extended transport header ([`crate::reth`]), 16 bytes.
    Reth,
    /// ACK extended transport header ([`crate::aeth`]), 4 bytes.
    Aeth,
    /// Datagram extended transport header ([`crate::deth`]), 8 bytes.
    Deth,
    /// Immediate data ([`crate::immdt`]), 4 bytes.
    ImmDt,
    /// Invalidate extended transport header ([`crate::ieth`]), 4 bytes.
    Ieth,
    /// Atomic extended transport header ([`crate::atomic_eth`]), 28 bytes.
    AtomicEth,
    /// Atomic acknowledge extended transport header ([`crate::atomic_ack_eth`]), 8 bytes.
    AtomicAckEth,
}

impl ExtHeader {
    /// The number of extended header kinds.
    pub(crate) const COUNT: usize = 7;

    /// Every extended header kind, in [`ExtHeader::index`] order.
    #[cfg(test)]
    pub(crate) const ALL: [ExtHeader; ExtHeader::COUNT] = [
        ExtHeader::Reth,
        ExtHeader::Aeth,
        ExtHeader::Deth,
        ExtHeader::ImmDt,
        ExtHeader::Ieth,
        ExtHeader::AtomicEth,
        ExtHeader::AtomicAckEth,
    ];

    /// A dense index, `0..COUNT`.
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// A one-bit mask, `1 << index`.
    #[inline]
    pub(crate) const fn bit(self) -> u8 {
        1 << self.index()
    }

    /// Length of the header in bytes.
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            ExtHeader::Reth => crate::reth::HEADER_LEN,
            ExtHeader::Aeth => crate::aeth::HEADER_LEN,
            ExtHeader::Deth => crate::deth::HEADER_LEN,
            ExtHeader::ImmDt => crate::immdt::HEADER_LEN,
            ExtHeader::Ieth => crate::ieth::HEADER_LEN,
            ExtHeader::AtomicEth => crate::atomic_eth::HEADER_LEN,
            ExtHeader::AtomicAckEth => crate::atomic_ack_eth::HEADER_LEN,
        }
    }
}

/// Where a packet sits inside its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last packet of a multi-packet message.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The only packet of its message (also every request without payload and every ACK).
    Only,
}

impl Position {
    /// Whether a message starts with this packet (`First` or `Only`).
    pub const fn is_start(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether a message ends with this packet (`Last` or `Only`).
    pub const fn is_end(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Which side of a queue pair handles a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// A request: handled by the responder of the receiving QP.
    Request,
    /// An acknowledgement or a read/atomic response: handled by the requester (completer) of
    /// the receiving QP.
    Ack,
}

/// The operation a packet is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (any variant).
    Send,
    /// RDMA WRITE (any variant).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK or NAK).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// ATOMIC COMPARE & SWAP.
    CompareSwap,
    /// ATOMIC FETCH & ADD.
    FetchAdd,
    /// ATOMIC WRITE (IBA 1.5): a RETH and exactly 8 bytes of payload.
    AtomicWrite,
}

/// Everything known about one opcode: one row of [`OPCODE_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode this row describes.
    pub opcode: Opcode,
    /// The IBTA name, e.g. `"RC_SEND_FIRST"`.
    pub name: &'static str,
    /// The transport (top three opcode bits).
    pub transport: Transport,
    /// The operation.
    pub operation: Operation,
    /// The extended transport headers following the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// Bytes from the start of the BTH to the start of the payload.
    pub header_len: usize,
    /// Whether the packet may carry payload bytes (if not, it carries none and no pad).
    pub has_payload: bool,
    /// The position of the packet inside its message.
    pub position: Position,
    /// Request or acknowledgement class.
    pub class: Class,
    /// Whether the packet consumes a receive WQE at the responder.
    pub consumes_recv_wqe: bool,
    /// Whether the packet generates a receive completion at the responder.
    pub completes_recv: bool,
    /// Whether an ImmDt header is present.
    pub has_immediate: bool,
    /// Whether an IETH header is present.
    pub has_invalidate: bool,
}

impl OpcodeInfo {
    /// The byte offset of `header` from the start of the BTH, or `None` when this opcode does
    /// not carry that header.
    pub fn offset_of(&self, header: ExtHeader) -> Option<usize> {
        let mut at = BTH_LEN;
        for h in self.headers {
            if *h == header {
                return Some(at);
            }
            at += h.size();
        }
        None
    }

    /// Whether this opcode carries `header`.
    pub fn has_header(&self, header: ExtHeader) -> bool {
        self.headers.contains(&header)
    }

    const fn new(
        opcode: u8,
        name: &'static str,
        operation: Operation,
        headers: &'static [ExtHeader],
        position: Position,
    ) -> OpcodeInfo {
        let mut header_len = BTH_LEN;
        let mut has_immediate = false;
        let mut has_invalidate = false;
        let mut i = 0;
        while i < headers.len() {
            header_len += headers[i].size();
            match headers[i] {
                ExtHeader::ImmDt => has_immediate = true,
                ExtHeader::Ieth => has_invalidate = true,
                _ => {}
            }
            i += 1;
        }
        let has_payload = matches!(
            operation,
            Operation::Send
                | Operation::RdmaWrite
                | Operation::RdmaReadResponse
                | Operation::AtomicWrite
        );
        let class = match operation {
            Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge => {
                Class::Ack
            }
            _ => Class::Request,
        };
        let (consumes_recv_wqe, completes_recv) = match operation {
            Operation::Send => (position.is_start(), position.is_end()),
            Operation::RdmaWrite => (has_immediate, has_immediate),
            _ => (false, false),
        };
        OpcodeInfo {
            opcode: Opcode(opcode),
            name,
            transport: Transport::of(opcode),
            operation,
            headers,
            header_len,
            has_payload,
            position,
            class,
            consumes_recv_wqe,
            completes_recv,
            has_immediate,
            has_invalidate,
        }
    }
}

/// A BTH opcode (any byte value; use [`Opcode::info`] to learn whether it is supported).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RC SEND First.
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND Middle.
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND Last.
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND Last with Immediate.
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND Only with Immediate.
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE First.
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE Middle.
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE Last.
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE Last with Immediate.
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE Only.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// RC RDMA WRITE Only with Immediate.
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    /// RC RDMA READ Request.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC RDMA READ Response First.
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// RC RDMA READ Response Middle.
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// RC RDMA READ Response Last.
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// RC RDMA READ Response Only.
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC Acknowledge (ACK, RNR NAK or NAK).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC ATOMIC Acknowledge.
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC CmpSwap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FetchAdd.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND Last with Invalidate.
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// RC SEND Only with Invalidate.
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// RC FLUSH (IBA 1.5). Named only: it is not in the table (no FETH support).
    pub const RC_FLUSH: Opcode = Opcode(0x1c);
    /// RC ATOMIC WRITE (IBA 1.5).
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);

    /// UC SEND First.
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// UC SEND Middle.
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// UC SEND Last.
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// UC SEND Last with Immediate.
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    /// UC SEND Only.
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// UC SEND Only with Immediate.
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    /// UC RDMA WRITE First.
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE Middle.
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE Last.
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE Last with Immediate.
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// UC RDMA WRITE Only.
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    /// UC RDMA WRITE Only with Immediate.
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);

    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND Only with Immediate.
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);

    /// The RoCEv2 Congestion Notification Packet. Named only: it is not in the table.
    pub const CNP: Opcode = Opcode(0x81);

    /// The table row of this opcode, or `None` for RD, XRC, CNP, FLUSH, reserved and
    /// vendor-specific opcodes.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        let i = OPCODE_INDEX[usize::from(self.0)];
        OPCODE_TABLE.get(usize::from(i))
    }

    /// Like [`Opcode::info`], but fails with [`Error::Unsupported`] when the opcode has no
    /// table row.
    #[inline]
    pub fn lookup(self) -> Result<&'static OpcodeInfo> {
        self.info().ok_or(Error::Unsupported)
    }

    /// The transport named by the top three bits. Defined for every byte value.
    pub const fn transport(self) -> Transport {
        Transport::of(self.0)
    }

    /// The IBTA name, or `None` for opcodes without a table row.
    pub fn name(self) -> Option<&'static str> {
        self.info().map(|i| i.name)
    }
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Self {
        Opcode(v)
    }
}

impl From<Opcode> for u8 {
    fn from(v: Opcode) -> Self {
        v.0
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

use ExtHeader::{Aeth, AtomicAckEth, AtomicEth, Deth, Ieth, ImmDt, Reth};
use Operation as Op;
use Position::{First, Last, Middle, Only};

const NONE: &[ExtHeader] = &[];
const IMM: &[ExtHeader] = &[ImmDt];
const INV: &[ExtHeader] = &[Ieth];
const RETH: &[ExtHeader] = &[Reth];
const RETH_IMM: &[ExtHeader] = &[Reth, ImmDt];
const AETH: &[ExtHeader] = &[Aeth];
const AETH_ATOMIC_ACK: &[ExtHeader] = &[Aeth, AtomicAckEth];
const ATOMIC: &[ExtHeader] = &[AtomicEth];
const DETH: &[ExtHeader] = &[Deth];
const DETH_IMM: &[ExtHeader] = &[Deth, ImmDt];

const fn row(
    opcode: u8,
    name: &'static str,
    operation: Operation,
    headers: &'static [ExtHeader],
    position: Position,
) -> OpcodeInfo {
    OpcodeInfo::new(opcode, name, operation, headers, position)
}

/// Every supported opcode, sorted by opcode value.
pub static OPCODE_TABLE: [OpcodeInfo; 38] = TABLE;

const TABLE: [OpcodeInfo; 38] = [
    row(0x00, "RC_SEND_FIRST", Op::Send, NONE, First),
    row(0x01, "RC_SEND_MIDDLE", Op::Send, NONE, Middle),
    row(0x02, "RC_SEND_LAST", Op::Send, NONE, Last),
    row(0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Op::Send, IMM, Last),
    row(0x04, "RC_SEND_ONLY", Op::Send, NONE, Only),
    row(0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Op::Send, IMM, Only),
    row(0x06, "RC_RDMA_WRITE_FIRST", Op::RdmaWrite, RETH, First),
    row(0x07, "RC_RDMA_WRITE_MIDDLE", Op::RdmaWrite, NONE, Middle),
    row(0x08, "RC_RDMA_WRITE_LAST", Op::RdmaWrite, NONE, Last),
    row(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        Op::RdmaWrite,
        IMM,
        Last,
    ),
    row(0x0a, "RC_RDMA_WRITE_ONLY", Op::RdmaWrite, RETH, Only),
    row(
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        Op::RdmaWrite,
        RETH_IMM,
        Only,
    ),
    row(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        Op::RdmaReadRequest,
        RETH,
        Only,
    ),
    row(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        Op::RdmaReadResponse,
        AETH,
        First,
    ),
    row(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        Op::RdmaReadResponse,
        NONE,
        Middle,
    ),
    row(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        Op::RdmaReadResponse,
        AETH,
        Last,
    ),
    row(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        Op::RdmaReadResponse,
        AETH,
        Only,
    ),
    row(0x11, "RC_ACKNOWLEDGE", Op::Acknowledge, AETH, Only),
    row(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        Op::AtomicAcknowledge,
        AETH_ATOMIC_ACK,
        Only,
    ),
    row(0x13, "RC_COMPARE_SWAP", Op::CompareSwap, ATOMIC, Only),
    row(0x14, "RC_FETCH_ADD", Op::FetchAdd, ATOMIC, Only),
    row(0x16, "RC_SEND_LAST_WITH_INVALIDATE", Op::Send, INV, Last),
    row(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Op::Send, INV, Only),
    row(0x1d, "RC_ATOMIC_WRITE", Op::AtomicWrite, RETH, Only),
    row(0x20, "UC_SEND_FIRST", Op::Send, NONE, First),
    row(0x21, "UC_SEND_MIDDLE", Op::Send, NONE, Middle),
    row(0x22, "UC_SEND_LAST", Op::Send, NONE, Last),
    row(0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Op::Send, IMM, Last),
    row(0x24, "UC_SEND_ONLY", Op::Send, NONE, Only),
    row(0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Op::Send, IMM, Only),
    row(0x26, "UC_RDMA_WRITE_FIRST", Op::RdmaWrite, RETH, First),
    row(0x27, "UC_RDMA_WRITE_MIDDLE", Op::RdmaWrite, NONE, Middle),
    row(0x28, "UC_RDMA_WRITE_LAST", Op::RdmaWrite, NONE, Last),
    row(
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        Op::RdmaWrite,
        IMM,
        Last,
    ),
    row(0x2a, "UC_RDMA_WRITE_ONLY", Op::RdmaWrite, RETH, Only),
    row(
        0x2b,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        Op::RdmaWrite,
        RETH_IMM,
        Only,
    ),
    row(0x64, "UD_SEND_ONLY", Op::Send, DETH, Only),
    row(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        Op::Send,
        DETH_IMM,
        Only,
    ),
];

const NO_ROW: u8 = u8::MAX;

const fn build_index() -> [u8; 256] {
    let mut index = [NO_ROW; 256];
    let mut i = 0;
    while i < TABLE.len() {
        index[TABLE[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    index
}

static OPCODE_INDEX: [u8; 256] = build_index();

/// The parse/emit layout of one opcode byte, precomputed from [`OPCODE_TABLE`] so that the
/// packet code finds everything it needs with one indexed load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bytes from the start of the BTH to the payload; 0 for an unsupported opcode.
    pub(crate) header_len: u8,
    /// Bit [`ExtHeader::bit`] is set for every extended header the opcode carries.
    pub(crate) headers: u8,
    /// Offset from the start of the BTH of each extended header, indexed by
    /// [`ExtHeader::index`]; 0 when the opcode does not carry it.
    pub(crate) offsets: [u8; ExtHeader::COUNT],
    /// Whether the opcode may carry payload.
    pub(crate) has_payload: bool,
    /// Whether the opcode is an ATOMIC_WRITE (exactly [`crate::roce::ATOMIC_WRITE_LEN`]
    /// payload bytes).
    pub(crate) atomic_write: bool,
}

impl Layout {
    const UNSUPPORTED: Layout = Layout {
        header_len: 0,
        headers: 0,
        offsets: [0; ExtHeader::COUNT],
        has_payload: false,
        atomic_write: false,
    };

    /// The layout of `opcode`; `header_len` is 0 when the opcode is not supported.
    #[inline]
    pub(crate) fn of(opcode: u8) -> &'static Layout {
        &OPCODE_LAYOUT[usize::from(opcode)]
    }

    /// Whether the opcode has a row in [`OPCODE_TABLE`].
    #[inline]
    pub(crate) const fn is_supported(&self) -> bool {
        self.header_len != 0
    }

    /// The offset of `header` from the start of the BTH, `None` when not carried.
    #[inline]
    pub(crate) const fn offset_of(&self, header: ExtHeader) -> Option<usize> {
        match self.offsets[header.index()] {
            0 => None,
            at => Some(at as usize),
        }
    }

    const fn new(info: &OpcodeInfo) -> Layout {
        let mut layout = Layout {
            header_len: info.header_len as u8,
            headers: 0,
            offsets: [0; ExtHeader::COUNT],
            has_payload: info.has_payload,
            atomic_write: matches!(info.operation, Operation::AtomicWrite),
        };
        let mut at = BTH_LEN;
        let mut i = 0;
        while i < info.headers.len() {
            let h = info.headers[i];
            layout.headers |= h.bit();
            layout.offsets[h.index()] = at as u8;
            at += h.size();
            i += 1;
        }
        assert!(at == info.header_len && at <= u8::MAX as usize);
        layout
    }
}

const fn build_layout() -> [Layout; 256] {
    let mut layout = [Layout::UNSUPPORTED; 256];
    let mut i = 0;
    while i < TABLE.len() {
        layout[TABLE[i].opcode.0 as usize] = Layout::new(&TABLE[i]);
        i += 1;
    }
    layout
}

static OPCODE_LAYOUT: [Layout; 256] = build_layout();

#[cfg(test)]
mod tests {
    use super::*;

    /// Header lengths (BTH to payload) as listed in the notes' opcode table, written out
    /// independently of the table above.
    const EXPECTED_LEN: &[(u8, usize)] = &[
        (0x00, 12),
        (0x01, 12),
        (0x02, 12),
        (0x03, 16),
        (0x04, 12),
        (0x05, 16),
        (0x06, 28),
        (0x07, 12),
        (0x08, 12),
        (0x09, 16),
        (0x0a, 28),
        (0x0b, 32),
        (0x0c, 28),
        (0x0d, 16),
        (0x0e, 12),
        (0x0f, 16),
        (0x10, 16),
        (0x11, 16),
        (0x12, 24),
        (0x13, 40),
        (0x14, 40),
        (0x16, 16),
        (0x17, 16),
        (0x1d, 28),
        (0x64, 20),
        (0x65, 24),
    ];

    #[test]
    fn header_lengths_match_notes() {
        for &(op, len) in EXPECTED_LEN {
            assert_eq!(Opcode(op).lookup().unwrap().header_len, len, "{op:#x}");
        }
        // UC mirrors RC for SEND/WRITE.
        for op in 0x20..=0x2bu8 {
            let uc = Opcode(op).lookup().unwrap();
            let rc = Opcode(op - 0x20).lookup().unwrap();
            assert_eq!(uc.header_len, rc.header_len);
            assert_eq!(uc.headers, rc.headers);
            assert_eq!(uc.transport, Transport::Uc);
            assert_eq!(uc.name.replace("UC_", "RC_"), rc.name);
        }
    }

    #[test]
    fn table_is_sorted_and_indexed() {
        let mut last = None;
        for (i, row) in OPCODE_TABLE.iter().enumerate() {
            assert!(last < Some(row.opcode.0), "row {i} out of order");
            last = Some(row.opcode.0);
            assert!(core::ptr::eq(row.opcode.info().unwrap(), row));
            assert_eq!(row.transport, row.opcode.transport());
            assert_eq!(format!("{:?}", row.opcode), row.name);
        }
        let known = (0..=255u8).filter(|&o| Opcode(o).info().is_some()).count();
        assert_eq!(known, OPCODE_TABLE.len());
    }

    #[test]
    fn layout_matches_table() {
        for op in 0..=255u8 {
            let layout = Layout::of(op);
            let Some(info) = Opcode(op).info() else {
                assert_eq!(*layout, Layout::UNSUPPORTED, "{op:#x}");
                continue;
            };
            assert!(layout.is_supported());
            assert_eq!(usize::from(layout.header_len), info.header_len, "{op:#x}");
            assert_eq!(layout.has_payload, info.has_payload);
            assert_eq!(
                layout.atomic_write,
                info.operation == Operation::AtomicWrite
            );
            for h in ExtHeader::ALL {
                assert_eq!(layout.offset_of(h), info.offset_of(h), "{op:#x} {h:?}");
                assert_eq!(layout.headers & h.bit() != 0, info.has_header(h));
            }
        }
        for (i, h) in ExtHeader::ALL.iter().enumerate() {
            assert_eq!(h.index(), i);
        }
    }

    #[test]
    fn unsupported_opcodes() {
        for op in [
            0x15u8, 0x18, 0x1c, 0x1f, 0x2c, 0x40, 0x4a, 0x60, 0x63, 0x66, 0x81, 0xa0, 0xc0, 0xff,
        ] {
            assert_eq!(
                Opcode(op).lookup().unwrap_err(),
                Error::Unsupported,
                "{op:#x}"
            );
            assert_eq!(Opcode(op).name(), None);
        }
        assert_eq!(Opcode::RC_FLUSH.info(), None);
        assert_eq!(Opcode::CNP.transport(), Transport::Cnp);
        assert_eq!(Opcode(0x40).transport(), Transport::Rd);
        assert_eq!(Opcode(0xa0).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xc0).transport(), Transport::Reserved);
        assert_eq!(Opcode(0xe0).transport(), Transport::Vendor);
        assert_eq!(format!("{:?}", Opcode(0x81)), "Opcode(0x81)");
    }

    #[test]
    fn classification() {
        let i = |o: Opcode| o.lookup().unwrap();
        let send_first = i(Opcode::RC_SEND_FIRST);
        assert!(
            send_first.has_payload && send_first.consumes_recv_wqe && !send_first.completes_recv
        );
        assert_eq!(send_first.position, Position::First);
        let mid = i(Opcode::UC_SEND_MIDDLE);
        assert!(!mid.consumes_recv_wqe && !mid.completes_recv);
        assert_eq!(mid.position, Position::Middle);
        let last_inv = i(Opcode::RC_SEND_LAST_WITH_INVALIDATE);
        assert!(last_inv.has_invalidate && last_inv.completes_recv && !last_inv.consumes_recv_wqe);
        let w = i(Opcode::RC_RDMA_WRITE_ONLY);
        assert!(!w.consumes_recv_wqe && !w.completes_recv && !w.has_immediate);
        let wi = i(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE);
        assert!(wi.consumes_recv_wqe && wi.completes_recv && wi.has_immediate);
        assert_eq!(wi.headers, &[ExtHeader::Reth, ExtHeader::ImmDt]);
        assert_eq!(wi.offset_of(ExtHeader::ImmDt), Some(28));
        assert_eq!(wi.offset_of(ExtHeader::Aeth), None);
        let wli = i(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE);
        assert!(wli.consumes_recv_wqe && wli.completes_recv);
        let rd = i(Opcode::RC_RDMA_READ_REQUEST);
        assert!(!rd.has_payload && rd.class == Class::Request);
        for o in [
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_LAST,
            Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            Opcode::RC_ACKNOWLEDGE,
            Opcode::RC_ATOMIC_ACKNOWLEDGE,
        ] {
            assert_eq!(i(o).class, Class::Ack, "{o:?}");
        }
        assert!(i(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE).has_payload);
        assert!(!i(Opcode::RC_ACKNOWLEDGE).has_payload);
        let aa = i(Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(aa.headers, &[ExtHeader::Aeth, ExtHeader::AtomicAckEth]);
        assert_eq!(aa.offset_of(ExtHeader::AtomicAckEth), Some(16));
        let cs = i(Opcode::RC_COMPARE_SWAP);
        assert_eq!(
            (cs.operation, cs.has_payload),
            (Operation::CompareSwap, false)
        );
        assert_eq!(i(Opcode::RC_FETCH_ADD).operation, Operation::FetchAdd);
        let ud = i(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE);
        assert_eq!(ud.headers, &[ExtHeader::Deth, ExtHeader::ImmDt]);
        assert!(ud.consumes_recv_wqe && ud.completes_recv && ud.has_immediate);
        assert_eq!(ud.transport, Transport::Ud);
        assert_eq!(i(Opcode::RC_ATOMIC_WRITE).operation, Operation::AtomicWrite);
        assert!(Position::Only.is_start() && Position::Only.is_end());
        assert!(!Position::Middle.is_start() && !Position::First.is_end());
        assert_eq!(u8::from(Opcode::from(7u8)), 7);
        assert_eq!(Opcode::RC_SEND_ONLY.to_string(), "RC_SEND_ONLY");
    }
}
