//! The typed face: slices of registered memory and remote regions in work requests, zero-copy
//! views of buffers, completions turned into errors, inline sends without a region, and
//! `rdma_destroy_qp` letting go of the PD.

use softrdma::rdma_cm::{CmId, ConnParam, PortSpace};
use softrdma::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// An address of this test process's own: 127.<net>.<pid>.
fn ip(net: u8) -> IpAddr {
    let pid = std::process::id();
    IpAddr::from([127, net, (pid >> 8) as u8, pid as u8])
}

const CAP: QpCap = QpCap {
    max_send_wr: 8,
    max_recv_wr: 8,
    max_send_sge: 2,
    max_recv_sge: 2,
    max_inline_data: 64,
};

fn param(private_data: Vec<u8>) -> ConnParam {
    ConnParam {
        private_data,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// A connected pair of synchronous ids on `net` (server) and `net + 1` (client). The server
/// exposes a 4096-byte buffer (REMOTE_READ and REMOTE_WRITE) in its accept's private data and
/// posts one receive into a 64-byte buffer first.
struct Pair {
    client: CmId,
    server: CmId,
    peer: RemoteMr,
    sbuf: Arc<Buffer>,
    _smr: Mr,
    msg: Arc<Buffer>,
    _msg_mr: Mr,
}

fn connect(net: u8) -> Pair {
    let listener = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(ip(net), 0)).unwrap();
    listener.listen(1).unwrap();
    let dst = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let id = listener.get_request().unwrap();
        let mut cap = CAP;
        id.create_qp(None, &mut cap).unwrap();
        let sbuf = Arc::new(Buffer::from_slice(&[0x5a; 4096]));
        let smr = id
            .pd()
            .unwrap()
            .reg_buffer(
                &sbuf,
                (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
                    .bits(),
            )
            .unwrap();
        let msg = Arc::new(Buffer::new(64));
        let msg_mr = id.reg_msgs(&msg).unwrap();
        id.recv(1, &msg_mr.slice(..).unwrap()).unwrap();
        id.accept(&param(smr.remote().to_bytes().to_vec())).unwrap();
        (id, sbuf, smr, msg, msg_mr, listener)
    });
    let client = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(Some(SocketAddr::new(ip(net + 1), 0)), dst, 2000)
        .unwrap();
    client.resolve_route(2000).unwrap();
    let mut cap = CAP;
    client.create_qp(None, &mut cap).unwrap();
    client.connect(&param(Vec::new())).unwrap();
    let peer = RemoteMr::from_bytes(&client.event().unwrap().param.private_data).unwrap();
    let (server, sbuf, smr, msg, msg_mr, _listener) = server.join().unwrap();
    Pair {
        client,
        server,
        peer,
        sbuf,
        _smr: smr,
        msg,
        _msg_mr: msg_mr,
    }
}

#[test]
fn typed_write_read_send_and_a_failed_completion_as_an_error() {
    let p = connect(81);
    assert_eq!(p.peer.len, 4096);
    let id = &p.client;
    let data = Arc::new(Buffer::new(4096));
    data.write(0, b"typed RDMA WRITE").unwrap();
    let mr = id.reg_msgs(&data).unwrap();

    // WRITE 16 bytes to offset 100 of the peer's region.
    id.write(
        1,
        &mr.slice(0..16).unwrap(),
        p.peer.slice(100..).unwrap(),
        SendFlags::SIGNALED,
    )
    .unwrap();
    let wc = id.get_send_comp().unwrap().ok().unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::RdmaWrite));
    let mut got = [0; 16];
    p.sbuf.read(100, &mut got).unwrap();
    assert_eq!(&got, b"typed RDMA WRITE");

    // READ it back elsewhere through a sub-slice.
    id.read(
        2,
        &mr.slice(1000..1016).unwrap(),
        p.peer.slice(100..116).unwrap(),
        SendFlags::SIGNALED,
    )
    .unwrap();
    id.get_send_comp().unwrap().check().unwrap();
    data.read(1000, &mut got).unwrap();
    assert_eq!(&got, b"typed RDMA WRITE");

    // Too long for the remote range: refused at post time, nothing sent.
    let e = id
        .write(
            3,
            &mr.slice(0..200).unwrap(),
            p.peer.slice(4000..).unwrap(),
            SendFlags::SIGNALED,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = id
        .read(
            3,
            &mr.slice(0..200).unwrap(),
            p.peer.slice(..100).unwrap(),
            SendFlags::SIGNALED,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);

    // A wrong rkey: the completion reports the failure, and ok() makes it an error.
    let bogus = RemoteMr {
        rkey: p.peer.rkey ^ 1,
        ..p.peer
    };
    id.write(4, &mr.slice(0..8).unwrap(), bogus, SendFlags::SIGNALED)
        .unwrap();
    let wc = id.get_send_comp().unwrap();
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    let e = wc.ok().unwrap_err();
    assert_eq!(e.wc_status(), Some(WcStatus::RemAccessErr));
    assert_eq!(e.kind(), ErrorKind::Completion(WcStatus::RemAccessErr));
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("remote access error"), "{e}");
}

#[test]
fn inline_sends_without_a_region_as_librdmacm_allows() {
    let p = connect(83);
    let id = &p.client;
    // Bytes registered nowhere: send_inline copies them at post time.
    let on_stack = *b"inline, unregistered";
    id.send_inline(7, &on_stack, SendFlags::SIGNALED).unwrap();
    id.get_send_comp().unwrap().check().unwrap();
    let wc = p.server.get_recv_comp().unwrap().ok().unwrap();
    assert_eq!(wc.byte_len as usize, on_stack.len());
    let mut got = [0; 20];
    p.msg.read(0, &mut got).unwrap();
    assert_eq!(&got, &on_stack);

    // rdma_post_send(id, ctx, addr, len, NULL, IBV_SEND_INLINE): accepted when the bytes lie
    // in a region of the id's PD, found by address.
    let buf = Arc::new(Buffer::from_slice(b"registered, no MR passed"));
    let mr = id.reg_msgs(&buf).unwrap();
    p.server.recv(2, &p._msg_mr.slice(..).unwrap()).unwrap();
    id.post_send(
        8,
        buf.addr() + 12,
        12,
        None,
        SendFlags::INLINE | SendFlags::SIGNALED,
    )
    .unwrap();
    id.get_send_comp().unwrap().check().unwrap();
    p.server.get_recv_comp().unwrap().check().unwrap();
    let mut got = [0; 12];
    p.msg.read(0, &mut got).unwrap();
    assert_eq!(&got, b"no MR passed");
    drop(mr);

    // Without INLINE, or for bytes in no region, EINVAL as before.
    let e = id
        .post_send(9, buf.addr(), 4, None, SendFlags::SIGNALED)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = id
        .post_send(9, on_stack.as_ptr() as u64, 4, None, SendFlags::INLINE)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // Longer than max_inline_data: EINVAL.
    let e = id
        .send_inline(10, &[0; 4096], SendFlags::empty())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn destroy_qp_lets_go_of_the_pd_for_rpings_teardown_order() {
    let id = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(ip(85), 0)).unwrap();
    let ctx = id.verbs().unwrap();
    let pd = Arc::new(ctx.alloc_pd().unwrap());
    let mut cap = CAP;
    let qp = id.create_qp(Some(&pd), &mut cap).unwrap();
    assert!(id.pd().is_some());
    // rping: rdma_destroy_qp, ibv_destroy_cq (the CM's own here), ibv_dealloc_pd, then
    // rdma_destroy_id.
    id.destroy_qp();
    drop(qp);
    assert!(id.pd().is_none());
    let pd = Arc::try_unwrap(pd).expect("the id holds no handle of the PD any more");
    pd.dealloc().unwrap();
    id.destroy();
}

#[test]
fn buffer_views_only_while_nothing_can_write_the_buffer() {
    let ctx = Device::from_addr(ip(86)).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = Arc::new(Buffer::new(64));
    // Registered nowhere: mutable in place.
    Arc::get_mut(&mut buf).unwrap().as_mut_slice()[..4].copy_from_slice(b"abcd");

    // A region the device may only read: views are fine, and registration goes on.
    let ro = pd
        .reg_buffer(&buf, AccessFlags::REMOTE_READ.bits())
        .unwrap();
    let v = buf.view().unwrap();
    assert_eq!(&v[..4], b"abcd");
    let v2 = buf.view().unwrap(); // several views at once
    let ro2 = pd.reg_buffer(&buf, 0).unwrap();
    // While a view lives: no region the device could write through, no program writes.
    for access in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    ] {
        let e = pd.reg_buffer(&buf, access.bits()).unwrap_err();
        assert_eq!(e.errno(), libc::EBUSY, "{access:?}");
    }
    assert_eq!(buf.write(0, b"x").unwrap_err().errno(), libc::EBUSY);
    assert_eq!(buf.fill(0).unwrap_err().errno(), libc::EBUSY);
    assert_eq!(buf.store_u64(8, 1).unwrap_err().errno(), libc::EBUSY);
    let mut out = [0; 4];
    buf.read(0, &mut out).unwrap(); // reads go on
    assert_eq!(&out, b"abcd");
    drop((v, v2));
    buf.write(0, b"A").unwrap();

    // A region with LOCAL_WRITE: no view until it is deregistered.
    let rw = pd
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .unwrap();
    assert_eq!(buf.view().unwrap_err().errno(), libc::EBUSY);
    let rw2 = pd
        .reg_buffer(
            &buf,
            (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).bits(),
        )
        .unwrap();
    drop(rw);
    assert_eq!(
        buf.view().unwrap_err().errno(),
        libc::EBUSY,
        "rw2 is still there"
    );
    rw2.dereg().unwrap();
    assert_eq!(&buf.view().unwrap()[..4], b"Abcd");
    drop((ro, ro2));
    assert!(Arc::get_mut(&mut buf).is_some(), "no region holds it");
}

#[test]
fn typed_slices_check_their_ranges() {
    let ctx = Device::from_addr(ip(87)).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let buf = Arc::new(Buffer::new(256));
    let mr = pd
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .unwrap();
    let s = mr.slice(16..=31).unwrap();
    assert_eq!(
        (s.addr(), s.len(), s.lkey()),
        (buf.addr() + 16, 16, mr.lkey())
    );
    assert_eq!(
        s.sge(),
        Sge {
            addr: buf.addr() + 16,
            length: 16,
            lkey: mr.lkey()
        }
    );
    assert!(mr.slice(..).unwrap().len() == 256);
    assert!(mr.slice(..257).is_err());
    let (hi, lo) = (200, 100);
    assert!(mr.slice(hi..lo).is_err());
    assert!(s.slice(8..17).is_err());
    assert_eq!(s.slice(8..).unwrap().addr(), buf.addr() + 24);
    let r = mr.remote();
    assert_eq!((r.addr, r.len, r.rkey), (buf.addr(), 256, mr.rkey()));
    assert!(r.slice(u64::MAX..).is_err());
    assert!(RemoteMr::from_bytes(
        &RemoteMr {
            addr: u64::MAX,
            len: 2,
            rkey: 1
        }
        .to_bytes()
    )
    .is_err());

    // Atomics: an 8-byte result slice and an aligned 8-byte remote word.
    let res = mr.slice(8..16).unwrap();
    let wr = SendWr::fetch_add(1, &res, r.slice(16..24).unwrap(), 5).unwrap();
    assert_eq!(
        (wr.opcode, wr.compare_add, wr.remote_addr),
        (WrOpcode::AtomicFetchAndAdd, 5, buf.addr() + 16)
    );
    assert!(
        SendWr::fetch_add(1, &res, r.slice(12..20).unwrap(), 5).is_err(),
        "misaligned"
    );
    assert!(
        SendWr::fetch_add(1, &res, r.slice(16..20).unwrap(), 5).is_err(),
        "short"
    );
    assert!(SendWr::compare_swap(1, &mr.slice(8..12).unwrap(), r, 1, 2).is_err());
    let wr = SendWr::compare_swap(2, &res, r, 1, 2).unwrap();
    assert_eq!(
        (wr.opcode, wr.compare_add, wr.swap),
        (WrOpcode::AtomicCmpAndSwp, 1, 2)
    );
    let list = [s, res];
    let wr = SendWr::send(3, &list).with_imm(9).signaled();
    assert_eq!(
        (wr.opcode, wr.imm_data, wr.sg_list.len()),
        (WrOpcode::SendWithImm, 9, 2)
    );
    assert_eq!(RecvWr::new(4, &list).sg_list[1], res.sge());
}
