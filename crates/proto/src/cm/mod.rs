//! The InfiniBand communication manager (IB CM) of one device, sans IO: the connection
//! set-up and tear-down Linux's `drivers/infiniband/core/cm.c` performs for rdma_cm, with
//! the MADs a Linux rxe peer sends and accepts over RoCEv2.
//!
//! # Model
//!
//! [`Cm`] owns no socket, thread or clock, and draws no OS randomness. It is driven by:
//! * received MADs ([`Cm::handle_mad`], with the source IP of the packet),
//! * API calls ([`Cm::connect`], [`Cm::accept`], [`Cm::disconnect`], …),
//! * the current time, passed as `now` to every call that may arm a timer, and
//!   [`Cm::handle_timeout`] when [`Cm::poll_timeout`] says so;
//!
//! and produces MADs to send ([`Cm::poll_transmit`]: destination IP + 256 bytes, to be sent
//! as a UD SEND from QP1 to QP1 with Q_Key 0x80010000; or [`Cm::poll_transmit_into`], which
//! writes them into the caller's buffer as the transport's `Qp::poll_transmit` does) and
//! events ([`Cm::poll_event`]).
//! Communication IDs and the TID high word come from a splitmix64 generator seeded by
//! [`CmConfig::seed`], so the same inputs give the same outputs, byte for byte.
//!
//! A communication is named by its local communication ID ([`ConnId`]). The owner (the
//! rdma_cm layer) maps it to its `rdma_cm_id`, prepends the `cma_hdr` to REQ/SIDR_REQ private
//! data, and drives the QP through INIT/RTR/RTS with the values in [`ReqInfo`]/[`RepInfo`].
//!
//! ```text
//! active                               passive
//! connect ──REQ──────────────────────▶ ReqReceived (listen'd service ID)
//!                                      accept (QP → RTR, RTS first)
//! RepReceived ◀──────────────────REP── (retransmitted until RTU)
//! send_rtu (QP → RTR, RTS first)
//!         ──RTU──────────────────────▶ Established
//! disconnect ──DREQ──────────────────▶ DisconnectRequested (DREP sent by the CM)
//! Disconnected ◀────────────────DREP── … both: timewait → TimewaitExit
//! ```
//!
//! # Wire behaviour (as Linux cm.c)
//!
//! * **TIDs**: requests (REQ, DREQ, SIDR_REQ) carry `hi << 32 | bswap32(local comm ID)`,
//!   Linux's `cm_form_tid` on a little-endian host (so a DREQ reuses the REQ's TID on the
//!   active side, as in the golden capture); REP, REJ, MRA and RTU reuse the REQ's TID, DREP
//!   the DREQ's, SIDR_REP the SIDR_REQ's.
//! * **Comm IDs**: a keyed bijection of a cyclic counter: unique and non-zero, not guessable
//!   from earlier IDs without the seed, never reused while the record exists (timewait
//!   included).
//! * **Retransmission** of the identical MAD on timeout: a REQ every
//!   `2·ms(packet_lifetime) + ms(cm_response_timeout)` (ms(t) = `1 << max(t−8, 0)`; 6144 ms
//!   with rdma_cm's values), `max_cm_retries` times (so 1 + 15 REQs), then
//!   [`CmEvent::Unreachable`]; a REP every ms(the REQ's local CM response timeout), the
//!   REQ's max CM retries times, until the RTU or [`Cm::notify_established`], then
//!   `Unreachable`; a DREQ with the side's REQ/REP timeout until the DREP, then
//!   [`CmEvent::Disconnected`] anyway; a SIDR_REQ every ms(cm_response_timeout), then
//!   `Unreachable`. Retries exhausted send nothing (Linux resets the ID to idle); the REJ
//!   reason 4 seen in `rxe_cm_req_no_listener.pcap` is what [`Cm::destroy`] sends for a REQ
//!   still outstanding (rping gave up), and it is reproduced byte for byte.
//! * **MRA** received: the retransmission timer of our REQ/REP becomes
//!   `ms(service_timeout) + ms(path ACK timeout)` for the remaining tries.
//!   [`Cm::delay_reply`] arms an MRA that is only sent in answer to a duplicate REQ
//!   (rdma_cm's `IB_CM_MRA_FLAG_DELAY`).
//! * **Duplicates**: REQ while unanswered → ignored, or MRA if armed; REQ after REP → the
//!   REP again; REQ in timewait → REJ 10; REP after RTU → the RTU again; DREQ in timewait →
//!   DREP again; DREQ for an unknown communication → DREP (Linux does too); SIDR_REQ while
//!   unanswered → ignored; after the answer → the SIDR_REP again.
//! * **No listener**: REQ → REJ 8 (invalid service ID, local comm ID 0, message REQ);
//!   SIDR_REQ → SIDR_REP status 1.
//! * **Stale**: a new REQ (or REP) from a remote QPN + CA GUID that still has a
//!   communication here (connected or in timewait) → REJ 10, and the old connection, if
//!   established, is sent a DREQ.
//! * **Timewait**: after DREQ/DREP, a REJ of a connection, or destroy of a connected ID, for
//!   ms(path ACK timeout) (active: `cm_ack_timeout(target_ack_delay, packet_lifetime)`;
//!   passive: the REQ's local ACK timeout; 2048 ms with rdma_cm's values), then
//!   [`CmEvent::TimewaitExit`].
//! * **REQ fields** as rdma_cm sets them over RoCE: see [`Cm::connect`].
//!
//! # Deviations from Linux, on purpose
//!
//! * A duplicate REQ after our REP is answered with the REP at once (IBTA behaviour); Linux
//!   ignores it and relies on its REP retransmission timer. Harmless to a Linux peer, which
//!   ignores a duplicate REP before its RTU.
//! * Answered SIDR_REQs are remembered for the requester's retry window and a retransmitted
//!   request gets the same SIDR_REP; Linux forgets them and reports the request again.
//! * Linux drops the duplicate/stale lookup entries when a connection enters timewait; here
//!   they live until timewait ends, so a REQ from a QP still in timewait is stale (REJ 10),
//!   as the IBTA intends.
//! * Every MAD of an existing communication must come from the IP the communication talks
//!   to; others are dropped as unknown. Linux matches comm IDs only.
//! * Resources are bounded ([`CmConfig::max_connections`], [`CmConfig::max_pending_reqs`],
//!   [`TX_QUEUE_LIMIT`], [`EVENT_QUEUE_LIMIT`]): REQs beyond them get REJ 3 (no resources),
//!   SIDR_REQs are dropped; Linux allocates until memory runs out.
//! * RD and XRC REQs are refused with REJ 9; LAP/APR (alternate paths, unused on RoCE, and
//!   ignored by Linux on RoCE) and ClassPortInfo are dropped.
//! * ECE (vendor ID / attribute modifier) is always 0.

mod endpoint;
mod rng;
mod types;

#[cfg(test)]
mod tests;

pub use endpoint::{
    cm_ack_timeout, Cm, EVENT_QUEUE_LIMIT, REFUSED_RETRIES, REFUSED_RETRY_MS, TX_QUEUE_LIMIT,
};
pub use softrdma_wire::ip::ip_to_gid;
pub use types::{
    AcceptParams, CmConfig, CmError, CmEvent, CmStats, CmTransmit, ConnId, ConnectRequest,
    MsgCounts, RepInfo, ReqInfo, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING_REQS,
};
