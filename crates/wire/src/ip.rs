//! Just enough Ethernet II, IPv4, IPv6 and UDP to read and write RoCEv2 captures and to
//! rebuild the IP and UDP headers the ICRC covers.
//!
//! Not handled: VLAN tags and every EtherType other than IPv4/IPv6 ([`parse_ethernet_udp`]
//! answers [`Error::Unsupported`]), IPv6 extension headers, IPv4 fragments. IPv4 options are
//! skipped using the IHL, but [`Ipv4Repr`] neither keeps nor emits them.

use crate::field::{put_u16, put_u32, u16_at, u24_at};
use crate::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an IEEE 802.1Q VLAN tag (not supported beyond being recognised).
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of UDP.
pub const IP_PROTOCOL_UDP: u8 = 17;

/// Length of an Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// The GID that stands for an IP address on RoCEv2: IPv4 as the IPv4-mapped IPv6 address
/// `::ffff:a.b.c.d`, IPv6 as is. Never fails.
pub fn ip_to_gid(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn addr6(b: &[u8], at: usize) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(a)
}

fn addr4(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// The 16-bit ones'-complement sum of `data` (odd trailing byte padded with zero), folded.
fn ones_complement_sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

// ------------------------------------------------------------------------------------------
// Ethernet

/// A read/write view of an Ethernet II frame (destination, source, EtherType, payload).
///
/// Getters index the buffer directly: they panic on an unchecked view shorter than
/// [`ETHERNET_HEADER_LEN`], never on a checked one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer; fails with [`Error::Truncated`] when it is shorter than the header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Fails with [`Error::Truncated`] when the buffer is shorter than the header.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < ETHERNET_HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The destination MAC address.
    pub fn dst_addr(&self) -> [u8; 6] {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[0..6]);
        a
    }

    /// The source MAC address.
    pub fn src_addr(&self) -> [u8; 6] {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[6..12]);
        a
    }

    /// The EtherType.
    pub fn ethertype(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 12)
    }

    /// Everything after the header (including any Ethernet padding).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(ETHERNET_HEADER_LEN..)
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    pub fn set_dst_addr(&mut self, value: [u8; 6]) {
        self.buffer.as_mut()[0..6].copy_from_slice(&value);
    }

    /// Sets the source MAC address.
    pub fn set_src_addr(&mut self, value: [u8; 6]) {
        self.buffer.as_mut()[6..12].copy_from_slice(&value);
    }

    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 12, value);
    }

    /// Everything after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match self.buffer.as_mut().get_mut(ETHERNET_HEADER_LEN..) {
            Some(s) => s,
            None => &mut [],
        }
    }
}

/// The fields of an Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source MAC address.
    pub src_addr: [u8; 6],
    /// Destination MAC address.
    pub dst_addr: [u8; 6],
    /// EtherType.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Reads the header; fails with [`Error::Truncated`] when the view is too short.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &EthernetFrame<&T>) -> Result<Self> {
        frame.check_len()?;
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    /// The header length, [`ETHERNET_HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// On an unchecked view shorter than [`ETHERNET_HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, frame: &mut EthernetFrame<&mut T>) {
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        frame.set_ethertype(self.ethertype);
    }
}

// ------------------------------------------------------------------------------------------
// IPv4

/// A read/write view of an IPv4 packet.
///
/// [`Ipv4Packet::new_checked`] guarantees that the IHL and the total length are consistent
/// with the buffer, so every getter and [`Ipv4Packet::payload`] are safe; bytes after the
/// total length (Ethernet padding) are ignored. Getters panic on an unchecked view shorter
/// than 20 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after [`Ipv4Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`Error::Truncated`] when the buffer is shorter than 20 bytes, the IHL or
    /// the total length; with [`Error::Malformed`] when the IHL is below 5 or the total
    /// length is below the header length. The version is checked by [`Ipv4Repr::parse`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < IPV4_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let hlen = self.header_len();
        let total = usize::from(self.total_len());
        if hlen < IPV4_HEADER_LEN || total < hlen {
            return Err(Error::Malformed);
        }
        if len < hlen || len < total {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The version field (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// The header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & 0x0f) * 4
    }

    /// The DSCP/ECN byte (formerly TOS).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// The total length field.
    pub fn total_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 2)
    }

    /// The Identification field.
    pub fn ident(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 4)
    }

    /// The Don't Fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.buffer.as_ref()[6] & 0x40 != 0
    }

    /// The More Fragments flag.
    pub fn more_frags(&self) -> bool {
        self.buffer.as_ref()[6] & 0x20 != 0
    }

    /// The fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (u16_at(self.buffer.as_ref(), 6) & 0x1fff) << 3
    }

    /// The time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }

    /// The protocol field (17 for UDP).
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }

    /// The header checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 10)
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        addr4(self.buffer.as_ref(), 12)
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        addr4(self.buffer.as_ref(), 16)
    }

    /// Whether the header checksum is correct (false when the header does not fit).
    pub fn verify_checksum(&self) -> bool {
        match self.buffer.as_ref().get(..self.header_len()) {
            Some(h) if h.len() >= IPV4_HEADER_LEN => ones_complement_sum(0, h) == 0xffff,
            _ => false,
        }
    }

    /// The header bytes, options included (empty when the IHL runs past the buffer).
    pub fn header(&self) -> &[u8] {
        self.buffer.as_ref().get(..self.header_len()).unwrap_or(&[])
    }

    /// The bytes between the header and the total length (empty when inconsistent).
    pub fn payload(&self) -> &[u8] {
        let end = usize::from(self.total_len());
        self.buffer
            .as_ref()
            .get(self.header_len()..end)
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version and IHL; `header_len` is in bytes and should be a multiple of 4.
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: usize) {
        self.buffer.as_mut()[0] = (version << 4) | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the DSCP/ECN byte.
    pub fn set_tos(&mut self, value: u8) {
        self.buffer.as_mut()[1] = value;
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 2, value);
    }

    /// Sets the Identification.
    pub fn set_ident(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 4, value);
    }

    /// Sets the flags and fragment offset word: DF, MF and the offset in bytes (a multiple
    /// of 8).
    pub fn set_flags_and_frag_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & 0x1fff;
        if dont_frag {
            v |= 0x4000;
        }
        if more_frags {
            v |= 0x2000;
        }
        put_u16(self.buffer.as_mut(), 6, v);
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, value: u8) {
        self.buffer.as_mut()[8] = value;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, value: u8) {
        self.buffer.as_mut()[9] = value;
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 10, value);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, value: Ipv4Addr) {
        self.buffer.as_mut()[12..16].copy_from_slice(&value.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, value: Ipv4Addr) {
        self.buffer.as_mut()[16..20].copy_from_slice(&value.octets());
    }

    /// Computes and stores the header checksum over the IHL bytes.
    ///
    /// # Panics
    /// On an unchecked view shorter than the IHL.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hlen = self.header_len().max(IPV4_HEADER_LEN);
        let sum = ones_complement_sum(0, &self.buffer.as_ref()[..hlen]);
        self.set_checksum(!(sum as u16));
    }

    /// The payload, mutable (empty when inconsistent).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.header_len()..usize::from(self.total_len());
        match self.buffer.as_mut().get_mut(range) {
            Some(s) => s,
            None => &mut [],
        }
    }
}

/// The fields of an IPv4 header without options, as softrdma sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol (17 for UDP).
    pub protocol: u8,
    /// Payload length (total length minus header length).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP/ECN byte.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment flag.
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Reads the header. Fails like [`Ipv4Packet::check_len`], with [`Error::Malformed`]
    /// when the version is not 4, and with [`Error::Unsupported`] for fragments. The
    /// checksum is not verified (captures with checksum offload carry wrong ones; use
    /// [`Ipv4Packet::verify_checksum`]) and options are skipped.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Ipv4Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        if packet.version() != 4 {
            return Err(Error::Malformed);
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::Unsupported);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            ttl: packet.ttl(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// The emitted header length, 20.
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// The total length field this header gets; fails with [`Error::Malformed`] when
    /// `payload_len + 20` does not fit in 16 bits.
    pub fn total_len(&self) -> Result<u16> {
        self.payload_len
            .checked_add(IPV4_HEADER_LEN)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(Error::Malformed)
    }

    /// Writes a 20-byte header with a correct checksum. Fails with [`Error::Malformed`] when
    /// the payload length does not fit the total length field and with
    /// [`Error::Truncated`] when the view is shorter than 20 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut Ipv4Packet<&mut T>,
    ) -> Result<()> {
        let total = self.total_len()?;
        if packet.buffer.as_ref().len() < IPV4_HEADER_LEN {
            return Err(Error::Truncated);
        }
        packet.set_version_and_header_len(4, IPV4_HEADER_LEN);
        packet.set_tos(self.tos);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_flags_and_frag_offset(self.dont_frag, false, 0);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// IPv6

/// A read/write view of an IPv6 packet (fixed header only).
///
/// [`Ipv6Packet::new_checked`] guarantees the header and the declared payload fit the
/// buffer. Getters panic on an unchecked view shorter than 40 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer after [`Ipv6Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`Error::Truncated`] when the buffer is shorter than 40 bytes plus the
    /// payload length. The version is checked by [`Ipv6Repr::parse`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < IPV6_HEADER_LEN || len - IPV6_HEADER_LEN < usize::from(self.payload_len()) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The version field (6).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// The traffic class.
    pub fn traffic_class(&self) -> u8 {
        let b = self.buffer.as_ref();
        (b[0] << 4) | (b[1] >> 4)
    }

    /// The flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        u24_at(self.buffer.as_ref(), 1) & 0x000f_ffff
    }

    /// The payload length field.
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 4)
    }

    /// The next header field (17 for UDP).
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[6]
    }

    /// The hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[7]
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        addr6(self.buffer.as_ref(), 8)
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        addr6(self.buffer.as_ref(), 24)
    }

    /// The 40 header bytes (empty when the buffer is shorter).
    pub fn header(&self) -> &[u8] {
        self.buffer.as_ref().get(..IPV6_HEADER_LEN).unwrap_or(&[])
    }

    /// The payload as declared by the payload length (empty when inconsistent).
    pub fn payload(&self) -> &[u8] {
        let end = IPV6_HEADER_LEN + usize::from(self.payload_len());
        self.buffer
            .as_ref()
            .get(IPV6_HEADER_LEN..end)
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets version (6), traffic class and flow label (20 low bits used).
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let word = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000f_ffff);
        put_u32(self.buffer.as_mut(), 0, word);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 4, value);
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, value: u8) {
        self.buffer.as_mut()[6] = value;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[7] = value;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, value: Ipv6Addr) {
        self.buffer.as_mut()[8..24].copy_from_slice(&value.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, value: Ipv6Addr) {
        self.buffer.as_mut()[24..40].copy_from_slice(&value.octets());
    }

    /// The payload, mutable (empty when inconsistent).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = IPV6_HEADER_LEN + usize::from(self.payload_len());
        match self.buffer.as_mut().get_mut(IPV6_HEADER_LEN..end) {
            Some(s) => s,
            None => &mut [],
        }
    }
}

/// The fields of an IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header (17 for UDP).
    pub next_header: u8,
    /// Payload length.
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Reads the header. Fails like [`Ipv6Packet::check_len`] and with
    /// [`Error::Malformed`] when the version is not 6.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Ipv6Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        if packet.version() != 6 {
            return Err(Error::Malformed);
        }
        Ok(Ipv6Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    /// The emitted header length, 40.
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Writes the 40-byte header. Fails with [`Error::Malformed`] when the payload length
    /// does not fit 16 bits and with [`Error::Truncated`] when the view is shorter than 40
    /// bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut Ipv6Packet<&mut T>,
    ) -> Result<()> {
        let len = u16::try_from(self.payload_len).map_err(|_| Error::Malformed)?;
        if packet.buffer.as_ref().len() < IPV6_HEADER_LEN {
            return Err(Error::Truncated);
        }
        packet.set_version_class_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// UDP

/// A read/write view of a UDP datagram.
///
/// [`UdpPacket::new_checked`] guarantees the length field is at least 8 and fits the
/// buffer. Getters panic on an unchecked view shorter than 8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer after [`UdpPacket::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Fails with [`Error::Truncated`] when the buffer is shorter than 8 bytes or than the
    /// length field, and with [`Error::Malformed`] when the length field is below 8.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < UDP_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let declared = usize::from(self.len());
        if declared < UDP_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < declared {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 0)
    }

    /// The destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 2)
    }

    /// The length field (header plus payload).
    pub fn len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 4)
    }

    /// Whether the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= UDP_HEADER_LEN
    }

    /// The checksum field (0 = not computed).
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), 6)
    }

    /// The 8 header bytes (empty when the buffer is shorter).
    pub fn header(&self) -> &[u8] {
        self.buffer.as_ref().get(..UDP_HEADER_LEN).unwrap_or(&[])
    }

    /// The payload as declared by the length field (empty when inconsistent).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(UDP_HEADER_LEN..usize::from(self.len()))
            .unwrap_or(&[])
    }

    fn pseudo_sum(&self, src: IpAddr, dst: IpAddr) -> Option<u32> {
        let datagram = self.buffer.as_ref().get(..usize::from(self.len()))?;
        let len = u32::try_from(datagram.len()).ok()?;
        let mut acc = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let acc = ones_complement_sum(0, &s.octets());
                ones_complement_sum(acc, &d.octets())
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let acc = ones_complement_sum(0, &s.octets());
                ones_complement_sum(acc, &d.octets())
            }
            _ => return None,
        };
        acc += u32::from(IP_PROTOCOL_UDP) + (len >> 16) + (len & 0xffff);
        Some(ones_complement_sum(acc, datagram))
    }

    /// Whether the checksum is correct for the given addresses. A zero checksum ("none")
    /// counts as correct; mixed address families or an inconsistent length as wrong.
    pub fn verify_checksum(&self, src: IpAddr, dst: IpAddr) -> bool {
        if self.buffer.as_ref().len() < UDP_HEADER_LEN {
            return false;
        }
        if self.checksum() == 0 {
            return true;
        }
        self.pseudo_sum(src, dst) == Some(0xffff)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 0, value);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 2, value);
    }

    /// Sets the length field.
    pub fn set_len(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 4, value);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        put_u16(self.buffer.as_mut(), 6, value);
    }

    /// Computes and stores the checksum over the pseudo-header and the datagram (as long as
    /// the length field says). Leaves 0 when the addresses are of mixed families or the
    /// length field runs past the buffer.
    pub fn fill_checksum(&mut self, src: IpAddr, dst: IpAddr) {
        self.set_checksum(0);
        if let Some(sum) = self.pseudo_sum(src, dst) {
            let c = !(sum as u16);
            self.set_checksum(if c == 0 { 0xffff } else { c });
        }
    }

    /// The payload, mutable (empty when inconsistent).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        match self.buffer.as_mut().get_mut(UDP_HEADER_LEN..end) {
            Some(s) => s,
            None => &mut [],
        }
    }
}

/// The fields of a UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length (length field minus 8).
    pub payload_len: usize,
}

impl UdpRepr {
    /// Reads the header. Fails like [`UdpPacket::check_len`]. The checksum is not verified
    /// (see [`UdpPacket::verify_checksum`]).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &UdpPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: usize::from(packet.len()) - UDP_HEADER_LEN,
        })
    }

    /// The emitted header length, 8.
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }

    /// The length field this header gets; fails with [`Error::Malformed`] when
    /// `payload_len + 8` does not fit 16 bits.
    pub fn udp_len(&self) -> Result<u16> {
        self.payload_len
            .checked_add(UDP_HEADER_LEN)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(Error::Malformed)
    }

    /// Writes the header with a zero checksum, as rxe does (the ICRC masks it; fill it
    /// later with [`UdpPacket::fill_checksum`] if wanted). Fails with [`Error::Malformed`]
    /// when the length does not fit and [`Error::Truncated`] when the view is shorter than
    /// 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut UdpPacket<&mut T>,
    ) -> Result<()> {
        let len = self.udp_len()?;
        if packet.buffer.as_ref().len() < UDP_HEADER_LEN {
            return Err(Error::Truncated);
        }
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        packet.set_checksum(0);
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Walking a frame down to the UDP payload

/// The IP and UDP layers of a datagram, located inside a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The IP header as it appears in the buffer (IPv4 options included).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The UDP payload, as long as the UDP length field says.
    pub payload: &'a [u8],
    /// Source address.
    pub src_addr: IpAddr,
    /// Destination address.
    pub dst_addr: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

/// Locates the UDP datagram inside an IPv4 or IPv6 packet (version taken from the first
/// nibble). Trailing bytes after the IP length (Ethernet padding) are ignored.
///
/// Fails with [`Error::Truncated`] on short buffers, [`Error::Malformed`] on inconsistent
/// lengths or an unknown version, [`Error::Unsupported`] when the packet is not UDP or is a
/// fragment.
pub fn parse_ip_udp(ip_packet: &[u8]) -> Result<UdpDatagram<'_>> {
    let first = *ip_packet.first().ok_or(Error::Truncated)?;
    let (ip_header, ip_payload, src_addr, dst_addr) = match first >> 4 {
        4 => {
            let p = Ipv4Packet::new_checked(ip_packet)?;
            let repr = Ipv4Repr::parse(&p)?;
            if repr.protocol != IP_PROTOCOL_UDP {
                return Err(Error::Unsupported);
            }
            let (hlen, total) = (p.header_len(), usize::from(p.total_len()));
            (
                ip_packet.get(..hlen).ok_or(Error::Truncated)?,
                ip_packet.get(hlen..total).ok_or(Error::Truncated)?,
                IpAddr::V4(repr.src_addr),
                IpAddr::V4(repr.dst_addr),
            )
        }
        6 => {
            let p = Ipv6Packet::new_checked(ip_packet)?;
            let repr = Ipv6Repr::parse(&p)?;
            if repr.next_header != IP_PROTOCOL_UDP {
                return Err(Error::Unsupported);
            }
            let end = IPV6_HEADER_LEN + repr.payload_len;
            (
                ip_packet.get(..IPV6_HEADER_LEN).ok_or(Error::Truncated)?,
                ip_packet
                    .get(IPV6_HEADER_LEN..end)
                    .ok_or(Error::Truncated)?,
                IpAddr::V6(repr.src_addr),
                IpAddr::V6(repr.dst_addr),
            )
        }
        _ => return Err(Error::Malformed),
    };
    let udp = UdpPacket::new_checked(ip_payload)?;
    let (src_port, dst_port, udp_len) = (udp.src_port(), udp.dst_port(), udp.len());
    Ok(UdpDatagram {
        ip_header,
        udp_header: ip_payload.get(..UDP_HEADER_LEN).ok_or(Error::Truncated)?,
        payload: ip_payload
            .get(UDP_HEADER_LEN..usize::from(udp_len))
            .ok_or(Error::Truncated)?,
        src_addr,
        dst_addr,
        src_port,
        dst_port,
    })
}

/// Locates the UDP datagram inside an Ethernet II frame. Fails like [`parse_ip_udp`], and
/// with [`Error::Unsupported`] when the EtherType is neither IPv4 nor IPv6 (VLAN tags
/// included).
pub fn parse_ethernet_udp(frame: &[u8]) -> Result<UdpDatagram<'_>> {
    let eth = EthernetFrame::new_checked(frame)?;
    match eth.ethertype() {
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => {}
        _ => return Err(Error::Unsupported),
    }
    let payload = frame.get(ETHERNET_HEADER_LEN..).unwrap_or(&[]);
    let d = parse_ip_udp(payload)?;
    let version_ok = matches!(
        (eth.ethertype(), d.src_addr),
        (ETHERTYPE_IPV4, IpAddr::V4(_)) | (ETHERTYPE_IPV6, IpAddr::V6(_))
    );
    if !version_ok {
        return Err(Error::Malformed);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 192.0.2.1 -> 192.0.2.2, ID 0, DF, TTL 64, UDP, total 60 (checksum precomputed by hand).
    fn ipv4_udp(payload: &[u8]) -> Vec<u8> {
        let repr = Ipv4Repr {
            src_addr: Ipv4Addr::new(192, 0, 2, 1),
            dst_addr: Ipv4Addr::new(192, 0, 2, 2),
            protocol: IP_PROTOCOL_UDP,
            payload_len: UDP_HEADER_LEN + payload.len(),
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        };
        let udp = UdpRepr {
            src_port: 0xc123,
            dst_port: 4791,
            payload_len: payload.len(),
        };
        let mut b = vec![0u8; 28 + payload.len()];
        repr.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]))
            .unwrap();
        udp.emit(&mut UdpPacket::new_unchecked(&mut b[20..]))
            .unwrap();
        b[28..].copy_from_slice(payload);
        b
    }

    #[test]
    fn ipv4_golden_header() {
        let b = ipv4_udp(&[0u8; 32]);
        // total length 60 = 0x3c; checksum of this header is 0xb6ad.
        assert_eq!(
            &b[..20],
            &[
                0x45, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb6, 0xad, 192, 0, 2,
                1, 192, 0, 2, 2
            ]
        );
        assert_eq!(
            &b[20..28],
            &[0xc1, 0x23, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00]
        );
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        let r = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 40);
        assert!(r.dont_frag);
        assert_eq!(p.payload().len(), 40);
        let d = parse_ip_udp(&b).unwrap();
        assert_eq!(d.dst_port, 4791);
        assert_eq!(d.payload.len(), 32);
        assert_eq!(d.ip_header.len(), 20);
    }

    #[test]
    fn ipv4_options_and_padding() {
        let mut b = ipv4_udp(&[7u8; 4]);
        // Insert a 4-byte NOP option block, IHL 6.
        b.splice(20..20, [1u8, 1, 1, 1]);
        b[0] = 0x46;
        b[3] += 4;
        b.extend_from_slice(&[0xee; 6]); // Ethernet padding after the packet
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(p.header_len(), 24);
        let d = parse_ip_udp(&b).unwrap();
        assert_eq!(d.ip_header.len(), 24);
        assert_eq!(d.payload, &[7, 7, 7, 7]);
    }

    #[test]
    fn ipv4_malformed() {
        let b = ipv4_udp(&[0u8; 8]);
        for n in 0..b.len() {
            assert!(parse_ip_udp(&b[..n]).is_err());
            assert!(Ipv4Packet::new_checked(&b[..n]).is_err());
        }
        let mut bad = b.clone();
        bad[0] = 0x44; // IHL 4
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Malformed
        );
        let mut bad = b.clone();
        bad[0] = 0x4f; // IHL 15 = 60 bytes > total length 36
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Malformed
        );
        let mut bad = b.clone();
        bad[2] = 0xff; // total length past the buffer
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Truncated
        );
        let mut bad = b.clone();
        bad[0] = 0x55; // version 5
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Malformed);
        let mut bad = b.clone();
        bad[6] = 0x20; // more fragments
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Unsupported);
        let mut bad = b.clone();
        bad[9] = 6; // TCP
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Unsupported);
        let mut bad = b.clone();
        bad[25] = 4; // UDP length 4
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Malformed);
        let mut bad = b;
        bad[25] = 0xff; // UDP length past the IP payload
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Truncated);
    }

    #[test]
    fn ipv6_round_trip() {
        let repr = Ipv6Repr {
            src_addr: "fe80::1".parse().unwrap(),
            dst_addr: "2001:db8::2".parse().unwrap(),
            next_header: IP_PROTOCOL_UDP,
            payload_len: 12,
            hop_limit: 64,
            traffic_class: 0xa5,
            flow_label: 0x12345,
        };
        let mut b = vec![0u8; 52];
        repr.emit(&mut Ipv6Packet::new_unchecked(&mut b[..]))
            .unwrap();
        assert_eq!(&b[..8], &[0x6a, 0x51, 0x23, 0x45, 0x00, 0x0c, 0x11, 0x40]);
        UdpRepr {
            src_port: 1,
            dst_port: 4791,
            payload_len: 4,
        }
        .emit(&mut UdpPacket::new_unchecked(&mut b[40..]))
        .unwrap();
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv6Repr::parse(&p).unwrap(), repr);
        let d = parse_ip_udp(&b).unwrap();
        assert_eq!(d.ip_header.len(), 40);
        assert_eq!(d.payload.len(), 4);
        for n in 0..b.len() {
            assert!(parse_ip_udp(&b[..n]).is_err());
        }
        let mut bad = b.clone();
        bad[0] = 0x40 | (bad[0] & 0x0f);
        assert!(parse_ip_udp(&bad).is_err());
        assert_eq!(
            Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&bad[..])).unwrap_err(),
            Error::Malformed
        );
        bad = b;
        bad[6] = 0; // hop-by-hop extension header
        assert_eq!(parse_ip_udp(&bad).unwrap_err(), Error::Unsupported);
    }

    #[test]
    fn udp_checksum() {
        let mut b = ipv4_udp(b"abcde");
        let (src, dst) = (
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
        );
        let mut u = UdpPacket::new_checked(&mut b[20..]).unwrap();
        assert!(u.verify_checksum(src, dst)); // zero = none
        u.fill_checksum(src, dst);
        assert_ne!(u.checksum(), 0);
        assert!(u.verify_checksum(src, dst));
        u.payload_mut()[0] ^= 1;
        assert!(!u.verify_checksum(src, dst));
        let v6: IpAddr = "::1".parse().unwrap();
        assert!(!u.verify_checksum(src, v6));
    }

    #[test]
    fn ethernet() {
        let ip = ipv4_udp(&[1, 2, 3, 4]);
        let mut f = vec![0u8; 14];
        let repr = EthernetRepr {
            src_addr: [2, 0, 0, 0, 0, 1],
            dst_addr: [2, 0, 0, 0, 0, 2],
            ethertype: ETHERTYPE_IPV4,
        };
        repr.emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        assert_eq!(&f[..], &[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0]);
        f.extend_from_slice(&ip);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&e).unwrap(), repr);
        assert_eq!(e.payload(), &ip[..]);
        assert_eq!(parse_ethernet_udp(&f).unwrap().payload, &[1, 2, 3, 4]);
        for n in 0..f.len() {
            assert!(parse_ethernet_udp(&f[..n]).is_err());
        }
        let mut vlan = f.clone();
        vlan[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        assert_eq!(parse_ethernet_udp(&vlan).unwrap_err(), Error::Unsupported);
        let mut mismatch = f;
        mismatch[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        assert_eq!(parse_ethernet_udp(&mismatch).unwrap_err(), Error::Malformed);
    }

    #[test]
    fn emit_length_overflow() {
        let mut b = [0u8; 40];
        let v4 = Ipv4Repr {
            src_addr: Ipv4Addr::LOCALHOST,
            dst_addr: Ipv4Addr::LOCALHOST,
            protocol: 17,
            payload_len: 65_516,
            ttl: 1,
            tos: 0,
            ident: 0,
            dont_frag: false,
        };
        assert_eq!(
            v4.emit(&mut Ipv4Packet::new_unchecked(&mut b[..])),
            Err(Error::Malformed)
        );
        let udp = UdpRepr {
            src_port: 1,
            dst_port: 2,
            payload_len: usize::MAX,
        };
        assert_eq!(
            udp.emit(&mut UdpPacket::new_unchecked(&mut b[..])),
            Err(Error::Malformed)
        );
        let v4ok = Ipv4Repr {
            payload_len: 8,
            ..v4
        };
        assert_eq!(
            v4ok.emit(&mut Ipv4Packet::new_unchecked(&mut b[..10])),
            Err(Error::Truncated)
        );
    }
}
