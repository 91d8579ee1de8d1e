//! The receive side: datagrams from the socket, their ICRC checks, and delivery of runs of
//! packets to their QPs.

use super::capture;
use super::counters::Counters;
use super::share::{self, Share};
use super::sock::RxMsg;
use super::tx::{icrc_flow, TxBatch, Wire, BATCH};
use crate::gid::{ipv6_mapped, Gid};
use softrdma_wire::icrc::{IcrcPrefix, IdentSolver};
use softrdma_wire::ip;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The 40-byte GRH a UD receive gets for a datagram of `payload_len` bytes from `src` to
/// `dst`: the IP header the datagram came with (as softrdma peers send it: TTL 64, DF,
/// identification 0), an IPv4 one in the last 20 bytes.
#[inline]
pub(crate) fn grh_for(src: &SocketAddr, dst: &SocketAddr, payload_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = ip::UDP_HEADER_LEN + payload_len;
    // (A datagram too long for the length fields, which cannot arrive, leaves them zero.)
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let repr = ip::Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: ip::IP_PROTOCOL_UDP,
                payload_len: udp_len,
                ttl: 64,
                tos: 0,
                ident: 0,
                dont_frag: true,
            };
            let _ = repr.emit(&mut ip::Ipv4Packet::new_unchecked(&mut g[20..]));
        }
        (s, d) => {
            let repr = ip::Ipv6Repr {
                src_addr: ipv6_mapped(s),
                dst_addr: ipv6_mapped(d),
                next_header: ip::IP_PROTOCOL_UDP,
                payload_len: udp_len,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            let _ = repr.emit(&mut ip::Ipv6Packet::new_unchecked(&mut g[..]));
        }
    }
    g
}

/// The ICRC flow of datagrams from `src` to `dst` port 4791.
pub(super) fn rx_flow(src: SocketAddr, dst: IpAddr) -> IcrcPrefix {
    icrc_flow(src.ip(), src.port(), dst)
}

/// Checks one received datagram (the UDP payload `pkt`, from `src`, whose ICRC flow is
/// `prefix`): its ICRC and headers.
/// Returns the destination QP number of a good packet; counts and drops a bad one.
pub(super) fn check_packet(
    wire: &Wire,
    pkt: &[u8],
    src: SocketAddr,
    flow: &mut RxFlow,
    solver: &mut IdentSolver,
) -> Option<u32> {
    let c = &wire.counters;
    let prefix = &flow.prefix;
    // A sender whose packets all verified with identification 0 (a softrdma peer) keeps the
    // full 32-bit check: its packets are never accepted through a solved identification.
    let solve = flow.solved_any || flow.zero_ident < ZERO_IDENT_PEER;
    let Ok(view) = softrdma_wire::roce::Packet::new_checked(pkt) else {
        if is_cnp(pkt) {
            // BTH, 16 reserved bytes, ICRC: counted when the ICRC is good, then dropped.
            let (covered, icrc) = pkt.split_at(pkt.len() - 4);
            let icrc = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
            if check_icrc(c, prefix, solve.then_some(solver), covered, icrc).is_some() {
                c.cnp_received.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let ident = check_icrc(
        c,
        prefix,
        solve.then_some(solver),
        view.icrc_covered(),
        view.icrc(),
    )?;
    if ident == 0 {
        flow.zero_ident = flow.zero_ident.saturating_add(1);
    } else {
        flow.solved_any = true;
    }
    c.rx_packets.fetch_add(1, Ordering::Relaxed);
    c.rx_bytes.fetch_add(pkt.len() as u64, Ordering::Relaxed);
    if capture::active() {
        capture::record_received(src, wire.local, pkt, ident);
    }
    Some(view.bth().dest_qp())
}

/// Verifies the ICRC of a received packet against its flow's prefix (no per-sender
/// history: the multicast path): first as sent with
/// IPv4 identification 0 (softrdma peers; the full 32-bit check, and all the work done when
/// it passes), then, for IPv4, with the identification solved from the ICRC (other stacks).
/// Returns the identification that matched; counts and returns `None` when none does.
pub(crate) fn verify_icrc(
    c: &Counters,
    prefix: &IcrcPrefix,
    solver: &mut IdentSolver,
    view: &softrdma_wire::roce::Packet<&[u8]>,
) -> Option<u16> {
    check_icrc(c, prefix, Some(solver), view.icrc_covered(), view.icrc())
}

/// Packets verified with identification 0, and none through a solved one, after which a
/// sender counts as a softrdma peer whose packets get only the full check (a corrupted
/// packet would otherwise pass the 16-bit check of a solved identification with probability
/// 2^-16: one in about 65,000 corrupted packets). Linux rxe varies the identification per
/// packet, so its flows solve one long before this many zeros.
pub(super) const ZERO_IDENT_PEER: u32 = 64;

/// What the receive path keeps per sender: its ICRC prefix and how its packets verified.
pub(crate) struct RxFlow {
    pub(super) prefix: IcrcPrefix,
    /// Packets verified with identification 0 (saturating).
    pub(super) zero_ident: u32,
    /// Whether a packet ever verified through a solved identification (another stack).
    pub(super) solved_any: bool,
}

/// Whether a UDP payload is a RoCEv2 CNP: opcode `0x81` in a packet of exactly its size
/// (BTH, 16 reserved bytes, ICRC).
pub(super) fn is_cnp(pkt: &[u8]) -> bool {
    pkt.len() == softrdma_wire::bth::HEADER_LEN + 16 + 4
        && pkt[0] == softrdma_wire::opcode::Opcode::CNP.0
}

/// [`verify_icrc`] for the bytes the ICRC covers and the ICRC as received.
pub(super) fn check_icrc(
    c: &Counters,
    prefix: &IcrcPrefix,
    solver: Option<&mut IdentSolver>,
    covered: &[u8],
    icrc: u32,
) -> Option<u16> {
    match prefix.compute(covered) {
        Ok(crc) if crc == icrc => Some(0),
        Ok(crc) => match solver.and_then(|s| prefix.solve_ident(s, covered.len(), crc, icrc)) {
            Some(ident) => {
                c.icrc_ident_solved.fetch_add(1, Ordering::Relaxed);
                Some(ident)
            }
            None => {
                c.icrc_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        },
        Err(_) => {
            c.icrc_errors.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// How a packet reached the device.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Via {
    /// On the device socket: an RC or UC QP takes it only from its peer.
    Unicast,
    /// On the socket of this multicast group: the QP takes it only while attached.
    Group(Gid),
}

/// What became of packets handed to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The transport has them.
    Delivered,
    /// The QP cannot take them: no transport (RESET), or not attached to the group.
    NotReady,
    /// An RC or UC QP, and they did not come from its peer.
    WrongSource,
}

/// Where the receive side hands what it received: the engine above it, which holds the QPs
/// and QP 1.
pub(crate) trait RxSink {
    /// Hands a run of good packets, all from `src` to `dst` and for QP `qpn`, to that QP's
    /// transport; `None` when there is no such QP.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &self,
        qpn: u32,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Option<Delivery>;

    /// Hands a good packet for QP 1 to the CM (of this process, or of the one it is for when
    /// not `forwarded` here already).
    fn mad(&self, pkt: &[u8], src: SocketAddr, now: Instant, tx: &mut TxBatch, forwarded: bool);

    /// Reads the socket's ICMP errors; returns how many.
    fn icmp_errors(&self, tx: &mut TxBatch) -> usize;

    /// The steering of the shared device is out of date: runs its discovery again.
    fn rediscover(&self);
}

/// Hands a run of good packets, all for QP `qpn` and from `src`, to that QP's transport
/// under one lock, then drives the QP once; counts what it could not take.
fn deliver(
    wire: &Wire,
    sink: &impl RxSink,
    qpn: u32,
    pkts: &[&[u8]],
    src: SocketAddr,
    now: Instant,
    tx: &mut TxBatch,
) {
    let c = &wire.counters;
    let n = pkts.len() as u64;
    match sink.deliver(qpn, pkts, src, wire.local.ip(), Via::Unicast, now, tx) {
        Some(Delivery::Delivered) => {}
        None | Some(Delivery::NotReady) => {
            c.unknown_qp.fetch_add(n, Ordering::Relaxed);
        }
        Some(Delivery::WrongSource) => {
            c.wrong_source.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The receive side of an engine: buffers and ICRC flows, used by whichever thread receives
/// (the progress thread, or an application thread polling a CQ), one at a time so that
/// packets are processed in the order they arrived.
pub(crate) struct RxState {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) meta: Vec<RxMsg>,
    pub(super) prefixes: HashMap<SocketAddr, RxFlow>,
    /// Solves for the IPv4 identification of packets from other stacks.
    pub(super) ident: IdentSolver,
}

impl RxState {
    pub(crate) fn new() -> RxState {
        RxState {
            bufs: (0..BATCH).map(|_| vec![0u8; 65536]).collect(),
            meta: vec![RxMsg::default(); BATCH],
            prefixes: HashMap::new(),
            ident: IdentSolver::new(),
        }
    }
}

/// The RoCEv2 packets of one received message (one datagram, or a GRO batch of
/// `segment`-byte datagrams) and their sender; `None` (counted as malformed when empty)
/// when there is nothing to process.
pub(crate) fn datagrams<'a>(
    c: &Counters,
    buf: &'a [u8],
    m: RxMsg,
) -> Option<(SocketAddr, std::slice::Chunks<'a, u8>)> {
    let src = m.src?;
    if m.len == 0 {
        let c = if m.truncated {
            &c.malformed
        } else {
            &c.probes_received
        };
        c.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let seg = if m.segment == 0 { m.len } else { m.segment };
    Some((src, buf[..m.len].chunks(seg)))
}

impl RxState {
    /// Receives and processes what is waiting on the device socket, up to `rounds` batches,
    /// handing what is good to `sink`. Returns the number of messages received.
    pub(crate) fn receive_rounds(
        &mut self,
        wire: &Wire,
        share: &Share,
        sink: &impl RxSink,
        tx: &mut TxBatch,
        rounds: usize,
    ) -> usize {
        let mut total = 0;
        let RxState {
            bufs,
            meta,
            prefixes,
            ident,
        } = self;
        let local = wire.local.ip();
        for _ in 0..rounds {
            let n = match wire.sock.recv_batch(bufs, meta) {
                Ok(n) => n,
                Err(e) => {
                    // An ICMP error for an earlier datagram is reported here once, and its
                    // details wait in the error queue (which keeps the socket readable
                    // until drained): read them, then go on receiving.
                    let icmp = sink.icmp_errors(tx);
                    if icmp == 0 {
                        tracing::warn!(error = %e, "receive failed");
                        0
                    } else {
                        continue;
                    }
                }
            };
            if n == 0 {
                break;
            }
            total += n;
            let now = Instant::now();
            // Runs of packets for the same QP are delivered under one lock (one vector for
            // the round, not one per message).
            let mut run: Vec<&[u8]> = Vec::with_capacity(BATCH);
            for i in 0..n {
                let Some((src, pkts)) = datagrams(&wire.counters, &bufs[i], meta[i]) else {
                    continue;
                };
                // One flow lookup per message: the datagrams of a GRO batch share a sender.
                let flow = prefixes.entry(src).or_insert_with(|| RxFlow {
                    prefix: rx_flow(src, local),
                    zero_ident: 0,
                    solved_any: false,
                });
                run.clear();
                let mut run_qpn = None;
                for pkt in pkts {
                    if pkt.len() == share::MARKER_LEN
                        && pkt[0] == share::MARKER_OPCODE
                        && share.on_marker(pkt, src)
                    {
                        continue;
                    }
                    let Some(qpn) = check_packet(wire, pkt, src, flow, ident) else {
                        continue;
                    };
                    if qpn == softrdma_wire::mad::GSI_QPN {
                        sink.mad(pkt, src, now, tx, false);
                        continue;
                    }
                    if !owns_qpn(share, qpn) {
                        misrouted(wire, share, sink, qpn, src, pkt);
                        continue;
                    }
                    if run_qpn != Some(qpn) {
                        if let Some(q) = run_qpn {
                            deliver(wire, sink, q, &run, src, now, tx);
                        }
                        run.clear();
                        run_qpn = Some(qpn);
                    }
                    run.push(pkt);
                }
                if let Some(q) = run_qpn {
                    deliver(wire, sink, q, &run, src, now, tx);
                }
            }
            wire.send(tx);
            if n < BATCH {
                break;
            }
        }
        total
    }
}

/// The QP number that addresses a multicast group (IBA 10.5.2.5).
pub(crate) const MULTICAST_QPN: u32 = 0xff_ffff;

/// Whether packets for `qpn` are this process's (its slot's, or the multicast QP's): the
/// others belong to other processes sharing the device.
#[inline]
fn owns_qpn(share: &Share, qpn: u32) -> bool {
    share::slot_of_qpn(qpn) == share.slot() || qpn == MULTICAST_QPN
}

/// A good packet for a QP of another process sharing the device: forwarded to it (counted in
/// `misrouted`), or dropped when that process is gone (`unknown_qp`); either way the
/// steering is out of date, so discovery runs again.
fn misrouted(
    wire: &Wire,
    share: &Share,
    sink: &impl RxSink,
    qpn: u32,
    src: SocketAddr,
    pkt: &[u8],
) {
    let c = &wire.counters;
    match share.forward(share::slot_of_qpn(qpn), src, pkt) {
        Ok(()) => c.misrouted.fetch_add(1, Ordering::Relaxed),
        Err(_) => c.unknown_qp.fetch_add(1, Ordering::Relaxed),
    };
    if share.discovery_due() {
        sink.rediscover();
    }
}

impl RxState {
    /// Receives what other processes sharing the device forwarded to this one (packets that
    /// reached them for QPs of this process) and processes it as if it had arrived on the
    /// device socket: the same checks, then delivery. Returns the number of messages taken.
    pub(crate) fn receive_forwarded(
        &mut self,
        wire: &Wire,
        share: &Share,
        sink: &impl RxSink,
        tx: &mut TxBatch,
    ) -> usize {
        let RxState {
            bufs,
            prefixes,
            ident,
            ..
        } = self;
        let buf = &mut bufs[0];
        let mut n = 0;
        while n < 4 * BATCH {
            let Some(got) = share.recv(buf) else {
                break;
            };
            n += 1;
            let Some((src, range)) = got else {
                continue;
            };
            let pkt = &buf[range];
            let flow = prefixes.entry(src).or_insert_with(|| RxFlow {
                prefix: rx_flow(src, wire.local.ip()),
                zero_ident: 0,
                solved_any: false,
            });
            let Some(qpn) = check_packet(wire, pkt, src, flow, ident) else {
                continue;
            };
            let now = Instant::now();
            if qpn == softrdma_wire::mad::GSI_QPN {
                sink.mad(pkt, src, now, tx, true);
            } else if owns_qpn(share, qpn) {
                deliver(wire, sink, qpn, &[pkt], src, now, tx);
            } else {
                // Never a second hop.
                wire.counters.unknown_qp.fetch_add(1, Ordering::Relaxed);
            }
        }
        wire.send(tx);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::grh_for;
    use softrdma_wire::ip::{Ipv4Packet, Ipv6Packet, IP_PROTOCOL_UDP};
    use std::net::SocketAddr;

    #[test]
    fn grh_carries_the_ip_header_the_datagram_came_with() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.91.0.1:4791".parse().unwrap(),
            "127.91.0.2:4791".parse().unwrap(),
        );
        let g = grh_for(&a, &b, 100);
        assert_eq!(g[..20], [0; 20]);
        let p = Ipv4Packet::new_unchecked(&g[20..]);
        assert!(p.verify_checksum());
        assert_eq!(
            &g[20..32],
            &[0x45, 0, 0, 128, 0, 0, 0x40, 0, 64, 17, g[30], g[31]]
        );
        assert_eq!(
            (p.src_addr(), p.dst_addr(), p.total_len()),
            (
                "127.91.0.1".parse().unwrap(),
                "127.91.0.2".parse().unwrap(),
                128
            )
        );
        let (a, b): (SocketAddr, SocketAddr) = (
            "[fd00::1]:4791".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
        );
        let g = grh_for(&a, &b, 100);
        let p = Ipv6Packet::new_unchecked(&g[..]);
        assert_eq!(g[0..4], [0x60, 0, 0, 0]);
        assert_eq!(
            (p.next_header(), p.hop_limit(), p.payload_len()),
            (IP_PROTOCOL_UDP, 64, 108)
        );
        assert_eq!(
            (p.src_addr(), p.dst_addr()),
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
        );
    }
}
