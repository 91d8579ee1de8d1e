//! The documented rules of the verbs objects (api_checklist.md §2, P0 and P1), one test per
//! rule, named after the function it checks.

mod common;
use common::*;
use softrdma::*;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

fn errno<T: std::fmt::Debug>(r: std::result::Result<T, Error>) -> i32 {
    r.expect_err("expected an error").errno()
}

// ---------------------------------------------------------------- devices and contexts

#[test]
fn ibv_get_device_list_has_one_device_per_address_with_unique_names() {
    let list = get_device_list().unwrap();
    assert!(
        list.iter()
            .any(|d| d.addr() == "127.0.0.1".parse::<IpAddr>().unwrap()),
        "loopback is always a device: {list:?}"
    );
    let names: HashSet<_> = list.iter().map(|d| d.name().to_string()).collect();
    assert_eq!(names.len(), list.len());
    assert!(list.iter().all(|d| d.name().starts_with("srdma")));
    let guids: HashSet<_> = list.iter().map(Device::guid).collect();
    assert_eq!(guids.len(), list.len());
}

#[test]
fn ibv_open_device_on_loopback_aliases_gives_independent_devices() {
    let (x, y) = (unique_addr(), unique_addr());
    let a = Device::from_addr(x).unwrap();
    let b = Device::from_addr(y).unwrap();
    assert_ne!(a, b);
    assert_ne!(a.guid(), b.guid());
    assert_eq!(a.name(), format!("srdma_{x}"));
    assert_eq!(Device::by_name(&format!("srdma_{x}")).unwrap(), a);
    let ca = a.open().unwrap();
    let cb = b.open().unwrap();
    assert_eq!(ca.query_gid(1, 0).unwrap().to_ip(), a.addr());
    assert_eq!(cb.query_gid(1, 0).unwrap().to_ip(), b.addr());
    ca.close().unwrap();
    cb.close().unwrap();
}

#[test]
fn ibv_open_device_refuses_addresses_that_are_not_local() {
    // 192.0.2.0/24 is TEST-NET-1: never assigned to a host. Nothing is sent.
    let e = Device::from_addr("192.0.2.77".parse().unwrap()).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL);
    assert_eq!(
        errno(Device::from_addr("0.0.0.0".parse().unwrap())),
        libc::EINVAL
    );
    assert_eq!(
        errno(Device::from_addr("224.0.0.1".parse().unwrap())),
        libc::EINVAL
    );
    assert_eq!(errno(Device::by_name("mlx5_0")), libc::ENODEV);
}

#[test]
fn ibv_query_device_reports_usable_limits() {
    let ctx = ctx();
    let a = ctx.query_device().unwrap();
    assert_eq!(a.node_guid, ctx.device().guid());
    assert_eq!(a.phys_port_cnt, 1);
    assert!(a.max_qp_wr >= 1024 && a.max_sge >= 16 && a.max_cqe >= 4096);
    assert!(a.max_qp_rd_atom >= 16 && a.max_qp_init_rd_atom >= 16);
    assert_eq!(a.atomic_cap, AtomicCap::Hca);
    assert_eq!(a.max_pkeys, 1);
    assert!(a.fw_ver.starts_with("softrdma"));
}

#[test]
fn ibv_query_port_is_an_active_roce_port() {
    let ctx = ctx();
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert_eq!(p.flags & QPF_GRH_REQUIRED, QPF_GRH_REQUIRED);
    assert_eq!(p.max_mtu, Mtu::Mtu4096);
    // Loopback's MTU is 65536: the whole 4096-byte IB MTU fits.
    assert_eq!(p.active_mtu, Mtu::Mtu4096);
    assert_eq!(p.gid_tbl_len, GID_TABLE_LEN);
    assert_eq!(p.pkey_tbl_len, 1);
    assert_eq!(errno(ctx.query_port(0)), libc::EINVAL);
    assert_eq!(errno(ctx.query_port(2)), libc::EINVAL);
}

#[test]
fn ibv_query_gid_gives_the_ipv4_mapped_address() {
    let ctx = ctx();
    let g = ctx.query_gid(1, 0).unwrap();
    assert_eq!(g.to_string(), format!("::ffff:{}", lo_addr()));
    assert_eq!(g.raw[10..12], [0xff, 0xff]);
    let e = ctx.query_gid_ex(1, 0).unwrap();
    assert_eq!(e.gid_type, GidType::RoceV2);
    assert_eq!(errno(ctx.query_gid(1, GID_TABLE_LEN)), libc::EINVAL);
    assert_eq!(errno(ctx.query_gid(2, 0)), libc::EINVAL);
    assert_eq!(ctx.query_gid_table().len(), GID_TABLE_LEN as usize);
}

#[test]
fn ibv_query_gid_of_an_ipv6_device_is_the_address_itself() {
    let v6: IpAddr = "::1".parse().unwrap();
    let Ok(dev) = Device::from_addr(v6) else {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    };
    let ctx = dev.open().unwrap();
    assert_eq!(ctx.query_gid(1, 0).unwrap().to_ip(), v6);
}

#[test]
fn ibv_query_pkey_has_the_default_pkey_only() {
    let ctx = ctx();
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff);
    assert_eq!(errno(ctx.query_pkey(1, 1)), libc::EINVAL);
    assert_eq!(ctx.get_pkey_index(1, 0xffff).unwrap(), 0);
    assert_eq!(errno(ctx.get_pkey_index(1, 0x8001)), libc::EINVAL);
}

#[test]
fn ibv_close_device_leaves_child_objects_usable() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, 0, None, 0).unwrap();
    ctx.close().unwrap();
    let (_b, _mr) = buffer_mr(&pd, 64);
    let mut init = QpInitAttr::new(QpType::Rc, &cq, caps(4, 1));
    pd.create_qp(&mut init).unwrap();
}

// ---------------------------------------------------------------- protection domains

#[test]
fn ibv_dealloc_pd_is_ebusy_while_an_mr_exists() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let (_b, mr) = buffer_mr(&pd, 64);
    let e = pd.dealloc().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    let pd = e.into_inner();
    mr.dereg().unwrap();
    pd.dealloc().unwrap();
}

#[test]
fn ibv_dealloc_pd_is_ebusy_while_a_qp_srq_or_ah_exists() {
    let ctx = ctx();
    let cq = ctx.create_cq(4, 0, None, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, caps(1, 1)))
        .unwrap();
    let pd = pd.dealloc().unwrap_err().into_inner();
    drop(qp);
    let srq = pd
        .create_srq(&mut SrqInitAttr {
            attr: SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
            ..Default::default()
        })
        .unwrap();
    let pd = pd.dealloc().unwrap_err().into_inner();
    srq.destroy().unwrap();
    let ah = pd.create_ah(&AhAttr::for_ip(lo_addr())).unwrap();
    let e = pd.dealloc().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    ah.destroy().unwrap();
    e.into_inner().dealloc().unwrap();
}

// ---------------------------------------------------------------- memory regions

#[test]
fn ibv_reg_mr_remote_write_or_atomic_without_local_write_is_einval() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let b = Arc::new(Buffer::new(64));
    for bad in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(errno(pd.reg_buffer(&b, bad.bits())), libc::EINVAL);
        pd.reg_buffer(&b, (bad | AccessFlags::LOCAL_WRITE).bits())
            .unwrap();
    }
    // REMOTE_READ alone, and no access at all, are legal (rping's send buffer uses 0).
    pd.reg_buffer(&b, AccessFlags::REMOTE_READ.bits()).unwrap();
    pd.reg_buffer(&b, 0).unwrap();
}

#[test]
fn ibv_reg_mr_rejects_bad_arguments() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let b = Arc::new(Buffer::new(64));
    assert_eq!(
        errno(pd.reg_buffer(&b, 1 << 15)),
        libc::EINVAL,
        "unknown bit"
    );
    pd.reg_buffer(&b, AccessFlags::MW_BIND.bits()).unwrap();
    // (On-demand paging is offered: tests/on_demand_paging.rs.)
    pd.reg_buffer(&b, AccessFlags::ON_DEMAND.bits()).unwrap();
    assert_eq!(
        errno(pd.reg_buffer(&Arc::new(Buffer::new(0)), 0)),
        libc::EINVAL
    );
    // SAFETY: the range overflows, so the registration fails before touching memory.
    let r = unsafe { pd.reg_mr((usize::MAX - 10) as *mut u8, 100, 0) };
    assert_eq!(errno(r), libc::EINVAL);
}

#[test]
fn ibv_reg_mr_keys_are_unpredictable() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let b = Arc::new(Buffer::new(64));
    let mrs: Vec<Mr> = (0..64).map(|_| pd.reg_buffer(&b, RW).unwrap()).collect();
    let mut keys = HashSet::new();
    for m in &mrs {
        assert_ne!(m.lkey(), m.rkey());
        assert_ne!(m.lkey(), 0);
        assert!(
            keys.insert(m.lkey()) && keys.insert(m.rkey()),
            "keys repeat"
        );
    }
    // Never sequential: consecutive registrations are not a fixed stride apart.
    let strides: HashSet<u32> = mrs
        .windows(2)
        .map(|w| w[1].rkey().wrapping_sub(w[0].rkey()))
        .collect();
    assert!(strides.len() > 32, "rkeys look sequential: {strides:?}");
}

#[test]
fn ibv_reg_mr_reports_address_length_and_access() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let b = Arc::new(Buffer::new(8192));
    let mr = pd.reg_buffer(&b, RW).unwrap();
    assert_eq!(mr.addr(), b.addr());
    assert_eq!(mr.iova(), b.addr());
    assert_eq!(mr.length(), 8192);
    assert_eq!(mr.access().bits(), RW);
    assert!(mr.in_pd(&pd));
    let mut v = vec![7u8; 100];
    // SAFETY: v outlives the region (dropped at the end of the test, after `z`).
    let z = unsafe {
        pd.reg_mr_iova(
            v.as_mut_ptr(),
            v.len(),
            0x1000,
            (AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED).bits(),
        )
    }
    .unwrap();
    assert_eq!(z.iova(), 0, "ZERO_BASED addresses the region from 0");
    // SAFETY: as above.
    let i = unsafe { pd.reg_mr_iova(v.as_mut_ptr(), v.len(), 0x1000, 0) }.unwrap();
    assert_eq!(i.iova(), 0x1000);
    drop((z, i));
}

#[test]
fn ibv_dereg_mr_makes_the_keys_invalid() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, 0, None, 0).unwrap();
    let mut init = QpInitAttr::new(
        QpType::Rc,
        &cq,
        QpCap {
            max_inline_data: 64,
            ..caps(4, 1)
        },
    );
    let qp = pd.create_qp(&mut init).unwrap();
    connect_rc(&qp, 0x42);
    let (b, mr) = buffer_mr(&pd, 64);
    let sge = [Sge {
        addr: b.addr(),
        length: 16,
        lkey: mr.lkey(),
    }];
    let wr = SendWr {
        sg_list: &sge,
        send_flags: SendFlags::INLINE,
        ..Default::default()
    };
    qp.post_send(&[wr]).unwrap();
    mr.dereg().unwrap();
    let e = qp.post_send(&[wr]).unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (0, libc::EINVAL));
}

// ---------------------------------------------------------------- CQs and channels

#[test]
fn ibv_create_cq_rounds_up_and_checks_sizes() {
    let ctx = ctx();
    let max = ctx.query_device().unwrap().max_cqe;
    for want in [1, 2, 3, 100, 1000, max] {
        let cq = ctx.create_cq(want, 7, None, 0).unwrap();
        assert!(
            cq.cqe() >= want && cq.cqe() <= max,
            "{want} -> {}",
            cq.cqe()
        );
        assert_eq!(cq.cq_context(), 7);
    }
    assert_eq!(errno(ctx.create_cq(0, 0, None, 0)), libc::EINVAL);
    assert_eq!(errno(ctx.create_cq(max + 1, 0, None, 0)), libc::EINVAL);
    assert_eq!(
        errno(ctx.create_cq(4, 0, None, ctx.num_comp_vectors())),
        libc::EINVAL
    );
    let other = ctx.device().open().unwrap();
    let ch = other.create_comp_channel().unwrap();
    assert_eq!(errno(ctx.create_cq(4, 0, Some(&ch), 0)), libc::EINVAL);
}

#[test]
fn ibv_create_comp_channel_is_a_pollable_fd_that_honours_o_nonblock() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    assert!(ch.fd() >= 0);
    assert!(!fd_readable(ch.fd()));
    set_nonblocking(ch.fd());
    assert_eq!(errno(ch.get_cq_event()), libc::EAGAIN);
}

fn qp_with_recvs(ctx: &Context, pd: &Pd, cq: &Cq, n: u64) -> Qp {
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, cq, caps(16, 1)))
        .unwrap();
    connect_rc(&qp, 0x99);
    let (b, mr) = buffer_mr(pd, 256);
    for i in 0..n {
        let sge = [Sge {
            addr: b.addr(),
            length: 64,
            lkey: mr.lkey(),
        }];
        qp.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sg_list: &sge,
        }])
        .unwrap();
    }
    let _ = ctx;
    qp
}

#[test]
fn ibv_req_notify_cq_arms_one_event_and_ibv_get_cq_event_returns_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, 0xc0ffee, Some(&ch), 0).unwrap();
    let other_cq = ctx.create_cq(16, 0, None, 0).unwrap();
    assert_eq!(
        errno(other_cq.req_notify_cq(false)),
        libc::EINVAL,
        "no channel"
    );
    let qp = qp_with_recvs(&ctx, &pd, &cq, 2);
    cq.req_notify_cq(false).unwrap();
    assert!(!fd_readable(ch.fd()));
    to_err(&qp); // flushes the two receives: two completions, but one event (one-shot)
    assert!(fd_readable(ch.fd()));
    let ev = ch.get_cq_event().unwrap();
    assert!(ev.is_for(&cq));
    assert_eq!(ev.cq_context(), 0xc0ffee);
    assert!(!fd_readable(ch.fd()), "one event per arm");
    let wcs = poll_all(&cq);
    assert_eq!(wcs.len(), 2);
    cq.ack_cq_events(1);
    drop(qp);
    cq.destroy().unwrap();
}

#[test]
fn ibv_poll_cq_returns_flushed_work_requests_in_order() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = qp_with_recvs(&ctx, &pd, &cq, 3);
    let (b, mr) = buffer_mr(&pd, 64);
    let sge = [Sge {
        addr: b.addr(),
        length: 8,
        lkey: mr.lkey(),
    }];
    qp.post_send(&[SendWr {
        wr_id: 9,
        sg_list: &sge,
        opcode: WrOpcode::RdmaWrite,
        ..Default::default()
    }])
    .unwrap();
    to_err(&qp);
    let wcs = poll_all(&cq);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (9, WcStatus::WrFlushErr, WcOpcode::RdmaWrite),
            (100, WcStatus::WrFlushErr, WcOpcode::Recv),
            (101, WcStatus::WrFlushErr, WcOpcode::Recv),
            (102, WcStatus::WrFlushErr, WcOpcode::Recv),
        ]
    );
    assert!(wcs.iter().all(|w| w.qp_num == qp.qp_num()));
    // Partial polls.
    let mut one = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut one).unwrap(), 0);
    assert_eq!(WcStatus::WrFlushErr.as_str(), "Work Request Flushed Error");
}

#[test]
fn ibv_poll_cq_after_overrun_fails_and_raises_ibv_event_cq_err() {
    let ctx = ctx();
    set_nonblocking(ctx.async_fd());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1, 0x5a, None, 0).unwrap();
    assert_eq!(cq.cqe(), 1);
    let qp = qp_with_recvs(&ctx, &pd, &cq, 3);
    to_err(&qp);
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type(), EventType::CqErr);
    assert_eq!(ev.element(), AsyncElement::Cq { cq_context: 0x5a });
    assert_eq!(
        errno(cq.poll(&mut [WorkCompletion::default(); 4])),
        libc::EIO
    );
    drop(qp);
    let cq = cq.destroy().unwrap_err().into_inner();
    ev.ack();
    cq.destroy().unwrap();
}

#[test]
fn ibv_destroy_cq_is_ebusy_while_a_qp_uses_it_or_events_are_unacked() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, 0, Some(&ch), 0).unwrap();
    let qp = qp_with_recvs(&ctx, &pd, &cq, 1);
    cq.req_notify_cq(false).unwrap();
    to_err(&qp);
    let e = cq.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    let cq = e.into_inner();
    drop(qp);
    let _ev = ch.get_cq_event().unwrap();
    let e = cq.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "an event is not acknowledged");
    let cq = e.into_inner();
    cq.ack_cq_events(1);
    cq.destroy().unwrap();
}

#[test]
fn ibv_destroy_comp_channel_is_ebusy_while_a_cq_uses_it() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(4, 0, Some(&ch), 0).unwrap();
    let e = ch.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    cq.destroy().unwrap();
    e.into_inner().destroy().unwrap();
}

// ---------------------------------------------------------------- QPs

#[test]
fn ibv_create_qp_writes_back_caps_at_least_those_requested() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let dev = ctx.query_device().unwrap();
    for (wr, sge, inline) in [
        (0, 0, 0),
        (1, 1, 1),
        (3, 2, 60),
        (100, 5, 64),
        (dev.max_qp_wr, dev.max_sge, dev.max_inline_data),
    ] {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let want = QpCap {
                max_send_wr: wr,
                max_recv_wr: wr,
                max_send_sge: sge,
                max_recv_sge: sge,
                max_inline_data: inline,
            };
            let mut init = QpInitAttr::new(t, &cq, want);
            let qp = pd.create_qp(&mut init).unwrap();
            let c = init.cap;
            assert!(
                c.max_send_wr >= wr.max(1) && c.max_recv_wr >= wr.max(1),
                "{c:?}"
            );
            assert!(c.max_send_sge >= sge && c.max_recv_sge >= sge, "{c:?}");
            assert!(c.max_inline_data >= inline, "{c:?}");
            assert!(c.max_send_wr <= dev.max_qp_wr && c.max_send_sge <= dev.max_sge);
            assert_eq!(qp.cap(), c);
            assert_eq!(qp.state(), QpState::Reset);
            assert_eq!(qp.qp_type(), t);
        }
    }
}

#[test]
fn ibv_create_qp_above_device_limits_is_einval() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let dev = ctx.query_device().unwrap();
    let base = caps(4, 1);
    for bad in [
        QpCap {
            max_send_wr: dev.max_qp_wr + 1,
            ..base
        },
        QpCap {
            max_recv_wr: dev.max_qp_wr + 1,
            ..base
        },
        QpCap {
            max_send_sge: dev.max_sge + 1,
            ..base
        },
        QpCap {
            max_recv_sge: dev.max_sge + 1,
            ..base
        },
        QpCap {
            max_inline_data: dev.max_inline_data + 1,
            ..base
        },
    ] {
        let mut init = QpInitAttr::new(QpType::Rc, &cq, bad);
        assert_eq!(errno(pd.create_qp(&mut init)), libc::EINVAL, "{bad:?}");
        assert_eq!(init.cap, bad, "caps untouched on failure");
    }
}

#[test]
fn ibv_create_qp_raw_packet_and_xrc_are_eopnotsupp() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    for t in [QpType::RawPacket, QpType::XrcSend, QpType::XrcRecv] {
        let mut init = QpInitAttr::new(t, &cq, caps(4, 1));
        assert_eq!(errno(pd.create_qp(&mut init)), libc::EOPNOTSUPP, "{t:?}");
    }
}

#[test]
fn ibv_create_qp_with_an_srq_only_for_rc_and_ud_and_ignores_recv_caps() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let srq = pd
        .create_srq(&mut SrqInitAttr {
            attr: SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            ..Default::default()
        })
        .unwrap();
    let huge = QpCap {
        max_recv_wr: u32::MAX,
        max_recv_sge: u32::MAX,
        ..caps(4, 1)
    };
    let mut uc = QpInitAttr {
        srq: Some(&srq),
        ..QpInitAttr::new(QpType::Uc, &cq, huge)
    };
    assert_eq!(errno(pd.create_qp(&mut uc)), libc::EINVAL);
    for t in [QpType::Rc, QpType::Ud] {
        let mut init = QpInitAttr {
            srq: Some(&srq),
            ..QpInitAttr::new(t, &cq, huge)
        };
        let qp = pd.create_qp(&mut init).unwrap();
        assert_eq!((init.cap.max_recv_wr, init.cap.max_recv_sge), (0, 0));
        assert!(qp.query_qp().unwrap().1.has_srq);
        let e = qp.post_recv(&[RecvWr::default()]).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "post to the SRQ instead");
    }
    let other_pd = ctx.alloc_pd().unwrap();
    let mut init = QpInitAttr {
        srq: Some(&srq),
        ..QpInitAttr::new(QpType::Rc, &cq, caps(1, 1))
    };
    assert_eq!(
        errno(other_pd.create_qp(&mut init)),
        libc::EINVAL,
        "SRQ of another PD"
    );
}

#[test]
fn ibv_create_qp_rejects_cqs_of_another_device() {
    let a = ctx();
    let b = Device::from_addr(unique_addr()).unwrap().open().unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = b.create_cq(4, 0, None, 0).unwrap();
    assert_eq!(
        errno(pd.create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, caps(1, 1)))),
        libc::EINVAL
    );
}

#[test]
fn ibv_create_qp_numbers_are_24_bit_unique_and_unpredictable() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qps: Vec<Qp> = (0..64)
        .map(|_| {
            pd.create_qp(&mut QpInitAttr::new(QpType::Ud, &cq, caps(1, 1)))
                .unwrap()
        })
        .collect();
    let nums: HashSet<u32> = qps.iter().map(Qp::qp_num).collect();
    assert_eq!(nums.len(), 64);
    assert!(nums.iter().all(|&n| (16..0xff_ffff).contains(&n)));
    let strides: HashSet<u32> = qps
        .windows(2)
        .map(|w| w[1].qp_num().wrapping_sub(w[0].qp_num()))
        .collect();
    assert!(strides.len() > 32, "QP numbers look sequential");
}

fn rc_qp(ctx: &Context, pd: &Pd, cq: &Cq) -> Qp {
    let _ = ctx;
    pd.create_qp(&mut QpInitAttr::new(QpType::Rc, cq, caps(8, 2)))
        .unwrap()
}

#[test]
fn ibv_modify_qp_rc_reset_init_rtr_rts_with_the_required_masks() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    connect_rc(&qp, 0xabcdef);
    let (a, _) = qp.query_qp().unwrap();
    assert_eq!(a.qp_state, QpState::Rts);
    assert_eq!(a.dest_qp_num, 0xabcdef);
    assert_eq!((a.rq_psn, a.sq_psn), (0x123, 0x456));
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 7, 7));
    assert_eq!(
        (a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer),
        (4, 4, 12)
    );
    assert_eq!(a.path_mtu, Mtu::Mtu1024);
    assert_eq!(a.ah_attr.grh.dgid.to_ip(), lo_addr());
    assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_WRITE.bits());
    assert_eq!(a.port_num, 1);
}

#[test]
fn ibv_modify_qp_uc_and_ud_paths() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let uc = pd
        .create_qp(&mut QpInitAttr::new(QpType::Uc, &cq, caps(4, 1)))
        .unwrap();
    connect_rc(&uc, 7);
    assert_eq!(uc.state(), QpState::Rts);
    let ud = pd
        .create_qp(&mut QpInitAttr::new(QpType::Ud, &cq, caps(4, 1)))
        .unwrap();
    ud_to_rts(&ud, 0x1234_5678);
    assert_eq!(ud.query_qp().unwrap().0.qkey, 0x1234_5678);
    assert_eq!(ud.state(), QpState::Rts);
}

#[test]
fn ibv_modify_qp_missing_required_attribute_is_einval_and_names_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let e = qp
        .modify_qp(
            &a,
            (QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX).bits(),
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.message().contains("ACCESS_FLAGS"), "{e}");
    assert!(e.message().contains("INIT"), "{e}");
    assert_eq!(qp.state(), QpState::Reset, "nothing changed");
}

#[test]
fn ibv_modify_qp_attribute_not_allowed_in_the_transition_is_einval() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::PORT
        | QpAttrMask::PKEY_INDEX
        | QpAttrMask::ACCESS_FLAGS
        | QpAttrMask::SQ_PSN;
    let e = qp.modify_qp(&a, m.bits()).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.message().contains("SQ_PSN"), "{e}");
    assert_eq!(qp.state(), QpState::Reset);
}

#[test]
fn ibv_modify_qp_invalid_transition_is_einval() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    let a = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    let e = qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(
        errno(qp.modify_qp(&a, 1 << 30)),
        libc::EINVAL,
        "unknown mask bit"
    );
}

#[test]
fn ibv_modify_qp_is_all_or_nothing_on_bad_values() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let dev = ctx.query_device().unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    let init_mask =
        (QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS)
            .bits();
    let good = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    for bad in [
        QpAttr {
            port_num: 2,
            ..good
        },
        QpAttr {
            pkey_index: 1,
            ..good
        },
        QpAttr {
            qp_access_flags: 1 << 12,
            ..good
        },
    ] {
        assert_eq!(
            errno(qp.modify_qp(&bad, init_mask)),
            libc::EINVAL,
            "{bad:?}"
        );
        assert_eq!(qp.state(), QpState::Reset);
    }
    qp.modify_qp(&good, init_mask).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::for_ip(lo_addr()),
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: 5,
        ..good
    };
    let rtr_mask = (QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER)
        .bits();
    let no_grh = AhAttr {
        is_global: false,
        ..rtr.ah_attr
    };
    let v6 = AhAttr::for_ip("::1".parse().unwrap());
    for bad in [
        QpAttr {
            ah_attr: no_grh,
            ..rtr
        },
        QpAttr { ah_attr: v6, ..rtr },
        QpAttr {
            dest_qp_num: 1 << 24,
            ..rtr
        },
        QpAttr {
            min_rnr_timer: 32,
            ..rtr
        },
        QpAttr {
            max_dest_rd_atomic: (dev.max_qp_rd_atom + 1) as u8,
            ..rtr
        },
    ] {
        assert_eq!(errno(qp.modify_qp(&bad, rtr_mask)), libc::EINVAL, "{bad:?}");
        assert_eq!(qp.state(), QpState::Init);
        assert_eq!(qp.query_qp().unwrap().0.dest_qp_num, 0, "nothing applied");
    }
    qp.modify_qp(&rtr, rtr_mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ..rtr
    };
    let rts_mask = (QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC)
        .bits();
    for bad in [
        QpAttr { timeout: 32, ..rts },
        QpAttr {
            retry_cnt: 8,
            ..rts
        },
        QpAttr {
            rnr_retry: 8,
            ..rts
        },
        QpAttr {
            max_rd_atomic: (dev.max_qp_init_rd_atom + 1) as u8,
            ..rts
        },
    ] {
        assert_eq!(errno(qp.modify_qp(&bad, rts_mask)), libc::EINVAL, "{bad:?}");
        assert_eq!(qp.state(), QpState::Rtr);
    }
    qp.modify_qp(&rts, rts_mask).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn ibv_modify_qp_cur_state_must_match() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    let a = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    assert_eq!(
        errno(qp.modify_qp(&a, QpAttrMask::STATE.bits())),
        libc::EINVAL,
        "RESET->ERR is not in the IBTA table"
    );
    connect_rc(&qp, 9);
    // RTS->RTS takes an optional CUR_STATE, which must be the state the QP is in.
    let a = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Sqe,
        ..Default::default()
    };
    let m = (QpAttrMask::STATE | QpAttrMask::CUR_STATE).bits();
    assert_eq!(errno(qp.modify_qp(&a, m)), libc::EINVAL);
    let a = QpAttr {
        cur_qp_state: QpState::Rts,
        ..a
    };
    qp.modify_qp(&a, m).unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    // ->ERR takes nothing but STATE.
    let e = QpAttr {
        qp_state: QpState::Err,
        cur_qp_state: QpState::Rts,
        ..Default::default()
    };
    assert_eq!(errno(qp.modify_qp(&e, m)), libc::EINVAL);
    qp.modify_qp(&e, QpAttrMask::STATE.bits()).unwrap();
    assert_eq!(qp.state(), QpState::Err);
}

#[test]
fn ibv_modify_qp_to_reset_discards_work_and_attributes() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = qp_with_recvs(&ctx, &pd, &cq, 2);
    let a = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap();
    assert!(poll_all(&cq).is_empty(), "RESET completes nothing");
    let (attr, _) = qp.query_qp().unwrap();
    assert_eq!(attr.qp_state, QpState::Reset);
    assert_eq!(attr.dest_qp_num, 0);
    connect_rc(&qp, 3); // usable again
}

#[test]
fn ibv_modify_qp_rts_to_sqd_raises_sq_drained_when_asked() {
    let ctx = ctx();
    set_nonblocking(ctx.async_fd());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &cq, caps(4, 1));
    init.qp_context = 77;
    let qp = pd.create_qp(&mut init).unwrap();
    connect_rc(&qp, 3);
    let a = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY).bits(),
    )
    .unwrap();
    assert!(fd_readable(ctx.async_fd()));
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type(), EventType::SqDrained);
    assert_eq!(
        ev.element(),
        AsyncElement::Qp {
            qp_num: qp.qp_num(),
            qp_context: 77
        }
    );
    let qp = qp.destroy().unwrap_err().into_inner();
    ev.ack();
    let a = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap();
    qp.destroy().unwrap();
    assert_eq!(errno(ctx.get_async_event()), libc::EAGAIN);
}

#[test]
fn ibv_modify_qp_to_err_on_an_srq_raises_last_wqe_reached() {
    let ctx = ctx();
    set_nonblocking(ctx.async_fd());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let srq = pd
        .create_srq(&mut SrqInitAttr {
            attr: SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            ..Default::default()
        })
        .unwrap();
    let mut init = QpInitAttr {
        srq: Some(&srq),
        ..QpInitAttr::new(QpType::Rc, &cq, caps(4, 1))
    };
    let qp = pd.create_qp(&mut init).unwrap();
    connect_rc(&qp, 9);
    to_err(&qp);
    let ev = ctx.get_async_event().unwrap();
    assert_eq!(ev.event_type(), EventType::QpLastWqeReached);
    let e = qp.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "unacknowledged event");
    drop(ev); // dropping acknowledges too
    e.into_inner().destroy().unwrap();
    srq.destroy().unwrap();
}

#[test]
fn ibv_query_qp_reports_creation_attributes() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let mut init = QpInitAttr::new(QpType::Uc, &cq, caps(5, 3));
    init.sq_sig_all = true;
    init.qp_context = 0xdead;
    let qp = pd.create_qp(&mut init).unwrap();
    let (a, i) = qp.query_qp().unwrap();
    assert_eq!(a.cap, init.cap);
    assert_eq!(i.cap, init.cap);
    assert_eq!(
        (i.qp_type, i.sq_sig_all, i.qp_context, i.has_srq),
        (QpType::Uc, true, 0xdead, false)
    );
}

#[test]
fn ibv_post_send_checks_state_opcode_sges_and_queue_size() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Ud, &cq, caps(4, 2)))
        .unwrap();
    let ah = pd.create_ah(&AhAttr::for_ip(lo_addr())).unwrap();
    let (b, mr) = buffer_mr(&pd, 64);
    let sge = [Sge {
        addr: b.addr(),
        length: 8,
        lkey: mr.lkey(),
    }; 3];
    let send = SendWr {
        sg_list: &sge[..1],
        ah: Some(&ah),
        remote_qpn: 5,
        remote_qkey: 1,
        ..Default::default()
    };
    let e = qp.post_send(&[send]).unwrap_err();
    assert_eq!(
        (e.bad_wr, e.errno()),
        (0, libc::EINVAL),
        "RESET cannot send"
    );
    ud_to_rts(&qp, 1);
    let write = SendWr {
        opcode: WrOpcode::RdmaWrite,
        ..send
    };
    let e = qp.post_send(&[send, write]).unwrap_err();
    assert_eq!(
        (e.bad_wr, e.errno()),
        (1, libc::EINVAL),
        "UD cannot RDMA WRITE"
    );
    let too_many = SendWr {
        sg_list: &sge,
        ..send
    };
    assert_eq!(qp.post_send(&[too_many]).unwrap_err().errno(), libc::EINVAL);
    let no_ah = SendWr { ah: None, ..send };
    assert_eq!(qp.post_send(&[no_ah]).unwrap_err().errno(), libc::EINVAL);
    // A full send queue: an RC QP whose peer never answers keeps every send outstanding.
    let rc = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, caps(4, 2)))
        .unwrap();
    connect_rc(&rc, 0x42); // nobody has QP 0x42: nothing is ever acknowledged
    let room = rc.cap().max_send_wr as usize;
    let plain = SendWr {
        sg_list: &sge[..1],
        ..Default::default()
    };
    let batch = vec![plain; room + 1];
    let e = rc.post_send(&batch).unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (room, libc::ENOMEM));
}

#[test]
fn ibv_post_send_checks_inline_and_atomics_on_rc() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let mut init = QpInitAttr::new(
        QpType::Rc,
        &cq,
        QpCap {
            max_inline_data: 64,
            ..caps(16, 2)
        },
    );
    let qp = pd.create_qp(&mut init).unwrap();
    connect_rc(&qp, 1);
    let (b, mr) = buffer_mr(&pd, 4096);
    let big = [Sge {
        addr: b.addr(),
        length: 1000,
        lkey: mr.lkey(),
    }];
    let inline = SendWr {
        sg_list: &big,
        send_flags: SendFlags::INLINE,
        ..Default::default()
    };
    assert_eq!(
        qp.post_send(&[inline]).unwrap_err().errno(),
        libc::EINVAL,
        "too long"
    );
    let small = [Sge {
        addr: b.addr() + 8,
        length: 64,
        lkey: mr.lkey(),
    }];
    qp.post_send(&[SendWr {
        sg_list: &small,
        ..inline
    }])
    .unwrap();
    let outside = [Sge {
        addr: b.addr() + 4090,
        length: 64,
        lkey: mr.lkey(),
    }];
    assert_eq!(
        qp.post_send(&[SendWr {
            sg_list: &outside,
            ..inline
        }])
        .unwrap_err()
        .errno(),
        libc::EINVAL,
        "inline data outside the region"
    );
    let read_inline = SendWr {
        opcode: WrOpcode::RdmaRead,
        sg_list: &small,
        ..inline
    };
    assert_eq!(
        qp.post_send(&[read_inline]).unwrap_err().errno(),
        libc::EINVAL
    );
    let eight = [Sge {
        addr: b.addr(),
        length: 8,
        lkey: mr.lkey(),
    }];
    let cas = SendWr {
        opcode: WrOpcode::AtomicCmpAndSwp,
        sg_list: &eight,
        remote_addr: 0x1000,
        rkey: 1,
        ..Default::default()
    };
    qp.post_send(&[cas]).unwrap();
    assert_eq!(
        qp.post_send(&[SendWr {
            remote_addr: 0x1004,
            ..cas
        }])
        .unwrap_err()
        .errno(),
        libc::EINVAL
    );
    assert_eq!(
        qp.post_send(&[SendWr {
            sg_list: &small,
            ..cas
        }])
        .unwrap_err()
        .errno(),
        libc::EINVAL
    );
    // BIND_MW without its `bind_mw` member; TSO (not supported). (LOCAL_INV is posted and
    // fails when carried out: tests/memory_windows.rs.)
    for op in [WrOpcode::BindMw, WrOpcode::Tso] {
        let wr = SendWr {
            opcode: op,
            ..Default::default()
        };
        assert_eq!(
            qp.post_send(&[wr]).unwrap_err().errno(),
            libc::EINVAL,
            "{op:?}"
        );
    }
}

#[test]
fn ibv_post_send_in_err_completes_with_flush_err() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let qp = rc_qp(&ctx, &pd, &cq);
    connect_rc(&qp, 1);
    to_err(&qp);
    qp.post_send(&[SendWr {
        wr_id: 5,
        ..Default::default()
    }])
    .unwrap();
    qp.post_recv(&[RecvWr {
        wr_id: 6,
        sg_list: &[],
    }])
    .unwrap();
    let got: Vec<_> = poll_all(&cq).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![(5, WcStatus::WrFlushErr), (6, WcStatus::WrFlushErr)]
    );
}

#[test]
fn ibv_post_recv_is_einval_in_reset_and_enomem_when_full() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, caps(2, 1)))
        .unwrap();
    let e = qp.post_recv(&[RecvWr::default()]).unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (0, libc::EINVAL));
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS)
            .bits(),
    )
    .unwrap();
    let two = [Sge::default(); 2];
    assert_eq!(
        qp.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &two
        }])
        .unwrap_err()
        .errno(),
        libc::EINVAL
    );
    let n = qp.cap().max_recv_wr as usize;
    let e = qp.post_recv(&vec![RecvWr::default(); n + 1]).unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (n, libc::ENOMEM));
}

#[test]
fn ibv_attach_mcast_only_ud_and_multicast_gids_and_destroy_is_ebusy_while_attached() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, 0, None, 0).unwrap();
    let mgid = Gid::from_ip(softrdma::testing::unique_multicast_group().into());
    let rc = rc_qp(&ctx, &pd, &cq);
    assert_eq!(errno(rc.attach_mcast(&mgid, 0)), libc::EINVAL);
    let ud = pd
        .create_qp(&mut QpInitAttr::new(QpType::Ud, &cq, caps(4, 1)))
        .unwrap();
    let unicast = Gid::from_ip("10.1.2.3".parse().unwrap());
    assert_eq!(errno(ud.attach_mcast(&unicast, 0)), libc::EINVAL);
    ud.attach_mcast(&mgid, 0).unwrap();
    ud.attach_mcast(&mgid, 0).unwrap(); // twice is fine
    let e = ud.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    let ud = e.into_inner();
    ud.detach_mcast(&mgid, 0).unwrap();
    assert_eq!(errno(ud.detach_mcast(&mgid, 0)), libc::EINVAL);
    ud.attach_mcast(&Gid::from_ip("ff0e::1".parse().unwrap()), 0)
        .unwrap();
    ud.detach_mcast(&Gid::from_ip("ff0e::1".parse().unwrap()), 0)
        .unwrap();
    ud.destroy().unwrap();
}

// ---------------------------------------------------------------- SRQs and AHs

#[test]
fn ibv_create_srq_writes_back_caps_and_checks_limits() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let dev = ctx.query_device().unwrap();
    let mut init = SrqInitAttr {
        srq_context: 3,
        attr: SrqAttr {
            max_wr: 100,
            max_sge: 3,
            srq_limit: 50,
        },
    };
    let srq = pd.create_srq(&mut init).unwrap();
    assert!(init.attr.max_wr >= 100 && init.attr.max_sge >= 3);
    assert_eq!(init.attr.srq_limit, 0, "the limit is ignored at creation");
    assert_eq!(srq.query_srq().unwrap(), init.attr);
    for bad in [
        SrqAttr {
            max_wr: 0,
            max_sge: 1,
            srq_limit: 0,
        },
        SrqAttr {
            max_wr: dev.max_srq_wr + 1,
            max_sge: 1,
            srq_limit: 0,
        },
        SrqAttr {
            max_wr: 4,
            max_sge: dev.max_srq_sge + 1,
            srq_limit: 0,
        },
    ] {
        let mut i = SrqInitAttr {
            srq_context: 0,
            attr: bad,
        };
        assert_eq!(errno(pd.create_srq(&mut i)), libc::EINVAL, "{bad:?}");
    }
}

#[test]
fn ibv_modify_srq_limit_and_resize_are_all_or_nothing() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mut init = SrqInitAttr {
        srq_context: 0,
        attr: SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    let srq = pd.create_srq(&mut init).unwrap();
    let max_wr = init.attr.max_wr;
    let both = (SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT).bits();
    let bad = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 1000,
    };
    assert_eq!(errno(srq.modify_srq(&bad, both)), libc::EINVAL);
    assert_eq!(srq.query_srq().unwrap().max_wr, max_wr, "nothing changed");
    srq.modify_srq(
        &SrqAttr {
            srq_limit: 4,
            ..Default::default()
        },
        SrqAttrMask::LIMIT.bits(),
    )
    .unwrap();
    assert_eq!(srq.query_srq().unwrap().srq_limit, 4);
    assert_eq!(errno(srq.modify_srq(&bad, 0)), libc::EINVAL, "empty mask");
    assert_eq!(
        errno(srq.modify_srq(&bad, 1 << 5)),
        libc::EINVAL,
        "unknown bit"
    );
    srq.post_srq_recv(&[RecvWr::default(); 6]).unwrap();
    let shrink = SrqAttr {
        max_wr: 4,
        ..Default::default()
    };
    assert_eq!(
        errno(srq.modify_srq(&shrink, SrqAttrMask::MAX_WR.bits())),
        libc::EINVAL
    );
    let grow = SrqAttr {
        max_wr: 64,
        ..Default::default()
    };
    srq.modify_srq(&grow, SrqAttrMask::MAX_WR.bits()).unwrap();
    assert!(srq.query_srq().unwrap().max_wr >= 64);
}

#[test]
fn ibv_post_srq_recv_checks_sges_and_fullness() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let mut init = SrqInitAttr {
        srq_context: 0,
        attr: SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        },
    };
    let srq = pd.create_srq(&mut init).unwrap();
    let two = [Sge::default(); 2];
    let e = srq
        .post_srq_recv(&[
            RecvWr::default(),
            RecvWr {
                wr_id: 1,
                sg_list: &two,
            },
        ])
        .unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (1, libc::EINVAL));
    let n = init.attr.max_wr as usize - 1;
    let e = srq
        .post_srq_recv(&vec![RecvWr::default(); n + 1])
        .unwrap_err();
    assert_eq!((e.bad_wr, e.errno()), (n, libc::ENOMEM));
}

#[test]
fn ibv_destroy_srq_is_ebusy_while_a_qp_uses_it() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, 0, None, 0).unwrap();
    let srq = pd
        .create_srq(&mut SrqInitAttr {
            srq_context: 0,
            attr: SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        })
        .unwrap();
    let mut init = QpInitAttr {
        srq: Some(&srq),
        ..QpInitAttr::new(QpType::Ud, &cq, caps(1, 1))
    };
    let qp = pd.create_qp(&mut init).unwrap();
    let e = srq.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    qp.destroy().unwrap();
    e.into_inner().destroy().unwrap();
}

#[test]
fn ibv_create_ah_requires_a_grh_port_1_and_a_reachable_family() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let good = AhAttr::for_ip(lo_addr());
    let ah = pd.create_ah(&good).unwrap();
    assert_eq!(ah.attr(), &good);
    for bad in [
        AhAttr {
            is_global: false,
            ..good
        },
        AhAttr {
            port_num: 2,
            ..good
        },
        AhAttr {
            grh: GlobalRoute {
                sgid_index: 1,
                ..good.grh
            },
            ..good
        },
        AhAttr {
            grh: GlobalRoute {
                dgid: Gid::ZERO,
                ..good.grh
            },
            ..good
        },
        AhAttr {
            grh: GlobalRoute {
                flow_label: 1 << 20,
                ..good.grh
            },
            ..good
        },
        AhAttr::for_ip("2001:db8::1".parse().unwrap()),
    ] {
        assert_eq!(errno(pd.create_ah(&bad)), libc::EINVAL, "{bad:?}");
    }
}

#[test]
fn ibv_get_async_event_honours_o_nonblock() {
    let ctx = ctx();
    set_nonblocking(ctx.async_fd());
    assert!(!fd_readable(ctx.async_fd()));
    assert_eq!(errno(ctx.get_async_event()), libc::EAGAIN);
    assert_eq!(EventType::SrqLimitReached.as_str(), "SRQ limit reached");
}
