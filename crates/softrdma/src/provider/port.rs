//! The provider's face to the layers above it: the [`Provider`] trait through which the
//! verbs and rdma_cm layers use a device (they hold it as `Arc<dyn Provider>`), the
//! [`QpPort`] trait through which a provider hands a QP its packets and timeouts, and the
//! [`CmHook`] through which it hands CM events up. A provider implements them (today the UDP
//! RoCEv2 engine, `engine.rs`); nothing here names the implementation.

use super::counters::DeviceCounters;
use super::faults::FaultConfig;
use super::gsi::Gsi;
use super::rx::{Delivery, Via};
use super::tx::{DirectTx, TxBatch};
use crate::error::Result;
use crate::gid::Gid;
use softrdma_proto::cm::CmEvent;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// A QP as the provider sees it. The verbs layer registers each QP that can receive
/// ([`Provider::register`]) as this trait, and the provider hands it packets, timeouts and held
/// ACKs through it: the provider never names the verbs objects.
pub(crate) trait QpPort: Send + Sync {
    /// Hands a run of good packets, all from `src` to `dst` and for this QP, to its transport
    /// (under the QP's lock), drives the QP and raises the resulting events; says what
    /// became of them.
    #[allow(clippy::too_many_arguments)]
    fn receive(
        self: Arc<Self>,
        engine: &dyn Provider,
        pkts: &[&[u8]],
        src: SocketAddr,
        dst: IpAddr,
        via: Via,
        now: Instant,
        tx: &mut TxBatch,
    ) -> Delivery;

    /// The QP's deadline has passed: runs its transport's timers and drives it.
    fn on_timeout(self: Arc<Self>, engine: &dyn Provider, now: Instant, tx: &mut TxBatch);

    /// A ring of its own for the work-request records of QP `src_qpn` of the device at `src`
    /// (see `lanes::pair`): whether this QP takes it (an RC QP connected to that QP).
    fn attach_pair(
        self: Arc<Self>,
        engine: &dyn Provider,
        src: SocketAddr,
        src_qpn: u32,
        p: Arc<super::PairRx>,
    ) -> bool;

    /// Sends the positive ACK the QP's transport holds back, if any, and the sends of a UC
    /// or UD QP held for a batch; returns whether there was any (`false`: it sent what it
    /// held already, with an answer of its program, or holds nothing).
    fn release_held_ack(self: Arc<Self>) -> bool;
}

/// A device's provider as the layers above call it: the verbs layer (QPs, their timers and
/// transmit batches, CQ polls, multicast, counters, faults) and the connection manager (QP 1).
/// The layers above hold a device's provider only as `Arc<dyn Provider>` (from
/// `provider::open`, `if_open`, `all_open`) and never name its type. Today it has one
/// implementation, the UDP RoCEv2 engine (`engine.rs`), which also carries same-host lanes (its
/// packets through shared-memory rings when the peer device is on this host:
/// [`Provider::direct_lane`]); a transport that does not carry RoCEv2 packets would be a
/// second implementation.
pub(crate) trait Provider: Send + Sync {
    /// The device's address and UDP port (the address of its GID).
    fn local(&self) -> SocketAddr;
    /// This process's slot on the device (bits 16..23 of its QP numbers).
    fn slot(&self) -> u8;
    /// Registers the QP `qpn`: packets and timeouts for it go to `qp` from now on.
    fn register(&self, qpn: u32, qp: Weak<dyn QpPort>);
    /// Forgets the QP `qpn` and its deadline.
    fn unregister(&self, qpn: u32);
    /// Records the QP's next deadline (`None`: none).
    fn set_timer(&self, qpn: u32, deadline: Option<Instant>);
    /// Sends a batch of finished packets.
    fn send(&self, tx: &mut TxBatch);
    /// Whether [`Provider::direct_lane`] may find a lane (same-host lanes are on, and
    /// neither fault injection nor a capture needs the packets to pass through
    /// [`Provider::send`]).
    fn lanes_direct(&self) -> bool;
    /// The same-host lane to QP `dest_qpn` of the device at `peer` when one is up, to write
    /// packets straight into its ring ([`DirectTx::reserve`], [`DirectTx::commit`]): one copy
    /// less than through a [`TxBatch`]; published and counted when dropped (hold it only for
    /// a run of packets: other senders to the device's lanes wait). `None` when no lane is
    /// up there (one is offered: send through a batch meanwhile).
    fn direct_lane(&self, peer: IpAddr, dest_qpn: u32) -> Option<DirectTx<'_>>;
    /// Whether packets to QP `dest_qpn` of the device at `peer` may leave their payload in
    /// the program's registered memory, to be read in place when they go
    /// ([`TxBatch::commit_gapped`]): they go on the wire, and nothing needs them whole.
    fn may_gather(&self, peer: IpAddr, dest_qpn: u32) -> bool;
    /// Whether a same-host lane to QP `dest_qpn` of the device at `peer` is up now (its
    /// packets cost no system call).
    fn lane_is_up(&self, peer: IpAddr, dest_qpn: u32) -> bool;
    /// Offers a same-host lane to the process of QP `dest_qpn` of the device at `peer` now,
    /// if none is up or offered (a QP connected to it asks at RTR, so that its first packets
    /// find the lane up). Never fails; a peer that is not on this host gets none.
    fn prepare_lane(&self, peer: IpAddr, dest_qpn: u32);
    /// Whether short RC work requests to QP `dest_qpn` of the device at `peer` may go as
    /// records through a same-host lane ([`direct_lane`](Provider::direct_lane)) instead of
    /// packets: lanes both ways are up, the peer process takes such records, and neither a
    /// capture nor fault injection needs packets. Never fails; offers nothing.
    fn records_ready(&self, peer: IpAddr, dest_qpn: u32) -> bool;
    /// A ring of their own for the work-request records of QP `src_qpn` of this device to QP
    /// `dest_qpn` of the device at `peer` (see `lanes::pair`), offered to its process; `None`
    /// when pair rings are off, no lane to that process is up, or too many are out.
    fn offer_pair(&self, peer: IpAddr, dest_qpn: u32, src_qpn: u32) -> Option<super::PairTx>;
    /// Takes what the QP pair ring `p` holds and carries it out (on the calling thread; `busy`:
    /// it polls a CQ, and holds the acknowledgements of what it takes as `poll_progress`
    /// does); returns how many records. 0 when another thread is at it, or the device's
    /// lanes are paused. `qp`: the ring's QP when the caller has it (it is found by its number
    /// otherwise).
    fn take_pair(&self, p: &super::PairRx, qp: Option<Arc<dyn QpPort>>, busy: bool) -> usize;

    /// A number that changes whenever [`Provider::records_ready`] may have changed its
    /// answer for some peer (one atomic load): a QP that found records not ready looks
    /// again only once it changed.
    fn records_generation(&self) -> u64;
    /// A polling program took the completion of an RC RDMA WRITE that the peer acknowledged
    /// before answering (nothing came from it since): the progress thread watches the device
    /// for that program until it polls again, rather than leave the device to its polls (it
    /// may spin on memory for the answer). Never fails; costs a wake-up of the progress
    /// thread when it was leaving the device to the polls.
    fn watch_for_spinner(&self);
    /// Records that the transport of QP `qpn` holds a positive ACK back.
    fn note_held_ack(&self, qpn: u32);
    /// Undoes [`Provider::note_held_ack`]: QP `qpn` holds nothing back any more (it sent it
    /// with its own request). Never fails.
    fn forget_held_ack(&self, qpn: u32);
    /// Records that the transport of the UC or UD QP `qpn` holds sends just posted back for
    /// a batch; says whether the device will send them soon without the caller (an
    /// application thread polls it). `false`: the caller sends now.
    fn note_held_send(&self, qpn: u32) -> bool;
    /// Sends what QPs hold back after [`Provider::note_held_send`] (one atomic load when
    /// nothing is held).
    fn flush_held_sends(&self);
    /// Progress from an application thread that polls a CQ (`busy`: not armed): what waits
    /// for the device is received here. `empty`: the poll found nothing (the ACKs its QPs hold
    /// for the program's answers go now); not when a poll that took records from a QP pair
    /// ring looks at the device as well (an ACK sent then would reach the peer before the
    /// answer the program is about to give, and a peer that spins on memory once its WRITE
    /// completes would wait for its progress thread to take that answer).
    fn poll_progress(&self, busy: bool, empty: bool);
    /// Receives on the calling thread what waits for this device (this receive queue) now,
    /// after the thread receiving for it finishes its round (a few ms at most): for the
    /// connection manager, which runs on queue 0, so that what a peer sent to a QP of
    /// another queue before its DREQ reaches the QP before the DREQ moves it to ERR (on one
    /// queue the order of the socket and the lanes gives that).
    fn drain_receive(&self);
    /// An application thread is about to sleep on a completion channel.
    fn app_sleeps(&self);
    /// Attaches QP `qpn` to the multicast group `gid`; fails with the errno of joining it.
    fn mcast_join(&self, gid: &Gid, qpn: u32) -> Result<()>;
    /// Detaches QP `qpn` from the multicast group `gid`.
    fn mcast_leave(&self, gid: &Gid, qpn: u32);
    /// A snapshot of the device's packet counters.
    fn counters(&self) -> DeviceCounters;
    /// Stops (`true`) or resumes taking packets from the device's inbound same-host lanes,
    /// as a receiver that falls behind would, for tests of flow control.
    fn pause_lanes(&self, paused: bool);
    /// Injects faults with `cfg` into what the device sends (`None`: none).
    fn set_faults(&self, cfg: Option<FaultConfig>);
    /// Runs `f` on the device's connection manager, sends what it wants sent, then
    /// dispatches its events (see `with_cm` on `dyn Provider` for a result).
    fn with_cm_dyn(&self, f: &mut dyn FnMut(&mut Gsi, Instant));
    /// The counters and bounds of the device's connection manager (QP 1).
    fn cm_stats(&self) -> crate::GsiStats;
    /// Listens for the service `sid`; fails with `EADDRINUSE` when another process sharing
    /// the device listens on it.
    fn cm_listen(&self, sid: u64) -> Result<bool>;
    /// Stops listening for the service `sid`.
    fn cm_unlisten(&self, sid: u64);
}

impl dyn Provider {
    /// Runs `f` on the device's connection manager and returns its result, then sends what
    /// the CM wants sent and dispatches its events ([`Provider::with_cm_dyn`]).
    pub(crate) fn with_cm<R>(&self, f: impl FnOnce(&mut Gsi, Instant) -> R) -> R {
        let mut f = Some(f);
        let mut r = None;
        self.with_cm_dyn(&mut |g, now| {
            if let Some(f) = f.take() {
                r = Some(f(g, now));
            }
        });
        match r {
            Some(r) => r,
            None => unreachable!("with_cm_dyn runs its closure once"),
        }
    }
}

/// The entry points of the connection-manager layer above the provider ([`crate::rdma_cm`]),
/// which registers them with [`set_cm_hook`] before it holds any id: the provider calls up
/// only through them, never by name.
pub(crate) struct CmHook {
    /// Takes an event of a device's CM (called with no lock held); gives it back when no id
    /// of that layer is behind it.
    pub(crate) dispatch: fn(&Arc<dyn Provider>, CmEvent) -> Option<CmEvent>,
    /// A device engine has started (its wildcard listeners may listen on it).
    pub(crate) engine_started: fn(&Arc<dyn Provider>),
}

static CM_HOOK: OnceLock<CmHook> = OnceLock::new();

/// The connection-manager layer's entry points, once it registered them.
pub(super) fn cm_hook() -> Option<&'static CmHook> {
    CM_HOOK.get()
}

/// Registers the connection-manager layer's entry points (the first registration stays).
pub(crate) fn set_cm_hook(hook: CmHook) {
    let _ = CM_HOOK.set(hook);
}
