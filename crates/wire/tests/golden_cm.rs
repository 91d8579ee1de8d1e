//! Every CM MAD in the golden captures: it parses, it is the message tshark names, it re-emits
//! byte for byte, and its fields equal the values tshark 4.0 decodes for that frame (written
//! out literally below, keyed by file and frame number).
//!
//! Two deliberate departures from tshark's text, both checked against the raw bytes instead:
//! - tshark 4.0 does not decode MRA, SIDR_REQ and SIDR_REP ("Dissector Not Implemented"); their
//!   expected values come from the IBTA byte offsets and the hex dump (see `raw` below).
//! - tshark 4.0 misdecodes the REQ's *primary flow label* and *packet rate*: it shows the top
//!   12 bits of the first two bytes at offset 88 as the flow label and the low 6 bits of byte
//!   88 as the rate (e.g. frame 361: bytes `48 e0 f0 00` shown as flow label 0x0048e, rate 8).
//!   IBTA places a 20-bit flow label at 88 bit 0 and the rate at 91 bits 2..7, so the true
//!   values are 0x48e0f and 0; the raw bytes are asserted too.
//!
//! The MADs are sliced out of the frames by hand (Ethernet, IPv4 by IHL or IPv6, UDP, BTH with
//! destination QP 1, DETH, 256-byte MAD, ICRC), independently of the crate's IP/BTH modules.

use softrdma_wire::cm::{
    Message, MessageMraed, MessageRejected, RejectReason, SidrStatus, TransportServiceType,
};
use softrdma_wire::cma::{self, CmaHeaderRepr, PortSpace};
use softrdma_wire::mad;
use softrdma_wire::pcap::PcapReader;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

const RXE: &str = "rxe_two_vm.pcap";
const NOLISTEN: &str = "rxe_cm_req_no_listener.pcap";
const SYNTH: &str = "synthetic_cm_messages.pcap";
const MIXED: &str = "synthetic_mixed_one_bad_icrc.pcap";

fn golden_dir() -> PathBuf {
    let dir = match std::env::var_os("SOFTRDMA_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    if !dir.join(RXE).is_file() {
        panic!(
            "golden captures not found in {} (expected {RXE} there); set SOFTRDMA_GOLDEN_DIR \
             to the directory holding the golden pcaps",
            dir.display()
        );
    }
    dir
}

/// The 256-byte MAD of a RoCEv2 UD SEND-only packet to QP1, or `None` for any other frame.
fn cm_mad(frame: &[u8]) -> Option<&[u8]> {
    let mut at = 12;
    let mut ethertype = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
    at += 2;
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = u16::from_be_bytes([*frame.get(at + 2)?, *frame.get(at + 3)?]);
        at += 4;
    }
    let (proto, l4) = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame.get(at)? & 0x0f) * 4;
            (*frame.get(at + 9)?, at + ihl)
        }
        0x86dd => (*frame.get(at + 6)?, at + 40),
        _ => return None,
    };
    if proto != 17 {
        return None;
    }
    let udp = frame.get(l4..l4 + 8)?;
    if u16::from_be_bytes([udp[2], udp[3]]) != softrdma_wire::ROCE_V2_UDP_PORT {
        return None;
    }
    let bth = frame.get(l4 + 8..l4 + 20)?;
    let dest_qp = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
    if bth[0] != 0x64 || dest_qp != mad::GSI_QPN {
        return None;
    }
    let deth = frame.get(l4 + 20..l4 + 28)?;
    assert_eq!(
        u32::from_be_bytes([deth[0], deth[1], deth[2], deth[3]]),
        mad::GSI_QKEY
    );
    assert_eq!(u32::from_be_bytes([0, deth[5], deth[6], deth[7]]), 1);
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    assert_eq!(
        udp_len,
        8 + 12 + 8 + mad::MAD_SIZE + 4,
        "UDP length of a MAD"
    );
    frame.get(l4 + 28..l4 + 28 + mad::MAD_SIZE)
}

/// Expected rdma_cm header inside REQ / SIDR_REQ private data.
struct Cma {
    ip_version: u8,
    src_port: u16,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    /// Start of the user's private data after the header (the rest must be zero).
    user: &'static [u8],
}

struct Req {
    local_comm_id: u32,
    service_id: u64,
    ca_guid: u64,
    qkey: u32,
    qpn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    remote_cm_timeout: u8,
    transport: TransportServiceType,
    e2e: bool,
    starting_psn: u32,
    local_cm_timeout: u8,
    retry_count: u8,
    pkey: u16,
    mtu: u8,
    rnr_retry: u8,
    max_cm_retries: u8,
    srq: bool,
    local_lid: u16,
    remote_lid: u16,
    local_gid: Ipv4Addr,
    remote_gid: Ipv4Addr,
    flow_label: u32,
    packet_rate: u8,
    traffic_class: u8,
    hop_limit: u8,
    sl: u8,
    subnet_local: bool,
    local_ack_timeout: u8,
    cma: Cma,
}

struct Rep {
    local_comm_id: u32,
    remote_comm_id: u32,
    qkey: u32,
    qpn: u32,
    starting_psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    target_ack_delay: u8,
    failover: u8,
    e2e: bool,
    rnr_retry: u8,
    srq: bool,
    ca_guid: u64,
}

enum Exp {
    Req(Req),
    Rep(Rep),
    Rtu(u32, u32),
    /// local, remote, remote QPN
    Dreq(u32, u32, u32),
    Drep(u32, u32),
    Rej {
        local: u32,
        remote: u32,
        rejected: MessageRejected,
        info_len: u8,
        reason: RejectReason,
        ari: &'static [u8],
    },
    Mra {
        local: u32,
        remote: u32,
        mraed: MessageMraed,
        service_timeout: u8,
    },
    SidrReq {
        request_id: u32,
        pkey: u16,
        service_id: u64,
        cma: Cma,
    },
    SidrRep {
        request_id: u32,
        status: SidrStatus,
        qpn: u32,
        service_id: u64,
        qkey: u32,
    },
}

struct Entry {
    file: &'static str,
    frame: usize,
    tid: u64,
    exp: Exp,
    /// (offset in the CM data, hex bytes) checked against the raw MAD.
    raw: &'static [(usize, &'static str)],
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

#[allow(clippy::too_many_lines)]
fn table() -> Vec<Entry> {
    let h198 = |d| v4(198, 18, 0, d);
    let e = |file, frame, tid, exp| Entry {
        file,
        frame,
        tid,
        exp,
        raw: &[],
    };
    vec![
        // ---------------- rxe_two_vm.pcap ----------------
        Entry {
            raw: &[(88, "48e0f000"), (140, "0040a8d7")],
            ..e(
                RXE,
                361,
                0x0000_0002_fc9f_3356,
                Exp::Req(Req {
                    local_comm_id: 0x5633_9ffc,
                    service_id: 0x0000_0000_0106_1c06,
                    ca_guid: 0x5054_00ff_fe00_0003,
                    qkey: 0,
                    qpn: 0x24,
                    responder_resources: 1,
                    initiator_depth: 1,
                    remote_cm_timeout: 0x14,
                    transport: TransportServiceType::Rc,
                    e2e: false,
                    starting_psn: 0x72_e4d5,
                    local_cm_timeout: 0x14,
                    retry_count: 7,
                    pkey: 0xffff,
                    mtu: 3,
                    rnr_retry: 7,
                    max_cm_retries: 15,
                    srq: false,
                    local_lid: 65535,
                    remote_lid: 65535,
                    local_gid: h198(3),
                    remote_gid: h198(2),
                    flow_label: 0x48e0f,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 0x40,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0x13,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0xa8d7,
                        src: h198(3),
                        dst: h198(2),
                        user: &[],
                    },
                }),
            )
        },
        e(
            RXE,
            362,
            0x0000_0002_fc9f_3356,
            Exp::Rep(Rep {
                local_comm_id: 0x209e_7d45,
                remote_comm_id: 0x5633_9ffc,
                qkey: 0,
                qpn: 0x24,
                starting_psn: 0x7e_2e65,
                responder_resources: 1,
                initiator_depth: 1,
                target_ack_delay: 0x0f,
                failover: 0,
                e2e: false,
                rnr_retry: 7,
                srq: false,
                ca_guid: 0x5054_00ff_fe00_0002,
            }),
        ),
        e(
            RXE,
            363,
            0x0000_0002_fc9f_3356,
            Exp::Rtu(0x5633_9ffc, 0x209e_7d45),
        ),
        e(
            RXE,
            484,
            0x0000_0002_fc9f_3356,
            Exp::Dreq(0x5633_9ffc, 0x209e_7d45, 0x24),
        ),
        e(
            RXE,
            485,
            0x0000_0002_fc9f_3356,
            Exp::Drep(0x209e_7d45, 0x5633_9ffc),
        ),
        Entry {
            raw: &[(88, "37360000"), (140, "00409faf")],
            ..e(
                RXE,
                486,
                0x0000_0002_fc9f_3357,
                Exp::Req(Req {
                    local_comm_id: 0x5733_9ffc,
                    service_id: 0x0000_0000_0106_1d2f,
                    ca_guid: 0x5054_00ff_fe00_0003,
                    qkey: 0,
                    qpn: 0x25,
                    responder_resources: 1,
                    initiator_depth: 1,
                    remote_cm_timeout: 0x14,
                    transport: TransportServiceType::Rc,
                    e2e: false,
                    starting_psn: 0x89_1295,
                    local_cm_timeout: 0x14,
                    retry_count: 5,
                    pkey: 0xffff,
                    mtu: 3,
                    rnr_retry: 0,
                    max_cm_retries: 15,
                    srq: false,
                    local_lid: 65535,
                    remote_lid: 65535,
                    local_gid: h198(3),
                    remote_gid: h198(2),
                    flow_label: 0x37360,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 0x40,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0x13,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0x9faf,
                        src: h198(3),
                        dst: h198(2),
                        user: &[],
                    },
                }),
            )
        },
        e(
            RXE,
            487,
            0x0000_0002_fc9f_3357,
            Exp::Rep(Rep {
                local_comm_id: 0x229e_7d45,
                remote_comm_id: 0x5733_9ffc,
                qkey: 0,
                qpn: 0x25,
                starting_psn: 0xce_5595,
                responder_resources: 1,
                initiator_depth: 1,
                target_ack_delay: 0x0f,
                failover: 0,
                e2e: false,
                rnr_retry: 7,
                srq: false,
                ca_guid: 0x5054_00ff_fe00_0002,
            }),
        ),
        e(
            RXE,
            488,
            0x0000_0002_fc9f_3357,
            Exp::Rtu(0x5733_9ffc, 0x229e_7d45),
        ),
        e(
            RXE,
            529,
            0x0000_0002_457d_9e22,
            Exp::Dreq(0x229e_7d45, 0x5733_9ffc, 0x25),
        ),
        e(
            RXE,
            530,
            0x0000_0002_457d_9e22,
            Exp::Drep(0x5733_9ffc, 0x229e_7d45),
        ),
        Entry {
            // Byte offsets of IBTA table "SIDR_REQ": request ID, P_Key, reserved, service ID,
            // private data (cma_hdr).
            raw: &[
                (0, "54339ffc"),
                (4, "ffff"),
                (6, "0000"),
                (8, "0000000001111c06"),
                (16, "0040e3ed000000000000000000000000c6120003"),
                (36, "000000000000000000000000c6120002"),
            ],
            ..e(
                RXE,
                531,
                0x0000_0002_fc9f_3354,
                Exp::SidrReq {
                    request_id: 0x5433_9ffc,
                    pkey: 0xffff,
                    service_id: 0x0000_0000_0111_1c06,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0xe3ed,
                        src: h198(3),
                        dst: h198(2),
                        user: &[],
                    },
                },
            )
        },
        Entry {
            // IBTA "SIDR_REP": request ID, status, add. info length, vendor ID high, QPN,
            // vendor ID low, service ID, Q_Key.
            raw: &[
                (0, "54339ffc"),
                (4, "00"),
                (5, "00"),
                (6, "0000"),
                (8, "000026"),
                (11, "00"),
                (12, "0000000001111c06"),
                (20, "01234567"),
            ],
            ..e(
                RXE,
                532,
                0x0000_0002_fc9f_3354,
                Exp::SidrRep {
                    request_id: 0x5433_9ffc,
                    status: SidrStatus::Success,
                    qpn: 0x26,
                    service_id: 0x0000_0000_0111_1c06,
                    qkey: cma::RDMA_UDP_QKEY,
                },
            )
        },
        Entry {
            raw: &[(88, "1211d000"), (140, "00408b1f")],
            ..e(
                RXE,
                2753,
                0x0000_0002_fc9f_3355,
                Exp::Req(Req {
                    local_comm_id: 0x5533_9ffc,
                    service_id: 0x0000_0000_0106_485c,
                    ca_guid: 0x5054_00ff_fe00_0003,
                    qkey: 0,
                    qpn: 0x2b,
                    responder_resources: 0,
                    initiator_depth: 0,
                    remote_cm_timeout: 0x14,
                    transport: TransportServiceType::Rc,
                    e2e: false,
                    starting_psn: 0x7c_5415,
                    local_cm_timeout: 0x14,
                    retry_count: 7,
                    pkey: 0xffff,
                    mtu: 3,
                    rnr_retry: 7,
                    max_cm_retries: 15,
                    srq: false,
                    local_lid: 65535,
                    remote_lid: 65535,
                    local_gid: h198(3),
                    remote_gid: h198(2),
                    flow_label: 0x1211d,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 0x40,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0x13,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0x8b1f,
                        src: h198(3),
                        dst: h198(2),
                        user: &[],
                    },
                }),
            )
        },
        e(
            RXE,
            2754,
            0x0000_0002_fc9f_3355,
            Exp::Rep(Rep {
                local_comm_id: 0x269e_7d45,
                remote_comm_id: 0x5533_9ffc,
                qkey: 0,
                qpn: 0x2b,
                starting_psn: 0x1e_bad1,
                responder_resources: 0,
                initiator_depth: 0,
                target_ack_delay: 0x0f,
                failover: 0,
                e2e: false,
                rnr_retry: 7,
                srq: false,
                ca_guid: 0x5054_00ff_fe00_0002,
            }),
        ),
        e(
            RXE,
            2755,
            0x0000_0002_fc9f_3355,
            Exp::Rtu(0x5533_9ffc, 0x269e_7d45),
        ),
        Entry {
            raw: &[(88, "69ac6000"), (140, "0040b856")],
            ..e(
                RXE,
                2776,
                0x0000_0002_fc9f_3352,
                Exp::Req(Req {
                    local_comm_id: 0x5233_9ffc,
                    service_id: 0x0000_0000_0106_485c,
                    ca_guid: 0x5054_00ff_fe00_0003,
                    qkey: 0,
                    qpn: 0x2c,
                    responder_resources: 0,
                    initiator_depth: 0,
                    remote_cm_timeout: 0x14,
                    transport: TransportServiceType::Rc,
                    e2e: false,
                    starting_psn: 0x66_537a,
                    local_cm_timeout: 0x14,
                    retry_count: 7,
                    pkey: 0xffff,
                    mtu: 3,
                    rnr_retry: 7,
                    max_cm_retries: 15,
                    srq: false,
                    local_lid: 65535,
                    remote_lid: 65535,
                    local_gid: h198(3),
                    remote_gid: h198(2),
                    flow_label: 0x69ac6,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 0x40,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0x13,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0xb856,
                        src: h198(3),
                        dst: h198(2),
                        user: &[],
                    },
                }),
            )
        },
        e(
            RXE,
            2777,
            0x0000_0002_fc9f_3352,
            Exp::Rep(Rep {
                local_comm_id: 0x289e_7d45,
                remote_comm_id: 0x5233_9ffc,
                qkey: 0,
                qpn: 0x2c,
                starting_psn: 0x23_13ef,
                responder_resources: 0,
                initiator_depth: 0,
                target_ack_delay: 0x0f,
                failover: 0,
                e2e: false,
                rnr_retry: 7,
                srq: false,
                ca_guid: 0x5054_00ff_fe00_0002,
            }),
        ),
        e(
            RXE,
            2778,
            0x0000_0002_fc9f_3352,
            Exp::Rtu(0x5233_9ffc, 0x289e_7d45),
        ),
        e(
            RXE,
            3323,
            0x0000_0002_fc9f_3352,
            Exp::Dreq(0x5233_9ffc, 0x289e_7d45, 0x2c),
        ),
        e(
            RXE,
            3324,
            0x0000_0002_fc9f_3352,
            Exp::Drep(0x289e_7d45, 0x5233_9ffc),
        ),
        e(
            RXE,
            3325,
            0x0000_0002_457d_9e26,
            Exp::Dreq(0x269e_7d45, 0x5533_9ffc, 0x2b),
        ),
        e(
            RXE,
            3326,
            0x0000_0002_457d_9e26,
            Exp::Drep(0x5533_9ffc, 0x269e_7d45),
        ),
        // ---------------- rxe_cm_req_no_listener.pcap ----------------
        // Three identical REQs (MAD-layer retransmissions, same TID), then the *active* side's
        // REJ: reason timeout, "message rejected" = other, ARI = its own CA GUID.
        Entry {
            raw: &[(88, "c59ce000"), (140, "0040e938")],
            ..e(NOLISTEN, 1, 0x0000_0002_0de8_15a8, Exp::Req(nolisten_req()))
        },
        Entry {
            raw: &[(88, "c59ce000"), (140, "0040e938")],
            ..e(NOLISTEN, 2, 0x0000_0002_0de8_15a8, Exp::Req(nolisten_req()))
        },
        Entry {
            raw: &[(88, "c59ce000"), (140, "0040e938")],
            ..e(NOLISTEN, 3, 0x0000_0002_0de8_15a8, Exp::Req(nolisten_req()))
        },
        e(
            NOLISTEN,
            4,
            0x0000_0002_0de8_15a8,
            Exp::Rej {
                local: 0xa815_e80d,
                remote: 0,
                rejected: MessageRejected::Other,
                info_len: 8,
                reason: RejectReason::Timeout,
                ari: &[0x50, 0x54, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x02],
            },
        ),
        // ---------------- synthetic_cm_messages.pcap ----------------
        e(
            SYNTH,
            1,
            0x0000_1234_dead_beef,
            Exp::Rep(Rep {
                local_comm_id: 0xcafe_f00d,
                remote_comm_id: 0xdead_beef,
                qkey: 0,
                qpn: 0x22,
                starting_psn: 0x65_4321,
                responder_resources: 1,
                initiator_depth: 1,
                target_ack_delay: 0x0f,
                failover: 0,
                e2e: true,
                rnr_retry: 7,
                srq: false,
                ca_guid: 0x0002_c9ff_fe00_0002,
            }),
        ),
        e(
            SYNTH,
            2,
            0x0000_1234_dead_beef,
            Exp::Rtu(0xdead_beef, 0xcafe_f00d),
        ),
        e(
            SYNTH,
            3,
            0x0000_1234_dead_beef,
            Exp::Rej {
                local: 0,
                remote: 0xdead_beef,
                rejected: MessageRejected::Req,
                info_len: 0,
                reason: RejectReason::InvalidServiceId,
                ari: &[],
            },
        ),
        e(
            SYNTH,
            4,
            0x0000_1234_dead_beef,
            Exp::Dreq(0xdead_beef, 0xcafe_f00d, 0x22),
        ),
        e(
            SYNTH,
            5,
            0x0000_1234_dead_beef,
            Exp::Drep(0xcafe_f00d, 0xdead_beef),
        ),
        Entry {
            // IBTA "MRA": local comm ID, remote comm ID, message MRAed (8, bits 0-1),
            // service timeout (9, bits 0-4).
            raw: &[(0, "cafef00d"), (4, "deadbeef"), (8, "00"), (9, "c0")],
            ..e(
                SYNTH,
                6,
                0x0000_1234_dead_beef,
                Exp::Mra {
                    local: 0xcafe_f00d,
                    remote: 0xdead_beef,
                    mraed: MessageMraed::Req,
                    service_timeout: 24,
                },
            )
        },
        Entry {
            raw: &[
                (0, "11223344"),
                (4, "ffff"),
                (8, "0000000001111d2f"),
                (16, "00409c41000000000000000000000000c0000201"),
                (36, "000000000000000000000000c0000202"),
            ],
            ..e(
                SYNTH,
                7,
                0x0000_1234_dead_beef,
                Exp::SidrReq {
                    request_id: 0x1122_3344,
                    pkey: 0xffff,
                    service_id: 0x0000_0000_0111_1d2f,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0x9c41,
                        src: v4(192, 0, 2, 1),
                        dst: v4(192, 0, 2, 2),
                        user: &[],
                    },
                },
            )
        },
        Entry {
            raw: &[
                (0, "11223344"),
                (4, "0000"),
                (8, "000033"),
                (12, "0000000001111d2f"),
                (20, "01234567"),
            ],
            ..e(
                SYNTH,
                8,
                0x0000_1234_dead_beef,
                Exp::SidrRep {
                    request_id: 0x1122_3344,
                    status: SidrStatus::Success,
                    qpn: 0x33,
                    service_id: 0x0000_0000_0111_1d2f,
                    qkey: cma::RDMA_UDP_QKEY,
                },
            )
        },
        // ---------------- synthetic_mixed_one_bad_icrc.pcap ----------------
        Entry {
            raw: &[(88, "00000000"), (140, "00409c40")],
            ..e(
                MIXED,
                10,
                0x0000_1234_dead_beef,
                Exp::Req(Req {
                    local_comm_id: 0xdead_beef,
                    service_id: 0x0000_0000_0106_1d2f,
                    ca_guid: 0x0002_c9ff_fe00_0001,
                    qkey: 0,
                    qpn: 0x11,
                    responder_resources: 1,
                    initiator_depth: 1,
                    remote_cm_timeout: 0x14,
                    transport: TransportServiceType::Rc,
                    e2e: true,
                    starting_psn: 0x12_3456,
                    local_cm_timeout: 0x14,
                    retry_count: 7,
                    pkey: 0xffff,
                    mtu: 3,
                    rnr_retry: 7,
                    max_cm_retries: 15,
                    srq: false,
                    local_lid: 65535,
                    remote_lid: 65535,
                    local_gid: v4(192, 0, 2, 1),
                    remote_gid: v4(192, 0, 2, 2),
                    flow_label: 0,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 0x40,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0x13,
                    cma: Cma {
                        ip_version: 4,
                        src_port: 0x9c40,
                        src: v4(192, 0, 2, 1),
                        dst: v4(192, 0, 2, 2),
                        user: b"user-private-data",
                    },
                }),
            )
        },
    ]
}

fn nolisten_req() -> Req {
    Req {
        local_comm_id: 0xa815_e80d,
        service_id: 0x0000_0000_0106_1c06,
        ca_guid: 0x5054_00ff_fe00_0002,
        qkey: 0,
        qpn: 0x5c,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_timeout: 0x14,
        transport: TransportServiceType::Rc,
        e2e: false,
        starting_psn: 0x0f_f285,
        local_cm_timeout: 0x14,
        retry_count: 7,
        pkey: 0xffff,
        mtu: 3,
        rnr_retry: 7,
        max_cm_retries: 15,
        srq: false,
        local_lid: 65535,
        remote_lid: 65535,
        local_gid: v4(198, 18, 0, 2),
        remote_gid: v4(198, 18, 0, 1),
        flow_label: 0xc59ce,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0x40,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0x13,
        cma: Cma {
            ip_version: 4,
            src_port: 0xe938,
            src: v4(198, 18, 0, 2),
            dst: v4(198, 18, 0, 1),
            user: &[],
        },
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn check_cma(private_data: &[u8], exp: &Cma, what: &str) {
    let (hdr, rest) = CmaHeaderRepr::parse_private_data(private_data).expect(what);
    assert_eq!(hdr.cma_version, 0, "{what}: cma_version");
    assert_eq!(hdr.ip_version, exp.ip_version, "{what}: ip_version");
    assert_eq!(hdr.src_port, exp.src_port, "{what}: cma src port");
    assert_eq!(hdr.src_addr, IpAddr::V4(exp.src), "{what}: cma src addr");
    assert_eq!(hdr.dst_addr, IpAddr::V4(exp.dst), "{what}: cma dst addr");
    assert_eq!(
        &rest[..exp.user.len()],
        exp.user,
        "{what}: user private data"
    );
    assert!(
        rest[exp.user.len()..].iter().all(|&b| b == 0),
        "{what}: private data tail not zero"
    );
}

fn check(msg: &Message, exp: &Exp, what: &str) {
    match (msg, exp) {
        (Message::Req(r), Exp::Req(x)) => {
            assert_eq!(r.local_comm_id, x.local_comm_id, "{what}: local comm id");
            assert_eq!(r.vendor_id, 0, "{what}: ECE vendor id");
            assert_eq!(r.service_id, x.service_id, "{what}: service id");
            assert_eq!(r.local_ca_guid, x.ca_guid, "{what}: CA GUID");
            assert_eq!(r.local_qkey, x.qkey, "{what}: qkey");
            assert_eq!(r.local_qpn, x.qpn, "{what}: qpn");
            assert_eq!(
                r.responder_resources, x.responder_resources,
                "{what}: responder resources"
            );
            assert_eq!(
                r.initiator_depth, x.initiator_depth,
                "{what}: initiator depth"
            );
            assert_eq!((r.local_eecn, r.remote_eecn), (0, 0), "{what}: EECNs");
            assert_eq!(
                r.remote_cm_response_timeout, x.remote_cm_timeout,
                "{what}: remote CM timeout"
            );
            assert_eq!(r.transport_service_type, x.transport, "{what}: transport");
            assert_eq!(r.end_to_end_flow_control, x.e2e, "{what}: e2e flow control");
            assert_eq!(r.starting_psn, x.starting_psn, "{what}: starting PSN");
            assert_eq!(
                r.local_cm_response_timeout, x.local_cm_timeout,
                "{what}: local CM timeout"
            );
            assert_eq!(r.retry_count, x.retry_count, "{what}: retry count");
            assert_eq!(r.partition_key, x.pkey, "{what}: pkey");
            assert_eq!(r.path_mtu, x.mtu, "{what}: MTU");
            assert!(!r.rdc_exists, "{what}: RDC exists");
            assert_eq!(r.rnr_retry_count, x.rnr_retry, "{what}: RNR retry");
            assert_eq!(r.max_cm_retries, x.max_cm_retries, "{what}: max CM retries");
            assert_eq!(r.srq, x.srq, "{what}: SRQ");
            assert_eq!(r.extended_transport_type, 0, "{what}: extended transport");
            let p = &r.primary_path;
            assert_eq!(p.local_lid, x.local_lid, "{what}: local LID");
            assert_eq!(p.remote_lid, x.remote_lid, "{what}: remote LID");
            assert_eq!(
                p.local_gid.to_ipv4_mapped(),
                Some(x.local_gid),
                "{what}: local GID"
            );
            assert_eq!(
                p.remote_gid.to_ipv4_mapped(),
                Some(x.remote_gid),
                "{what}: remote GID"
            );
            assert_eq!(p.flow_label, x.flow_label, "{what}: flow label");
            assert_eq!(p.packet_rate, x.packet_rate, "{what}: packet rate");
            assert_eq!(p.traffic_class, x.traffic_class, "{what}: traffic class");
            assert_eq!(p.hop_limit, x.hop_limit, "{what}: hop limit");
            assert_eq!(p.sl, x.sl, "{what}: SL");
            assert_eq!(p.subnet_local, x.subnet_local, "{what}: subnet local");
            assert_eq!(
                p.local_ack_timeout, x.local_ack_timeout,
                "{what}: ACK timeout"
            );
            assert_eq!(
                r.alternate_path,
                softrdma_wire::cm::ReqPath::ZERO,
                "{what}: alternate path"
            );
            assert!(!r.sap_supported, "{what}: SAP");
            assert_eq!(
                cma::parse_service_id(r.service_id),
                Some((PortSpace::Tcp, r.service_id as u16)),
                "{what}: port space"
            );
            check_cma(&r.private_data, &x.cma, what);
        }
        (Message::Rep(r), Exp::Rep(x)) => {
            assert_eq!(r.local_comm_id, x.local_comm_id, "{what}: local comm id");
            assert_eq!(r.remote_comm_id, x.remote_comm_id, "{what}: remote comm id");
            assert_eq!(r.local_qkey, x.qkey, "{what}: qkey");
            assert_eq!(r.local_qpn, x.qpn, "{what}: qpn");
            assert_eq!(r.local_eecn, 0, "{what}: EECN");
            assert_eq!(r.vendor_id, 0, "{what}: ECE vendor id");
            assert_eq!(r.starting_psn, x.starting_psn, "{what}: starting PSN");
            assert_eq!(
                r.responder_resources, x.responder_resources,
                "{what}: responder resources"
            );
            assert_eq!(
                r.initiator_depth, x.initiator_depth,
                "{what}: initiator depth"
            );
            assert_eq!(
                r.target_ack_delay, x.target_ack_delay,
                "{what}: target ACK delay"
            );
            assert_eq!(r.failover_accepted, x.failover, "{what}: failover");
            assert_eq!(r.end_to_end_flow_control, x.e2e, "{what}: e2e");
            assert_eq!(r.rnr_retry_count, x.rnr_retry, "{what}: RNR retry");
            assert_eq!(r.srq, x.srq, "{what}: SRQ");
            assert_eq!(r.local_ca_guid, x.ca_guid, "{what}: CA GUID");
            assert!(
                r.private_data.iter().all(|&b| b == 0),
                "{what}: private data"
            );
        }
        (Message::Rtu(r), Exp::Rtu(l, rm)) => {
            assert_eq!((r.local_comm_id, r.remote_comm_id), (*l, *rm), "{what}");
            assert!(
                r.private_data.iter().all(|&b| b == 0),
                "{what}: private data"
            );
        }
        (Message::Dreq(r), Exp::Dreq(l, rm, q)) => {
            assert_eq!(
                (r.local_comm_id, r.remote_comm_id, r.remote_qpn_eecn),
                (*l, *rm, *q),
                "{what}"
            );
        }
        (Message::Drep(r), Exp::Drep(l, rm)) => {
            assert_eq!((r.local_comm_id, r.remote_comm_id), (*l, *rm), "{what}");
        }
        (
            Message::Rej(r),
            Exp::Rej {
                local,
                remote,
                rejected,
                info_len,
                reason,
                ari,
            },
        ) => {
            assert_eq!(r.local_comm_id, *local, "{what}: local comm id");
            assert_eq!(r.remote_comm_id, *remote, "{what}: remote comm id");
            assert_eq!(r.message_rejected, *rejected, "{what}: message rejected");
            assert_eq!(
                r.reject_info_length, *info_len,
                "{what}: reject info length"
            );
            assert_eq!(r.reason, *reason, "{what}: reason");
            assert_eq!(r.ari_info(), *ari, "{what}: ARI");
            assert!(
                r.ari[ari.len()..].iter().all(|&b| b == 0),
                "{what}: ARI tail"
            );
        }
        (
            Message::Mra(r),
            Exp::Mra {
                local,
                remote,
                mraed,
                service_timeout,
            },
        ) => {
            assert_eq!(r.local_comm_id, *local, "{what}: local comm id");
            assert_eq!(r.remote_comm_id, *remote, "{what}: remote comm id");
            assert_eq!(r.message_mraed, *mraed, "{what}: message MRAed");
            assert_eq!(
                r.service_timeout, *service_timeout,
                "{what}: service timeout"
            );
        }
        (
            Message::SidrReq(r),
            Exp::SidrReq {
                request_id,
                pkey,
                service_id,
                cma: c,
            },
        ) => {
            assert_eq!(r.request_id, *request_id, "{what}: request id");
            assert_eq!(r.partition_key, *pkey, "{what}: pkey");
            assert_eq!(r.service_id, *service_id, "{what}: service id");
            assert_eq!(
                cma::parse_service_id(r.service_id),
                Some((PortSpace::Udp, r.service_id as u16)),
                "{what}: port space"
            );
            check_cma(&r.private_data, c, what);
        }
        (
            Message::SidrRep(r),
            Exp::SidrRep {
                request_id,
                status,
                qpn,
                service_id,
                qkey,
            },
        ) => {
            assert_eq!(r.request_id, *request_id, "{what}: request id");
            assert_eq!(r.status, *status, "{what}: status");
            assert_eq!(r.additional_info_length, 0, "{what}: add. info length");
            assert_eq!(r.vendor_id, 0, "{what}: vendor id");
            assert_eq!(r.qpn, *qpn, "{what}: qpn");
            assert_eq!(r.service_id, *service_id, "{what}: service id");
            assert_eq!(r.qkey, *qkey, "{what}: qkey");
        }
        (m, _) => panic!(
            "{what}: got a {} but the table expects another type",
            m.name()
        ),
    }
}

/// (frame number, MAD) of every CM MAD in one capture, in file order.
fn scan(dir: &std::path::Path, file: &'static str) -> Vec<(usize, [u8; mad::MAD_SIZE])> {
    let path = dir.join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = PcapReader::new(&bytes).expect("pcap header");
    let mut out = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.expect("pcap record");
        if let Some(m) = cm_mad(rec.data) {
            let mut a = [0u8; mad::MAD_SIZE];
            a.copy_from_slice(m);
            out.push((i + 1, a));
        }
    }
    out
}

#[test]
fn every_cm_mad_in_the_golden_captures() {
    let dir = golden_dir();
    let table = table();
    let mut checked = 0;
    for (file, count) in [(RXE, 22), (NOLISTEN, 4), (SYNTH, 8), (MIXED, 1)] {
        let mads = scan(&dir, file);
        assert_eq!(mads.len(), count, "{file}: number of CM MADs");
        for (frame, raw) in &mads {
            let what = format!("{file} frame {frame}");
            let entry = table
                .iter()
                .find(|e| e.file == file && e.frame == *frame)
                .unwrap_or_else(|| panic!("{what}: CM MAD missing from the table"));
            let pkt = mad::Packet::new_checked(&raw[..]).unwrap();
            let hdr = mad::Repr::parse(&pkt).unwrap();
            assert_eq!(hdr.transaction_id, entry.tid, "{what}: TID");
            assert_eq!(hdr.mgmt_class, mad::MGMT_CLASS_CM, "{what}");
            assert_eq!(hdr.class_version, mad::CM_CLASS_VERSION, "{what}");
            assert_eq!(hdr.method, mad::METHOD_SEND, "{what}");
            assert_eq!(hdr.status, 0, "{what}");
            assert_eq!(hdr.attribute_modifier, 0, "{what}: attribute modifier");
            let msg = Message::parse(&pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(msg.attribute_id(), hdr.attribute_id, "{what}");
            check(&msg, &entry.exp, &what);
            for (off, bytes) in entry.raw {
                let want = hex(bytes);
                assert_eq!(
                    &pkt.data()[*off..*off + want.len()],
                    &want[..],
                    "{what}: raw bytes at CM offset {off}"
                );
            }
            // Re-emission is byte exact, both through emit_mad and through Repr + data_mut.
            let mut out = [0u8; mad::MAD_SIZE];
            msg.emit_mad(hdr.transaction_id, &mut out).unwrap();
            assert_eq!(&out[..], &raw[..], "{what}: emit_mad differs");
            let mut out2 = [0xffu8; mad::MAD_SIZE];
            let mut p2 = mad::Packet::new_checked(&mut out2[..]).unwrap();
            hdr.emit(&mut p2);
            msg.emit(p2.data_mut()).unwrap();
            assert_eq!(&out2[..], &raw[..], "{what}: Repr emit differs");
            checked += 1;
        }
    }
    assert_eq!(checked, table.len(), "table has entries no capture matched");
    assert_eq!(checked, 35);
}

#[test]
fn message_types_match_tshark() {
    // The names tshark prints in the Info column, per (file, frame).
    let dir = golden_dir();
    let expected: &[(&str, &[(usize, &str)])] = &[
        (
            RXE,
            &[
                (361, "REQ"),
                (362, "REP"),
                (363, "RTU"),
                (484, "DREQ"),
                (485, "DREP"),
                (486, "REQ"),
                (487, "REP"),
                (488, "RTU"),
                (529, "DREQ"),
                (530, "DREP"),
                (531, "SIDR_REQ"),
                (532, "SIDR_REP"),
                (2753, "REQ"),
                (2754, "REP"),
                (2755, "RTU"),
                (2776, "REQ"),
                (2777, "REP"),
                (2778, "RTU"),
                (3323, "DREQ"),
                (3324, "DREP"),
                (3325, "DREQ"),
                (3326, "DREP"),
            ],
        ),
        (NOLISTEN, &[(1, "REQ"), (2, "REQ"), (3, "REQ"), (4, "REJ")]),
        (
            SYNTH,
            &[
                (1, "REP"),
                (2, "RTU"),
                (3, "REJ"),
                (4, "DREQ"),
                (5, "DREP"),
                (6, "MRA"),
                (7, "SIDR_REQ"),
                (8, "SIDR_REP"),
            ],
        ),
        (MIXED, &[(10, "REQ")]),
    ];
    let mut total = 0;
    for (file, frames) in expected {
        let mads = scan(&dir, file);
        let got: Vec<(usize, &str)> = mads
            .iter()
            .map(|(f, m)| {
                let pkt = mad::Packet::new_checked(&m[..]).unwrap();
                (*f, Message::parse(&pkt).unwrap().name())
            })
            .collect();
        assert_eq!(got, frames.to_vec(), "{file}");
        total += frames.len();
    }
    assert_eq!(total, 35);
}
