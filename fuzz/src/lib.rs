//! Bodies of the cargo-fuzz targets of `softrdma-wire`.
//!
//! Each public function takes arbitrary bytes, feeds them to every parser it covers and, when
//! a parse succeeds, asserts the invariants the parsers document:
//!
//! - accessors of a checked view never panic and agree with the raw bytes;
//! - `Repr::parse` → `emit` → `parse` gives the same `Repr`;
//! - where the format is canonical, the re-emitted bytes equal the input's covered bytes once
//!   the bits `emit` is documented to zero (reserved bits, pad, ICRC, checksums) are zeroed;
//! - independent ways of computing the same thing (ICRC over a whole packet, over split
//!   pieces, through an [`icrc::IcrcPrefix`]) agree.
//!
//! The functions live in a library (not in the `fuzz_targets/*.rs` files) so that they can
//! be run on stable Rust by `cargo test` in this package over the golden captures.

#![forbid(unsafe_code)]

use softrdma_wire::cm::{self, Message, CM_DATA_LEN};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr, CMA_HDR_LEN};
use softrdma_wire::icrc::{self, IcrcPrefix};
use softrdma_wire::ip::{
    self, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, UdpDatagram,
    UdpPacket, UdpRepr, ETHERNET_HEADER_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN,
};
use softrdma_wire::opcode::ExtHeader;
use softrdma_wire::pcap::{PcapReader, PcapWriter, LINKTYPE_ETHERNET};
use softrdma_wire::roce::{self, ICRC_LEN};
use softrdma_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, mad, reth, Error, ROCE_V2_UDP_PORT,
};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const ALL_EXT_HEADERS: [ExtHeader; 7] = [
    ExtHeader::Reth,
    ExtHeader::Aeth,
    ExtHeader::Deth,
    ExtHeader::ImmDt,
    ExtHeader::Ieth,
    ExtHeader::AtomicEth,
    ExtHeader::AtomicAckEth,
];

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Offset of `sub` inside `whole` (`sub` must be a subslice of `whole`).
fn offset_in(whole: &[u8], sub: &[u8]) -> usize {
    let off = (sub.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    assert!(off + sub.len() <= whole.len(), "not a subslice");
    off
}

// ==========================================================================================
// roce_packet

/// A RoCEv2 transport packet (BTH … ICRC): the view, the `Repr` round trip, every extended
/// header view, the ICRC through [`IcrcPrefix`] and through whole IPv4/IPv6 packets, and
/// each extended-header parser on the raw bytes.
pub fn roce_packet(data: &[u8]) {
    ext_header_parsers(data);
    roce_unchecked(data);
    roce_icrc(data);

    let checked = roce::Packet::new_checked(data);
    let repr = roce::Repr::parse(&roce::Packet::new_unchecked(data));
    let p = match checked {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(repr, Err(e), "Repr::parse must fail like check_len");
            return;
        }
    };
    roce_checked(data, &p);
    if let Ok(r) = repr {
        roce_round_trip(data, &p, &r);
    }
}

/// Accessors of an unchecked view: documented never to panic, except the BTH getters on a
/// buffer shorter than a BTH.
fn roce_unchecked(data: &[u8]) {
    let u = roce::Packet::new_unchecked(data);
    black_box((u.len(), u.is_empty(), u.opcode(), u.opcode_info()));
    black_box((u.header_len(), u.pad_count(), u.payload(), u.pad()));
    black_box((u.icrc_covered(), u.icrc()));
    for h in ALL_EXT_HEADERS {
        if let Some(b) = u.ext_header(h) {
            assert_eq!(b.len(), h.size());
        }
    }
    poke_ext_views(&u);
    if data.len() >= bth::HEADER_LEN {
        poke_bth(&u.bth());
    } else {
        assert_eq!(u.bth().into_inner().len(), data.len());
    }
    let pad = u.pad().len();
    assert!(u.payload().len() + pad <= data.len());
}

fn poke_bth(b: &bth::Packet<&[u8]>) {
    black_box((b.opcode(), b.solicited_event(), b.mig_req(), b.pad_count()));
    black_box((b.tver(), b.pkey(), b.fecn(), b.becn(), b.resv6a()));
    black_box((b.dest_qp(), b.ack_req(), b.resv7(), b.psn()));
}

fn poke_ext_views(p: &roce::Packet<&[u8]>) {
    black_box(p.reth().map(|h| (h.va(), h.rkey(), h.dma_len())));
    black_box(p.aeth().map(|h| (h.syndrome(), h.msn())));
    black_box(p.deth().map(|h| (h.qkey(), h.src_qp(), h.reserved())));
    black_box(p.immdt().map(|h| h.imm_data()));
    black_box(p.ieth().map(|h| h.rkey()));
    black_box(
        p.atomic_eth()
            .map(|h| (h.va(), h.rkey(), h.swap_add(), h.compare())),
    );
    black_box(p.atomic_ack_eth().map(|h| h.orig_data()));
}

/// Layout invariants of a checked view.
fn roce_checked(data: &[u8], p: &roce::Packet<&[u8]>) {
    let len = data.len();
    let info = p
        .opcode_info()
        .expect("a checked view has a supported opcode");
    assert_eq!(info.opcode, p.opcode());
    assert_eq!(p.header_len(), info.header_len);
    assert_eq!(p.len(), len);
    assert!(!p.is_empty());
    let (hl, pl) = (p.header_len(), p.payload().len());
    assert_eq!(hl + pl + p.pad().len() + ICRC_LEN, len, "layout must tile");
    assert_eq!(p.pad().len(), p.pad_count());
    assert_eq!(p.payload(), &data[hl..hl + pl]);
    assert_eq!(p.pad(), &data[hl + pl..len - ICRC_LEN]);
    assert_eq!(p.icrc_covered(), &data[..len - ICRC_LEN]);
    assert_eq!(p.icrc(), le32(&data[len - ICRC_LEN..]));
    for h in ALL_EXT_HEADERS {
        match info.offset_of(h) {
            Some(at) => {
                assert!(info.has_header(h));
                assert_eq!(p.ext_header(h), Some(&data[at..at + h.size()]));
            }
            None => {
                assert!(!info.has_header(h));
                assert_eq!(p.ext_header(h), None);
            }
        }
    }
    assert_eq!(p.reth().is_some(), info.has_header(ExtHeader::Reth));
    assert_eq!(p.aeth().is_some(), info.has_header(ExtHeader::Aeth));
    assert_eq!(p.deth().is_some(), info.has_header(ExtHeader::Deth));
    assert_eq!(p.immdt().is_some(), info.has_header(ExtHeader::ImmDt));
    assert_eq!(p.ieth().is_some(), info.has_header(ExtHeader::Ieth));
    assert_eq!(
        p.atomic_eth().is_some(),
        info.has_header(ExtHeader::AtomicEth)
    );
    assert_eq!(
        p.atomic_ack_eth().is_some(),
        info.has_header(ExtHeader::AtomicAckEth)
    );
    poke_bth(&p.bth());
    assert_eq!(p.bth().opcode(), p.opcode());
    assert_eq!(usize::from(p.bth().pad_count()), p.pad_count());
}

/// `Repr` invariants of a packet that parsed.
fn roce_round_trip(data: &[u8], p: &roce::Packet<&[u8]>, r: &roce::Repr) {
    let len = data.len();
    let info = r.check().expect("a parsed Repr passes check()");
    assert_eq!(info.opcode, p.opcode());
    assert_eq!(r.header_len(), p.header_len());
    assert_eq!(r.buffer_len(), len);
    assert_eq!(r.payload_len, p.payload().len());
    assert_eq!(usize::from(r.bth.pad_count), p.pad_count());
    assert_eq!(
        roce::Repr::payload_pad(r.payload_len),
        p.pad_count(),
        "parse accepts only the canonical pad"
    );

    // emit → parse gives the same Repr, and the bytes are the input's, normalised.
    let mut out = vec![0u8; len];
    r.emit(&mut roce::Packet::new_unchecked(&mut out[..]), p.payload())
        .expect("a parsed Repr emits into buffer_len() bytes");
    let again = roce::Packet::new_checked(&out[..]).expect("emitted packet is valid");
    assert_eq!(roce::Repr::parse(&again), Ok(*r));
    assert_eq!(again.icrc(), 0, "emit leaves a zero ICRC");
    assert_eq!(out, normalised_roce(data, p), "emit is canonical");

    // emit_header writes exactly the header bytes of emit.
    let mut hdr = vec![0xa5u8; r.header_len()];
    assert_eq!(r.emit_header(&mut hdr), Ok(r.header_len()));
    assert_eq!(hdr, out[..r.header_len()]);
    if r.header_len() > 0 {
        let short = r.header_len() - 1;
        assert_eq!(r.emit_header(&mut hdr[..short]), Err(Error::Truncated));
    }

    // Wrong buffer or payload sizes are errors, not panics.
    let mut longer = vec![0u8; len + 1];
    assert_eq!(
        r.emit(
            &mut roce::Packet::new_unchecked(&mut longer[..]),
            p.payload()
        ),
        Err(Error::Malformed)
    );
    assert_eq!(
        r.emit(
            &mut roce::Packet::new_unchecked(&mut out[..len - 1]),
            p.payload()
        ),
        Err(Error::Truncated)
    );
    if let Some((_, shorter)) = p.payload().split_last() {
        assert_eq!(
            r.emit(&mut roce::Packet::new_unchecked(&mut out[..]), shorter),
            Err(Error::Malformed)
        );
    }
}

/// `data` with what `Repr::emit` writes as zero zeroed: BTH reserved bits, the DETH
/// reserved byte, the pad and the ICRC.
fn normalised_roce(data: &[u8], p: &roce::Packet<&[u8]>) -> Vec<u8> {
    let mut n = data.to_vec();
    n[4] &= 0xc0; // FECN, BECN kept; resv6a zeroed
    n[8] &= 0x80; // AckReq kept; resv7 zeroed
    if let Some(at) = p.opcode_info().and_then(|i| i.offset_of(ExtHeader::Deth)) {
        n[at + 4] = 0;
    }
    let pad_at = p.header_len() + p.payload().len();
    let len = n.len();
    n[pad_at..].fill(0);
    assert_eq!(len - pad_at, p.pad_count() + ICRC_LEN);
    n
}

const SRC4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const DST4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const SRC6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe00, 2);
const DST6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe00, 3);

/// The ICRC of `data` taken as a transport packet, computed four ways that must agree:
/// [`IcrcPrefix::compute`], an [`icrc::IcrcHasher`] fed in pieces, [`icrc::icrc_ipv4`] /
/// [`icrc::icrc_ipv6`] over hand-built headers, and [`icrc::icrc`] / [`icrc::verify`] over
/// the whole IP packet after [`IcrcPrefix::fill`]. Masked fields (TOS, TTL, checksums, flow
/// label, …) are taken from the input so the masking is exercised too.
fn roce_icrc(data: &[u8]) {
    if data.len() < roce::MIN_LEN || data.len() > 60_000 {
        return;
    }
    let covered = &data[..data.len() - ICRC_LEN];
    let sport = 0xc000 | be16(&data[2..4]) & 0x3fff;
    let splits = [
        usize::from(data[5]) % (covered.len() + 1),
        usize::from(data[9]) % (covered.len() + 1),
    ];

    for v6 in [false, true] {
        let prefix = if v6 {
            IcrcPrefix::ipv6(SRC6, DST6, sport, ROCE_V2_UDP_PORT)
        } else {
            IcrcPrefix::ipv4(SRC4, DST4, sport, ROCE_V2_UDP_PORT)
        };
        let crc = prefix.compute(covered).expect("length fits");

        // In pieces, BTH byte 4 masked whatever the piece boundaries.
        let (a, b) = (splits[0].min(splits[1]), splits[0].max(splits[1]));
        let mut h = prefix.start(covered.len()).unwrap();
        h.update(&covered[..a]);
        h.update(&[]);
        h.update(&covered[a..b]);
        h.update(&covered[b..]);
        assert_eq!(h.finalize(), crc, "IcrcHasher in pieces");

        // The same flow as real headers, with arbitrary values in the masked fields.
        let udp_len = (covered.len() + ICRC_LEN + UDP_HEADER_LEN) as u16;
        let mut udp = [0u8; UDP_HEADER_LEN];
        udp[0..2].copy_from_slice(&sport.to_be_bytes());
        udp[2..4].copy_from_slice(&ROCE_V2_UDP_PORT.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        udp[6..8].copy_from_slice(&[data[0], data[1]]);
        let ip_hdr: Vec<u8> = if v6 {
            let mut h = vec![0u8; IPV6_HEADER_LEN];
            h[0] = 0x60 | (data[1] & 0x0f);
            h[1..4].copy_from_slice(&data[1..4]);
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = ip::IP_PROTOCOL_UDP;
            h[7] = data[6];
            h[8..24].copy_from_slice(&SRC6.octets());
            h[24..40].copy_from_slice(&DST6.octets());
            h
        } else {
            let total = udp_len + IPV4_HEADER_LEN as u16;
            let mut h = vec![0u8; IPV4_HEADER_LEN];
            h[0] = 0x45;
            h[1] = data[3];
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40;
            h[8] = data[6];
            h[9] = ip::IP_PROTOCOL_UDP;
            h[10..12].copy_from_slice(&[data[7], data[10]]);
            h[12..16].copy_from_slice(&SRC4.octets());
            h[16..20].copy_from_slice(&DST4.octets());
            h
        };
        let direct = if v6 {
            icrc::icrc_ipv6(&ip_hdr, &udp, covered)
        } else {
            icrc::icrc_ipv4(&ip_hdr, &udp, covered)
        };
        assert_eq!(
            direct,
            crc,
            "icrc_ipv{} vs IcrcPrefix",
            if v6 { 6 } else { 4 }
        );
        let from_headers = IcrcPrefix::from_headers(&ip_hdr, &udp).unwrap();
        assert_eq!(from_headers.compute(covered), Ok(crc));

        // fill() then verify() over the whole IP packet.
        let mut pkt = ip_hdr.clone();
        pkt.extend_from_slice(&udp);
        pkt.extend_from_slice(data);
        let at = ip_hdr.len() + UDP_HEADER_LEN;
        prefix
            .fill(&mut roce::Packet::new_unchecked(&mut pkt[at..]))
            .unwrap();
        assert_eq!(le32(&pkt[pkt.len() - ICRC_LEN..]), crc, "fill stores LE");
        assert_eq!(icrc::icrc(&pkt), Ok(crc));
        assert_eq!(icrc::verify(&pkt), Ok(()));
        let last = pkt.len() - 1;
        pkt[last] ^= 0x01;
        assert_eq!(icrc::verify(&pkt), Err(Error::BadIcrc));
    }
}

/// Runs one fixed-size header module over the raw bytes: `new_checked` fails exactly on
/// short buffers; a parsed `Repr` re-emits to the input (with the bytes at `masks` ANDed
/// with their masks: reserved bits, which emit zeroes) and re-parses equal.
macro_rules! fixed_header {
    ($data:expr, $m:ident, |$p:ident| $poke:expr, masks: [$(($i:expr, $mask:expr)),*]) => {{
        let data: &[u8] = $data;
        match $m::Packet::new_checked(data) {
            Err(e) => {
                assert_eq!(e, Error::Truncated);
                assert!(data.len() < $m::HEADER_LEN);
                assert_eq!(
                    $m::Repr::parse(&$m::Packet::new_unchecked(data)),
                    Err(Error::Truncated)
                );
            }
            Ok($p) => {
                black_box($poke);
                assert_eq!($p.as_ref().len(), data.len());
                if let Ok(r) = $m::Repr::parse(&$p) {
                    assert_eq!(r.buffer_len(), $m::HEADER_LEN);
                    let mut out = [0xa5u8; $m::HEADER_LEN];
                    r.emit(&mut $m::Packet::new_unchecked(&mut out[..]));
                    let mut n = [0u8; $m::HEADER_LEN];
                    n.copy_from_slice(&data[..$m::HEADER_LEN]);
                    let masks: &[(usize, u8)] = &[$(($i, $mask)),*];
                    for &(i, mask) in masks {
                        n[i] &= mask;
                    }
                    assert_eq!(out, n, concat!(stringify!($m), " emit is canonical"));
                    let again = $m::Packet::new_checked(&out[..]).unwrap();
                    assert_eq!($m::Repr::parse(&again), Ok(r));
                }
            }
        }
    }};
}

/// Every extended-header parser (and the BTH's) on the raw bytes.
pub fn ext_header_parsers(data: &[u8]) {
    fixed_header!(
        data,
        bth,
        |p| {
            poke_bth(&p);
            assert_eq!(bth::Repr::parse(&p).is_ok(), p.tver() == bth::TVER)
        },
        masks: [(4, 0xc0), (8, 0x80)]
    );
    fixed_header!(data, reth, |p| (p.va(), p.rkey(), p.dma_len()), masks: []);
    fixed_header!(
        data,
        aeth,
        |p| {
            let ok = aeth::Syndrome::from_byte(p.syndrome()).is_ok();
            assert_eq!(aeth::Repr::parse(&p).is_ok(), ok);
            if let Ok(s) = aeth::Syndrome::from_byte(p.syndrome()) {
                assert_eq!(s.to_byte(), p.syndrome());
            }
            p.msn()
        },
        masks: []
    );
    fixed_header!(data, deth, |p| (p.qkey(), p.src_qp(), p.reserved()), masks: [(4, 0)]);
    fixed_header!(data, immdt, |p| p.imm_data(), masks: []);
    fixed_header!(data, ieth, |p| p.rkey(), masks: []);
    fixed_header!(
        data,
        atomic_eth,
        |p| (p.va(), p.rkey(), p.swap_add(), p.compare()),
        masks: []
    );
    fixed_header!(data, atomic_ack_eth, |p| p.orig_data(), masks: []);
}

// ==========================================================================================
// ip_frames

/// `data` as an Ethernet frame and as a bare IP packet: [`ip::parse_ethernet_udp`],
/// [`ip::parse_ip_udp`], the Ethernet/IPv4/IPv6/UDP views and `Repr`s, and the ICRC of the
/// RoCEv2 packet the datagram would carry.
pub fn ip_frames(data: &[u8]) {
    ethernet(data);
    let from_eth = ip::parse_ethernet_udp(data);
    if let Some(inner) = data.get(ETHERNET_HEADER_LEN..) {
        let from_ip = ip::parse_ip_udp(inner);
        let ethertype = be16(&data[12..14]);
        match (&from_eth, &from_ip) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Ok(_), Err(e)) => panic!("frame parses but its IP packet fails with {e}"),
            (Err(e), Ok(d)) => {
                let family_ok = matches!(
                    (ethertype, d.src_addr),
                    (ip::ETHERTYPE_IPV4, IpAddr::V4(_)) | (ip::ETHERTYPE_IPV6, IpAddr::V6(_))
                );
                assert!(!family_ok, "IP packet parses but its frame fails with {e}");
            }
            (Err(_), Err(_)) => {}
        }
        ip_packet(inner);
    } else {
        assert_eq!(from_eth.unwrap_err(), Error::Truncated);
    }
    ip_packet(data);
}

fn ethernet(data: &[u8]) {
    match EthernetFrame::new_checked(data) {
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(data.len() < ETHERNET_HEADER_LEN);
        }
        Ok(f) => {
            black_box((f.dst_addr(), f.src_addr(), f.ethertype()));
            assert_eq!(f.payload(), &data[ETHERNET_HEADER_LEN..]);
            let r = EthernetRepr::parse(&f).unwrap();
            let mut out = [0u8; ETHERNET_HEADER_LEN];
            r.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
            assert_eq!(out[..], data[..ETHERNET_HEADER_LEN]);
            assert_eq!(r.buffer_len(), ETHERNET_HEADER_LEN);
        }
    }
}

fn ip_packet(data: &[u8]) {
    ipv4(data);
    ipv6(data);
    match ip::parse_ip_udp(data) {
        Ok(d) => {
            datagram(data, &d);
            datagram_icrc(&d, data);
        }
        Err(e) => assert_eq!(icrc::icrc(data), Err(e)),
    }
}

/// Where the pieces of a parsed datagram sit in the packet, and what they say.
fn datagram(data: &[u8], d: &UdpDatagram<'_>) {
    let hl = d.ip_header.len();
    assert_eq!(offset_in(data, d.ip_header), 0);
    assert_eq!(offset_in(data, d.udp_header), hl);
    assert_eq!(offset_in(data, d.payload), hl + UDP_HEADER_LEN);
    assert_eq!(d.udp_header.len(), UDP_HEADER_LEN);
    assert_eq!(d.src_port, be16(&d.udp_header[0..2]));
    assert_eq!(d.dst_port, be16(&d.udp_header[2..4]));
    let udp_len = usize::from(be16(&d.udp_header[4..6]));
    assert_eq!(udp_len, d.payload.len() + UDP_HEADER_LEN);
    match (data[0] >> 4, d.src_addr, d.dst_addr) {
        (4, IpAddr::V4(s), IpAddr::V4(t)) => {
            let p = Ipv4Packet::new_checked(data).unwrap();
            assert_eq!((p.src_addr(), p.dst_addr()), (s, t));
            assert_eq!(hl, p.header_len());
            assert!(hl >= IPV4_HEADER_LEN);
            assert!(hl + udp_len <= usize::from(p.total_len()));
            assert_eq!(p.protocol(), ip::IP_PROTOCOL_UDP);
        }
        (6, IpAddr::V6(s), IpAddr::V6(t)) => {
            let p = Ipv6Packet::new_checked(data).unwrap();
            assert_eq!((p.src_addr(), p.dst_addr()), (s, t));
            assert_eq!(hl, IPV6_HEADER_LEN);
            assert!(udp_len <= usize::from(p.payload_len()));
            assert_eq!(p.next_header(), ip::IP_PROTOCOL_UDP);
        }
        other => panic!("version/address family mismatch: {other:?}"),
    }
    udp(&data[hl..], d.src_addr, d.dst_addr);
}

/// `icrc`/`verify` on the IP packet agree with each other, with `icrc_ipv4/6` over the
/// located headers and, when the length fields are consistent, with an [`IcrcPrefix`].
fn datagram_icrc(d: &UdpDatagram<'_>, data: &[u8]) {
    let crc = icrc::icrc(data);
    let verified = icrc::verify(data);
    if d.payload.len() < roce::MIN_LEN {
        assert_eq!(crc, Err(Error::Truncated));
        assert_eq!(verified, Err(Error::Truncated));
        return;
    }
    let crc = crc.expect("icrc of a parsed datagram");
    let covered = &d.payload[..d.payload.len() - ICRC_LEN];
    let carried = le32(&d.payload[d.payload.len() - ICRC_LEN..]);
    assert_eq!(verified.is_ok(), crc == carried);
    if let Err(e) = verified {
        assert_eq!(e, Error::BadIcrc);
    }
    let direct = match d.src_addr {
        IpAddr::V4(_) => icrc::icrc_ipv4(d.ip_header, d.udp_header, covered),
        IpAddr::V6(_) => icrc::icrc_ipv6(d.ip_header, d.udp_header, covered),
    };
    assert_eq!(direct, crc);
    let udp_len = d.payload.len() + UDP_HEADER_LEN;
    let ip_len_field = usize::from(be16(&d.ip_header[2..4]));
    let ip6_len_field = usize::from(be16(&d.ip_header[4..6]));
    let consistent = match d.src_addr {
        IpAddr::V4(_) => ip_len_field == d.ip_header.len() + udp_len,
        IpAddr::V6(_) => ip6_len_field == udp_len,
    };
    let prefix = IcrcPrefix::from_headers(d.ip_header, d.udp_header)
        .expect("headers located by parse_ip_udp make a prefix");
    if consistent {
        assert_eq!(prefix.compute(covered), Ok(crc), "IcrcPrefix vs icrc()");
    } else {
        black_box(prefix.compute(covered).ok());
    }
}

fn ipv4(data: &[u8]) {
    if data.len() >= IPV4_HEADER_LEN {
        // Documented not to panic on an unchecked view of at least 20 bytes.
        let u = Ipv4Packet::new_unchecked(data);
        black_box((u.header(), u.payload(), u.verify_checksum()));
    }
    let p = match Ipv4Packet::new_checked(data) {
        Ok(p) => p,
        Err(e) => {
            let r = Ipv4Repr::parse(&Ipv4Packet::new_unchecked(data));
            assert_eq!(r, Err(e));
            return;
        }
    };
    black_box((
        p.version(),
        p.tos(),
        p.ident(),
        p.dont_frag(),
        p.more_frags(),
    ));
    black_box((p.frag_offset(), p.ttl(), p.protocol(), p.checksum()));
    black_box((p.src_addr(), p.dst_addr(), p.verify_checksum()));
    let (hl, total) = (p.header_len(), usize::from(p.total_len()));
    assert!(hl >= IPV4_HEADER_LEN && hl <= total && total <= data.len());
    assert_eq!(p.header(), &data[..hl]);
    assert_eq!(p.payload(), &data[hl..total]);
    let r = match Ipv4Repr::parse(&p) {
        Ok(r) => r,
        Err(_) => return,
    };
    assert_eq!(p.version(), 4);
    assert_eq!(r.payload_len, total - hl);
    assert_eq!(r.total_len(), Ok((r.payload_len + IPV4_HEADER_LEN) as u16));
    let mut out = vec![0u8; IPV4_HEADER_LEN + r.payload_len];
    r.emit(&mut Ipv4Packet::new_unchecked(&mut out[..]))
        .expect("a parsed IPv4 header re-emits");
    let again = Ipv4Packet::new_checked(&out[..]).unwrap();
    assert!(again.verify_checksum(), "emit fills a correct checksum");
    assert_eq!(Ipv4Repr::parse(&again), Ok(r));
    if hl == IPV4_HEADER_LEN {
        // Canonical up to the flags byte (only DF is kept) and the checksum.
        let mut n = data[..IPV4_HEADER_LEN].to_vec();
        n[6] &= 0x40;
        n[7] = 0;
        let flags_unchanged = n[6..8] == data[6..8];
        n[10..12].copy_from_slice(&out[10..12]);
        assert_eq!(out[..IPV4_HEADER_LEN], n[..], "IPv4 emit is canonical");
        if flags_unchanged && p.verify_checksum() {
            // Same header, so the same checksum, up to the two encodings of zero.
            let (a, b) = (be16(&out[10..12]), p.checksum());
            assert!(
                a == b || (a | b == 0xffff && a & b == 0),
                "{a:#x} vs {b:#x}"
            );
        }
    }
}

fn ipv6(data: &[u8]) {
    if data.len() >= IPV6_HEADER_LEN {
        let u = Ipv6Packet::new_unchecked(data);
        black_box((u.header(), u.payload()));
    }
    let p = match Ipv6Packet::new_checked(data) {
        Ok(p) => p,
        Err(e) => {
            let r = Ipv6Repr::parse(&Ipv6Packet::new_unchecked(data));
            assert_eq!(r, Err(e));
            return;
        }
    };
    black_box((p.version(), p.traffic_class(), p.flow_label()));
    black_box((p.next_header(), p.hop_limit(), p.src_addr(), p.dst_addr()));
    let pl = usize::from(p.payload_len());
    assert_eq!(p.header(), &data[..IPV6_HEADER_LEN]);
    assert_eq!(p.payload(), &data[IPV6_HEADER_LEN..IPV6_HEADER_LEN + pl]);
    assert!(p.flow_label() <= 0x000f_ffff);
    let r = match Ipv6Repr::parse(&p) {
        Ok(r) => r,
        Err(_) => return,
    };
    assert_eq!(r.payload_len, pl);
    assert_eq!(r.buffer_len(), IPV6_HEADER_LEN);
    let mut out = vec![0u8; IPV6_HEADER_LEN + pl];
    r.emit(&mut Ipv6Packet::new_unchecked(&mut out[..]))
        .expect("a parsed IPv6 header re-emits");
    assert_eq!(out[..IPV6_HEADER_LEN], data[..IPV6_HEADER_LEN], "IPv6 emit");
    assert_eq!(
        Ipv6Repr::parse(&Ipv6Packet::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
}

fn udp(data: &[u8], src: IpAddr, dst: IpAddr) {
    let p = match UdpPacket::new_checked(data) {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(UdpRepr::parse(&UdpPacket::new_unchecked(data)), Err(e));
            return;
        }
    };
    let len = usize::from(p.len());
    black_box((
        p.src_port(),
        p.dst_port(),
        p.checksum(),
        p.verify_checksum(src, dst),
    ));
    assert_eq!(p.is_empty(), len == UDP_HEADER_LEN);
    assert_eq!(p.header(), &data[..UDP_HEADER_LEN]);
    assert_eq!(p.payload(), &data[UDP_HEADER_LEN..len]);
    let r = UdpRepr::parse(&p).expect("a checked UDP view parses");
    assert_eq!(r.payload_len, len - UDP_HEADER_LEN);
    assert_eq!(r.udp_len(), Ok(len as u16));
    let mut out = data[..len].to_vec();
    r.emit(&mut UdpPacket::new_unchecked(&mut out[..])).unwrap();
    let mut n = data[..UDP_HEADER_LEN].to_vec();
    n[6..8].fill(0);
    assert_eq!(out[..UDP_HEADER_LEN], n[..], "UDP emit zeroes the checksum");
    assert_eq!(
        UdpRepr::parse(&UdpPacket::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
    let mut q = UdpPacket::new_unchecked(&mut out[..]);
    q.fill_checksum(src, dst);
    assert!(q.checksum() != 0);
    assert!(q.verify_checksum(src, dst), "fill_checksum then verify");
}

// ==========================================================================================
// cm_mad

/// `data` as a MAD and as CM data: [`mad::Packet`] / [`mad::Repr`], [`Message::parse`] and
/// emit round trips, every CM view's getters (with a setter round trip for each field), the
/// `cma_hdr` in REQ / SIDR_REQ private data and [`cma::parse_service_id`].
pub fn cm_mad(data: &[u8]) {
    mad_header(data);
    match mad::Packet::new_checked(data) {
        Ok(p) => {
            let parsed = Message::parse(&p);
            if let Ok(m) = &parsed {
                assert_eq!(p.base_version(), mad::BASE_VERSION);
                assert_eq!(p.mgmt_class(), mad::MGMT_CLASS_CM);
                assert_eq!(p.class_version(), mad::CM_CLASS_VERSION);
                assert_eq!(p.method(), mad::METHOD_SEND);
                assert_eq!(m.attribute_id(), p.attribute_id());
                let mut buf = [0u8; mad::MAD_SIZE];
                m.emit_mad(p.transaction_id(), &mut buf).unwrap();
                let q = mad::Packet::new_checked(&buf[..]).unwrap();
                assert_eq!(Message::parse(&q), Ok(*m));
                assert_eq!(q.transaction_id(), p.transaction_id());
                assert_eq!(buf[24..], canonical_cm(m)[..]);
                assert_eq!(
                    m.emit_mad(0, &mut buf[..mad::MAD_SIZE - 1]),
                    Err(Error::Truncated)
                );
            }
            cm_data(p.attribute_id(), p.data(), parsed.ok());
        }
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(data.len() < mad::MAD_SIZE);
            let r = Message::parse(&mad::Packet::new_unchecked(data));
            assert_eq!(r, Err(Error::Truncated));
        }
    }
    // The same bytes as bare CM data, the attribute chosen by the first byte
    // (REQ … SIDR_REP, and LAP / APR which are not decoded).
    if let Some((&sel, rest)) = data.split_first() {
        cm_data(mad::ATTR_CM_REQ + u16::from(sel % 11), rest, None);
    }
    cma_header(data);
    if let Some(b) = data.get(..8) {
        service_id(u64::from_be_bytes(b.try_into().unwrap()));
    }
}

fn mad_header(data: &[u8]) {
    let p = match mad::Packet::new_checked(data) {
        Ok(p) => p,
        Err(_) => return,
    };
    black_box((
        p.base_version(),
        p.mgmt_class(),
        p.class_version(),
        p.method(),
    ));
    black_box((p.status(), p.class_specific(), p.transaction_id()));
    black_box((p.attribute_id(), p.reserved(), p.attribute_modifier()));
    assert_eq!(p.data(), &data[mad::MAD_HEADER_LEN..mad::MAD_SIZE]);
    match mad::Repr::parse(&p) {
        Err(e) => {
            assert_eq!(e, Error::Unsupported);
            assert_ne!(p.base_version(), mad::BASE_VERSION);
        }
        Ok(r) => {
            assert_eq!(r.buffer_len(), mad::MAD_SIZE);
            let mut out = data[..mad::MAD_SIZE].to_vec();
            r.emit(&mut mad::Packet::new_unchecked(&mut out[..]));
            let mut n = data[..mad::MAD_SIZE].to_vec();
            n[18..20].fill(0);
            assert_eq!(out, n, "MAD header emit is canonical, class data untouched");
            let again = mad::Packet::new_checked(&out[..]).unwrap();
            assert_eq!(mad::Repr::parse(&again), Ok(r));
        }
    }
}

fn canonical_cm(m: &Message) -> [u8; CM_DATA_LEN] {
    let mut out = [0xffu8; CM_DATA_LEN];
    m.emit(&mut out).unwrap();
    out
}

/// CM data under attribute `attr`: every view, then [`Message::parse_data`] and its round
/// trip. `expected` is what [`Message::parse`] said about the enclosing MAD, if any.
fn cm_data(attr: u16, data: &[u8], expected: Option<Message>) {
    cm_views(data);
    let parsed = Message::parse_data(attr, data);
    if let Some(m) = expected {
        assert_eq!(parsed, Ok(m));
    }
    let m = match parsed {
        Ok(m) => m,
        Err(e) => {
            let known = (mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP).contains(&attr);
            if !known {
                assert_eq!(e, Error::Unsupported);
            } else if data.len() < CM_DATA_LEN {
                assert_eq!(e, Error::Truncated);
            } else {
                assert_eq!(e, Error::Malformed);
            }
            return;
        }
    };
    assert_eq!(m.attribute_id(), attr);
    assert_eq!(m.buffer_len(), CM_DATA_LEN);
    assert!(!m.name().is_empty());
    // Canonical: emit writes only bits the input had (reserved bits dropped, nothing
    // invented), whatever the buffer held before, and the result parses back equal.
    let out = canonical_cm(&m);
    let mut zeroed = [0u8; CM_DATA_LEN];
    m.emit(&mut zeroed).unwrap();
    assert_eq!(out, zeroed, "emit must clear the buffer's reserved bits");
    for (i, (o, d)) in out.iter().zip(data).enumerate() {
        assert_eq!(o & !d, 0, "emit invented bits in byte {i} of {}", m.name());
    }
    assert_eq!(Message::parse_data(attr, &out), Ok(m));
    assert_eq!(
        m.emit(&mut zeroed[..CM_DATA_LEN - 1]),
        Err(Error::Truncated)
    );

    match &m {
        Message::Req(r) => {
            assert_eq!(r.buffer_len(), CM_DATA_LEN);
            cma_header(&r.private_data);
            service_id(r.service_id);
        }
        Message::SidrReq(r) => {
            cma_header(&r.private_data);
            service_id(r.service_id);
        }
        Message::SidrRep(r) => {
            assert!(usize::from(r.additional_info_length) <= cm::SIDR_REP_ADDITIONAL_INFO_LEN);
            service_id(r.service_id);
        }
        Message::Rej(r) => {
            assert_eq!(r.ari_info().len(), usize::from(r.reject_info_length));
            assert_eq!(
                cm::RejectReason::from_u16(r.reason.to_u16()).to_u16(),
                r.reason.to_u16()
            );
        }
        _ => {}
    }
}

/// For one view: `new_checked` fails exactly on short buffers; the private data is the tail
/// of the CM data; each field read and written back leaves the bytes unchanged; `clear`
/// zeroes every field.
macro_rules! cm_view {
    ($data:expr, $view:ident, $pd_len:expr, [$(($get:ident, $set:ident)),* $(,)?], |$p:ident| $extra:expr) => {{
        let data: &[u8] = $data;
        match cm::$view::new_checked(data) {
            Err(e) => {
                assert_eq!(e, Error::Truncated);
                assert!(data.len() < CM_DATA_LEN);
            }
            Ok($p) => {
                assert_eq!($p.private_data(), &data[CM_DATA_LEN - $pd_len..CM_DATA_LEN]);
                black_box($extra);
                let mut copy = data[..CM_DATA_LEN].to_vec();
                {
                    let mut q = cm::$view::new_unchecked(&mut copy[..]);
                    $(
                        let v = $p.$get();
                        q.$set(v);
                        assert_eq!(q.$get(), v, concat!(stringify!($view), "::", stringify!($get)));
                    )*
                }
                assert_eq!(copy[..], data[..CM_DATA_LEN], concat!(stringify!($view), " setters"));
                let mut q = cm::$view::new_unchecked(&mut copy[..]);
                q.clear();
                $( assert!(q.$get().is_zero(), concat!(stringify!($view), "::clear")); )*
                assert!(q.private_data_mut().iter().all(|b| *b == 0));
            }
        }
    }};
}

/// Whether a field read from a cleared view is zero.
trait IsZero {
    fn is_zero(&self) -> bool;
}

macro_rules! is_zero_int {
    ($($t:ty),*) => {$(
        impl IsZero for $t {
            fn is_zero(&self) -> bool {
                *self == 0
            }
        }
    )*};
}
is_zero_int!(u8, u16, u32, u64);

impl IsZero for bool {
    fn is_zero(&self) -> bool {
        !*self
    }
}

impl IsZero for Ipv6Addr {
    fn is_zero(&self) -> bool {
        self.is_unspecified()
    }
}

fn cm_views(data: &[u8]) {
    cm_view!(
        data,
        ReqPacket,
        cm::REQ_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (vendor_id, set_vendor_id),
            (service_id, set_service_id),
            (local_ca_guid, set_local_ca_guid),
            (local_qkey, set_local_qkey),
            (local_qpn, set_local_qpn),
            (responder_resources, set_responder_resources),
            (local_eecn, set_local_eecn),
            (initiator_depth, set_initiator_depth),
            (remote_eecn, set_remote_eecn),
            (remote_cm_response_timeout, set_remote_cm_response_timeout),
            (transport_service_type, set_transport_service_type),
            (end_to_end_flow_control, set_end_to_end_flow_control),
            (starting_psn, set_starting_psn),
            (local_cm_response_timeout, set_local_cm_response_timeout),
            (retry_count, set_retry_count),
            (partition_key, set_partition_key),
            (path_mtu, set_path_mtu),
            (rdc_exists, set_rdc_exists),
            (rnr_retry_count, set_rnr_retry_count),
            (max_cm_retries, set_max_cm_retries),
            (srq, set_srq),
            (extended_transport_type, set_extended_transport_type),
            (primary_local_lid, set_primary_local_lid),
            (primary_remote_lid, set_primary_remote_lid),
            (primary_local_gid, set_primary_local_gid),
            (primary_remote_gid, set_primary_remote_gid),
            (primary_flow_label, set_primary_flow_label),
            (primary_packet_rate, set_primary_packet_rate),
            (primary_traffic_class, set_primary_traffic_class),
            (primary_hop_limit, set_primary_hop_limit),
            (primary_sl, set_primary_sl),
            (primary_subnet_local, set_primary_subnet_local),
            (primary_local_ack_timeout, set_primary_local_ack_timeout),
            (alternate_local_lid, set_alternate_local_lid),
            (alternate_remote_lid, set_alternate_remote_lid),
            (alternate_local_gid, set_alternate_local_gid),
            (alternate_remote_gid, set_alternate_remote_gid),
            (alternate_flow_label, set_alternate_flow_label),
            (alternate_packet_rate, set_alternate_packet_rate),
            (alternate_traffic_class, set_alternate_traffic_class),
            (alternate_hop_limit, set_alternate_hop_limit),
            (alternate_sl, set_alternate_sl),
            (alternate_subnet_local, set_alternate_subnet_local),
            (alternate_local_ack_timeout, set_alternate_local_ack_timeout),
            (sap_supported, set_sap_supported),
        ],
        |p| {
            assert_eq!(p.primary_path_bytes(), &data[52..96]);
            assert_eq!(p.alternate_path_bytes(), &data[96..140]);
        }
    );
    cm_view!(
        data,
        MraPacket,
        cm::MRA_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
            (message_mraed, set_message_mraed),
            (service_timeout, set_service_timeout),
        ],
        |p| ()
    );
    cm_view!(
        data,
        RejPacket,
        cm::REJ_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
            (message_rejected, set_message_rejected),
            (reject_info_length, set_reject_info_length),
            (reason, set_reason),
        ],
        |p| assert_eq!(p.ari(), &data[12..12 + cm::REJ_ARI_LEN])
    );
    cm_view!(
        data,
        RepPacket,
        cm::REP_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
            (local_qkey, set_local_qkey),
            (local_qpn, set_local_qpn),
            (vendor_id_high, set_vendor_id_high),
            (local_eecn, set_local_eecn),
            (vendor_id_mid, set_vendor_id_mid),
            (starting_psn, set_starting_psn),
            (vendor_id_low, set_vendor_id_low),
            (responder_resources, set_responder_resources),
            (initiator_depth, set_initiator_depth),
            (target_ack_delay, set_target_ack_delay),
            (failover_accepted, set_failover_accepted),
            (end_to_end_flow_control, set_end_to_end_flow_control),
            (rnr_retry_count, set_rnr_retry_count),
            (srq, set_srq),
            (local_ca_guid, set_local_ca_guid),
        ],
        |p| ()
    );
    cm_view!(
        data,
        RtuPacket,
        cm::RTU_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
        ],
        |p| ()
    );
    cm_view!(
        data,
        DreqPacket,
        cm::DREQ_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
            (remote_qpn_eecn, set_remote_qpn_eecn),
        ],
        |p| ()
    );
    cm_view!(
        data,
        DrepPacket,
        cm::DREP_PRIVATE_DATA_LEN,
        [
            (local_comm_id, set_local_comm_id),
            (remote_comm_id, set_remote_comm_id),
        ],
        |p| ()
    );
    cm_view!(
        data,
        SidrReqPacket,
        cm::SIDR_REQ_PRIVATE_DATA_LEN,
        [
            (request_id, set_request_id),
            (partition_key, set_partition_key),
            (service_id, set_service_id),
        ],
        |p| ()
    );
    cm_view!(
        data,
        SidrRepPacket,
        cm::SIDR_REP_PRIVATE_DATA_LEN,
        [
            (request_id, set_request_id),
            (status, set_status),
            (additional_info_length, set_additional_info_length),
            (vendor_id_high, set_vendor_id_high),
            (qpn, set_qpn),
            (vendor_id_low, set_vendor_id_low),
            (service_id, set_service_id),
            (qkey, set_qkey),
        ],
        |p| assert_eq!(
            p.additional_info(),
            &data[24..24 + cm::SIDR_REP_ADDITIONAL_INFO_LEN]
        )
    );
}

/// The `cma_hdr` view and `Repr` on private data.
fn cma_header(pd: &[u8]) {
    match CmaHeader::new_checked(pd) {
        Err(e) => {
            assert_eq!(e, Error::Truncated);
            assert!(pd.len() < CMA_HDR_LEN);
        }
        Ok(h) => {
            black_box((h.cma_version(), h.ip_version(), h.ip_version_reserved()));
            black_box((h.src_port(), h.src_addr_bytes(), h.dst_addr_bytes()));
            assert_eq!(h.payload(), &pd[CMA_HDR_LEN..]);
        }
    }
    let (r, rest) = match CmaHeaderRepr::parse_private_data(pd) {
        Ok(x) => x,
        Err(_) => return,
    };
    assert_eq!(rest, &pd[CMA_HDR_LEN..]);
    assert_eq!(r.cma_version, cma::CMA_VERSION);
    assert!(r.ip_version == 4 || r.ip_version == 6);
    assert_eq!(r.buffer_len(), CMA_HDR_LEN);
    let mut out = [0xa5u8; CMA_HDR_LEN];
    r.emit(&mut CmaHeader::new_unchecked(&mut out[..]));
    assert_eq!(
        CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
    let mut n = [0u8; CMA_HDR_LEN];
    n.copy_from_slice(&pd[..CMA_HDR_LEN]);
    n[1] &= 0xf0;
    if r.ip_version == 4 {
        n[4..16].fill(0);
        n[20..32].fill(0);
    }
    assert_eq!(out, n, "cma_hdr emit is canonical");
}

fn service_id(sid: u64) {
    match cma::parse_service_id(sid) {
        Some((ps, port)) => {
            assert_eq!(cma::service_id(ps, port), sid);
            assert_eq!(cma::PortSpace::from_u16(ps.to_u16()), Some(ps));
        }
        None => assert!(sid >> 32 != 0 || cma::PortSpace::from_u16((sid >> 16) as u16).is_none()),
    }
}

// ==========================================================================================
// pcap_file

/// A classic pcap file: [`PcapReader::new`], the record iterator (records tile the file,
/// at most one error and it ends the iteration), a [`PcapWriter`] round trip, and the
/// [`ip_frames`] checks on each Ethernet record.
pub fn pcap_file(data: &[u8]) {
    let r = match PcapReader::new(data) {
        Ok(r) => r,
        Err(e) => {
            if data.len() < 24 {
                assert_eq!(e, Error::Truncated);
            } else {
                assert_eq!(e, Error::Unsupported);
            }
            return;
        }
    };
    assert!(r.link_type() <= 0x0fff_ffff);
    black_box(r.snaplen());
    let mut at = 24;
    let mut records = Vec::new();
    let mut failed = false;
    for rec in r.records() {
        assert!(!failed, "the iteration ends after an error");
        match rec {
            Ok(rec) => {
                assert_eq!(offset_in(data, rec.data), at + 16);
                at += 16 + rec.data.len();
                records.push(rec);
            }
            Err(e) => {
                assert_eq!(e, Error::Truncated);
                let left = data.len() - at;
                assert!(left < 16 || left - 16 < captured_len(data, at));
                failed = true;
            }
        }
    }
    if !failed {
        assert_eq!(at, data.len(), "records tile the file");
    }

    let mut w = PcapWriter::new(Vec::new(), r.link_type(), u32::MAX).unwrap();
    for rec in &records {
        w.write_record(rec.ts_sec, rec.ts_nanos, rec.data).unwrap();
    }
    w.flush().unwrap();
    let file = w.into_inner();
    let back = PcapReader::new(&file).unwrap();
    assert_eq!(back.link_type(), r.link_type());
    let reread: Vec<_> = back.records().collect::<Result<_, _>>().unwrap();
    assert_eq!(reread.len(), records.len());
    for (a, b) in records.iter().zip(&reread) {
        assert_eq!((a.ts_sec, a.data), (b.ts_sec, b.data));
        assert_eq!(b.ts_nanos, a.ts_nanos / 1000 * 1000);
        assert_eq!(b.orig_len as usize, a.data.len());
    }

    if r.link_type() == LINKTYPE_ETHERNET {
        for rec in &records {
            ip_frames(rec.data);
        }
    }
}

/// The captured length in the record header at `at`, in the file's byte order (which the
/// reader does not expose, so it is re-derived from the magic).
fn captured_len(data: &[u8], at: usize) -> usize {
    let b: [u8; 4] = data[at + 8..at + 12].try_into().unwrap();
    let big = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) >> 16 == 0xa1b2;
    if big {
        u32::from_be_bytes(b) as usize
    } else {
        u32::from_le_bytes(b) as usize
    }
}

#[cfg(test)]
mod tests {
    //! The harnesses on stable Rust: every record of the golden captures, each cut at every
    //! length and with single bytes flipped.

    use super::*;
    use std::path::PathBuf;

    fn golden(name: &str) -> Option<Vec<u8>> {
        let dir = std::env::var_os("SOFTRDMA_GOLDEN_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden"),
            PathBuf::from,
        );
        match std::fs::read(dir.join(name)) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("golden capture {name} missing ({e}); skipped");
                None
            }
        }
    }

    fn frames() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for name in [
            "rxe_cm_req_no_listener.pcap",
            "synthetic_cm_messages.pcap",
            "synthetic_mixed_one_bad_icrc.pcap",
        ] {
            if let Some(file) = golden(name) {
                pcap_file(&file);
                let r = PcapReader::new(&file).unwrap();
                out.extend(r.records().map(|rec| rec.unwrap().data.to_vec()));
            }
        }
        out
    }

    fn mutations(input: &[u8], f: fn(&[u8])) {
        f(input);
        for n in 0..input.len().min(80) {
            f(&input[..n]);
        }
        for i in 0..input.len().min(80) {
            for bit in [0x01u8, 0x10, 0x80] {
                let mut m = input.to_vec();
                m[i] ^= bit;
                f(&m);
            }
        }
    }

    #[test]
    fn golden_frames_and_mutations() {
        for frame in frames() {
            mutations(&frame, ip_frames);
            let d = ip::parse_ethernet_udp(&frame).unwrap();
            mutations(d.payload, roce_packet);
            if d.payload.len() >= 20 + mad::MAD_SIZE {
                mutations(&d.payload[20..], cm_mad);
            }
        }
    }

    #[test]
    fn junk_never_panics() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in (0..600).step_by(7) {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            roce_packet(&data);
            ip_frames(&data);
            cm_mad(&data);
            pcap_file(&data);
        }
    }
}
