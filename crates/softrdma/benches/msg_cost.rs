//! The CPU cost of one small message through the whole data path, both ends on one
//! application thread (each device's progress thread exists, idle while that thread polls):
//! two devices of this process joined by a same-host lane (or the wire, with
//! `SOFTRDMA_TRANSPORT=wire`), an RC QP each; one thread posts a batch of 8-byte SENDs on one
//! side, polls the other side's CQ for their receives (reposting each), then polls the send
//! completions. With no second thread the figure is the sum of the sender's and the
//! receiver's work per message, free of scheduling; under `valgrind --tool=callgrind` it is an
//! instruction count that does not move from run to run.
//!
//!     cargo bench -p softrdma --bench msg_cost              # ns per message
//!     MSGS=200000 valgrind --tool=callgrind target/release/deps/msg_cost-*  # instructions
//!
//! (`MSGS` sets the number of messages; without `--bench`, as `cargo test --benches` runs
//! it, a few batches only.)
//!
//! Prints the messages, the time and ns per message.

use softrdma::*;
use std::sync::Arc;
use std::time::Instant;

const BATCH: u64 = 64;
const ACCESS: u32 = AccessFlags::LOCAL_WRITE.bits() | AccessFlags::REMOTE_WRITE.bits();

struct Side {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    _buf: Arc<Buffer>,
    mr: Mr,
    addr: std::net::IpAddr,
}

fn side() -> Side {
    let addr: std::net::IpAddr = softrdma::testing::unique_loopback_addr().into();
    let ctx = Device::from_addr(addr).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096, 0, None, 0).unwrap();
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, cap))
        .unwrap();
    let buf = Arc::new(Buffer::new(4096));
    let mr = pd.reg_buffer(&buf, ACCESS).unwrap();
    Side {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        _buf: buf,
        mr,
        addr,
    }
}

fn connect(me: &Side, peer: &Side) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ACCESS,
        ..Default::default()
    };
    let m =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    me.qp.modify_qp(&init, m.bits()).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::for_ip(peer.addr),
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: peer.qp.qp_num(),
        rq_psn: 1,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..init
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    me.qp.modify_qp(&rtr, m.bits()).unwrap();
}

fn to_rts(me: &Side) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 1,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    me.qp.modify_qp(&rts, m.bits()).unwrap();
}

fn sge(s: &Side, off: u64) -> Sge {
    Sge {
        addr: s.mr.addr() + off,
        length: 8,
        lkey: s.mr.lkey(),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; run otherwise (`cargo test --benches`), it is a smoke
    // test of a few batches.
    let bench = std::env::args().any(|a| a == "--bench");
    let msgs: u64 = std::env::var("MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 2_000_000 } else { BATCH * 10 });
    let (a, b) = (side(), side());
    connect(&a, &b);
    connect(&b, &a);
    to_rts(&a);
    to_rts(&b);
    let recv = |wr_id: u64| {
        let l = [sge(&b, 64 + wr_id % BATCH * 8)];
        b.qp.post_recv(&[RecvWr { wr_id, sg_list: &l }]).unwrap();
    };
    for i in 0..BATCH * 2 {
        recv(i);
    }
    let mut wc = [WorkCompletion::default(); 64];
    let run = |n: u64, wc: &mut [WorkCompletion]| {
        let mut sent = 0;
        while sent < n {
            let l = [sge(&a, 0)];
            for i in 0..BATCH {
                let signaled = i == BATCH - 1;
                a.qp.post_send(&[SendWr {
                    wr_id: sent + i,
                    sg_list: &l,
                    send_flags: if signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    },
                    ..Default::default()
                }])
                .unwrap();
            }
            // Both CQs are polled in turn, as a thread driving both devices would: the
            // sender's window moves on only as its device takes the ACKs.
            let (mut got, mut done) = (0, false);
            while got < BATCH || !done {
                let k = b.cq.poll(wc).unwrap();
                for w in &wc[..k] {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    recv(w.wr_id);
                }
                got += k as u64;
                let k = a.cq.poll(wc).unwrap();
                for w in &wc[..k] {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    done = true;
                }
            }
            sent += BATCH;
        }
    };
    run(BATCH * 100, &mut wc); // warm up (and let the lane come)
    let t = Instant::now();
    run(msgs, &mut wc);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{msgs} messages of 8 B, one thread: {:.3} s, {:.1} ns per message ({:.2} M msg/s)",
        secs,
        secs * 1e9 / msgs as f64,
        msgs as f64 / secs / 1e6
    );
}
