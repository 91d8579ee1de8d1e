//! The async face (feature `tokio`) and the `_timeout` variants of the blocking waits:
//! connect and accept, completions matched by wr_id, cancelled futures followed by
//! successful ones, timeouts that lose nothing, a peer's disconnect as an error, and the
//! async_echo example. Every test uses loopback addresses of its own (127.30-79.x.y from the
//! process id and a counter); every wait is bounded by a hang guard.

use softrdma::rdma_cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use softrdma::tokio::{conn_param, default_cap, AsyncConn, AsyncEventChannel, AsyncListener};
use softrdma::{Buffer, RecvWr, Sge};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A loopback address no other process uses (see `softrdma::testing`).
fn unique_addr() -> Ipv4Addr {
    softrdma::testing::unique_loopback_addr()
}

/// Hang guard: generous, only there so that a bug fails instead of hanging CI.
const GUARD: Duration = Duration::from_secs(60);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .expect("hang guard expired")
}

/// Connects from an address of this test's own (the route's source for a loopback
/// destination would be 127.0.0.1, which other processes on the machine use).
async fn connect(addr: SocketAddr) -> softrdma::Result<AsyncConn> {
    let src = SocketAddr::new(unique_addr().into(), 0);
    AsyncConn::connect_with(Some(src), addr, default_cap(), conn_param()).await
}

/// A listener on an address of its own, and a connected pair (server side, client side).
async fn pair() -> (AsyncListener, AsyncConn, AsyncConn) {
    let listener = AsyncListener::bind((unique_addr(), 0).into(), 8).unwrap();
    let addr = listener.local_addr().unwrap();
    let (s, c) = guard(async { tokio::join!(listener.accept(), connect(addr)) }).await;
    (listener, s.unwrap(), c.unwrap())
}

/// A buffer holding `data`, registered for local and remote reads and writes.
fn buf_mr(conn: &AsyncConn, data: &[u8]) -> (Arc<Buffer>, softrdma::Mr) {
    use softrdma::AccessFlags as A;
    let b = Arc::new(Buffer::from_slice(data));
    let access = A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ;
    let mr = conn
        .id()
        .pd()
        .unwrap()
        .reg_buffer(&b, access.bits())
        .unwrap();
    (b, mr)
}

#[test]
fn send_recv_write_and_read_return_their_own_completions() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (sbuf, smr) = buf_mr(&server, &[0u8; 64]);
        let (cbuf, cmr) = buf_mr(&client, b"0123456789abcdef");
        // SEND / RECV (the send may beat the receive: rnr_retry_count 7 waits for it).
        let (r, s) = guard(async {
            tokio::join!(server.qp().recv(&smr, 0..64), client.qp().send(&cmr, 0..16))
        })
        .await;
        let (r, s) = (r.unwrap(), s.unwrap());
        assert_eq!(r.byte_len, 16);
        assert_eq!(r.opcode, softrdma::WcOpcode::Recv);
        assert_eq!(s.opcode, softrdma::WcOpcode::Send);
        assert_eq!(&sbuf.to_vec()[..16], b"0123456789abcdef");
        // RDMA WRITE into the server's region, RDMA READ back from it.
        cbuf.write(0, b"WRITTEN-BY-CLIENT").unwrap_or(());
        let w = guard(
            client
                .qp()
                .write(&cmr, 0..8, smr.remote().slice(32..).unwrap()),
        )
        .await
        .unwrap();
        assert_eq!((w.opcode, w.byte_len), (softrdma::WcOpcode::RdmaWrite, 8));
        assert_eq!(&sbuf.to_vec()[32..40], &cbuf.to_vec()[..8]);
        let rd = guard(client.qp().read(&cmr, 8..16, smr.remote()))
            .await
            .unwrap();
        assert_eq!((rd.opcode, rd.byte_len), (softrdma::WcOpcode::RdmaRead, 8));
        assert_eq!(&cbuf.to_vec()[8..16], b"01234567");
        // A range outside the region: EINVAL before anything is posted.
        let e = client.qp().send(&cmr, 0..4097).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        guard(client.disconnect()).await.unwrap();
        guard(server.disconnect()).await.unwrap();
    });
}

#[test]
fn concurrent_requests_from_many_tasks_each_get_their_own_completion() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (server, client) = (Arc::new(server), Arc::new(client));
        const N: usize = 12;
        let (sbuf, smr) = buf_mr(&server, &[0u8; N * 8]);
        let (_cbuf, cmr) = buf_mr(&client, &[7u8; N * 8]);
        let smr = Arc::new(smr);
        let cmr = Arc::new(cmr);
        let mut tasks = Vec::new();
        for i in 0..N {
            let (client, cmr) = (client.clone(), cmr.clone());
            let at = smr.remote().slice((i * 8) as u64..).unwrap();
            tasks.push(tokio::spawn(async move {
                // Each task writes its own 8 bytes (i + 1 of them from the source).
                client.qp().write(&cmr, i * 8..i * 8 + i % 8 + 1, at).await
            }));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, t) in tasks.into_iter().enumerate() {
            let wc = guard(t).await.unwrap().unwrap();
            assert_eq!(
                wc.byte_len as usize,
                i % 8 + 1,
                "task {i} got another's completion"
            );
            assert!(ids.insert(wc.wr_id), "wr_id {:#x} twice", wc.wr_id);
        }
        let got = sbuf.to_vec();
        for i in 0..N {
            let want = i % 8 + 1;
            assert!(got[i * 8..i * 8 + want].iter().all(|&b| b == 7), "slot {i}");
        }
        assert_eq!(client.qp().send_cq().discarded(), 0);
        drop(smr);
    });
}

#[test]
fn a_dropped_recv_still_takes_a_message_whose_completion_is_discarded() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (sbuf, smr) = buf_mr(&server, &[0u8; 16]);
        let (cbuf, cmr) = buf_mr(&client, b"one.");
        // Posted, then dropped by the timeout while waiting.
        let t = tokio::time::timeout(Duration::from_millis(20), server.qp().recv(&smr, 0..8));
        assert!(t.await.is_err(), "nothing was sent yet");
        // The first message lands in the dropped receive; the next receive gets the second.
        assert_eq!(
            guard(client.qp().send(&cmr, 0..4)).await.unwrap().opcode,
            softrdma::WcOpcode::Send
        );
        cbuf.write(0, b"two!").unwrap();
        let (r, s) = guard(async {
            tokio::join!(server.qp().recv(&smr, 8..16), client.qp().send(&cmr, 0..4))
        })
        .await;
        assert_eq!(s.unwrap().opcode, softrdma::WcOpcode::Send);
        assert_eq!(r.unwrap().byte_len, 4);
        assert_eq!(&sbuf.to_vec()[..4], b"one.");
        assert_eq!(&sbuf.to_vec()[8..12], b"two!");
        assert_eq!(server.qp().recv_cq().discarded(), 1);
        // Nothing of it reaches next_completion.
        let t = tokio::time::timeout(
            Duration::from_millis(20),
            server.qp().recv_cq().next_completion(),
        );
        assert!(t.await.is_err());
    });
}

#[test]
fn a_dropped_recv_whose_region_is_freed_fails_without_touching_the_memory() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (sbuf, smr) = buf_mr(&server, &[0u8; 16]);
        let (_cbuf, cmr) = buf_mr(&client, b"into freed memory");
        let t = tokio::time::timeout(Duration::from_millis(20), server.qp().recv(&smr, 0..16));
        assert!(t.await.is_err());
        // The future is gone: the region can be deregistered and the buffer freed while the
        // receive is still posted.
        drop(smr);
        drop(sbuf);
        // The message finds no region: the responder refuses it, the sender's request fails,
        // and no byte is written anywhere.
        let e = guard(client.qp().send(&cmr, 0..17)).await.unwrap_err();
        assert_ne!(e.errno(), 0);
        // The server's QP is in the error state: its next receive is flushed, after the
        // dropped receive's completion, which was discarded.
        let (_b2, mr2) = buf_mr(&server, &[0u8; 16]);
        let e = guard(server.qp().recv(&mr2, 0..16)).await.unwrap_err();
        assert_eq!(e.errno(), libc::ECONNRESET);
        assert_eq!(server.qp().recv_cq().discarded(), 1);
    });
}

#[test]
fn a_dropped_send_still_goes_and_the_next_send_succeeds() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (sbuf, smr) = buf_mr(&server, &[0u8; 16]);
        let (_cbuf, cmr) = buf_mr(&client, b"firstsecond");
        // A zero timeout polls the send once (posting it) and drops it.
        let t = tokio::time::timeout(Duration::ZERO, client.qp().send(&cmr, 0..5)).await;
        assert!(t.is_err(), "a send cannot complete without the peer's ACK");
        let r1 = guard(server.qp().recv(&smr, 0..8)).await.unwrap();
        assert_eq!(r1.byte_len, 5);
        let (r2, s2) = guard(async {
            tokio::join!(server.qp().recv(&smr, 8..16), client.qp().send(&cmr, 5..11))
        })
        .await;
        assert_eq!(s2.unwrap().opcode, softrdma::WcOpcode::Send);
        assert_eq!(r2.unwrap().byte_len, 6);
        assert_eq!(&sbuf.to_vec()[..5], b"first");
        assert_eq!(&sbuf.to_vec()[8..14], b"second");
        // Completions are in order: the dropped send's came first and was discarded.
        assert_eq!(client.qp().send_cq().discarded(), 1);
    });
}

#[test]
fn next_completion_takes_requests_posted_directly_and_survives_a_drop() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (_sbuf, smr) = buf_mr(&server, &[0u8; 16]);
        let (_cbuf, cmr) = buf_mr(&client, b"raw");
        let rcq = server.qp().recv_cq();
        let t = tokio::time::timeout(Duration::from_millis(20), rcq.next_completion());
        assert!(t.await.is_err());
        let sge = [Sge {
            addr: smr.iova(),
            length: 16,
            lkey: smr.lkey(),
        }];
        server
            .qp()
            .qp()
            .post_recv(&[RecvWr {
                wr_id: 77,
                sg_list: &sge,
            }])
            .unwrap();
        let (wc, s) =
            guard(async { tokio::join!(rcq.next_completion(), client.qp().send(&cmr, 0..3)) })
                .await;
        assert_eq!(s.unwrap().opcode, softrdma::WcOpcode::Send);
        let wc = wc.unwrap();
        assert_eq!((wc.wr_id, wc.byte_len), (77, 3));
    });
}

#[test]
fn a_peer_disconnect_fails_pending_requests_and_surfaces_as_an_event() {
    rt().block_on(async {
        let (_l, server, client) = pair().await;
        let (_sbuf, smr) = buf_mr(&server, &[0u8; 16]);
        let server = Arc::new(server);
        let s2 = server.clone();
        let pending = tokio::spawn(async move {
            let r = s2.qp().recv(&smr, 0..16).await;
            (r, smr)
        });
        // Let the receive be posted before the peer leaves.
        tokio::time::sleep(Duration::from_millis(20)).await;
        guard(client.disconnect()).await.unwrap();
        let (r, _smr) = guard(pending).await.unwrap();
        assert_eq!(r.unwrap_err().errno(), libc::ECONNRESET);
        let ev = guard(server.cm().next_event()).await.unwrap();
        assert_eq!(ev.event, CmEventType::Disconnected);
        ev.ack();
        // Our own disconnect after the peer's returns at once.
        guard(server.disconnect()).await.unwrap();
        // A request after the disconnect fails too (flushed).
        let (_b, mr) = buf_mr(&client, b"late");
        let e = guard(client.qp().send(&mr, 0..4)).await.unwrap_err();
        assert_eq!(e.errno(), libc::ECONNRESET);
    });
}

#[test]
fn connect_is_refused_without_a_listener_or_when_the_peer_rejects() {
    rt().block_on(async {
        let ip = unique_addr();
        // The device exists (a listener on another port starts it) but nobody listens on 9.
        let listener = AsyncListener::bind((ip, 0).into(), 8).unwrap();
        let e = guard(connect((ip, 9).into())).await.unwrap_err();
        assert_eq!(e.errno(), libc::ECONNREFUSED);
        // The server takes the request and rejects it.
        let addr = listener.local_addr().unwrap();
        let (req, c) = guard(async {
            tokio::join!(
                async {
                    let req = listener.get_request().await.unwrap();
                    req.id().reject(b"no").unwrap();
                    req
                },
                connect(addr)
            )
        })
        .await;
        assert_eq!(c.unwrap_err().errno(), libc::ECONNREFUSED);
        req.destroy();
    });
}

#[test]
fn a_dropped_connect_goes_on_and_a_dropped_request_rejects_its_peer() {
    rt().block_on(async {
        use softrdma::tokio::AsyncCmId;
        let listener = AsyncListener::bind((unique_addr(), 0).into(), 8).unwrap();
        let addr = listener.local_addr().unwrap();
        // A connect dropped after its REQ went out: the outcome arrives as an event.
        let id = AsyncCmId::new(PortSpace::Tcp, 0).unwrap();
        let src = SocketAddr::new(unique_addr().into(), 0);
        guard(id.resolve(Some(src), addr)).await.unwrap();
        let qp = id.create_qp(&mut default_cap()).unwrap();
        let t = tokio::time::timeout(Duration::ZERO, id.connect(conn_param())).await;
        assert!(t.is_err(), "nobody accepted yet");
        let req = guard(listener.get_request()).await.unwrap();
        let rqp = req.create_qp(&mut default_cap()).unwrap();
        let (acc, ev) =
            guard(async { tokio::join!(req.accept(conn_param()), id.next_event()) }).await;
        acc.unwrap();
        let ev = ev.unwrap();
        assert_eq!(ev.event, CmEventType::Established);
        ev.ack();
        let (client, server) = (
            AsyncConn::from_parts(id, qp),
            AsyncConn::from_parts(req, rqp),
        );
        let (_sb, smr) = buf_mr(&server, &[0u8; 8]);
        let (_cb, cmr) = buf_mr(&client, b"ok");
        let (r, s) = guard(async {
            tokio::join!(server.qp().recv(&smr, 0..8), client.qp().send(&cmr, 0..2))
        })
        .await;
        assert_eq!(s.unwrap().opcode, softrdma::WcOpcode::Send);
        assert_eq!(r.unwrap().byte_len, 2);
        // A request taken and dropped without an answer: the peer is rejected.
        let c = tokio::spawn(connect(addr));
        let req = guard(listener.get_request()).await.unwrap();
        drop(req);
        let e = guard(c).await.unwrap().unwrap_err();
        assert_eq!(e.errno(), libc::ECONNREFUSED);
    });
}

#[test]
fn a_dropped_get_request_loses_no_request() {
    rt().block_on(async {
        let listener = AsyncListener::bind((unique_addr(), 0).into(), 8).unwrap();
        let addr = listener.local_addr().unwrap();
        let t = tokio::time::timeout(Duration::from_millis(20), listener.get_request());
        assert!(t.await.is_err());
        // The client's REQ waits in the listener's channel until a later call takes it.
        let (s, c) = guard(async {
            let client = connect(addr);
            let server = async {
                let req = listener.get_request().await.unwrap();
                let qp = req.create_qp(&mut default_cap()).unwrap();
                req.accept(conn_param()).await.unwrap();
                AsyncConn::from_parts(req, qp)
            };
            tokio::join!(server, client)
        })
        .await;
        let c = c.unwrap();
        assert_eq!(s.id().peer_addr(), c.id().local_addr());
    });
}

#[test]
fn a_dropped_next_event_loses_no_event() {
    rt().block_on(async {
        let ch = AsyncEventChannel::new(EventChannel::new().unwrap()).unwrap();
        let id = CmId::create(Some(ch.channel()), 5, PortSpace::Tcp).unwrap();
        let t = tokio::time::timeout(Duration::from_millis(20), ch.next_event());
        assert!(t.await.is_err());
        id.write_cm_event(CmEventType::User, 0, 1).unwrap();
        id.write_cm_event(CmEventType::User, 0, 2).unwrap();
        for want in [1, 2] {
            let ev = guard(ch.next_event()).await.unwrap();
            assert_eq!(ev.arg, want);
            ev.ack();
        }
        id.destroy();
    });
}

#[test]
fn blocking_timeouts_fail_with_etimedout_and_lose_nothing() {
    let ip = unique_addr();
    let listener = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    listener.bind_addr((ip, 0).into()).unwrap();
    listener.listen(4).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let e = listener
        .get_request_timeout(Duration::from_millis(20))
        .unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT);

    // The server takes the request but accepts only once the client's bounded connect has
    // timed out; the client then finds ESTABLISHED on its id's channel.
    let (timed_out_tx, timed_out_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let id = listener.get_request_timeout(GUARD).unwrap();
        let mut cap = default_cap();
        id.create_qp(None, &mut cap).unwrap();
        let buf = Arc::new(Buffer::new(16));
        let mr = id.reg_msgs(&buf).unwrap();
        timed_out_rx.recv_timeout(GUARD).unwrap();
        id.accept(&conn_param()).unwrap();
        // Nothing to receive yet.
        let e = id
            .get_recv_comp_timeout(Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(e.errno(), libc::ETIMEDOUT);
        id.post_recv(1, mr.addr(), 16, &mr).unwrap();
        let wc = id.get_recv_comp_timeout(GUARD).unwrap();
        assert_eq!((wc.wr_id, wc.byte_len), (1, 5));
        assert_eq!(&buf.to_vec()[..5], b"hello");
        (id, listener, mr)
    });
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    let src = SocketAddr::new(unique_addr().into(), 0);
    id.resolve_addr(Some(src), addr, 2000).unwrap();
    id.resolve_route(2000).unwrap();
    let mut cap = default_cap();
    id.create_qp(None, &mut cap).unwrap();
    let e = id
        .connect_timeout(&conn_param(), Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT);
    timed_out_tx.send(()).unwrap();
    let ev = id.channel().get_cm_event_timeout(GUARD).unwrap();
    assert_eq!(ev.event, CmEventType::Established);
    ev.ack();
    // No send posted: nothing to wait for.
    let e = id
        .get_send_comp_timeout(Duration::from_millis(20))
        .unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT);
    let buf = Arc::new(Buffer::from_slice(b"hello"));
    let mr = id.reg_msgs(&buf).unwrap();
    id.post_send(2, mr.addr(), 5, Some(&mr), softrdma::SendFlags::SIGNALED)
        .unwrap();
    let wc = id.get_send_comp_timeout(GUARD).unwrap();
    assert_eq!(wc.wr_id, 2);
    let (sid, listener, _smr) = server.join().unwrap();
    drop(mr);
    id.disconnect().unwrap();
    id.destroy();
    sid.destroy();
    listener.destroy();
}

#[test]
fn connect_param_default_has_no_rnr_retries_the_async_face_has_seven() {
    assert_eq!(ConnParam::default().rnr_retry_count, 0);
    assert_eq!(conn_param().rnr_retry_count, 7);
}

/// The example, as two processes: the server serves two clients at once.
#[test]
fn async_echo_example_echoes_for_two_clients() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().unwrap();
    let ex = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("async_echo");
    assert!(ex.exists(), "{} is missing", ex.display());
    let (sip, c1, c2) = (unique_addr(), unique_addr(), unique_addr());
    let port = 7000 + (std::process::id() % 1000) as u16;
    let mut server = Command::new(&ex)
        .args(["server", &sip.to_string(), &port.to_string(), "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    let client = |bind: Ipv4Addr, n: &str, size: &str| {
        Command::new(&ex)
            .args(["client", &sip.to_string(), &port.to_string()])
            .args(["-b", &bind.to_string(), "-n", n, "-S", size])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (client(c1, "20", "100"), client(c2, "5", "4096"));
    let wait = |mut c: std::process::Child, what: &str| {
        let t = std::time::Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t.elapsed() > GUARD {
                let _ = c.kill();
                panic!("{what} hangs");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    };
    let (a, b) = (wait(a, "client 1"), wait(b, "client 2"));
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
    };
    assert!(a.status.success(), "client 1: {}", text(&a));
    assert!(text(&a).contains("20 messages of 100 bytes echoed"));
    assert!(b.status.success(), "client 2: {}", text(&b));
    assert!(text(&b).contains("5 messages of 4096 bytes echoed"));
    server.stdout = Some(out.into_inner());
    let s = wait(server, "server");
    let st = text(&s);
    assert!(s.status.success(), "server: {st}");
    assert!(st.contains("echoed 20 messages"), "{st}");
    assert!(st.contains("echoed 5 messages"), "{st}");
}
