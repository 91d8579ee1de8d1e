//! Memory windows over real UDP sockets on loopback (two devices of this test's own):
//! type 1 windows bound with `Qp::bind_mw`, type 2 windows bound with BIND_MW requests,
//! local and remote invalidation, the responder's checks of window rkeys, bind errors, and
//! the rules that tie windows to their regions and PDs.

#[path = "common/pair.rs"]
mod pair;

use pair::*;
use softrdma::*;

/// The two devices' addresses (shared by the tests of this file).
fn x() -> &'static str {
    &pair_addrs().0
}

fn y() -> &'static str {
    &pair_addrs().1
}

/// A connected RC pair, and a region on B's buffer that windows can be bound to.
fn setup() -> (Side, Side, Mr) {
    let (a, b) = pair_on(x(), y(), QpType::Rc, 8192, &Opts::default());
    let mr =
        b.pd.reg_buffer(&b.buf, ALL | AccessFlags::MW_BIND.bits())
            .unwrap();
    (a, b, mr)
}

const RW: u32 = AccessFlags::REMOTE_WRITE.bits() | AccessFlags::REMOTE_READ.bits();

fn info(mr: &Mr, off: u64, len: u64, access: u32) -> MwBindInfo<'_> {
    MwBindInfo {
        mr: Some(mr),
        addr: mr.addr() + off,
        length: len,
        mw_access_flags: access,
    }
}

/// Binds a type 1 window and waits for its completion, which must be a successful BIND_MW.
fn bind1(b: &Side, mw: &Mw, i: MwBindInfo<'_>) -> u32 {
    let rkey =
        b.qp.bind_mw(
            mw,
            &MwBind {
                wr_id: 77,
                send_flags: SendFlags::SIGNALED,
                bind_info: i,
            },
        )
        .unwrap();
    let c = b.wait(1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (77, WcStatus::Success, WcOpcode::BindMw)
    );
    rkey
}

/// Binds a type 2 window with a BIND_MW request under `rkey` and returns the completion.
fn bind2(b: &Side, mw: &Mw, rkey: u32, i: MwBindInfo<'_>) -> WorkCompletion {
    b.qp.post_send(&[SendWr {
        wr_id: 88,
        opcode: WrOpcode::BindMw,
        send_flags: SendFlags::SIGNALED,
        bind_mw: Some(BindMwWr {
            mw,
            rkey,
            bind_info: i,
        }),
        ..Default::default()
    }])
    .unwrap();
    b.wait(1)[0]
}

#[test]
fn device_reports_memory_windows_and_a_window_holds_its_pd() {
    let ctx = Device::from_addr(ip(x())).unwrap().open().unwrap();
    let attr = ctx.query_device().unwrap();
    assert!(attr.max_mw > 0);
    assert!(attr
        .device_cap_flags
        .contains(DeviceCapFlags::MEM_WINDOW | DeviceCapFlags::MEM_WINDOW_TYPE_2B));
    let pd = ctx.alloc_pd().unwrap();
    let mw = pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type2);
    assert!(mw.in_pd(&pd) && !mw.is_bound());
    let pd = pd.dealloc().unwrap_err();
    assert_eq!(pd.error.errno(), libc::EBUSY, "the window uses the PD");
    let pd = pd.object;
    mw.dealloc().unwrap();
    pd.dealloc().unwrap();
}

/// A type 1 window: the peer writes and reads through it; a rebind gives it a new rkey (the
/// key byte plus one) and a new range, and the old rkey stops working.
#[test]
fn type1_window_grants_access_until_rebound() {
    let (a, b, mr) = setup();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let old = mw.rkey();
    let k1 = bind1(
        &b,
        &mw,
        info(&mr, 1024, 1024, RW | AccessFlags::REMOTE_ATOMIC.bits()),
    );
    assert_eq!(k1, inc_rkey(old));
    assert_eq!(mw.rkey(), k1);
    assert_eq!(k1 >> 8, old >> 8, "the index stays");
    assert!(mw.is_bound());
    assert_eq!(mr.bound_windows(), 1);
    let data = pattern(300, 9);
    a.buf.write(0, &data).unwrap();
    let at = b.buf.addr() + 1500;
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, at, k1, 300),
        WcStatus::Success
    );
    assert_eq!(&b.buf.to_vec()[1500..1800], &data[..]);
    b.buf.write(1100, b"through the window").unwrap();
    send(&a, 6, WrOpcode::RdmaRead, &[a.sge(4000, 18)], |w| {
        w.remote_addr = b.buf.addr() + 1100;
        w.rkey = k1;
    });
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(&a.buf.to_vec()[4000..4018], b"through the window");
    b.buf.store_u64(1024, 40).unwrap();
    send(&a, 7, WrOpcode::AtomicFetchAndAdd, &[a.sge(4096, 8)], |w| {
        w.remote_addr = b.buf.addr() + 1024;
        w.rkey = k1;
        w.compare_add = 2;
    });
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(
        (a.buf.load_u64(4096).unwrap(), b.buf.load_u64(1024).unwrap()),
        (40, 42)
    );
    // Rebind elsewhere: the new key works there, the old one nowhere.
    let k2 = bind1(&b, &mw, info(&mr, 4096, 512, RW));
    assert_eq!(k2, inc_rkey(k1));
    assert_eq!(mr.bound_windows(), 1);
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr() + 4096, k2, 64),
        WcStatus::Success
    );
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, at, k1, 64),
        WcStatus::RemAccessErr
    );
    assert_eq!(a.qp.state(), QpState::Err);
}

/// The responder's checks of a window rkey: the range must be inside the window, the window
/// must grant the access, and an unbound window (a zero-length type 1 bind) grants nothing.
/// Each refusal is a remote access error at the requester.
#[test]
fn window_checks_give_rem_access_err() {
    for case in 0..5 {
        let (a, b, mr) = setup();
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        let base = b.buf.addr() + 1024;
        let ro = AccessFlags::REMOTE_READ.bits();
        let (k, op, addr, len) = match case {
            // Past the end of the window (still inside the region).
            0 => (
                bind1(&b, &mw, info(&mr, 1024, 256, RW)),
                WrOpcode::RdmaWrite,
                base + 200,
                100,
            ),
            // Before its start.
            1 => (
                bind1(&b, &mw, info(&mr, 1024, 256, RW)),
                WrOpcode::RdmaRead,
                base - 8,
                16,
            ),
            // A write through a read-only window.
            2 => (
                bind1(&b, &mw, info(&mr, 1024, 256, ro)),
                WrOpcode::RdmaWrite,
                base,
                8,
            ),
            // An atomic through a window without atomic access.
            3 => (
                bind1(&b, &mw, info(&mr, 1024, 256, RW)),
                WrOpcode::AtomicFetchAndAdd,
                base,
                8,
            ),
            // Unbound by a zero-length bind.
            _ => {
                bind1(&b, &mw, info(&mr, 1024, 256, RW));
                let none = MwBindInfo::default();
                let k = bind1(&b, &mw, none);
                assert!(!mw.is_bound());
                assert_eq!(mr.bound_windows(), 0);
                (k, WrOpcode::RdmaWrite, base, 8)
            }
        };
        assert_eq!(
            rdma(&a, op, addr, k, len),
            WcStatus::RemAccessErr,
            "case {case}"
        );
        assert_eq!(b.qp.counters().access_naks_sent, 1, "case {case}");
        assert!(b.buf.to_vec().iter().all(|&x| x == 0), "case {case}");
    }
}

/// A type 2 window bound with a BIND_MW request under an rkey the program chose, reached by
/// the peer, then invalidated with LOCAL_INV: the peer's next write is a remote access
/// error. A zero-based type 2 window addresses its range from 0.
#[test]
fn type2_window_bound_by_a_work_request_and_invalidated_locally() {
    let (a, b, mr) = setup();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let k = (mw.rkey() & !0xff) | 0x42;
    let c = bind2(&b, &mw, k, info(&mr, 2048, 1024, RW));
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (88, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), k);
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr() + 2048, k, 1024),
        WcStatus::Success
    );
    b.qp.post_send(&[SendWr {
        wr_id: 9,
        opcode: WrOpcode::LocalInv,
        imm_data: k,
        send_flags: SendFlags::SIGNALED,
        ..Default::default()
    }])
    .unwrap();
    let c = b.wait(1)[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert!(!mw.is_bound());
    assert_eq!(mr.bound_windows(), 0);
    // Rebound zero-based under a new key: offsets from 0.
    let zb = RW | AccessFlags::ZERO_BASED.bits();
    let k2 = inc_rkey(k);
    let c = bind2(&b, &mw, k2, info(&mr, 4096, 512, zb));
    assert_eq!(c.status, WcStatus::Success);
    a.buf.write(0, b"zero based").unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, 100, k2, 10),
        WcStatus::Success
    );
    assert_eq!(&b.buf.to_vec()[4196..4206], b"zero based");
    // The invalidated key is refused.
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr() + 2048, k, 8),
        WcStatus::RemAccessErr
    );
}

/// SEND with invalidate: the receiver's completion carries WITH_INV and the rkey, and the
/// window is invalidated before it: the sender's next write through it is refused.
#[test]
fn send_with_invalidate_invalidates_a_type2_window_at_the_receiver() {
    let (a, b, mr) = setup();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let k = inc_rkey(mw.rkey());
    assert_eq!(
        bind2(&b, &mw, k, info(&mr, 0, 4096, RW)).status,
        WcStatus::Success
    );
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr(), k, 64),
        WcStatus::Success
    );
    b.post_recv(1, 6000, 100);
    send(&a, 2, WrOpcode::SendWithInv, &[a.sge(0, 10)], |w| {
        w.imm_data = k
    });
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let c = b.wait(1)[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (1, WcStatus::Success, WcOpcode::Recv, 10)
    );
    assert!(c.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(c.invalidated_rkey, k);
    assert!(!mw.is_bound());
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr(), k, 64),
        WcStatus::RemAccessErr
    );
}

/// A SEND with invalidate naming an rkey the receiver cannot invalidate (a region's, a type
/// 1 window's, an unbound one's) is an invalid request: REM_INV_REQ_ERR at the sender, the
/// receive completes in error too, and both QPs go to ERR.
#[test]
fn send_with_invalidate_of_an_invalid_rkey_is_rem_inv_req_err() {
    for case in 0..3 {
        let (a, b, mr) = setup();
        let rkey = match case {
            0 => mr.rkey(),
            1 => {
                let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
                let k = bind1(&b, &mw, info(&mr, 0, 64, RW));
                std::mem::forget(mw); // keep it bound
                k
            }
            _ => b.pd.alloc_mw(MwType::Type2).unwrap().rkey(),
        };
        b.post_recv(1, 6000, 100);
        send(&a, 2, WrOpcode::SendWithInv, &[a.sge(0, 10)], |w| {
            w.imm_data = rkey
        });
        let c = a.wait(1)[0];
        assert_eq!(
            (c.wr_id, c.status),
            (2, WcStatus::RemInvReqErr),
            "case {case}"
        );
        let c = b.wait(1)[0];
        assert_eq!(
            (c.wr_id, c.status),
            (1, WcStatus::RemInvReqErr),
            "case {case}"
        );
        assert_eq!(b.qp.state(), QpState::Err, "case {case}");
        assert_eq!(b.qp.counters().inv_req_naks_sent, 1, "case {case}");
    }
}

/// Binds that break a rule complete with MW_BIND_ERR and move the QP to ERR (what follows
/// is flushed); a LOCAL_INV of a key that names no bound type 2 window completes with
/// LOC_QP_OP_ERR.
#[test]
fn bad_binds_are_mw_bind_err_and_bad_local_invalidates_loc_qp_op_err() {
    for case in 0..6 {
        let (_a, b, mr) = setup();
        let plain = &b.mr; // registered without MW_BIND
        let t1 = b.pd.alloc_mw(MwType::Type1).unwrap();
        let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
        let k2 = inc_rkey(t2.rkey());
        let c = match case {
            0 => bind2(&b, &t2, k2, info(plain, 0, 64, RW)),
            // Outside the region.
            1 => bind2(&b, &t2, k2, info(&mr, 8000, 1000, RW)),
            // Type 2 with no length.
            2 => bind2(&b, &t2, k2, info(&mr, 0, 0, RW)),
            // Type 2 bound twice.
            3 => {
                assert_eq!(
                    bind2(&b, &t2, k2, info(&mr, 0, 64, RW)).status,
                    WcStatus::Success
                );
                bind2(&b, &t2, inc_rkey(k2), info(&mr, 0, 64, RW))
            }
            // Remote write on a region without LOCAL_WRITE.
            4 => {
                let ro =
                    b.pd.reg_buffer(
                        &b.buf,
                        (AccessFlags::MW_BIND | AccessFlags::REMOTE_READ).bits(),
                    )
                    .unwrap();
                let c = bind2(&b, &t2, k2, info(&ro, 0, 64, RW));
                drop(ro);
                c
            }
            // Type 1 through a BIND_MW request asking for ZERO_BASED.
            _ => bind2(
                &b,
                &t1,
                inc_rkey(t1.rkey()),
                info(&mr, 0, 64, RW | AccessFlags::ZERO_BASED.bits()),
            ),
        };
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::MwBindErr, WcOpcode::BindMw),
            "case {case}"
        );
        assert_eq!(b.qp.state(), QpState::Err, "case {case}");
    }
    for case in 0..3 {
        let (_a, b, mr) = setup();
        let t1 = b.pd.alloc_mw(MwType::Type1).unwrap();
        let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
        let rkey = match case {
            0 => mr.rkey(),
            1 => bind1(&b, &t1, info(&mr, 0, 64, RW)),
            _ => t2.rkey(), // not bound
        };
        b.qp.post_send(&[
            SendWr {
                wr_id: 1,
                opcode: WrOpcode::LocalInv,
                imm_data: rkey,
                ..Default::default()
            },
            SendWr {
                wr_id: 2,
                sg_list: &[b.sge(0, 1)],
                ..Default::default()
            },
        ])
        .unwrap();
        let c = b.wait(2);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].opcode),
            (1, WcStatus::LocQpOpErr, WcOpcode::LocalInv),
            "case {case}"
        );
        assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    }
}

/// `ibv_bind_mw`'s own checks (nothing is posted): type 1 only, no address or length without
/// a region, the region in the window's PD (EPERM), no zero-based type 1 window; BIND_MW
/// and LOCAL_INV cannot be posted on UD QPs.
#[test]
fn bind_mw_argument_checks() {
    let (_a, b, mr) = setup();
    let t1 = b.pd.alloc_mw(MwType::Type1).unwrap();
    let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = |mw: &Mw, i: MwBindInfo<'_>| {
        b.qp.bind_mw(
            mw,
            &MwBind {
                bind_info: i,
                ..Default::default()
            },
        )
        .unwrap_err()
        .errno()
    };
    assert_eq!(bind(&t2, info(&mr, 0, 64, RW)), libc::EINVAL);
    let no_mr = MwBindInfo {
        length: 64,
        ..Default::default()
    };
    assert_eq!(bind(&t1, no_mr), libc::EINVAL);
    let other_pd = b.ctx.alloc_pd().unwrap();
    let other = other_pd
        .reg_buffer(&b.buf, ALL | AccessFlags::MW_BIND.bits())
        .unwrap();
    assert_eq!(bind(&t1, info(&other, 0, 64, RW)), libc::EPERM);
    let zb = RW | AccessFlags::ZERO_BASED.bits();
    let before = t1.rkey();
    assert_eq!(bind(&t1, info(&mr, 0, 64, zb)), libc::EINVAL);
    assert_eq!(t1.rkey(), before, "unchanged");
    assert!(b.wait_none(), "nothing was posted");
    let (u, _) = Side::new(x(), QpType::Ud, 64, false);
    for op in [WrOpcode::BindMw, WrOpcode::LocalInv] {
        let e =
            u.qp.post_send(&[SendWr {
                opcode: op,
                ..Default::default()
            }])
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
    }
}

/// A region with bound windows cannot be deregistered (EINVAL, as Linux rxe: IBA
/// 10.6.7.2.6) until they are unbound or deallocated; a region dropped anyway takes its
/// windows' access with it, so no window reaches memory whose region is gone.
#[test]
fn regions_with_bound_windows_stay_registered_and_dropping_one_revokes_its_windows() {
    let (a, b, mr) = setup();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let k = bind1(&b, &mw, info(&mr, 0, 4096, RW));
    let e = mr.dereg().unwrap_err();
    assert_eq!(e.error.errno(), libc::EINVAL);
    let mr = e.object;
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr(), k, 8),
        WcStatus::Success,
        "still registered, still reachable"
    );
    mw.dealloc().unwrap();
    assert_eq!(mr.bound_windows(), 0);
    mr.dereg().unwrap();
    // Dropping (not deregistering) a region under a bound window.
    let mr2 =
        b.pd.reg_buffer(&b.buf, ALL | AccessFlags::MW_BIND.bits())
            .unwrap();
    let mw2 = b.pd.alloc_mw(MwType::Type1).unwrap();
    let k2 = bind1(&b, &mw2, info(&mr2, 0, 4096, RW));
    drop(mr2);
    b.buf.fill(0).unwrap();
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr(), k2, 8),
        WcStatus::RemAccessErr
    );
    assert!(b.buf.to_vec().iter().all(|&x| x == 0));
}

/// A deallocated window's rkey is refused.
#[test]
fn a_deallocated_window_is_unreachable() {
    let (a, b, mr) = setup();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let k = bind1(&b, &mw, info(&mr, 0, 4096, RW));
    drop(mw);
    assert_eq!(mr.bound_windows(), 0);
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr(), k, 8),
        WcStatus::RemAccessErr
    );
}

/// Local operations complete in send-queue order: a bind posted after a SEND completes
/// after it, and an unsignaled bind completes silently.
#[test]
fn binds_complete_in_send_queue_order() {
    let (a, b, mr) = setup();
    a.post_recv(1, 0, 100);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    send(&b, 10, WrOpcode::Send, &[b.sge(0, 50)], |_| {});
    b.qp.bind_mw(
        &mw,
        &MwBind {
            wr_id: 11,
            send_flags: SendFlags::empty(),
            bind_info: info(&mr, 0, 64, RW),
        },
    )
    .unwrap();
    let k =
        b.qp.bind_mw(
            &mw,
            &MwBind {
                wr_id: 12,
                send_flags: SendFlags::SIGNALED,
                bind_info: info(&mr, 64, 64, RW),
            },
        )
        .unwrap();
    let c = b.wait(2);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.opcode)).collect::<Vec<_>>(),
        vec![(10, WcOpcode::Send), (12, WcOpcode::BindMw)]
    );
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(
        rdma(&a, WrOpcode::RdmaWrite, b.buf.addr() + 64, k, 64),
        WcStatus::Success
    );
}
