//! The connection manager (librdmacm) over IB CM MADs on QP 1: resolve, connect, accept,
//! reject, no listener, data over the connected QPs, disconnect — with the events of each.

use softrdma::rdma_cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::*;
use std::net::SocketAddr;
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
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

/// This binary's client device address: the source the clients resolve from (without one,
/// the route to a loopback destination would give 127.0.0.1, which other programs use).
fn client_src() -> SocketAddr {
    static A: std::sync::OnceLock<std::net::IpAddr> = std::sync::OnceLock::new();
    SocketAddr::new(*A.get_or_init(|| unique().parse().unwrap()), 0)
}

fn client(ch: &EventChannel, dst: &str, data: &[u8]) -> CmId {
    let id = CmId::create(Some(ch), 7, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(client_src()), addr(dst), 2000)
        .unwrap();
    expect(ch, CmEventType::AddrResolved).ack();
    assert!(id.verbs().is_some(), "bound to a device");
    id.resolve_route(2000).unwrap();
    expect(ch, CmEventType::RouteResolved).ack();
    let mut c = cap();
    id.create_qp(None, &mut c).unwrap();
    id.connect(&ConnParam {
        private_data: data.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    id
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
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Registers a `len`-byte buffer in the default PD of `id` and posts it to `qp` as receive
/// `wr_id`; returns the buffer and its region (keep them while the receive may complete).
fn post_recv_buffer(id: &CmId, qp: &Qp, len: usize, wr_id: u64) -> (Arc<Buffer>, Mr) {
    let buf = Arc::new(Buffer::new(len));
    let mr = id
        .pd()
        .unwrap()
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .unwrap();
    let sge = [Sge {
        addr: buf.addr(),
        length: len as u32,
        lkey: mr.lkey(),
    }];
    qp.post_recv(&[RecvWr {
        wr_id,
        sg_list: &sge,
    }])
    .unwrap();
    (buf, mr)
}

/// Sends `data` on the QP of `id` (a signaled SEND, wr_id 1) and returns its completion.
fn send_and_wait(id: &CmId, data: &[u8]) -> WorkCompletion {
    let buf = Arc::new(Buffer::from_slice(data));
    let mr = id.pd().unwrap().reg_buffer(&buf, 0).unwrap();
    let sge = [Sge {
        addr: buf.addr(),
        length: data.len() as u32,
        lkey: mr.lkey(),
    }];
    id.qp()
        .unwrap()
        .post_send(&[SendWr {
            wr_id: 1,
            sg_list: &sge,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }])
        .unwrap();
    wait_wc(&id.send_cq().unwrap())
}

#[test]
fn rdma_connect_accept_send_and_disconnect() {
    let ip_21 = unique();
    let sch = EventChannel::new().unwrap();
    let listen = CmId::create(Some(&sch), 1, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(&format!("{ip_21}:7471"))).unwrap();
    listen.listen(8).unwrap();

    let cch = EventChannel::new().unwrap();
    let cid = client(&cch, &format!("{ip_21}:7471"), b"hi server");

    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.param.private_data[..9], b"hi server");
    assert_eq!(req.listen_id.as_ref().unwrap().context(), 1);
    let sid = req.id.clone();
    assert_eq!(sid.local_addr().unwrap(), addr(&format!("{ip_21}:7471")));
    let mut c = cap();
    let sqp = sid.create_qp(None, &mut c).unwrap();
    let scq = sid.recv_cq().unwrap();
    // A receive for the client's SEND, in the default PD the QP was created in.
    let (sbuf, _smr) = post_recv_buffer(&sid, &sqp, 4096, 5);
    req.ack();
    sid.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let est = expect(&cch, CmEventType::Established);
    assert_eq!(&est.param.private_data[..7], b"welcome");
    est.ack();
    expect(&sch, CmEventType::Established).ack();
    assert_eq!(cid.qp().unwrap().state(), QpState::Rts);
    assert_eq!(sqp.state(), QpState::Rts);

    // Data over the connection the CM set up.
    assert_eq!(
        send_and_wait(&cid, b"over the CM's connection").status,
        WcStatus::Success
    );
    let r = wait_wc(&scq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (5, WcStatus::Success, 24));
    let mut got = [0u8; 24];
    sbuf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over the CM's connection");

    // Disconnect from the client: both sides get DISCONNECTED.
    cid.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    expect(&sch, CmEventType::Disconnected).ack();
    cid.destroy();
    sid.destroy();
    listen.destroy();
}

#[test]
fn rdma_connect_to_a_port_nobody_listens_on_is_rejected_with_status_8() {
    let ip_22 = unique();
    let ch = EventChannel::new().unwrap();
    // ip_22 is a running device (its CM answers on QP 1) but nothing listens on port 9.
    let dev = Device::from_addr(ip_22.parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    dev.local_udp_addr().unwrap();
    let id = client(&ch, &format!("{ip_22}:9"), b"");
    let ev = expect(&ch, CmEventType::Rejected);
    assert_eq!(ev.status, 8);
    ev.ack();
    id.destroy();
}

#[test]
fn rdma_reject_reaches_the_peer_as_status_28_with_private_data() {
    let ip_23 = unique();
    let sch = EventChannel::new().unwrap();
    let listen = CmId::create(Some(&sch), 0, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(&format!("{ip_23}:7000"))).unwrap();
    listen.listen(1).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = client(&cch, &format!("{ip_23}:7000"), b"please");
    let req = expect(&sch, CmEventType::ConnectRequest);
    req.id.reject(b"no thanks").unwrap();
    let rid = req.id.clone();
    req.ack();
    let ev = expect(&cch, CmEventType::Rejected);
    assert_eq!(ev.status, 28);
    assert_eq!(&ev.param.private_data[..9], b"no thanks");
    ev.ack();
    cid.destroy();
    rid.destroy();
    listen.destroy();
}

#[test]
fn rdma_bind_addr_rules() {
    let ip_24 = unique();
    let ch = EventChannel::new().unwrap();
    let a = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    a.bind_addr(addr(&format!("{ip_24}:7100"))).unwrap();
    let b = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        b.bind_addr(addr(&format!("{ip_24}:7100")))
            .unwrap_err()
            .errno(),
        libc::EADDRINUSE
    );
    assert_eq!(
        a.bind_addr(addr(&format!("{ip_24}:7101")))
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    let c = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    c.bind_addr(addr(&format!("{ip_24}:0"))).unwrap();
    assert_ne!(c.local_addr().unwrap().port(), 0, "ephemeral port");
    let d = CmId::create(Some(&ch), 0, PortSpace::Tcp).unwrap();
    assert_eq!(
        d.bind_addr(addr("192.0.2.1:7100")).unwrap_err().errno(),
        libc::EADDRNOTAVAIL
    );
    let u = CmId::create(Some(&ch), 0, PortSpace::Udp).unwrap();
    assert_eq!(u.qp_type(), QpType::Ud);
    // Port spaces are separate: the UDP id may take the TCP id's port.
    u.bind_addr(addr(&format!("{ip_24}:7100"))).unwrap();
    u.destroy();
    let ch2 = ch.clone();
    a.destroy();
    // The port is free again once its id is destroyed.
    b.bind_addr(addr(&format!("{ip_24}:7100"))).unwrap();
    for id in [b, c, d] {
        id.destroy();
    }
    ch2.destroy().unwrap();
}

/// rdma-core's rdma_server / rdma_client, with synchronous ids and the rdma_verbs helpers.
#[test]
fn rdma_get_request_and_the_verbs_helpers_with_synchronous_ids() {
    let ip_25 = unique();
    let listen = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    assert!(listen.is_sync());
    listen.bind_addr(addr(&format!("{ip_25}:7471"))).unwrap();
    listen.listen(1).unwrap();
    let server = std::thread::spawn(move || {
        let id = listen.get_request().unwrap();
        assert!(id.is_sync());
        let ev = id.event().unwrap();
        assert_eq!(
            (ev.event, &ev.param.private_data[..3]),
            (CmEventType::ConnectRequest, &b"cli"[..])
        );
        let mut c = cap();
        id.create_qp(None, &mut c).unwrap();
        let buf = Arc::new(Buffer::new(16));
        let mr = id.reg_msgs(&buf).unwrap();
        id.post_recv(1, buf.addr(), 16, &mr).unwrap();
        id.accept(&ConnParam::default()).unwrap(); // blocks until ESTABLISHED
        let wc = id.get_recv_comp().unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (1, WcStatus::Success, 16)
        );
        id.post_send(2, buf.addr(), 16, Some(&mr), SendFlags::SIGNALED)
            .unwrap();
        assert_eq!(id.get_send_comp().unwrap().status, WcStatus::Success);
        // Both sides disconnect, as rdma_server and rdma_client do; whoever is second gets
        // the DISCONNECTED the first one caused.
        id.disconnect().unwrap();
        assert_eq!(id.event().unwrap().event, CmEventType::Disconnected);
        drop(mr);
        id.destroy();
        listen.destroy();
    });
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(client_src()), addr(&format!("{ip_25}:7471")), 2000)
        .unwrap();
    id.resolve_route(2000).unwrap();
    let mut c = cap();
    id.create_qp(None, &mut c).unwrap();
    let buf = Arc::new(Buffer::from_slice(b"0123456789abcdef"));
    let mr = id.reg_msgs(&buf).unwrap();
    id.post_recv(7, buf.addr(), 16, &mr).unwrap();
    id.connect(&ConnParam {
        private_data: b"cli".to_vec(),
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap(); // blocks until ESTABLISHED
    id.post_send(8, buf.addr(), 16, Some(&mr), SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(id.get_send_comp().unwrap().wr_id, 8);
    let wc = id.get_recv_comp().unwrap();
    assert_eq!((wc.wr_id, wc.byte_len), (7, 16));
    id.disconnect().unwrap();
    server.join().unwrap();
    drop(mr);
    id.destroy();
}

/// A connection whose client has sent one message (completed: the server's device has it)
/// to the server's one posted receive, then disconnected; the client's DISCONNECTED is
/// taken. Returns the server's id (its QP and receive CQ hold the message), its channel, and
/// what must stay alive meanwhile.
struct OneMessageThenGone {
    sid: CmId,
    sch: EventChannel,
    sbuf: Arc<Buffer>,
    _keep: (CmId, CmId, EventChannel, Mr),
}

fn one_message_then_disconnect() -> OneMessageThenGone {
    let ip = unique();
    let sch = EventChannel::new().unwrap();
    let listen = CmId::create(Some(&sch), 1, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(&format!("{ip}:7471"))).unwrap();
    listen.listen(8).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = client(&cch, &format!("{ip}:7471"), b"");
    let req = expect(&sch, CmEventType::ConnectRequest);
    let sid = req.id.clone();
    let mut c = cap();
    let sqp = sid.create_qp(None, &mut c).unwrap();
    let (sbuf, smr) = post_recv_buffer(&sid, &sqp, 64, 9);
    req.ack();
    sid.accept(&ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    expect(&cch, CmEventType::Established).ack();
    expect(&sch, CmEventType::Established).ack();
    assert_eq!(send_and_wait(&cid, b"last words").status, WcStatus::Success);
    cid.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected).ack();
    OneMessageThenGone {
        sid,
        sch,
        sbuf,
        _keep: (cid, listen, cch, smr),
    }
}

/// Whether `fd` is readable within a minute (a hang guard, never a speed check).
fn readable_soon(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 60_000) == 1 }
}

/// A program that polls its CQ and reads its events in turn, and destroys its QP when the
/// peer disconnects (libfabric 1.17's rxm does), must not learn of the disconnection before
/// it has polled the peer's last message: destroying the QP would take that completion out
/// of the CQ. The DISCONNECTED event, queued (the channel is readable), waits while the
/// message is unpolled and the CQ is being polled, then goes at once.
#[test]
fn disconnected_waits_until_the_peers_last_message_is_polled() {
    let s = one_message_then_disconnect();
    s.sch.set_nonblocking(true).unwrap();
    assert!(readable_soon(s.sch.fd()), "no DISCONNECTED queued");
    let scq = s.sid.recv_cq().unwrap();
    // A poll that takes nothing: the program is polling.
    assert_eq!(scq.poll(&mut []).unwrap(), 0);
    let e = s.sch.get_cm_event().unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    let r = wait_wc(&scq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 10));
    let mut got = [0u8; 10];
    s.sbuf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"last words");
    // Now it goes, without waiting.
    let ev = s.sch.get_cm_event().unwrap();
    assert_eq!(ev.event, CmEventType::Disconnected);
    ev.ack();
    assert_eq!(s.sid.qp().unwrap().state(), QpState::Err);
    s.sid.destroy();
}

/// A program that polls the non-blocking descriptor of its channel (poll(2), an async
/// runtime) while a DISCONNECTED is held for its QP's unpolled message does not spin: the
/// descriptor is readable again only when a CQ gives up completions or a few ms later, so
/// the program wakes a bounded number of times (a few hundred at most in the 1 s the hold may
/// last; with the descriptor left readable it woke without a pause, hundreds of thousands of
/// times), then gets the event, and the message is still there.
#[test]
fn a_held_disconnected_does_not_keep_a_polled_descriptor_readable() {
    let s = one_message_then_disconnect();
    s.sch.set_nonblocking(true).unwrap();
    let scq = s.sid.recv_cq().unwrap();
    let mut wakes = 0u32;
    let ev = loop {
        // The program polls its CQ (taking nothing: it keeps the hold on) and its channel.
        assert_eq!(scq.poll(&mut []).unwrap(), 0);
        assert!(readable_soon(s.sch.fd()), "the held event never came");
        match s.sch.get_cm_event() {
            Ok(ev) => break ev,
            Err(e) => {
                assert_eq!(e.errno(), libc::EAGAIN, "{e}");
                wakes += 1;
            }
        }
    };
    assert_eq!(ev.event, CmEventType::Disconnected);
    ev.ack();
    assert!(wakes < 2000, "{wakes} wake-ups for one held event");
    let r = wait_wc(&scq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 10));
    s.sid.destroy();
}

/// A program that waits for the event before it polls its CQ gets it all the same (once
/// nobody has polled the CQ for a while), and the message is still there to poll.
#[test]
fn disconnected_reaches_a_program_that_waits_for_it_before_polling() {
    let s = one_message_then_disconnect();
    expect(&s.sch, CmEventType::Disconnected).ack();
    let r = wait_wc(&s.sid.recv_cq().unwrap());
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 10));
    s.sid.destroy();
}

/// Two ids at a time binding and listening on one port of two addresses, over and over, in
/// two threads: each checks the other's use of the port while it holds its own id, and
/// neither waits for the other (they once could, for ever). A hang guard, not a speed check.
#[test]
fn binding_and_listening_on_one_port_of_two_addresses_at_once_never_deadlocks() {
    let (tx, rx) = std::sync::mpsc::channel();
    for ip in [unique(), unique()] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for _ in 0..500 {
                let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
                id.bind_addr(addr(&format!("{ip}:7480"))).unwrap();
                id.listen(1).unwrap();
                id.destroy();
            }
            tx.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("the two threads wait for each other");
    }
}
