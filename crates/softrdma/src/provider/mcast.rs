//! IP multicast for UD QPs, as RoCEv2 does it.
//!
//! A UD SEND whose address handle names a multicast GID goes, from the device socket, to the
//! group's IP address on port 4791 with the multicast QP number (0xFFFFFF) in its BTH (see
//! [`crate::Qp::post_send`] and `drive`). To receive, the first QP of a device attached to a
//! group makes the engine open a socket bound to `group:4791` (with `SO_REUSEADDR`, so that
//! every device and process on the host that joins gets a copy) and join the group on the
//! device's interface; the last detach leaves the group and drops the socket.
//!
//! A datagram received on a group socket is checked like a unicast one (ICRC computed with
//! the group as destination address; bad ones counted and dropped) and a copy goes to every
//! attached QP of the device, with the QP's own number in the copy's BTH, so that the QP's
//! transport sees an ordinary UD SEND: it checks the Q_Key, takes a receive WQE of its own and
//! fills the GRH area (with the group as destination). The QP that sent the datagram does not
//! get it back.
//!
//! # Concurrency
//! The table of groups is behind one lock that nothing else is taken under (sockets are opened
//! and joined with it held, which never blocks). Receivers use an immutable snapshot of it
//! (`View`), refreshed when `mcast_gen` changes, so the receive path takes no lock for the
//! table; the snapshot also keeps the sockets it lists open, so the progress thread never polls
//! a closed (or reused) descriptor. Whether a member still gets a copy is decided under the
//! QP's own lock from the QP's list of groups, so a QP receives nothing once
//! [`crate::Qp::detach_mcast`] has returned. A group joined while the progress thread sleeps
//! wakes it up; datagrams that arrive before it polls the new socket wait in that socket.

use super::capture;
use super::rx::{add_counts, datagrams, Counts, RxSink, RxState, Via, MULTICAST_QPN};
use super::sock::{UdpSock, ROCE_PORT};
use super::tx::{TxBatch, Wire};
use crate::error::Result;
use crate::gid::Gid;
use softrdma_proto::device::{icrc_flow, verify_icrc};
use softrdma_wire::icrc::{IcrcPrefix, IdentSolver};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One joined group, as receivers see it.
#[derive(Debug)]
pub(super) struct Group {
    /// The group's IP address.
    pub(super) ip: IpAddr,
    /// The group's GID (what QPs record in their list of groups).
    pub(super) gid: Gid,
    /// The socket bound to `ip:4791` and member of the group.
    pub(super) sock: Arc<UdpSock>,
    /// The QP numbers attached, in attach order.
    pub(super) members: Vec<u32>,
}

/// A snapshot of the groups that have a socket.
#[derive(Debug, Default)]
pub(super) struct View {
    pub(super) groups: Vec<Group>,
}

/// One group in the table: its socket (none when the group is of the other IP family than
/// the device, which can then never receive it) and its members.
#[derive(Debug)]
struct Entry {
    gid: Gid,
    sock: Option<Arc<UdpSock>>,
    members: Vec<u32>,
}

/// The table of groups, and the snapshot receivers use.
#[derive(Debug, Default)]
struct Table {
    groups: HashMap<IpAddr, Entry>,
    view: Arc<View>,
}

impl Table {
    fn rebuild(&mut self) {
        let mut groups: Vec<Group> = self
            .groups
            .iter()
            .filter_map(|(ip, e)| {
                Some(Group {
                    ip: *ip,
                    gid: e.gid,
                    sock: e.sock.clone()?,
                    members: e.members.clone(),
                })
            })
            .collect();
        groups.sort_by_key(|g| g.ip);
        self.view = Arc::new(View { groups });
    }
}

/// The multicast part of the receive state (held by whichever thread receives).
#[derive(Default)]
pub(crate) struct RxMcast {
    /// The snapshot `poll_progress` receives from, and its generation.
    view: Arc<View>,
    view_gen: u64,
    /// ICRC flows by (source, group).
    prefixes: HashMap<(SocketAddr, IpAddr), IcrcPrefix>,
    /// Solves for the IPv4 identification of packets from other stacks.
    ident: IdentSolver,
    /// The copy of a datagram handed to one member (with its QP number in the BTH).
    copy: Vec<u8>,
}

impl RxMcast {
    /// Whether the snapshot still holds group sockets open.
    pub(super) fn holds_sockets(&self) -> bool {
        !self.view.groups.is_empty()
    }
}

/// The multicast part of an engine: the groups the device has joined, their sockets and
/// attached QPs.
pub(crate) struct Mcast {
    table: Mutex<Table>,
    /// Bumped (under the `table` lock) whenever the set of groups or members changes, so
    /// that receivers refresh their snapshot without taking the lock otherwise.
    gen: AtomicU64,
    /// Number of group sockets open (0: the multicast receive path costs one load).
    socks: AtomicUsize,
    /// Interface index of the device address (IPv6 multicast names interfaces by index).
    ifindex: u32,
}

impl Mcast {
    /// No group, on the interface `ifindex`.
    pub(super) fn new(ifindex: u32) -> Mcast {
        Mcast {
            table: Mutex::new(Table::default()),
            gen: AtomicU64::new(0),
            socks: AtomicUsize::new(0),
            ifindex,
        }
    }

    /// The generation of the groups (changes whenever they do).
    pub(super) fn generation(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// Whether a group socket is open.
    #[inline]
    pub(super) fn any_sockets(&self) -> bool {
        self.socks.load(Ordering::Acquire) != 0
    }

    /// Attaches QP `qpn` to the multicast group `gid` on this device: the first member joins
    /// the IP group (a socket bound to `group:4791`, a member on the device's interface,
    /// polled by the progress thread). A group of the other IP family than the device is
    /// recorded but never receives anything (the device has no address to join it from).
    /// Attaching a QP already attached does nothing.
    ///
    /// Fails, changing nothing, with `EINVAL` when `gid` is not a multicast GID and with the
    /// error of opening or joining the socket (`ENOBUFS` past the kernel's
    /// `igmp_max_memberships`, `ENODEV` when the interface cannot do multicast, …).
    pub(crate) fn join(&self, wire: &Wire, gid: &Gid, qpn: u32) -> Result<()> {
        let ip = gid.to_ip();
        if !ip.is_multicast() {
            return Err(crate::Error::invalid(format!(
                "{gid} is not a multicast GID"
            )));
        }
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut opened = false;
        // A new member needs no wake-up: receivers take a fresh snapshot after receiving.
        let e = match t.groups.entry(ip) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let local = wire.local.ip();
                let sock = if ip.is_ipv4() == local.is_ipv4() {
                    opened = true;
                    Some(Arc::new(UdpSock::bind_group(ip, local, self.ifindex)?))
                } else {
                    tracing::debug!(%gid, %local, "group of the other family: attached, not joined");
                    None
                };
                v.insert(Entry {
                    gid: *gid,
                    sock,
                    members: Vec::new(),
                })
            }
        };
        if e.members.contains(&qpn) {
            return Ok(());
        }
        e.members.push(qpn);
        t.rebuild();
        if opened {
            self.socks.fetch_add(1, Ordering::AcqRel);
        }
        self.gen.fetch_add(1, Ordering::AcqRel);
        drop(t);
        tracing::debug!(%gid, qpn, joined = opened, "multicast attach");
        if opened {
            // The progress thread polls the new socket from its next round.
            wire.wake.signal();
        }
        Ok(())
    }

    /// Detaches QP `qpn` from the group `gid` (no-op when it is not attached); the last
    /// member leaves the IP group, and the socket closes once no receiver's snapshot holds
    /// it any more. Never fails: a failure to leave the group is only logged (the socket
    /// closes anyway, which leaves the group).
    pub(crate) fn leave(&self, wire: &Wire, gid: &Gid, qpn: u32) {
        let ip = gid.to_ip();
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = t.groups.get_mut(&ip) else {
            return;
        };
        let Some(pos) = e.members.iter().position(|&q| q == qpn) else {
            return;
        };
        e.members.remove(pos);
        let mut closed = false;
        if e.members.is_empty() {
            let e = t.groups.remove(&ip).expect("present above");
            if let Some(sock) = e.sock {
                closed = true;
                if let Err(err) = sock.leave_group(ip, wire.local.ip(), self.ifindex) {
                    tracing::debug!(%gid, error = %err, "leaving the multicast group");
                }
            }
        }
        t.rebuild();
        if closed {
            self.socks.fetch_sub(1, Ordering::AcqRel);
        }
        self.gen.fetch_add(1, Ordering::AcqRel);
        drop(t);
        tracing::debug!(%gid, qpn, left = closed, "multicast detach");
        if closed {
            // The progress thread drops its snapshot, closing the socket.
            wire.wake.signal();
        }
    }

    /// Brings the receive state's snapshot of the groups up to date (the lock is only taken
    /// when the groups changed since) and returns it.
    pub(super) fn refresh(&self, m: &mut RxMcast) -> Arc<View> {
        if self.gen.load(Ordering::Acquire) != m.view_gen {
            let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
            m.view_gen = self.gen.load(Ordering::Acquire);
            m.view = t.view.clone();
        }
        m.view.clone()
    }

    /// Receives what waits on every group socket (up to `rounds` batches each), with the
    /// receive state held. Returns the number of messages received.
    pub(super) fn poll(
        &self,
        rx: &mut RxState,
        m: &mut RxMcast,
        wire: &Wire,
        sink: &impl RxSink,
        tx: &mut TxBatch,
        rounds: usize,
    ) -> usize {
        let view = self.refresh(m);
        view.groups
            .iter()
            .map(|g| self.receive_group(rx, m, wire, sink, tx, g, rounds))
            .sum()
    }

    /// Receives and processes what waits on the socket of group `g`, up to `rounds` batches,
    /// with the receive state held. Returns the number of messages received.
    #[allow(clippy::too_many_arguments)]
    fn receive_group(
        &self,
        rx: &mut RxState,
        mcast: &mut RxMcast,
        wire: &Wire,
        sink: &impl RxSink,
        tx: &mut TxBatch,
        g: &Group,
        rounds: usize,
    ) -> usize {
        let RxState {
            bufs,
            meta,
            scratch,
            ..
        } = rx;
        let batch = bufs.len();
        let mut total = 0;
        for _ in 0..rounds {
            let n = match g.sock.recv_batch(bufs, meta, scratch) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, group = %g.ip, "multicast receive failed");
                    0
                }
            };
            if n == 0 {
                break;
            }
            total += n;
            // The members as they are now: a QP attached before these datagrams were sent
            // (hence before they were received) is in the snapshot taken after receiving.
            let view = self.refresh(mcast);
            let Some(g) = view.groups.iter().find(|x| x.ip == g.ip) else {
                // Left meanwhile: nobody is attached any more.
                continue;
            };
            let now = Instant::now();
            for i in 0..n {
                let Some((src, pkts)) = datagrams(&wire.counters, &bufs[i], meta[i]) else {
                    continue;
                };
                for pkt in pkts {
                    packet(mcast, wire, sink, g, pkt, src, now, tx);
                }
            }
            wire.send(tx);
            if n < batch {
                break;
            }
        }
        total
    }
}

/// Checks one datagram received on the socket of group `g` and hands a copy to every
/// attached QP but the one that sent it.
#[allow(clippy::too_many_arguments)]
fn packet(
    m: &mut RxMcast,
    wire: &Wire,
    sink: &impl RxSink,
    g: &Group,
    pkt: &[u8],
    src: SocketAddr,
    now: Instant,
    tx: &mut TxBatch,
) {
    let c = &wire.counters;
    let Ok(view) = softrdma_wire::roce::Packet::new_checked(pkt) else {
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let prefix = m
        .prefixes
        .entry((src, g.ip))
        .or_insert_with(|| icrc_flow(src.ip(), src.port(), g.ip));
    // No per-sender history here: the identification is always solved for when the full
    // check fails.
    let mut counts = Counts::default();
    let checked = verify_icrc(
        &mut counts,
        prefix,
        Some(&mut m.ident),
        view.icrc_covered(),
        view.icrc(),
    );
    add_counts(&mut counts, c);
    let Ok(ident) = checked else {
        return;
    };
    c.rx_packets.fetch_add(1, Ordering::Relaxed);
    c.rx_bytes.fetch_add(pkt.len() as u64, Ordering::Relaxed);
    c.mcast_rx_packets.fetch_add(1, Ordering::Relaxed);
    let group_addr = SocketAddr::new(g.ip, ROCE_PORT);
    if capture::active() {
        capture::record_received(src, group_addr, pkt, ident);
    }
    // Only UD SENDs to the multicast QP number are multicast (IBA 10.5.2.5).
    let (Some(deth), MULTICAST_QPN) = (view.deth(), view.bth().dest_qp()) else {
        c.malformed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let src_qp = deth.src_qp();
    for &qpn in &g.members {
        if src == wire.local && src_qp == qpn {
            // The sender's own copy, looped back.
            continue;
        }
        m.copy.clear();
        m.copy.extend_from_slice(pkt);
        softrdma_wire::bth::Packet::new_unchecked(&mut m.copy[..]).set_dest_qp(qpn);
        // (A member gone, in RESET or just detached takes nothing.)
        let _ = sink.deliver(qpn, &[&m.copy[..]], src, g.ip, Via::Group(g.gid), now, tx);
    }
}
