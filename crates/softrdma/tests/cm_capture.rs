//! The connection set-up traffic in a capture: an rdma_cm RC connection (REQ, REP, RTU, then
//! DREQ, DREP) and a UD SIDR lookup (SIDR_REQ, SIDR_REP) between two devices, written to a
//! pcap file, parse with our wire layer (every ICRC verifies over the captured headers) and
//! decode in tshark (when installed; required in CI) as the right InfiniBand CM messages with
//! no malformed frame — and the rdma_cm header in the REQ's and the SIDR_REQ's private data
//! (IP version, addresses, port) is what the active side sent, read back both from our own
//! parse and from tshark's fields and bytes.
//!
//! One test: the capture is process-wide. Its two devices are loopback addresses of this run's
//! own (see `softrdma::testing`).

use softrdma::rdma_cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::*;
use softrdma_wire::cm::{Message, SidrReqPacket, SidrStatus};
use softrdma_wire::cma::{self, CmaHeaderRepr};
use softrdma_wire::{icrc, ip, mad, pcap::PcapReader, roce};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;

/// This binary's (server, client) device addresses.
fn addrs() -> &'static (String, String) {
    static A: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let u = || softrdma::testing::unique_loopback_addr().to_string();
        (u(), u())
    })
}

fn server_addr() -> &'static str {
    &addrs().0
}

fn client_addr() -> &'static str {
    &addrs().1
}
const RC_PORT: u16 = 7120;
const UD_PORT: u16 = 7121;
const RC_DATA: &[u8] = b"rc private data";
const UD_DATA: &[u8] = b"sidr private data";

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn expect(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let ev = ch.get_cm_event().unwrap();
    assert_eq!(ev.event, want, "status {}", ev.status);
    ev
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn listener(ch: &EventChannel, ps: PortSpace, port: u16) -> CmId {
    let l = CmId::create(Some(ch), 1, ps).unwrap();
    l.bind_addr(addr(server_addr(), port)).unwrap();
    l.listen(4).unwrap();
    l
}

/// A client id on the client device, resolved to the server's `port`, with a QP.
fn client(ch: &EventChannel, ps: PortSpace, port: u16) -> CmId {
    let c = CmId::create(Some(ch), 2, ps).unwrap();
    c.resolve_addr(
        Some(addr(client_addr(), 0)),
        addr(server_addr(), port),
        2000,
    )
    .unwrap();
    expect(ch, CmEventType::AddrResolved).ack();
    c.resolve_route(2000).unwrap();
    expect(ch, CmEventType::RouteResolved).ack();
    c.create_qp(None, &mut cap()).unwrap();
    c
}

/// Sets up and tears down one RC connection and does one SIDR lookup; returns the source
/// ports of the RC and UD client ids (what their rdma_cm headers must carry).
fn cm_traffic() -> (u16, u16) {
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();

    // RC: REQ, REP, RTU, then DREQ, DREP.
    let l = listener(&sch, PortSpace::Tcp, RC_PORT);
    let c = client(&cch, PortSpace::Tcp, RC_PORT);
    c.connect(&ConnParam {
        private_data: RC_DATA.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.param.private_data[..RC_DATA.len()], RC_DATA);
    let s = req.id.clone();
    req.ack();
    s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam {
        private_data: b"rep".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    expect(&cch, CmEventType::Established).ack();
    expect(&sch, CmEventType::Established).ack();
    c.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    expect(&sch, CmEventType::Disconnected).ack();
    let rc_port = c.src_port();

    // UD: SIDR_REQ, SIDR_REP.
    let ul = listener(&sch, PortSpace::Udp, UD_PORT);
    let uc = client(&cch, PortSpace::Udp, UD_PORT);
    uc.connect(&ConnParam {
        private_data: UD_DATA.to_vec(),
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(
        &req.ud.as_ref().unwrap().private_data[..UD_DATA.len()],
        UD_DATA
    );
    let us = req.id.clone();
    req.ack();
    let uqp = us.create_qp(None, &mut cap()).unwrap();
    us.accept(&ConnParam::default()).unwrap();
    let est = expect(&cch, CmEventType::Established);
    assert_eq!(est.ud.as_ref().unwrap().qp_num, uqp.qp_num());
    est.ack();
    let ud_port = uc.src_port();

    for id in [c, s, l, uc, us, ul] {
        id.destroy();
    }
    (rc_port, ud_port)
}

/// One CM message of the capture, as our wire layer reads it.
struct CmFrame {
    attribute_id: u16,
    msg: Message,
}

/// The name Wireshark's InfiniBand dissector gives a CM attribute in its Info column.
fn wireshark_name(attribute_id: u16) -> &'static str {
    match attribute_id {
        mad::ATTR_CM_REQ => "ConnectRequest",
        mad::ATTR_CM_MRA => "MsgRcptAck",
        mad::ATTR_CM_REJ => "ConnectReject",
        mad::ATTR_CM_REP => "ConnectReply",
        mad::ATTR_CM_RTU => "ReadyToUse",
        mad::ATTR_CM_DREQ => "DisconnectRequest",
        mad::ATTR_CM_DREP => "DisconnectReply",
        mad::ATTR_CM_SIDR_REQ => "ServiceIDResReq",
        mad::ATTR_CM_SIDR_REP => "ServiceIDResReqResp",
        _ => "?",
    }
}

/// A tshark number field: `0x…` in hex, else decimal.
fn number(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn rdma_cm_connection_and_sidr_traffic_decodes_as_infiniband_cm_in_tshark() {
    let dir = std::env::temp_dir().join(format!("softrdma-cm-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cm.pcap");
    // Both devices exist before the capture starts, so it holds the CM traffic only.
    let _devs: Vec<Context> = [server_addr(), client_addr()]
        .iter()
        .map(|a| {
            let c = Device::from_addr(a.parse().unwrap())
                .unwrap()
                .open()
                .unwrap();
            c.local_udp_addr().unwrap();
            c
        })
        .collect();
    start_capture(&file).unwrap();
    let (rc_port, ud_port) = cm_traffic();
    stop_capture().unwrap();

    // Our own reading: every frame valid RoCEv2 with a good ICRC; the CM frames in order.
    let data = std::fs::read(&file).unwrap();
    let mut frames = 0;
    let mut cm: BTreeMap<usize, CmFrame> = BTreeMap::new();
    for (i, rec) in PcapReader::new(&data).unwrap().records().enumerate() {
        let rec = rec.unwrap();
        frames += 1;
        let d = ip::parse_ethernet_udp(rec.data).expect("Ethernet/IP/UDP");
        assert_eq!(d.dst_port, 4791);
        icrc::verify(&rec.data[ip::ETHERNET_HEADER_LEN..]).expect("ICRC");
        let p = roce::Packet::new_checked(d.payload).unwrap();
        roce::Repr::parse(&p).unwrap();
        if p.bth().dest_qp() == mad::GSI_QPN {
            let m = mad::Packet::new_checked(p.payload()).unwrap();
            let msg = Message::parse(&m).expect("a CM message");
            cm.insert(
                i + 1,
                CmFrame {
                    attribute_id: m.attribute_id(),
                    msg,
                },
            );
        }
    }
    let names: Vec<&str> = cm.values().map(|f| f.msg.name()).collect();
    assert_eq!(
        names,
        ["REQ", "REP", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP"],
        "the CM messages of the capture"
    );
    let client_ip: IpAddr = client_addr().parse().unwrap();
    let server_ip: IpAddr = server_addr().parse().unwrap();
    for f in cm.values() {
        match &f.msg {
            Message::Req(r) => {
                assert_eq!(r.service_id, cma::service_id(cma::PortSpace::Tcp, RC_PORT));
                let (h, user) = CmaHeaderRepr::parse_private_data(&r.private_data).unwrap();
                assert_eq!(h, CmaHeaderRepr::new(client_ip, rc_port, server_ip));
                assert_eq!(&user[..RC_DATA.len()], RC_DATA);
            }
            Message::SidrReq(r) => {
                assert_eq!(r.service_id, cma::service_id(cma::PortSpace::Udp, UD_PORT));
                let (h, user) = CmaHeaderRepr::parse_private_data(&r.private_data).unwrap();
                assert_eq!(h, CmaHeaderRepr::new(client_ip, ud_port, server_ip));
                assert_eq!(&user[..UD_DATA.len()], UD_DATA);
            }
            Message::SidrRep(r) => {
                assert_eq!(r.status, SidrStatus::Success);
                assert_eq!(r.qkey, cma::RDMA_UDP_QKEY);
            }
            _ => {}
        }
    }

    // tshark's reading.
    match Command::new("tshark").arg("-v").output() {
        Ok(o) if o.status.success() => {
            let fields = [
                "frame.number",
                "_ws.col.Info",
                "infiniband.bth.opcode",
                "infiniband.bth.destqp",
                "infiniband.deth.q_key",
                "infiniband.mad.baseversion",
                "infiniband.mad.mgmtclass",
                "infiniband.mad.classversion",
                "infiniband.mad.method",
                "infiniband.mad.attributeid",
                "infiniband.mad.data",
                "infiniband.cm.req.serviceid",
                "infiniband.cm.req.ip_cm.ipv",
                "infiniband.cm.req.ip_cm.sport",
                "infiniband.cm.req.ip_cm.sip4",
                "infiniband.cm.req.ip_cm.dip4",
                "infiniband.cm.req.ip_cm.private",
                "_ws.malformed",
                "_ws.expert.severity",
            ];
            let mut cmd = Command::new("tshark");
            cmd.arg("-r")
                .arg(&file)
                .args(["-T", "fields", "-E", "occurrence=f"]);
            for f in fields {
                cmd.args(["-e", f]);
            }
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), frames, "tshark saw every frame");
            for l in &lines {
                let v: Vec<&str> = l.split('\t').collect();
                assert_eq!(v.len(), fields.len(), "{l}");
                let get = |name: &str| v[fields.iter().position(|f| *f == name).unwrap()];
                assert!(
                    !get("infiniband.bth.opcode").is_empty(),
                    "not InfiniBand: {l}"
                );
                assert!(get("_ws.malformed").is_empty(), "malformed: {l}");
                assert!(get("_ws.expert.severity").is_empty(), "expert info: {l}");
                let n = get("frame.number").parse::<usize>().unwrap();
                let Some(f) = cm.get(&n) else {
                    assert_ne!(number(get("infiniband.bth.destqp")), 1, "{l}");
                    continue;
                };
                // The right CM message, as a UD SEND to QP 1 with the GSI Q_Key.
                assert_eq!(number(get("infiniband.bth.opcode")), 0x64, "{l}");
                assert_eq!(number(get("infiniband.bth.destqp")), 1, "{l}");
                assert_eq!(
                    number(get("infiniband.deth.q_key")),
                    u64::from(mad::GSI_QKEY)
                );
                assert_eq!(number(get("infiniband.mad.baseversion")), 1, "{l}");
                assert_eq!(number(get("infiniband.mad.mgmtclass")), 0x07, "{l}");
                assert_eq!(number(get("infiniband.mad.classversion")), 2, "{l}");
                assert_eq!(number(get("infiniband.mad.method")), 0x03, "{l}");
                assert_eq!(
                    number(get("infiniband.mad.attributeid")),
                    u64::from(f.attribute_id),
                    "{l}"
                );
                assert_eq!(
                    get("_ws.col.Info"),
                    format!("CM: {}", wireshark_name(f.attribute_id)),
                    "{l}"
                );
                match &f.msg {
                    Message::Req(_) => {
                        // tshark decodes the rdma_cm header itself (IBTA Annex A11 "IP CM").
                        assert_eq!(
                            number(get("infiniband.cm.req.serviceid")),
                            cma::service_id(cma::PortSpace::Tcp, RC_PORT)
                        );
                        assert_eq!(number(get("infiniband.cm.req.ip_cm.ipv")), 4, "{l}");
                        assert_eq!(
                            number(get("infiniband.cm.req.ip_cm.sport")),
                            u64::from(rc_port)
                        );
                        assert_eq!(get("infiniband.cm.req.ip_cm.sip4"), client_addr());
                        assert_eq!(get("infiniband.cm.req.ip_cm.dip4"), server_addr());
                        let user = unhex(get("infiniband.cm.req.ip_cm.private"));
                        assert_eq!(&user[..RC_DATA.len()], RC_DATA);
                    }
                    Message::SidrReq(_) => {
                        // tshark 4.0 does not dissect SIDR_REQ: read its header from the
                        // MAD data bytes tshark shows.
                        let data = unhex(get("infiniband.mad.data"));
                        assert_eq!(data.len(), mad::MAD_DATA_LEN);
                        let p = SidrReqPacket::new_checked(&data[..]).unwrap();
                        assert_eq!(
                            p.service_id(),
                            cma::service_id(cma::PortSpace::Udp, UD_PORT)
                        );
                        let (h, user) =
                            CmaHeaderRepr::parse_private_data(p.private_data()).unwrap();
                        assert_eq!(h, CmaHeaderRepr::new(client_ip, ud_port, server_ip));
                        assert_eq!(&user[..UD_DATA.len()], UD_DATA);
                    }
                    _ => {}
                }
            }
        }
        _ if std::env::var_os("CI").is_some() => panic!("tshark is required in CI"),
        _ => eprintln!("tshark not installed: skipped the Wireshark check"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
