//! Bounded waits: the blocking calls of a synchronous id with a timeout
//! (`rdma_get_request`, `rdma_connect`, `rdma_get_send_comp`, `rdma_get_recv_comp`).
//!
//! Each fails with `ETIMEDOUT` when its time is up and loses nothing: what arrives after the
//! timeout (a connection request, the outcome of a connect, a completion) is there for the
//! next call that looks for it. The channel-level waits are
//! [`super::EventChannel::get_cm_event_timeout`] and
//! [`crate::CompChannel::get_cq_event_timeout`].

use super::{CmId, ConnParam};
use crate::error::Result;
use crate::WorkCompletion;
use std::time::{Duration, Instant};

impl CmId {
    /// [`CmId::get_request`], waiting `timeout` at most for a connection request.
    ///
    /// Fails with `ETIMEDOUT` when none came in time (a request that comes later is taken
    /// by the next call), otherwise like [`CmId::get_request`].
    ///
    /// ```
    /// use softrdma::rdma_cm::{CmId, PortSpace};
    /// use std::time::Duration;
    /// # let ip = softrdma::testing::unique_loopback_addr();
    /// let listener = CmId::create(None, 0, PortSpace::Tcp).unwrap();
    /// listener.bind_addr((ip, 0).into()).unwrap();
    /// listener.listen(1).unwrap();
    /// let err = listener.get_request_timeout(Duration::from_millis(10)).unwrap_err();
    /// assert_eq!(err.errno(), libc::ETIMEDOUT);
    /// # listener.destroy();
    /// ```
    pub fn get_request_timeout(&self, timeout: Duration) -> Result<CmId> {
        self.get_request_until(Some(Instant::now() + timeout))
    }

    /// [`CmId::connect`], waiting `timeout` at most for the outcome on a synchronous id (an
    /// id with a channel returns at once, as `connect` does).
    ///
    /// Fails with `ETIMEDOUT` when no outcome came in time. The attempt is not cancelled:
    /// the CM goes on retrying its REQ, and the outcome (ESTABLISHED, REJECTED,
    /// UNREACHABLE) arrives later on the id's channel ([`CmId::channel`], e.g.
    /// [`super::EventChannel::get_cm_event_timeout`]); destroy the id to give up.
    /// Otherwise fails like [`CmId::connect`].
    pub fn connect_timeout(&self, param: &ConnParam, timeout: Duration) -> Result<()> {
        self.connect_until(param, Some(Instant::now() + timeout))
    }

    /// [`CmId::get_send_comp`], waiting `timeout` at most.
    ///
    /// Fails with `ETIMEDOUT` when no send completion came in time (one that comes later is
    /// returned by the next call), otherwise like [`CmId::get_send_comp`].
    pub fn get_send_comp_timeout(&self, timeout: Duration) -> Result<WorkCompletion> {
        self.get_comp_until(true, Some(Instant::now() + timeout))
    }

    /// [`CmId::get_recv_comp`], waiting `timeout` at most.
    ///
    /// Fails like [`CmId::get_send_comp_timeout`].
    pub fn get_recv_comp_timeout(&self, timeout: Duration) -> Result<WorkCompletion> {
        self.get_comp_until(false, Some(Instant::now() + timeout))
    }
}
