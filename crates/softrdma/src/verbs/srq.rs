//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq`, `ibv_post_srq_recv`).

use crate::error::{DestroyError, Error, Result};
use crate::verbs::event::EventTarget;
use crate::verbs::hold::{users_of, Counted, Hold};
use crate::verbs::pd::{Pd, PdInner};
use crate::verbs::requests::{recv_wqe, RecvWqe, RecvWr};
use crate::verbs::resources::{CountGuard, Kind, Resources};
use crate::verbs::wr::{check_sges, PostError};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

/// `struct ibv_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Most outstanding receive requests.
    pub max_wr: u32,
    /// Most scatter/gather entries per receive request.
    pub max_sge: u32,
    /// When fewer than this many receive requests remain, raise
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` once (0: disarmed).
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`: what [`Pd::create_srq`] takes; the caps are written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInitAttr {
    /// Context value reported with the SRQ's asynchronous events.
    pub srq_context: u64,
    /// Requested sizes (`srq_limit` is ignored at creation).
    pub attr: SrqAttr,
}

bitflags::bitflags! {
    /// `enum ibv_srq_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize the queue.
        const MAX_WR = 1 << 0;
        /// `IBV_SRQ_LIMIT`: arm the limit event.
        const LIMIT = 1 << 1;
    }
}

/// A shared receive queue (`struct ibv_srq`).
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

pub(crate) struct SrqState {
    pub(crate) attr: SrqAttr,
    pub(crate) queue: VecDeque<RecvWqe>,
}

pub(crate) struct SrqInner {
    pub(crate) pd: Hold<PdInner>,
    pub(crate) srq_context: u64,
    pub(crate) state: Mutex<SrqState>,
    users: AtomicUsize,
    async_unacked: AtomicUsize,
    _count: CountGuard,
}

impl Counted for SrqInner {
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

impl EventTarget for SrqInner {
    fn unacked_events(&self) -> &AtomicUsize {
        &self.async_unacked
    }
}

impl Pd {
    /// Creates a shared receive queue (`ibv_create_srq`), writing the actual sizes back into
    /// `init_attr.attr` (at least what was asked).
    ///
    /// Fails with `EINVAL` when `max_wr` is 0 or above the device's `max_srq_wr`, or
    /// `max_sge` above `max_srq_sge`; `ENOMEM` past `max_srq`.
    pub fn create_srq(&self, init_attr: &mut SrqInitAttr) -> Result<Srq> {
        let dev = &self.inner.shared().attr;
        let a = &init_attr.attr;
        if a.max_wr == 0 || a.max_wr > dev.max_srq_wr {
            return Err(Error::invalid(format!(
                "max_wr {} is outside 1..={} (max_srq_wr)",
                a.max_wr, dev.max_srq_wr
            )));
        }
        if a.max_sge > dev.max_srq_sge {
            return Err(Error::invalid(format!(
                "max_sge {} exceeds max_srq_sge {}",
                a.max_sge, dev.max_srq_sge
            )));
        }
        let count = Resources::acquire(self.inner.shared(), Kind::Srq)?;
        let actual = SrqAttr {
            max_wr: a.max_wr.next_power_of_two().min(dev.max_srq_wr),
            max_sge: a.max_sge.max(1),
            srq_limit: 0,
        };
        init_attr.attr = actual;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: Hold::new(&self.inner),
                srq_context: init_attr.srq_context,
                state: Mutex::new(SrqState {
                    attr: actual,
                    queue: VecDeque::new(),
                }),
                users: AtomicUsize::new(0),
                async_unacked: AtomicUsize::new(0),
                _count: count,
            }),
        })
    }
}

impl Srq {
    /// Changes the SRQ (`ibv_modify_srq`): with MAX_WR, resizes it (never below the receive
    /// requests it holds); with LIMIT, arms the limit event. All or nothing: on failure
    /// nothing changes.
    ///
    /// Fails with `EINVAL` for an empty or unknown mask, a `max_wr` of 0, above `max_srq_wr`
    /// or below the number of outstanding receive requests, or a limit above `max_wr`.
    pub fn modify_srq(&self, attr: &SrqAttr, mask: u32) -> Result<()> {
        let Some(mask) = SrqAttrMask::from_bits(mask) else {
            return Err(Error::invalid(format!(
                "unknown SRQ attribute mask bits in {mask:#x}"
            )));
        };
        if mask.is_empty() {
            return Err(Error::invalid("the SRQ attribute mask is empty"));
        }
        let dev_max = self.inner.pd.shared().attr.max_srq_wr;
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut new = st.attr;
        if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > dev_max {
                return Err(Error::invalid(format!(
                    "max_wr {} is outside 1..={dev_max}",
                    attr.max_wr
                )));
            }
            if (attr.max_wr as usize) < st.queue.len() {
                return Err(Error::invalid(format!(
                    "max_wr {} is below the {} receive requests the SRQ holds",
                    attr.max_wr,
                    st.queue.len()
                )));
            }
            new.max_wr = attr.max_wr.next_power_of_two().min(dev_max);
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            if attr.srq_limit > new.max_wr {
                return Err(Error::invalid(format!(
                    "srq_limit {} exceeds max_wr {}",
                    attr.srq_limit, new.max_wr
                )));
            }
            new.srq_limit = attr.srq_limit;
        }
        st.attr = new;
        Ok(())
    }

    /// The SRQ's current attributes (`ibv_query_srq`); `srq_limit` is 0 once the limit event
    /// has fired.
    pub fn query_srq(&self) -> Result<SrqAttr> {
        Ok(self
            .inner
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attr)
    }

    /// Posts receive requests to the SRQ (`ibv_post_srq_recv`), in order, stopping at the
    /// first that cannot be posted.
    ///
    /// Fails (naming the index of that request) with `EINVAL` when it has more than
    /// `max_sge` entries and `ENOMEM` when the SRQ is full.
    pub fn post_srq_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { bad_wr: i, error };
            check_sges(wr.sg_list, st.attr.max_sge, "max_sge").map_err(fail)?;
            if st.queue.len() >= st.attr.max_wr as usize {
                return Err(fail(Error::no_memory(format!(
                    "the SRQ is full ({} receive requests)",
                    st.attr.max_wr
                ))));
            }
            st.queue.push_back(recv_wqe(wr));
        }
        Ok(())
    }

    /// The `srq_context` given at creation.
    pub fn srq_context(&self) -> u64 {
        self.inner.srq_context
    }

    /// Destroys the SRQ (`ibv_destroy_srq`); receive requests still in it are dropped.
    ///
    /// Fails with `EBUSY`, giving the SRQ back, while a QP uses it or an asynchronous event
    /// about it is not acknowledged.
    pub fn destroy(self) -> std::result::Result<(), DestroyError<Srq>> {
        let n = users_of(&*self.inner);
        let ev = self
            .inner
            .async_unacked
            .load(std::sync::atomic::Ordering::Acquire);
        let why = if n != 0 {
            format!("the SRQ is used by {n} QP(s)")
        } else if ev != 0 {
            format!("{ev} asynchronous event(s) about the SRQ are not acknowledged")
        } else {
            self.inner
                .pd
                .ctx
                .async_events
                .discard(&self.inner.async_unacked);
            return Ok(());
        };
        Err(DestroyError {
            object: self,
            error: Error::busy(why),
        })
    }
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("srq_context", &self.inner.srq_context)
            .finish_non_exhaustive()
    }
}
