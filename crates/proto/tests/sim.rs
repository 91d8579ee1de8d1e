//! Deterministic network simulation of two transport QPs: RC, UC and UD under loss,
//! duplication, reordering, corruption and delay, plus the error paths.

#[path = "common/sim_harness.rs"]
mod harness;

use harness::*;
use softrdma_proto::transport::*;
use softrdma_proto::{Mtu, QpType};
use std::time::Duration;

const ALL_RC: &[OpKind] = &[
    OpKind::Send,
    OpKind::SendImm,
    OpKind::Write,
    OpKind::WriteImm,
    OpKind::Read,
    OpKind::Faa,
    OpKind::Cas,
];

fn rc_run(seed: u64, loss: f64, mtu: Mtu, n: usize) -> (u64, Sim) {
    let net = if loss == 0.0 {
        NetCfg::perfect()
    } else {
        NetCfg::lossy(loss)
    };
    let mut sim = Sim::new(QpType::Rc, mtu, net, seed);
    let mut rng = Rng(seed.wrapping_mul(0x1234_5678_9abc_def1));
    let m = mtu.bytes();
    let ops = [
        gen_ops(&mut rng, n, m, ALL_RC),
        gen_ops(&mut rng, n / 2, m, ALL_RC),
    ];
    let exp = Expect::setup(&mut sim, &ops, &mut rng);
    let ctx = format!("seed {seed} loss {loss} mtu {m}");
    let ok = sim.run(Duration::from_secs(3600), |s| exp.done(s));
    assert!(
        ok,
        "{ctx}: did not finish; comps0 {:?} comps1 {:?}",
        sim.nodes[0].comps, sim.nodes[1].comps
    );
    exp.verify(&sim, &ctx);
    (sim.hash, sim)
}

#[test]
fn rc_all_ops_no_loss() {
    for seed in 0..20 {
        let (_, sim) = rc_run(seed, 0.0, Mtu::Mtu1024, 12);
        for n in &sim.nodes {
            let s = n.qp.stats();
            assert_eq!(
                s.retransmitted_packets + s.retries + s.timeouts + s.duplicates,
                0,
                "{s:?}"
            );
        }
    }
}

#[test]
fn rc_all_ops_lossy_many_seeds() {
    let mut retrans = 0;
    for &loss in &[0.01, 0.05, 0.2] {
        for seed in 0..200 {
            let (_, sim) = rc_run(
                seed,
                loss,
                if seed % 2 == 0 {
                    Mtu::Mtu1024
                } else {
                    Mtu::Mtu256
                },
                8,
            );
            retrans += sim.nodes[0].qp.stats().retransmitted_packets;
        }
    }
    assert!(retrans > 0);
}

#[test]
fn rc_deterministic_trace() {
    for seed in [1u64, 7, 42] {
        let (a, _) = rc_run(seed, 0.1, Mtu::Mtu512, 10);
        let (b, _) = rc_run(seed, 0.1, Mtu::Mtu512, 10);
        assert_eq!(a, b, "seed {seed}");
    }
}

fn spec(kind: OpKind, len: u32, nsge: u8) -> OpSpec {
    OpSpec {
        kind,
        len,
        nsge,
        signaled: true,
        inline: false,
        solicited: false,
    }
}

#[test]
fn rc_sizes_exact() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096] {
        let m = mtu.bytes();
        let mut ops = Vec::new();
        for len in [0, 1, m - 1, m, m + 1, 65536] {
            for kind in [
                OpKind::Send,
                OpKind::SendImm,
                OpKind::Write,
                OpKind::WriteImm,
                OpKind::Read,
            ] {
                for nsge in [1, 3] {
                    ops.push(spec(kind, len, nsge));
                }
            }
        }
        for loss in [0.0, 0.1] {
            let net = if loss == 0.0 {
                NetCfg::perfect()
            } else {
                NetCfg::lossy(loss)
            };
            let mut sim = Sim::new(QpType::Rc, mtu, net, 99);
            let mut rng = Rng(3);
            let exp = Expect::setup(
                &mut sim,
                &[ops.clone(), vec![spec(OpKind::Read, 65536, 2)]],
                &mut rng,
            );
            assert!(sim.run(Duration::from_secs(3600), |s| exp.done(s)));
            exp.verify(&sim, &format!("sizes mtu {m} loss {loss}"));
        }
    }
}

#[test]
fn rc_fetch_add_sums_exactly() {
    for seed in 0..20 {
        let ops = vec![spec(OpKind::Faa, 8, 1); 50];
        let mut sim = Sim::new(QpType::Rc, Mtu::Mtu1024, NetCfg::lossy(0.15), seed);
        let mut rng = Rng(seed);
        let exp = Expect::setup(&mut sim, &[ops.clone(), ops], &mut rng);
        assert!(sim.run(Duration::from_secs(3600), |s| exp.done(s)));
        exp.verify(&sim, &format!("faa seed {seed}"));
    }
}

// ---------------------------------------------------------------------------------------
// UC

#[test]
fn uc_no_loss() {
    let kinds = [
        OpKind::Send,
        OpKind::SendImm,
        OpKind::Write,
        OpKind::WriteImm,
    ];
    for seed in 0..20 {
        let mut sim = Sim::new(QpType::Uc, Mtu::Mtu512, NetCfg::perfect(), seed);
        let mut rng = Rng(seed);
        let ops = [
            gen_ops(&mut rng, 12, 512, &kinds),
            gen_ops(&mut rng, 6, 512, &kinds),
        ];
        let exp = Expect::setup(&mut sim, &ops, &mut rng);
        assert!(sim.run(Duration::from_secs(10), |s| exp.done(s)
            && s.inflight() == 0));
        exp.verify(&sim, &format!("uc seed {seed}"));
        for n in &sim.nodes {
            assert_eq!(
                n.qp.stats().acks_sent + n.qp.stats().retransmitted_packets,
                0
            );
        }
    }
}

#[test]
fn uc_lossy_whole_or_nothing() {
    let mtu = 256u32;
    let mut delivered = 0;
    for seed in 0..100 {
        let mut net = NetCfg::lossy(0.05);
        net.dup = 0.02;
        net.jitter = Duration::ZERO;
        net.reorder = 0.01;
        let mut sim = Sim::new(QpType::Uc, Mtu::Mtu256, net, seed);
        let mut rng = Rng(seed);
        let n = 30usize;
        let slot = 4096u64;
        let rbase = sim.nodes[1]
            .env
            .add_region(RECV, n * slot as usize, LOCAL_WRITE);
        let sbase = sim.nodes[0]
            .env
            .add_region(SRC, n * slot as usize, LOCAL_WRITE);
        rng.fill(sim.nodes[0].env.bytes_mut(SRC, sbase, n * slot as usize));
        let mut msgs = Vec::new();
        for i in 0..n {
            sim.nodes[1].env.rq.push_back(RecvRequest {
                wr_id: 1000 + i as u64,
                sges: [Sge {
                    addr: rbase + i as u64 * slot,
                    length: slot as u32,
                    lkey: RECV,
                }]
                .into(),
            });
            let len = 1 + rng.below(u64::from(4 * mtu)) as u32;
            let addr = sbase + i as u64 * slot;
            msgs.push(sim.nodes[0].env.bytes(SRC, addr, len as usize).to_vec());
            sim.post(
                0,
                SendRequest {
                    wr_id: i as u64,
                    op: SendOp::Send,
                    sges: [Sge {
                        addr,
                        length: len,
                        lkey: SRC,
                    }]
                    .into(),
                    inline: None,
                    signaled: true,
                    solicited: false,
                    fence: false,
                    ud: None,
                },
            );
        }
        sim.run(Duration::from_secs(10), |_| false);
        let sends: Vec<_> = sim.nodes[0].comps.iter().collect();
        assert_eq!(sends.len(), n);
        assert!(sends
            .iter()
            .enumerate()
            .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success));
        let mut next = 0usize;
        for (k, c) in sim.nodes[1].comps.iter().enumerate() {
            assert_eq!(c.status, WcStatus::Success);
            assert_eq!(c.wr_id, 1000 + k as u64, "recv requests are used in order");
            let got = sim.nodes[1]
                .env
                .bytes(RECV, rbase + k as u64 * slot, c.byte_len as usize);
            let j = (next..n)
                .find(|&j| msgs[j] == got)
                .unwrap_or_else(|| panic!("seed {seed}: recv {k} matches no message"));
            next = j + 1;
        }
        delivered += sim.nodes[1].comps.len();
    }
    assert!(delivered > 100 * 30 / 2, "{delivered}");
}

// ---------------------------------------------------------------------------------------
// UD

#[test]
fn ud_send_recv() {
    for loss in [0.0, 0.1] {
        let net = if loss == 0.0 {
            NetCfg::perfect()
        } else {
            NetCfg {
                corrupt: 0.0,
                ..NetCfg::lossy(loss)
            }
        };
        let mut sim = Sim::new(QpType::Ud, Mtu::Mtu1024, net, 5);
        let qkey = sim.nodes[1].qp.config().qkey;
        let rbase = sim.nodes[1].env.add_region(RECV, 64 * 2048, LOCAL_WRITE);
        let sbase = sim.nodes[0].env.add_region(SRC, 4096, LOCAL_WRITE);
        let mut rng = Rng(1);
        rng.fill(sim.nodes[0].env.bytes_mut(SRC, sbase, 4096));
        for i in 0..64u64 {
            sim.nodes[1].env.rq.push_back(RecvRequest {
                wr_id: 500 + i,
                sges: [Sge {
                    addr: rbase + i * 2048,
                    length: 2048,
                    lkey: RECV,
                }]
                .into(),
            });
        }
        // (len, qkey, imm)
        let cases: Vec<(u32, u32, Option<u32>)> = vec![
            (0, qkey, None),
            (1, qkey, Some(7)),
            (100, 0x8000_0000, None), // privileged: the QP's own Q_Key
            (1023, qkey, None),
            (1024, qkey, Some(9)),
            (1025, qkey, None), // over the MTU: completes, nothing sent
            (10, 0x4444, None), // wrong Q_Key: dropped at the receiver
            (77, qkey, None),
        ];
        for (i, (len, qk, imm)) in cases.iter().enumerate() {
            sim.post(
                0,
                SendRequest {
                    wr_id: i as u64,
                    op: imm.map_or(SendOp::Send, SendOp::SendWithImm),
                    sges: [Sge {
                        addr: sbase + i as u64,
                        length: *len,
                        lkey: SRC,
                    }]
                    .into(),
                    inline: None,
                    signaled: true,
                    solicited: i == 3,
                    fence: false,
                    ud: Some(UdDest {
                        dest: 1,
                        remote_qpn: 0x22,
                        remote_qkey: *qk,
                    }),
                },
            );
        }
        sim.run(Duration::from_secs(1), |_| false);
        let sends = &sim.nodes[0].comps;
        assert_eq!(sends.len(), cases.len());
        assert!(sends.iter().enumerate().all(|(i, c)| c.wr_id == i as u64
            && c.status == WcStatus::Success
            && c.opcode == WcOpcode::Send));
        assert_eq!(sim.nodes[0].qp.stats().ud_oversize, 1);
        let expect: Vec<usize> = vec![0, 1, 2, 3, 4, 7];
        let recvs = &sim.nodes[1].comps;
        if loss == 0.0 {
            assert_eq!(recvs.len(), expect.len());
            assert_eq!(sim.nodes[1].qp.stats().qkey_violations, 1);
        }
        for (k, c) in recvs.iter().enumerate() {
            // find which case this is by length
            let i = *expect
                .iter()
                .find(|&&i| cases[i].0 + 40 == c.byte_len)
                .expect("known length");
            assert_eq!(c.status, WcStatus::Success);
            assert_eq!(c.src_qp, 0x11);
            assert_eq!(c.imm_data, cases[i].2);
            assert_eq!(c.solicited, i == 3);
            let slot = rbase + (c.wr_id - 500) * 2048;
            // The GRH area holds the IPv4 header the datagram came with, as the receiving
            // device builds it from the addresses and the packet's length.
            let len = cases[i].0 as usize;
            let imm = if cases[i].2.is_some() { 4 } else { 0 };
            let plen = 12 + 8 + imm + len + (4 - len % 4) % 4 + 4;
            let grh = softrdma_proto::device::grh_for(node_addr(0).ip(), node_addr(1).ip(), plen);
            assert_eq!(sim.nodes[1].env.bytes(RECV, slot, 40), &grh[..]);
            assert_eq!(grh[20..22], [0x45, 0]);
            let want = sim.nodes[0].env.bytes(SRC, sbase + i as u64, len).to_vec();
            assert_eq!(sim.nodes[1].env.bytes(RECV, slot + 40, len), &want[..]);
            assert_eq!(c.wr_id, 500 + k as u64);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Error paths

fn simple_sim(qp_type: QpType) -> Sim {
    let mut sim = Sim::new(qp_type, Mtu::Mtu1024, NetCfg::perfect(), 11);
    for n in &mut sim.nodes {
        let b = n.env.add_region(SRC, 1 << 16, LOCAL_WRITE);
        for (i, x) in n.env.bytes_mut(SRC, b, 1 << 16).iter_mut().enumerate() {
            *x = i as u8;
        }
        n.env.add_region(RECV, 1 << 16, LOCAL_WRITE);
        n.env
            .add_region(REMOTE, 1 << 16, LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ);
        n.env.add_region(ATOMIC, 64, LOCAL_WRITE | REMOTE_ATOMIC);
    }
    sim
}

fn req(wr_id: u64, op: SendOp, len: u32, sim: &Sim) -> SendRequest {
    SendRequest {
        wr_id,
        op,
        sges: [Sge {
            addr: sim.nodes[0].env.base(SRC),
            length: len,
            lkey: SRC,
        }]
        .into(),
        inline: None,
        signaled: true,
        solicited: false,
        fence: false,
        ud: None,
    }
}

fn statuses(sim: &Sim, node: usize) -> Vec<(u64, WcStatus)> {
    sim.nodes[node]
        .comps
        .iter()
        .filter(|c| !c.is_recv)
        .map(|c| (c.wr_id, c.status))
        .collect()
}

fn post_recv(sim: &mut Sim, node: usize, wr_id: u64, len: u32) {
    let addr = sim.nodes[node].env.base(RECV);
    sim.nodes[node].env.rq.push_back(RecvRequest {
        wr_id,
        sges: [Sge {
            addr,
            length: len,
            lkey: RECV,
        }]
        .into(),
    });
}

#[test]
fn bad_rkey_remote_access_error_then_flush() {
    for read in [false, true] {
        let mut sim = simple_sim(QpType::Rc);
        let base = sim.nodes[1].env.base(REMOTE);
        let op = if read {
            SendOp::RdmaRead {
                remote_addr: base,
                rkey: 99,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr: base,
                rkey: 99,
            }
        };
        let mut r = req(1, op, 100, &sim);
        if read {
            r.sges[0].lkey = RECV;
            r.sges[0].addr = sim.nodes[0].env.base(RECV);
        }
        sim.post(0, r);
        for i in 2..5 {
            let r = req(
                i,
                SendOp::RdmaWrite {
                    remote_addr: base,
                    rkey: REMOTE,
                },
                10,
                &sim,
            );
            sim.post(0, r);
        }
        sim.run(Duration::from_secs(1), |_| false);
        assert_eq!(
            statuses(&sim, 0),
            vec![
                (1, WcStatus::RemAccessErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr),
                (4, WcStatus::WrFlushErr)
            ]
        );
        assert!(sim.nodes[0].qp.is_error() && sim.nodes[1].qp.is_error());
        assert!(sim.nodes[1].events.contains(&QpEvent::AccessErr));
        assert_eq!(sim.nodes[1].qp.stats().err_naks_sent, 1);
        // By kind, on both sides: one remote-access NAK, nothing else.
        let (tx, rx) = (sim.nodes[1].qp.stats(), sim.nodes[0].qp.stats());
        assert_eq!(
            (tx.access_naks_sent, tx.inv_req_naks_sent, tx.op_naks_sent),
            (1, 0, 0)
        );
        assert_eq!(
            (
                rx.err_naks_received,
                rx.access_naks_received,
                rx.inv_req_naks_received,
                rx.op_naks_received
            ),
            (1, 1, 0, 0)
        );
    }
}

#[test]
fn out_of_bounds_write_is_remote_access_error() {
    let mut sim = simple_sim(QpType::Rc);
    let base = sim.nodes[1].env.base(REMOTE);
    let r = req(
        1,
        SendOp::RdmaWrite {
            remote_addr: base + (1 << 16) - 10,
            rkey: REMOTE,
        },
        100,
        &sim,
    );
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn rnr_retry_exceeded() {
    for rnr_retry in 0..=3u8 {
        let mut sim = simple_sim(QpType::Rc);
        let mut cfg = *sim.nodes[0].qp.config();
        cfg.rnr_retry = rnr_retry;
        sim.nodes[0].qp.set_config(cfg);
        let r = req(1, SendOp::Send, 3000, &sim);
        sim.post(0, r);
        let r = req(2, SendOp::Send, 10, &sim);
        sim.post(0, r);
        sim.run(Duration::from_secs(10), |_| false);
        assert_eq!(
            statuses(&sim, 0),
            vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(
            sim.nodes[0].qp.stats().rnr_naks_received,
            u64::from(rnr_retry) + 1
        );
        assert_eq!(
            sim.nodes[1].qp.stats().rnr_naks_sent,
            u64::from(rnr_retry) + 1
        );
        assert!(!sim.nodes[1].qp.is_error());
    }
}

#[test]
fn rnr_then_late_recv_succeeds() {
    for rnr_retry in [3u8, 7] {
        let mut sim = simple_sim(QpType::Rc);
        for n in &mut sim.nodes {
            let mut cfg = *n.qp.config();
            cfg.rnr_retry = rnr_retry;
            cfg.min_rnr_timer = 14; // 1.28 ms
            n.qp.set_config(cfg);
        }
        let r = req(1, SendOp::Send, 3000, &sim);
        sim.post(0, r);
        let r = req(2, SendOp::SendWithImm(5), 5, &sim);
        sim.post(0, r);
        // Nothing posted for 2 ms of virtual time, then the receives arrive.
        sim.run(Duration::from_millis(2), |_| false);
        assert!(sim.nodes[0].comps.is_empty());
        post_recv(&mut sim, 1, 10, 4000);
        post_recv(&mut sim, 1, 11, 4000);
        assert!(
            sim.run(Duration::from_secs(10), |s| s.nodes[0].comps.len() == 2
                && s.nodes[1].comps.len() == 2)
        );
        assert_eq!(
            statuses(&sim, 0),
            vec![(1, WcStatus::Success), (2, WcStatus::Success)]
        );
        let rc = &sim.nodes[1].comps;
        assert_eq!(
            (rc[0].wr_id, rc[0].byte_len, rc[1].wr_id, rc[1].imm_data),
            (10, 3000, 11, Some(5))
        );
        assert!(sim.nodes[0].qp.stats().rnr_naks_received >= 1);
        let got = sim.nodes[1]
            .env
            .bytes(RECV, sim.nodes[1].env.base(RECV), 5)
            .to_vec();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
    }
}

#[test]
fn peer_gone_retry_exceeded() {
    for retry_cnt in [0u8, 3, 6, 7] {
        let mut sim = simple_sim(QpType::Rc);
        sim.net.blackhole = true;
        let mut cfg = *sim.nodes[0].qp.config();
        cfg.retry_cnt = retry_cnt;
        sim.nodes[0].qp.set_config(cfg);
        let r = req(1, SendOp::Send, 5000, &sim);
        sim.post(0, r);
        let r = req(2, SendOp::Send, 10, &sim);
        sim.post(0, r);
        sim.run(Duration::from_secs(100), |_| false);
        assert_eq!(
            statuses(&sim, 0),
            vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
        );
        let st = sim.nodes[0].qp.stats();
        assert_eq!(st.timeouts, u64::from(retry_cnt) + 1);
        // Tail-loss probes go out between the timeouts (two packets each: the first
        // unacknowledged and the last sent), but consume no retry: RETRY_EXC_ERR still comes
        // after exactly retry_cnt + 1 local ACK timeouts.
        assert!(st.probes > 0);
        assert_eq!(st.retries, u64::from(retry_cnt));
        // Each retry resends the 5 packets of the first message (the second, a SEND too,
        // waits for the first ACK: before it the responder's receives are unknown).
        assert_eq!(
            st.retransmitted_packets,
            5 * u64::from(retry_cnt) + 2 * st.probes
        );
        let t = sim.now - sim.base;
        let one = softrdma_proto::local_ack_timeout(10).unwrap();
        assert_eq!(t, one * (u32::from(retry_cnt) + 1));
    }
}

#[test]
fn recv_too_small_len_err_and_rem_inv_req() {
    let mut sim = simple_sim(QpType::Rc);
    post_recv(&mut sim, 1, 10, 50);
    let r = req(1, SendOp::Send, 100, &sim);
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::RemInvReqErr)]);
    let rc: Vec<_> = sim.nodes[1]
        .comps
        .iter()
        .map(|c| (c.wr_id, c.status, c.is_recv))
        .collect();
    assert_eq!(rc, vec![(10, WcStatus::LocLenErr, true)]);
    assert!(sim.nodes[1].events.contains(&QpEvent::ReqErr));
    assert!(sim.nodes[1].qp.is_error());
}

#[test]
fn local_bad_lkey_loc_prot_err() {
    let mut sim = simple_sim(QpType::Rc);
    post_recv(&mut sim, 1, 10, 5000);
    let mut r = req(1, SendOp::Send, 100, &sim);
    r.sges[0].lkey = 77;
    sim.post(0, r);
    let r = req(2, SendOp::Send, 10, &sim);
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(
        statuses(&sim, 0),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(sim.nodes[0].qp.stats().tx_packets, 0);
    // A READ whose destination is not writable.
    let mut sim = simple_sim(QpType::Rc);
    let base = sim.nodes[1].env.base(REMOTE);
    let r = req(
        1,
        SendOp::RdmaRead {
            remote_addr: base,
            rkey: REMOTE,
        },
        100,
        &sim,
    );
    sim.nodes[0].env.regions.get_mut(&SRC).unwrap().access = 0;
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::LocProtErr)]);
}

#[test]
fn set_error_flushes_in_order() {
    let mut sim = simple_sim(QpType::Rc);
    sim.net.blackhole = true;
    for i in 0..5 {
        let r = req(i, SendOp::Send, 2000, &sim);
        sim.post(0, r);
    }
    sim.run(Duration::from_micros(100), |_| false);
    assert!(sim.nodes[0].comps.is_empty());
    sim.nodes[0].qp.set_error();
    assert!(sim.nodes[0].qp.is_error());
    let r = req(9, SendOp::Send, 1, &sim);
    sim.post(0, r);
    sim.pump();
    let want: Vec<_> = [0, 1, 2, 3, 4, 9]
        .iter()
        .map(|&i| (i, WcStatus::WrFlushErr))
        .collect();
    assert_eq!(statuses(&sim, 0), want);
    let mut buf = vec![0u8; 5000];
    let n = &mut sim.nodes[0];
    assert!(n.qp.poll_transmit(sim.now, &mut buf, &mut n.env).is_none());
    assert!(n.qp.poll_timeout().is_none());
}

#[test]
fn qp_access_flags_and_misaligned_atomic() {
    // READ to a QP without remote-read access → invalid request.
    let mut sim = simple_sim(QpType::Rc);
    let mut cfg = *sim.nodes[1].qp.config();
    cfg.access_flags = REMOTE_WRITE;
    sim.nodes[1].qp.set_config(cfg);
    let base = sim.nodes[1].env.base(REMOTE);
    let mut r = req(
        1,
        SendOp::RdmaRead {
            remote_addr: base,
            rkey: REMOTE,
        },
        8,
        &sim,
    );
    r.sges[0].lkey = RECV;
    r.sges[0].addr = sim.nodes[0].env.base(RECV);
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::RemInvReqErr)]);
    // Misaligned atomic.
    let mut sim = simple_sim(QpType::Rc);
    let abase = sim.nodes[1].env.base(ATOMIC);
    let mut r = req(
        1,
        SendOp::FetchAndAdd {
            remote_addr: abase + 4,
            rkey: ATOMIC,
            add: 1,
        },
        8,
        &sim,
    );
    r.sges[0].lkey = RECV;
    r.sges[0].addr = sim.nodes[0].env.base(RECV);
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::RemInvReqErr)]);
}

#[test]
fn comm_est_once_and_unsignaled_silent() {
    let mut sim = simple_sim(QpType::Rc);
    let base = sim.nodes[1].env.base(REMOTE);
    for i in 0..4 {
        let mut r = req(
            i,
            SendOp::RdmaWrite {
                remote_addr: base,
                rkey: REMOTE,
            },
            100,
            &sim,
        );
        r.signaled = i == 3;
        sim.post(0, r);
    }
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(3, WcStatus::Success)]);
    assert_eq!(sim.nodes[1].events, vec![QpEvent::CommEst]);
    // One coalesced ACK for the four AckReq packets at most... at least the last one acked.
    assert!(sim.nodes[1].qp.stats().acks_sent >= 1);
}

/// Every packet the simulator saw was asserted to parse; this feeds hostile variants of
/// them (and random bytes) to fresh QPs of every type: nothing may panic.
#[test]
fn hostile_packets_do_not_panic() {
    let mut sim = Sim::new(QpType::Rc, Mtu::Mtu256, NetCfg::lossy(0.05), 3);
    sim.record = Some(Vec::new());
    let mut rng = Rng(77);
    let ops = [
        gen_ops(&mut rng, 10, 256, ALL_RC),
        gen_ops(&mut rng, 5, 256, ALL_RC),
    ];
    let exp = Expect::setup(&mut sim, &ops, &mut rng);
    assert!(sim.run(Duration::from_secs(3600), |s| exp.done(s)));
    let reprs = sim.record.take().unwrap();
    let mut pkts: Vec<Vec<u8>> = Vec::new();
    for (_, r) in &reprs {
        let mut b = vec![0u8; r.buffer_len()];
        let payload = vec![0xabu8; r.payload_len];
        r.emit(
            &mut softrdma_wire::roce::Packet::new_unchecked(&mut b[..]),
            &payload,
        )
        .unwrap();
        pkts.push(b);
    }
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut sim2 = simple_sim(qp_type);
        for round in 0..20_000u64 {
            let mut p = pkts[rng.below(pkts.len() as u64) as usize].clone();
            if qp_type != QpType::Rc {
                p[0] = (p[0] & 0x1f) | if qp_type == QpType::Uc { 0x20 } else { 0x60 };
            }
            for _ in 0..rng.below(4) {
                let i = rng.below(p.len() as u64) as usize;
                p[i] = rng.next_u64() as u8;
            }
            if round % 7 == 0 {
                p.truncate(rng.below(p.len() as u64 + 1) as usize);
            }
            if round % 11 == 0 {
                p = (0..rng.below(80)).map(|_| rng.next_u64() as u8).collect();
            }
            // Point at the QP so the packet gets past the QPN check.
            if p.len() >= 8 {
                p[5..8].copy_from_slice(&[0, 0, 0x22]);
            }
            let now = sim2.now;
            let n = &mut sim2.nodes[1];
            n.qp.handle_packet(
                now,
                &p,
                &softrdma_proto::transport::RxMeta { grh: [0; 40] },
                &mut n.env,
            );
            if round % 64 == 0 {
                n.env.rq.push_back(RecvRequest {
                    wr_id: round,
                    sges: [Sge {
                        addr: n.env.base(RECV),
                        length: 512,
                        lkey: RECV,
                    }]
                    .into(),
                });
            }
            let mut buf = vec![0u8; 4200];
            while let Some(t) = n.qp.poll_transmit(now, &mut buf, &mut n.env) {
                let v = softrdma_wire::roce::Packet::new_checked(&buf[..t.len]).unwrap();
                softrdma_wire::roce::Repr::parse(&v).unwrap();
            }
            while n.qp.poll_completion().is_some() {}
            if n.qp.is_error() {
                sim2 = simple_sim(qp_type);
            }
        }
    }
}

#[test]
fn uc_errors_drop_silently() {
    let mut sim = simple_sim(QpType::Uc);
    let base = sim.nodes[1].env.base(REMOTE);
    // Bad rkey: the message is dropped at the responder; the sender completes anyway.
    let r = req(
        1,
        SendOp::RdmaWrite {
            remote_addr: base,
            rkey: 99,
        },
        3000,
        &sim,
    );
    sim.post(0, r);
    // Receive too small: LOC_LEN_ERR at the responder, the QP stays usable.
    post_recv(&mut sim, 1, 10, 50);
    let r = req(2, SendOp::Send, 100, &sim);
    sim.post(0, r);
    post_recv(&mut sim, 1, 11, 5000);
    let r = req(3, SendOp::Send, 3000, &sim);
    sim.post(0, r);
    // No receive at all: dropped.
    let r = req(4, SendOp::Send, 10, &sim);
    sim.post(0, r);
    // READ on UC: local QP operation error.
    let r = req(
        5,
        SendOp::RdmaRead {
            remote_addr: base,
            rkey: REMOTE,
        },
        10,
        &sim,
    );
    sim.post(0, r);
    sim.run(Duration::from_secs(1), |_| false);
    assert_eq!(
        statuses(&sim, 0),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success),
            (5, WcStatus::LocQpOpErr)
        ]
    );
    let rc: Vec<_> = sim.nodes[1]
        .comps
        .iter()
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    assert_eq!(
        rc,
        vec![(10, WcStatus::LocLenErr, 0), (11, WcStatus::Success, 3000)]
    );
    assert!(!sim.nodes[1].qp.is_error());
    assert_eq!(sim.nodes[1].qp.stats().no_recv_drops, 1);
}

/// Long soak: `SIM_SEEDS=5000 cargo test --release --test sim rc_soak -- --ignored`.
#[test]
#[ignore]
fn rc_soak() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for seed in 0..seeds {
        let loss = [0.0, 0.02, 0.1, 0.3][(seed % 4) as usize];
        let mtu = [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][(seed % 3) as usize];
        rc_run(seed + 1_000_000, loss, mtu, 16);
    }
}

/// A lost tail packet, a lost ACK, and a lost sequence NAK (with the gap it reported) are
/// each recovered by a tail-loss probe long before the local ACK timeout (19: 2.1 s, as
/// rdma_cm sets it), and the probe consumes no retry: with retry_cnt 0 the SEND still
/// succeeds. Packets: #0..#2 the SEND's three, #3 the responder's ACK (or NAK).
#[test]
fn lone_losses_recovered_by_probe_not_timeout() {
    for (what, drop) in [
        ("tail packet", vec![2u64]),
        ("ACK", vec![3]),
        ("middle packet and its NAK", vec![1, 3]),
    ] {
        let mut sim = simple_sim(QpType::Rc);
        for n in &mut sim.nodes {
            let mut cfg = *n.qp.config();
            cfg.timeout = 19;
            cfg.retry_cnt = 0;
            n.qp.set_config(cfg);
        }
        sim.drop_packets = drop;
        post_recv(&mut sim, 1, 10, 4096);
        let r = req(1, SendOp::Send, 3000, &sim);
        sim.post(0, r);
        let done = sim.run(Duration::from_secs(10), |s| {
            s.nodes[0].comps.len() == 1 && s.nodes[1].comps.len() == 1
        });
        assert!(done, "{what}: did not finish");
        assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::Success)], "{what}");
        let rc = &sim.nodes[1].comps[0];
        assert_eq!(
            (rc.status, rc.byte_len),
            (WcStatus::Success, 3000),
            "{what}"
        );
        let base = sim.nodes[1].env.base(RECV);
        let got = sim.nodes[1].env.bytes(RECV, base, 3000);
        assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8), "{what}");
        let st = sim.nodes[0].qp.stats();
        assert_eq!(st.timeouts, 0, "{what}: {st:?}");
        assert!(st.probes >= 1, "{what}: {st:?}");
        let took = sim.now - sim.base;
        assert!(took < Duration::from_millis(10), "{what}: {took:?}");
        if what.contains("NAK") {
            assert_eq!(sim.nodes[1].qp.stats().seq_naks_sent, 1, "{what}");
        }
    }
}

/// On a path marked lossless (a same-host ring) the requester sends no tail-loss probes: a
/// lost tail (the path closed with it) is resent by the local ACK timeout instead, and the
/// data arrives intact. Marked lossy again with packets outstanding, it probes at once
/// again. A dead peer on a lossless path still gets RETRY_EXC_ERR after exactly
/// retry_cnt + 1 timeouts, with nothing resent but the timeouts' retries.
#[test]
fn a_lossless_path_is_not_probed_and_the_timeout_still_recovers() {
    /// A SEND of three packets from a QP on a lossless path, its tail (#2) lost.
    fn lossless_send_losing_its_tail() -> Sim {
        let mut sim = simple_sim(QpType::Rc);
        let now = sim.now;
        sim.nodes[0].qp.set_lossless_path(true, now);
        sim.drop_packets = vec![2];
        post_recv(&mut sim, 1, 10, 4096);
        let r = req(1, SendOp::Send, 3000, &sim);
        sim.post(0, r);
        sim
    }

    // The tail lost: recovered by one timeout, no probe.
    let mut sim = lossless_send_losing_its_tail();
    assert!(
        sim.run(Duration::from_secs(100), |s| s.nodes[0].comps.len() == 1
            && s.nodes[1].comps.len() == 1)
    );
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::Success)]);
    let base = sim.nodes[1].env.base(RECV);
    let got = sim.nodes[1].env.bytes(RECV, base, 3000);
    assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
    let st = sim.nodes[0].qp.stats();
    assert_eq!((st.probes, st.timeouts), (0, 1), "{st:?}");

    // Lossy again while the tail is missing: a probe recovers it, long before a timeout.
    let mut sim = lossless_send_losing_its_tail();
    // (Well before the local ACK timeout, 4.2 ms here.)
    sim.run(Duration::from_millis(2), |_| false);
    assert_eq!(sim.nodes[0].qp.stats().probes, 0);
    let now = sim.now;
    sim.nodes[0].qp.set_lossless_path(false, now);
    let start = sim.now;
    assert!(sim.run(Duration::from_secs(100), |s| s.nodes[0].comps.len() == 1));
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::Success)]);
    let st = sim.nodes[0].qp.stats();
    assert_eq!((st.probes, st.timeouts), (1, 0), "{st:?}");
    assert!(sim.now - start < Duration::from_millis(2));

    // A dead peer.
    let mut sim = simple_sim(QpType::Rc);
    sim.net.blackhole = true;
    let now = sim.now;
    sim.nodes[0].qp.set_lossless_path(true, now);
    let r = req(1, SendOp::Send, 5000, &sim);
    sim.post(0, r);
    sim.run(Duration::from_secs(100), |_| false);
    assert_eq!(statuses(&sim, 0), vec![(1, WcStatus::RetryExcErr)]);
    let st = sim.nodes[0].qp.stats();
    let retry_cnt = u64::from(sim.nodes[0].qp.config().retry_cnt);
    assert_eq!(
        (st.probes, st.timeouts, st.retransmitted_packets),
        (0, retry_cnt + 1, 5 * retry_cnt)
    );
}

/// A sequence NAK restarts the sending at the missing PSN, and that packet goes out twice
/// (the responder NAKs a gap once; if the resent packet were lost too it would stay silent
/// until a probe): one loss, one NAK, no probe, no timeout.
#[test]
fn seq_nak_resends_missing_packet_twice() {
    let mut sim = simple_sim(QpType::Rc);
    sim.record = Some(Vec::new());
    sim.drop_packets = vec![1];
    post_recv(&mut sim, 1, 10, 4096);
    let r = req(1, SendOp::Send, 3000, &sim);
    sim.post(0, r);
    assert!(
        sim.run(Duration::from_secs(10), |s| s.nodes[1].comps.len() == 1
            && s.nodes[0].comps.len() == 1)
    );
    let st = sim.nodes[0].qp.stats();
    assert_eq!(
        (st.seq_naks_received, st.probes, st.timeouts),
        (1, 0, 0),
        "{st:?}"
    );
    let rec = sim.record.as_ref().unwrap();
    let sent: Vec<u32> = rec
        .iter()
        .filter(|(n, _)| *n == 0)
        .map(|(_, r)| r.bth.psn)
        .collect();
    let p0 = sent[0];
    let p = |i: u32| (p0 + i) & 0xff_ffff;
    // #0 #1(lost) #2, NAK(#1), then #1 (asking for an ACK), #1, #2.
    assert_eq!(sent, vec![p(0), p(1), p(2), p(1), p(1), p(2)]);
    assert!(
        rec.iter()
            .filter(|(n, _)| *n == 0)
            .nth(3)
            .unwrap()
            .1
            .bth
            .ack_req
    );
}

/// Memory window binds and local invalidates interleaved with SENDs and WRITEs, and SENDs
/// with invalidate, under loss, duplication and reordering: every local operation is
/// carried out exactly once in posting order (go-back-N resends never repeat one), every
/// request completes successfully in posting order, and each SEND with invalidate
/// invalidates exactly once at the responder (duplicates are only re-acknowledged).
#[test]
fn rc_local_operations_and_send_with_invalidate_exactly_once_under_loss() {
    let mut retrans = 0;
    for seed in 0..60 {
        let loss = [0.0, 0.05, 0.2][seed as usize % 3];
        let mut sim = simple_sim(QpType::Rc);
        sim.net = NetCfg::lossy(loss);
        sim.rng = Rng(seed);
        let mut want_local = Vec::new();
        let mut want_remote = Vec::new();
        let mut order = Vec::new();
        let dst = sim.nodes[1].env.base(REMOTE);
        for i in 0..40u64 {
            let op = match i % 5 {
                0 => SendOp::BindMw(MwBind {
                    mw: i,
                    ..MwBind::default()
                }),
                1 => SendOp::RdmaWrite {
                    remote_addr: dst + i * 64,
                    rkey: REMOTE,
                },
                2 => SendOp::LocalInv(0x100 + i as u32),
                3 => SendOp::SendWithInv(0x200 + i as u32),
                _ => SendOp::Send,
            };
            match op {
                SendOp::BindMw(_) => want_local.push((i, false)),
                SendOp::LocalInv(k) => want_local.push((u64::from(k), false)),
                SendOp::SendWithInv(k) => want_remote.push((u64::from(k), true)),
                _ => {}
            }
            if matches!(op, SendOp::Send | SendOp::SendWithInv(_)) {
                post_recv(&mut sim, 1, 1000 + i, 64);
            }
            sim.post(0, req(i, op, 64, &sim));
            order.push(i);
        }
        let done = sim.run(Duration::from_secs(60), |s| s.nodes[0].comps.len() >= 40);
        assert!(done, "seed {seed}: {:?}", statuses(&sim, 0));
        let st = statuses(&sim, 0);
        assert_eq!(
            st,
            order
                .iter()
                .map(|&i| (i, WcStatus::Success))
                .collect::<Vec<_>>(),
            "seed {seed}"
        );
        assert_eq!(sim.nodes[0].env.local_ops, want_local, "seed {seed}");
        assert_eq!(sim.nodes[1].env.local_ops, want_remote, "seed {seed}");
        let inv: Vec<_> = sim.nodes[1]
            .comps
            .iter()
            .filter_map(|c| c.invalidated_rkey)
            .map(|k| (u64::from(k), true))
            .collect();
        assert_eq!(inv, want_remote, "seed {seed}");
        retrans += sim.nodes[0].qp.stats().retransmitted_packets;
    }
    assert!(retrans > 0, "the losses made the requester resend");
}

/// Two QPs that agree on a segment beyond the path MTU (softrdma's two QPs of one host):
/// every RC operation byte-exact, with and without loss, in far fewer packets.
#[test]
fn rc_all_ops_with_a_same_host_segment() {
    for &(loss, seeds) in &[(0.0, 10u64), (0.05, 40)] {
        for seed in 0..seeds {
            let net = if loss == 0.0 {
                NetCfg::perfect()
            } else {
                NetCfg::lossy(loss)
            };
            let mut sim = Sim::new(QpType::Rc, Mtu::Mtu1024, net, seed);
            for n in sim.nodes.iter_mut() {
                n.qp.set_segment(Some(16384));
                assert_eq!(n.qp.segment(), 16384);
            }
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            // Lengths drawn for the segment: messages of one to several segments.
            let ops = [
                gen_ops(&mut rng, 8, 16384, ALL_RC),
                gen_ops(&mut rng, 4, 16384, ALL_RC),
            ];
            let exp = Expect::setup(&mut sim, &ops, &mut rng);
            let ctx = format!("segment 16384 seed {seed} loss {loss}");
            assert!(
                sim.run(Duration::from_secs(3600), |s| exp.done(s)),
                "{ctx}: did not finish"
            );
            exp.verify(&sim, &ctx);
            if loss == 0.0 {
                let s = sim.nodes[0].qp.stats();
                assert_eq!(s.retransmitted_packets, 0, "{ctx}: {s:?}");
            }
        }
    }
}

/// `n` RDMA WRITEs of `len` bytes each, posted back to back from one source region to
/// consecutive places of the peer's, over an RC path of 256-byte packets with `loss` (and the
/// duplication, reordering and corruption that come with it; a perfect network at 0): runs
/// until every one completes, checks that they completed successfully in posting order and
/// that the target holds the source byte for byte, and returns the simulation.
fn write_stream(seed: u64, loss: f64, n: u64, len: u64) -> Sim {
    let net = if loss == 0.0 {
        NetCfg::perfect()
    } else {
        NetCfg::lossy(loss)
    };
    stream(seed, net, n, len, false)
}

fn read_stream(seed: u64, net: NetCfg, n: u64, len: u64) -> Sim {
    stream(seed, net, n, len, true)
}

/// `n` RDMA WRITEs (or READs) of `len` bytes each, posted at once on node 0, moving a
/// patterned region of node 0 into node 1 (of node 1 into node 0): all complete in order,
/// successfully, and the bytes land exactly.
fn stream(seed: u64, net: NetCfg, n: u64, len: u64, read: bool) -> Sim {
    let mut sim = Sim::new(QpType::Rc, Mtu::Mtu256, net, seed);
    let size = (n * len) as usize;
    let (from, to) = if read { (1, 0) } else { (0, 1) };
    let local = sim.nodes[0].env.add_region(SRC, size, LOCAL_WRITE);
    let remote_access = if read { REMOTE_READ } else { REMOTE_WRITE };
    let remote = sim.nodes[1]
        .env
        .add_region(REMOTE, size, LOCAL_WRITE | remote_access);
    let (src_key, src) = if read { (REMOTE, remote) } else { (SRC, local) };
    let (dst_key, dst) = if read { (SRC, local) } else { (REMOTE, remote) };
    for (i, x) in sim.nodes[from]
        .env
        .bytes_mut(src_key, src, size)
        .iter_mut()
        .enumerate()
    {
        *x = (i * 13 + i / 199) as u8;
    }
    for k in 0..n {
        let remote_addr = remote + k * len;
        let op = if read {
            SendOp::RdmaRead {
                remote_addr,
                rkey: REMOTE,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr,
                rkey: REMOTE,
            }
        };
        let mut r = req(k, op, len as u32, &sim);
        r.sges[0].addr = local + k * len;
        sim.post(0, r);
    }
    let ctx = format!("seed {seed} loss {} read {read}", sim.net.loss);
    assert!(
        sim.run(Duration::from_secs(600), |s| s.nodes[0].comps.len()
            == n as usize),
        "{ctx}: did not finish"
    );
    assert_eq!(
        statuses(&sim, 0),
        (0..n).map(|k| (k, WcStatus::Success)).collect::<Vec<_>>(),
        "{ctx}"
    );
    let want = sim.nodes[from].env.bytes(src_key, src, size).to_vec();
    assert!(
        sim.nodes[to].env.bytes(dst_key, dst, size) == &want[..],
        "{ctx}: data differs"
    );
    sim
}

/// A stream that keeps the send window full (four 64 KiB WRITEs of 256-byte packets: 1,024
/// packets, eight windows), where the requester asks for an ACK only every sixteenth of a
/// window (8 packets; `full_window_asks_for_acks_spaced`), lands byte-exact and completes in
/// order: on a perfect network with nothing resent and no probe, and under loss,
/// duplication, reordering and corruption (the ACKs asked for in flight, probes and sequence
/// NAKs keep it going).
#[test]
fn full_window_stream_acks_spaced_and_completes_under_loss() {
    for (seed, loss) in [(1u64, 0.0), (2, 0.02), (3, 0.05), (4, 0.1), (5, 0.05)] {
        let sim = write_stream(seed, loss, 4, 64 * 1024);
        if loss == 0.0 {
            let st = sim.nodes[0].qp.stats();
            assert_eq!(
                (st.retransmitted_packets, st.probes, st.timeouts),
                (0, 0, 0),
                "seed {seed}"
            );
        }
    }
}

/// 300 one-packet WRITEs posted back to back, most of whose ends ask for no ACK (a plain
/// WRITE follows; `writes_queued_back_to_back_share_ack_requests`), land byte-exact and
/// complete in order, on a perfect network and under loss, duplication, reordering and
/// corruption.
#[test]
fn back_to_back_writes_share_ack_requests_and_complete_under_loss() {
    for (seed, loss) in [(11u64, 0.0), (12, 0.02), (13, 0.05), (14, 0.1)] {
        write_stream(seed, loss, 300, 200);
    }
}

/// Forty 64 KiB READs (256 packets of 256 bytes each) back to back land byte-exact and
/// complete in order under 1% loss, each loss repaired by asking again from the missing PSN
/// without waiting for the local ACK timeout (a tail-loss probe of a READ asks first for its
/// last packet only, and the answer out of order restarts it even after an earlier restart
/// at that PSN lost its own responses); and under loss, duplication, reordering and
/// corruption.
#[test]
fn read_stream_recovers_losses_without_timeouts() {
    for seed in 1..9u64 {
        let mut net = NetCfg::perfect();
        net.loss = 0.01;
        let sim = read_stream(seed, net, 40, 64 * 1024);
        let st = sim.nodes[0].qp.stats();
        assert!(st.retries > 0, "seed {seed}: losses were repaired");
        assert_eq!(st.timeouts, 0, "seed {seed}: {st:?}");
    }
    for seed in 11..14u64 {
        read_stream(seed, NetCfg::lossy(0.02), 20, 64 * 1024);
    }
}

/// What a READ stream's loss repairs cost (BENCHMARKS.md, "A READ's first tail-loss probe
/// asks for one packet"): forty 64 KiB READs at MTU 256 under 1%, 3% and 10% loss, seeds
/// 1-20, each landing byte-exact; prints the simulated time, probes and local ACK timeouts
/// summed. `cargo test --release -p softrdma-proto --test sim read_stream_loss_costs --
/// --ignored --nocapture`
#[test]
#[ignore]
fn read_stream_loss_costs() {
    for loss in [0.01, 0.03, 0.1] {
        let (mut timeouts, mut probes, mut time) = (0, 0, Duration::ZERO);
        for seed in 1..21u64 {
            let mut net = NetCfg::perfect();
            net.loss = loss;
            let sim = read_stream(seed, net, 40, 64 * 1024);
            let st = sim.nodes[0].qp.stats();
            timeouts += st.timeouts;
            probes += st.probes;
            time += sim.now - sim.base;
        }
        println!("loss {loss}: simulated time {time:?}, probes {probes}, timeouts {timeouts}");
    }
}
