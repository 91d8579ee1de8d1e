//! The device: the sans-IO layer between a UDP socket and the QPs of one RoCEv2 device, in
//! the style of quinn-proto's `Endpoint`.
//!
//! A [`Device`] takes the datagrams its owner receives ([`Device::handle_datagram`]) and
//! says what each one is: a packet for a registered QP (with the GRH a UD receive gets), a
//! MAD for the connection manager on QP 1, a liveness probe, or a drop with its reason,
//! counted in [`DeviceCounters`]. On the way it checks the packet's layout and its ICRC,
//! computed as RoCEv2 specifies over the masked IP and UDP pseudo-header of the datagram's
//! flow ([`softrdma_wire::icrc::IcrcPrefix`]; IPv4 packets of other stacks verify through
//! their solved identification, see [`flows::ZERO_IDENT_PEER`]). On the way out it seals the
//! packets its owner's QPs wrote ([`Device::seal`]: the ICRC for the flow to the peer) and
//! frames and seals the CM's MADs ([`Device::poll_cm_transmit`]). It keeps one deadline per
//! QP number ([`Device::set_timer`], [`Device::poll_timeout`], [`Device::handle_timeout`];
//! QP 1's is the CM's) and the held-ACK policy ([`acks`]).
//!
//! It never reads a clock, opens a socket or spawns a thread, holds no QP state itself (its
//! owner holds the [`Qp`](crate::transport::Qp)s and the [`Cm`], and registers a handle of
//! its choice per QP number), never panics on input, and allocates nothing per datagram once
//! its tables have grown to their working size (senders, destinations, timers).
//!
//! # How the provider drives it
//! The provider (softrdma's `provider/` engine) keeps one `Device<H>` per device under its
//! receive lock, `H` being its QP handle (a `Weak<dyn QpPort>`, or an index):
//! * `register`/`unregister` as the verbs layer does today (`Engine::register`); unregister
//!   also clears the QP's timer and held ACK;
//! * receiving (`rx.rs`): for each datagram of a `recvmmsg` batch, `handle_datagram(now,
//!   src, local_ip, bytes)`; runs of consecutive [`Received::Qp`] with the same QP number go
//!   to that QP under one lock (`QpPort::receive`), [`Received::Mad`] to `Cm::handle_mad`
//!   under the GSI lock; a QP that cannot take its packets (no transport, wrong peer) is
//!   counted with [`Device::count_drop`];
//! * sending (`tx.rs`): each packet a QP's `poll_transmit` wrote into the batch slot is
//!   sealed before `sendmmsg`, by `seal(dst, &mut slot[..len])`, or, on posting threads
//!   that do not hold the receive lock, by a [`Sealer`] kept in the thread's transmit
//!   batch (as its ICRC prefixes are today); the CM's MADs come from
//!   `poll_cm_transmit(&mut cm, slot)`, sealed, with their destination;
//! * progress (`progress.rs`): sleep until `poll_timeout()`, then `handle_timeout(now, &mut
//!   due)` and run each due QP's `on_timeout` (QP 1: `Cm::handle_timeout`); after every drive
//!   of a QP, `set_timer(qpn, qp.poll_timeout())`;
//! * held ACKs: a thread receiving for itself passes [`Receiver::AppPoll`] to
//!   [`HeldAcks::begin_drive`] / [`HeldAcks::end_drive`] around the QP's transmit loop
//!   ([`Device::acks_mut`]); a CQ polled empty or the progress thread waking takes
//!   [`HeldAcks::take_all`] and drives those QPs; post_send, a move to RESET/ERR and destroy
//!   call [`HeldAcks::release`] for theirs.
//!
//! Today the provider uses the parts rather than a whole `Device`: a [`Sealer`] per source
//! address in each thread's transmit batch, [`RxFlows`] (one [`Sender`] per received
//! message) and [`verify_icrc`] for its multicast groups, [`grh_for`], [`icrc_flow`], the
//! QP 1 framing of [`gsi`] around `Cm::poll_transmit_into`; it keeps its QP table, timers
//! (a map: a [`TimerTable::set`] costs about three times a map insert, once per drive of a
//! QP), held ACKs and atomic counters itself (adding what the checks count before packets
//! go to a QP). The whole `Device` is driven by the simulated-network tests.
//!
//! The provider's `Counters` map onto [`DeviceCounters`] field for field (`rx_packets`,
//! `rx_bytes`, `probes_received`, `malformed`, `icrc_errors`, `icrc_ident_solved`,
//! `cnp_received`, `unknown_qp`, `wrong_source`), and its GSI `dropped` onto `gsi_dropped`;
//! `tx_*` stay the socket's (what `sendmmsg` took), beside `sealed_*` here. The provider
//! reads them under the receive lock, or adds them into its atomic counters after each
//! batch. A capture records
//! the identification a packet verified with from [`Device::last_ident`].
//!
//! Multicast group sockets and their fan-out (the provider checks their ICRC per group, with
//! no per-sender history), ICMP errors, fault injection, capture and the socket hand-off stay
//! in the provider.

pub mod acks;
mod counters;
pub mod flows;
pub mod gsi;
pub mod timers;

pub use acks::{HeldAcks, Receiver};
pub use counters::{DeviceCounters, DropReason};
pub use flows::{grh_for, icrc_flow, verify_icrc, RxFlows, SealError, Sealer, Sender};
pub use gsi::{frame_mad, unframe_mad, MAD_PACKET_LEN};
pub use timers::TimerTable;

use crate::cm::Cm;
use crate::transport::RxMeta;
use softrdma_wire::{mad, roce};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// The QP number of the general services interface, whose packets go to the CM.
pub const GSI_QPN: u32 = mad::GSI_QPN;

/// The settings of a [`Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The device's IP address: the source of what it sends.
    pub local: IpAddr,
    /// The UDP source port of what it sends (the port its socket is bound to; 4791 for a
    /// device), which the ICRC of every packet sent covers.
    pub port: u16,
    /// The PSN of the first MAD sent from QP 1 (24 bits; the provider draws it at random).
    pub gsi_psn: u32,
    /// Whether the owner hands the socket to polling application threads, which then hold
    /// ACKs (see [`acks`]).
    pub hold_acks: bool,
    /// The most senders, and the most destinations, whose ICRC flows are kept; beyond it a
    /// flow is built for each packet and not kept (so hostile sources cannot grow memory).
    pub max_flows: usize,
}

impl DeviceConfig {
    /// The settings of a device at `local` port 4791: first GSI PSN 0, no held ACKs, up to
    /// 4096 flows each way.
    pub fn new(local: IpAddr) -> DeviceConfig {
        DeviceConfig {
            local,
            port: softrdma_wire::ROCE_V2_UDP_PORT,
            gsi_psn: 0,
            hold_acks: false,
            max_flows: 4096,
        }
    }
}

/// What a received datagram turned out to be ([`Device::handle_datagram`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received<'a, H> {
    /// A good packet for a registered QP: hand `packet` and `meta` to its
    /// [`Qp::handle_packet`](crate::transport::Qp::handle_packet).
    Qp {
        /// The destination QP number.
        qpn: u32,
        /// The handle registered for it.
        handle: H,
        /// The transport packet, BTH through ICRC (ICRC verified).
        packet: &'a [u8],
        /// The GRH a UD receive gets ([`grh_for`]).
        meta: RxMeta,
    },
    /// A MAD for the connection manager (QP 1): hand it to [`Cm::handle_mad`].
    Mad {
        /// The sender's IP address.
        src: IpAddr,
        /// The 256-byte MAD.
        mad: &'a [u8],
    },
    /// An empty datagram: a softrdma peer's liveness probe (counted).
    Probe,
    /// Dropped, and counted, for this reason.
    Dropped(DropReason),
}

/// The sans-IO device: see the [module documentation](self).
#[derive(Debug)]
pub struct Device<H> {
    cfg: DeviceConfig,
    qps: HashMap<u32, H>,
    rx: RxFlows,
    tx: Sealer,
    timers: TimerTable,
    acks: HeldAcks,
    counters: DeviceCounters,
    last_rx: Option<Instant>,
    last_ident: u16,
    gsi_psn: u32,
}

impl<H: Clone> Device<H> {
    /// A device with `cfg`, no QP registered.
    pub fn new(cfg: DeviceConfig) -> Device<H> {
        Device {
            cfg,
            qps: HashMap::new(),
            rx: RxFlows::new(cfg.max_flows),
            tx: Sealer::new(cfg.local, cfg.port, cfg.max_flows),
            timers: TimerTable::new(),
            acks: HeldAcks::new(cfg.hold_acks),
            counters: DeviceCounters::default(),
            last_rx: None,
            last_ident: 0,
            gsi_psn: cfg.gsi_psn & 0xff_ffff,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// The device's IP address.
    pub fn local(&self) -> IpAddr {
        self.cfg.local
    }

    /// Routes packets for QP `qpn` (24 bits) to `handle` from now on; returns the handle it
    /// replaces. QP 1 is the CM's: its packets are always [`Received::Mad`], whatever is
    /// registered.
    pub fn register(&mut self, qpn: u32, handle: H) -> Option<H> {
        self.qps.insert(qpn & 0xff_ffff, handle)
    }

    /// Stops routing packets to QP `qpn`, clears its deadline and forgets its held ACK;
    /// returns its handle.
    pub fn unregister(&mut self, qpn: u32) -> Option<H> {
        let qpn = qpn & 0xff_ffff;
        self.timers.set(qpn, None);
        self.acks.release(qpn);
        self.qps.remove(&qpn)
    }

    /// The handle registered for QP `qpn`.
    pub fn handle(&self, qpn: u32) -> Option<&H> {
        self.qps.get(&(qpn & 0xff_ffff))
    }

    /// The number of QPs registered.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Takes one received UDP datagram (its payload `datagram`, from `src`, sent to `dst`,
    /// this device's address) at `now`: checks it and says where it goes. Bad ones are
    /// counted and dropped ([`Received::Dropped`]). Never panics; allocates nothing once the
    /// sender's flow is known.
    pub fn handle_datagram<'a>(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        datagram: &'a [u8],
    ) -> Received<'a, H> {
        self.last_rx = Some(now);
        let c = &mut self.counters;
        if datagram.is_empty() {
            c.probes_received = c.probes_received.saturating_add(1);
            return Received::Probe;
        }
        let qpn = match self.rx.check(c, datagram, src, dst) {
            Ok((qpn, ident)) => {
                self.last_ident = ident;
                qpn
            }
            Err(why) => return Received::Dropped(why),
        };
        c.rx_packets = c.rx_packets.saturating_add(1);
        c.rx_bytes = c.rx_bytes.saturating_add(datagram.len() as u64);
        if qpn == GSI_QPN {
            return match gsi::unframe_mad(datagram) {
                Some(mad) => Received::Mad { src: src.ip(), mad },
                None => {
                    c.count_drop(DropReason::BadMad, 1);
                    Received::Dropped(DropReason::BadMad)
                }
            };
        }
        match self.qps.get(&qpn) {
            Some(h) => Received::Qp {
                qpn,
                handle: h.clone(),
                packet: datagram,
                meta: RxMeta {
                    grh: grh_for(src.ip(), dst, datagram.len()),
                },
            },
            None => {
                c.count_drop(DropReason::UnknownQp, 1);
                Received::Dropped(DropReason::UnknownQp)
            }
        }
    }

    /// When a datagram was last handed to [`Device::handle_datagram`] (the provider keeps
    /// busy-polling for a while after it).
    pub fn last_receive(&self) -> Option<Instant> {
        self.last_rx
    }

    /// The IPv4 identification the last packet that passed the ICRC check verified with:
    /// 0 for softrdma peers and IPv6, the solved one for other stacks' packets (a capture
    /// that writes the IP header as it was on the wire records it).
    pub fn last_ident(&self) -> u16 {
        self.last_ident
    }

    /// Seals a packet this device sends to `dst` (from its port to port 4791): `packet` is the
    /// whole transport packet, BTH through the 4 bytes reserved for the ICRC, which get the
    /// ICRC computed over the pseudo-header of that flow (IPv4: identification 0, DF; IPv6
    /// when either address is). Fails, counted, when the packet is shorter than a BTH plus
    /// an ICRC or too long for the length fields; the packet is then left as it was.
    pub fn seal(&mut self, dst: IpAddr, packet: &mut [u8]) -> Result<(), SealError> {
        let c = &mut self.counters;
        match self.tx.seal(dst, packet) {
            Ok(()) => {
                c.sealed_packets = c.sealed_packets.saturating_add(1);
                c.sealed_bytes = c.sealed_bytes.saturating_add(packet.len() as u64);
                Ok(())
            }
            Err(e) => {
                c.seal_errors = c.seal_errors.saturating_add(1);
                Err(e)
            }
        }
    }

    /// Frames `mad` (256 bytes) as the next packet from QP 1 to QP 1 at `dst` into `buf` and
    /// seals it; returns its length ([`MAD_PACKET_LEN`]), or `None` when `mad` is shorter
    /// than a MAD or `buf` shorter than the packet.
    pub fn frame_mad(&mut self, dst: IpAddr, mad: &[u8], buf: &mut [u8]) -> Option<usize> {
        let len = gsi::frame_mad(buf, self.gsi_psn, mad)?;
        self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
        self.seal(dst, &mut buf[..len]).ok()?;
        Some(len)
    }

    /// Writes the CM's next MAD as a sealed RoCEv2 packet (UD SEND_ONLY, QP 1 to QP 1, Q_Key
    /// 0x80010000) into `buf` and returns its length and destination; `None` when the CM
    /// has nothing to send or `buf` is shorter than [`MAD_PACKET_LEN`] (the MAD then stays
    /// queued). The MAD is written in place behind the headers: nothing is allocated.
    pub fn poll_cm_transmit(&mut self, cm: &mut Cm, buf: &mut [u8]) -> Option<(usize, IpAddr)> {
        let len = gsi::frame_headers(buf, self.gsi_psn)?;
        let t = cm.poll_transmit_into(&mut buf[gsi::MAD_AT..len - roce::ICRC_LEN])?;
        self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
        self.seal(t.dest, &mut buf[..len]).ok()?;
        Some((len, t.dest))
    }

    /// The PSN of the next MAD sent from QP 1.
    pub fn gsi_psn(&self) -> u32 {
        self.gsi_psn
    }

    /// Sets (`Some`) or clears (`None`) the deadline of QP `qpn` (QP 1: the CM's,
    /// `Cm::poll_timeout`). Never fails.
    pub fn set_timer(&mut self, qpn: u32, deadline: Option<Instant>) {
        self.timers.set(qpn & 0xff_ffff, deadline);
    }

    /// The earliest deadline of all QPs: when [`Device::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.poll_timeout()
    }

    /// Appends to `due` the QPs whose deadline is at or before `now`, earliest first, and
    /// clears their deadlines (see [`TimerTable::handle_timeout`]); returns how many. QP 1
    /// stands for the CM (`Cm::handle_timeout`).
    pub fn handle_timeout(&mut self, now: Instant, due: &mut Vec<u32>) -> usize {
        self.timers.handle_timeout(now, due)
    }

    /// The timer table.
    pub fn timers(&self) -> &TimerTable {
        &self.timers
    }

    /// The held-ACK policy and the QPs holding one.
    pub fn acks(&self) -> &HeldAcks {
        &self.acks
    }

    /// The held-ACK policy and the QPs holding one, to note, take and release them.
    pub fn acks_mut(&mut self) -> &mut HeldAcks {
        &mut self.acks
    }

    /// The counters.
    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    /// Counts `n` packets the owner dropped after routing (a QP that cannot take them:
    /// [`DropReason::UnknownQp`]; an RC/UC packet from another address than the peer's:
    /// [`DropReason::WrongSource`]).
    pub fn count_drop(&mut self, reason: DropReason, n: u64) {
        self.counters.count_drop(reason, n);
    }

    /// The number of senders whose ICRC flows are kept.
    pub fn rx_flow_count(&self) -> usize {
        self.rx.len()
    }
}
