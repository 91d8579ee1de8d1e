//! librdmacm conformance (../shared/docs/api_checklist.md §1): one test per function or
//! behaviour, named after it. Every device address is a loopback address of this run's own
//! (see `softrdma::testing`).

use softrdma::rdma_cm::*;
use softrdma::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text: a device address of the test's own.
fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn expect(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let ev = ch.get_cm_event().unwrap();
    assert_eq!(ev.event, want, "got {ev:?}");
    ev
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn cap2() -> QpCap {
    QpCap {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..cap()
    }
}

fn wait_wc(cq: &Cq) -> WorkCompletion {
    let t = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        if t.elapsed() > Duration::from_secs(60) {
            // A hang guard, not a speed check: only something that never happens trips it.
            panic!("no completion");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn poll_readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// This binary's client device address: the source the clients resolve from (without one,
/// the route to a loopback destination would give 127.0.0.1, which other programs use).
fn client_src() -> SocketAddr {
    static A: std::sync::OnceLock<IpAddr> = std::sync::OnceLock::new();
    SocketAddr::new(*A.get_or_init(|| unique().parse().unwrap()), 0)
}

/// An asynchronous client resolved to `dst` (address and route) from [`client_src`], no QP
/// yet.
fn resolved(ch: &EventChannel, ps: PortSpace, dst: &str) -> CmId {
    let id = CmId::create(Some(ch), 9, ps).unwrap();
    id.resolve_addr(Some(client_src()), addr(dst), 2000)
        .unwrap();
    expect(ch, CmEventType::AddrResolved).ack();
    id.resolve_route(2000).unwrap();
    expect(ch, CmEventType::RouteResolved).ack();
    id
}

fn listener(ch: &EventChannel, ps: PortSpace, at: &str) -> CmId {
    let l = CmId::create(Some(ch), 1, ps).unwrap();
    l.bind_addr(addr(at)).unwrap();
    l.listen(4).unwrap();
    l
}

#[test]
fn rdma_create_event_channel_fd_is_pollable_and_nonblocking_gives_eagain() {
    let ch = EventChannel::new().unwrap();
    assert!(ch.fd() >= 0);
    ch.set_nonblocking(true).unwrap();
    assert_eq!(ch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    assert!(!poll_readable(ch.fd()));
    let id = CmId::create(Some(&ch), 5, PortSpace::Tcp).unwrap();
    id.write_cm_event(CmEventType::User, -7, 42).unwrap();
    assert!(poll_readable(ch.fd()), "readable while an event waits");
    let ev = ch.get_cm_event().unwrap();
    assert_eq!((ev.event, ev.status, ev.arg), (CmEventType::User, -7, 42));
    assert_eq!(ev.id.context(), 5);
    ev.ack();
    assert!(!poll_readable(ch.fd()));
    assert_eq!(ch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    id.destroy();
    ch.destroy().unwrap();
}

#[test]
fn rdma_destroy_event_channel_fails_with_ebusy_while_ids_use_it() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    let ch = ch.destroy().unwrap_err();
    assert_eq!(ch.errno(), libc::EBUSY);
    id.destroy();
    ch.object.destroy().unwrap();
}

#[test]
fn rdma_write_cm_event_takes_only_user_events() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        id.write_cm_event(CmEventType::Established, 0, 0)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    id.destroy();
}

#[test]
fn rdma_event_str_names_every_event_and_unknown_ones() {
    for (n, t) in CmEventType::ALL.iter().enumerate() {
        assert_eq!(*t as u32, n as u32);
        assert_eq!(event_str(n as u32), t.as_str());
        assert!(t.as_str().starts_with("RDMA_CM_EVENT_"));
    }
    assert_eq!(event_str(9), "RDMA_CM_EVENT_ESTABLISHED");
    assert_eq!(event_str(18), "RDMA_CM_EVENT_USER");
    assert_eq!(event_str(19), "UNKNOWN EVENT");
    assert_eq!(event_str(1000), "UNKNOWN EVENT");
}

#[test]
fn rdma_create_id_derives_the_qp_type_from_the_port_space() {
    for (ps, t) in [
        (PortSpace::Tcp, QpType::Rc),
        (PortSpace::Ib, QpType::Rc),
        (PortSpace::Udp, QpType::Ud),
        (PortSpace::Ipoib, QpType::Ud),
    ] {
        let id = CmId::create(None, 3, ps).unwrap();
        assert_eq!((id.qp_type(), id.ps(), id.context()), (t, ps, 3));
        assert!(id.is_sync());
        assert!(
            id.channel().fd() >= 0,
            "a synchronous id has a private channel"
        );
        assert_eq!((id.src_port(), id.dst_port()), (0, 0));
        assert!(id.local_addr().is_none() && id.peer_addr().is_none());
        id.destroy();
    }
}

#[test]
fn rdma_destroy_id_waits_until_its_events_are_acknowledged() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    id.write_cm_event(CmEventType::User, 0, 1).unwrap();
    let ev = ch.get_cm_event().unwrap();
    let acked = Arc::new(AtomicBool::new(false));
    let a2 = acked.clone();
    let t = std::thread::spawn(move || {
        id.destroy();
        assert!(a2.load(Ordering::SeqCst), "destroy returned before the ack");
    });
    std::thread::sleep(Duration::from_millis(50));
    acked.store(true, Ordering::SeqCst);
    ev.ack();
    t.join().unwrap();
    ch.destroy().unwrap();
}

#[test]
fn rdma_destroy_id_drops_its_queued_events() {
    let ch = EventChannel::new().unwrap();
    ch.set_nonblocking(true).unwrap();
    let a = CmId::create(Some(&ch), 1, PortSpace::Tcp).unwrap();
    let b = CmId::create(Some(&ch), 2, PortSpace::Tcp).unwrap();
    a.write_cm_event(CmEventType::User, 0, 1).unwrap();
    b.write_cm_event(CmEventType::User, 0, 2).unwrap();
    a.destroy(); // never taken: no ack needed, and the event goes
    let ev = ch.get_cm_event().unwrap();
    assert_eq!(ev.arg, 2);
    ev.ack();
    assert_eq!(ch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    b.destroy();
    ch.destroy().unwrap();
}

#[test]
fn rdma_migrate_id_moves_the_id_and_its_events() {
    let ip_30 = unique();
    let ch1 = EventChannel::new().unwrap();
    let ch2 = EventChannel::new().unwrap();
    ch1.set_nonblocking(true).unwrap();
    let id = CmId::create(Some(&ch1), 0, PortSpace::Tcp).unwrap();
    id.write_cm_event(CmEventType::User, 0, 11).unwrap();
    id.migrate_id(Some(&ch2)).unwrap();
    assert_eq!(ch1.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    assert_eq!(ch2.get_cm_event().unwrap().arg, 11);
    // The old channel is free of the id, the new one is not.
    ch1.destroy().unwrap();
    // To synchronous, then no further: EINVAL.
    id.migrate_id(None).unwrap();
    assert!(id.is_sync());
    assert_eq!(id.migrate_id(None).unwrap_err().errno(), libc::EINVAL);
    // A synchronous id's calls wait for their event.
    id.resolve_addr(Some(client_src()), addr(&format!("{ip_30}:1")), 2000)
        .unwrap();
    assert_eq!(id.event().unwrap().event, CmEventType::AddrResolved);
    id.destroy();
    ch2.destroy().unwrap();
}

#[test]
fn rdma_set_option_checks_lengths_names_and_state() {
    let ip_31 = unique();
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.set_option_raw(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &[32])
        .unwrap();
    id.set_option_raw(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &[14])
        .unwrap();
    id.set_option_raw(
        RDMA_OPTION_ID,
        RDMA_OPTION_ID_REUSEADDR,
        &1i32.to_ne_bytes(),
    )
    .unwrap();
    id.set_option_raw(RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &0i32.to_ne_bytes())
        .unwrap();
    let e = |r: softrdma::Result<()>| r.unwrap_err().errno();
    assert_eq!(
        e(id.set_option_raw(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &[1, 2])),
        libc::EINVAL
    );
    assert_eq!(
        e(id.set_option_raw(RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &[1])),
        libc::EINVAL
    );
    assert_eq!(e(id.set_option_raw(RDMA_OPTION_ID, 99, &[1])), libc::ENOSYS);
    assert_eq!(e(id.set_option_raw(7, 0, &[1])), libc::ENOSYS);
    assert_eq!(
        e(id.set_option_raw(RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &[0; 64])),
        libc::EOPNOTSUPP
    );
    id.bind_addr(addr(&format!("{ip_31}:7000"))).unwrap();
    assert_eq!(e(id.set_option(CmOption::ReuseAddr(true))), libc::EINVAL);
    assert_eq!(e(id.set_option(CmOption::AfOnly(true))), libc::EINVAL);
    id.set_option(CmOption::Tos(0)).unwrap();
    id.destroy();
}

#[test]
fn rdma_set_option_reuseaddr_lets_ids_share_a_port_until_one_listens() {
    let ip_31 = unique();
    let mk = |reuse: bool| {
        let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
        id.set_option(CmOption::ReuseAddr(reuse)).unwrap();
        id
    };
    let a = mk(true);
    a.bind_addr(addr(&format!("{ip_31}:7001"))).unwrap();
    let b = mk(true);
    b.bind_addr(addr(&format!("{ip_31}:7001"))).unwrap();
    let c = mk(false);
    assert_eq!(
        c.bind_addr(addr(&format!("{ip_31}:7001")))
            .unwrap_err()
            .errno(),
        libc::EADDRINUSE
    );
    a.listen(1).unwrap();
    let d = mk(true);
    assert_eq!(
        d.bind_addr(addr(&format!("{ip_31}:7001")))
            .unwrap_err()
            .errno(),
        libc::EADDRINUSE,
        "a listener's port is not shared"
    );
    assert_eq!(b.listen(1).unwrap_err().errno(), libc::EADDRINUSE);
    for id in [a, b, c, d] {
        id.destroy();
    }
}

#[test]
fn rdma_listen_on_an_unbound_id_binds_an_ephemeral_port() {
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.listen(1).unwrap();
    let a = id.local_addr().unwrap();
    assert!(a.ip().is_unspecified());
    assert_ne!(a.port(), 0);
    assert_eq!(id.src_port(), a.port());
    assert_eq!(id.listen(1).unwrap_err().errno(), libc::EINVAL);
    id.destroy();
}

#[test]
fn rdma_resolve_addr_binds_the_device_and_sets_the_addresses() {
    let ip_32 = unique();
    let ip_33 = unique();
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(id.resolve_route(100).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(id.port_num(), 0);
    id.resolve_addr(
        Some(addr(&format!("{ip_32}:0"))),
        addr(&format!("{ip_33}:4000")),
        2000,
    )
    .unwrap();
    let ev = expect(&ch, CmEventType::AddrResolved);
    assert_eq!(ev.status, 0);
    ev.ack();
    assert_eq!(
        id.verbs().unwrap().device().addr(),
        ip_32.parse::<IpAddr>().unwrap()
    );
    assert_eq!(id.port_num(), 1);
    assert_eq!(id.peer_addr().unwrap(), addr(&format!("{ip_33}:4000")));
    assert_eq!(id.dst_port(), 4000);
    assert_ne!(id.src_port(), 0);
    // Twice: wrong state.
    assert_eq!(
        id.resolve_addr(None, addr(&format!("{ip_33}:4000")), 10)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    id.resolve_route(2000).unwrap();
    expect(&ch, CmEventType::RouteResolved).ack();
    id.destroy();
}

#[test]
fn rdma_resolve_addr_reports_addr_error_when_there_is_no_route() {
    // An IPv6 documentation address: unreachable unless this machine has an IPv6 route.
    let dst: SocketAddr = "[2001:db8::1]:4000".parse().unwrap();
    let routable = std::net::UdpSocket::bind("[::]:0")
        .and_then(|s| s.connect(dst))
        .is_ok();
    if routable {
        eprintln!("skipped: this machine has a route to {dst}");
        return;
    }
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, 2000).unwrap();
    let ev = expect(&ch, CmEventType::AddrError);
    assert!(ev.status < 0, "a negative errno: {}", ev.status);
    ev.ack();
    // A synchronous id fails with that errno.
    let s = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    assert!(s.resolve_addr(None, dst, 2000).is_err());
    assert_eq!(s.event().unwrap().event, CmEventType::AddrError);
    id.destroy();
    s.destroy();
}

#[test]
fn rdma_resolve_addr_refuses_a_destination_of_another_family() {
    let ip_32 = unique();
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.bind_addr(addr(&format!("{ip_32}:0"))).unwrap();
    assert_eq!(
        id.resolve_addr(None, addr("[::1]:1"), 10)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    id.destroy();
}

#[test]
fn rdma_get_devices_returns_opened_contexts() {
    let devs = rdma_cm::get_devices().unwrap();
    assert!(!devs.is_empty());
    for d in &devs {
        d.query_device().unwrap();
    }
    let names: Vec<_> = devs.iter().map(|d| d.device().name().to_string()).collect();
    let list: Vec<_> = get_device_list()
        .unwrap()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, list);
}

#[test]
fn rdma_create_qp_default_pd_cqs_channels_and_caps() {
    let ip_36 = unique();
    let ip_35 = unique();
    let ch = EventChannel::new().unwrap();
    let a = resolved(&ch, PortSpace::Tcp, &format!("{ip_35}:1"));
    let b = resolved(&ch, PortSpace::Tcp, &format!("{ip_35}:1"));
    let unbound = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    let mut c = cap();
    assert_eq!(
        unbound.create_qp(None, &mut c).unwrap_err().errno(),
        libc::EINVAL
    );
    let mut c = QpCap {
        max_send_wr: 5,
        max_recv_wr: 3,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = a.create_qp(None, &mut c).unwrap();
    assert!(c.max_send_wr >= 5 && c.max_recv_wr >= 3);
    b.create_qp(None, &mut cap()).unwrap();
    // One default PD per device.
    assert!(Arc::ptr_eq(&a.pd().unwrap(), &b.pd().unwrap()));
    // Separate send and receive CQs, each with a channel, cq_context = the id's context.
    let (scq, rcq) = (a.send_cq().unwrap(), a.recv_cq().unwrap());
    assert!(!Arc::ptr_eq(&scq, &rcq));
    assert!(scq.cqe() >= 5 && rcq.cqe() >= 3);
    assert_eq!((scq.cq_context(), rcq.cq_context()), (9, 9));
    assert!(a.send_cq_channel().is_some() && a.recv_cq_channel().is_some());
    assert_eq!(qp.query_qp().unwrap().0.qp_state, QpState::Init);
    assert_eq!(qp.qp_type(), QpType::Rc);
    // One QP per id.
    assert_eq!(
        a.create_qp(None, &mut cap()).unwrap_err().errno(),
        libc::EINVAL
    );
    // A QP type that does not fit the port space.
    let mut attr = CmQpInitAttr {
        cap: cap(),
        qp_type: Some(QpType::Ud),
        ..Default::default()
    };
    a.destroy_qp();
    assert!(a.qp().is_none() && a.send_cq().is_none());
    assert_eq!(
        a.create_qp_ex(None, &mut attr).unwrap_err().errno(),
        libc::EINVAL
    );
    // The application's own PD and CQ.
    let ctx = a.verbs().unwrap();
    let pd = Arc::new(ctx.alloc_pd().unwrap());
    let cq = Arc::new(ctx.create_cq(16, 0, None, 0).unwrap());
    let mut attr = CmQpInitAttr {
        cap: cap(),
        send_cq: Some(cq.clone()),
        sq_sig_all: true,
        ..Default::default()
    };
    a.create_qp_ex(Some(&pd), &mut attr).unwrap();
    assert!(Arc::ptr_eq(&a.send_cq().unwrap(), &cq));
    assert!(a.send_cq_channel().is_none() && a.recv_cq_channel().is_some());
    assert!(Arc::ptr_eq(&a.pd().unwrap(), &pd));
    // A PD of another device.
    a.destroy_qp();
    let other = Device::from_addr(ip_36.parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    let opd = Arc::new(other.alloc_pd().unwrap());
    assert_eq!(
        a.create_qp(Some(&opd), &mut cap()).unwrap_err().errno(),
        libc::EINVAL
    );
    for id in [a, b, unbound] {
        id.destroy_qp();
        id.destroy();
    }
}

#[test]
fn rdma_create_qp_on_a_udp_id_is_ud_in_rts_with_the_rdma_cm_qkey() {
    let ip_37 = unique();
    let id = CmId::create(None, 0, PortSpace::Udp).unwrap();
    id.bind_addr(addr(&format!("{ip_37}:0"))).unwrap();
    let qp = id.create_qp(None, &mut cap()).unwrap();
    let (a, _) = qp.query_qp().unwrap();
    assert_eq!(
        (qp.qp_type(), a.qp_state, a.qkey),
        (QpType::Ud, QpState::Rts, RDMA_UDP_QKEY)
    );
    let (i, m) = id.init_qp_attr(QpState::Init).unwrap();
    assert_eq!(i.qkey, RDMA_UDP_QKEY);
    assert!(m.contains(QpAttrMask::QKEY));
    id.destroy_qp();
    id.destroy();
}

#[test]
fn rdma_create_srq_gives_the_id_an_srq_its_qp_uses() {
    let ip_38 = unique();
    let ch = EventChannel::new().unwrap();
    let id = resolved(&ch, PortSpace::Tcp, &format!("{ip_38}:1"));
    let mut a = SrqInitAttr {
        srq_context: 0,
        attr: SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    let srq = id.create_srq(None, &mut a).unwrap();
    assert_eq!(
        id.create_srq(None, &mut a).unwrap_err().errno(),
        libc::EINVAL
    );
    id.create_qp(None, &mut cap()).unwrap();
    // rdma_post_recv goes to the SRQ.
    let buf = Arc::new(Buffer::new(64));
    let mr = id.reg_msgs(&buf).unwrap();
    id.post_recv(1, buf.addr(), 64, &mr).unwrap();
    assert!(Arc::ptr_eq(&id.srq().unwrap(), &srq));
    drop(mr);
    id.destroy_qp();
    id.destroy_srq();
    assert!(id.srq().is_none());
    id.destroy();
}

#[test]
fn rdma_init_qp_attr_needs_a_device_and_the_peer() {
    let ip_38 = unique();
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        id.init_qp_attr(QpState::Init).unwrap_err().errno(),
        libc::EINVAL
    );
    id.bind_addr(addr(&format!("{ip_38}:0"))).unwrap();
    let (a, m) = id.init_qp_attr(QpState::Init).unwrap();
    assert_eq!(a.qp_state, QpState::Init);
    assert_eq!(
        m,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    );
    assert_eq!(
        id.init_qp_attr(QpState::Rtr).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        id.init_qp_attr(QpState::Sqd).unwrap_err().errno(),
        libc::EINVAL
    );
    id.destroy();
}

/// rping -q: both sides own their QPs; the CM only negotiates (CONNECT_RESPONSE,
/// rdma_establish, accept with qp_num, rdma_init_qp_attr).
#[test]
fn rdma_establish_and_init_qp_attr_connect_ids_without_a_qp() {
    let ip_39 = unique();
    const MSG: &[u8; 32] = b"own QPs, CM-negotiated..........";
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_39}:7300"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_39}:7300"));

    let own_qp = |id: &CmId| {
        let ctx = id.verbs().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, 0, None, 0).unwrap();
        let qp = pd
            .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, cap()))
            .unwrap();
        let (a, m) = id.init_qp_attr(QpState::Init).unwrap();
        qp.modify_qp(&a, m.bits()).unwrap();
        let buf = Arc::new(Buffer::new(32));
        let mr = pd
            .reg_buffer(&buf, (AccessFlags::LOCAL_WRITE).bits())
            .unwrap();
        (ctx, pd, cq, qp, buf, mr)
    };
    let move_rts = |id: &CmId, qp: &Qp| {
        for st in [QpState::Rtr, QpState::Rts] {
            let (a, m) = id.init_qp_attr(st).unwrap();
            qp.modify_qp(&a, m.bits()).unwrap();
        }
    };
    let cside = own_qp(&c);
    // No QP and no qp_num: EINVAL.
    assert_eq!(
        c.connect(&ConnParam::default()).unwrap_err().errno(),
        libc::EINVAL
    );
    c.connect(&ConnParam {
        qp_num: cside.3.qp_num(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(req.param.qp_num, cside.3.qp_num());
    let s = req.id.clone();
    req.ack();
    let sside = own_qp(&s);
    move_rts(&s, &sside.3);
    sside
        .3
        .post_recv(&[RecvWr {
            wr_id: 5,
            sg_list: &[Sge {
                addr: sside.4.addr(),
                length: 32,
                lkey: sside.5.lkey(),
            }],
        }])
        .unwrap();
    s.accept(&ConnParam {
        qp_num: sside.3.qp_num(),
        responder_resources: 1,
        initiator_depth: 1,
        ..Default::default()
    })
    .unwrap();
    let resp = expect(&cch, CmEventType::ConnectResponse);
    assert_eq!(resp.param.qp_num, sside.3.qp_num());
    resp.ack();
    move_rts(&c, &cside.3);
    // With a QP on the id, rdma_establish is refused; here it completes the handshake.
    c.establish().unwrap();
    assert_eq!(c.establish().unwrap_err().errno(), libc::EINVAL);
    expect(&sch, CmEventType::Established).ack();
    cside.4.write(0, MSG).unwrap();
    cside
        .3
        .post_send(&[SendWr {
            wr_id: 6,
            sg_list: &[Sge {
                addr: cside.4.addr(),
                length: 32,
                lkey: cside.5.lkey(),
            }],
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }])
        .unwrap();
    assert_eq!(wait_wc(&cside.2).status, WcStatus::Success);
    let wc = wait_wc(&sside.2);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (5, WcStatus::Success, 32)
    );
    let mut got = [0u8; 32];
    sside.4.read(0, &mut got).unwrap();
    assert_eq!(&got, MSG);
    c.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    expect(&sch, CmEventType::Disconnected).ack();
    for id in [c, s, l] {
        id.destroy();
    }
}

#[test]
fn rdma_connect_checks_private_data_and_resources() {
    let ip_40 = unique();
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, PortSpace::Tcp, &format!("{ip_40}:7301"));
    c.create_qp(None, &mut cap()).unwrap();
    let e = |p: ConnParam| c.connect(&p).unwrap_err().errno();
    assert_eq!(
        e(ConnParam {
            private_data: vec![0; 57],
            ..Default::default()
        }),
        libc::EINVAL
    );
    assert_eq!(
        e(ConnParam {
            responder_resources: 200,
            ..Default::default()
        }),
        libc::EINVAL
    );
    let fresh = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        fresh.connect(&ConnParam::default()).unwrap_err().errno(),
        libc::EINVAL
    );
    for id in [c, fresh] {
        id.destroy();
    }
}

/// 0xFF asks for the device maximum; the passive side sees the values swapped to its point
/// of view, and the accepted values are clipped to what was offered.
#[test]
fn rdma_connect_max_resources_and_the_request_parameters() {
    let ip_41 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_41}:7302"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_41}:7302"));
    c.create_qp(None, &mut cap()).unwrap();
    let max = c.verbs().unwrap().query_device().unwrap();
    c.connect(&ConnParam {
        private_data: vec![7; 56],
        responder_resources: RDMA_MAX_RESP_RES,
        initiator_depth: 2,
        retry_count: 5,
        rnr_retry_count: 6,
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.param.private_data[..56], &[7; 56][..]);
    // Our initiator depth is their responder resources, and the other way round.
    assert_eq!(req.param.responder_resources, 2);
    assert_eq!(
        u32::from(req.param.initiator_depth),
        max.max_qp_rd_atom.min(255)
    );
    assert_eq!((req.param.retry_count, req.param.rnr_retry_count), (5, 6));
    let s = req.id.clone();
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    // The listener cannot accept; the new id can.
    assert_eq!(
        l.accept(&ConnParam::default()).unwrap_err().errno(),
        libc::EINVAL
    );
    req.ack();
    s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam {
        responder_resources: RDMA_MAX_RESP_RES,
        initiator_depth: RDMA_MAX_INIT_DEPTH,
        private_data: vec![1; 196],
        ..Default::default()
    })
    .unwrap();
    let est = expect(&cch, CmEventType::Established);
    assert_eq!(&est.param.private_data[..196], &[1; 196][..]);
    // From our point of view: the peer reads from us at most as deep as we offered, and we
    // issue at most 2, as we asked.
    assert_eq!(
        (
            u32::from(est.param.responder_resources),
            est.param.initiator_depth
        ),
        (max.max_qp_rd_atom.min(255), 2)
    );
    est.ack();
    expect(&sch, CmEventType::Established).ack();
    let (sa, _) = s.qp().unwrap().query_qp().unwrap();
    assert_eq!(sa.max_dest_rd_atomic, 2);
    c.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    expect(&sch, CmEventType::Disconnected).ack();
    // Timewait ends on both sides.
    expect(&cch, CmEventType::TimewaitExit).ack();
    expect(&sch, CmEventType::TimewaitExit).ack();
    for id in [c, s, l] {
        id.destroy();
    }
}

/// The REP cannot move the client's QP (it was reset behind the CM's back):
/// CONNECT_ERROR, and the REJ it sends is seen by the passive side.
#[test]
fn rdma_connect_reports_connect_error_when_the_qp_cannot_move() {
    let ip_42 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_42}:7303"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_42}:7303"));
    let qp = c.create_qp(None, &mut cap()).unwrap();
    qp.modify_qp(
        &QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        },
        QpAttrMask::STATE.bits(),
    )
    .unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let s = req.id.clone();
    req.ack();
    s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    let ev = expect(&cch, CmEventType::ConnectError);
    assert!(ev.status < 0);
    ev.ack();
    let ev = expect(&sch, CmEventType::Rejected);
    assert_eq!(ev.status, 28);
    ev.ack();
    for id in [c, s, l] {
        id.destroy();
    }
}

#[test]
fn rdma_get_request_is_for_synchronous_listeners_only() {
    let ip_43 = unique();
    let ch = EventChannel::new().unwrap();
    let l = listener(&ch, PortSpace::Tcp, &format!("{ip_43}:7304"));
    assert_eq!(l.get_request().unwrap_err().errno(), libc::EINVAL);
    let s = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        s.get_request().unwrap_err().errno(),
        libc::EINVAL,
        "not listening"
    );
    for id in [l, s] {
        id.destroy();
    }
}

#[test]
fn rdma_destroy_id_of_a_listener_rejects_its_pending_requests() {
    let ip_43 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_43}:7305"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_43}:7305"));
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    // Wait until the request is queued, without taking it.
    let t = Instant::now();
    while !poll_readable(sch.fd()) {
        if t.elapsed() > Duration::from_secs(60) {
            // A hang guard, not a speed check: only something that never happens trips it.
            panic!("hung");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    l.destroy();
    let ev = expect(&cch, CmEventType::Rejected);
    assert_eq!(ev.status, 28);
    ev.ack();
    c.destroy();
    sch.destroy().unwrap();
}

/// UD: rdma_connect is a SIDR lookup, rdma_accept answers with the QPN and Q_Key, and the
/// two exchange datagrams with rdma_post_ud_send.
#[test]
fn rdma_connect_and_accept_on_udp_ids_use_sidr() {
    let ip_44 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Udp, &format!("{ip_44}:7306"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Udp, &format!("{ip_44}:7306"));
    c.create_qp(None, &mut cap()).unwrap();
    assert_eq!(
        c.connect(&ConnParam {
            private_data: vec![0; 181],
            ..Default::default()
        })
        .unwrap_err()
        .errno(),
        libc::EINVAL
    );
    c.connect(&ConnParam {
        private_data: vec![3; 180],
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.ud.as_ref().unwrap().private_data[..180], &[3; 180][..]);
    let s = req.id.clone();
    req.ack();
    assert_eq!(s.qp_type(), QpType::Ud);
    let sqp = s.create_qp(None, &mut cap()).unwrap();
    let sbuf = Arc::new(Buffer::new(40 + 64));
    let smr = s.reg_msgs(&sbuf).unwrap();
    s.post_recv(1, sbuf.addr(), 40 + 64, &smr).unwrap();
    s.accept(&ConnParam {
        private_data: b"sidr rep".to_vec(),
        ..Default::default()
    })
    .unwrap();
    let est = expect(&cch, CmEventType::Established);
    let ud = est.ud.clone().unwrap();
    est.ack();
    assert_eq!((ud.qp_num, ud.qkey), (sqp.qp_num(), RDMA_UDP_QKEY));
    assert_eq!(&ud.private_data[..8], b"sidr rep");
    let ah = c.pd().unwrap().create_ah(&ud.ah_attr).unwrap();
    let cbuf = Arc::new(Buffer::from_slice(&[9u8; 64]));
    let cmr = c.reg_msgs(&cbuf).unwrap();
    c.post_ud_send(
        2,
        cbuf.addr(),
        64,
        &cmr,
        SendFlags::SIGNALED,
        &ah,
        ud.qp_num,
    )
    .unwrap();
    assert_eq!(c.get_send_comp().unwrap().status, WcStatus::Success);
    let wc = s.get_recv_comp().unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 40 + 64)
    );
    let mut got = [0u8; 64];
    sbuf.read(40, &mut got).unwrap();
    assert_eq!(got, [9u8; 64]);
    // UD ids have no connection to tear down.
    assert_eq!(c.disconnect().unwrap_err().errno(), libc::EINVAL);
    drop((cmr, smr, ah));
    for id in [c, s, l] {
        id.destroy_qp();
        id.destroy();
    }
}

#[test]
fn rdma_reject_on_a_udp_id_and_no_listener_give_unreachable_with_the_sidr_status() {
    let ip_45 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Udp, &format!("{ip_45}:7307"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Udp, &format!("{ip_45}:7307"));
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    req.id.reject(b"no").unwrap();
    let s = req.id.clone();
    req.ack();
    let ev = expect(&cch, CmEventType::Unreachable);
    assert_eq!(ev.status, 2, "SIDR status 2: rejected");
    ev.ack();
    // Nobody listens on this port: status 1.
    let n = resolved(&cch, PortSpace::Udp, &format!("{ip_45}:7399"));
    n.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, CmEventType::Unreachable);
    assert_eq!(ev.status, 1, "SIDR status 1: service ID not supported");
    ev.ack();
    // A synchronous UD id fails rdma_connect with ECONNREFUSED.
    let sy = CmId::create(None, 0, PortSpace::Udp).unwrap();
    sy.resolve_addr(Some(client_src()), addr(&format!("{ip_45}:7399")), 2000)
        .unwrap();
    sy.resolve_route(2000).unwrap();
    assert_eq!(
        sy.connect(&ConnParam::default()).unwrap_err().errno(),
        libc::ECONNREFUSED
    );
    assert_eq!(sy.event().unwrap().event, CmEventType::Unreachable);
    for id in [c, s, l, n, sy] {
        id.destroy();
    }
}

#[test]
fn rdma_reject_ece_gives_reason_35() {
    let ip_46 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_46}:7308"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_46}:7308"));
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    req.id.reject_ece(&[]).unwrap();
    assert_eq!(
        req.id.reject(&[]).unwrap_err().errno(),
        libc::EINVAL,
        "once"
    );
    let s = req.id.clone();
    req.ack();
    assert_eq!(expect(&cch, CmEventType::Rejected).status, 35);
    for id in [c, s, l] {
        id.destroy();
    }
}

#[test]
fn rdma_join_multicast_checks_its_arguments() {
    let ip_47 = unique();
    let ch = EventChannel::new().unwrap();
    let tcp = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    tcp.bind_addr(addr(&format!("{ip_47}:0"))).unwrap();
    let g: IpAddr = softrdma::testing::unique_multicast_group().into();
    let e = |r: softrdma::Result<()>| r.unwrap_err().errno();
    assert_eq!(e(tcp.join_multicast(g, 0)), libc::EINVAL, "not a UD id");
    let unbound = CmId::create(Some(&ch), 0, PortSpace::Udp).unwrap();
    assert_eq!(e(unbound.join_multicast(g, 0)), libc::EINVAL, "not bound");
    let id = CmId::create(Some(&ch), 0, PortSpace::Udp).unwrap();
    id.bind_addr(addr(&format!("{ip_47}:0"))).unwrap();
    assert_eq!(
        e(id.join_multicast("127.0.0.1".parse().unwrap(), 0)),
        libc::EINVAL
    );
    assert_eq!(
        e(id.join_multicast("ff0e::1".parse().unwrap(), 0)),
        libc::EINVAL
    );
    let ex = |comp_mask, join_flags, addr| JoinMcAttrEx {
        comp_mask,
        join_flags,
        addr,
    };
    let both = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    assert_eq!(
        e(id.join_multicast_ex(&ex(RDMA_CM_JOIN_MC_ATTR_RESERVED, 0, Some(g)), 0)),
        libc::ENOTSUP
    );
    assert_eq!(
        e(id.join_multicast_ex(&ex(RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS, 0, Some(g)), 0)),
        libc::EINVAL
    );
    assert_eq!(
        e(id.join_multicast_ex(&ex(RDMA_CM_JOIN_MC_ATTR_ADDRESS, 0, Some(g)), 0)),
        libc::EINVAL
    );
    assert_eq!(
        e(id.join_multicast_ex(&ex(both, RDMA_MC_JOIN_FLAG_RESERVED, Some(g)), 0)),
        libc::EINVAL
    );
    assert_eq!(e(id.leave_multicast(g)), libc::EADDRNOTAVAIL);
    id.join_multicast(g, 77).unwrap();
    assert_eq!(e(id.join_multicast(g, 0)), libc::EADDRINUSE);
    let ev = expect(&ch, CmEventType::MulticastJoin);
    assert_eq!(ev.arg, 77);
    let ud = ev.ud.clone().unwrap();
    assert_eq!((ud.qp_num, ud.qkey), (MULTICAST_QPN, RDMA_UDP_QKEY));
    assert_eq!(ud.ah_attr.grh.dgid, Gid::from_ip(g));
    ev.ack();
    id.leave_multicast(g).unwrap();
    assert_eq!(e(id.leave_multicast(g)), libc::EADDRNOTAVAIL);
    for id in [tcp, unbound, id] {
        id.destroy();
    }
}

#[test]
fn rdma_join_multicast_attaches_the_qp_and_leave_detaches_it() {
    let ip_48 = unique();
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Udp).unwrap();
    id.bind_addr(addr(&format!("{ip_48}:0"))).unwrap();
    let qp = id.create_qp(None, &mut cap()).unwrap();
    let g: IpAddr = softrdma::testing::unique_multicast_group().into();
    let s: IpAddr = softrdma::testing::unique_multicast_group().into();
    id.join_multicast(g, 1).unwrap();
    id.join_multicast_ex(
        &JoinMcAttrEx {
            comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
            join_flags: RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
            addr: Some(s),
        },
        2,
    )
    .unwrap();
    expect(&ch, CmEventType::MulticastJoin).ack();
    expect(&ch, CmEventType::MulticastJoin).ack();
    // Attached to the full-member group, not to the send-only one: detaching shows which.
    assert_eq!(
        qp.detach_mcast(&Gid::from_ip(s), 0).unwrap_err().errno(),
        libc::EINVAL
    );
    qp.detach_mcast(&Gid::from_ip(g), 0).unwrap();
    qp.attach_mcast(&Gid::from_ip(g), 0).unwrap();
    id.leave_multicast(g).unwrap();
    assert_eq!(
        qp.detach_mcast(&Gid::from_ip(g), 0).unwrap_err().errno(),
        libc::EINVAL
    );
    id.leave_multicast(s).unwrap();
    id.destroy_qp();
    id.destroy();
}

/// A synchronous UDP id joins without an event channel: the call returns once joined.
#[test]
fn rdma_join_multicast_on_a_synchronous_id_blocks_until_joined() {
    let ip_49 = unique();
    let id = CmId::create(None, 0, PortSpace::Udp).unwrap();
    id.bind_addr(addr(&format!("{ip_49}:0"))).unwrap();
    let g: IpAddr = softrdma::testing::unique_multicast_group().into();
    id.join_multicast(g, 5).unwrap();
    let ev = id.event().unwrap();
    assert_eq!((ev.event, ev.arg), (CmEventType::MulticastJoin, 5));
    id.destroy(); // leaves the group
}

#[test]
fn rdma_create_ep_active_resolves_and_creates_the_qp_passive_keeps_the_attributes() {
    let ip_50 = unique();
    let ip_51 = unique();
    let passive = getaddrinfo(
        Some(ip_50.as_str()),
        Some("7310"),
        Some(&AddrInfoHints {
            ai_flags: RAI_PASSIVE,
            ..Default::default()
        }),
    )
    .unwrap();
    let mut attr = CmQpInitAttr {
        cap: cap(),
        sq_sig_all: true,
        ..Default::default()
    };
    let l = CmId::create_ep(&passive[0], None, Some(&mut attr)).unwrap();
    assert!(l.is_sync());
    assert_eq!(l.local_addr().unwrap(), addr(&format!("{ip_50}:7310")));
    assert!(l.qp().is_none(), "a passive endpoint has no QP itself");
    l.listen(1).unwrap();
    let mut res = getaddrinfo(Some(ip_50.as_str()), Some("7310"), None).unwrap();
    res[0].ai_src_addr = Some(addr(&format!("{ip_51}:0")));
    res[0].ai_connect = b"hdr:".to_vec();
    let mut attr = CmQpInitAttr {
        cap: cap(),
        ..Default::default()
    };
    let c = CmId::create_ep(&res[0], None, Some(&mut attr)).unwrap();
    assert_eq!(attr.qp_type, Some(QpType::Rc));
    assert!(c.qp().is_some() && c.send_cq_channel().is_some());
    assert_eq!(c.peer_addr().unwrap(), addr(&format!("{ip_50}:7310")));
    let t = std::thread::spawn(move || {
        let id = l.get_request().unwrap();
        let ev = id.event().unwrap();
        assert_eq!(&ev.param.private_data[..8], b"hdr:data");
        assert!(id.qp().is_some(), "rdma_get_request made the QP");
        id.accept(&ConnParam::default()).unwrap();
        id.disconnect().unwrap();
        id.destroy_ep();
        l.destroy_ep();
    });
    c.connect(&ConnParam {
        private_data: b"data".to_vec(),
        ..Default::default()
    })
    .unwrap();
    c.disconnect().unwrap();
    t.join().unwrap();
    c.destroy_ep();
}

#[test]
fn rdma_create_ep_fails_cleanly_without_an_address() {
    let ip_52 = unique();
    let mut res = getaddrinfo(Some(ip_52.as_str()), Some("1"), None).unwrap();
    res[0].ai_dst_addr = None;
    assert_eq!(
        CmId::create_ep(&res[0], None, None).unwrap_err().errno(),
        libc::EINVAL
    );
    res[0].ai_flags = RAI_PASSIVE;
    res[0].ai_src_addr = None;
    assert_eq!(
        CmId::create_ep(&res[0], None, None).unwrap_err().errno(),
        libc::EINVAL
    );
}

#[test]
fn rdma_resolve_addrinfo_and_query_addrinfo() {
    let ip_53 = unique();
    let ch = EventChannel::new().unwrap();
    let id = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(id.query_addrinfo().unwrap_err().errno(), libc::ENODATA);
    assert_eq!(
        id.resolve_addrinfo(None, None, None).unwrap_err().errno(),
        libc::EINVAL
    );
    id.resolve_addrinfo(Some(ip_53.as_str()), Some("7311"), None)
        .unwrap();
    expect(&ch, CmEventType::AddrinfoResolved).ack();
    let r = id.query_addrinfo().unwrap();
    assert_eq!(r[0].ai_dst_addr, Some(addr(&format!("{ip_53}:7311"))));
    let hints = AddrInfoHints {
        ai_flags: RAI_NUMERICHOST,
        ..Default::default()
    };
    id.resolve_addrinfo(Some("not-a-number.invalid"), Some("1"), Some(&hints))
        .unwrap();
    let ev = expect(&ch, CmEventType::AddrinfoError);
    assert!(ev.status < 0);
    ev.ack();
    id.destroy();
}

/// A removed device: every id bound to it gets DEVICE_REMOVAL, its QP flushes, the device's
/// context reports IBV_EVENT_DEVICE_FATAL; ids of other devices are untouched.
#[test]
fn rdma_cm_event_device_removal_reaches_every_id_of_the_device() {
    let ip_54 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_54}:7312"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_54}:7312"));
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let s = req.id.clone();
    req.ack();
    let sqp = s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established).ack();
    expect(&sch, CmEventType::Established).ack();
    let n = rdma_cm::inject_device_removal(ip_54.parse().unwrap());
    assert_eq!(n, 2, "the listener and the accepted id");
    let got = [
        expect(&sch, CmEventType::DeviceRemoval).id.clone(),
        expect(&sch, CmEventType::DeviceRemoval).id.clone(),
    ];
    assert!(got.contains(&l) && got.contains(&s));
    assert_eq!(sqp.query_qp().unwrap().0.qp_state, QpState::Err);
    let ev = s.verbs().unwrap().get_async_event().unwrap();
    assert_eq!(ev.event_type(), EventType::DeviceFatal);
    ev.ack();
    // The client's device is another one: nothing for it.
    cch.set_nonblocking(true).unwrap();
    assert_eq!(cch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    for id in [s, l, c] {
        id.destroy();
    }
}

/// A join whose attach fails (here the 57th QP of one device on one group, beyond
/// max_mcast_qp_attach) arrives as MULTICAST_ERROR with the errno; leaving it works.
#[test]
fn rdma_join_multicast_reports_multicast_error_when_the_attach_fails() {
    let ip_55 = unique();
    let ch = EventChannel::new().unwrap();
    let g: IpAddr = softrdma::testing::unique_multicast_group().into();
    let mut ids = Vec::new();
    let limit = Device::from_addr(ip_55.parse().unwrap())
        .unwrap()
        .open()
        .unwrap()
        .query_device()
        .unwrap()
        .max_mcast_qp_attach as usize;
    for i in 0..=limit {
        let id = CmId::create(Some(&ch), i as u64, PortSpace::Udp).unwrap();
        id.bind_addr(addr(&format!("{ip_55}:0"))).unwrap();
        id.create_qp(None, &mut cap()).unwrap();
        id.join_multicast(g, i as u64).unwrap();
        let ev = ch.get_cm_event().unwrap();
        if i < limit {
            assert_eq!(ev.event, CmEventType::MulticastJoin, "{ev:?}");
        } else {
            assert_eq!(ev.event, CmEventType::MulticastError);
            assert_eq!(ev.status, -libc::ENOMEM);
            assert_eq!(ev.arg, i as u64, "the join context");
        }
        ev.ack();
        ids.push(id);
    }
    for id in ids {
        id.leave_multicast(g).unwrap();
        id.destroy_qp();
        id.destroy();
    }
}

/// Synchronous ids on both sides, the data moved with the rdma_verbs.h helpers: sendv/recvv
/// with two-entry lists, write and writev into the peer's rdma_reg_write region, read and
/// readv from its rdma_reg_read region, dereg_mr.
#[test]
fn rdma_post_read_write_and_the_vector_helpers() {
    let ip_56 = unique();
    let ip_57 = unique();
    let l = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    l.bind_addr(addr(&format!("{ip_56}:7313"))).unwrap();
    l.listen(1).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(u64, u32, u64, u32)>();
    let server = std::thread::spawn(move || {
        let id = l.get_request().unwrap();
        id.create_qp(None, &mut cap2()).unwrap();
        let target = Arc::new(Buffer::new(64));
        let source = Arc::new(Buffer::from_slice(&[0x5a; 64]));
        let wmr = id.reg_write(&target).unwrap();
        let rmr = id.reg_read(&source).unwrap();
        let msg = Arc::new(Buffer::new(16));
        let mmr = id.reg_msgs(&msg).unwrap();
        id.post_recvv(
            1,
            &[
                Sge {
                    addr: msg.addr(),
                    length: 8,
                    lkey: mmr.lkey(),
                },
                Sge {
                    addr: msg.addr() + 8,
                    length: 8,
                    lkey: mmr.lkey(),
                },
            ],
        )
        .unwrap();
        id.accept(&ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            ..Default::default()
        })
        .unwrap();
        tx.send((target.addr(), wmr.rkey(), source.addr(), rmr.rkey()))
            .unwrap();
        let wc = id.get_recv_comp().unwrap();
        assert_eq!((wc.wr_id, wc.byte_len), (1, 16));
        let mut got = [0u8; 16];
        msg.read(0, &mut got).unwrap();
        assert_eq!(&got, b"done: wrote 64 B");
        let mut t = [0u8; 64];
        target.read(0, &mut t).unwrap();
        assert_eq!(&t[..32], &[1u8; 32][..]);
        assert_eq!(&t[32..], &[2u8; 32][..]);
        id.disconnect().unwrap();
        for mr in [wmr, rmr, mmr] {
            CmId::dereg_mr(mr).unwrap();
        }
        id.destroy_ep();
        l.destroy();
    });
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.resolve_addr(
        Some(addr(&format!("{ip_57}:0"))),
        addr(&format!("{ip_56}:7313")),
        2000,
    )
    .unwrap();
    id.resolve_route(2000).unwrap();
    id.create_qp(None, &mut cap2()).unwrap();
    id.connect(&ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let (taddr, wkey, saddr, rkey) = rx.recv().unwrap();
    let buf = Arc::new(Buffer::new(128));
    buf.write(0, &[1u8; 32]).unwrap();
    buf.write(32, &[2u8; 16]).unwrap();
    buf.write(48, &[2u8; 16]).unwrap();
    let mr = id.reg_msgs(&buf).unwrap();
    let s = SendFlags::SIGNALED;
    id.post_write(1, buf.addr(), 32, &mr, s, taddr, wkey)
        .unwrap();
    id.post_writev(
        2,
        &[
            Sge {
                addr: buf.addr() + 32,
                length: 16,
                lkey: mr.lkey(),
            },
            Sge {
                addr: buf.addr() + 48,
                length: 16,
                lkey: mr.lkey(),
            },
        ],
        s,
        taddr + 32,
        wkey,
    )
    .unwrap();
    id.post_read(3, buf.addr() + 64, 32, &mr, s, saddr, rkey)
        .unwrap();
    id.post_readv(
        4,
        &[Sge {
            addr: buf.addr() + 96,
            length: 32,
            lkey: mr.lkey(),
        }],
        s,
        saddr + 32,
        rkey,
    )
    .unwrap();
    for want in 1..=4 {
        let wc = id.get_send_comp().unwrap();
        assert_eq!((wc.wr_id, wc.status), (want, WcStatus::Success));
    }
    let mut r = [0u8; 64];
    buf.read(64, &mut r).unwrap();
    assert_eq!(r, [0x5a; 64]);
    // A buffer outside the region is refused before anything is posted.
    assert_eq!(
        id.post_write(9, buf.addr() + 100, 64, &mr, s, taddr, wkey)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    buf.write(0, b"done: wrote 64 B").unwrap();
    id.post_sendv(
        5,
        &[
            Sge {
                addr: buf.addr(),
                length: 6,
                lkey: mr.lkey(),
            },
            Sge {
                addr: buf.addr() + 6,
                length: 10,
                lkey: mr.lkey(),
            },
        ],
        s,
    )
    .unwrap();
    assert_eq!(id.get_send_comp().unwrap().wr_id, 5);
    id.disconnect().unwrap();
    server.join().unwrap();
    drop(mr);
    id.destroy_ep();
}

/// rdma_notify(COMM_EST): the passive side is established without waiting for the RTU.
#[test]
fn rdma_notify_comm_est_establishes_the_passive_side() {
    let ip_58 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_58}:7314"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_58}:7314"));
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let s = req.id.clone();
    req.ack();
    assert_eq!(
        s.notify(EventType::CommEst).unwrap_err().errno(),
        libc::EINVAL,
        "not accepted yet"
    );
    s.create_qp(None, &mut cap()).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    // Either the RTU or the notification establishes; the other is EISCONN or harmless.
    match s.notify(EventType::CommEst) {
        Ok(()) => {}
        Err(e) => assert_eq!(e.errno(), libc::EISCONN),
    }
    expect(&sch, CmEventType::Established).ack();
    expect(&cch, CmEventType::Established).ack();
    assert_eq!(
        s.notify(EventType::CommEst).unwrap_err().errno(),
        libc::EISCONN
    );
    s.notify(EventType::SqDrained).unwrap();
    for id in [c, s, l] {
        id.destroy();
    }
}

/// An id dropped without rdma_destroy_id (say its thread panicked) still answers: the
/// pending request is rejected, so the peer learns at once instead of after its retries.
#[test]
fn rdma_destroy_id_is_implied_when_the_last_handle_goes() {
    let ip_59 = unique();
    let sch = EventChannel::new().unwrap();
    let l = listener(&sch, PortSpace::Tcp, &format!("{ip_59}:7315"));
    let cch = EventChannel::new().unwrap();
    let c = resolved(&cch, PortSpace::Tcp, &format!("{ip_59}:7315"));
    c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    drop(req); // acknowledges the event and drops the last handle of the new id
    let ev = expect(&cch, CmEventType::Rejected);
    assert_eq!(ev.status, 28);
    ev.ack();
    for id in [c, l] {
        id.destroy();
    }
}

/// rdma_listen's backlog: a request beyond the untaken ones the backlog allows is dropped
/// unanswered; the peer's CM retries it, and once the application took the first, the
/// retried request comes through.
#[test]
fn rdma_listen_backlog_drops_requests_beyond_it_until_the_peer_retries() {
    let ip_34 = unique();
    let sch = EventChannel::new().unwrap();
    let l = CmId::create(Some(&sch), 1, PortSpace::Tcp).unwrap();
    l.bind_addr(addr(&format!("{ip_34}:7316"))).unwrap();
    l.listen(1).unwrap();
    let ctx = l.verbs().unwrap();
    let cch = EventChannel::new().unwrap();
    let a = resolved(&cch, PortSpace::Tcp, &format!("{ip_34}:7316"));
    let b = resolved(&cch, PortSpace::Tcp, &format!("{ip_34}:7316"));
    for id in [&a, &b] {
        id.create_qp(None, &mut cap()).unwrap();
        id.connect(&ConnParam::default()).unwrap();
    }
    // Both REQs reached the server's CM; one waits for the application, one was dropped.
    let t = Instant::now();
    while ctx.cm_stats().cm.received.req < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the REQs did not arrive"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // (The CM counts a REQ as pending when it takes it; the dispatch to the listener, which
    // drops the one beyond the backlog, follows a moment later.)
    let t = Instant::now();
    while ctx.cm_stats().pending_reqs != 1 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ctx.cm_stats().pending_reqs, 1);
    sch.set_nonblocking(true).unwrap();
    let first = sch.get_cm_event().unwrap();
    assert_eq!(first.event, CmEventType::ConnectRequest);
    assert_eq!(sch.get_cm_event().unwrap_err().errno(), libc::EAGAIN);
    sch.set_nonblocking(false).unwrap();
    // The dropped one is retried by its CM and now fits.
    let second = expect(&sch, CmEventType::ConnectRequest);
    assert_ne!(first.id, second.id);
    for ev in [first, second] {
        ev.id.reject(&[]).unwrap();
        let id = ev.id.clone();
        ev.ack();
        id.destroy();
    }
    for _ in 0..2 {
        assert_eq!(expect(&cch, CmEventType::Rejected).status, 28);
    }
    for id in [a, b, l] {
        id.destroy();
    }
}

/// An asynchronous RC id from `src` connects to `dst`, which does not answer: the id gets
/// UNREACHABLE with `status`, its QP in ERR. Returns the channel and the id.
fn connect_expecting_unreachable(src: &str, dst: &str, status: i32) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let c = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    c.resolve_addr(Some(addr(src)), addr(dst), 2000).unwrap();
    expect(&ch, CmEventType::AddrResolved).ack();
    c.resolve_route(2000).unwrap();
    expect(&ch, CmEventType::RouteResolved).ack();
    let qp = c.create_qp(None, &mut cap()).unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventType::Unreachable);
    assert_eq!(ev.status, status);
    ev.ack();
    assert_eq!(qp.query_qp().unwrap().0.qp_state, QpState::Err);
    (ch, c)
}

/// Nobody answers the REQ (something holds the RoCEv2 port there but never replies, so no
/// ICMP error comes back either): the CM retries it as rdma_cm does (15 retries of the
/// 4-second CM response timeout), then UNREACHABLE with -ETIMEDOUT, the QP in ERR. This test
/// takes that long, on purpose: it is the real timer.
#[test]
fn rdma_connect_to_an_address_nobody_answers_ends_unreachable() {
    let ip_29 = unique();
    let ip_28 = unique();
    let _black_hole = std::net::UdpSocket::bind(format!("{ip_29}:4791")).unwrap();
    let (ch, c) = connect_expecting_unreachable(
        &format!("{ip_28}:0"),
        &format!("{ip_29}:7317"),
        -libc::ETIMEDOUT,
    );
    drop(ch);
    let stats = c.verbs().unwrap().cm_stats();
    // The first REQ and its 15 retransmissions (sent counts them all).
    assert_eq!((stats.cm.sent.req, stats.cm.retransmitted.req), (16, 15));
    c.destroy();
}

/// No RoCEv2 device at the address at all: the peer's kernel answers the REQ's datagram
/// with ICMP port unreachable; toward this host the REQ is sent again five times, sooner
/// each time than its timer would (a device may be starting there), and each draws the same
/// answer, so the connection fails within a third of a second (UNREACHABLE with -ECONNREFUSED; a
/// synchronous id's rdma_connect fails with ECONNREFUSED) instead of after 98 seconds of
/// retries.
#[test]
fn rdma_connect_where_no_device_listens_is_refused_after_quick_retries() {
    let ip_26 = unique();
    let ip_27 = unique();
    let (_ch, c) = connect_expecting_unreachable(
        &format!("{ip_26}:0"),
        &format!("{ip_27}:7317"),
        -libc::ECONNREFUSED,
    );
    let ctx = c.verbs().unwrap();
    let refusals = u64::from(softrdma_proto::cm::REFUSED_RETRIES);
    assert!(ctx.counters().icmp_errors > refusals);
    assert_eq!(
        ctx.cm_stats().cm.retransmitted.req,
        refusals,
        "one resend per refusal before the last"
    );
    c.destroy();

    // The synchronous face: rdma_connect itself fails with ECONNREFUSED.
    let s = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    s.resolve_addr(
        Some(addr(&format!("{ip_26}:0"))),
        addr(&format!("{ip_27}:7318")),
        2000,
    )
    .unwrap();
    s.resolve_route(2000).unwrap();
    s.create_qp(None, &mut cap()).unwrap();
    assert_eq!(
        s.connect(&ConnParam::default()).unwrap_err().errno(),
        libc::ECONNREFUSED
    );
    s.destroy();
}
