//! A whole RoCEv2 transport packet: the payload of a UDP datagram to port 4791.
//!
//! ```text
//! BTH (12) | extended transport headers (per opcode) | payload | pad (0..=3) | ICRC (4)
//! ```
//!
//! Which extended headers follow the BTH, and in what order, is decided by the opcode alone
//! (see [`crate::opcode`]). The pad makes payload + pad a multiple of four bytes; its length
//! is the BTH PadCnt. The ICRC is computed by [`crate::icrc`] and stored little-endian.
//!
//! ```
//! use softrdma_wire::{bth, opcode::Opcode, roce};
//! let repr = roce::Repr {
//!     bth: bth::Repr {
//!         opcode: Opcode::RC_SEND_ONLY, solicited_event: false, mig_req: false,
//!         pad_count: 3, pkey: 0xffff, fecn: false, becn: false, dest_qp: 0x11,
//!         ack_req: true, psn: 0x123456,
//!     },
//!     payload_len: 5,
//!     ..roce::Repr::default()
//! };
//! let mut buf = vec![0u8; repr.buffer_len()];
//! repr.emit(&mut roce::Packet::new_unchecked(&mut buf[..]), b"hello").unwrap();
//! let packet = roce::Packet::new_checked(&buf[..]).unwrap();
//! assert_eq!(packet.payload(), b"hello");
//! assert_eq!(roce::Repr::parse(&packet).unwrap(), repr);
//! ```

use crate::opcode::{ExtHeader, Layout, Opcode, OpcodeInfo};
use crate::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, Error, Result};
use core::ops::Range;

/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// The shortest possible transport packet: a BTH and an ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// The payload length an RC ATOMIC_WRITE must carry.
pub const ATOMIC_WRITE_LEN: usize = 8;

/// A read/write view of a RoCEv2 transport packet (BTH through ICRC) filling a buffer.
///
/// The whole buffer is the packet: the ICRC is its last four bytes. Accessors never panic on
/// a view returned by [`Packet::new_checked`]; on an unchecked view they return empty slices
/// or `None` where the buffer is too short, except the BTH getters of [`Packet::bth`],
/// which panic on a buffer shorter than a BTH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without validating it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the layout: fails with [`Error::Truncated`] when the buffer is shorter than
    /// a BTH, or than the opcode's headers plus the ICRC; with [`Error::Unsupported`] when
    /// the opcode is not in the opcode table; with [`Error::Malformed`] when PadCnt is larger
    /// than the bytes between the headers and the ICRC.
    pub fn check_len(&self) -> Result<()> {
        check_layout(self.buffer.as_ref()).map(|_| ())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Length of the whole packet, BTH through ICRC.
    pub fn len(&self) -> usize {
        self.buffer.as_ref().len()
    }

    /// Whether the buffer is empty (never true for a checked view).
    pub fn is_empty(&self) -> bool {
        self.buffer.as_ref().is_empty()
    }

    /// The BTH opcode (opcode 0 on an empty unchecked buffer).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref().first().copied().unwrap_or(0))
    }

    /// The opcode table row, `None` for unsupported opcodes (never for a checked view).
    pub fn opcode_info(&self) -> Option<&'static OpcodeInfo> {
        self.opcode().info()
    }

    /// Bytes from the start of the BTH to the payload (just the BTH for an unsupported
    /// opcode).
    pub fn header_len(&self) -> usize {
        match Layout::of(self.opcode().0).header_len {
            0 => bth::HEADER_LEN,
            len => usize::from(len),
        }
    }

    /// PadCnt from the BTH (0 on an empty unchecked buffer).
    pub fn pad_count(&self) -> usize {
        self.buffer
            .as_ref()
            .get(1)
            .map_or(0, |b| usize::from((b >> 4) & 3))
    }

    /// The BTH view (the first twelve bytes, fewer if the buffer is shorter).
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        let b = self.buffer.as_ref();
        bth::Packet::new_unchecked(&b[..b.len().min(bth::HEADER_LEN)])
    }

    fn ext_range(&self, header: ExtHeader) -> Option<Range<usize>> {
        let at = Layout::of(self.opcode().0).offset_of(header)?;
        let range = at..at + header.size();
        if range.end <= self.buffer.as_ref().len() {
            Some(range)
        } else {
            None
        }
    }

    fn ext(&self, header: ExtHeader) -> Option<&[u8]> {
        let range = self.ext_range(header)?;
        self.buffer.as_ref().get(range)
    }

    /// The raw bytes of an extended header, `None` when the opcode does not carry it.
    pub fn ext_header(&self, header: ExtHeader) -> Option<&[u8]> {
        self.ext(header)
    }

    /// The RETH, when the opcode carries one.
    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.ext(ExtHeader::Reth).map(reth::Packet::new_unchecked)
    }

    /// The AETH, when the opcode carries one.
    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.ext(ExtHeader::Aeth).map(aeth::Packet::new_unchecked)
    }

    /// The DETH, when the opcode carries one.
    pub fn deth(&self) -> Option<deth::Packet<&[u8]>> {
        self.ext(ExtHeader::Deth).map(deth::Packet::new_unchecked)
    }

    /// The ImmDt, when the opcode carries one.
    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.ext(ExtHeader::ImmDt).map(immdt::Packet::new_unchecked)
    }

    /// The IETH, when the opcode carries one.
    pub fn ieth(&self) -> Option<ieth::Packet<&[u8]>> {
        self.ext(ExtHeader::Ieth).map(ieth::Packet::new_unchecked)
    }

    /// The AtomicETH, when the opcode carries one.
    pub fn atomic_eth(&self) -> Option<atomic_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicEth)
            .map(atomic_eth::Packet::new_unchecked)
    }

    /// The AtomicAckETH, when the opcode carries one.
    pub fn atomic_ack_eth(&self) -> Option<atomic_ack_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicAckEth)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    /// Start and end of the payload; empty when the buffer is inconsistent.
    fn payload_range(&self) -> Range<usize> {
        let start = self.header_len();
        let end = self
            .len()
            .saturating_sub(ICRC_LEN)
            .saturating_sub(self.pad_count());
        start..end.max(start)
    }

    /// The payload, without the pad.
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(self.payload_range())
            .unwrap_or(&[])
    }

    /// The pad bytes between payload and ICRC (normally zeros).
    pub fn pad(&self) -> &[u8] {
        let start = self.payload_range().end;
        let end = self.len().saturating_sub(ICRC_LEN).max(start);
        self.buffer.as_ref().get(start..end).unwrap_or(&[])
    }

    /// The bytes the ICRC covers after the UDP header: BTH through pad.
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len().saturating_sub(ICRC_LEN)]
    }

    /// The ICRC as carried on the wire: the last four bytes read little-endian (0 when the
    /// buffer is shorter than four bytes).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        match b.len().checked_sub(ICRC_LEN).and_then(|at| b.get(at..)) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
            _ => 0,
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// A mutable BTH view (the first twelve bytes, fewer if the buffer is shorter).
    pub fn bth_mut(&mut self) -> bth::Packet<&mut [u8]> {
        let b = self.buffer.as_mut();
        let n = b.len().min(bth::HEADER_LEN);
        bth::Packet::new_unchecked(&mut b[..n])
    }

    /// The raw bytes of an extended header, mutable; `None` when the opcode does not carry
    /// it or the buffer is too short.
    pub fn ext_header_mut(&mut self, header: ExtHeader) -> Option<&mut [u8]> {
        let range = self.ext_range(header)?;
        self.buffer.as_mut().get_mut(range)
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.payload_range();
        match self.buffer.as_mut().get_mut(range) {
            Some(s) => s,
            None => &mut [],
        }
    }

    /// Stores `icrc` little-endian in the last four bytes (does nothing on a buffer shorter
    /// than four bytes).
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        if let Some(at) = b.len().checked_sub(ICRC_LEN) {
            b[at..].copy_from_slice(&icrc.to_le_bytes());
        }
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The headers of a transport packet and the length of its payload.
///
/// Exactly the extended headers the opcode carries are `Some`. `bth.pad_count` is always
/// `payload_pad(payload_len)` in a parsed `Repr`; [`Repr::emit`] writes that value whatever
/// the field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The base transport header.
    pub bth: bth::Repr,
    /// RETH (RDMA WRITE first/only, READ request, ATOMIC_WRITE).
    pub reth: Option<reth::Repr>,
    /// AETH (ACK, READ response first/last/only, ATOMIC ACK).
    pub aeth: Option<aeth::Repr>,
    /// DETH (UD).
    pub deth: Option<deth::Repr>,
    /// Immediate data (`*_WITH_IMMEDIATE`).
    pub immdt: Option<immdt::Repr>,
    /// IETH (`SEND_*_WITH_INVALIDATE`).
    pub ieth: Option<ieth::Repr>,
    /// AtomicETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// Payload bytes, pad excluded.
    pub payload_len: usize,
}

impl Default for Repr {
    /// An RC SEND_FIRST to QP 0 with P_Key 0xFFFF, PSN 0, no payload and no extended headers.
    fn default() -> Repr {
        Repr {
            bth: bth::Repr {
                opcode: Opcode::RC_SEND_FIRST,
                solicited_event: false,
                mig_req: false,
                pad_count: 0,
                pkey: bth::DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: 0,
                ack_req: false,
                psn: 0,
            },
            reth: None,
            aeth: None,
            deth: None,
            immdt: None,
            ieth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            payload_len: 0,
        }
    }
}

/// Validates the layout of a transport packet like [`Packet::check_len`], returning the
/// BTH bytes, the opcode's layout and the payload length.
#[inline]
fn check_layout(b: &[u8]) -> Result<(&[u8; bth::HEADER_LEN], &'static Layout, usize)> {
    let Some(bth) = b.first_chunk::<{ bth::HEADER_LEN }>() else {
        return Err(Error::Truncated);
    };
    let layout = Layout::of(bth[0]);
    if !layout.is_supported() {
        return Err(Error::Unsupported);
    }
    let fixed = usize::from(layout.header_len) + ICRC_LEN;
    let Some(room) = b.len().checked_sub(fixed) else {
        return Err(Error::Truncated);
    };
    let pad = usize::from((bth[1] >> 4) & 3);
    match room.checked_sub(pad) {
        Some(payload_len) => Ok((bth, layout, payload_len)),
        None => Err(Error::Malformed),
    }
}

/// The bytes of extended header `header` inside `b`, `None` when the opcode of `layout`
/// does not carry it (or `b` is too short).
#[inline]
fn ext_bytes<'a>(b: &'a [u8], layout: &Layout, header: ExtHeader) -> Option<&'a [u8]> {
    let at = layout.offset_of(header)?;
    b.get(at..at + header.size())
}

/// The bytes of extended header `header` inside `b`, which holds every header of an opcode
/// whose `layout` carries `header` (checked by [`Repr::layout`]).
#[inline]
fn ext_bytes_mut<'a>(b: &'a mut [u8], layout: &Layout, header: ExtHeader) -> &'a mut [u8] {
    let at = usize::from(layout.offsets[header.index()]);
    &mut b[at..at + header.size()]
}

fn parse_opt<V, R>(view: Option<V>, parse: impl FnOnce(&V) -> Result<R>) -> Result<Option<R>> {
    view.map(|v| parse(&v)).transpose()
}

impl Repr {
    /// The pad length for a payload of `len` bytes: `(-len) & 3`.
    pub const fn payload_pad(len: usize) -> usize {
        len.wrapping_neg() & 3
    }

    /// Reads every header of a packet.
    ///
    /// Fails like [`Packet::check_len`], then with [`Error::Malformed`] when TVer is not 0,
    /// an AETH syndrome is reserved, an opcode without payload carries payload or pad, PadCnt
    /// is not `(-payload_len) & 3`, or an ATOMIC_WRITE payload is not 8 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        let b = packet.buffer.as_ref();
        let (bth, layout, payload_len) = check_layout(b)?;
        Self::parse_checked(b, bth, layout, payload_len)
    }

    /// Checks and reads a whole packet (BTH through ICRC) in one pass: what
    /// [`Packet::new_checked`], [`Repr::parse`] and [`Packet::payload`] give together, with
    /// the opcode's layout looked up once. Fails as they do.
    #[inline]
    pub fn parse_packet(b: &[u8]) -> Result<(Repr, &[u8])> {
        let (bth, layout, payload_len) = check_layout(b)?;
        let repr = Self::parse_checked(b, bth, layout, payload_len)?;
        let start = usize::from(layout.header_len);
        Ok((repr, &b[start..start + payload_len]))
    }

    /// [`Repr::parse`] after [`check_layout`] accepted `b`.
    #[inline]
    fn parse_checked(
        b: &[u8],
        bth: &[u8; bth::HEADER_LEN],
        layout: &Layout,
        payload_len: usize,
    ) -> Result<Repr> {
        let bth = bth::Repr::from_bytes(bth)?;
        let pad = usize::from(bth.pad_count);
        if !layout.has_payload && (payload_len != 0 || pad != 0) {
            return Err(Error::Malformed);
        }
        if pad != Self::payload_pad(payload_len) {
            return Err(Error::Malformed);
        }
        if layout.atomic_write && payload_len != ATOMIC_WRITE_LEN {
            return Err(Error::Malformed);
        }
        let ext = |h| ext_bytes(b, layout, h);
        Ok(Repr {
            bth,
            reth: parse_opt(ext(ExtHeader::Reth).map(reth::Packet::new_unchecked), |p| {
                reth::Repr::parse(p)
            })?,
            aeth: parse_opt(ext(ExtHeader::Aeth).map(aeth::Packet::new_unchecked), |p| {
                aeth::Repr::parse(p)
            })?,
            deth: parse_opt(ext(ExtHeader::Deth).map(deth::Packet::new_unchecked), |p| {
                deth::Repr::parse(p)
            })?,
            immdt: parse_opt(
                ext(ExtHeader::ImmDt).map(immdt::Packet::new_unchecked),
                |p| immdt::Repr::parse(p),
            )?,
            ieth: parse_opt(ext(ExtHeader::Ieth).map(ieth::Packet::new_unchecked), |p| {
                ieth::Repr::parse(p)
            })?,
            atomic_eth: parse_opt(
                ext(ExtHeader::AtomicEth).map(atomic_eth::Packet::new_unchecked),
                |p| atomic_eth::Repr::parse(p),
            )?,
            atomic_ack_eth: parse_opt(
                ext(ExtHeader::AtomicAckEth).map(atomic_ack_eth::Packet::new_unchecked),
                |p| atomic_ack_eth::Repr::parse(p),
            )?,
            payload_len,
        })
    }

    /// The opcode table row of `bth.opcode`; fails with [`Error::Unsupported`] when the
    /// opcode has none.
    pub fn opcode_info(&self) -> Result<&'static OpcodeInfo> {
        self.bth.opcode.lookup()
    }

    /// The extended headers present, one [`ExtHeader`] bit each.
    fn present_mask(&self) -> u8 {
        let bit = |present: bool, h: ExtHeader| if present { h.bit() } else { 0 };
        bit(self.reth.is_some(), ExtHeader::Reth)
            | bit(self.aeth.is_some(), ExtHeader::Aeth)
            | bit(self.deth.is_some(), ExtHeader::Deth)
            | bit(self.immdt.is_some(), ExtHeader::ImmDt)
            | bit(self.ieth.is_some(), ExtHeader::Ieth)
            | bit(self.atomic_eth.is_some(), ExtHeader::AtomicEth)
            | bit(self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth)
    }

    /// [`Repr::check`], returning the opcode's layout.
    #[inline]
    fn layout(&self) -> Result<&'static Layout> {
        let layout = Layout::of(self.bth.opcode.0);
        if !layout.is_supported() {
            return Err(Error::Unsupported);
        }
        if self.present_mask() != layout.headers {
            return Err(Error::Malformed);
        }
        if !layout.has_payload && self.payload_len != 0 {
            return Err(Error::Malformed);
        }
        if layout.atomic_write && self.payload_len != ATOMIC_WRITE_LEN {
            return Err(Error::Malformed);
        }
        Ok(layout)
    }

    /// Checks that the representation can be emitted: the opcode is supported (else
    /// [`Error::Unsupported`]), exactly its extended headers are present, an opcode without
    /// payload has `payload_len == 0` and an ATOMIC_WRITE has 8 (else [`Error::Malformed`]).
    pub fn check(&self) -> Result<&'static OpcodeInfo> {
        self.layout()?;
        self.opcode_info()
    }

    /// Bytes from the BTH to the payload: the BTH plus every present extended header.
    pub fn header_len(&self) -> usize {
        let len = |present: bool, h: ExtHeader| if present { h.size() } else { 0 };
        bth::HEADER_LEN
            + len(self.reth.is_some(), ExtHeader::Reth)
            + len(self.aeth.is_some(), ExtHeader::Aeth)
            + len(self.deth.is_some(), ExtHeader::Deth)
            + len(self.immdt.is_some(), ExtHeader::ImmDt)
            + len(self.ieth.is_some(), ExtHeader::Ieth)
            + len(self.atomic_eth.is_some(), ExtHeader::AtomicEth)
            + len(self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth)
    }

    /// Length of the whole packet: headers, payload, pad and ICRC (saturating at
    /// `usize::MAX` for absurd payload lengths, which [`Repr::emit`] then rejects).
    pub fn buffer_len(&self) -> usize {
        Self::packet_len(self.header_len(), self.payload_len)
    }

    /// [`Repr::buffer_len`] for `header_len` bytes of headers.
    #[inline]
    fn packet_len(header_len: usize, payload_len: usize) -> usize {
        header_len
            .saturating_add(payload_len)
            .saturating_add(Self::payload_pad(payload_len))
            .saturating_add(ICRC_LEN)
    }

    /// Writes the BTH (PadCnt computed from `payload_len`) and the extended headers into the
    /// start of `buf`, returning [`Repr::header_len`]. This is the header half of
    /// [`Repr::emit`], for callers that gather the payload from elsewhere.
    ///
    /// Fails like [`Repr::check`], and with [`Error::Truncated`] when `buf` is shorter than
    /// the headers.
    pub fn emit_header(&self, buf: &mut [u8]) -> Result<usize> {
        let layout = self.layout()?;
        self.write_header(buf, layout)
    }

    /// Writes everything of the packet but its payload: the headers (as
    /// [`Repr::emit_header`]) at the start of `buf`, then zeroes in the pad and ICRC bytes
    /// after the `payload_len` bytes the caller fills. Returns the header length and the
    /// packet length ([`Repr::buffer_len`]); the packet is `buf[..packet length]`. One pass:
    /// the opcode's layout is looked up once for both lengths.
    ///
    /// Fails like [`Repr::check`], and with [`Error::Truncated`] (writing nothing) when `buf`
    /// is shorter than the packet.
    #[inline]
    pub fn emit_around_payload(&self, buf: &mut [u8]) -> Result<(usize, usize)> {
        let layout = self.layout()?;
        let hlen = usize::from(layout.header_len);
        let total = Self::packet_len(hlen, self.payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::Truncated)?;
        self.write_header(buf, layout)?;
        buf[hlen + self.payload_len..].fill(0);
        Ok((hlen, total))
    }

    /// [`Repr::emit_header`] after [`Repr::layout`] accepted `self`.
    #[inline]
    fn write_header(&self, buf: &mut [u8], layout: &Layout) -> Result<usize> {
        let len = usize::from(layout.header_len);
        let buf = buf.get_mut(..len).ok_or(Error::Truncated)?;
        let mut bth = self.bth;
        bth.pad_count = Self::payload_pad(self.payload_len) as u8;
        buf[..bth::HEADER_LEN].copy_from_slice(&bth.to_bytes());
        if let Some(r) = self.reth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::Reth);
            r.emit(&mut reth::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.aeth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::Aeth);
            r.emit(&mut aeth::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.deth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::Deth);
            r.emit(&mut deth::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.immdt {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::ImmDt);
            r.emit(&mut immdt::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.ieth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::Ieth);
            r.emit(&mut ieth::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.atomic_eth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::AtomicEth);
            r.emit(&mut atomic_eth::Packet::new_unchecked(dst));
        }
        if let Some(r) = self.atomic_ack_eth {
            let dst = ext_bytes_mut(buf, layout, ExtHeader::AtomicAckEth);
            r.emit(&mut atomic_ack_eth::Packet::new_unchecked(dst));
        }
        Ok(len)
    }

    /// Writes the whole packet: headers, `payload`, zero pad and a zero ICRC (the caller
    /// computes the ICRC with [`crate::icrc`] and stores it with [`Packet::set_icrc`]).
    ///
    /// The view's buffer must be exactly [`Repr::buffer_len`] bytes long. Fails like
    /// [`Repr::check`]; with [`Error::Malformed`] when `payload.len() != payload_len` or
    /// the buffer is longer than needed; with [`Error::Truncated`] when it is shorter.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        payload: &[u8],
    ) -> Result<()> {
        let layout = self.layout()?;
        if payload.len() != self.payload_len {
            return Err(Error::Malformed);
        }
        let need = Self::packet_len(usize::from(layout.header_len), self.payload_len);
        let buf = packet.buffer.as_mut();
        if buf.len() < need {
            return Err(Error::Truncated);
        }
        if buf.len() > need {
            return Err(Error::Malformed);
        }
        let hlen = self.write_header(buf, layout)?;
        let (body, icrc) = buf.split_at_mut(need - ICRC_LEN);
        let (data, pad) = body[hlen..].split_at_mut(self.payload_len);
        data.copy_from_slice(payload);
        pad.fill(0);
        icrc.fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};

    fn bth(opcode: Opcode, pad: u8) -> bth::Repr {
        bth::Repr {
            opcode,
            solicited_event: false,
            mig_req: false,
            pad_count: pad,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x123456,
        }
    }

    // RC SEND_ONLY "hello, rxe!!\n" (13 bytes, pad 3), ICRC left zero.
    const SEND_ONLY: [u8; 32] = [
        0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, b'h', b'e', b'l',
        b'l', b'o', b',', b' ', b'r', b'x', b'e', b'!', b'!', b'\n', 0, 0, 0, 0x42, 0x1d, 0x77,
        0x25,
    ];

    #[test]
    fn golden_send_only() {
        let p = Packet::new_checked(&SEND_ONLY[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY);
        assert_eq!(p.header_len(), 12);
        assert_eq!(p.payload(), b"hello, rxe!!\n");
        assert_eq!(p.pad(), &[0, 0, 0]);
        assert_eq!(p.icrc(), 0x2577_1d42);
        assert_eq!(p.icrc_covered(), &SEND_ONLY[..28]);
        assert!(p.reth().is_none() && p.aeth().is_none() && p.deth().is_none());
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            r,
            Repr {
                bth: bth(Opcode::RC_SEND_ONLY, 3),
                payload_len: 13,
                ..Repr::default()
            }
        );
        assert_eq!(r.buffer_len(), 32);
        assert_eq!(r.header_len(), 12);
        let mut out = [0xeeu8; 32];
        let mut q = Packet::new_unchecked(&mut out[..]);
        r.emit(&mut q, b"hello, rxe!!\n").unwrap();
        assert_eq!(q.icrc(), 0);
        q.set_icrc(0x2577_1d42);
        assert_eq!(out, SEND_ONLY);
    }

    #[test]
    fn golden_write_only_imm_and_atomic_ack() {
        // RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: BTH | RETH | ImmDt | 4 bytes | ICRC
        let mut b = vec![0x0b, 0x00, 0xff, 0xff, 0, 0, 0, 0x22, 0x80, 0, 0, 7];
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 4]);
        b.extend_from_slice(&[0xca, 0xfe, 0xba, 0xbe]);
        b.extend_from_slice(b"abcd");
        b.extend_from_slice(&[1, 2, 3, 4]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 32);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            r.reth,
            Some(reth::Repr {
                va: 0x1000,
                rkey: 0x1234,
                dma_len: 4
            })
        );
        assert_eq!(
            r.immdt,
            Some(immdt::Repr {
                imm_data: 0xcafe_babe
            })
        );
        assert_eq!(p.payload(), b"abcd");
        assert_eq!(p.icrc(), 0x0403_0201);
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut out[..]), b"abcd")
            .unwrap();
        assert_eq!(out[..36], b[..36]);

        // RC_ATOMIC_ACKNOWLEDGE: BTH | AETH | AtomicAckETH | ICRC
        let mut a = vec![0x12, 0x00, 0xff, 0xff, 0, 0, 0, 0x22, 0, 0, 0, 9];
        a.extend_from_slice(&[0x1f, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0x2a, 0, 0, 0, 0]);
        let r = Repr::parse(&Packet::new_checked(&a[..]).unwrap()).unwrap();
        assert_eq!(
            r.aeth,
            Some(aeth::Repr {
                syndrome: Syndrome::Ack { credit: 0x1f },
                msn: 5
            })
        );
        assert_eq!(
            r.atomic_ack_eth,
            Some(atomic_ack_eth::Repr { orig_data: 42 })
        );
        assert_eq!(r.payload_len, 0);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..16 {
            assert_eq!(
                Packet::new_checked(&SEND_ONLY[..n]).unwrap_err(),
                Error::Truncated,
                "len {n}"
            );
        }
        // 16 bytes: BTH + ICRC, pad 3 but nothing to pad.
        assert_eq!(
            Packet::new_checked(&SEND_ONLY[..16]).unwrap_err(),
            Error::Malformed
        );
        // With pad 0 every length from 16 up is a valid layout.
        let mut b = SEND_ONLY;
        b[1] = 0;
        for n in 16..=32 {
            let p = Packet::new_checked(&b[..n]).unwrap();
            assert_eq!(p.payload().len(), n - 16);
        }
        // An atomic needs 40 + 4 bytes.
        let mut a = [0u8; 44];
        a[0] = Opcode::RC_FETCH_ADD.0;
        for n in 0..44 {
            assert_eq!(Packet::new_checked(&a[..n]).unwrap_err(), Error::Truncated);
        }
        assert!(Packet::new_checked(&a[..]).is_ok());
    }

    #[test]
    fn unchecked_views_do_not_panic() {
        for n in 0..SEND_ONLY.len() {
            let p = Packet::new_unchecked(&SEND_ONLY[..n]);
            let _ = (p.payload(), p.pad(), p.icrc(), p.icrc_covered(), p.reth());
            let _ = Repr::parse(&p);
        }
        let p = Packet::new_unchecked(&[0x06u8, 0x30][..]);
        assert!(p.reth().is_none());
        assert_eq!(p.payload(), &[] as &[u8]);
    }

    #[test]
    fn unknown_opcodes_unsupported() {
        let mut b = [0u8; 64];
        for op in 0..=255u8 {
            b[0] = op;
            let r = Packet::new_checked(&b[..]);
            if Opcode(op).info().is_none() {
                assert_eq!(r.unwrap_err(), Error::Unsupported, "opcode {op:#x}");
            } else {
                assert!(r.is_ok(), "opcode {op:#x}");
            }
        }
    }

    #[test]
    fn malformed_cases() {
        // TVer != 0
        let mut b = SEND_ONLY;
        b[1] |= 0x01;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        // pad inconsistent with payload length: 15 bytes between headers and ICRC, pad 3,
        // so 12 bytes of payload that would need no pad.
        let mut b = SEND_ONLY.to_vec();
        b.remove(27);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload().len(), 12);
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        // payload on an ACK
        let mut ack = vec![0x11, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0x1f, 0, 0, 1];
        ack.extend_from_slice(&[9, 9, 9, 9, 0, 0, 0, 0]);
        let p = Packet::new_checked(&ack[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        // reserved AETH syndrome
        let ack = [
            0x11, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0x40, 0, 0, 1, 0, 0, 0, 0,
        ];
        let p = Packet::new_checked(&ack[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        // NAK syndrome 0x65 is reserved too, 0x60 is fine
        let mut nak = ack;
        nak[12] = 0x65;
        let p = Packet::new_checked(&nak[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), Error::Malformed);
        nak[12] = 0x60;
        let r = Repr::parse(&Packet::new_checked(&nak[..]).unwrap()).unwrap();
        assert_eq!(
            r.aeth.unwrap().syndrome,
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        // ATOMIC_WRITE with a 4-byte payload
        let mut aw = vec![0x1d, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        aw.extend_from_slice(&[0; 16]);
        aw.extend_from_slice(&[0; 8]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&aw[..]).unwrap()).unwrap_err(),
            Error::Malformed
        );
    }

    #[test]
    fn emit_rejects_inconsistent_reprs() {
        let good = Repr {
            bth: bth(Opcode::RC_RDMA_WRITE_ONLY, 0),
            reth: Some(reth::Repr {
                va: 1,
                rkey: 2,
                dma_len: 4,
            }),
            payload_len: 4,
            ..Repr::default()
        };
        let mut buf = [0u8; 36];
        good.emit(&mut Packet::new_unchecked(&mut buf[..]), b"wxyz")
            .unwrap();
        let emit = |r: Repr, len: usize, payload: &[u8]| {
            let mut buf = vec![0u8; len];
            r.emit(&mut Packet::new_unchecked(&mut buf[..]), payload)
        };
        assert_eq!(emit(good, 35, b"wxyz"), Err(Error::Truncated));
        assert_eq!(emit(good, 37, b"wxyz"), Err(Error::Malformed));
        assert_eq!(emit(good, 36, b"wxy"), Err(Error::Malformed));
        let missing = Repr { reth: None, ..good };
        assert_eq!(emit(missing, 20, b"wxyz"), Err(Error::Malformed));
        let extra = Repr {
            immdt: Some(immdt::Repr { imm_data: 1 }),
            ..good
        };
        assert_eq!(emit(extra, 40, b"wxyz"), Err(Error::Malformed));
        let mut unsupported = good;
        unsupported.bth.opcode = Opcode(0x40);
        assert_eq!(emit(unsupported, 36, b"wxyz"), Err(Error::Unsupported));
        let mut read = good;
        read.bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
        assert_eq!(emit(read, 36, b"wxyz"), Err(Error::Malformed));
        let huge = Repr {
            payload_len: usize::MAX,
            ..good
        };
        assert_eq!(huge.buffer_len(), usize::MAX);
        assert_eq!(emit(huge, 36, b"wxyz"), Err(Error::Malformed));
        assert_eq!(good.emit_header(&mut [0u8; 27]), Err(Error::Truncated));
    }

    #[test]
    fn payload_pad() {
        let pads: Vec<usize> = (0..8).map(Repr::payload_pad).collect();
        assert_eq!(pads, [0, 3, 2, 1, 0, 3, 2, 1]);
        assert_eq!(Repr::payload_pad(usize::MAX), 1);
    }

    #[test]
    fn mutable_accessors() {
        let mut b = SEND_ONLY;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.payload_mut()[0] = b'j';
        p.bth_mut().set_psn(7);
        assert!(p.ext_header_mut(ExtHeader::Reth).is_none());
        p.set_icrc(0x0102_0304);
        assert_eq!(p.psn_for_test(), 7);
        assert_eq!(&b[12..14], b"je");
        assert_eq!(&b[28..], &[4, 3, 2, 1]);
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        fn psn_for_test(&self) -> u32 {
            self.bth().psn()
        }
    }

    /// The implementation before the per-opcode layout table (one opcode table lookup and
    /// one walk of the header list per accessor), kept to prove the fast paths equivalent.
    mod reference {
        use super::*;
        use crate::opcode::Operation;

        fn info(b: &[u8]) -> Option<&'static OpcodeInfo> {
            Opcode(b.first().copied().unwrap_or(0)).info()
        }

        fn pad_count(b: &[u8]) -> usize {
            b.get(1).map_or(0, |b| usize::from((b >> 4) & 3))
        }

        pub(super) fn check_len(b: &[u8]) -> Result<()> {
            if b.len() < bth::HEADER_LEN {
                return Err(Error::Truncated);
            }
            let info = Opcode(b[0]).lookup()?;
            let fixed = info.header_len + ICRC_LEN;
            if b.len() < fixed {
                return Err(Error::Truncated);
            }
            if pad_count(b) > b.len() - fixed {
                return Err(Error::Malformed);
            }
            Ok(())
        }

        pub(super) fn header_len(b: &[u8]) -> usize {
            info(b).map_or(bth::HEADER_LEN, |info| info.header_len)
        }

        pub(super) fn ext(b: &[u8], header: ExtHeader) -> Option<&[u8]> {
            let at = info(b)?.offset_of(header)?;
            let range = at..at + header.size();
            if range.end <= b.len() {
                b.get(range)
            } else {
                None
            }
        }

        pub(super) fn payload(b: &[u8]) -> &[u8] {
            let start = header_len(b);
            let end = b
                .len()
                .saturating_sub(ICRC_LEN)
                .saturating_sub(pad_count(b));
            b.get(start..end.max(start)).unwrap_or(&[])
        }

        pub(super) fn bth_parse(b: &[u8]) -> Result<bth::Repr> {
            let p = bth::Packet::new_unchecked(b);
            p.check_len()?;
            if p.tver() != bth::TVER {
                return Err(Error::Malformed);
            }
            Ok(bth::Repr {
                opcode: p.opcode(),
                solicited_event: p.solicited_event(),
                mig_req: p.mig_req(),
                pad_count: p.pad_count(),
                pkey: p.pkey(),
                fecn: p.fecn(),
                becn: p.becn(),
                dest_qp: p.dest_qp(),
                ack_req: p.ack_req(),
                psn: p.psn(),
            })
        }

        pub(super) fn bth_emit(r: &bth::Repr, b: &mut [u8]) {
            b[1] = 0;
            b[4] = 0;
            b[8] = 0;
            let mut p = bth::Packet::new_unchecked(b);
            p.set_opcode(r.opcode);
            p.set_solicited_event(r.solicited_event);
            p.set_mig_req(r.mig_req);
            p.set_pad_count(r.pad_count);
            p.set_tver(bth::TVER);
            p.set_pkey(r.pkey);
            p.set_fecn(r.fecn);
            p.set_becn(r.becn);
            p.set_dest_qp(r.dest_qp);
            p.set_ack_req(r.ack_req);
            p.set_psn(r.psn);
        }

        pub(super) fn parse(b: &[u8]) -> Result<Repr> {
            check_len(b)?;
            let info = Opcode(b[0]).lookup()?;
            let bth = bth_parse(&b[..bth::HEADER_LEN])?;
            let payload_len = payload(b).len();
            let pad = pad_count(b);
            if !info.has_payload && (payload_len != 0 || pad != 0) {
                return Err(Error::Malformed);
            }
            if pad != Repr::payload_pad(payload_len) {
                return Err(Error::Malformed);
            }
            if info.operation == Operation::AtomicWrite && payload_len != ATOMIC_WRITE_LEN {
                return Err(Error::Malformed);
            }
            let e = |h| ext(b, h);
            Ok(Repr {
                bth,
                reth: parse_opt(e(ExtHeader::Reth).map(reth::Packet::new_unchecked), |p| {
                    reth::Repr::parse(p)
                })?,
                aeth: parse_opt(e(ExtHeader::Aeth).map(aeth::Packet::new_unchecked), |p| {
                    aeth::Repr::parse(p)
                })?,
                deth: parse_opt(e(ExtHeader::Deth).map(deth::Packet::new_unchecked), |p| {
                    deth::Repr::parse(p)
                })?,
                immdt: parse_opt(e(ExtHeader::ImmDt).map(immdt::Packet::new_unchecked), |p| {
                    immdt::Repr::parse(p)
                })?,
                ieth: parse_opt(e(ExtHeader::Ieth).map(ieth::Packet::new_unchecked), |p| {
                    ieth::Repr::parse(p)
                })?,
                atomic_eth: parse_opt(
                    e(ExtHeader::AtomicEth).map(atomic_eth::Packet::new_unchecked),
                    |p| atomic_eth::Repr::parse(p),
                )?,
                atomic_ack_eth: parse_opt(
                    e(ExtHeader::AtomicAckEth).map(atomic_ack_eth::Packet::new_unchecked),
                    |p| atomic_ack_eth::Repr::parse(p),
                )?,
                payload_len,
            })
        }

        fn present(r: &Repr, header: ExtHeader) -> bool {
            match header {
                ExtHeader::Reth => r.reth.is_some(),
                ExtHeader::Aeth => r.aeth.is_some(),
                ExtHeader::Deth => r.deth.is_some(),
                ExtHeader::ImmDt => r.immdt.is_some(),
                ExtHeader::Ieth => r.ieth.is_some(),
                ExtHeader::AtomicEth => r.atomic_eth.is_some(),
                ExtHeader::AtomicAckEth => r.atomic_ack_eth.is_some(),
            }
        }

        pub(super) fn check(r: &Repr) -> Result<&'static OpcodeInfo> {
            let info = r.bth.opcode.lookup()?;
            for h in ExtHeader::ALL {
                if present(r, h) != info.has_header(h) {
                    return Err(Error::Malformed);
                }
            }
            if !info.has_payload && r.payload_len != 0 {
                return Err(Error::Malformed);
            }
            if info.operation == Operation::AtomicWrite && r.payload_len != ATOMIC_WRITE_LEN {
                return Err(Error::Malformed);
            }
            Ok(info)
        }

        pub(super) fn header_len_repr(r: &Repr) -> usize {
            ExtHeader::ALL
                .iter()
                .filter(|h| present(r, **h))
                .map(|h| h.size())
                .sum::<usize>()
                + bth::HEADER_LEN
        }

        pub(super) fn buffer_len(r: &Repr) -> usize {
            header_len_repr(r)
                .saturating_add(r.payload_len)
                .saturating_add(Repr::payload_pad(r.payload_len))
                .saturating_add(ICRC_LEN)
        }

        pub(super) fn emit_header(r: &Repr, buf: &mut [u8]) -> Result<usize> {
            let info = check(r)?;
            let len = info.header_len;
            let buf = buf.get_mut(..len).ok_or(Error::Truncated)?;
            let mut bth = r.bth;
            bth.pad_count = Repr::payload_pad(r.payload_len) as u8;
            bth_emit(&bth, &mut buf[..bth::HEADER_LEN]);
            let mut at = bth::HEADER_LEN;
            for h in info.headers {
                let dst = &mut buf[at..at + h.size()];
                match h {
                    ExtHeader::Reth => r.reth.unwrap().emit(&mut reth::Packet::new_unchecked(dst)),
                    ExtHeader::Aeth => r.aeth.unwrap().emit(&mut aeth::Packet::new_unchecked(dst)),
                    ExtHeader::Deth => r.deth.unwrap().emit(&mut deth::Packet::new_unchecked(dst)),
                    ExtHeader::ImmDt => r
                        .immdt
                        .unwrap()
                        .emit(&mut immdt::Packet::new_unchecked(dst)),
                    ExtHeader::Ieth => r.ieth.unwrap().emit(&mut ieth::Packet::new_unchecked(dst)),
                    ExtHeader::AtomicEth => r
                        .atomic_eth
                        .unwrap()
                        .emit(&mut atomic_eth::Packet::new_unchecked(dst)),
                    ExtHeader::AtomicAckEth => r
                        .atomic_ack_eth
                        .unwrap()
                        .emit(&mut atomic_ack_eth::Packet::new_unchecked(dst)),
                }
                at += h.size();
            }
            Ok(len)
        }

        pub(super) fn emit(r: &Repr, buf: &mut [u8], payload: &[u8]) -> Result<()> {
            check(r)?;
            if payload.len() != r.payload_len {
                return Err(Error::Malformed);
            }
            let need = buffer_len(r);
            if buf.len() < need {
                return Err(Error::Truncated);
            }
            if buf.len() > need {
                return Err(Error::Malformed);
            }
            let hlen = emit_header(r, buf)?;
            let (body, icrc) = buf.split_at_mut(need - ICRC_LEN);
            let (data, pad) = body[hlen..].split_at_mut(r.payload_len);
            data.copy_from_slice(payload);
            pad.fill(0);
            icrc.fill(0);
            Ok(())
        }
    }

    mod equivalence {
        use super::reference;
        use super::*;
        use crate::opcode::OPCODE_TABLE;
        use proptest::prelude::*;

        /// Supported opcodes and a few unsupported ones.
        fn opcodes() -> Vec<u8> {
            let mut v: Vec<u8> = OPCODE_TABLE.iter().map(|i| i.opcode.0).collect();
            v.extend([0x15, 0x1c, 0x2c, 0x40, 0x81, 0xff]);
            v
        }

        /// Packet-like bytes: a chosen opcode, TVer 0 and a consistent pad most of the time.
        fn packet_bytes() -> impl Strategy<Value = Vec<u8>> {
            (
                proptest::sample::select(opcodes()),
                0..4u8,
                proptest::collection::vec(any::<u8>(), 0..80),
            )
                .prop_map(|(op, mode, mut v)| {
                    if mode > 0 && !v.is_empty() {
                        v[0] = op;
                    }
                    if mode > 1 && v.len() >= 2 {
                        v[1] &= 0xf0;
                    }
                    if mode > 2 && v.len() >= 2 {
                        let hlen = Opcode(op).info().map_or(12, |i| i.header_len);
                        let room = v.len().saturating_sub(hlen + ICRC_LEN);
                        // Make PadCnt agree with a payload of `room - pad` bytes when it can.
                        let pad = (0..4).find(|&p| p <= room && Repr::payload_pad(room - p) == p);
                        v[1] = (v[1] & 0xcf) | ((pad.unwrap_or(0) as u8) << 4);
                        // A valid syndrome half of the time when an AETH follows the BTH.
                        if Layout::of(op).offset_of(ExtHeader::Aeth) == Some(12)
                            && v.len() > 12
                            && v[12] & 1 == 0
                        {
                            v[12] &= 0x3f;
                        }
                    }
                    v
                })
        }

        /// A representation built from random bytes: any opcode, any set of extended headers
        /// (made consistent with the opcode when `fix`), any payload length up to 20 bytes.
        fn repr_from(op: u8, fix: bool, mask: u8, payload_len: usize, r: &[u8]) -> Repr {
            let u32_at = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
            let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap());
            let mask = match (fix, Layout::of(op).is_supported()) {
                (true, true) => Layout::of(op).headers,
                _ => mask,
            };
            let has = |h: ExtHeader| mask & h.bit() != 0;
            let syndrome = aeth::Syndrome::from_byte(r[0] & 0x7f)
                .unwrap_or(aeth::Syndrome::Ack { credit: r[0] & 31 });
            Repr {
                bth: bth::Repr {
                    opcode: Opcode(op),
                    solicited_event: r[1] & 1 != 0,
                    mig_req: r[1] & 2 != 0,
                    pad_count: r[2],
                    pkey: u32_at(3) as u16,
                    fecn: r[1] & 4 != 0,
                    becn: r[1] & 8 != 0,
                    dest_qp: u32_at(5),
                    ack_req: r[1] & 16 != 0,
                    psn: u32_at(9),
                },
                reth: has(ExtHeader::Reth).then(|| reth::Repr {
                    va: u64_at(13),
                    rkey: u32_at(21),
                    dma_len: u32_at(25),
                }),
                aeth: has(ExtHeader::Aeth).then(|| aeth::Repr {
                    syndrome,
                    msn: u32_at(29),
                }),
                deth: has(ExtHeader::Deth).then(|| deth::Repr {
                    qkey: u32_at(33),
                    src_qp: u32_at(37),
                }),
                immdt: has(ExtHeader::ImmDt).then(|| immdt::Repr {
                    imm_data: u32_at(41),
                }),
                ieth: has(ExtHeader::Ieth).then(|| ieth::Repr { rkey: u32_at(45) }),
                atomic_eth: has(ExtHeader::AtomicEth).then(|| atomic_eth::Repr {
                    va: u64_at(49),
                    rkey: u32_at(57),
                    swap_add: u64_at(61),
                    compare: u64_at(69),
                }),
                atomic_ack_eth: has(ExtHeader::AtomicAckEth).then(|| atomic_ack_eth::Repr {
                    orig_data: u64_at(77),
                }),
                payload_len,
            }
        }

        fn arb_repr(fix: bool) -> impl Strategy<Value = Repr> {
            (
                proptest::sample::select(opcodes()),
                any::<u8>(),
                prop_oneof![0..20usize, Just(ATOMIC_WRITE_LEN)],
                proptest::collection::vec(any::<u8>(), 85),
            )
                .prop_map(move |(op, mask, len, r)| repr_from(op, fix, mask, len, &r))
        }

        /// `repr` as parsing it back must give: PadCnt from the payload length, DestQP, PSN
        /// and the 24-bit header fields truncated.
        fn normalized(mut r: Repr) -> Repr {
            r.bth.pad_count = Repr::payload_pad(r.payload_len) as u8;
            r.bth.dest_qp &= 0xff_ffff;
            r.bth.psn &= 0xff_ffff;
            if let Some(a) = &mut r.aeth {
                a.msn &= 0xff_ffff;
            }
            if let Some(d) = &mut r.deth {
                d.src_qp &= 0xff_ffff;
            }
            r
        }

        proptest! {
            #[test]
            fn parse_and_accessors_match_reference(b in packet_bytes()) {
                let b = &b[..];
                let p = Packet::new_unchecked(b);
                prop_assert_eq!(p.check_len(), reference::check_len(b));
                prop_assert_eq!(Packet::new_checked(b).map(|_| ()), reference::check_len(b));
                prop_assert_eq!(Repr::parse(&p), reference::parse(b));
                // The one-pass form: check, parse and payload together.
                let want = reference::check_len(b)
                    .and_then(|()| reference::parse(b))
                    .map(|r| (r, reference::payload(b)));
                prop_assert_eq!(Repr::parse_packet(b), want);
                prop_assert_eq!(p.header_len(), reference::header_len(b));
                prop_assert_eq!(p.payload(), reference::payload(b));
                for h in ExtHeader::ALL {
                    prop_assert_eq!(p.ext_header(h), reference::ext(b, h));
                }
                prop_assert_eq!(
                    bth::Repr::parse(&bth::Packet::new_unchecked(b)),
                    reference::bth_parse(b)
                );
                let mut m = b.to_vec();
                let mut q = Packet::new_unchecked(&mut m[..]);
                for h in ExtHeader::ALL {
                    prop_assert_eq!(
                        q.ext_header_mut(h).map(|s| s.to_vec()),
                        reference::ext(b, h).map(|s| s.to_vec())
                    );
                }
            }

            #[test]
            fn emit_matches_reference(
                r in arb_repr(false),
                slack in 0..3usize,
                fill in any::<u8>(),
            ) {
                prop_assert_eq!(r.check(), reference::check(&r));
                prop_assert_eq!(r.header_len(), reference::header_len_repr(&r));
                prop_assert_eq!(r.buffer_len(), reference::buffer_len(&r));
                let mut bth_fast = [fill; 12];
                let mut bth_slow = [fill; 12];
                r.bth.emit(&mut bth::Packet::new_unchecked(&mut bth_fast[..]));
                reference::bth_emit(&r.bth, &mut bth_slow);
                prop_assert_eq!(bth_fast, bth_slow);
                // emit_header into buffers around the header length.
                let hlen = r.header_len();
                for len in hlen.saturating_sub(1)..=hlen + slack {
                    let mut fast = vec![fill; len];
                    let mut slow = vec![fill; len];
                    prop_assert_eq!(
                        r.emit_header(&mut fast),
                        reference::emit_header(&r, &mut slow)
                    );
                    prop_assert_eq!(&fast, &slow);
                }
                // emit_around_payload: the headers and zero pad and ICRC, around a payload
                // left as it was, in buffers around the packet length.
                let need = r.buffer_len();
                for len in need.saturating_sub(1)..=need + slack {
                    let mut fast = vec![fill; len];
                    let got = r.emit_around_payload(&mut fast);
                    let mut slow = vec![fill; len];
                    let want = match reference::check(&r) {
                        Err(e) => Err(e),
                        Ok(_) if len < need => Err(Error::Truncated),
                        Ok(_) => {
                            let h = reference::emit_header(&r, &mut slow).unwrap();
                            slow[h + r.payload_len..need].fill(0);
                            Ok((h, need))
                        }
                    };
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(&fast, &slow);
                }
                // emit with the right and wrong payload and buffer lengths.
                let data: Vec<u8> = (0..r.payload_len + 1).map(|i| i as u8 ^ fill).collect();
                for plen in [r.payload_len, r.payload_len + 1] {
                    for len in need.saturating_sub(1)..=need + slack {
                        let mut fast = vec![fill; len];
                        let mut slow = vec![fill; len];
                        prop_assert_eq!(
                            r.emit(&mut Packet::new_unchecked(&mut fast[..]), &data[..plen]),
                            reference::emit(&r, &mut slow, &data[..plen])
                        );
                        prop_assert_eq!(&fast, &slow);
                    }
                }
            }

            #[test]
            fn valid_reprs_round_trip(r in arb_repr(true)) {
                let mut r = r;
                let info = Layout::of(r.bth.opcode.0);
                if !info.has_payload {
                    r.payload_len = 0;
                }
                if info.atomic_write {
                    r.payload_len = ATOMIC_WRITE_LEN;
                }
                let mut buf = vec![0u8; r.buffer_len()];
                let data = vec![0x5a; r.payload_len];
                let emitted = r.emit(&mut Packet::new_unchecked(&mut buf[..]), &data);
                if !info.is_supported() {
                    prop_assert_eq!(emitted, Err(Error::Unsupported));
                    return Ok(());
                }
                prop_assert_eq!(emitted, Ok(()));
                let p = Packet::new_checked(&buf[..]).unwrap();
                prop_assert_eq!(Repr::parse(&p), Ok(normalized(r)));
                prop_assert_eq!(p.payload(), &data[..]);
                prop_assert_eq!(reference::parse(&buf), Ok(normalized(r)));
            }
        }
    }
}
