//! softrdma: RDMA verbs (the programming model of libibverbs) and the connection manager
//! (librdmacm, in [`rdma_cm`]), over a software RDMA device that speaks RoCEv2 on ordinary UDP
//! sockets in userspace — no RDMA NIC, no kernel module, no root.
//!
//! | librdmacm | softrdma |
//! |---|---|
//! | `rdma_create_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event` | [`rdma_cm::EventChannel`], [`rdma_cm::CmEvent::ack`] |
//! | `rdma_create_id`, `rdma_create_ep`, `rdma_getaddrinfo` | [`rdma_cm::CmId::create`], [`rdma_cm::CmId::create_ep`], [`rdma_cm::getaddrinfo`] |
//! | `rdma_resolve_addr/route`, `rdma_listen`, `rdma_connect`, `rdma_accept` | [`rdma_cm::CmId`] methods of the same names |
//! | `rdma_create_qp`, `rdma_post_send`, `rdma_get_send_comp` | [`rdma_cm::CmId::create_qp`], [`rdma_cm::CmId::post_send`], [`rdma_cm::CmId::get_send_comp`] |
//! | `rdma_join_multicast`, `rdma_leave_multicast` | [`rdma_cm::CmId::join_multicast`], [`rdma_cm::CmId::leave_multicast`] |
//!
//! With the feature `tokio`, the module `tokio` is the async face: connect, accept,
//! completions and work requests as futures (`AsyncConn::connect(addr).await`,
//! `listener.accept().await`, `qp.send(&mr, range).await`), on tokio's `AsyncFd` over the
//! channels' descriptors. Without it, the blocking waits have `_timeout` variants
//! ([`rdma_cm::CmId::get_request_timeout`], [`rdma_cm::CmId::connect_timeout`],
//! [`rdma_cm::CmId::get_send_comp_timeout`], [`rdma_cm::EventChannel::get_cm_event_timeout`],
//! [`CompChannel::get_cq_event_timeout`]) that fail with `ETIMEDOUT` and lose nothing.
//!
//! # The objects
//! Names follow the man pages, so a reader who knows rdma-core is at home:
//!
//! | verbs | softrdma |
//! |---|---|
//! | `ibv_get_device_list`, `ibv_open_device` | [`get_device_list`], [`Device::open`] → [`Context`] |
//! | `ibv_query_device/port/gid/pkey` | [`Context::query_device`], [`Context::query_port`], [`Context::query_gid`], [`Context::query_pkey`] |
//! | `ibv_alloc_pd` / `ibv_dealloc_pd` | [`Context::alloc_pd`] / [`Pd::dealloc`] |
//! | `ibv_reg_mr` / `ibv_dereg_mr` | [`Pd::reg_mr`] (unsafe, raw memory), [`Pd::reg_buffer`] (safe) / [`Mr::dereg`] |
//! | `ibv_alloc_mw` / `ibv_bind_mw` / `ibv_dealloc_mw` | [`Pd::alloc_mw`] / [`Qp::bind_mw`] (type 1), [`WrOpcode::BindMw`] (type 2) / [`Mw::dealloc`] |
//! | `ibv_create_comp_channel`, `ibv_get_cq_event` | [`Context::create_comp_channel`], [`CompChannel::get_cq_event`] |
//! | `ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq` | [`Context::create_cq`], [`Cq::poll`], [`Cq::req_notify_cq`] |
//! | `ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send` | [`Pd::create_qp`], [`Qp::modify_qp`], [`Qp::post_send`] |
//! | `ibv_create_srq`, `ibv_post_srq_recv` | [`Pd::create_srq`], [`Srq::post_srq_recv`] |
//! | `ibv_create_ah` | [`Pd::create_ah`] |
//! | `ibv_get_async_event` | [`Context::get_async_event`] |
//!
//! # Typed memory
//! Next to the faithful `(u64 addr, len, lkey)` face, work requests can name memory with
//! types that cannot be swapped or overrun silently: [`Mr::slice`] gives an [`MrSlice`] (a
//! checked range of a local region), [`Mr::remote`] a [`RemoteMr`] (address, length, rkey;
//! 20 bytes with [`RemoteMr::to_bytes`], for private data; checked sub-ranges with
//! [`RemoteMr::slice`]). [`SendWr::write`], [`SendWr::read`], [`SendWr::fetch_add`], ...
//! and [`rdma_cm::CmId::write`], [`rdma_cm::CmId::read`], [`rdma_cm::CmId::send`], ... are
//! built on them and post through the same path as the faithful calls. Completions are
//! `#[must_use]`; [`WorkCompletion::ok`] turns a failed one into an [`Error`] carrying its
//! status. The [`rdma_cm`] module documentation connects two ids and RDMA-writes with them,
//! end to end.
//!
//! # Errors
//! Every failure is an [`Error`] whose [`Error::errno`] is the errno rdma-core would set
//! (`EINVAL`, `EBUSY`, `ENOMEM`, `EOPNOTSUPP`, …), with a sentence saying what was wrong.
//! Destroy calls that fail hand the object back in a [`DestroyError`].
//!
//! # Two faces, one memory model
//! The faithful face names memory as verbs does — `u64` addresses, lkeys and rkeys, `wr_id`s
//! — and is still memory-safe, because the device checks every address of every access
//! against the registered memory regions (key, PD, bounds, access flags) in one place before
//! it touches a byte. Registering raw memory is the one `unsafe` step ([`Pd::reg_mr`]), with
//! the contract of `ibv_reg_mr`. The safe face registers a [`Buffer`], which the region keeps
//! alive, so no safe program can make the device touch freed memory. Memory the device may
//! write while the program runs is never borrowed as a Rust slice; see [`mem`] for how that
//! avoids undefined behaviour.
//!
//! ```
//! use softrdma::{Device, Buffer, AccessFlags, QpType, QpInitAttr, QpCap};
//! use std::sync::Arc;
//! // Any local address is a device; this one is a loopback address no other run on this
//! // machine uses (see `softrdma::testing`).
//! let addr = softrdma::testing::unique_loopback_addr().into();
//! let dev = Device::from_addr(addr).unwrap();
//! let ctx = dev.open().unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let buf = Arc::new(Buffer::new(4096));
//! let mr = pd.reg_buffer(&buf, (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).bits()).unwrap();
//! let cq = ctx.create_cq(16, 0, None, 0).unwrap();
//! let mut init = QpInitAttr::new(QpType::Rc, &cq, QpCap { max_send_wr: 10, max_recv_wr: 10, ..Default::default() });
//! let qp = pd.create_qp(&mut init).unwrap();
//! assert!(init.cap.max_send_wr >= 10);
//! assert_ne!(mr.lkey(), mr.rkey());
//! # drop((qp, mr));
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod gid;
pub mod log;
mod provider;
pub mod rdma_cm;
pub mod testing;
#[cfg(feature = "tokio")]
pub mod tokio;
mod verbs;

pub use error::{DestroyError, Error, ErrorKind, Result};
pub use gid::{Gid, GidType};
pub use provider::capture::{start_capture, stop_capture};
pub use provider::gsi::GsiStats;
pub use provider::{same_host_lanes, DeviceCounters, FaultConfig, PROBE_INTERVAL};
/// The transport counters of one QP, as [`Qp::counters`] returns them (the sans-IO
/// transport's `QpStats`: every field only grows).
pub use softrdma_proto::transport::QpStats as QpCounters;
pub use softrdma_proto::{Mtu, QpAttrMask, QpState, QpType};
pub use verbs::ah::{Ah, AhAttr, GlobalRoute};
pub use verbs::context::{Context, NUM_COMP_VECTORS};
pub use verbs::copy::{copy_engines, CopyEngineStats};
pub use verbs::cq::{CompChannel, Cq, CqEvent, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use verbs::device::{
    get_device_list, AtomicCap, Device, DeviceAttr, DeviceCapFlags, GidEntry, LinkLayer, NodeType,
    OdpCaps, OdpGeneralCaps, OdpTransportCaps, PortAttr, PortCapFlags, PortState, TransportType,
    DEFAULT_PKEY, GID_TABLE_LEN, PORT_NUM, QPF_GRH_REQUIRED,
};
pub use verbs::event::{AsyncElement, AsyncEvent, EventType};
pub use verbs::mem;
pub use verbs::mem::{Buffer, BufferView};
pub use verbs::mr::{AccessFlags, AdviseMr, Mr, MrSlice, RemoteMr, ADVISE_MR_FLAG_FLUSH};
pub use verbs::mw::{inc_rkey, BindMwWr, Mw, MwBind, MwBindInfo, MwType};
pub use verbs::pd::Pd;
pub use verbs::qp::{MigState, Qp, QpAttr, QpCap, QpInitAttr, QpInitInfo};
pub use verbs::requests::{RecvWr, SendWr};
pub use verbs::srq::{Srq, SrqAttr, SrqAttrMask, SrqInitAttr};
pub use verbs::wr::{PostError, SendFlags, Sge, WrOpcode};
