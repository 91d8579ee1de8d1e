//! Receive queues (`Context::set_receive_queues`): a device's RC and UC QPs in one process
//! spread over several sockets of its reuseport group, each with a thread of its own, as a
//! NIC spreads flows over its queues. Over the wire (`SOFTRDMA_TRANSPORT=wire`), so that
//! every packet goes through the device's steering program; `datapath_queues` runs the whole
//! data-path suite on three queues over same-host lanes.

#[path = "common/pair.rs"]
mod pair;

use pair::*;
use softrdma::rdma_cm::*;
use softrdma::*;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Every device of this binary sends on the wire.
preset_env!("SOFTRDMA_TRANSPORT", "wire");

fn open(addr: IpAddr) -> Context {
    Device::from_addr(addr).unwrap().open().unwrap()
}

/// The slot byte of a QP number: which member of the device's reuseport group (which
/// receive queue of this process) its packets are steered to.
fn slot(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

#[test]
fn a_device_has_1_to_16_receive_queues_shared_by_its_contexts() {
    let addr = ip(&unique());
    let ctx = open(addr);
    assert!(ctx.receive_queues() >= 1);
    for bad in [0u8, 17, 255] {
        let e = ctx.set_receive_queues(bad).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{bad} queues");
    }
    ctx.set_receive_queues(4).unwrap();
    assert_eq!(ctx.receive_queues(), 4);
    assert_eq!(open(addr).receive_queues(), 4, "a second context shares it");
    ctx.set_receive_queues(1).unwrap();
    assert_eq!(open(addr).receive_queues(), 1);
}

/// RESET -> INIT -> RTR -> RTS for an RC QP `qp` connected to QP `dest` of the device at
/// `peer`.
fn connect(qp: &Qp, peer: IpAddr, dest: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..Default::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    qp.modify_qp(&init, (m | QpAttrMask::ACCESS_FLAGS).bits())
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::for_ip(peer),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: dest,
        rq_psn: dest & 0xff_ffff,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    qp.modify_qp(&rtr, m.bits()).unwrap();
}

fn to_rts(qp: &Qp) {
    to_rts_with(qp, 12, 7, 16);
}

/// [`to_rts`] with the local ACK `timeout`, `retries` (for timeouts and RNR alike) and
/// `max_rd_atomic` given.
fn to_rts_with(qp: &Qp, timeout: u8, retries: u8, max_rd_atomic: u8) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: qp.qp_num() & 0xff_ffff,
        timeout,
        retry_cnt: retries,
        rnr_retry: retries,
        max_rd_atomic,
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    qp.modify_qp(&rts, m.bits()).unwrap();
}

/// Polls `cq` until `n` completions arrived (a generous deadline: a hang is a bug, the figure
/// is no performance assertion).
fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wc = [WorkCompletion::default(); 32];
    while out.len() < n {
        let k = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            assert!(Instant::now() < deadline, "completions missing: {out:?}");
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    out
}

#[test]
fn rc_qps_on_three_queues_sharing_one_cq_carry_every_operation_byte_exact() {
    const N: usize = 6;
    const REGION: usize = 256 * 1024;
    let (x, y) = (ip(&unique()), ip(&unique()));
    let (cx, cy) = (open(x), open(y));
    cx.set_receive_queues(3).unwrap();
    cy.set_receive_queues(3).unwrap();
    let (px, py) = (cx.alloc_pd().unwrap(), cy.alloc_pd().unwrap());
    let (qx, qy) = (
        cx.create_cq(4096, 0, None, 0).unwrap(),
        cy.create_cq(4096, 0, None, 0).unwrap(),
    );
    let (bx, by) = (
        Arc::new(Buffer::new(N * REGION)),
        Arc::new(Buffer::new(N * REGION)),
    );
    let (mx, my) = (
        px.reg_buffer(&bx, ALL).unwrap(),
        py.reg_buffer(&by, ALL).unwrap(),
    );
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let make = |pd: &Pd, cq: &Cq| {
        pd.create_qp(&mut QpInitAttr::new(QpType::Rc, cq, cap))
            .unwrap()
    };
    let a: Vec<Qp> = (0..N).map(|_| make(&px, &qx)).collect();
    let b: Vec<Qp> = (0..N).map(|_| make(&py, &qy)).collect();
    // Three queues: the QPs of each side carry three slots, in turn.
    for side in [&a, &b] {
        let slots: HashSet<u8> = side.iter().map(|q| slot(q.qp_num())).collect();
        assert_eq!(
            slots.len(),
            3,
            "QPs {:x?}",
            side.iter().map(Qp::qp_num).collect::<Vec<_>>()
        );
    }
    for i in 0..N {
        connect(&a[i], y, b[i].qp_num());
        connect(&b[i], x, a[i].qp_num());
        to_rts(&a[i]);
        to_rts(&b[i]);
    }
    let sge = |buf: &Buffer, mr: &Mr, off: usize, len: usize| Sge {
        addr: buf.addr() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    };
    // Each QP i: a WRITE of 100,000 bytes, a SEND of 5,000 bytes, a READ of what it wrote
    // back into another place, a FETCH_AND_ADD on a counter of its region, all at once.
    for (i, qp) in b.iter().enumerate() {
        let base = i * REGION;
        let data = pattern(100_000, i as u8);
        bx.write(base, &data).unwrap();
        by.write(base + 200_000, &(i as u64 * 1000).to_le_bytes())
            .unwrap();
        let r = [sge(&by, &my, base + 120_000, 10_000)];
        qp.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &r,
        }])
        .unwrap();
    }
    for (i, qp) in a.iter().enumerate() {
        let base = i * REGION;
        let remote = by.addr() + base as u64;
        let w = [sge(&bx, &mx, base, 100_000)];
        let s = [sge(&bx, &mx, base + 1000, 5000)];
        let rd = [sge(&bx, &mx, base + 130_000, 100_000)];
        let at = [sge(&bx, &mx, base + 240_000, 8)];
        let wrs = [
            SendWr {
                wr_id: 1,
                sg_list: &w,
                opcode: WrOpcode::RdmaWrite,
                send_flags: SendFlags::SIGNALED,
                remote_addr: remote,
                rkey: my.rkey(),
                ..Default::default()
            },
            SendWr {
                wr_id: 2,
                sg_list: &s,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::SIGNALED,
                ..Default::default()
            },
            SendWr {
                wr_id: 3,
                sg_list: &rd,
                opcode: WrOpcode::RdmaRead,
                send_flags: SendFlags::SIGNALED,
                remote_addr: remote,
                rkey: my.rkey(),
                ..Default::default()
            },
            SendWr {
                wr_id: 4,
                sg_list: &at,
                opcode: WrOpcode::AtomicFetchAndAdd,
                send_flags: SendFlags::SIGNALED,
                remote_addr: remote + 200_000,
                rkey: my.rkey(),
                compare_add: 7,
                ..Default::default()
            },
        ];
        qp.post_send(&wrs).unwrap();
    }
    let sent = wait(&qx, 4 * N);
    let got = wait(&qy, N);
    for c in sent.iter().chain(&got) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    // Every QP's four completions, in the order posted.
    for i in 0..N {
        let mine: Vec<u64> = sent
            .iter()
            .filter(|c| c.qp_num == a[i].qp_num())
            .map(|c| c.wr_id)
            .collect();
        assert_eq!(mine, [1, 2, 3, 4], "QP {i}");
        let r: Vec<&WorkCompletion> = got.iter().filter(|c| c.qp_num == b[i].qp_num()).collect();
        assert_eq!(
            (r.len(), r[0].wr_id, r[0].byte_len),
            (1, 100 + i as u64, 5000)
        );
    }
    for i in 0..N {
        let base = i * REGION;
        let data = pattern(100_000, i as u8);
        let mut v = vec![0; 100_000];
        by.read(base, &mut v).unwrap();
        assert!(v == data, "WRITE of QP {i}");
        bx.read(base + 130_000, &mut v).unwrap();
        assert!(v == data, "READ of QP {i}");
        let mut s = vec![0; 5000];
        by.read(base + 120_000, &mut s).unwrap();
        assert!(s[..] == data[1000..6000], "SEND of QP {i}");
        let mut w = [0u8; 8];
        bx.read(base + 240_000, &mut w).unwrap();
        assert_eq!(
            u64::from_le_bytes(w),
            i as u64 * 1000,
            "fetched value of QP {i}"
        );
        by.read(base + 200_000, &mut w).unwrap();
        assert_eq!(
            u64::from_le_bytes(w),
            i as u64 * 1000 + 7,
            "added value of QP {i}"
        );
    }
    // The device's counters sum its queues'; nothing was steered to a queue without the QP.
    let (kx, ky) = (cx.counters(), cy.counters());
    assert_eq!((kx.unknown_qp, ky.unknown_qp), (0, 0));
    assert!(ky.rx_bytes >= (N * 105_000) as u64, "{ky:?}");
    assert!(kx.rx_bytes >= (N * 100_000) as u64, "{kx:?}");
}

/// Two devices of their own with two receive queues each, a PD and a CQ on each, and two
/// RC QPs on each device, one per queue (`a` on `x`, `b` on `y`), not connected.
struct TwoQueues {
    x: IpAddr,
    y: IpAddr,
    cx: Context,
    cy: Context,
    px: Pd,
    py: Pd,
    qx: Cq,
    qy: Cq,
    a: [Qp; 2],
    b: [Qp; 2],
}

/// [`TwoQueues`]; `faults` are set on `x` before its QPs start its queues.
fn two_queue_pairs(faults: Option<FaultConfig>) -> TwoQueues {
    let (x, y) = (ip(&unique()), ip(&unique()));
    let (cx, cy) = (open(x), open(y));
    cx.set_receive_queues(2).unwrap();
    cy.set_receive_queues(2).unwrap();
    if faults.is_some() {
        cx.set_fault_injection(faults).unwrap();
    }
    let (px, py) = (cx.alloc_pd().unwrap(), cy.alloc_pd().unwrap());
    let (qx, qy) = (
        cx.create_cq(64, 0, None, 0).unwrap(),
        cy.create_cq(64, 0, None, 0).unwrap(),
    );
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let make = |pd: &Pd, cq: &Cq| {
        pd.create_qp(&mut QpInitAttr::new(QpType::Rc, cq, cap))
            .unwrap()
    };
    let a = [make(&px, &qx), make(&px, &qx)];
    let b = [make(&py, &qy), make(&py, &qy)];
    assert_ne!(slot(a[0].qp_num()), slot(a[1].qp_num()));
    TwoQueues {
        x,
        y,
        cx,
        cy,
        px,
        py,
        qx,
        qy,
        a,
        b,
    }
}

#[test]
fn faults_set_on_a_device_hold_on_every_queue() {
    // Every packet of the device dropped: QPs on every queue time out, none gets through.
    // (Every part bound, so that each lives to the end of the test.)
    let TwoQueues {
        x,
        y,
        cx,
        cy,
        px: _px,
        py: _py,
        qx,
        qy: _qy,
        a,
        b,
    } = two_queue_pairs(None);
    cx.set_fault_injection(Some(FaultConfig {
        drop: 1.0,
        seed: 3,
        ..Default::default()
    }))
    .unwrap();
    for i in 0..2 {
        connect(&a[i], y, b[i].qp_num());
        connect(&b[i], x, a[i].qp_num());
        // A short local ACK timeout and one retry: the failure comes in milliseconds.
        to_rts_with(&a[i], 8, 1, 1);
        a[i].post_send(&[SendWr {
            wr_id: i as u64,
            sg_list: &[],
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }])
        .unwrap();
    }
    let c = wait(&qx, 2);
    for c in &c {
        assert_eq!(c.status, WcStatus::RetryExcErr, "{c:?}");
    }
    let k = cx.counters();
    assert!(k.fault_drops >= 4, "both queues' packets dropped: {k:?}");
    assert_eq!(cy.counters().rx_packets, 0);
}

/// Sets two receive queues on the devices at `addrs` (as rdma_cm sees them).
fn two_queues(addrs: &[&String]) {
    for a in addrs {
        device_context(a.parse().unwrap())
            .unwrap()
            .set_receive_queues(2)
            .unwrap();
    }
}

/// The QP capabilities of the rdma_cm tests: a few small messages.
fn cm_caps() -> CmQpInitAttr {
    CmQpInitAttr {
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
        ..Default::default()
    }
}

/// A passive endpoint on `addr`, port `port` (not listening yet).
fn cm_listener(addr: &str, port: u16) -> CmId {
    let hints = AddrInfoHints {
        ai_flags: RAI_PASSIVE,
        ai_port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let res = getaddrinfo(Some(addr), Some(&port.to_string()), Some(&hints)).unwrap();
    CmId::create_ep(&res[0], None, Some(&mut cm_caps())).unwrap()
}

/// An endpoint on the device at `from` for the server at `addr`, port `port`.
fn cm_client(addr: &str, from: &str, port: u16) -> CmId {
    let hints = AddrInfoHints {
        ai_port_space: Some(PortSpace::Tcp),
        ai_src_addr: Some(std::net::SocketAddr::new(from.parse().unwrap(), 0)),
        ..Default::default()
    };
    let res = getaddrinfo(Some(addr), Some(&port.to_string()), Some(&hints)).unwrap();
    CmId::create_ep(&res[0], None, Some(&mut cm_caps())).unwrap()
}

#[test]
fn rdma_cm_connections_spread_over_queues_echo_messages() {
    // The server on one device, the clients on another (QPs of one device take its queues
    // in turn, whichever side creates them).
    let (addr, from) = (unique(), unique());
    let port = 7000 + (std::process::id() % 20000) as u16;
    two_queues(&[&addr, &from]);
    let listen = cm_listener(&addr, port);
    listen.listen(8).unwrap();
    const K: usize = 4;
    let server = std::thread::spawn(move || {
        let mut slots = HashSet::new();
        let mut ids = Vec::new();
        for _ in 0..K {
            let id = listen.get_request().unwrap();
            let buf = Arc::new(Buffer::new(64));
            let mr = id.reg_msgs(&buf).unwrap();
            id.post_recv(0, buf.addr(), 64, &mr).unwrap();
            id.accept(&ConnParam::default()).unwrap();
            slots.insert(slot(id.qp().unwrap().qp_num()));
            ids.push((id, buf, mr));
        }
        for (id, buf, mr) in &ids {
            let wc = id.get_recv_comp().unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            // Echo it back.
            id.post_send(
                0,
                buf.addr(),
                wc.byte_len as usize,
                Some(mr),
                SendFlags::empty(),
            )
            .unwrap();
            assert_eq!(id.get_send_comp().unwrap().status, WcStatus::Success);
        }
        slots
    });
    let mut clients = Vec::new();
    let mut slots = HashSet::new();
    for i in 0..K {
        let id = cm_client(&addr, &from, port);
        let buf = Arc::new(Buffer::new(64));
        let mr = id.reg_msgs(&buf).unwrap();
        id.connect(&ConnParam::default()).unwrap();
        slots.insert(slot(id.qp().unwrap().qp_num()));
        buf.write(0, &[i as u8 + 1; 40]).unwrap();
        clients.push((id, buf, mr));
    }
    for (id, buf, mr) in &clients {
        id.post_recv(0, buf.addr(), 64, mr).unwrap();
        id.post_send(0, buf.addr(), 40, Some(mr), SendFlags::empty())
            .unwrap();
        assert_eq!(id.get_send_comp().unwrap().status, WcStatus::Success);
    }
    for (i, (id, buf, _)) in clients.iter().enumerate() {
        let wc = id.get_recv_comp().unwrap();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40));
        let mut v = [0u8; 40];
        buf.read(0, &mut v).unwrap();
        assert_eq!(v, [i as u8 + 1; 40]);
    }
    let server_slots = server.join().unwrap();
    assert_eq!(slots.len(), 2, "the clients' QPs on both queues");
    assert_eq!(server_slots.len(), 2, "the server's QPs on both queues");
    // The CM's messages that the kernel's hash gave queue 1 went to queue 0 in the process,
    // with no hop: nothing counts as misrouted on devices no other process uses.
    for a in [&addr, &from] {
        let k = device_context(a.parse().unwrap()).unwrap().counters();
        assert_eq!((k.misrouted, k.unknown_qp), (0, 0), "{a}: {k:?}");
    }
    for (id, _, _) in &clients {
        let _ = id.disconnect();
    }
}

#[test]
fn a_message_sent_right_before_a_disconnect_arrives_on_every_queue() {
    // The peer posts a SEND and disconnects at once: its DREQ reaches the device's queue 0
    // (the connection manager's) while the SEND may still wait on the QP's own queue 1; the
    // connection manager takes what waits there first, so the SEND lands (Success) rather
    // than being flushed by the disconnection. (Nothing in RDMA orders a DREQ after data:
    // for a QP on queue 0, whose DREQ may come in on queue 1's socket and be handed over,
    // the SEND may be flushed, as it may on hardware; only queue 1's QPs are held to it.)
    const N: usize = 12;
    let (addr, from) = (unique(), unique());
    let port = 9000 + (std::process::id() % 20000) as u16;
    two_queues(&[&addr, &from]);
    let listen = cm_listener(&addr, port);
    listen.listen(N as i32).unwrap();
    let server = std::thread::spawn(move || {
        let mut slots = HashSet::new();
        let mut queue0 = None;
        let mut on_queue1 = 0;
        for i in 0..N {
            let id = listen.get_request().unwrap();
            let buf = Arc::new(Buffer::new(8192));
            let mr = id.reg_msgs(&buf).unwrap();
            id.post_recv(0, buf.addr(), 8192, &mr).unwrap();
            id.accept(&ConnParam::default()).unwrap();
            let s = slot(id.qp().unwrap().qp_num());
            slots.insert(s);
            // The device's first QP is on queue 0.
            let first = *queue0.get_or_insert(s);
            let wc = id.get_recv_comp().unwrap();
            if s == first {
                assert!(
                    matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr),
                    "connection {i}: {wc:?}"
                );
                continue;
            }
            on_queue1 += 1;
            assert_eq!(
                (wc.status, wc.byte_len),
                (WcStatus::Success, 4000),
                "connection {i}: the last SEND before the DREQ"
            );
            let mut v = vec![0; 4000];
            buf.read(0, &mut v).unwrap();
            assert_eq!(v, pattern(4000, i as u8), "connection {i}");
        }
        assert!(on_queue1 >= N / 2 - 1, "{on_queue1} connections on queue 1");
        slots
    });
    for i in 0..N {
        let id = cm_client(&addr, &from, port);
        let buf = Arc::new(Buffer::new(4000));
        let mr = id.reg_msgs(&buf).unwrap();
        buf.write(0, &pattern(4000, i as u8)).unwrap();
        id.connect(&ConnParam::default()).unwrap();
        id.post_send(0, buf.addr(), 4000, Some(&mr), SendFlags::empty())
            .unwrap();
        id.disconnect().unwrap();
    }
    let slots = server.join().unwrap();
    assert_eq!(slots.len(), 2, "the server's QPs on both queues");
}

#[test]
fn a_device_counts_its_first_faulty_packets_once_for_all_its_queues() {
    // `first = 2`: the device's first two packets are dropped, whichever queue sends them,
    // and a queue that starts later does not drop two more of its own.
    let TwoQueues {
        x,
        y,
        cx,
        cy: _cy,
        px,
        py,
        qx,
        qy,
        a,
        b,
    } = two_queue_pairs(Some(FaultConfig {
        drop: 1.0,
        first: 2,
        seed: 5,
        ..Default::default()
    }));
    let buf = Arc::new(Buffer::new(64));
    let mr = py.reg_buffer(&buf, ALL).unwrap();
    for i in 0..2 {
        connect(&a[i], y, b[i].qp_num());
        connect(&b[i], x, a[i].qp_num());
        to_rts(&a[i]);
        to_rts(&b[i]);
        let r = [Sge {
            addr: buf.addr() + 32 * i as u64,
            length: 32,
            lkey: mr.lkey(),
        }];
        b[i].post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &r,
        }])
        .unwrap();
    }
    let out = Arc::new(Buffer::new(64));
    let omr = px.reg_buffer(&out, ALL).unwrap();
    for (i, qp) in a.iter().enumerate() {
        out.write(16 * i, &[i as u8 + 1; 16]).unwrap();
        let s = [Sge {
            addr: out.addr() + 16 * i as u64,
            length: 16,
            lkey: omr.lkey(),
        }];
        qp.post_send(&[SendWr {
            wr_id: i as u64,
            sg_list: &s,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }])
        .unwrap();
    }
    for c in wait(&qx, 2).iter().chain(&wait(&qy, 2)) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    assert_eq!(cx.counters().fault_drops, 2, "{:?}", cx.counters());
    for i in 0..2 {
        let mut v = [0u8; 16];
        buf.read(32 * i, &mut v).unwrap();
        assert_eq!(v, [i as u8 + 1; 16]);
    }
}
