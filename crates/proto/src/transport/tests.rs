//! Packet-level unit tests of the requester, completer and responder, driving one [`Qp`]
//! by hand.

use super::*;
use crate::psn::Psn;
use softrdma_wire::aeth::{self, NakCode, Syndrome};
use softrdma_wire::opcode::Opcode;
use softrdma_wire::{bth, immdt, reth, roce};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One flat memory (key 1, any access) and a receive queue.
struct FlatEnv {
    mem: Vec<u8>,
    rq: VecDeque<RecvRequest>,
    /// Whether the receive queue reports its length (end-to-end credits); off, as on an SRQ.
    credits: bool,
    /// Memory window binds carried out, in order.
    binds: Vec<MwBind>,
    /// Local (`false`) and remote (`true`) invalidations carried out, in order.
    invalidated: Vec<(u32, bool)>,
}

impl FlatEnv {
    fn new() -> FlatEnv {
        FlatEnv {
            mem: (0..1 << 20).map(|i: u32| i as u8).collect(),
            rq: VecDeque::new(),
            credits: false,
            binds: Vec::new(),
            invalidated: Vec::new(),
        }
    }
    fn at(&mut self, key: u32, addr: u64, len: usize) -> Result<&mut [u8], AccessError> {
        if key != 1 {
            return Err(AccessError::InvalidKey);
        }
        self.mem
            .get_mut(addr as usize..addr as usize + len)
            .ok_or(AccessError::OutOfBounds)
    }
}

impl Env for FlatEnv {
    fn read_local(&mut self, sge: &Sge, offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(sge.lkey, sge.addr + u64::from(offset), n)?);
        Ok(())
    }
    fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
        self.at(sge.lkey, sge.addr + u64::from(offset), src.len())?
            .copy_from_slice(src);
        Ok(())
    }
    fn check_remote(&mut self, rkey: u32, va: u64, len: u64, _: bool) -> Result<(), AccessError> {
        self.at(rkey, va, len as usize).map(|_| ())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, src: &[u8]) -> Result<(), AccessError> {
        self.at(rkey, va, src.len())?.copy_from_slice(src);
        Ok(())
    }
    fn read_remote(&mut self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(rkey, va, n)?);
        Ok(())
    }
    fn atomic_remote(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let w = self.at(rkey, va, 8)?;
        let orig = u64::from_ne_bytes(w.try_into().unwrap());
        let new = match op {
            AtomicOp::FetchAndAdd { add } => orig.wrapping_add(add),
            AtomicOp::CmpAndSwp { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
        };
        w.copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }
    fn take_recv(&mut self) -> Option<RecvRequest> {
        self.rq.pop_front()
    }
    /// Binds with a zero length fail; the rest succeed.
    fn bind_mw(&mut self, bind: &MwBind) -> Result<(), WcStatus> {
        if bind.length == 0 {
            return Err(WcStatus::MwBindErr);
        }
        self.binds.push(*bind);
        Ok(())
    }
    /// Only keys with 0x77 in the low byte can be invalidated.
    fn local_invalidate(&mut self, rkey: u32) -> Result<(), WcStatus> {
        if rkey & 0xff != 0x77 {
            return Err(WcStatus::LocQpOpErr);
        }
        self.invalidated.push((rkey, false));
        Ok(())
    }
    fn remote_invalidate(&mut self, rkey: u32) -> Result<(), AccessError> {
        if rkey & 0xff != 0x77 {
            return Err(AccessError::InvalidKey);
        }
        self.invalidated.push((rkey, true));
        Ok(())
    }
    fn recv_available(&self) -> Option<u32> {
        self.credits.then_some(self.rq.len() as u32)
    }
}

fn cfg() -> QpConfig {
    QpConfig {
        qp_type: QpType::Rc,
        qp_num: 0x22,
        dest_qp_num: 0x11,
        path_mtu: Mtu::Mtu256,
        sq_psn: 0xff_fffe,
        rq_psn: 100,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 2,
        max_dest_rd_atomic: 2,
        qkey: 0,
        access_flags: 2 | 4 | 8,
        max_send_wr: 100,
    }
}

fn send(wr_id: u64, op: SendOp, len: u32) -> SendRequest {
    SendRequest {
        wr_id,
        op,
        sges: [Sge {
            addr: 0,
            length: len,
            lkey: 1,
        }]
        .into(),
        inline: None,
        signaled: true,
        solicited: false,
        fence: false,
        ud: None,
    }
}

/// Drains the QP's transmissions as parsed packets with their payloads.
fn drain(qp: &mut Qp, env: &mut FlatEnv, now: Instant) -> Vec<(roce::Repr, Vec<u8>)> {
    let mut buf = vec![0u8; 4200];
    let mut out = Vec::new();
    while let Some(t) = qp.poll_transmit(now, &mut buf, env) {
        let p = roce::Packet::new_checked(&buf[..t.len]).unwrap();
        out.push((roce::Repr::parse(&p).unwrap(), p.payload().to_vec()));
    }
    out
}

fn pkt(repr: roce::Repr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce::Packet::new_unchecked(&mut b[..]), payload)
        .unwrap();
    b
}

fn bthr(opcode: Opcode, psn: u32, ack_req: bool) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited_event: false,
        mig_req: false,
        pad_count: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: 0x22,
        ack_req,
        psn,
    }
}

fn ack(psn: u32, syndrome: Syndrome) -> Vec<u8> {
    pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_ACKNOWLEDGE, psn & 0xff_ffff, false),
            aeth: Some(aeth::Repr { syndrome, msn: 0 }),
            ..roce::Repr::default()
        },
        &[],
    )
}

const META: RxMeta = RxMeta { grh: [0; 40] };
const ACK: Syndrome = Syndrome::Ack { credit: 0x1f };

/// A receive request of 100 bytes at `addr`.
fn recv_req(wr_id: u64, addr: u64) -> RecvRequest {
    RecvRequest {
        wr_id,
        sges: [Sge {
            addr,
            length: 100,
            lkey: 1,
        }]
        .into(),
    }
}

/// An RC SEND ONLY request packet with PSN `psn`, AckReq set, carrying `payload`.
fn send_only_pkt(psn: u32, payload: &[u8]) -> Vec<u8> {
    pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_SEND_ONLY, psn, true),
            payload_len: payload.len(),
            ..roce::Repr::default()
        },
        payload,
    )
}

/// In a full send window, the packet that fills it asks for an ACK only if the last request
/// for one went out at least a sixteenth of the window before (8 packets of 128): the ACKs of
/// the requests still in flight move the window on, and the responder answers a stream some
/// eight times less often than a packet each.
#[test]
fn full_window_asks_for_acks_spaced() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    qp.post_send(send(1, SendOp::Send, 256 * 400)).unwrap();
    let pkts = drain(&mut qp, &mut env, now);
    assert_eq!(pkts.len(), 128);
    let first = pkts[0].0.bth.psn;
    let acks: Vec<usize> = (0..128).filter(|&i| pkts[i].0.bth.ack_req).collect();
    assert_eq!(acks, vec![63, 127]);
    // ACKs of 1, then 3, then 4 more packets: each opening fills the window again, and only
    // the 8th packet since the request on #127 asks again.
    let mut sent = Vec::new();
    for acked in [1u32, 4, 8, 9] {
        qp.handle_packet(
            now,
            &ack(Psn::new(first).add(acked - 1).value(), ACK),
            &META,
            &mut env,
        );
        sent.extend(drain(&mut qp, &mut env, now));
    }
    assert_eq!(sent.len(), 9);
    let asked: Vec<bool> = sent.iter().map(|(r, _)| r.bth.ack_req).collect();
    assert_eq!(
        asked,
        [false, false, false, false, false, false, false, true, false]
    );
    // The stream goes on to its end as ACKs come, and completes.
    let mut total = 128 + sent.len();
    let mut last = sent.last().unwrap().0;
    loop {
        qp.handle_packet(now, &ack(last.bth.psn, ACK), &META, &mut env);
        let more = drain(&mut qp, &mut env, now);
        let Some((l, _)) = more.last() else { break };
        total += more.len();
        last = *l;
    }
    assert_eq!(total, 400);
    assert_eq!(last.bth.opcode, Opcode::RC_SEND_LAST);
    assert!(last.bth.ack_req);
    let c = qp.poll_completion().unwrap();
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success));
}

/// A message with a plain RDMA WRITE queued right behind it asks for no ACK unless 8
/// packets went without one (the WRITE's request acknowledges both); the last message queued
/// always asks, and so does one followed by a SEND (which may wait for credits), a WRITE with
/// immediate data or a fenced WRITE. One coalesced ACK completes everything in order.
#[test]
fn writes_queued_back_to_back_share_ack_requests() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    for i in 0..20 {
        qp.post_send(send(i, write_op(), 200)).unwrap();
    }
    let pkts = drain(&mut qp, &mut env, now);
    assert_eq!(pkts.len(), 20);
    let asked: Vec<usize> = (0..20).filter(|&i| pkts[i].0.bth.ack_req).collect();
    assert_eq!(asked, vec![7, 15, 19]);
    qp.handle_packet(now, &ack(pkts[19].0.bth.psn, ACK), &META, &mut env);
    let done: Vec<u64> = completions(&mut qp).iter().map(|c| c.0).collect();
    assert_eq!(done, (0..20).collect::<Vec<_>>());
    // What follows decides: a SEND, a WRITE with immediate data, a fenced WRITE.
    let mut fenced = send(25, write_op(), 200);
    fenced.fence = true;
    for r in [
        send(20, write_op(), 200),
        send(21, SendOp::Send, 200),
        send(22, write_op(), 200),
        send(
            23,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 7,
                imm: 5,
            },
            200,
        ),
        send(24, write_op(), 200),
        fenced,
        send(26, write_op(), 200),
    ] {
        qp.post_send(r).unwrap();
    }
    let pkts = drain(&mut qp, &mut env, now);
    let asked: Vec<bool> = pkts.iter().map(|(r, _)| r.bth.ack_req).collect();
    assert_eq!(asked, [true, false, true, false, true, false, true]);
}

#[test]
fn segmentation_opcodes_psns_and_ackreq() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    // 200 packets: FIRST, MIDDLE x198, LAST; AckReq at most 64 apart and on the last.
    qp.post_send(send(1, SendOp::Send, 256 * 199 + 5)).unwrap();
    qp.post_send(send(2, SendOp::SendWithImm(0xabcd), 0))
        .unwrap();
    let pkts = drain(&mut qp, &mut env, now);
    // The window stops the requester at 128 unacknowledged PSNs.
    assert_eq!(pkts.len(), 128);
    assert_eq!(pkts[0].0.bth.opcode, Opcode::RC_SEND_FIRST);
    assert_eq!(pkts[0].0.bth.psn, 0xff_fffe);
    assert_eq!(pkts[2].0.bth.psn, 0);
    assert!(pkts[1..]
        .iter()
        .all(|(r, p)| r.bth.opcode == Opcode::RC_SEND_MIDDLE && p.len() == 256));
    let acks: Vec<usize> = (0..128).filter(|&i| pkts[i].0.bth.ack_req).collect();
    assert_eq!(acks, vec![63, 127]);
    assert_eq!(&pkts[3].1[..], &env.mem[3 * 256..4 * 256]);
    // An ACK for the 100th packet opens the window again.
    qp.handle_packet(
        now,
        &ack(Psn::new(0xff_fffe).add(99).value(), ACK),
        &META,
        &mut env,
    );
    let more = drain(&mut qp, &mut env, now);
    assert_eq!(more.len(), 73);
    let (last, data) = &more[71];
    assert_eq!(last.bth.opcode, Opcode::RC_SEND_LAST);
    assert!(last.bth.ack_req);
    assert_eq!(data.len(), 5);
    assert_eq!(last.bth.pad_count, 3);
    let (imm, _) = &more[72];
    assert_eq!(imm.bth.opcode, Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
    assert_eq!(imm.immdt.unwrap().imm_data, 0xabcd);
    assert!(qp.poll_completion().is_none());
    // One coalesced ACK for the last PSN completes both requests, in order.
    qp.handle_packet(now, &ack(imm.bth.psn, ACK), &META, &mut env);
    let c1 = qp.poll_completion().unwrap();
    let c2 = qp.poll_completion().unwrap();
    assert_eq!(
        (c1.wr_id, c1.byte_len, c2.wr_id, c2.byte_len),
        (1, 256 * 199 + 5, 2, 0)
    );
    assert!(qp.poll_timeout().is_none());
}

/// A QP (send PSN 10, `retry_cnt` as given) with one READ posted: work request 1, `len`
/// bytes from `remote_addr` (rkey 7) into local address 0.
fn read_qp(remote_addr: u64, len: u32, retry_cnt: u8) -> (Qp, FlatEnv) {
    let mut c = cfg();
    c.sq_psn = 10;
    c.retry_cnt = retry_cnt;
    let mut qp = Qp::new(c);
    let read = SendOp::RdmaRead {
        remote_addr,
        rkey: 7,
    };
    qp.post_send(send(1, read, len)).unwrap();
    (qp, FlatEnv::new())
}

#[test]
fn read_consumes_psns_and_rd_atomic_depth_and_fence() {
    let now = Instant::now();
    let (mut qp, mut env) = read_qp(4096, 600, 7);
    qp.post_send(send(
        2,
        SendOp::FetchAndAdd {
            remote_addr: 8,
            rkey: 7,
            add: 3,
        },
        8,
    ))
    .unwrap();
    qp.post_send(send(
        3,
        SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 7,
        },
        0,
    ))
    .unwrap();
    let mut w = send(4, SendOp::Send, 1);
    w.fence = true;
    qp.post_send(w).unwrap();
    let pkts = drain(&mut qp, &mut env, now);
    // max_rd_atomic = 2: the second READ waits.
    assert_eq!(pkts.len(), 2);
    assert_eq!(pkts[0].0.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(
        pkts[0].0.reth,
        Some(reth::Repr {
            va: 4096,
            rkey: 7,
            dma_len: 600
        })
    );
    assert_eq!(
        pkts[1].0.bth.psn, 13,
        "a 600-byte READ takes 3 PSNs at MTU 256"
    );
    let a = pkts[1].0.atomic_eth.unwrap();
    assert_eq!(
        (a.swap_add, a.compare, pkts[1].0.bth.opcode),
        (3, 0, Opcode::RC_FETCH_ADD)
    );
    // READ responses: FIRST, (lost MIDDLE), LAST → retry resumes at the missing PSN.
    let chunk = [9u8; 256];
    qp.handle_packet(
        now,
        &read_response(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 10, &chunk),
        &META,
        &mut env,
    );
    qp.handle_packet(
        now,
        &read_response(Opcode::RC_RDMA_READ_RESPONSE_LAST, 12, &chunk[..88]),
        &META,
        &mut env,
    );
    let retry = drain(&mut qp, &mut env, now);
    assert_eq!(retry[0].0.bth.psn, 11);
    assert_eq!(
        retry[0].0.reth,
        Some(reth::Repr {
            va: 4096 + 256,
            rkey: 7,
            dma_len: 344
        })
    );
    assert_eq!(retry[1].0.bth.psn, 13);
    assert_eq!(qp.stats().retries, 1);
    qp.handle_packet(
        now,
        &read_response(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 11, &[8u8; 256]),
        &META,
        &mut env,
    );
    qp.handle_packet(
        now,
        &read_response(Opcode::RC_RDMA_READ_RESPONSE_LAST, 12, &[7u8; 88]),
        &META,
        &mut env,
    );
    let c1 = qp.poll_completion().unwrap();
    assert_eq!(
        (c1.wr_id, c1.opcode, c1.byte_len),
        (1, WcOpcode::RdmaRead, 600)
    );
    assert!(env.mem[..256].iter().all(|&b| b == 9));
    assert!(env.mem[256..512].iter().all(|&b| b == 8));
    assert!(env.mem[512..600].iter().all(|&b| b == 7));
    // Now the zero-length READ may go; the fenced SEND waits for it.
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].0.bth.psn, p[0].0.reth.unwrap().dma_len), (14, 0));
    let aack = pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_ATOMIC_ACKNOWLEDGE, 13, false),
            aeth: Some(aeth::Repr {
                syndrome: ACK,
                msn: 2,
            }),
            atomic_ack_eth: Some(softrdma_wire::atomic_ack_eth::Repr { orig_data: 0x1234 }),
            ..roce::Repr::default()
        },
        &[],
    );
    qp.handle_packet(now, &aack, &META, &mut env);
    assert_eq!(qp.poll_completion().unwrap().wr_id, 2);
    assert_eq!(u64::from_ne_bytes(env.mem[..8].try_into().unwrap()), 0x1234);
    assert!(
        drain(&mut qp, &mut env, now).is_empty(),
        "fence holds the SEND"
    );
    qp.handle_packet(
        now,
        &read_response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 14, &[]),
        &META,
        &mut env,
    );
    assert_eq!(qp.poll_completion().unwrap().wr_id, 3);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        (p[0].0.bth.psn, p[0].0.bth.opcode),
        (15, Opcode::RC_SEND_ONLY)
    );
}

/// A READ response packet with opcode `op` at `psn` carrying `payload` (an AETH, MSN 1, on all
/// but a MIDDLE).
fn read_response(op: Opcode, psn: u32, payload: &[u8]) -> Vec<u8> {
    let aeth = op != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE;
    pkt(
        roce::Repr {
            bth: bthr(op, psn & 0xff_ffff, false),
            aeth: aeth.then_some(aeth::Repr {
                syndrome: ACK,
                msn: 1,
            }),
            payload_len: payload.len(),
            ..roce::Repr::default()
        },
        payload,
    )
}

/// The READ response packet at `psn`, `i` of `n` in its READ, carrying `payload`.
fn read_resp(psn: u32, i: u32, n: u32, payload: &[u8]) -> Vec<u8> {
    let op = match (i, n) {
        (0, 1) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        (0, _) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        (i, n) if i + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    };
    read_response(op, psn, payload)
}

/// `r` asks for the 16-packet READ of [`read_qp`]`(8192, ..)` again from its sixth packet
/// (PSN 15) to its end.
fn assert_read_again_from_5(r: &roce::Repr) {
    assert_eq!(r.bth.psn, 15);
    assert_eq!(
        r.reth,
        Some(reth::Repr {
            va: 8192 + 5 * 256,
            rkey: 7,
            dma_len: 11 * 256
        })
    );
}

/// The first tail-loss probe of a READ whose responses are partly in asks the responder for
/// the READ's last packet, not for everything from the first PSN missing: the responses may
/// be waiting unread in this host's socket, and the responder would send them all again. The
/// rest arriving completes the READ (the probe's answer is then a duplicate, ignored); a
/// lost tail makes that answer out of order, and the READ is asked for again from the
/// missing PSN (as the probe's resend: no retry counted, so even a QP with `retry_cnt` 0
/// repairs it); a response lost midway is repaired once, by the usual restart. A second probe
/// with no progress between asks from the missing PSN.
#[test]
fn a_probe_of_a_read_asks_for_its_last_packet_only() {
    let t0 = Instant::now();
    // (Responses lost: none; 5 to the end, with retry_cnt 0; 5 alone, with retry_cnt 7.)
    for (lost, retry_cnt) in [(0..0, 7), (5..16, 0), (5..6, 7)] {
        let (mut qp, mut env) = read_qp(8192, 16 * 256, retry_cnt);
        let p = drain(&mut qp, &mut env, t0);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.reth.unwrap().dma_len, 4096);
        // Responses 0..4 arrive, then nothing for a while.
        for i in 0..5 {
            qp.handle_packet(
                t0,
                &read_resp(10 + i, i, 16, &[i as u8; 256]),
                &META,
                &mut env,
            );
        }
        let probe_at = qp.poll_timeout().unwrap();
        assert!(probe_at < t0 + crate::timer::local_ack_timeout(14).unwrap());
        qp.handle_timeout(probe_at, &mut env);
        let p = drain(&mut qp, &mut env, probe_at);
        assert_eq!(qp.stats().probes, 1);
        assert_eq!(p.len(), 1, "one packet: the READ's last PSN");
        assert_eq!(p[0].0.bth.psn, 25);
        assert!(p[0].0.bth.ack_req);
        assert_eq!(
            p[0].0.reth,
            Some(reth::Repr {
                va: 8192 + 15 * 256,
                rkey: 7,
                dma_len: 256
            })
        );
        // The rest of the responses (but those lost), then the probe's answer: psn 25 again
        // (an ONLY response: one packet asked for).
        let t1 = probe_at + Duration::from_micros(10);
        for i in 5..16 {
            if !lost.contains(&i) {
                qp.handle_packet(
                    t1,
                    &read_resp(10 + i, i, 16, &[i as u8; 256]),
                    &META,
                    &mut env,
                );
            }
        }
        qp.handle_packet(t1, &read_resp(25, 0, 1, &[15u8; 256]), &META, &mut env);
        if lost.is_empty() {
            let c1 = qp.poll_completion().unwrap();
            assert_eq!(
                (c1.wr_id, c1.status, c1.byte_len),
                (1, WcStatus::Success, 4096)
            );
            assert!(qp.poll_completion().is_none());
            assert!(
                drain(&mut qp, &mut env, t1).is_empty(),
                "nothing asked again"
            );
            assert_eq!(qp.stats().retries, 0);
            for i in 0..16 {
                assert!(env.mem[i * 256..(i + 1) * 256]
                    .iter()
                    .all(|&b| b == i as u8));
            }
            continue;
        }
        // The READ is asked for again from the first response missing, once.
        assert!(qp.poll_completion().is_none(), "{:?}", qp.poll_completion());
        let p = drain(&mut qp, &mut env, t1);
        assert_eq!(p.len(), 1);
        assert_read_again_from_5(&p[0].0);
        // A tail lost is repaired as the probe's resend (no retry: retry_cnt 0 is enough); a
        // response lost midway, by the restart its successor's arrival starts.
        let retries = if lost.len() == 1 { 1 } else { 0 };
        assert_eq!(qp.stats().retries, retries);
        for i in 5..16 {
            qp.handle_packet(
                t1,
                &read_resp(10 + i, i - 5, 11, &[i as u8; 256]),
                &META,
                &mut env,
            );
        }
        let c1 = qp.poll_completion().unwrap();
        assert_eq!((c1.wr_id, c1.status), (1, WcStatus::Success));
        assert!(env.mem[15 * 256..16 * 256].iter().all(|&b| b == 15));
    }
    // A first probe that draws nothing: the next one, with still no progress, asks from the
    // first PSN missing (the responder may wait for exactly that one).
    let (mut qp, mut env) = read_qp(8192, 16 * 256, 7);
    drain(&mut qp, &mut env, t0);
    for i in 0..5 {
        qp.handle_packet(t0, &read_resp(10 + i, i, 16, &[0; 256]), &META, &mut env);
    }
    let t1 = qp.poll_timeout().unwrap();
    qp.handle_timeout(t1, &mut env);
    let p = drain(&mut qp, &mut env, t1);
    assert_eq!((p.len(), p[0].0.bth.psn), (1, 25));
    let t2 = qp.poll_timeout().unwrap();
    assert!(t2 > t1);
    qp.handle_timeout(t2, &mut env);
    let p = drain(&mut qp, &mut env, t2);
    assert_eq!(qp.stats().probes, 2);
    assert_read_again_from_5(&p[0].0);
    assert_eq!(qp.stats().retries, 0, "a probe is no retry");
}

#[test]
fn timeout_and_rnr_timers() {
    let t0 = Instant::now();
    let mut env = FlatEnv::new();
    let mut c = cfg();
    c.retry_cnt = 1;
    c.rnr_retry = 1;
    c.sq_psn = 0;
    let mut qp = Qp::new(c);
    qp.post_send(send(1, SendOp::Send, 10)).unwrap();
    assert_eq!(drain(&mut qp, &mut env, t0).len(), 1);
    let rto = crate::timer::local_ack_timeout(14).unwrap();
    // The tail-loss probe comes first (no round trip measured yet), the local ACK timeout
    // after it.
    assert_eq!(
        qp.poll_timeout(),
        Some(t0 + super::requester::PROBE_INITIAL)
    );
    assert_eq!(qp.requester.retrans_deadline, Some(t0 + rto));
    // RNR NAK: the retransmit timer stops, the RNR timer (code 5 = 60 µs) runs.
    qp.handle_packet(t0, &ack(0, Syndrome::RnrNak { timer: 5 }), &META, &mut env);
    assert_eq!(qp.poll_timeout(), Some(t0 + Duration::from_micros(60)));
    assert!(drain(&mut qp, &mut env, t0).is_empty());
    let t1 = t0 + Duration::from_micros(60);
    qp.handle_timeout(t1, &mut env);
    assert_eq!(drain(&mut qp, &mut env, t1).len(), 1);
    // Second RNR NAK: rnr_retry (1) used up.
    qp.handle_packet(t1, &ack(0, Syndrome::RnrNak { timer: 5 }), &META, &mut env);
    let c1 = qp.poll_completion().unwrap();
    assert_eq!(c1.status, WcStatus::RnrRetryExcErr);
    assert!(qp.is_error());

    // Retransmit timeout: one retry, then RETRY_EXC_ERR.
    let mut qp = Qp::new(c);
    qp.post_send(send(1, SendOp::Send, 10)).unwrap();
    drain(&mut qp, &mut env, t0);
    qp.handle_timeout(t0 + rto, &mut env);
    let again = drain(&mut qp, &mut env, t0 + rto);
    assert_eq!(again.len(), 1);
    assert_eq!(qp.stats().retransmitted_packets, 1);
    qp.handle_timeout(t0 + rto * 2, &mut env);
    assert_eq!(qp.poll_completion().unwrap().status, WcStatus::RetryExcErr);
}

#[test]
fn retry_cnt_7_is_seven_retries_then_retry_exc_err() {
    // rping, rdma_cm users and `softrdma perf` pass retry_cnt 7: a peer that died must still
    // be detected (IBTA: only rnr_retry 7 means infinite), after 1 + 7 local ACK timeouts.
    let t0 = Instant::now();
    let mut env = FlatEnv::new();
    let mut c = cfg();
    c.retry_cnt = 7;
    c.sq_psn = 0;
    let mut qp = Qp::new(c);
    qp.post_send(send(1, SendOp::Send, 10)).unwrap();
    assert_eq!(drain(&mut qp, &mut env, t0).len(), 1);
    let rto = crate::timer::local_ack_timeout(c.timeout).unwrap();
    let mut now = t0;
    for retry in 1..=7u64 {
        now += rto;
        qp.handle_timeout(now, &mut env);
        assert_eq!(drain(&mut qp, &mut env, now).len(), 1, "retry {retry}");
        assert!(qp.poll_completion().is_none(), "retry {retry}");
    }
    assert_eq!(qp.stats().retransmitted_packets, 7);
    now += rto;
    qp.handle_timeout(now, &mut env);
    assert_eq!(qp.poll_completion().unwrap().status, WcStatus::RetryExcErr);
    assert!(qp.is_error());
}

#[test]
fn responder_seq_nak_once_duplicate_reack_and_rnr() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    let send_only = |psn: u32, ack_req: bool| {
        pkt(
            roce::Repr {
                bth: bthr(Opcode::RC_SEND_ONLY, psn, ack_req),
                payload_len: 4,
                ..roce::Repr::default()
            },
            b"abcd",
        )
    };
    // No receive posted: RNR NAK with the packet's PSN and min_rnr_timer.
    qp.handle_packet(now, &send_only(100, true), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].0.bth.psn, 100);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::RnrNak { timer: 12 }
    );
    assert_eq!(qp.poll_event(), Some(QpEvent::CommEst));
    for i in 0..3 {
        env.rq.push_back(RecvRequest {
            wr_id: 50 + i,
            sges: [Sge {
                addr: 1000 + 100 * i,
                length: 100,
                lkey: 1,
            }]
            .into(),
        });
    }
    // 100 without AckReq: no ACK; 101 with: one ACK, MSN 2.
    qp.handle_packet(now, &send_only(100, false), &META, &mut env);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    qp.handle_packet(now, &send_only(101, true), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!((p[0].0.bth.psn, p[0].0.aeth.unwrap().msn), (101, 2));
    assert_eq!(&env.mem[1100..1104], b"abcd");
    // Gap: 103, 104 → one PSN-sequence NAK carrying 102.
    qp.handle_packet(now, &send_only(103, true), &META, &mut env);
    qp.handle_packet(now, &send_only(104, true), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].0.bth.psn, 102);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::PsnSequenceError)
    );
    // Duplicate 100: re-ACK with the last good PSN (101).
    qp.handle_packet(now, &send_only(100, false), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!((p[0].0.bth.psn, p[0].0.aeth.unwrap().syndrome), (101, ACK));
    assert_eq!(qp.stats().duplicates, 1);
    let rc: Vec<u64> = std::iter::from_fn(|| qp.poll_completion())
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(rc, vec![50, 51]);
}

#[test]
fn responder_read_replay_and_atomic_replay() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    let read = |psn: u32, va: u64, len: u32| {
        pkt(
            roce::Repr {
                bth: bthr(Opcode::RC_RDMA_READ_REQUEST, psn, true),
                reth: Some(reth::Repr {
                    va,
                    rkey: 1,
                    dma_len: len,
                }),
                ..roce::Repr::default()
            },
            &[],
        )
    };
    qp.handle_packet(now, &read(100, 5000, 600), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    let ops: Vec<_> = p
        .iter()
        .map(|(r, d)| (r.bth.opcode, r.bth.psn, d.len(), r.aeth.is_some()))
        .collect();
    assert_eq!(
        ops,
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 100, 256, true),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 101, 256, false),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 102, 88, true),
        ]
    );
    assert_eq!(&p[1].1[..], &env.mem[5256..5512]);
    // Replay from the middle (a resumed READ), re-reading memory.
    env.mem[5256] = 0xee;
    qp.handle_packet(now, &read(101, 5256, 344), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 2);
    assert_eq!(
        (p[0].0.bth.opcode, p[0].0.bth.psn, p[0].1[0]),
        (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 101, 0xee)
    );
    // Not a subset of the original: dropped.
    qp.handle_packet(now, &read(101, 4000, 344), &META, &mut env);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    // Atomic executed once, replayed from the stored result.
    let faa = pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_FETCH_ADD, 103, true),
            atomic_eth: Some(softrdma_wire::atomic_eth::Repr {
                va: 8000,
                rkey: 1,
                swap_add: 5,
                compare: 0,
            }),
            ..roce::Repr::default()
        },
        &[],
    );
    let before = u64::from_ne_bytes(env.mem[8000..8008].try_into().unwrap());
    qp.handle_packet(now, &faa, &META, &mut env);
    qp.handle_packet(now, &faa, &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 2);
    for (r, _) in &p {
        assert_eq!(r.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(r.atomic_ack_eth.unwrap().orig_data, before);
        assert_eq!(r.aeth.unwrap().msn, 2);
    }
    assert_eq!(
        u64::from_ne_bytes(env.mem[8000..8008].try_into().unwrap()),
        before + 5
    );
    assert_eq!((qp.stats().read_replays, qp.stats().atomic_replays), (1, 1));
}

#[test]
fn responder_opcode_sequence_and_length_errors() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    // MIDDLE without FIRST → NAK invalid request, ERR, ReqErr.
    let mut qp = Qp::new(cfg());
    let mid = pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_SEND_MIDDLE, 100, false),
            payload_len: 256,
            ..roce::Repr::default()
        },
        &[0u8; 256],
    );
    qp.handle_packet(now, &mid, &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    assert!(qp.is_error());
    assert!(std::iter::from_fn(|| qp.poll_event()).any(|e| e == QpEvent::ReqErr));
    assert_eq!(
        (qp.stats().err_naks_sent, qp.stats().inv_req_naks_sent),
        (1, 1)
    );
    // FIRST shorter than the MTU → invalid request.
    let mut qp = Qp::new(cfg());
    let first = pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_RDMA_WRITE_FIRST, 100, false),
            reth: Some(reth::Repr {
                va: 0,
                rkey: 1,
                dma_len: 1000,
            }),
            payload_len: 100,
            ..roce::Repr::default()
        },
        &[0u8; 100],
    );
    qp.handle_packet(now, &first, &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    // Wrong destination QP / transport: dropped silently.
    let mut qp = Qp::new(cfg());
    let mut other = mid.clone();
    other[7] = 0x23;
    qp.handle_packet(now, &other, &META, &mut env);
    let mut uc = mid;
    uc[0] = 0x21;
    qp.handle_packet(now, &uc, &META, &mut env);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert_eq!(qp.stats().malformed, 2);
    assert!(!qp.is_error());
}

#[test]
fn post_send_limits_and_error_flush() {
    let mut c = cfg();
    c.max_send_wr = 2;
    let mut qp = Qp::new(c);
    qp.post_send(send(1, SendOp::Send, 1)).unwrap();
    qp.post_send(send(2, SendOp::Send, 1)).unwrap();
    assert!(qp.post_send(send(3, SendOp::Send, 1)).is_err());
    qp.set_error();
    let st: Vec<_> = std::iter::from_fn(|| qp.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
}

/// A request written in place: a fill that fails queues nothing (the next request takes the
/// slot, blank), a full queue does not call the fill, and on a QP in ERR the request
/// completes at once with WR_FLUSH_ERR. What is queued goes out as filled.
#[test]
fn post_send_with_fills_in_place_and_rejects_cleanly() {
    let mut c = cfg();
    c.max_send_wr = 2;
    let mut qp = Qp::new(c);
    let mut env = FlatEnv::new();
    let r: Result<(), PostSendError<&str>> = qp.post_send_with(|req| {
        req.wr_id = 9;
        req.sges.push(Sge {
            addr: 0,
            length: 300,
            lkey: 1,
        });
        Err("refused")
    });
    assert_eq!(r, Err(PostSendError::Rejected("refused")));
    assert_eq!(qp.unsent_requests(), 0);
    let got = qp.post_send_with(|req| {
        // A blank request, whatever the rejected one left in the slot.
        assert_eq!(req.wr_id, 0);
        assert!(req.sges.is_empty() && req.inline.is_none() && !req.signaled);
        *req = send(1, SendOp::Send, 8);
        Ok::<_, ()>(41)
    });
    assert_eq!(got, Ok(41));
    qp.post_send(send(2, SendOp::Send, 8)).unwrap();
    let full: Result<(), PostSendError<()>> =
        qp.post_send_with(|_| panic!("the fill of a full queue must not run"));
    assert_eq!(full, Err(PostSendError::QueueFull));
    // (One SEND at a time until the first ACK tells the responder's receives.)
    let out = drain(&mut qp, &mut env, Instant::now());
    let sent: Vec<_> = out.iter().map(|(r, p)| (r.bth.opcode, p.len())).collect();
    assert_eq!(sent, vec![(Opcode::RC_SEND_ONLY, 8)]);
    qp.set_error();
    let r: Result<(), PostSendError<()>> = qp.post_send_with(|req| {
        *req = send(3, SendOp::Send, 8);
        Ok(())
    });
    assert_eq!(r, Ok(()));
    let st: Vec<_> = std::iter::from_fn(|| qp.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        st,
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

/// A responder on its own receive queue puts the receives it has left in every positive ACK
/// (IBA's logarithmic credit code, rounded down); one without that information (an SRQ)
/// says "invalid".
#[test]
fn responder_acks_carry_the_receives_left_as_credits() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    env.credits = true;
    let mut qp = Qp::new(cfg());
    for i in 0..8 {
        env.rq.push_back(recv_req(i, 1000 + 100 * i));
    }
    let send_only = |psn: u32| send_only_pkt(psn, b"abcd");
    // 8 posted, 1 consumed: 7 left, advertised as 6 (code 5).
    qp.handle_packet(now, &send_only(100), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p[0].0.aeth.unwrap().syndrome, Syndrome::Ack { credit: 5 });
    assert_eq!(aeth::credit_count(5), Some(6));
    // Three more: 4 left (code 4).
    for psn in 101..104 {
        qp.handle_packet(now, &send_only(psn), &META, &mut env);
    }
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        p.last().unwrap().0.aeth.unwrap().syndrome,
        Syndrome::Ack { credit: 4 }
    );
    // Without the information: invalid.
    env.credits = false;
    qp.handle_packet(now, &send_only(104), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p[0].0.aeth.unwrap().syndrome, ACK);
}

/// The requester starts a SEND only while the responder's credits cover it; with none left
/// it sends one at a time once nothing is outstanding, and "invalid" lifts the limit. WRITEs
/// (which take no receive) are never held.
#[test]
fn requester_starts_sends_only_within_the_credits() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut c = cfg();
    c.sq_psn = 10;
    let mut qp = Qp::new(c);
    let psns = |p: &[(roce::Repr, Vec<u8>)]| p.iter().map(|(r, _)| r.bth.psn).collect::<Vec<_>>();
    for i in 1..=4 {
        qp.post_send(send(i, SendOp::Send, 10)).unwrap();
    }
    // No credit information yet: one at a time, until the first ACK tells.
    assert_eq!(psns(&drain(&mut qp, &mut env, now)), vec![10]);
    assert!(qp.stats().credit_waits > 0);
    // Its ACK with three credits: the other three go.
    qp.handle_packet(now, &ack(10, Syndrome::Ack { credit: 3 }), &META, &mut env);
    assert_eq!(psns(&drain(&mut qp, &mut env, now)), vec![11, 12, 13]);
    // ACK of the second with one credit: the responder can take one message beyond it
    // (number 3, already sent). 4 is already on its way; 5 and 6 wait.
    let waits = qp.stats().credit_waits;
    qp.handle_packet(now, &ack(11, Syndrome::Ack { credit: 1 }), &META, &mut env);
    qp.post_send(send(5, SendOp::Send, 10)).unwrap();
    qp.post_send(send(6, SendOp::Send, 10)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert!(qp.stats().credit_waits > waits);
    // ACK of 13 (the fourth) with two credits: 5 and 6 may start.
    qp.handle_packet(now, &ack(13, Syndrome::Ack { credit: 2 }), &META, &mut env);
    assert_eq!(psns(&drain(&mut qp, &mut env, now)), vec![14, 15]);
    // All acknowledged with no credit left: the requester waits for a credit update, and
    // (with none ever seen from this responder) after CREDIT_PROBE_DELAY_UPDATES without one
    // sends one SEND anyway (nothing is outstanding); the next waits for its ACK.
    qp.handle_packet(now, &ack(15, Syndrome::Ack { credit: 0 }), &META, &mut env);
    qp.post_send(send(7, SendOp::Send, 10)).unwrap();
    qp.post_send(send(8, SendOp::Send, 10)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    let probe = qp.poll_timeout().expect("a deadline for the probe");
    assert_eq!(probe, now + requester::CREDIT_PROBE_DELAY_UPDATES);
    assert!(drain(&mut qp, &mut env, probe - Duration::from_millis(1)).is_empty());
    let later = probe;
    assert_eq!(psns(&drain(&mut qp, &mut env, later)), vec![16]);
    // A stale ACK (of 14) does not change the credits.
    qp.handle_packet(
        later,
        &ack(14, Syndrome::Ack { credit: 8 }),
        &META,
        &mut env,
    );
    assert!(drain(&mut qp, &mut env, later).is_empty());
    // The wait ran out with no update: this responder sends none, so the next probe goes
    // after CREDIT_PROBE_DELAY.
    qp.handle_packet(
        later,
        &ack(16, Syndrome::Ack { credit: 0 }),
        &META,
        &mut env,
    );
    assert!(drain(&mut qp, &mut env, later).is_empty());
    assert_eq!(
        qp.poll_timeout(),
        Some(later + requester::CREDIT_PROBE_DELAY)
    );
    // "Invalid" (what rxe sends): no limit any more.
    qp.handle_packet(later, &ack(16, ACK), &META, &mut env);
    assert_eq!(psns(&drain(&mut qp, &mut env, later)), vec![17]);
    // An unsolicited credit update (an ACK of the same PSN with credits) lets a waiting
    // requester go at once.
    qp.handle_packet(
        later,
        &ack(17, Syndrome::Ack { credit: 0 }),
        &META,
        &mut env,
    );
    qp.post_send(send(12, SendOp::Send, 10)).unwrap();
    assert!(drain(&mut qp, &mut env, later).is_empty());
    qp.handle_packet(
        later,
        &ack(17, Syndrome::Ack { credit: 1 }),
        &META,
        &mut env,
    );
    assert_eq!(psns(&drain(&mut qp, &mut env, later)), vec![18]);
    // WRITEs take no receive: never held, even with no credit.
    qp.handle_packet(
        later,
        &ack(18, Syndrome::Ack { credit: 0 }),
        &META,
        &mut env,
    );
    for i in 9..=11 {
        qp.post_send(send(
            i,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 7,
            },
            10,
        ))
        .unwrap();
    }
    assert_eq!(psns(&drain(&mut qp, &mut env, later)), vec![19, 20, 21]);
    // This responder was seen to send an update: out of credits again, the requester waits
    // CREDIT_PROBE_DELAY_UPDATES for the next one.
    qp.handle_packet(
        later,
        &ack(21, Syndrome::Ack { credit: 0 }),
        &META,
        &mut env,
    );
    qp.post_send(send(13, SendOp::Send, 10)).unwrap();
    assert!(drain(&mut qp, &mut env, later).is_empty());
    assert_eq!(
        qp.poll_timeout(),
        Some(later + requester::CREDIT_PROBE_DELAY_UPDATES)
    );
    let done: Vec<u64> = std::iter::from_fn(|| qp.poll_completion())
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(done, vec![1, 2, 3, 4, 5, 6, 7, 8, 12, 9, 10, 11]);
}

/// A lone positive ACK goes after the requests ready with it, and not at all while held;
/// a NAK is never held, and takes a held ACK along.
#[test]
fn held_ack_goes_after_the_answer_and_never_blocks_a_nak() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    for i in 0..2 {
        env.rq.push_back(recv_req(i, 1000));
    }
    let send_only = |psn: u32| send_only_pkt(psn, b"ping");
    qp.handle_packet(now, &send_only(100), &META, &mut env);
    assert!(qp.has_held_ack());
    qp.set_hold_acks(true);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    // The answer goes first, then the ACK, in one drain.
    qp.set_hold_acks(false);
    qp.post_send(send(7, SendOp::Send, 4)).unwrap();
    let p = drain(&mut qp, &mut env, now);
    let ops: Vec<Opcode> = p.iter().map(|(r, _)| r.bth.opcode).collect();
    assert_eq!(ops, vec![Opcode::RC_SEND_ONLY, Opcode::RC_ACKNOWLEDGE]);
    assert_eq!(p[1].0.bth.psn, 100);
    assert!(!qp.has_held_ack());
    // Held again; then a gap makes a sequence NAK: it goes, with the ACK before it.
    qp.handle_packet(now, &send_only(101), &META, &mut env);
    qp.set_hold_acks(true);
    qp.handle_packet(now, &send_only(103), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    let syn: Vec<Syndrome> = p.iter().map(|(r, _)| r.aeth.unwrap().syndrome).collect();
    assert_eq!(syn, vec![ACK, Syndrome::Nak(NakCode::PsnSequenceError)]);
}

/// A responder whose last ACK left the requester few credits sends an unsolicited ACK (the
/// last PSN again) with the new count when receives are posted; not when enough are left.
#[test]
fn responder_sends_a_credit_update_when_receives_are_posted() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    env.credits = true;
    let mut qp = Qp::new(cfg());
    let recv = |i: u64| recv_req(i, 1000);
    env.rq.push_back(recv(0));
    let send_only = send_only_pkt(100, b"abcd");
    // Before any ACK: nothing to update.
    assert!(!qp.recv_posted(1));
    qp.handle_packet(now, &send_only, &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p[0].0.aeth.unwrap().syndrome, Syndrome::Ack { credit: 0 });
    // Receives posted: an ACK of PSN 100 again, with the credits.
    for i in 1..=40 {
        env.rq.push_back(recv(i));
    }
    assert!(qp.recv_posted(40));
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].0.bth.psn, 100);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Ack {
            credit: aeth::credit_code(Some(40))
        }
    );
    // Plenty left: no more updates.
    env.rq.push_back(recv(41));
    assert!(!qp.recv_posted(41));
    assert!(drain(&mut qp, &mut env, now).is_empty());
}

fn bind_op(length: u64) -> SendOp {
    SendOp::BindMw(MwBind {
        mw: 5,
        rkey: 0x1234_5601,
        lkey: 1,
        addr: 0,
        length,
        access: 2,
    })
}

fn write_op() -> SendOp {
    SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: 7,
    }
}

fn completions(qp: &mut Qp) -> Vec<(u64, WcStatus, WcOpcode)> {
    std::iter::from_fn(|| qp.poll_completion())
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect()
}

/// A bind and a local invalidate take no packet and no PSN; they are carried out when the
/// cursor reaches them and complete in order, after the SEND before them is acknowledged.
#[test]
fn local_operations_run_in_order_and_complete_after_what_precedes_them() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    // Alone on an idle QP: carried out and completed at once.
    qp.post_send(send(9, bind_op(64), 0)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert_eq!(env.binds.len(), 1);
    assert_eq!(
        completions(&mut qp),
        vec![(9, WcStatus::Success, WcOpcode::BindMw)]
    );
    // (A WRITE first: before the first ACK only one SEND would be in flight.)
    qp.post_send(send(1, write_op(), 10)).unwrap();
    qp.post_send(send(2, bind_op(64), 0)).unwrap();
    qp.post_send(send(3, SendOp::LocalInv(0xab77), 0)).unwrap();
    qp.post_send(send(4, SendOp::Send, 10)).unwrap();
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 2, "only the two SENDs go on the wire");
    assert_eq!(p[0].0.bth.psn, 0xff_fffe);
    assert_eq!(
        p[1].0.bth.psn, 0xff_ffff,
        "the local operations take no PSN"
    );
    assert_eq!(env.binds.len(), 2);
    assert_eq!(env.invalidated, vec![(0xab77, false)]);
    assert!(
        completions(&mut qp).is_empty(),
        "they wait for the SEND before them"
    );
    // A go-back-N resend does not carry them out again.
    qp.handle_packet(
        now,
        &ack(0xff_fffe, Syndrome::Nak(NakCode::PsnSequenceError)),
        &META,
        &mut env,
    );
    let p = drain(&mut qp, &mut env, now);
    assert!(p.iter().any(|(r, _)| r.bth.psn == 0xff_ffff), "resent");
    assert_eq!(env.binds.len(), 2);
    assert_eq!(env.invalidated.len(), 1);
    // The ACK of the first SEND completes it and both local operations.
    qp.handle_packet(now, &ack(0xff_fffe, ACK), &META, &mut env);
    assert_eq!(
        completions(&mut qp),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::BindMw),
            (3, WcStatus::Success, WcOpcode::LocalInv),
        ]
    );
    qp.handle_packet(now, &ack(0xff_ffff, ACK), &META, &mut env);
    assert_eq!(
        completions(&mut qp),
        vec![(4, WcStatus::Success, WcOpcode::Send)]
    );
    assert!(!qp.is_error());
}

/// A bind the owner refuses completes with MW_BIND_ERR, a refused local invalidate with
/// LOC_QP_OP_ERR; either moves the QP to ERR and flushes what follows.
#[test]
fn failed_local_operations_complete_in_error_and_flush_the_rest() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    qp.post_send(send(1, bind_op(0), 0)).unwrap();
    qp.post_send(send(2, SendOp::Send, 10)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert!(qp.is_error());
    assert_eq!(
        completions(&mut qp),
        vec![
            (1, WcStatus::MwBindErr, WcOpcode::BindMw),
            (2, WcStatus::WrFlushErr, WcOpcode::Send),
        ]
    );
    let mut qp = Qp::new(cfg());
    qp.post_send(send(1, SendOp::LocalInv(0xab00), 0)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert_eq!(
        completions(&mut qp),
        vec![(1, WcStatus::LocQpOpErr, WcOpcode::LocalInv)]
    );
    // UD cannot carry them out.
    let mut c = cfg();
    c.qp_type = QpType::Ud;
    let mut qp = Qp::new(c);
    qp.post_send(send(1, bind_op(64), 0)).unwrap();
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert_eq!(
        completions(&mut qp),
        vec![(1, WcStatus::LocQpOpErr, WcOpcode::BindMw)]
    );
}

/// UC local operations complete as soon as everything before them was sent.
#[test]
fn uc_local_operations_complete_after_the_sends_before_them() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut c = cfg();
    c.qp_type = QpType::Uc;
    let mut qp = Qp::new(c);
    qp.post_send(send(1, SendOp::Send, 10)).unwrap();
    qp.post_send(send(2, SendOp::LocalInv(0x77), 0)).unwrap();
    assert_eq!(drain(&mut qp, &mut env, now).len(), 1);
    assert_eq!(
        completions(&mut qp),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::LocalInv),
        ]
    );
}

fn send_inv_pkt(psn: u32, rkey: u32) -> Vec<u8> {
    pkt(
        roce::Repr {
            bth: bthr(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, psn, true),
            ieth: Some(softrdma_wire::ieth::Repr { rkey }),
            payload_len: 4,
            ..roce::Repr::default()
        },
        b"abcd",
    )
}

/// SEND with invalidate: the responder invalidates the rkey before the receive completes
/// (WITH_INV, `invalidated_rkey`); an rkey it cannot invalidate is an invalid request: NAK,
/// the receive completes with REM_INV_REQ_ERR, the QP goes to ERR; the requester that
/// gets the NAK completes with REM_INV_REQ_ERR too.
#[test]
fn responder_invalidates_the_rkey_of_a_send_with_invalidate() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    env.rq.push_back(recv_req(7, 0));
    qp.handle_packet(now, &send_inv_pkt(100, 0x5577), &META, &mut env);
    assert_eq!(env.invalidated, vec![(0x5577, true)]);
    let c = qp.poll_completion().unwrap();
    assert_eq!(
        (c.wr_id, c.status, c.invalidated_rkey, c.byte_len),
        (7, WcStatus::Success, Some(0x5577), 4)
    );
    let p = drain(&mut qp, &mut env, now);
    assert!(p[0].0.aeth.unwrap().syndrome.is_ack());
    // A duplicate is re-acknowledged, not invalidated again.
    qp.handle_packet(now, &send_inv_pkt(100, 0x5577), &META, &mut env);
    assert_eq!(env.invalidated.len(), 1);
    drain(&mut qp, &mut env, now);
    // An rkey that cannot be invalidated.
    env.rq.push_back(recv_req(8, 0));
    qp.handle_packet(now, &send_inv_pkt(101, 0x5500), &META, &mut env);
    let c = qp.poll_completion().unwrap();
    assert_eq!((c.wr_id, c.status), (8, WcStatus::RemInvReqErr));
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
    assert!(qp.is_error());
    assert!(std::iter::from_fn(|| qp.poll_event()).any(|e| e == QpEvent::ReqErr));
    // The requester's side of that NAK.
    let mut rq = Qp::new(cfg());
    rq.post_send(send(1, SendOp::SendWithInv(0x5500), 4))
        .unwrap();
    let p = drain(&mut rq, &mut env, now);
    assert_eq!(p[0].0.ieth.unwrap().rkey, 0x5500);
    rq.handle_packet(
        now,
        &ack(0xff_fffe, Syndrome::Nak(NakCode::InvalidRequest)),
        &META,
        &mut env,
    );
    assert_eq!(
        completions(&mut rq),
        vec![(1, WcStatus::RemInvReqErr, WcOpcode::Send)]
    );
}

/// The ACK waiting alone says whether it acknowledges an RDMA WRITE without immediate (a
/// request the program here gets no completion for), which the owner holds back on a
/// same-host lane to go behind its answer; a SEND's or a WRITE with immediate's does not.
#[test]
fn a_held_ack_tells_whether_it_acknowledges_a_one_sided_write() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    env.rq.push_back(recv_req(0, 1000));
    env.rq.push_back(recv_req(1, 1100));
    let mut qp = Qp::new(cfg());
    qp.set_hold_acks(true);
    let write = |psn: u32, imm: Option<u32>| {
        pkt(
            roce::Repr {
                bth: bthr(
                    if imm.is_some() {
                        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                    } else {
                        Opcode::RC_RDMA_WRITE_ONLY
                    },
                    psn,
                    true,
                ),
                reth: Some(reth::Repr {
                    va: 5000,
                    rkey: 1,
                    dma_len: 4,
                }),
                immdt: imm.map(|imm_data| immdt::Repr { imm_data }),
                payload_len: 4,
                ..roce::Repr::default()
            },
            b"wxyz",
        )
    };
    assert!(!qp.held_ack_is_one_sided());
    qp.handle_packet(now, &write(100, None), &META, &mut env);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert!(qp.has_held_ack() && qp.held_ack_is_one_sided());
    qp.handle_packet(now, &send_only_pkt(101, b"abcd"), &META, &mut env);
    assert!(qp.has_held_ack() && !qp.held_ack_is_one_sided());
    qp.handle_packet(now, &write(102, None), &META, &mut env);
    assert!(qp.held_ack_is_one_sided());
    qp.handle_packet(now, &write(103, Some(7)), &META, &mut env);
    assert!(qp.has_held_ack() && !qp.held_ack_is_one_sided());
    // Sent: nothing waits.
    qp.set_hold_acks(false);
    assert_eq!(drain(&mut qp, &mut env, now).len(), 1);
    assert!(!qp.held_ack_is_one_sided());
}

/// Receives posted while the advertised credits run low queue a credit update (an ACK of
/// its own, sent now), unless a positive ACK is held back already: that one carries the new
/// count when it goes, and no second ACK is made (a program reposting each receive before
/// its answer sent an extra ACK ahead of every answer).
#[test]
fn a_held_ack_carries_the_credits_of_receives_posted_meanwhile() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    env.credits = true;
    let mut qp = Qp::new(cfg());
    env.rq.push_back(recv_req(0, 1000));
    env.rq.push_back(recv_req(1, 1100));
    let send_only = |psn: u32| send_only_pkt(psn, b"abcd");
    // One taken, its ACK sent: one credit advertised.
    qp.handle_packet(now, &send_only(100), &META, &mut env);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Ack {
            credit: aeth::credit_code(Some(1))
        }
    );
    // Reposted with no ACK waiting: an update goes at once.
    env.rq.push_back(recv_req(2, 1200));
    assert!(qp.recv_posted(env.rq.len() as u32));
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].0.aeth.unwrap().syndrome,
        Syndrome::Ack {
            credit: aeth::credit_code(Some(2))
        }
    );
    // Both taken while the owner holds ACKs back: one ACK waits, none goes.
    qp.set_hold_acks(true);
    qp.handle_packet(now, &send_only(101), &META, &mut env);
    qp.handle_packet(now, &send_only(102), &META, &mut env);
    assert!(drain(&mut qp, &mut env, now).is_empty());
    assert!(qp.has_held_ack());
    // Reposted meanwhile: no update of its own.
    env.rq.push_back(recv_req(3, 1300));
    env.rq.push_back(recv_req(4, 1400));
    assert!(!qp.recv_posted(env.rq.len() as u32));
    // The held ACK goes (one packet) with the count of now.
    qp.set_hold_acks(false);
    let p = drain(&mut qp, &mut env, now);
    assert_eq!(p.len(), 1);
    let aeth = p[0].0.aeth.unwrap();
    assert_eq!(p[0].0.bth.psn, 102);
    assert_eq!(
        aeth.syndrome,
        Syndrome::Ack {
            credit: aeth::credit_code(Some(2))
        }
    );
}

/// SQD: a request that has begun (here one of three packets sent) goes on to its last packet
/// and its ACK; one posted while draining does not begin; the queue is drained once the ACK
/// completes the first; `allow_begin` lets the oldest held back begin, not the one behind it;
/// back in RTS that one begins.
#[test]
fn a_draining_send_queue_finishes_what_began_and_starts_nothing() {
    let now = Instant::now();
    let mut env = FlatEnv::new();
    let mut qp = Qp::new(cfg());
    assert!(qp.is_drained(), "nothing posted");
    // Three packets of 256 bytes; the window lets one out before draining starts.
    qp.post_send(send(1, SendOp::Send, 3 * 256)).unwrap();
    let mut buf = vec![0u8; 4200];
    assert!(qp.poll_transmit(now, &mut buf, &mut env).is_some());
    assert!(!qp.is_drained(), "the first request has begun");
    qp.set_draining(true);
    qp.post_send(send(
        2,
        SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        },
        8,
    ))
    .unwrap();
    let rest = drain(&mut qp, &mut env, now);
    let ops: Vec<Opcode> = rest.iter().map(|(r, _)| r.bth.opcode).collect();
    assert_eq!(ops, [Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST]);
    assert!(!qp.is_drained(), "sent, not acknowledged");
    let last = Psn::new(0xff_fffe).add(2).value();
    qp.handle_packet(now, &ack(last, ACK), &META, &mut env);
    let c = qp.poll_completion().expect("the first completes");
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success));
    assert!(qp.is_drained());
    assert!(
        drain(&mut qp, &mut env, now).is_empty(),
        "nothing begins while draining"
    );
    assert_eq!(qp.unsent_requests(), 1);
    // One more may begin (the oldest held back), not the one posted after it.
    qp.post_send(send(3, SendOp::Send, 8)).unwrap();
    qp.allow_begin(1);
    assert!(!qp.is_drained(), "one may begin");
    let w = drain(&mut qp, &mut env, now);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0.bth.opcode, Opcode::RC_RDMA_WRITE_ONLY);
    qp.handle_packet(now, &ack(w[0].0.bth.psn, ACK), &META, &mut env);
    assert_eq!(qp.poll_completion().map(|c| c.wr_id), Some(2));
    assert!(qp.is_drained());
    // Back in RTS the last one begins.
    qp.set_draining(false);
    let s = drain(&mut qp, &mut env, now);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0.bth.opcode, Opcode::RC_SEND_ONLY);
    assert!(!qp.is_drained());
}
