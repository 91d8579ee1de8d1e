//! Property tests of the MAD, CM and rdma_cm layers: no input makes a parser panic, and every
//! representation survives emit → parse unchanged.

use proptest::prelude::*;
use softrdma_wire::cm::*;
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
use softrdma_wire::mad;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Draws field values from a buffer of random bytes.
struct Draw<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Draw<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes[self.at % self.bytes.len()];
        self.at += 1;
        b
    }
    fn bits(&mut self, width: u32) -> u64 {
        let mut v = 0u64;
        for _ in 0..8 {
            v = v << 8 | u64::from(self.byte());
        }
        if width == 64 {
            v
        } else {
            v & ((1 << width) - 1)
        }
    }
    fn u8(&mut self, width: u32) -> u8 {
        self.bits(width) as u8
    }
    fn u16(&mut self) -> u16 {
        self.bits(16) as u16
    }
    fn u32(&mut self, width: u32) -> u32 {
        self.bits(width) as u32
    }
    fn u64(&mut self) -> u64 {
        self.bits(64)
    }
    fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    fn gid(&mut self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        for b in &mut a {
            *b = self.byte();
        }
        Ipv6Addr::from(a)
    }
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        for b in &mut a {
            *b = self.byte();
        }
        a
    }
}

fn path(d: &mut Draw) -> ReqPath {
    ReqPath {
        local_lid: d.u16(),
        remote_lid: d.u16(),
        local_gid: d.gid(),
        remote_gid: d.gid(),
        flow_label: d.u32(20),
        packet_rate: d.u8(6),
        traffic_class: d.u8(8),
        hop_limit: d.u8(8),
        sl: d.u8(4),
        subnet_local: d.flag(),
        local_ack_timeout: d.u8(5),
    }
}

/// An arbitrary message of the kind `kind % 9`, every field drawn within its wire width.
fn message(kind: u8, d: &mut Draw) -> Message {
    match kind % 9 {
        0 => Message::Req(ReqRepr {
            local_comm_id: d.u32(32),
            vendor_id: d.u32(24),
            service_id: d.u64(),
            local_ca_guid: d.u64(),
            local_qkey: d.u32(32),
            local_qpn: d.u32(24),
            responder_resources: d.u8(8),
            local_eecn: d.u32(24),
            initiator_depth: d.u8(8),
            remote_eecn: d.u32(24),
            remote_cm_response_timeout: d.u8(5),
            transport_service_type: TransportServiceType::from_bits(d.u8(2)),
            end_to_end_flow_control: d.flag(),
            starting_psn: d.u32(24),
            local_cm_response_timeout: d.u8(5),
            retry_count: d.u8(3),
            partition_key: d.u16(),
            path_mtu: d.u8(4),
            rdc_exists: d.flag(),
            rnr_retry_count: d.u8(3),
            max_cm_retries: d.u8(4),
            srq: d.flag(),
            extended_transport_type: d.u8(3),
            primary_path: path(d),
            alternate_path: path(d),
            sap_supported: d.flag(),
            private_data: d.array(),
        }),
        1 => Message::Mra(MraRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            message_mraed: MessageMraed::from_bits(d.byte() % 3).unwrap(),
            service_timeout: d.u8(5),
            private_data: d.array(),
        }),
        2 => Message::Rej(RejRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            message_rejected: MessageRejected::from_bits(d.byte() % 3).unwrap(),
            reject_info_length: d.byte() % (REJ_ARI_LEN as u8 + 1),
            reason: RejectReason::from_u16(d.u16()),
            ari: d.array(),
            private_data: d.array(),
        }),
        3 => Message::Rep(RepRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            local_qkey: d.u32(32),
            local_qpn: d.u32(24),
            local_eecn: d.u32(24),
            starting_psn: d.u32(24),
            vendor_id: d.u32(24),
            responder_resources: d.u8(8),
            initiator_depth: d.u8(8),
            target_ack_delay: d.u8(5),
            failover_accepted: d.u8(2),
            end_to_end_flow_control: d.flag(),
            rnr_retry_count: d.u8(3),
            srq: d.flag(),
            local_ca_guid: d.u64(),
            private_data: d.array(),
        }),
        4 => Message::Rtu(RtuRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            private_data: d.array(),
        }),
        5 => Message::Dreq(DreqRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            remote_qpn_eecn: d.u32(24),
            private_data: d.array(),
        }),
        6 => Message::Drep(DrepRepr {
            local_comm_id: d.u32(32),
            remote_comm_id: d.u32(32),
            private_data: d.array(),
        }),
        7 => Message::SidrReq(SidrReqRepr {
            request_id: d.u32(32),
            partition_key: d.u16(),
            service_id: d.u64(),
            private_data: d.array(),
        }),
        _ => Message::SidrRep(SidrRepRepr {
            request_id: d.u32(32),
            status: SidrStatus::from_u8(d.byte()),
            additional_info_length: d.byte() % (SIDR_REP_ADDITIONAL_INFO_LEN as u8 + 1),
            vendor_id: d.u32(24),
            qpn: d.u32(24),
            service_id: d.u64(),
            qkey: d.u32(32),
            additional_info: d.array(),
            private_data: d.array(),
        }),
    }
}

fn ip(v6: bool, bytes: [u8; 16]) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300),
                                   attr in any::<u16>()) {
        let pkt = mad::Packet::new_unchecked(&bytes[..]);
        let _ = mad::Repr::parse(&pkt);
        let _ = Message::parse(&pkt);
        let _ = Message::parse_data(attr, &bytes);
        for a in mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP {
            let _ = Message::parse_data(a, &bytes);
        }
        let _ = ReqRepr::parse(&ReqPacket::new_unchecked(&bytes[..]));
        let _ = MraRepr::parse(&MraPacket::new_unchecked(&bytes[..]));
        let _ = RejRepr::parse(&RejPacket::new_unchecked(&bytes[..]));
        let _ = RepRepr::parse(&RepPacket::new_unchecked(&bytes[..]));
        let _ = RtuRepr::parse(&RtuPacket::new_unchecked(&bytes[..]));
        let _ = DreqRepr::parse(&DreqPacket::new_unchecked(&bytes[..]));
        let _ = DrepRepr::parse(&DrepPacket::new_unchecked(&bytes[..]));
        let _ = SidrReqRepr::parse(&SidrReqPacket::new_unchecked(&bytes[..]));
        let _ = SidrRepRepr::parse(&SidrRepPacket::new_unchecked(&bytes[..]));
        let _ = CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bytes[..]));
        let _ = CmaHeaderRepr::parse_private_data(&bytes);
        if bytes.len() >= 8 {
            let sid = u64::from_be_bytes(bytes[..8].try_into().unwrap());
            if let Some((ps, port)) = cma::parse_service_id(sid) {
                prop_assert_eq!(cma::service_id(ps, port), sid);
            }
        }
    }

    /// A MAD with a valid CM header and arbitrary data: parsing never panics; when it succeeds,
    /// emitting gives back the input except for reserved bits, and parsing that is a fixpoint.
    #[test]
    fn arbitrary_cm_mads(data in prop::collection::vec(any::<u8>(), mad::MAD_DATA_LEN),
                         attr in 0x10u16..=0x18, tid in any::<u64>()) {
        let mut buf = [0u8; mad::MAD_SIZE];
        let mut p = mad::Packet::new_unchecked(&mut buf[..]);
        mad::Repr::cm(tid, attr).emit(&mut p);
        p.data_mut().copy_from_slice(&data);
        let pkt = mad::Packet::new_checked(&buf[..]).unwrap();
        if let Ok(msg) = Message::parse(&pkt) {
            prop_assert_eq!(msg.attribute_id(), attr);
            let mut out = [0u8; mad::MAD_SIZE];
            msg.emit_mad(tid, &mut out).unwrap();
            prop_assert_eq!(&out[..mad::MAD_HEADER_LEN], &buf[..mad::MAD_HEADER_LEN]);
            // Emitted bits are a subset of the input bits (only reserved ones are cleared).
            for (o, i) in out.iter().zip(buf.iter()) {
                prop_assert_eq!(o & !i, 0);
            }
            let again = Message::parse(&mad::Packet::new_checked(&out[..]).unwrap()).unwrap();
            prop_assert_eq!(again, msg);
        }
    }

    #[test]
    fn messages_round_trip(kind in any::<u8>(),
                           entropy in prop::collection::vec(any::<u8>(), 64..600),
                           garbage in any::<u8>(), tid in any::<u64>()) {
        let mut d = Draw { bytes: &entropy, at: 0 };
        let msg = message(kind, &mut d);
        // Into CM data pre-filled with garbage: emit must overwrite every byte.
        let mut data = [garbage; CM_DATA_LEN];
        msg.emit(&mut data).unwrap();
        prop_assert_eq!(Message::parse_data(msg.attribute_id(), &data), Ok(msg));
        // As a whole MAD.
        let mut buf = [garbage; mad::MAD_SIZE];
        msg.emit_mad(tid, &mut buf).unwrap();
        let pkt = mad::Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(pkt.transaction_id(), tid);
        prop_assert_eq!(pkt.attribute_id(), msg.attribute_id());
        prop_assert_eq!(Message::parse(&pkt), Ok(msg));
    }

    #[test]
    fn mad_header_round_trip(mgmt_class in any::<u8>(), class_version in any::<u8>(),
                             method in any::<u8>(), status in any::<u16>(),
                             class_specific in any::<u16>(), transaction_id in any::<u64>(),
                             attribute_id in any::<u16>(), attribute_modifier in any::<u32>(),
                             garbage in any::<u8>()) {
        let repr = mad::Repr {
            mgmt_class, class_version, method, status, class_specific, transaction_id,
            attribute_id, attribute_modifier,
        };
        let mut buf = [garbage; mad::MAD_SIZE];
        repr.emit(&mut mad::Packet::new_checked(&mut buf[..]).unwrap());
        let pkt = mad::Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(pkt.reserved(), 0);
        prop_assert_eq!(pkt.base_version(), mad::BASE_VERSION);
        prop_assert_eq!(mad::Repr::parse(&pkt), Ok(repr));
    }

    #[test]
    fn cma_header_round_trip(v6 in any::<bool>(), src in any::<[u8; 16]>(),
                             dst in any::<[u8; 16]>(), port in any::<u16>(),
                             garbage in any::<u8>()) {
        let repr = CmaHeaderRepr::new(ip(v6, src), port, ip(v6, dst));
        let mut buf = [garbage; cma::CMA_HDR_LEN];
        repr.emit(&mut CmaHeader::new_checked(&mut buf[..]).unwrap());
        prop_assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&buf[..]).unwrap()), Ok(repr));
        if !v6 {
            prop_assert!(buf[4..16].iter().all(|&b| b == 0));
            prop_assert!(buf[20..32].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn service_id_round_trip(ps in 0usize..4, port in any::<u16>()) {
        let ps = [PortSpace::Ipoib, PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib][ps];
        let sid = cma::service_id(ps, port);
        prop_assert_eq!(cma::parse_service_id(sid), Some((ps, port)));
    }
}
