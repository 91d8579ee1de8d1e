//! A deterministic simulated network for two transport QPs: in-memory registered memory and
//! receive queues, a seeded PRNG, loss / duplication / reordering / corruption / delay, and
//! a virtual clock that jumps to the next delivery or deadline.
//!
//! Each node is a sans-IO [`Device`] with its QP registered: what a QP sends is sealed by its
//! device (ICRC) and travels as datagram bytes; what arrives goes through the other device,
//! which checks the ICRC (a corrupted packet is caught and counted there, not by the
//! network), routes it by QP number and builds its GRH; the devices' timer tables say when
//! each QP's timers are due.

#![allow(dead_code, clippy::needless_range_loop)]

use softrdma_proto::device::{Device, DeviceConfig, Received};
use softrdma_proto::transport::{
    AccessError, AtomicOp, Completion, Env, MwBind, Qp, QpConfig, QpEvent, RecvRequest,
    SendRequest, Sge, WcStatus,
};
use softrdma_proto::{Mtu, QpType};
use softrdma_wire::roce;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

pub const LOCAL_WRITE: u32 = 1;
pub const REMOTE_WRITE: u32 = 2;
pub const REMOTE_READ: u32 = 4;
pub const REMOTE_ATOMIC: u32 = 8;

/// splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for chunk in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// FNV-1a, for trace hashes.
pub fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
pub const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

#[derive(Debug)]
pub struct Region {
    pub base: u64,
    pub data: Vec<u8>,
    pub access: u32,
}

/// Registered memory (lkey == rkey == region key) and a receive queue.
#[derive(Debug, Default)]
pub struct SimEnv {
    pub regions: HashMap<u32, Region>,
    pub rq: VecDeque<RecvRequest>,
    /// Memory window binds (`MwBind::mw`) and invalidations (rkey, remote) carried out, in
    /// order: every one is accepted.
    pub local_ops: Vec<(u64, bool)>,
}

impl SimEnv {
    pub fn add_region(&mut self, key: u32, len: usize, access: u32) -> u64 {
        let base = u64::from(key) << 32;
        self.regions.insert(
            key,
            Region {
                base,
                data: vec![0; len],
                access,
            },
        );
        base
    }
    pub fn base(&self, key: u32) -> u64 {
        self.regions[&key].base
    }
    pub fn bytes(&self, key: u32, addr: u64, len: usize) -> &[u8] {
        let r = &self.regions[&key];
        let at = (addr - r.base) as usize;
        &r.data[at..at + len]
    }
    pub fn bytes_mut(&mut self, key: u32, addr: u64, len: usize) -> &mut [u8] {
        let r = self.regions.get_mut(&key).unwrap();
        let at = (addr - r.base) as usize;
        &mut r.data[at..at + len]
    }
    fn range(
        &mut self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> Result<(&mut Vec<u8>, usize), AccessError> {
        let r = self.regions.get_mut(&key).ok_or(AccessError::InvalidKey)?;
        if r.access & need != need {
            return Err(AccessError::AccessDenied);
        }
        let off = addr.checked_sub(r.base).ok_or(AccessError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if end > r.data.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok((&mut r.data, off as usize))
    }
}

impl Env for SimEnv {
    fn read_local(&mut self, sge: &Sge, offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        if u64::from(offset) + dst.len() as u64 > u64::from(sge.length) {
            return Err(AccessError::OutOfBounds);
        }
        let (d, at) = self.range(sge.lkey, sge.addr + u64::from(offset), dst.len() as u64, 0)?;
        dst.copy_from_slice(&d[at..at + dst.len()]);
        Ok(())
    }
    fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
        if u64::from(offset) + src.len() as u64 > u64::from(sge.length) {
            return Err(AccessError::OutOfBounds);
        }
        let (d, at) = self.range(
            sge.lkey,
            sge.addr + u64::from(offset),
            src.len() as u64,
            LOCAL_WRITE,
        )?;
        d[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        write: bool,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        let need = if write { REMOTE_WRITE } else { REMOTE_READ };
        self.range(rkey, va, len, need).map(|_| ())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, src: &[u8]) -> Result<(), AccessError> {
        let (d, at) = self.range(rkey, va, src.len() as u64, REMOTE_WRITE)?;
        d[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read_remote(&mut self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let (d, at) = self.range(rkey, va, dst.len() as u64, REMOTE_READ)?;
        dst.copy_from_slice(&d[at..at + dst.len()]);
        Ok(())
    }
    fn atomic_remote(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Misaligned);
        }
        let (d, at) = self.range(rkey, va, 8, REMOTE_ATOMIC)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(&d[at..at + 8]);
        let orig = u64::from_ne_bytes(w);
        let new = match op {
            AtomicOp::CmpAndSwp { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAndAdd { add } => orig.wrapping_add(add),
        };
        d[at..at + 8].copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }
    fn take_recv(&mut self) -> Option<RecvRequest> {
        self.rq.pop_front()
    }
    fn bind_mw(&mut self, bind: &MwBind) -> Result<(), WcStatus> {
        self.local_ops.push((bind.mw, false));
        Ok(())
    }
    fn local_invalidate(&mut self, rkey: u32) -> Result<(), WcStatus> {
        self.local_ops.push((u64::from(rkey), false));
        Ok(())
    }
    fn remote_invalidate(&mut self, rkey: u32) -> Result<(), AccessError> {
        self.local_ops.push((u64::from(rkey), true));
        Ok(())
    }
    fn recv_available(&self) -> Option<u32> {
        // End-to-end credits, as softrdma's engine advertises them for a QP's own queue.
        Some(self.rq.len() as u32)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct NetCfg {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
    pub delay: Duration,
    pub jitter: Duration,
    /// Drop everything (peer gone).
    pub blackhole: bool,
}

impl NetCfg {
    pub fn perfect() -> NetCfg {
        NetCfg {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: Duration::from_micros(10),
            jitter: Duration::ZERO,
            blackhole: false,
        }
    }
    pub fn lossy(loss: f64) -> NetCfg {
        NetCfg {
            loss,
            dup: loss / 4.0,
            reorder: loss / 2.0,
            corrupt: loss / 4.0,
            delay: Duration::from_micros(10),
            jitter: Duration::from_micros(5),
            blackhole: false,
        }
    }
}

pub struct Node {
    pub qp: Qp,
    pub env: SimEnv,
    pub comps: Vec<Completion>,
    pub events: Vec<QpEvent>,
}

/// A datagram on the wire: (arrival, sequence, destination node, bytes).
type Flight = Reverse<(Duration, u64, usize, Vec<u8>)>;

/// The address of node `i`'s device (port 4791, as a device socket is bound).
pub fn node_addr(i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + i as u8)), 4791)
}

pub struct Sim {
    pub nodes: [Node; 2],
    /// The device of each node; the handle of a QP is its node's index.
    pub devices: [Device<usize>; 2],
    pub base: Instant,
    pub now: Instant,
    pub net: NetCfg,
    pub rng: Rng,
    inflight: BinaryHeap<Flight>,
    seq: u64,
    pub hash: u64,
    pub packets: u64,
    /// Datagrams the network corrupted (one flipped bit each).
    pub corrupted: u64,
    /// Of those, the ones whose flipped bit is in BTH byte 4 (FECN, BECN, reserved): bits
    /// the ICRC does not cover, as routers may change them.
    pub corrupted_variant: u64,
    buf: Vec<u8>,
    /// QPs due, reused.
    due: Vec<u32>,
    /// Every emitted packet (opcode, psn) per node, when recording.
    pub record: Option<Vec<(usize, roce::Repr)>>,
    /// Link serialization time per byte, in picoseconds (0: infinitely fast links): a
    /// packet leaves once the link toward its destination is free and takes its length
    /// times this, lost or not, before its delay starts.
    pub link_ps_per_byte: u64,
    link_free: [Duration; 2],
    /// Packets to lose, by their number among all emitted packets (from 0, both nodes).
    pub drop_packets: Vec<u64>,
}

pub fn config(
    qp_type: QpType,
    mtu: Mtu,
    qpn: u32,
    dest: u32,
    sq_psn: u32,
    rq_psn: u32,
) -> QpConfig {
    QpConfig {
        qp_type,
        qp_num: qpn,
        dest_qp_num: dest,
        path_mtu: mtu,
        sq_psn,
        rq_psn,
        timeout: 10,
        // Not a verbs value: the sans-IO transport takes any count, and these runs check
        // exactly-once delivery at up to 20% loss, where 7 retries (the most verbs allows)
        // do run out now and then, as they would on hardware. Runs that test giving up set
        // their own count.
        retry_cnt: 255,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        qkey: 0x1111_1111,
        access_flags: REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC,
        max_send_wr: 4096,
    }
}

impl Sim {
    /// Two connected QPs (0x11 and 0x22) with the given PSNs.
    pub fn new(qp_type: QpType, mtu: Mtu, net: NetCfg, seed: u64) -> Sim {
        let mut rng = Rng(seed ^ 0x5eed_0000_0000);
        let psn_a = (rng.next_u64() as u32) & 0xff_ffff;
        let psn_b = if seed.is_multiple_of(3) {
            0xff_fff0 // exercise PSN wrap-around
        } else {
            (rng.next_u64() as u32) & 0xff_ffff
        };
        let a = config(qp_type, mtu, 0x11, 0x22, psn_a, psn_b);
        let b = config(qp_type, mtu, 0x22, 0x11, psn_b, psn_a);
        Sim::with_configs(a, b, net, rng)
    }

    pub fn with_configs(a: QpConfig, b: QpConfig, net: NetCfg, rng: Rng) -> Sim {
        let base = Instant::now();
        let mk = |cfg| Node {
            qp: Qp::new(cfg),
            env: SimEnv::default(),
            comps: Vec::new(),
            events: Vec::new(),
        };
        let dev = |i: usize, qpn: u32| {
            let mut d = Device::new(DeviceConfig::new(node_addr(i).ip()));
            d.register(qpn, i);
            d
        };
        Sim {
            devices: [dev(0, a.qp_num), dev(1, b.qp_num)],
            nodes: [mk(a), mk(b)],
            base,
            now: base,
            net,
            rng,
            inflight: BinaryHeap::new(),
            seq: 0,
            hash: FNV0,
            packets: 0,
            corrupted: 0,
            corrupted_variant: 0,
            buf: vec![0u8; 65536 + 128],
            due: Vec::new(),
            record: None,
            link_ps_per_byte: 0,
            link_free: [Duration::ZERO; 2],
            drop_packets: Vec::new(),
        }
    }

    pub fn post(&mut self, node: usize, req: SendRequest) {
        self.nodes[node].qp.post_send(req).expect("send queue full");
    }

    fn schedule(&mut self, to: usize, pkt: Vec<u8>) {
        let net = self.net;
        let mut sent = self.now - self.base;
        if self.link_ps_per_byte != 0 {
            let wire = Duration::from_nanos(pkt.len() as u64 * self.link_ps_per_byte / 1000);
            sent = sent.max(self.link_free[to]) + wire;
            self.link_free[to] = sent;
        }
        if net.blackhole || self.rng.chance(net.loss) {
            return;
        }
        let copies = if self.rng.chance(net.dup) { 2 } else { 1 };
        for c in 0..copies {
            let _ = c;
            let mut p = pkt.clone();
            let jitter = net.jitter.as_nanos() as u64;
            let mut delay = net.delay + Duration::from_nanos(self.rng.below(jitter + 1));
            if self.rng.chance(net.reorder) {
                delay += Duration::from_nanos(self.rng.below(200_000));
            }
            if self.rng.chance(net.corrupt) {
                let i = self.rng.below(p.len() as u64) as usize;
                p[i] ^= 1 << self.rng.below(8);
                self.corrupted += 1;
                self.corrupted_variant += u64::from(i == 4);
            }
            let at = sent + delay;
            self.seq += 1;
            self.inflight.push(Reverse((at, self.seq, to, p)));
        }
    }

    fn hash_completion(h: u64, node: usize, c: &Completion) -> u64 {
        let mut h = fnv(
            h,
            &[node as u8, c.status as u8, c.opcode as u8, c.is_recv as u8],
        );
        h = fnv(h, &c.wr_id.to_le_bytes());
        h = fnv(h, &c.byte_len.to_le_bytes());
        fnv(h, &c.imm_data.unwrap_or(0).to_le_bytes())
    }

    /// Lets both QPs transmit until quiet; collects completions and events.
    pub fn pump(&mut self) {
        for i in 0..2 {
            loop {
                let now = self.now;
                let node = &mut self.nodes[i];
                let Some(t) = node.qp.poll_transmit(now, &mut self.buf, &mut node.env) else {
                    break;
                };
                assert!(t.len >= 16 && t.len <= self.buf.len());
                self.devices[i]
                    .seal(node_addr(1 - i).ip(), &mut self.buf[..t.len])
                    .expect("emitted packet sealed");
                let pkt = self.buf[..t.len].to_vec();
                let view = roce::Packet::new_checked(&pkt[..]).expect("emitted packet layout");
                let repr = roce::Repr::parse(&view).expect("emitted packet parses");
                if let Some(r) = &mut self.record {
                    r.push((i, repr));
                }
                let number = self.packets;
                self.packets += 1;
                self.hash = fnv(self.hash, &pkt);
                if self.drop_packets.contains(&number) {
                    continue;
                }
                self.schedule(1 - i, pkt);
            }
            let node = &mut self.nodes[i];
            while let Some(c) = node.qp.poll_completion() {
                self.hash = Self::hash_completion(self.hash, i, &c);
                node.comps.push(c);
            }
            while let Some(e) = node.qp.poll_event() {
                self.hash = fnv(self.hash, format!("{i}{e:?}").as_bytes());
                node.events.push(e);
            }
        }
    }

    /// Gives each device the deadline of its QP.
    fn sync_timers(&mut self) {
        for (d, n) in self.devices.iter_mut().zip(&self.nodes) {
            d.set_timer(n.qp.config().qp_num, n.qp.poll_timeout());
        }
    }

    /// Packets the devices dropped for a bad ICRC (the network's corruption).
    pub fn corrupted_drops(&self) -> u64 {
        self.devices.iter().map(|d| d.counters().icrc_errors).sum()
    }

    /// Hands datagram `pkt` from node `1 - to` to node `to`'s device and, when it routes it
    /// to a QP, to that QP.
    pub fn deliver(&mut self, to: usize, pkt: &[u8]) {
        let now = self.now;
        let from = node_addr(1 - to);
        let local = node_addr(to).ip();
        if let Received::Qp {
            handle,
            packet,
            meta,
            ..
        } = self.devices[to].handle_datagram(now, from, local, pkt)
        {
            let node = &mut self.nodes[handle];
            node.qp.handle_packet(now, packet, &meta, &mut node.env);
        }
    }

    /// Runs until `done` holds, nothing is left to happen, or `limit` of virtual time
    /// passed. Returns whether `done` held.
    pub fn run(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        loop {
            self.pump();
            if done(self) {
                return true;
            }
            self.sync_timers();
            let mut next: Option<Duration> = self.inflight.peek().map(|Reverse(f)| f.0);
            for d in &self.devices {
                if let Some(t) = d.poll_timeout() {
                    let t = t.saturating_duration_since(self.base);
                    next = Some(next.map_or(t, |x| x.min(t)));
                }
            }
            let Some(next) = next else {
                return false;
            };
            if next > limit {
                return false;
            }
            let at = self.base + next;
            if at > self.now {
                self.now = at;
            }
            while self
                .inflight
                .peek()
                .is_some_and(|Reverse(f)| self.base + f.0 <= self.now)
            {
                let Reverse((_, _, to, pkt)) = self.inflight.pop().unwrap();
                self.deliver(to, &pkt);
            }
            self.sync_timers();
            let mut due = std::mem::take(&mut self.due);
            for (i, d) in self.devices.iter_mut().enumerate() {
                due.clear();
                d.handle_timeout(self.now, &mut due);
                for &qpn in &due {
                    let h = *d.handle(qpn).expect("due QP registered");
                    assert_eq!(h, i);
                    let now = self.now;
                    let n = &mut self.nodes[h];
                    n.qp.handle_timeout(now, &mut n.env);
                }
            }
            self.due = due;
        }
    }

    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }
}

// ---------------------------------------------------------------------------------------
// Workloads: random mixes of operations with everything needed to check the outcome.

use softrdma_proto::transport::{SendOp, WcOpcode};

pub const SRC: u32 = 1;
pub const RECV: u32 = 2;
pub const RDST: u32 = 3;
pub const REMOTE: u32 = 4;
pub const ATOMIC: u32 = 5;
pub const SRC_LEN: usize = 192 * 1024;
pub const READ_AREA: usize = 128 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Faa,
    Cas,
}

#[derive(Debug, Clone, Copy)]
pub struct OpSpec {
    pub kind: OpKind,
    pub len: u32,
    pub nsge: u8,
    pub signaled: bool,
    pub inline: bool,
    pub solicited: bool,
}

pub fn pick_len(rng: &mut Rng, mtu: u32) -> u32 {
    match rng.below(10) {
        0 => 0,
        1 => 1,
        2 => mtu - 1,
        3 => mtu,
        4 => mtu + 1,
        5 => 2 * mtu + 3,
        6 if rng.chance(0.3) => 65536,
        _ => rng.below(u64::from(3 * mtu)) as u32,
    }
}

pub fn gen_ops(rng: &mut Rng, n: usize, mtu: u32, kinds: &[OpKind]) -> Vec<OpSpec> {
    let mut v: Vec<OpSpec> = (0..n)
        .map(|_| {
            let kind = kinds[rng.below(kinds.len() as u64) as usize];
            let len = match kind {
                OpKind::Faa | OpKind::Cas => 8,
                _ => pick_len(rng, mtu),
            };
            OpSpec {
                kind,
                len,
                nsge: 1 + rng.below(3) as u8,
                signaled: rng.chance(0.75),
                inline: len <= 256 && rng.chance(0.2),
                solicited: rng.chance(0.3),
            }
        })
        .collect();
    if let Some(l) = v.last_mut() {
        l.signaled = true;
    }
    v
}

#[derive(Debug, Clone)]
pub struct ExpRecv {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub len: u32,
    pub imm: Option<u32>,
    pub addr: u64,
    pub data: Option<Vec<u8>>,
    pub solicited: bool,
}

#[derive(Debug, Clone)]
pub struct MemCheck {
    pub node: usize,
    pub key: u32,
    pub addr: u64,
    pub data: Vec<u8>,
    pub what: String,
}

#[derive(Debug, Default)]
pub struct Expect {
    pub recvs: [Vec<ExpRecv>; 2],
    pub sends: [Vec<(u64, WcOpcode, u32)>; 2],
    pub mem: Vec<MemCheck>,
}

/// Splits `len` bytes into up to `n` sges in region `key` starting at `addr`, with a gap of
/// `gap` bytes between pieces; returns the sges.
fn split_sges(key: u32, addr: u64, len: u32, n: u8, gap: u64) -> Vec<Sge> {
    let n = u32::from(n.max(1)).min(len.max(1));
    let mut sges = Vec::new();
    let mut at = addr;
    let mut left = len;
    for i in 0..n {
        let l = if i + 1 == n { left } else { len / n };
        sges.push(Sge {
            addr: at,
            length: l,
            lkey: key,
        });
        at += u64::from(l) + gap;
        left -= l;
    }
    sges
}

impl Expect {
    /// Registers memory on both nodes, posts the receive requests each node needs and the
    /// send requests of `ops[i]` on node `i`, and records what must come out.
    pub fn setup(sim: &mut Sim, ops: &[Vec<OpSpec>; 2], rng: &mut Rng) -> Expect {
        let mut exp = Expect::default();
        let mtu = sim.nodes[0].qp.config().path_mtu.bytes();
        let _ = mtu;
        // Sizes.
        for to in 0..2 {
            let from = 1 - to;
            let nrecv = ops[from]
                .iter()
                .filter(|o| matches!(o.kind, OpKind::Send | OpKind::SendImm | OpKind::WriteImm))
                .count();
            let slot = 65536 + 64;
            let wsum: u64 = ops[from]
                .iter()
                .filter(|o| matches!(o.kind, OpKind::Write | OpKind::WriteImm))
                .map(|o| u64::from(o.len) + 8)
                .sum();
            let env = &mut sim.nodes[to].env;
            env.add_region(RECV, nrecv.max(1) * slot, LOCAL_WRITE);
            env.add_region(
                REMOTE,
                READ_AREA + wsum as usize,
                LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ,
            );
            env.add_region(ATOMIC, 16, LOCAL_WRITE | REMOTE_ATOMIC);
            let rsum: u64 = ops[to]
                .iter()
                .map(|o| u64::from(o.len) + 8 * u64::from(o.nsge) + 8)
                .sum();
            env.add_region(RDST, rsum as usize + 8, LOCAL_WRITE);
            env.add_region(SRC, SRC_LEN, LOCAL_WRITE);
            let base = env.base(SRC);
            rng.fill(env.bytes_mut(SRC, base, SRC_LEN));
            let rb = env.base(REMOTE);
            rng.fill(env.bytes_mut(REMOTE, rb + wsum, READ_AREA));
        }
        for from in 0..2 {
            let to = 1 - from;
            let mut recv_slot = 0u64;
            let mut waddr = sim.nodes[to].env.base(REMOTE);
            let read_base = waddr
                + ops[from]
                    .iter()
                    .filter(|o| matches!(o.kind, OpKind::Write | OpKind::WriteImm))
                    .map(|o| u64::from(o.len) + 8)
                    .sum::<u64>();
            let mut rdst = sim.nodes[from].env.base(RDST);
            let (mut nfaa, mut ncas) = (0u64, 0u64);
            let abase = sim.nodes[to].env.base(ATOMIC);
            let recv_base = sim.nodes[to].env.base(RECV);
            for (i, o) in ops[from].iter().enumerate() {
                let wr_id = ((from as u64) << 32) | i as u64;
                let imm = (rng.next_u64() as u32) | 1;
                // Gather list from SRC (random pieces).
                let mut sges = Vec::new();
                let mut data = Vec::new();
                let n = u32::from(o.nsge).min(o.len.max(1));
                let mut left = o.len;
                for k in 0..n {
                    let l = if k + 1 == n { left } else { o.len / n };
                    left -= l;
                    let off = rng.below((SRC_LEN as u64) - u64::from(l));
                    let addr = sim.nodes[from].env.base(SRC) + off;
                    data.extend_from_slice(sim.nodes[from].env.bytes(SRC, addr, l as usize));
                    sges.push(Sge {
                        addr,
                        length: l,
                        lkey: SRC,
                    });
                }
                let inline = (o.inline
                    && matches!(
                        o.kind,
                        OpKind::Send | OpKind::SendImm | OpKind::Write | OpKind::WriteImm
                    ))
                .then(|| data.clone().into());
                let (op, sges) = match o.kind {
                    OpKind::Send | OpKind::SendImm => {
                        let imm_o = (o.kind == OpKind::SendImm).then_some(imm);
                        let addr = recv_base + recv_slot * (65536 + 64);
                        recv_slot += 1;
                        let rsges = split_sges(RECV, addr, 65536, o.nsge, 0);
                        sim.nodes[to].env.rq.push_back(RecvRequest {
                            wr_id: 0x1000_0000 | wr_id,
                            sges: rsges.into(),
                        });
                        exp.recvs[to].push(ExpRecv {
                            wr_id: 0x1000_0000 | wr_id,
                            opcode: WcOpcode::Recv,
                            len: o.len,
                            imm: imm_o,
                            addr,
                            data: Some(data.clone()),
                            solicited: o.solicited,
                        });
                        let op = match imm_o {
                            Some(v) => SendOp::SendWithImm(v),
                            None => SendOp::Send,
                        };
                        (op, sges)
                    }
                    OpKind::Write | OpKind::WriteImm => {
                        let remote_addr = waddr;
                        waddr += u64::from(o.len) + 8;
                        exp.mem.push(MemCheck {
                            node: to,
                            key: REMOTE,
                            addr: remote_addr,
                            data: data.clone(),
                            what: format!("write {wr_id:#x}"),
                        });
                        let op = if o.kind == OpKind::WriteImm {
                            let addr = recv_base + recv_slot * (65536 + 64);
                            recv_slot += 1;
                            sim.nodes[to].env.rq.push_back(RecvRequest {
                                wr_id: 0x1000_0000 | wr_id,
                                sges: [Sge {
                                    addr,
                                    length: 16,
                                    lkey: RECV,
                                }]
                                .into(),
                            });
                            exp.recvs[to].push(ExpRecv {
                                wr_id: 0x1000_0000 | wr_id,
                                opcode: WcOpcode::RecvRdmaWithImm,
                                len: o.len,
                                imm: Some(imm),
                                addr,
                                data: None,
                                solicited: o.solicited,
                            });
                            SendOp::RdmaWriteWithImm {
                                remote_addr,
                                rkey: REMOTE,
                                imm,
                            }
                        } else {
                            SendOp::RdmaWrite {
                                remote_addr,
                                rkey: REMOTE,
                            }
                        };
                        (op, sges)
                    }
                    OpKind::Read => {
                        let off = rng.below((READ_AREA as u64) - u64::from(o.len));
                        let remote_addr = read_base + off;
                        let want = sim.nodes[to]
                            .env
                            .bytes(REMOTE, remote_addr, o.len as usize)
                            .to_vec();
                        let dsges = split_sges(RDST, rdst, o.len, o.nsge, 8);
                        let mut at = 0usize;
                        for s in &dsges {
                            exp.mem.push(MemCheck {
                                node: from,
                                key: RDST,
                                addr: s.addr,
                                data: want[at..at + s.length as usize].to_vec(),
                                what: format!("read {wr_id:#x}"),
                            });
                            at += s.length as usize;
                        }
                        rdst += u64::from(o.len) + 8 * u64::from(o.nsge) + 8;
                        (
                            SendOp::RdmaRead {
                                remote_addr,
                                rkey: REMOTE,
                            },
                            dsges,
                        )
                    }
                    OpKind::Faa | OpKind::Cas => {
                        let res = Sge {
                            addr: rdst,
                            length: 8,
                            lkey: RDST,
                        };
                        rdst += 8 + 8 * u64::from(o.nsge) + 8;
                        let (op, k) = if o.kind == OpKind::Faa {
                            nfaa += 1;
                            (
                                SendOp::FetchAndAdd {
                                    remote_addr: abase,
                                    rkey: ATOMIC,
                                    add: 1,
                                },
                                nfaa - 1,
                            )
                        } else {
                            ncas += 1;
                            (
                                SendOp::CmpAndSwp {
                                    remote_addr: abase + 8,
                                    rkey: ATOMIC,
                                    compare: ncas - 1,
                                    swap: ncas,
                                },
                                ncas - 1,
                            )
                        };
                        exp.mem.push(MemCheck {
                            node: from,
                            key: RDST,
                            addr: res.addr,
                            data: k.to_ne_bytes().to_vec(),
                            what: format!("atomic result {wr_id:#x}"),
                        });
                        (op, vec![res])
                    }
                };
                let wc = match o.kind {
                    OpKind::Send | OpKind::SendImm => WcOpcode::Send,
                    OpKind::Write | OpKind::WriteImm => WcOpcode::RdmaWrite,
                    OpKind::Read => WcOpcode::RdmaRead,
                    OpKind::Faa => WcOpcode::FetchAdd,
                    OpKind::Cas => WcOpcode::CompSwap,
                };
                if o.signaled {
                    exp.sends[from].push((wr_id, wc, o.len));
                }
                sim.post(
                    from,
                    SendRequest {
                        wr_id,
                        op,
                        sges: sges.into(),
                        inline,
                        signaled: o.signaled,
                        solicited: o.solicited,
                        fence: rng.chance(0.1),
                        ud: None,
                    },
                );
            }
            exp.mem.push(MemCheck {
                node: to,
                key: ATOMIC,
                addr: abase,
                data: nfaa.to_ne_bytes().to_vec(),
                what: "faa counter".into(),
            });
            exp.mem.push(MemCheck {
                node: to,
                key: ATOMIC,
                addr: abase + 8,
                data: ncas.to_ne_bytes().to_vec(),
                what: "cas word".into(),
            });
        }
        exp
    }

    pub fn done(&self, sim: &Sim) -> bool {
        (0..2).all(|i| {
            let n = &sim.nodes[i];
            let r = n.comps.iter().filter(|c| c.is_recv).count();
            let s = n.comps.len() - r;
            (r >= self.recvs[i].len() && s >= self.sends[i].len()) || n.qp.is_error()
        })
    }

    pub fn verify(&self, sim: &Sim, ctx: &str) {
        for i in 0..2 {
            let n = &sim.nodes[i];
            assert!(
                !n.qp.is_error(),
                "{ctx}: node {i} in ERR; comps {:?}",
                n.comps
            );
            let sends: Vec<_> = n.comps.iter().filter(|c| !c.is_recv).collect();
            let recvs: Vec<_> = n.comps.iter().filter(|c| c.is_recv).collect();
            assert_eq!(
                sends.len(),
                self.sends[i].len(),
                "{ctx}: node {i} send completions"
            );
            for (c, (wr_id, op, len)) in sends.iter().zip(&self.sends[i]) {
                assert_eq!(c.status, WcStatus::Success, "{ctx}: node {i} {c:?}");
                assert_eq!(
                    (c.wr_id, c.opcode, c.byte_len),
                    (*wr_id, *op, *len),
                    "{ctx}: node {i} send order"
                );
            }
            assert_eq!(
                recvs.len(),
                self.recvs[i].len(),
                "{ctx}: node {i} recv completions"
            );
            for (c, e) in recvs.iter().zip(&self.recvs[i]) {
                assert_eq!(c.status, WcStatus::Success, "{ctx}: node {i} {c:?}");
                assert_eq!(
                    (c.wr_id, c.opcode, c.byte_len, c.imm_data, c.solicited),
                    (e.wr_id, e.opcode, e.len, e.imm, e.solicited),
                    "{ctx}: node {i} recv"
                );
                if let Some(d) = &e.data {
                    assert!(
                        n.env.bytes(RECV, e.addr, d.len()) == &d[..],
                        "{ctx}: node {i} recv data {:#x}",
                        e.wr_id
                    );
                }
            }
        }
        for m in &self.mem {
            let got = sim.nodes[m.node].env.bytes(m.key, m.addr, m.data.len());
            assert!(
                got == &m.data[..],
                "{ctx}: {} differs on node {}",
                m.what,
                m.node
            );
        }
    }
}
