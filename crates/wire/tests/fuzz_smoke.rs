//! Stable counterpart of the cargo-fuzz targets in `fuzz/` (see `fuzz/README.md`): the same
//! kind of checks, shortened, run by proptest over random bytes and over golden-capture
//! inputs with bytes flipped and cut short. The full checks live in `fuzz/src/lib.rs`.

use proptest::prelude::*;
use softrdma_wire::cm::{Message, CM_DATA_LEN};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};
use softrdma_wire::icrc::{self, IcrcPrefix};
use softrdma_wire::ip::{self, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, UdpPacket, UdpRepr};
use softrdma_wire::pcap::{PcapReader, PcapWriter};
use softrdma_wire::{mad, roce, Error, ROCE_V2_UDP_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::OnceLock;

// ------------------------------------------------------------------------------------------
// Inputs

struct Golden {
    frames: Vec<Vec<u8>>,
    roce: Vec<Vec<u8>>,
    mads: Vec<Vec<u8>>,
    pcaps: Vec<Vec<u8>>,
}

fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| {
        let dir = std::env::var_os("SOFTRDMA_GOLDEN_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
            PathBuf::from,
        );
        let mut g = Golden {
            frames: vec![],
            roce: vec![],
            mads: vec![],
            pcaps: vec![],
        };
        for name in [
            "rxe_cm_req_no_listener.pcap",
            "synthetic_cm_messages.pcap",
            "synthetic_mixed_one_bad_icrc.pcap",
        ] {
            let path = dir.join(name);
            let file = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "golden capture {} is missing ({e}); set SOFTRDMA_GOLDEN_DIR",
                    path.display()
                )
            });
            for rec in PcapReader::new(&file).unwrap().records() {
                let frame = rec.unwrap().data;
                let payload = ip::parse_ethernet_udp(frame).unwrap().payload;
                if payload.len() >= 20 + mad::MAD_SIZE {
                    g.mads.push(payload[20..20 + mad::MAD_SIZE].to_vec());
                }
                g.roce.push(payload.to_vec());
                g.frames.push(frame.to_vec());
            }
            g.pcaps.push(file);
        }
        g
    })
}

/// A golden input (picked by `pick`) with `flips` XORed in and cut to `cut` bytes.
fn mutate(pool: &[Vec<u8>], pick: usize, flips: &[(usize, u8)], cut: usize) -> Vec<u8> {
    let mut v = pool[pick % pool.len()].clone();
    for &(at, x) in flips {
        let n = v.len();
        if n > 0 {
            v[at % n] ^= x;
        }
    }
    let keep = if cut.is_multiple_of(4) {
        v.len()
    } else {
        cut % (v.len() + 1)
    };
    v.truncate(keep);
    v
}

// ------------------------------------------------------------------------------------------
// Checks (shortened copies of fuzz/src/lib.rs)

fn check_roce(data: &[u8]) {
    let u = roce::Packet::new_unchecked(data);
    let _ = (
        u.payload(),
        u.pad(),
        u.icrc(),
        u.icrc_covered(),
        u.header_len(),
    );
    let _ = (
        u.reth(),
        u.aeth(),
        u.deth(),
        u.immdt(),
        u.ieth(),
        u.atomic_eth(),
    );
    let Ok(p) = roce::Packet::new_checked(data) else {
        assert!(roce::Repr::parse(&u).is_err());
        return;
    };
    let len = data.len();
    assert_eq!(p.header_len() + p.payload().len() + p.pad().len() + 4, len);
    assert_eq!(p.pad().len(), p.pad_count());
    if let Ok(r) = roce::Repr::parse(&p) {
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut roce::Packet::new_unchecked(&mut out[..]), p.payload())
            .unwrap();
        let again = roce::Packet::new_checked(&out[..]).unwrap();
        assert_eq!(roce::Repr::parse(&again), Ok(r));
        // Canonical up to BTH reserved bits, the DETH reserved byte, pad and ICRC.
        let mut n = data.to_vec();
        n[4] &= 0xc0;
        n[8] &= 0x80;
        if let Some(at) = p.opcode_info().and_then(|i| i.offset_of(deth_header())) {
            n[at + 4] = 0;
        }
        n[p.header_len() + p.payload().len()..].fill(0);
        assert_eq!(out, n);
    }
    // ICRC: prefix, pieces, whole IPv4 packet.
    let covered = p.icrc_covered();
    let prefix = IcrcPrefix::ipv4(SRC, DST, 0xc000, ROCE_V2_UDP_PORT);
    let crc = prefix.compute(covered).unwrap();
    let split = usize::from(data[9]) % (covered.len() + 1);
    let mut h = prefix.start(covered.len()).unwrap();
    h.update(&covered[..split]);
    h.update(&covered[split..]);
    assert_eq!(h.finalize(), crc);
    let mut pkt = ipv4_udp(data, data[3], data[6]);
    prefix
        .fill(&mut roce::Packet::new_unchecked(&mut pkt[28..]))
        .unwrap();
    assert_eq!(icrc::icrc(&pkt), Ok(crc));
    assert_eq!(icrc::verify(&pkt), Ok(()));
}

fn deth_header() -> softrdma_wire::opcode::ExtHeader {
    softrdma_wire::opcode::ExtHeader::Deth
}

const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);

/// IPv4 (ident 0, DF) + UDP headers around `payload`, with the masked TOS and TTL given.
fn ipv4_udp(payload: &[u8], tos: u8, ttl: u8) -> Vec<u8> {
    let udp_len = (payload.len() + 8) as u16;
    let mut p = vec![0x45, tos];
    p.extend_from_slice(&(udp_len + 20).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, ttl, 17, 0xde, 0xad]);
    p.extend_from_slice(&SRC.octets());
    p.extend_from_slice(&DST.octets());
    p.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]);
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0xbe, 0xef]);
    p.extend_from_slice(payload);
    p
}

fn check_ip(data: &[u8]) {
    let eth = ip::parse_ethernet_udp(data);
    if let (Ok(a), Some(inner)) = (&eth, data.get(14..)) {
        assert_eq!(ip::parse_ip_udp(inner).as_ref(), Ok(a));
    }
    for pkt in [data, data.get(14..).unwrap_or(&[])] {
        check_ip_packet(pkt);
    }
}

fn check_ip_packet(data: &[u8]) {
    let d = match ip::parse_ip_udp(data) {
        Ok(d) => d,
        Err(e) => return assert_eq!(icrc::icrc(data), Err(e)),
    };
    assert_eq!(
        d.payload.len() + 8,
        usize::from(u16::from_be_bytes([d.udp_header[4], d.udp_header[5]]))
    );
    if d.payload.len() >= roce::MIN_LEN {
        let crc = icrc::icrc(data).unwrap();
        let carried = roce::Packet::new_unchecked(d.payload).icrc();
        assert_eq!(icrc::verify(data).is_ok(), crc == carried);
    } else {
        assert_eq!(icrc::icrc(data), Err(Error::Truncated));
    }
    if let Ok(r) = Ipv4Repr::parse(&Ipv4Packet::new_unchecked(data)) {
        let mut out = vec![0u8; 20 + r.payload_len];
        r.emit(&mut Ipv4Packet::new_unchecked(&mut out[..]))
            .unwrap();
        let again = Ipv4Packet::new_checked(&out[..]).unwrap();
        assert!(again.verify_checksum());
        assert_eq!(Ipv4Repr::parse(&again), Ok(r));
    }
    if let Ok(r) = Ipv6Repr::parse(&Ipv6Packet::new_unchecked(data)) {
        let mut out = vec![0u8; 40 + r.payload_len];
        r.emit(&mut Ipv6Packet::new_unchecked(&mut out[..]))
            .unwrap();
        assert_eq!(out[..40], data[..40]);
    }
    let udp = &data[d.ip_header.len()..];
    let r = UdpRepr::parse(&UdpPacket::new_checked(udp).unwrap()).unwrap();
    let mut out = udp[..8 + r.payload_len].to_vec();
    r.emit(&mut UdpPacket::new_unchecked(&mut out[..])).unwrap();
    let mut q = UdpPacket::new_unchecked(&mut out[..]);
    q.fill_checksum(d.src_addr, d.dst_addr);
    assert!(q.verify_checksum(d.src_addr, d.dst_addr));
}

fn check_cm(data: &[u8]) {
    if let Ok(p) = mad::Packet::new_checked(data) {
        if let Ok(r) = mad::Repr::parse(&p) {
            let mut out = data[..mad::MAD_SIZE].to_vec();
            r.emit(&mut mad::Packet::new_unchecked(&mut out[..]));
            let mut n = data[..mad::MAD_SIZE].to_vec();
            n[18..20].fill(0);
            assert_eq!(out, n);
        }
        if let Ok(m) = Message::parse(&p) {
            let mut out = [0xffu8; CM_DATA_LEN];
            m.emit(&mut out).unwrap();
            for (o, i) in out.iter().zip(p.data()) {
                assert_eq!(o & !i, 0, "emit invents bits in {}", m.name());
            }
            assert_eq!(Message::parse_data(m.attribute_id(), &out), Ok(m));
            let pd = match &m {
                Message::Req(r) => Some((&r.private_data[..], r.service_id)),
                Message::SidrReq(r) => Some((&r.private_data[..], r.service_id)),
                _ => None,
            };
            if let Some((pd, sid)) = pd {
                check_cma(pd);
                if let Some((ps, port)) = cma::parse_service_id(sid) {
                    assert_eq!(cma::service_id(ps, port), sid);
                }
            }
        }
    }
    if let Some((&sel, rest)) = data.split_first() {
        let _ = Message::parse_data(mad::ATTR_CM_REQ + u16::from(sel % 11), rest);
    }
    check_cma(data);
}

fn check_cma(pd: &[u8]) {
    let Ok((r, rest)) = CmaHeaderRepr::parse_private_data(pd) else {
        return;
    };
    assert_eq!(rest, &pd[36..]);
    let mut out = [0u8; 36];
    r.emit(&mut CmaHeader::new_unchecked(&mut out[..]));
    assert_eq!(
        CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
    assert_eq!(out[1], pd[1] & 0xf0);
    assert_eq!(out[32..36], pd[32..36]);
}

fn check_pcap(data: &[u8]) {
    let Ok(r) = PcapReader::new(data) else {
        return;
    };
    let recs: Vec<_> = r.records().collect();
    let ok: Vec<_> = recs.iter().filter_map(|x| x.ok()).collect();
    assert!(
        ok.len() + 1 >= recs.len(),
        "only the last item may be an error"
    );
    let used: usize = 24 + ok.iter().map(|x| 16 + x.data.len()).sum::<usize>();
    assert!(used <= data.len());
    if ok.len() == recs.len() {
        assert_eq!(used, data.len());
    }
    let mut w = PcapWriter::new(Vec::new(), r.link_type(), u32::MAX).unwrap();
    for x in &ok {
        w.write_record(x.ts_sec, x.ts_nanos, x.data).unwrap();
        check_ip(x.data);
    }
    let file = w.into_inner();
    let back: Vec<_> = PcapReader::new(&file)
        .unwrap()
        .records()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(back.len(), ok.len());
    for (a, b) in ok.iter().zip(&back) {
        assert_eq!(
            (a.ts_sec, a.ts_nanos / 1000, a.data),
            (b.ts_sec, b.ts_nanos / 1000, b.data)
        );
    }
}

// ------------------------------------------------------------------------------------------

#[test]
fn golden_inputs_pass_unmutated() {
    let g = golden();
    assert!(!g.frames.is_empty() && !g.mads.is_empty());
    g.frames.iter().for_each(|f| check_ip(f));
    g.roce.iter().for_each(|f| check_roce(f));
    g.mads.iter().for_each(|f| check_cm(f));
    g.pcaps.iter().for_each(|f| check_pcap(f));
    let _ = IpAddr::V4(SRC);
}

fn flips() -> impl Strategy<Value = Vec<(usize, u8)>> {
    proptest::collection::vec((any::<usize>(), 1u8..), 0..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        check_roce(&data);
        check_ip(&data);
        check_cm(&data);
        check_pcap(&data);
    }

    #[test]
    fn mutated_roce(pick in any::<usize>(), f in flips(), cut in any::<usize>()) {
        check_roce(&mutate(&golden().roce, pick, &f, cut));
    }

    #[test]
    fn mutated_frames(pick in any::<usize>(), f in flips(), cut in any::<usize>()) {
        check_ip(&mutate(&golden().frames, pick, &f, cut));
    }

    #[test]
    fn mutated_mads(pick in any::<usize>(), f in flips(), cut in any::<usize>()) {
        check_cm(&mutate(&golden().mads, pick, &f, cut));
    }

    #[test]
    fn mutated_pcaps(pick in any::<usize>(), f in flips(), cut in any::<usize>()) {
        check_pcap(&mutate(&golden().pcaps, pick, &f, cut));
    }
}
