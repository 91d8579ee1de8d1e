//! The RoCEv2 invariant CRC (ICRC).
//!
//! The ICRC is the IEEE 802.3 CRC-32 (the function of zlib and [`crc32fast`]) over
//!
//! 1. eight `0xFF` bytes standing in for the InfiniBand LRH;
//! 2. the IP header as sent, with the fields routers may change forced to all ones — IPv4:
//!    TOS, TTL and header checksum; IPv6: traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum forced to `0xFFFF`;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) forced to `0xFF`;
//! 5. the rest of the transport packet up to and including the pad.
//!
//! The result is carried in the last four bytes of the packet, least significant byte first
//! (read it with [`crate::roce::Packet::icrc`]). The IPv4 total length, identification and
//! flags and the UDP length are covered unmasked, so the ICRC of an IPv4 packet can only be
//! computed once those are known.
//!
//! For the data path, [`IcrcPrefix`] holds the masked IP and UDP headers of a flow and derives
//! the length fields from each packet's length, so per packet only a few dozen header bytes
//! and the transport bytes are hashed; [`IcrcHasher`] accepts the transport bytes in pieces
//! (headers from one buffer, payload from another).
//!
//! A receiver cannot see the IPv4 identification of a packet through a UDP socket; [`ident`]
//! verifies such packets by solving for the identification (a 16-bit check, see there), and
//! [`IcrcPrefix::solve_ident`] and [`recover_ident`] apply it.

use crate::ip::{self, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use crate::roce::{self, ICRC_LEN};
use crate::{Error, Result};
use crc32fast::Hasher;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

pub mod ident;
pub use ident::{IdentBasis, IdentSolver};

/// Offset of the IPv4 identification in the IPv4 header, and its length.
const IPV4_IDENT_AT: usize = 4;
const IPV4_IDENT_END: usize = 6;

/// OR-masks applied to the leading bytes of each covered header.
const LRH: [u8; 8] = [0xff; 8];
const IPV4_MASK: [u8; 12] = [0, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0, 0xff, 0xff];
const IPV6_MASK: [u8; 8] = [0x0f, 0xff, 0xff, 0xff, 0, 0, 0, 0xff];
const UDP_MASK: [u8; 8] = [0, 0, 0, 0, 0, 0, 0xff, 0xff];
const BTH_MASKED_BYTE: usize = 4;

/// The longest IPv4 header (IHL 15).
const IPV4_MAX_HEADER_LEN: usize = 60;

/// Hashes `bytes` with the leading bytes ORed with `mask`. `mask` is at most 12 bytes.
fn update_masked(h: &mut Hasher, bytes: &[u8], mask: &[u8]) {
    let n = bytes.len().min(mask.len());
    let mut buf = [0u8; 12];
    for ((out, b), m) in buf.iter_mut().zip(&bytes[..n]).zip(mask) {
        *out = b | m;
    }
    h.update(&buf[..n]);
    h.update(&bytes[n..]);
}

fn seeded() -> Hasher {
    let mut h = Hasher::new();
    h.update(&LRH);
    h
}

const BTH_MASK: [u8; 5] = [0, 0, 0, 0, 0xff];

fn finish(mut h: Hasher, udp_header: &[u8], ib_without_icrc: &[u8]) -> u32 {
    update_masked(&mut h, udp_header, &UDP_MASK);
    update_masked(&mut h, ib_without_icrc, &BTH_MASK);
    h.finalize()
}

/// The ICRC of a RoCEv2 packet over IPv4.
///
/// `ip_header` is the IPv4 header exactly as sent or received (options included),
/// `udp_header` the 8-byte UDP header, `ib_without_icrc` the transport packet from the BTH
/// through the pad. Never fails: the masks are applied to whatever bytes are present, so a
/// short header simply yields a CRC no peer will match.
pub fn icrc_ipv4(ip_header: &[u8], udp_header: &[u8], ib_without_icrc: &[u8]) -> u32 {
    let mut h = seeded();
    update_masked(&mut h, ip_header, &IPV4_MASK);
    finish(h, udp_header, ib_without_icrc)
}

/// The ICRC of a RoCEv2 packet over IPv6; arguments as for [`icrc_ipv4`], `ip_header`
/// being the 40-byte fixed header.
pub fn icrc_ipv6(ip_header: &[u8], udp_header: &[u8], ib_without_icrc: &[u8]) -> u32 {
    let mut h = seeded();
    update_masked(&mut h, ip_header, &IPV6_MASK);
    finish(h, udp_header, ib_without_icrc)
}

/// The ICRC of the RoCEv2 packet carried in a whole IPv4 or IPv6 packet (UDP header and
/// transport packet included; bytes past the IP length are ignored). The UDP port is not
/// checked.
///
/// Fails like [`ip::parse_ip_udp`], and with [`Error::Truncated`] when the UDP payload is
/// shorter than a BTH plus an ICRC.
pub fn icrc(ip_packet: &[u8]) -> Result<u32> {
    Ok(compute(ip_packet)?.0)
}

/// Returns (computed, carried) ICRC.
fn compute(ip_packet: &[u8]) -> Result<(u32, u32)> {
    let d = ip::parse_ip_udp(ip_packet)?;
    let ib = d.payload;
    if ib.len() < roce::MIN_LEN {
        return Err(Error::Truncated);
    }
    let packet = roce::Packet::new_unchecked(ib);
    let covered = packet.icrc_covered();
    let crc = if d.src_addr.is_ipv4() {
        icrc_ipv4(d.ip_header, d.udp_header, covered)
    } else {
        icrc_ipv6(d.ip_header, d.udp_header, covered)
    };
    Ok((crc, packet.icrc()))
}

/// Checks the ICRC carried in the last four bytes of the RoCEv2 packet inside `ip_packet`.
///
/// Fails with [`Error::BadIcrc`] when it does not match, otherwise like [`icrc`].
pub fn verify(ip_packet: &[u8]) -> Result<()> {
    let (computed, carried) = compute(ip_packet)?;
    if computed == carried {
        Ok(())
    } else {
        Err(Error::BadIcrc)
    }
}

/// The IPv4 identification with which the RoCEv2 packet inside the IPv4 packet `ip_packet`
/// verifies, whatever identification its header shows (see [`ident`]): the one its sender
/// used, when the packet is intact. For a packet captured on the wire that is the
/// identification in its header.
///
/// Fails with [`Error::BadIcrc`] when no identification makes the ICRC match, with
/// [`Error::Malformed`] for IPv6 (which has no identification), otherwise like [`icrc`].
pub fn recover_ident(ip_packet: &[u8]) -> Result<u16> {
    let d = ip::parse_ip_udp(ip_packet)?;
    if !d.src_addr.is_ipv4() {
        return Err(Error::Malformed);
    }
    let ib = d.payload;
    if ib.len() < roce::MIN_LEN || d.ip_header.len() < IPV4_IDENT_END {
        return Err(Error::Truncated);
    }
    let packet = roce::Packet::new_unchecked(ib);
    let covered = packet.icrc_covered();
    let mut header = [0u8; IPV4_MAX_HEADER_LEN];
    let n = d.ip_header.len().min(IPV4_MAX_HEADER_LEN);
    header[..n].copy_from_slice(&d.ip_header[..n]);
    header[IPV4_IDENT_AT..IPV4_IDENT_END].fill(0);
    let crc0 = icrc_ipv4(&header[..n], d.udp_header, covered);
    let after = n - IPV4_IDENT_END + d.udp_header.len() + covered.len();
    IdentBasis::new(after)
        .solve(crc0 ^ packet.icrc())
        .ok_or(Error::BadIcrc)
}

/// What the ICRC of an IPv4 RoCEv2 packet without IP options (as softrdma and rxe send
/// them) changes by when its IPv4 identification is `ident` rather than 0: the ICRC computed
/// with identification 0, XORed with this, is the one computed with `ident` (CRC-32 is affine,
/// see [`ident`]). `ib_len` is the length of the transport packet from the BTH through the pad
/// (without the ICRC). A sender whose datagrams the kernel numbers (the datagrams of one UDP GSO
/// message over IPv4: 0, 1, 2, ...) seals each with its number this way. Never fails;
/// `solver` caches the effect of each length.
pub fn ipv4_ident_syndrome(solver: &mut IdentSolver, ib_len: usize, ident: u16) -> u32 {
    if ident == 0 {
        return 0;
    }
    ipv4_ident_basis(solver, ib_len).syndrome(ident)
}

/// The [`IdentBasis`] of IPv4 RoCEv2 packets without IP options whose transport packet
/// (BTH through pad) is `ib_len` bytes long: its [`IdentBasis::syndrome`] is
/// [`ipv4_ident_syndrome`], for a sender that numbers several packets of one length.
pub fn ipv4_ident_basis(solver: &mut IdentSolver, ib_len: usize) -> &IdentBasis {
    let after = (IPV4_HEADER_LEN - IPV4_IDENT_END)
        .saturating_add(UDP_HEADER_LEN)
        .saturating_add(ib_len);
    solver.basis(after)
}

/// The masked IP and UDP headers of one flow (addresses, ports, IPv4 identification and
/// flags), ready to compute the ICRC of any packet of that flow.
///
/// The IPv4 total length, IPv6 payload length and UDP length are *not* taken from the
/// headers given at construction: [`IcrcPrefix::start`] recomputes them from the length of
/// each transport packet. Everything else must be what goes on the wire — in particular the
/// IPv4 identification, which a Linux UDP socket sets to 0 only with `IP_PMTUDISC_DO` (see
/// [`IcrcPrefix::ipv4`]).
#[derive(Debug, Clone)]
pub struct IcrcPrefix {
    /// CRC state after the LRH stand-in and the IP bytes before the length field.
    seed: Hasher,
    /// Masked IP header + UDP header; only bytes from `seed_len` on are hashed per packet.
    template: [u8; IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN],
    ip_len: usize,
    ipv6: bool,
    /// For short transport packets (BTH through pad of `SHORT_MIN + 4 * i` bytes, up to
    /// [`ONE_PASS_SHORT`]): the CRC state after the LRH stand-in and the masked IP and UDP
    /// headers with that packet's length fields, so that only its transport bytes are hashed
    /// per packet (ACKs and short messages, whose headers are most of what is covered).
    /// Made by [`IcrcPrefix::with_short_states`] for a flow that is kept; shared by clones.
    short: Option<Arc<[Hasher; SHORT_STATES]>>,
}

/// The shortest transport packet with a precomputed header state: a BTH.
const SHORT_MIN: usize = 12;
/// Header states kept per prefix: lengths `SHORT_MIN..=ONE_PASS_SHORT` in steps of 4 (a
/// transport packet is padded to a multiple of 4 bytes).
const SHORT_STATES: usize = (ONE_PASS_SHORT - SHORT_MIN) / 4 + 1;

impl IcrcPrefix {
    /// Bytes of the IP header before its length field, hashed once into the seed.
    const fn seed_len(ipv6: bool) -> usize {
        if ipv6 {
            4
        } else {
            2
        }
    }

    /// Builds the prefix from an IP header (IPv4 with or without options, or the IPv6 fixed
    /// header; version read from the first nibble) and an 8-byte UDP header. Length fields
    /// and masked fields may hold anything.
    ///
    /// Fails with [`Error::Truncated`] when a header is too short and with
    /// [`Error::Malformed`] for another IP version, an IPv4 header whose length is not what
    /// its IHL says, an IPv6 header longer than 40 bytes or a UDP header longer than 8.
    pub fn from_headers(ip_header: &[u8], udp_header: &[u8]) -> Result<IcrcPrefix> {
        let first = *ip_header.first().ok_or(Error::Truncated)?;
        let (ipv6, mask): (bool, &[u8]) = match first >> 4 {
            4 => {
                let ihl = usize::from(first & 0x0f) * 4;
                if ip_header.len() < IPV4_HEADER_LEN {
                    return Err(Error::Truncated);
                }
                if ihl != ip_header.len() {
                    return Err(Error::Malformed);
                }
                (false, &IPV4_MASK)
            }
            6 => {
                if ip_header.len() < IPV6_HEADER_LEN {
                    return Err(Error::Truncated);
                }
                if ip_header.len() != IPV6_HEADER_LEN {
                    return Err(Error::Malformed);
                }
                (true, &IPV6_MASK)
            }
            _ => return Err(Error::Malformed),
        };
        if udp_header.len() < UDP_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if udp_header.len() != UDP_HEADER_LEN {
            return Err(Error::Malformed);
        }
        let ip_len = ip_header.len();
        let mut template = [0u8; IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN];
        template[..ip_len].copy_from_slice(ip_header);
        template[ip_len..ip_len + UDP_HEADER_LEN].copy_from_slice(udp_header);
        for (t, m) in template.iter_mut().zip(mask) {
            *t |= m;
        }
        for (t, m) in template[ip_len..].iter_mut().zip(&UDP_MASK) {
            *t |= m;
        }
        let mut seed = seeded();
        seed.update(&template[..Self::seed_len(ipv6)]);
        Ok(IcrcPrefix {
            seed,
            template,
            ip_len,
            ipv6,
            short: None,
        })
    }

    /// The same prefix with the header states of short packets made (14 CRCs of some 40
    /// bytes, once): [`IcrcPrefix::compute`] then hashes only the transport bytes of a packet
    /// of up to 64 of them (an ACK, a short message), a third of what it covers. For a flow
    /// that carries many packets; clones share the states.
    pub fn with_short_states(mut self) -> IcrcPrefix {
        let states = std::array::from_fn(|i| {
            // (Lengths this short always fit the 16-bit fields.)
            match self.start_parts(SHORT_MIN + 4 * i) {
                Ok((mut h, headers)) => {
                    h.update(headers.as_slice());
                    h
                }
                Err(_) => unreachable!("a short packet's lengths fit the length fields"),
            }
        });
        self.short = Some(Arc::new(states));
        self
    }

    /// The header state kept for a transport packet of `ib_len` bytes, when one is kept (see
    /// [`IcrcPrefix::short`]). (A clone: a hasher made from a bare state would look up the
    /// CPU's features again, a quarter of the cost of hashing a short packet.)
    #[inline(always)]
    fn short_state(&self, ib_len: usize) -> Option<Hasher> {
        let short = self.short.as_ref()?;
        if !(SHORT_MIN..=ONE_PASS_SHORT).contains(&ib_len) || !ib_len.is_multiple_of(4) {
            return None;
        }
        Some(short[(ib_len - SHORT_MIN) / 4].clone())
    }

    /// The prefix of the IPv4 header softrdma sends from a Linux UDP socket with
    /// `IP_PMTUDISC_DO`: no options, identification 0, DF set, protocol UDP (TOS, TTL and
    /// checksum are masked and do not matter).
    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> IcrcPrefix {
        let mut h = [0u8; IPV4_HEADER_LEN];
        h[0] = 0x45;
        h[6] = 0x40;
        h[9] = ip::IP_PROTOCOL_UDP;
        h[12..16].copy_from_slice(&src.octets());
        h[16..20].copy_from_slice(&dst.octets());
        let mut u = [0u8; UDP_HEADER_LEN];
        u[0..2].copy_from_slice(&src_port.to_be_bytes());
        u[2..4].copy_from_slice(&dst_port.to_be_bytes());
        match Self::from_headers(&h, &u) {
            Ok(p) => p,
            Err(_) => unreachable!("a well-formed IPv4 header was built above"),
        }
    }

    /// The prefix of an IPv6 flow: fixed header, next header UDP (traffic class, flow label
    /// and hop limit are masked and do not matter).
    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16, dst_port: u16) -> IcrcPrefix {
        let mut h = [0u8; IPV6_HEADER_LEN];
        h[0] = 0x60;
        h[6] = ip::IP_PROTOCOL_UDP;
        h[8..24].copy_from_slice(&src.octets());
        h[24..40].copy_from_slice(&dst.octets());
        let mut u = [0u8; UDP_HEADER_LEN];
        u[0..2].copy_from_slice(&src_port.to_be_bytes());
        u[2..4].copy_from_slice(&dst_port.to_be_bytes());
        match Self::from_headers(&h, &u) {
            Ok(p) => p,
            Err(_) => unreachable!("a well-formed IPv6 header was built above"),
        }
    }

    /// Starts the ICRC of a transport packet whose BTH-through-pad part is `ib_len` bytes
    /// long (the ICRC itself excluded): hashes the IP and UDP headers with the length fields
    /// that packet gets. Feed the transport bytes to the returned [`IcrcHasher`].
    ///
    /// Fails with [`Error::Malformed`] when the lengths do not fit the 16-bit fields.
    pub fn start(&self, ib_len: usize) -> Result<IcrcHasher> {
        let (mut hasher, headers) = self.start_parts(ib_len)?;
        hasher.update(headers.as_slice());
        Ok(IcrcHasher { hasher, pos: 0 })
    }

    /// The seed and the header bytes still to hash for a packet of `ib_len` transport bytes
    /// (see [`IcrcPrefix::start`]).
    #[inline(always)]
    fn start_parts(&self, ib_len: usize) -> Result<(Hasher, Headers)> {
        let udp_len = ib_len
            .checked_add(UDP_HEADER_LEN + ICRC_LEN)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(Error::Malformed)?;
        let ip_field = if self.ipv6 {
            udp_len
        } else {
            u16::try_from(usize::from(udp_len) + self.ip_len).map_err(|_| Error::Malformed)?
        };
        let end = self.ip_len + UDP_HEADER_LEN;
        let mut buf = self.template;
        let len_at = Self::seed_len(self.ipv6);
        buf[len_at..len_at + 2].copy_from_slice(&ip_field.to_be_bytes());
        buf[self.ip_len + 4..self.ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        Ok((
            self.seed.clone(),
            Headers {
                buf,
                from: len_at,
                to: end,
            },
        ))
    }

    /// For an IPv4 flow, the identification with which a packet of this flow whose
    /// BTH-through-pad part is `ib_len` bytes long verifies, given `computed`, the ICRC this
    /// prefix computed for it (with the identification the prefix was built with, 0 for
    /// [`IcrcPrefix::ipv4`]), and `carried`, the one in the packet. `None` when no
    /// identification fits, and always for IPv6.
    ///
    /// A packet accepted this way got a 16-bit check, not a 32-bit one (see [`ident`]); try
    /// `computed == carried` first.
    pub fn solve_ident(
        &self,
        solver: &mut IdentSolver,
        ib_len: usize,
        computed: u32,
        carried: u32,
    ) -> Option<u16> {
        if self.ipv6 {
            return None;
        }
        let after = (self.ip_len - IPV4_IDENT_END)
            .checked_add(UDP_HEADER_LEN)?
            .checked_add(ib_len)?;
        let base = u16::from_be_bytes([
            self.template[IPV4_IDENT_AT],
            self.template[IPV4_IDENT_AT + 1],
        ]);
        solver
            .solve(after, computed ^ carried)
            .map(|delta| base ^ delta)
    }

    /// The ICRC of `ib_without_icrc` (BTH through pad) sent in this flow. Fails like
    /// [`IcrcPrefix::start`].
    pub fn compute(&self, ib_without_icrc: &[u8]) -> Result<u32> {
        let ib = ib_without_icrc;
        if ib.len() <= ONE_PASS_MAX && ib.len() > BTH_MASKED_BYTE {
            return self.compute_small(ib);
        }
        let mut h = self.start(ib.len())?;
        h.update(ib);
        Ok(h.finalize())
    }

    /// [`IcrcPrefix::compute`] of a small packet (an ACK, a short message) in one pass over
    /// one buffer: the CRC of a few pieces of a few bytes each costs more than copying them
    /// together (8-byte SEND: 57 -> 38 ns). `ib` is longer than the masked BTH byte's offset
    /// and at most [`ONE_PASS_MAX`] bytes.
    #[inline(never)]
    fn compute_small(&self, ib: &[u8]) -> Result<u32> {
        // An ACK or a short message: from the header state of its length, only its transport
        // bytes are hashed (they are a third of what is covered; the client of an 8-byte
        // SEND ping-pong over the wire: 1,069 -> 651 instructions of ICRC a round trip).
        if let Some(mut h) = self.short_state(ib.len()) {
            let mut buf = [0u8; ONE_PASS_SHORT];
            buf[..ib.len()].copy_from_slice(ib);
            buf[BTH_MASKED_BYTE] = 0xff;
            h.update(&buf[..ib.len()]);
            return Ok(h.finalize());
        }
        // (The buffer is zeroed before use: one of a size that fits an ACK or a short message
        // costs a few stores, the largest 324 bytes' worth, every packet.)
        if ib.len() <= ONE_PASS_SHORT {
            self.compute_in::<{ ONE_PASS_SHORT + IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN }>(ib)
        } else {
            self.compute_in::<{ ONE_PASS_MAX + IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN }>(ib)
        }
    }

    /// [`IcrcPrefix::compute_small`] in a buffer of `N` bytes (room for the headers and `ib`).
    #[inline(always)]
    fn compute_in<const N: usize>(&self, ib: &[u8]) -> Result<u32> {
        let (mut h, headers) = self.start_parts(ib.len())?;
        let mut buf = [0u8; N];
        let headers = headers.as_slice();
        let n = headers.len();
        buf[..n].copy_from_slice(headers);
        buf[n..n + ib.len()].copy_from_slice(ib);
        buf[n + BTH_MASKED_BYTE] = 0xff;
        h.update(&buf[..n + ib.len()]);
        Ok(h.finalize())
    }

    /// Computes the ICRC of a whole transport packet and stores it in its last four bytes.
    /// Fails like [`IcrcPrefix::start`], and with [`Error::Truncated`] when the packet is
    /// shorter than a BTH plus an ICRC.
    pub fn fill<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut roce::Packet<T>) -> Result<()> {
        if packet.len() < roce::MIN_LEN {
            return Err(Error::Truncated);
        }
        let crc = self.compute(packet.icrc_covered())?;
        packet.set_icrc(crc);
        Ok(())
    }
}

/// Transport packets up to this many bytes (BTH through pad) have their ICRC computed in one
/// pass ([`IcrcPrefix::compute`]).
const ONE_PASS_MAX: usize = 256;
/// Transport packets up to this many bytes use a smaller buffer for that pass: ACKs, and
/// messages of up to 32 bytes with their headers.
const ONE_PASS_SHORT: usize = 64;

/// The masked IP and UDP header bytes of one packet that follow a prefix's seed.
struct Headers {
    buf: [u8; IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN],
    from: usize,
    to: usize,
}

impl Headers {
    fn as_slice(&self) -> &[u8] {
        &self.buf[self.from..self.to]
    }
}

/// An ICRC in progress over the transport bytes of one packet, fed in order in any number of
/// pieces; BTH byte 4 is masked automatically.
#[derive(Debug, Clone)]
pub struct IcrcHasher {
    hasher: Hasher,
    pos: usize,
}

impl IcrcHasher {
    /// Hashes the next transport bytes (BTH first, then the rest, up to and including the
    /// pad).
    pub fn update(&mut self, bytes: &[u8]) {
        match BTH_MASKED_BYTE.checked_sub(self.pos) {
            Some(i) if i < bytes.len() => {
                self.hasher.update(&bytes[..i]);
                self.hasher.update(&[0xff]);
                self.hasher.update(&bytes[i + 1..]);
            }
            _ => self.hasher.update(bytes),
        }
        self.pos = self.pos.saturating_add(bytes.len());
    }

    /// Hashes the next `len` transport bytes with `crc_of`, for bytes the caller cannot lend
    /// as a slice (a payload in memory another thread may write, say): `crc_of` gets the
    /// CRC-32 of everything hashed so far, in the form [`crc32fast::Hasher::finalize`] gives,
    /// and returns it continued over those bytes, in the same form.
    ///
    /// The bytes must come after the masked BTH byte (offset 4): fails with
    /// [`Error::Malformed`], hashing nothing, when fewer than 5 transport bytes were hashed
    /// before.
    pub fn update_with(&mut self, len: usize, crc_of: impl FnOnce(u32) -> u32) -> Result<()> {
        if self.pos <= BTH_MASKED_BYTE {
            return Err(Error::Malformed);
        }
        let crc = crc_of(self.hasher.clone().finalize());
        self.hasher = Hasher::new_with_initial(crc);
        self.pos = self.pos.saturating_add(len);
        Ok(())
    }

    /// The ICRC, as [`crate::roce::Packet::icrc`] reads it from the wire.
    pub fn finalize(self) -> u32 {
        self.hasher.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::{Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr};
    use crate::opcode::Opcode;
    use crate::{bth, ROCE_V2_UDP_PORT};

    /// The packet of notes §7: RC SEND_ONLY to QP 0x11, PSN 0x123456, AckReq,
    /// "hello, rxe!!\n", 192.0.2.1 -> 192.0.2.2, ID 0, DF, TTL 64, sport 0xC123.
    fn vector() -> Vec<u8> {
        let payload = b"hello, rxe!!\n";
        let roce = roce::Repr {
            bth: bth::Repr {
                opcode: Opcode::RC_SEND_ONLY,
                solicited_event: false,
                mig_req: false,
                pad_count: 3,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 0x11,
                ack_req: true,
                psn: 0x123456,
            },
            payload_len: payload.len(),
            ..roce::Repr::default()
        };
        let udp = UdpRepr {
            src_port: 0xc123,
            dst_port: ROCE_V2_UDP_PORT,
            payload_len: roce.buffer_len(),
        };
        let ipv4 = Ipv4Repr {
            src_addr: Ipv4Addr::new(192, 0, 2, 1),
            dst_addr: Ipv4Addr::new(192, 0, 2, 2),
            protocol: ip::IP_PROTOCOL_UDP,
            payload_len: UDP_HEADER_LEN + udp.payload_len,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        };
        let mut b = vec![0u8; 28 + roce.buffer_len()];
        ipv4.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]))
            .unwrap();
        udp.emit(&mut UdpPacket::new_unchecked(&mut b[20..]))
            .unwrap();
        roce.emit(&mut roce::Packet::new_unchecked(&mut b[28..]), payload)
            .unwrap();
        b
    }

    #[test]
    fn notes_section_7_vector() {
        let mut b = vector();
        let crc = icrc(&b).unwrap();
        assert_eq!(crc.to_le_bytes(), [0x42, 0x1d, 0x77, 0x25]);
        assert_eq!(crc, icrc_ipv4(&b[..20], &b[20..28], &b[28..56]));
        assert_eq!(verify(&b), Err(Error::BadIcrc));
        b[56..].copy_from_slice(&[0x42, 0x1d, 0x77, 0x25]);
        assert_eq!(verify(&b), Ok(()));
        assert_eq!(roce::Packet::new_checked(&b[28..]).unwrap().icrc(), crc);
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let mut b = vector();
        let crc = icrc(&b).unwrap();
        b[1] = 0xb8; // TOS
        b[8] = 3; // TTL
        b[10] = 0x12; // IP checksum
        b[26] = 0x55; // UDP checksum
        b[28 + 4] = 0xc0; // FECN, BECN, resv6a
        assert_eq!(icrc(&b).unwrap(), crc);
        b[4] = 1; // identification: covered
        assert_ne!(icrc(&b).unwrap(), crc);
    }

    #[test]
    fn ident_syndrome_turns_the_icrc_with_ident_0_into_that_with_another() {
        let b = vector();
        let zero = icrc(&b).unwrap();
        let ib_len = b.len() - 28 - ICRC_LEN;
        let mut solver = IdentSolver::new();
        assert_eq!(ipv4_ident_syndrome(&mut solver, ib_len, 0), 0);
        for ident in [1u16, 2, 3, 63, 64, 255, 256, 0x5cf5, 0xffff] {
            let mut c = b.clone();
            c[4..6].copy_from_slice(&ident.to_be_bytes());
            let want = icrc(&c).unwrap();
            assert_eq!(
                zero ^ ipv4_ident_syndrome(&mut solver, ib_len, ident),
                want,
                "ident {ident}"
            );
            // A packet sealed this way carries the identification a receiver recovers.
            let crc = zero ^ ipv4_ident_syndrome(&mut solver, ib_len, ident);
            let n = c.len();
            c[n - 4..].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(verify(&c), Ok(()));
            assert_eq!(recover_ident(&c), Ok(ident));
        }
    }

    #[test]
    fn prefix_matches_direct() {
        let b = vector();
        let prefix = IcrcPrefix::ipv4(
            Ipv4Addr::new(192, 0, 2, 1),
            Ipv4Addr::new(192, 0, 2, 2),
            0xc123,
            ROCE_V2_UDP_PORT,
        );
        let direct = icrc(&b).unwrap();
        assert_eq!(prefix.compute(&b[28..56]).unwrap(), direct);
        let from_headers = IcrcPrefix::from_headers(&b[..20], &b[20..28]).unwrap();
        assert_eq!(from_headers.compute(&b[28..56]).unwrap(), direct);
        // In pieces, split at every point (including inside the masked BTH byte).
        for split in 0..=28 {
            let mut h = prefix.start(28).unwrap();
            h.update(&b[28..28 + split]);
            h.update(&b[28 + split..56]);
            assert_eq!(h.finalize(), direct, "split {split}");
        }
        let mut h = prefix.start(28).unwrap();
        for byte in &b[28..56] {
            h.update(core::slice::from_ref(byte));
        }
        assert_eq!(h.finalize(), direct);
        // fill() stores it little-endian.
        let mut ib = b[28..].to_vec();
        prefix
            .fill(&mut roce::Packet::new_unchecked(&mut ib[..]))
            .unwrap();
        assert_eq!(&ib[28..], &[0x42, 0x1d, 0x77, 0x25]);
        // Other lengths: the prefix recomputes the length fields.
        assert_ne!(prefix.compute(&b[28..52]).unwrap(), direct);
        assert_eq!(prefix.start(65_536).unwrap_err(), Error::Malformed);
        assert_eq!(prefix.start(usize::MAX).unwrap_err(), Error::Malformed);
    }

    #[test]
    fn one_pass_agrees_with_the_streaming_hash_at_every_length() {
        // Through the header states of short packets, both buffers of the one-pass path,
        // and past them; IPv4 without and with options, and IPv6.
        let mut with_options = [0u8; 24];
        with_options[0] = 0x46;
        with_options[9] = ip::IP_PROTOCOL_UDP;
        with_options[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        with_options[20..24].copy_from_slice(&[1, 1, 1, 0]);
        let udp = [0xd0, 0x0d, 0x12, 0xb7, 0, 0, 0, 0];
        let lean = [
            IcrcPrefix::ipv4(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
                0xd00d,
                ROCE_V2_UDP_PORT,
            ),
            IcrcPrefix::from_headers(&with_options, &udp).unwrap(),
            IcrcPrefix::ipv6(
                "fe80::1".parse().unwrap(),
                "fe80::2".parse().unwrap(),
                0xd00d,
                ROCE_V2_UDP_PORT,
            ),
        ];
        let prefixes: Vec<IcrcPrefix> = lean
            .iter()
            .cloned()
            .chain(lean.iter().map(|p| p.clone().with_short_states()))
            .collect();
        let ib: Vec<u8> = (0..400u32).map(|i| (i * 37 + 11) as u8).collect();
        for (k, prefix) in prefixes.iter().enumerate() {
            for len in 0..ib.len() {
                let mut h = prefix.start(len).unwrap();
                h.update(&ib[..len]);
                assert_eq!(
                    prefix.compute(&ib[..len]).unwrap(),
                    h.finalize(),
                    "prefix {k}, length {len}"
                );
            }
        }
        // And against the whole-packet function, for every length with a header state.
        let mut pkt = [0u8; 20 + 8 + 68];
        for len in (SHORT_MIN..=ONE_PASS_SHORT).step_by(4) {
            let total = 20 + 8 + len + ICRC_LEN;
            pkt[0] = 0x45;
            pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            pkt[6] = 0x40;
            pkt[9] = ip::IP_PROTOCOL_UDP;
            pkt[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
            pkt[20..22].copy_from_slice(&0xd00du16.to_be_bytes());
            pkt[22..24].copy_from_slice(&ROCE_V2_UDP_PORT.to_be_bytes());
            pkt[24..26].copy_from_slice(&((8 + len + ICRC_LEN) as u16).to_be_bytes());
            pkt[28..28 + len].copy_from_slice(&ib[..len]);
            for p in [&prefixes[0], &prefixes[3]] {
                assert_eq!(
                    p.compute(&ib[..len]).unwrap(),
                    icrc(&pkt[..total]).unwrap(),
                    "length {len}"
                );
            }
        }
    }

    #[test]
    fn bytes_hashed_by_the_caller_continue_the_hash() {
        let prefix = IcrcPrefix::ipv4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            0xd00d,
            ROCE_V2_UDP_PORT,
        );
        let ib: Vec<u8> = (0..300u32).map(|i| (i * 29 + 5) as u8).collect();
        let whole = prefix.compute(&ib).unwrap();
        for (from, to) in [(5, 5), (5, 6), (12, 300), (40, 200), (299, 300)] {
            let mut h = prefix.start(ib.len()).unwrap();
            h.update(&ib[..from]);
            h.update_with(to - from, |crc| {
                let mut c = Hasher::new_with_initial(crc);
                c.update(&ib[from..to]);
                c.finalize()
            })
            .unwrap();
            h.update(&ib[to..]);
            assert_eq!(h.finalize(), whole, "bytes {from}..{to} by the caller");
        }
        // Not over the masked BTH byte: refused, nothing hashed.
        let mut h = prefix.start(ib.len()).unwrap();
        h.update(&ib[..4]);
        assert_eq!(h.update_with(8, |_| 0), Err(Error::Malformed));
        h.update(&ib[4..]);
        assert_eq!(h.finalize(), whole);
    }

    #[test]
    fn ipv6() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::2".parse().unwrap();
        let ib: Vec<u8> = (0..28u8).collect();
        let mut pkt = vec![0u8; 40 + 8 + 32];
        ip::Ipv6Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: 17,
            payload_len: 40,
            hop_limit: 1,
            traffic_class: 2,
            flow_label: 3,
        }
        .emit(&mut ip::Ipv6Packet::new_unchecked(&mut pkt[..]))
        .unwrap();
        UdpRepr {
            src_port: 4791,
            dst_port: 4791,
            payload_len: 32,
        }
        .emit(&mut UdpPacket::new_unchecked(&mut pkt[40..]))
        .unwrap();
        pkt[48..76].copy_from_slice(&ib);
        let crc = icrc(&pkt).unwrap();
        assert_eq!(crc, icrc_ipv6(&pkt[..40], &pkt[40..48], &ib));
        let prefix = IcrcPrefix::ipv6(src, dst, 4791, 4791);
        assert_eq!(prefix.compute(&ib).unwrap(), crc);
        pkt[76..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(verify(&pkt), Ok(()));
        // Traffic class, flow label and hop limit are masked.
        pkt[0] = 0x6f;
        pkt[1..4].copy_from_slice(&[0xab, 0xcd, 0xef]);
        pkt[7] = 200;
        assert_eq!(verify(&pkt), Ok(()));
        pkt[60] ^= 0x80;
        assert_eq!(verify(&pkt), Err(Error::BadIcrc));
    }

    #[test]
    fn errors() {
        let b = vector();
        assert_eq!(icrc(&[]), Err(Error::Truncated));
        for n in 0..b.len() {
            assert!(icrc(&b[..n]).is_err());
        }
        // UDP payload shorter than BTH + ICRC.
        let mut short = b[..28 + 12].to_vec();
        short[3] = 40;
        short[25] = 20;
        assert_eq!(icrc(&short), Err(Error::Truncated));
        assert_eq!(
            IcrcPrefix::from_headers(&b[..19], &b[20..28]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            IcrcPrefix::from_headers(&b[..24], &b[20..28]).unwrap_err(),
            Error::Malformed
        );
        assert_eq!(
            IcrcPrefix::from_headers(&b[..20], &b[20..27]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            IcrcPrefix::from_headers(&[0x50; 20], &b[20..28]).unwrap_err(),
            Error::Malformed
        );
        assert_eq!(
            IcrcPrefix::from_headers(&[], &[]).unwrap_err(),
            Error::Truncated
        );
        // Short inputs to the infallible forms do not panic.
        let _ = icrc_ipv4(&[1], &[], &[2, 3]);
        let _ = icrc_ipv6(&[], &[1; 3], &[]);
    }
}
