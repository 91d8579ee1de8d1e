//! What Linux rdma_cm adds on top of the IB CM: port-space service IDs, the 36-byte
//! `cma_hdr` at the start of REQ and SIDR_REQ private data, and its default constants.
//!
//! # Service IDs
//!
//! rdma_cm maps an IP port to a CM service ID as `(port_space << 16) | port`, e.g. TCP port
//! 7471 → `0x0000_0000_0106_1D2F`. For the TCP, UDP and IB port spaces this places the IBTA
//! Annex A11 "IP CM" prefix `0x0000000001` in the top 40 bits and the IP protocol number
//! (6, 17) or 0x3F in the next 8; the IPoIB space (0x0002) has no such prefix.
//!
//! # The `cma_hdr`
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | cma_version, 0 |
//! | 1 | 1 | IP version in the high nibble (4 or 6); low nibble reserved |
//! | 2 | 2 | source port (the active side's rdma_cm port) |
//! | 4 | 16 | source IP (IPv4: 12 zero bytes, then the address) |
//! | 20 | 16 | destination IP (same encoding) |
//!
//! ```
//! use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
//! use std::net::{IpAddr, Ipv4Addr};
//! assert_eq!(cma::service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1D2F);
//! assert_eq!(cma::parse_service_id(0x0106_1D2F), Some((PortSpace::Tcp, 7471)));
//! let hdr = CmaHeaderRepr::new(
//!     IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
//!     43223,
//!     IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
//! );
//! let mut pd = [0u8; 92];
//! hdr.emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
//! assert_eq!(&pd[..4], &[0x00, 0x40, 0xa8, 0xd7]);
//! assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&pd[..]).unwrap()), Ok(hdr));
//! ```

use crate::{Error, Result};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Length of `struct cma_hdr`.
pub const CMA_HDR_LEN: usize = 36;
/// The only `cma_version` rdma_cm accepts.
pub const CMA_VERSION: u8 = 0;

/// The Q_Key rdma_cm gives UD QPs of the UDP and IB port spaces (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Service-ID base of the TCP port space (`RDMA_IB_IP_PS_TCP`).
pub const RDMA_IB_IP_PS_TCP: u64 = 0x0000_0000_0106_0000;
/// Service-ID base of the UDP port space (`RDMA_IB_IP_PS_UDP`).
pub const RDMA_IB_IP_PS_UDP: u64 = 0x0000_0000_0111_0000;
/// Service-ID base of the IB port space (`RDMA_IB_PS_IB`).
pub const RDMA_IB_PS_IB: u64 = 0x0000_0000_013F_0000;
/// Mask of the port-space part of a service ID.
pub const RDMA_IB_IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
/// Mask of the port part of a service ID.
pub const RDMA_IB_IP_PORT_MASK: u64 = 0x0000_0000_0000_FFFF;

/// Most user private data a REQ can carry after the `cma_hdr` (92 − 36).
pub const MAX_PRIVATE_DATA_REQ: usize = 56;
/// Most user private data a SIDR_REQ can carry after the `cma_hdr` (216 − 36).
pub const MAX_PRIVATE_DATA_SIDR_REQ: usize = 180;
/// Most user private data of a REP (no header).
pub const MAX_PRIVATE_DATA_REP: usize = 196;
/// Most user private data of a REJ (no header).
pub const MAX_PRIVATE_DATA_REJ: usize = 148;
/// Most user private data of an RTU (no header).
pub const MAX_PRIVATE_DATA_RTU: usize = 224;
/// Most user private data of a DREQ (no header).
pub const MAX_PRIVATE_DATA_DREQ: usize = 220;
/// Most user private data of a DREP (no header).
pub const MAX_PRIVATE_DATA_DREP: usize = 224;
/// Most user private data of an MRA (no header).
pub const MAX_PRIVATE_DATA_MRA: usize = 222;
/// Most user private data of a SIDR_REP (no header).
pub const MAX_PRIVATE_DATA_SIDR_REP: usize = 136;

/// CM response timeout rdma_cm puts in REQs and uses for SIDR_REQ (IBA time 20 ≈ 4.3 s;
/// Linux approximates it as 4096 ms). Upstream value; MLNX OFED uses 22.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// Max CM retries rdma_cm puts in REQs and uses for SIDR_REQ.
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// Packet lifetime rdma_cm assumes on RoCE (IBA time 18 ≈ 1.07 s). Newer kernels use 16.
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;
/// Service timeout of the MRA rdma_cm arms for a REQ not yet accepted (IBA time 24 ≈ 68 s).
pub const CMA_CM_MRA_SERVICE_TIMEOUT: u8 = 24;

/// An rdma_cm port space (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib = 0x0002,
    /// `RDMA_PS_TCP` (0x0106): RC connections.
    Tcp = 0x0106,
    /// `RDMA_PS_UDP` (0x0111): UD, resolved with SIDR.
    Udp = 0x0111,
    /// `RDMA_PS_IB` (0x013F): any QP type.
    Ib = 0x013F,
}

impl PortSpace {
    /// The port space with this number, or `None` if rdma_cm defines none.
    pub const fn from_u16(v: u16) -> Option<PortSpace> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }

    /// The port space number.
    pub const fn to_u16(self) -> u16 {
        self as u16
    }
}

/// The service ID rdma_cm uses for `port` in port space `ps`: `(ps << 16) | port`.
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    (ps as u64) << 16 | port as u64
}

/// Splits an rdma_cm service ID into port space and port.
///
/// Returns `None` unless the top 32 bits are zero and bits 31..16 name a port space — that
/// is, for TCP, UDP and IB, unless the top 40 bits are the IP CM prefix `0x0000000001`.
pub const fn parse_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    match PortSpace::from_u16((sid >> 16) as u16) {
        Some(ps) => Some((ps, sid as u16)),
        None => None,
    }
}

mod field {
    use core::ops::Range;
    pub const CMA_VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const SRC_PORT: Range<usize> = 2..4;
    pub const SRC_ADDR: Range<usize> = 4..20;
    pub const DST_ADDR: Range<usize> = 20..36;
}

/// A zero-copy view of a `cma_hdr`, normally the start of REQ or SIDR_REQ private data.
///
/// Built with [`CmaHeader::new_checked`], every accessor stays inside the buffer; built with
/// [`CmaHeader::new_unchecked`], accessors panic on a buffer shorter than [`CMA_HDR_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CmaHeader<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        CmaHeader { buffer }
    }

    /// Wraps a buffer after checking its length.
    ///
    /// Fails with [`Error::Truncated`] when the buffer is shorter than [`CMA_HDR_LEN`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Checks the buffer holds a whole header ([`Error::Truncated`] if not).
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < CMA_HDR_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Gives the underlying buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The `cma_version` byte (0).
    pub fn cma_version(&self) -> u8 {
        self.buffer.as_ref()[field::CMA_VERSION]
    }

    /// The IP version, high nibble of byte 1 (4 or 6).
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[field::IP_VERSION] >> 4
    }

    /// The reserved low nibble of byte 1.
    pub fn ip_version_reserved(&self) -> u8 {
        self.buffer.as_ref()[field::IP_VERSION] & 0x0f
    }

    /// The active side's port.
    pub fn src_port(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::SRC_PORT];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The 16 bytes of the source address.
    pub fn src_addr_bytes(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        a
    }

    /// The 16 bytes of the destination address.
    pub fn dst_addr_bytes(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        a
    }

    /// The bytes after the header: the user's private data (with the rest of the zero fill).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[CMA_HDR_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmaHeader<T> {
    /// Sets the `cma_version` byte.
    pub fn set_cma_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::CMA_VERSION] = v;
    }

    /// Sets the IP version nibble and clears the reserved low nibble.
    pub fn set_ip_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::IP_VERSION] = v << 4;
    }

    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the 16 bytes of the source address.
    pub fn set_src_addr_bytes(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a);
    }

    /// Sets the 16 bytes of the destination address.
    pub fn set_dst_addr_bytes(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a);
    }

    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[CMA_HDR_LEN..]
    }
}

/// A `cma_hdr` as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// `cma_version`; [`CmaHeaderRepr::parse`] accepts only [`CMA_VERSION`].
    pub cma_version: u8,
    /// IP version, 4 or 6.
    pub ip_version: u8,
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's IP address.
    pub src_addr: IpAddr,
    /// The passive side's IP address (the address the listener is bound to).
    pub dst_addr: IpAddr,
}

impl CmaHeaderRepr {
    /// A version-0 header; the IP version is taken from `src_addr` (4 for IPv4, else 6).
    pub const fn new(src_addr: IpAddr, src_port: u16, dst_addr: IpAddr) -> Self {
        CmaHeaderRepr {
            cma_version: CMA_VERSION,
            ip_version: match src_addr {
                IpAddr::V4(_) => 4,
                IpAddr::V6(_) => 6,
            },
            src_port,
            src_addr,
            dst_addr,
        }
    }

    /// Reads a `cma_hdr`.
    ///
    /// IPv4 addresses are read from the last 4 of their 16 bytes (the 12 pad bytes are
    /// ignored, as Linux does); the reserved low nibble of byte 1 is ignored too. Fails with
    /// [`Error::Truncated`] on a buffer shorter than [`CMA_HDR_LEN`] and with
    /// [`Error::Malformed`] when `cma_version` is not 0 or the IP version is neither 4 nor 6.
    pub fn parse<T: AsRef<[u8]>>(h: &CmaHeader<T>) -> Result<CmaHeaderRepr> {
        h.check_len()?;
        if h.cma_version() != CMA_VERSION {
            return Err(Error::Malformed);
        }
        let ip_version = h.ip_version();
        let addr = |b: [u8; 16]| -> Result<IpAddr> {
            match ip_version {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(b))),
                _ => Err(Error::Malformed),
            }
        };
        Ok(CmaHeaderRepr {
            cma_version: CMA_VERSION,
            ip_version,
            src_port: h.src_port(),
            src_addr: addr(h.src_addr_bytes())?,
            dst_addr: addr(h.dst_addr_bytes())?,
        })
    }

    /// Reads the `cma_hdr` at the start of REQ or SIDR_REQ private data and returns it with
    /// the bytes that follow it. Fails as [`CmaHeaderRepr::parse`].
    pub fn parse_private_data(private_data: &[u8]) -> Result<(CmaHeaderRepr, &[u8])> {
        let repr = Self::parse(&CmaHeader::new_checked(private_data)?)?;
        Ok((repr, private_data.get(CMA_HDR_LEN..).unwrap_or(&[])))
    }

    /// Length of the header: [`CMA_HDR_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CMA_HDR_LEN
    }

    /// Writes the header. Each address is encoded by its own type (IPv4: 12 zero bytes, then
    /// the address; IPv6: the 16 bytes); `ip_version` is written as given (only its low 4
    /// bits), so keep it consistent with the addresses. Panics on a view shorter than
    /// [`CMA_HDR_LEN`]; checked views never are.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut CmaHeader<T>) {
        h.set_cma_version(self.cma_version);
        h.set_ip_version(self.ip_version & 0x0f);
        h.set_src_port(self.src_port);
        h.set_src_addr_bytes(encode_addr(self.src_addr));
        h.set_dst_addr_bytes(encode_addr(self.dst_addr));
    }
}

fn encode_addr(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&v4.octets());
            b
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rxe_two_vm.pcap frame 361, REQ private data, by hand.
    const GOLDEN_V4: [u8; 36] = [
        0x00, 0x40, 0xa8, 0xd7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 3, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 2,
    ];

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1D2F);
        assert_eq!(service_id(PortSpace::Udp, 0x1c06), 0x0111_1c06);
        assert_eq!(service_id(PortSpace::Ib, 0xffff), 0x013F_FFFF);
        assert_eq!(service_id(PortSpace::Ipoib, 1), 0x0002_0001);
        assert_eq!(service_id(PortSpace::Tcp, 0), RDMA_IB_IP_PS_TCP);
        assert_eq!(service_id(PortSpace::Udp, 0), RDMA_IB_IP_PS_UDP);
        assert_eq!(service_id(PortSpace::Ib, 0), RDMA_IB_PS_IB);
        assert_eq!(
            service_id(PortSpace::Tcp, 7471) & RDMA_IB_IP_PS_MASK,
            RDMA_IB_IP_PS_TCP
        );
        assert_eq!(
            service_id(PortSpace::Tcp, 7471) & RDMA_IB_IP_PORT_MASK,
            7471
        );
        // IP CM prefix in the top 40 bits for TCP/UDP/IB.
        for ps in [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib] {
            assert_eq!(service_id(ps, 1234) >> 24, 1);
        }
        for ps in [
            PortSpace::Ipoib,
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
        ] {
            for port in [0u16, 1, 4791, 0xffff] {
                assert_eq!(parse_service_id(service_id(ps, port)), Some((ps, port)));
            }
            assert_eq!(PortSpace::from_u16(ps.to_u16()), Some(ps));
        }
        assert_eq!(parse_service_id(0x0000_0001_0106_1D2F), None);
        assert_eq!(parse_service_id(0x1000_0000_0106_1D2F), None);
        assert_eq!(parse_service_id(0x0107_1D2F), None);
        assert_eq!(parse_service_id(0), None);
        assert_eq!(parse_service_id(u64::MAX), None);
        assert_eq!(PortSpace::from_u16(0x0107), None);
    }

    #[test]
    fn golden_v4() {
        let h = CmaHeader::new_checked(&GOLDEN_V4[..]).unwrap();
        assert_eq!(h.cma_version(), 0);
        assert_eq!(h.ip_version(), 4);
        assert_eq!(h.ip_version_reserved(), 0);
        assert_eq!(h.src_port(), 0xa8d7);
        let r = CmaHeaderRepr::parse(&h).unwrap();
        assert_eq!(
            r,
            CmaHeaderRepr::new(
                IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
                0xa8d7,
                IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2))
            )
        );
        assert_eq!(r.buffer_len(), CMA_HDR_LEN);
        let mut out = [0xffu8; 36];
        r.emit(&mut CmaHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, GOLDEN_V4);
    }

    #[test]
    fn v6_round_trip_and_private_data() {
        let src: Ipv6Addr = "fe80::5054:ff:fe00:3".parse().unwrap();
        let dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let r = CmaHeaderRepr::new(IpAddr::V6(src), 40000, IpAddr::V6(dst));
        assert_eq!(r.ip_version, 6);
        let mut pd = [0u8; 92];
        pd[36..41].copy_from_slice(b"hello");
        let mut h = CmaHeader::new_checked(&mut pd[..]).unwrap();
        r.emit(&mut h);
        assert_eq!(&h.payload_mut()[..5], b"hello");
        assert_eq!(pd[1], 0x60);
        assert_eq!(&pd[4..20], &src.octets());
        let (back, rest) = CmaHeaderRepr::parse_private_data(&pd).unwrap();
        assert_eq!(back, r);
        assert_eq!(rest.len(), MAX_PRIVATE_DATA_REQ);
        assert_eq!(&rest[..5], b"hello");
    }

    #[test]
    fn malformed_and_truncated() {
        for len in 0..CMA_HDR_LEN {
            assert_eq!(
                CmaHeader::new_checked(&GOLDEN_V4[..len]),
                Err(Error::Truncated)
            );
            assert_eq!(
                CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&GOLDEN_V4[..len])),
                Err(Error::Truncated)
            );
            assert_eq!(
                CmaHeaderRepr::parse_private_data(&GOLDEN_V4[..len]),
                Err(Error::Truncated)
            );
        }
        for v in 1..=255u8 {
            let mut b = GOLDEN_V4;
            b[0] = v;
            assert_eq!(
                CmaHeaderRepr::parse(&CmaHeader::new_checked(&b[..]).unwrap()),
                Err(Error::Malformed)
            );
        }
        for nibble in 0..16u8 {
            let mut b = GOLDEN_V4;
            b[1] = nibble << 4 | 0x0f; // reserved low nibble is ignored
            let res = CmaHeaderRepr::parse(&CmaHeader::new_checked(&b[..]).unwrap());
            if nibble == 4 || nibble == 6 {
                assert_eq!(res.unwrap().ip_version, nibble);
            } else {
                assert_eq!(res, Err(Error::Malformed));
            }
        }
        // IPv4 pad bytes are ignored, like Linux does.
        let mut b = GOLDEN_V4;
        b[4] = 0xff;
        let r = CmaHeaderRepr::parse(&CmaHeader::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.src_addr, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)));
    }

    #[test]
    fn constants() {
        assert_eq!(
            MAX_PRIVATE_DATA_REQ,
            crate::cm::REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN
        );
        assert_eq!(
            MAX_PRIVATE_DATA_SIDR_REQ,
            crate::cm::SIDR_REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN
        );
        assert_eq!(MAX_PRIVATE_DATA_REP, crate::cm::REP_PRIVATE_DATA_LEN);
        assert_eq!(MAX_PRIVATE_DATA_REJ, crate::cm::REJ_PRIVATE_DATA_LEN);
        assert_eq!(MAX_PRIVATE_DATA_RTU, crate::cm::RTU_PRIVATE_DATA_LEN);
        assert_eq!(MAX_PRIVATE_DATA_DREQ, crate::cm::DREQ_PRIVATE_DATA_LEN);
        assert_eq!(MAX_PRIVATE_DATA_DREP, crate::cm::DREP_PRIVATE_DATA_LEN);
        assert_eq!(MAX_PRIVATE_DATA_MRA, crate::cm::MRA_PRIVATE_DATA_LEN);
        assert_eq!(
            MAX_PRIVATE_DATA_SIDR_REP,
            crate::cm::SIDR_REP_PRIVATE_DATA_LEN
        );
    }
}
