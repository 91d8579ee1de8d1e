//! Unit tests of the CM messages: field positions, reserved bits, parse/emit round trips.

use super::bits::{get_bits, set_bits};
use super::*;
use crate::{mad, Error};
use std::net::{Ipv4Addr, Ipv6Addr};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The CM data of a REQ as rxe sends it (rxe_two_vm.pcap frame 361), written out by hand:
/// 140 fixed bytes and the rdma_cm header at the start of the private data.
fn req_bytes() -> [u8; CM_DATA_LEN] {
    let mut b = [0u8; CM_DATA_LEN];
    let fixed = hex(
        "56339ffc 00000000 0000000001061c06 505400fffe000003 00000000 00000000
         00002401 00000001 000000a0 72e4d5a7 ffff 37 f0 ffff ffff
         00000000000000000000ffffc6120003 00000000000000000000ffffc6120002
         48e0f000 00 40 00 98",
    );
    b[..fixed.len()].copy_from_slice(&fixed);
    let cma = hex("00 40 a8d7 000000000000000000000000c6120003 000000000000000000000000c6120002");
    b[140..140 + cma.len()].copy_from_slice(&cma);
    b
}

fn mad_of(attr: u16, data: &[u8]) -> [u8; mad::MAD_SIZE] {
    let mut m = [0u8; mad::MAD_SIZE];
    let mut p = mad::Packet::new_unchecked(&mut m[..]);
    mad::Repr::cm(0x2_fc9f_3356, attr).emit(&mut p);
    p.data_mut().copy_from_slice(&data[..CM_DATA_LEN]);
    m
}

#[test]
fn bits_edges() {
    // Every (bit, width) that fits in 8 bytes, at a non-zero byte offset: writing all ones
    // reads back as all ones, leaves every other bit alone, and writing zero clears it.
    for bit in 0..8u32 {
        for width in 1..=(64 - bit) {
            let mut buf = [0u8; 12];
            set_bits(&mut buf, 2, bit, width, u64::MAX);
            let max = if width == 64 {
                u64::MAX
            } else {
                (1u64 << width) - 1
            };
            assert_eq!(
                get_bits(&buf, 2, bit, width),
                max,
                "bit {bit} width {width}"
            );
            let ones: u32 = buf.iter().map(|b| b.count_ones()).sum();
            assert_eq!(ones, width);
            assert_eq!(buf[0] | buf[1] | buf[11], 0);
            let mut full = [0xffu8; 12];
            set_bits(&mut full, 2, bit, width, 0);
            let zeros: u32 = full.iter().map(|b| b.count_zeros()).sum();
            assert_eq!(zeros, width);
            // Values wider than the field are truncated to it.
            let mut buf = [0u8; 12];
            set_bits(&mut buf, 2, bit, width, 0xa5c3_5a3c_a5c3_5a3c);
            assert_eq!(get_bits(&buf, 2, bit, width), 0xa5c3_5a3c_a5c3_5a3c & max);
        }
    }
}

#[test]
fn req_golden() {
    let b = req_bytes();
    let p = ReqPacket::new_checked(&b[..]).unwrap();
    let r = ReqRepr::parse(&p).unwrap();
    assert_eq!(r.local_comm_id, 0x5633_9ffc);
    assert_eq!(r.vendor_id, 0);
    assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fe00_0003);
    assert_eq!(r.local_qpn, 0x24);
    assert_eq!(r.responder_resources, 1);
    assert_eq!(r.initiator_depth, 1);
    assert_eq!(r.remote_cm_response_timeout, 20);
    assert_eq!(r.transport_service_type, TransportServiceType::Rc);
    assert!(!r.end_to_end_flow_control);
    assert_eq!(r.starting_psn, 0x72_e4d5);
    assert_eq!(r.local_cm_response_timeout, 20);
    assert_eq!(r.retry_count, 7);
    assert_eq!(r.partition_key, 0xffff);
    assert_eq!(r.path_mtu, 3);
    assert!(!r.rdc_exists);
    assert_eq!(r.rnr_retry_count, 7);
    assert_eq!(r.max_cm_retries, 15);
    assert!(!r.srq);
    assert_eq!(r.extended_transport_type, 0);
    let pp = r.primary_path;
    assert_eq!((pp.local_lid, pp.remote_lid), (0xffff, 0xffff));
    assert_eq!(pp.local_gid, Ipv4Addr::new(198, 18, 0, 3).to_ipv6_mapped());
    assert_eq!(pp.remote_gid, Ipv4Addr::new(198, 18, 0, 2).to_ipv6_mapped());
    assert_eq!(pp.flow_label, 0x48e0f);
    assert_eq!(pp.packet_rate, 0);
    assert_eq!(pp.traffic_class, 0);
    assert_eq!(pp.hop_limit, 64);
    assert_eq!(pp.sl, 0);
    assert!(!pp.subnet_local);
    assert_eq!(pp.local_ack_timeout, 19);
    assert_eq!(r.alternate_path, ReqPath::ZERO);
    assert!(!r.sap_supported);
    assert_eq!(&r.private_data[..4], &[0x00, 0x40, 0xa8, 0xd7]);
    assert_eq!(p.private_data(), &r.private_data[..]);
    assert_eq!(p.primary_path_bytes().len(), 44);
    assert!(p.alternate_path_bytes().iter().all(|&x| x == 0));
    let mut out = [0xa5u8; CM_DATA_LEN];
    r.emit(&mut ReqPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    assert_eq!(r.buffer_len(), CM_DATA_LEN);
}

#[test]
fn req_every_field_at_max() {
    let path = ReqPath {
        local_lid: 0xffff,
        remote_lid: 0xfffe,
        local_gid: Ipv6Addr::from([0xff; 16]),
        remote_gid: Ipv6Addr::from([0xee; 16]),
        flow_label: 0xf_ffff,
        packet_rate: 0x3f,
        traffic_class: 0xff,
        hop_limit: 0xff,
        sl: 0xf,
        subnet_local: true,
        local_ack_timeout: 0x1f,
    };
    let r = ReqRepr {
        local_comm_id: u32::MAX,
        vendor_id: 0xff_ffff,
        service_id: u64::MAX,
        local_ca_guid: u64::MAX,
        local_qkey: u32::MAX,
        local_qpn: 0xff_ffff,
        responder_resources: 0xff,
        local_eecn: 0xff_ffff,
        initiator_depth: 0xff,
        remote_eecn: 0xff_ffff,
        remote_cm_response_timeout: 0x1f,
        transport_service_type: TransportServiceType::Xrc,
        end_to_end_flow_control: true,
        starting_psn: 0xff_ffff,
        local_cm_response_timeout: 0x1f,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 0xf,
        rdc_exists: true,
        rnr_retry_count: 7,
        max_cm_retries: 0xf,
        srq: true,
        extended_transport_type: 7,
        primary_path: path,
        alternate_path: path,
        sap_supported: true,
        private_data: [0xff; REQ_PRIVATE_DATA_LEN],
    };
    let mut out = [0u8; CM_DATA_LEN];
    r.emit(&mut ReqPacket::new_unchecked(&mut out[..]));
    assert_eq!(
        ReqRepr::parse(&ReqPacket::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
    // Only the reserved bits stay zero: byte 4, bytes 24..28, the 6 bits between flow
    // label and packet rate, the 3 low bits of SL byte and ACK timeout byte (two paths),
    // minus the SAP bit.
    let zero_bits: u32 = out.iter().map(|b| b.count_zeros()).sum();
    let reserved = 8 + 32 + 2 * (6 + 3 + 3) - 1;
    let gid_zero_bits = 2 * (0xeeu8.count_zeros() * 16);
    let remote_lid_zero_bits = 2; // 0xfffe in both paths
    assert_eq!(zero_bits, reserved + gid_zero_bits + remote_lid_zero_bits);
    // Reserved bits set in the input are ignored, and re-emitted as zero.
    let mut dirty = out;
    dirty[4] = 0xff;
    dirty[24..28].fill(0xff);
    dirty[90] |= 0x0f;
    dirty[91] |= 0xc0;
    dirty[94] |= 0x07;
    dirty[95] |= 0x07;
    let r2 = ReqRepr::parse(&ReqPacket::new_checked(&dirty[..]).unwrap()).unwrap();
    assert_eq!(r2, r);
    let mut again = [0u8; CM_DATA_LEN];
    r2.emit(&mut ReqPacket::new_unchecked(&mut again[..]));
    assert_eq!(again, out);
}

#[test]
fn rep_golden() {
    // synthetic_cm_messages.pcap frame 1, by hand.
    let mut b = [0u8; CM_DATA_LEN];
    let fixed =
        hex("cafef00d deadbeef 00000000 00002200 00000000 65432100 01 01 79 e0 0002c9fffe000002");
    b[..fixed.len()].copy_from_slice(&fixed);
    let r = RepRepr::parse(&RepPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.local_comm_id, 0xcafe_f00d);
    assert_eq!(r.remote_comm_id, 0xdead_beef);
    assert_eq!(r.local_qpn, 0x22);
    assert_eq!(r.starting_psn, 0x65_4321);
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!(r.target_ack_delay, 15);
    assert_eq!(r.failover_accepted, 0);
    assert!(r.end_to_end_flow_control);
    assert_eq!(r.rnr_retry_count, 7);
    assert!(!r.srq);
    assert_eq!(r.vendor_id, 0);
    assert_eq!(r.local_ca_guid, 0x0002_c9ff_fe00_0002);
    let mut out = [0u8; CM_DATA_LEN];
    r.emit(&mut RepPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    // The vendor ID is split over three bytes.
    let r = RepRepr {
        vendor_id: 0x12_3456,
        srq: true,
        ..r
    };
    r.emit(&mut RepPacket::new_unchecked(&mut out[..]));
    assert_eq!((out[15], out[19], out[23]), (0x12, 0x34, 0x56));
    assert_eq!(out[27], 0xf0);
    assert_eq!(
        RepRepr::parse(&RepPacket::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
}

#[test]
fn rej_golden() {
    // rxe_cm_req_no_listener.pcap frame 4: the active side's REJ (timeout) by hand.
    let mut b = [0u8; CM_DATA_LEN];
    let fixed = hex("a815e80d 00000000 80 10 0004 505400fffe000002");
    b[..fixed.len()].copy_from_slice(&fixed);
    let r = RejRepr::parse(&RejPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.local_comm_id, 0xa815_e80d);
    assert_eq!(r.remote_comm_id, 0);
    assert_eq!(r.message_rejected, MessageRejected::Other);
    assert_eq!(r.reject_info_length, 8);
    assert_eq!(r.reason, RejectReason::Timeout);
    assert_eq!(r.ari_info(), &hex("505400fffe000002")[..]);
    let mut out = [0u8; CM_DATA_LEN];
    r.emit(&mut RejPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    // Reserved value 3 of "message rejected", and ARI lengths beyond 72, are malformed.
    let mut bad = b;
    bad[8] = 0xc0;
    assert_eq!(
        RejRepr::parse(&RejPacket::new_checked(&bad[..]).unwrap()),
        Err(Error::Malformed)
    );
    for len in 73..=127u8 {
        let mut bad = b;
        bad[9] = len << 1;
        assert_eq!(
            RejRepr::parse(&RejPacket::new_checked(&bad[..]).unwrap()),
            Err(Error::Malformed)
        );
    }
    let mut ok = b;
    ok[9] = 72 << 1 | 1; // the low reserved bit is ignored
    assert_eq!(
        RejRepr::parse(&RejPacket::new_checked(&ok[..]).unwrap())
            .unwrap()
            .reject_info_length,
        72
    );
}

#[test]
fn mra_golden() {
    let mut b = [0u8; CM_DATA_LEN];
    b[..10].copy_from_slice(&hex("cafef00d deadbeef 00 c0"));
    let r = MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.message_mraed, MessageMraed::Req);
    assert_eq!(r.service_timeout, 24);
    let mut out = [0u8; CM_DATA_LEN];
    r.emit(&mut MraPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    for (v, m) in [(0x40, MessageMraed::Rep), (0x80, MessageMraed::Lap)] {
        b[8] = v | 0x3f; // reserved bits ignored
        assert_eq!(
            MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap())
                .unwrap()
                .message_mraed,
            m
        );
    }
    b[8] = 0xc0;
    assert_eq!(
        MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap()),
        Err(Error::Malformed)
    );
}

#[test]
fn rtu_dreq_drep_golden() {
    let mut b = [0u8; CM_DATA_LEN];
    b[..12].copy_from_slice(&hex("deadbeef cafef00d 00002200"));
    b[231] = 0x5a;
    let d = DreqRepr::parse(&DreqPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id, d.remote_qpn_eecn),
        (0xdead_beef, 0xcafe_f00d, 0x22)
    );
    assert_eq!(d.private_data[219], 0x5a);
    let mut out = [0u8; CM_DATA_LEN];
    d.emit(&mut DreqPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    let mut b2 = b;
    b2[8..12].fill(0);
    let r = RtuRepr::parse(&RtuPacket::new_checked(&b2[..]).unwrap()).unwrap();
    assert_eq!(r.private_data[223], 0x5a);
    r.emit(&mut RtuPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b2);
    let r = DrepRepr::parse(&DrepPacket::new_checked(&b2[..]).unwrap()).unwrap();
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (0xdead_beef, 0xcafe_f00d)
    );
    r.emit(&mut DrepPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b2);
}

#[test]
fn sidr_golden() {
    // rxe_two_vm.pcap frames 531 and 532, by hand.
    let mut b = [0u8; CM_DATA_LEN];
    let fixed = hex("54339ffc ffff 0000 0000000001111c06 00 40 e3ed");
    b[..fixed.len()].copy_from_slice(&fixed);
    let r = SidrReqRepr::parse(&SidrReqPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.request_id, 0x5433_9ffc);
    assert_eq!(r.partition_key, 0xffff);
    assert_eq!(r.service_id, 0x0111_1c06);
    assert_eq!(&r.private_data[..4], &[0, 0x40, 0xe3, 0xed]);
    let mut out = [0u8; CM_DATA_LEN];
    r.emit(&mut SidrReqPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);

    let mut b = [0u8; CM_DATA_LEN];
    let fixed = hex("54339ffc 00 00 0000 00002600 0000000001111c06 01234567");
    b[..fixed.len()].copy_from_slice(&fixed);
    let r = SidrRepRepr::parse(&SidrRepPacket::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.status, SidrStatus::Success);
    assert_eq!(r.qpn, 0x26);
    assert_eq!(r.service_id, 0x0111_1c06);
    assert_eq!(r.qkey, 0x0123_4567);
    assert_eq!(r.vendor_id, 0);
    r.emit(&mut SidrRepPacket::new_unchecked(&mut out[..]));
    assert_eq!(out, b);
    let r = SidrRepRepr {
        vendor_id: 0xab_cdef,
        status: SidrStatus::Unknown(0x99),
        ..r
    };
    r.emit(&mut SidrRepPacket::new_unchecked(&mut out[..]));
    assert_eq!((out[6], out[7], out[11], out[4]), (0xab, 0xcd, 0xef, 0x99));
    assert_eq!(
        SidrRepRepr::parse(&SidrRepPacket::new_checked(&out[..]).unwrap()),
        Ok(r)
    );
    for len in 73..=255u8 {
        let mut bad = b;
        bad[5] = len;
        assert_eq!(
            SidrRepRepr::parse(&SidrRepPacket::new_checked(&bad[..]).unwrap()),
            Err(Error::Malformed)
        );
    }
}

#[test]
fn message_dispatch_and_mad_checks() {
    let req = req_bytes();
    let m = mad_of(mad::ATTR_CM_REQ, &req);
    let msg = Message::parse(&mad::Packet::new_checked(&m[..]).unwrap()).unwrap();
    assert_eq!(msg.attribute_id(), mad::ATTR_CM_REQ);
    assert_eq!(msg.name(), "REQ");
    assert_eq!(msg.buffer_len(), CM_DATA_LEN);
    let mut out = [0u8; mad::MAD_SIZE];
    msg.emit_mad(0x2_fc9f_3356, &mut out).unwrap();
    assert_eq!(out, m);
    assert_eq!(msg.emit_mad(0, &mut [0u8; 255]), Err(Error::Truncated));
    assert_eq!(msg.emit(&mut [0u8; 231]), Err(Error::Truncated));

    let cases: [(usize, u8); 5] = [
        (0, 2),               // base version
        (0, 0x80),            // OPA base version
        (1, 0x04),            // management class (PerfMgt)
        (2, 1),               // class version
        (3, mad::METHOD_GET), // method
    ];
    for (at, v) in cases {
        let mut bad = m;
        bad[at] = v;
        assert_eq!(
            Message::parse(&mad::Packet::new_checked(&bad[..]).unwrap()),
            Err(Error::Unsupported),
            "byte {at} = {v:#x}"
        );
    }
    for attr in [
        0u16,
        mad::ATTR_CLASS_PORT_INFO,
        0x000f,
        mad::ATTR_CM_LAP,
        mad::ATTR_CM_APR,
        0xffff,
    ] {
        let bad = mad_of(attr, &req);
        assert_eq!(
            Message::parse(&mad::Packet::new_checked(&bad[..]).unwrap()),
            Err(Error::Unsupported)
        );
    }
    // Every message type dispatches, and the attribute ID round-trips.
    for attr in mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP {
        let mm = mad_of(attr, &[0u8; CM_DATA_LEN]);
        let msg = Message::parse(&mad::Packet::new_checked(&mm[..]).unwrap()).unwrap();
        assert_eq!(msg.attribute_id(), attr);
        let mut out = [0xffu8; mad::MAD_SIZE];
        msg.emit_mad(0x2_fc9f_3356, &mut out).unwrap();
        assert_eq!(out, mm);
    }
}

#[test]
fn truncated_everywhere() {
    let data = [0u8; CM_DATA_LEN];
    for len in 0..CM_DATA_LEN {
        let d = &data[..len];
        assert_eq!(ReqPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(MraPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(RejPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(RepPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(RtuPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(DreqPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(DrepPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(SidrReqPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(SidrRepPacket::new_checked(d), Err(Error::Truncated));
        assert_eq!(
            ReqRepr::parse(&ReqPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            MraRepr::parse(&MraPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            RejRepr::parse(&RejPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            RepRepr::parse(&RepPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            RtuRepr::parse(&RtuPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            DreqRepr::parse(&DreqPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            DrepRepr::parse(&DrepPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            SidrReqRepr::parse(&SidrReqPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        assert_eq!(
            SidrRepRepr::parse(&SidrRepPacket::new_unchecked(d)),
            Err(Error::Truncated)
        );
        for attr in mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP {
            assert_eq!(Message::parse_data(attr, d), Err(Error::Truncated));
        }
    }
    let m = mad_of(mad::ATTR_CM_RTU, &data);
    for len in 0..mad::MAD_SIZE {
        assert_eq!(
            Message::parse(&mad::Packet::new_unchecked(&m[..len])),
            Err(Error::Truncated)
        );
    }
}

#[test]
fn enums_round_trip() {
    for v in 0..=u16::MAX {
        let r = RejectReason::from_u16(v);
        assert_eq!(r.to_u16(), v);
        let named = !matches!(r, RejectReason::Unknown(_));
        assert_eq!(named, (1..=33).contains(&v) || v == 35, "{v}");
    }
    assert_eq!(RejectReason::from_u16(8), RejectReason::InvalidServiceId);
    assert_eq!(RejectReason::from_u16(28), RejectReason::ConsumerDefined);
    for v in 0..=u8::MAX {
        let s = SidrStatus::from_u8(v);
        assert_eq!(s.to_u8(), v);
        assert_eq!(matches!(s, SidrStatus::Unknown(_)), v > 5);
    }
    for v in 0..4u8 {
        assert_eq!(TransportServiceType::from_bits(v).bits(), v);
    }
    for v in 0..3u8 {
        assert_eq!(MessageRejected::from_bits(v).unwrap().bits(), v);
        assert_eq!(MessageMraed::from_bits(v).unwrap().bits(), v);
    }
    assert_eq!(MessageRejected::from_bits(3), Err(Error::Malformed));
    assert_eq!(MessageMraed::from_bits(3), Err(Error::Malformed));
}

#[test]
fn padding() {
    let p: [u8; 4] = pad_private_data(&[1, 2]).unwrap();
    assert_eq!(p, [1, 2, 0, 0]);
    assert_eq!(pad_private_data::<4>(&[0; 5]), Err(Error::Malformed));
    assert_eq!(pad_private_data::<4>(&[9; 4]), Ok([9; 4]));
}

#[test]
fn view_setters() {
    let mut b = [0u8; CM_DATA_LEN + 4];
    let mut p = ReqPacket::new_checked(&mut b[..]).unwrap();
    p.set_primary_flow_label(0xabcde);
    p.set_primary_packet_rate(0x3f);
    p.set_sap_supported(true);
    p.set_alternate_local_ack_timeout(0x1f);
    p.private_data_mut()[0] = 1;
    assert_eq!(p.primary_flow_label(), 0xabcde);
    assert_eq!(p.primary_packet_rate(), 0x3f);
    assert!(p.sap_supported());
    assert_eq!(p.alternate_local_ack_timeout(), 0x1f);
    assert_eq!(p.private_data().len(), REQ_PRIVATE_DATA_LEN);
    let b = p.into_inner();
    assert_eq!(&b[88..92], &[0xab, 0xcd, 0xe0, 0x3f]);
    assert_eq!(b[139], 0xfc);
    assert_eq!(b[140], 1);
    assert_eq!(b[CM_DATA_LEN], 0, "bytes past the CM data are untouched");
}
