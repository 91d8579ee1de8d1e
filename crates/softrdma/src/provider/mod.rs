//! The device engine: the UDP socket of a device, its progress thread, and the glue between
//! the sans-IO transport of each QP ([`softrdma_proto::transport::Qp`]) and the verbs objects.
//!
//! # Progress
//! Sends are transmitted by the thread that posts them: `post_send` runs the transport and
//! hands the packets to `sendmmsg` before it returns, with no thread hop. Everything that
//! arrives — ACKs, requests from peers, one-sided RDMA WRITE/READ/atomics that the target
//! program never polls for — and every timer is handled by one progress thread per device,
//! which waits in `poll(2)` on the socket and a wake-up eventfd, receives in batches with
//! `recvmmsg`, and answers in batches with `sendmmsg`. A device with UD QPs attached to
//! multicast groups also has one socket per group, which the progress thread polls too (see
//! the `mcast` submodule); without groups that path costs one atomic load.
//!
//! An application thread that polls a CQ and finds it empty receives what is waiting on the
//! device socket itself (`Engine::poll_progress`), so a busy-polling program gets its
//! completions with no thread hop. While such polls of unarmed CQs go on, the progress
//! thread leaves the socket to them: it stops watching the socket for `POLL_HANDOFF` at a
//! time, as long as there were polls in the last period, and leaves the device's timers to
//! them as well (they look every few polls whether one is due; a timer set meanwhile does not
//! wake the progress thread). Otherwise both threads would be woken by every packet and by
//! every deadline moved earlier, and, on a machine with few cores, the progress thread would
//! preempt the very pollers it races (that doubled the one-way latency of a ping-pong; the
//! timer wake-ups, several thousand a second for a busy QP's tail-loss probe, cut an 8-byte
//! SEND stream's rate by a third). Should the pollers stop, a timer waits at most until the
//! end of the hand-off. Arming a CQ for an event
//! ([`crate::Cq::req_notify_cq`]), which a program does before it sleeps on a completion
//! channel, gives the socket back at once, and polls of an armed CQ (the last look before
//! sleeping) do not count; a program that stops polling without arming a CQ gets it back
//! within two periods. The positive ACK of a request taken for a program that polls (by its
//! own poll, or by the progress thread while it does not poll) waits for the program's
//! answer on the QP and goes right behind it, or else goes once the program has not polled
//! for `SOFTRDMA_ACK_HOLD_US` (see `progress::AckHold`): a peer that takes its WRITE's
//! completion and then spins on memory for the answer must not get the ACK first.
//!
//! # ICRC
//! Every packet sent carries the ICRC computed over the IP and UDP headers the kernel will
//! put in front of it (IPv4: identification 0 and DF, which `IP_PMTUDISC_DO` guarantees; the
//! `k`-th datagram of a UDP GSO message toward another host, which the kernel numbers `k`,
//! the ICRC for `k`: see `sock::batch`).
//! Every packet received is verified against the headers it must have had: for IPv6 that is
//! exact; for IPv4 the Identification field cannot be read from a UDP socket, so the check
//! assumes 0 — which is what every softrdma peer, and any sender using the same socket
//! recipe, sends, and then the full 32-bit check applies. Other stacks (the Linux kernel's
//! rxe, for one) give their packets varying identifications; for an IPv4 packet that fails
//! the check with identification 0, the receiver solves for the identification that makes
//! the ICRC match ([`softrdma_wire::icrc::ident`]) and accepts the packet if there is one,
//! counting it in `icrc_ident_solved`. Such packets get a 16-bit check: a corrupted packet
//! passes it with probability about 2^-16 (the wire crate documents the details). So a sender
//! whose first packets all verify with identification 0 (64 of them, none solved beyond the
//! numbers of a GSO message: a softrdma peer) gets its packets accepted from then on only
//! with identification 0 or a solved one below 64 (`flows::GSO_IDENTS`): a corrupted packet
//! of a softrdma peer passes with probability about 2^-26. Packets that fail are counted
//! (`icrc_errors`) and dropped.
//!
//! An RC or UC request's payload piece of 1 KiB or more that goes on the wire is not copied
//! into its packet: the transmit batch leases the region, computes the ICRC over the
//! program's memory in place ([`memory::crc32_of_memory`]) and the kernel reads the bytes from
//! there through an iovec (see [`tx::TxBatch`]).

//! # Files
//! The provider's files import only downward, in this order (xtask's `layers` checks it):
//! `devices` (the engines of this process, started on first use) over `progress` (the
//! progress thread, polls from application threads) over `engine` (the `Engine`: the QPs,
//! their timers, held ACKs, the CM hook) over `gsi` (QP 1) over `mcast` (multicast groups)
//! over `rx` (receiving, ICRC checks) over `tx` (transmit batches and the [`tx::Wire`]: the
//! socket, counters and faults every part sends through) over `faults` and `counters`, over
//! `sock`, `fd`, `share`, `capture` and `memory` (reads and writes of registered memory, which
//! the verbs' `mem` builds on). The engine composes the parts the lower files own;
//! they reach it only through [`rx::RxSink`], which it implements.

pub(crate) mod capture;
mod counters;
mod devices;
mod engine;
mod faults;
pub(crate) mod fd;
pub(crate) mod gsi;
mod keymap;
mod lanes;
mod mcast;
pub(crate) mod memory;
mod port;
mod progress;
mod rx;
pub(crate) mod scm;
pub(crate) mod share;
pub(crate) mod sock;
pub(crate) mod steer;
mod tx;
pub(crate) mod unix_names;

pub use counters::{DeviceCounters, PROBE_INTERVAL};
pub(crate) use devices::{
    all_open, default_queues, if_open, open, open_queue, release_held_acks, wait_receiving,
    MAX_QUEUES,
};
pub use faults::FaultConfig;
pub(crate) use fd::spawn_quiet;
pub(crate) use lanes::pair::{PairRx, PairTx};
pub(crate) use lanes::records as wr_records;
pub use lanes::same_host_lanes;
pub(crate) use lanes::{same_host_segment, WR_RECORD};
pub(crate) use port::{set_cm_hook, CmHook, Provider, QpPort};
pub(crate) use progress::{holding_acks, receiving_for_poller};
pub(crate) use rx::{Delivery, Via, MULTICAST_QPN};
pub(crate) use tx::{with_tx, DirectTx, PacketGaps, TxBatch, PKT_BUF};
