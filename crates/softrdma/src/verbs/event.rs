//! Asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`): the events, what
//! they are about, and the queue behind a context's `async_fd` (read through
//! `Context::get_async_event`).

use crate::error::Result;
use crate::provider::fd::EventFd;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// `enum ibv_event_type`, with the verbs numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventType {
    /// `IBV_EVENT_CQ_ERR`: the CQ overran; it can no longer be used.
    CqErr = 0,
    /// `IBV_EVENT_QP_FATAL`: a QP error that is not one of the two below.
    QpFatal = 1,
    /// `IBV_EVENT_QP_REQ_ERR`: an invalid request arrived on the QP.
    QpReqErr = 2,
    /// `IBV_EVENT_QP_ACCESS_ERR`: a remote access violation on the QP.
    QpAccessErr = 3,
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a QP in RTR.
    CommEst = 4,
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD has drained.
    SqDrained = 5,
    /// `IBV_EVENT_PATH_MIG`.
    PathMig = 6,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigErr = 7,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is gone.
    DeviceFatal = 8,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive = 9,
    /// `IBV_EVENT_PORT_ERR`.
    PortErr = 10,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange = 11,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange = 12,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange = 13,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr = 14,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer receive requests than the armed limit remain.
    SrqLimitReached = 15,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR and will take no
    /// more receive requests from it.
    QpLastWqeReached = 16,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister = 17,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange = 18,
    /// `IBV_EVENT_WQ_FATAL`.
    WqFatal = 19,
}

impl EventType {
    /// A short description (`ibv_event_type_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::CqErr => "CQ error",
            EventType::QpFatal => "local work queue catastrophic error",
            EventType::QpReqErr => "invalid request local work queue error",
            EventType::QpAccessErr => "local access violation work queue error",
            EventType::CommEst => "communication established",
            EventType::SqDrained => "send queue drained",
            EventType::PathMig => "path migrated",
            EventType::PathMigErr => "path migration request error",
            EventType::DeviceFatal => "local catastrophic error",
            EventType::PortActive => "port active",
            EventType::PortErr => "port error",
            EventType::LidChange => "LID change",
            EventType::PkeyChange => "P_Key change",
            EventType::SmChange => "SM change",
            EventType::SrqErr => "SRQ catastrophic error",
            EventType::SrqLimitReached => "SRQ limit reached",
            EventType::QpLastWqeReached => "last WQE reached",
            EventType::ClientReregister => "client reregistration",
            EventType::GidChange => "GID table change",
            EventType::WqFatal => "WQ fatal",
        }
    }
}

/// An object that counts the asynchronous events reported about it and not yet acknowledged;
/// it cannot be destroyed while that count is not zero.
pub(crate) trait EventTarget: Send + Sync {
    fn unacked_events(&self) -> &AtomicUsize;
}

/// What an asynchronous event is about (the `element` union of `struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number and the `qp_context` it was created with.
    Qp {
        /// The QP number.
        qp_num: u32,
        /// The QP's context value.
        qp_context: u64,
    },
    /// A CQ, by the `cq_context` it was created with.
    Cq {
        /// The CQ's context value.
        cq_context: u64,
    },
    /// An SRQ, by the `srq_context` it was created with.
    Srq {
        /// The SRQ's context value.
        srq_context: u64,
    },
    /// A port, by number.
    Port(u8),
    /// The device as a whole.
    Device,
}

/// An asynchronous event (`struct ibv_async_event`) from [`crate::Context::get_async_event`].
///
/// Every event must be acknowledged ([`AsyncEvent::ack`], `ibv_ack_async_event`) before the
/// QP, CQ or SRQ it is about can be destroyed; dropping the event acknowledges it too. Events
/// nobody has read hold nothing: destroying the object discards them, as in rdma-core.
pub struct AsyncEvent {
    event_type: EventType,
    element: AsyncElement,
    target: Option<Arc<dyn EventTarget>>,
    /// Whether [`crate::Context::get_async_event`] handed it out (only then does it count against
    /// its object until acknowledged).
    reported: bool,
}

impl AsyncEvent {
    /// The event's type.
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// What the event is about.
    pub fn element(&self) -> AsyncElement {
        self.element
    }

    /// Acknowledges the event (`ibv_ack_async_event`).
    pub fn ack(self) {}
}

impl Drop for AsyncEvent {
    fn drop(&mut self) {
        if let Some(t) = self.target.take() {
            if self.reported {
                t.unacked_events().fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl std::fmt::Debug for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEvent")
            .field("event_type", &self.event_type)
            .field("element", &self.element)
            .finish()
    }
}

/// The queue behind a context's `async_fd`.
pub(crate) struct AsyncQueue {
    fd: EventFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncQueue {
    pub(crate) fn new() -> Result<Self> {
        Ok(AsyncQueue {
            fd: EventFd::new()?,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    pub(crate) fn fd(&self) -> &EventFd {
        &self.fd
    }

    /// Queues an event about `element`. Once the program has read it, `target` (the QP, CQ
    /// or SRQ) counts it as unacknowledged until the program acknowledges it; an event
    /// nobody read holds nothing, and is discarded when its object is destroyed
    /// ([`AsyncQueue::discard`]), as the kernel's uverbs counts only the events it reported.
    pub(crate) fn raise(
        &self,
        event_type: EventType,
        element: AsyncElement,
        target: Option<Arc<dyn EventTarget>>,
    ) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(AsyncEvent {
                event_type,
                element,
                target,
                reported: false,
            });
        self.fd.signal();
        tracing::debug!(?event_type, ?element, "asynchronous event");
    }

    /// Takes the next event, blocking until one is queued (or failing with `EAGAIN` when
    /// the descriptor is non-blocking), and counts it against its object from now on.
    pub(crate) fn pop(&self) -> Result<AsyncEvent> {
        loop {
            self.fd.wait()?;
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(mut ev) = q.pop_front() {
                if let Some(t) = &ev.target {
                    t.unacked_events().fetch_add(1, Ordering::AcqRel);
                }
                ev.reported = true;
                return Ok(ev);
            }
        }
    }

    /// Drops the unread events about the object whose event counter is `counter` (it is
    /// being destroyed).
    pub(crate) fn discard(&self, counter: &AtomicUsize) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let (gone, kept): (VecDeque<_>, VecDeque<_>) = q.drain(..).partition(|e| {
            e.target
                .as_ref()
                .is_some_and(|t| std::ptr::eq(t.unacked_events(), counter))
        });
        *q = kept;
        drop(q);
        for _ in &gone {
            self.fd.try_wait();
        }
        // (The events, and their references to the object, go once the queue is unlocked.)
        drop(gone);
    }
}
