//! `ibv_post_recv`: receive work requests onto the QP's own receive queue.

use super::Qp;
use crate::error::Error;
use crate::verbs::cq::WcOpcode;
use crate::verbs::datapath::{drive_and_send, take_parked};
use crate::verbs::requests::{recv_wqe, RecvWr};
use crate::verbs::wr::{check_sges, PostError};
use softrdma_proto::QpState;

impl Qp {
    /// Posts receive work requests (`ibv_post_recv`), in order, stopping at the first that
    /// cannot be posted. Allowed from INIT on; in ERR, requests are completed at once with
    /// `WR_FLUSH_ERR`.
    ///
    /// Fails, naming the index of that request, with `EINVAL` when the QP is in RESET or
    /// uses an SRQ (post to the SRQ instead), or a request has more than `max_recv_sge`
    /// entries; `ENOMEM` when the receive queue is full.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let inner = &self.inner;
        let mut st = inner.lock();
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { bad_wr: i, error };
            if inner.srq.is_some() {
                return Err(fail(Error::invalid(
                    "the QP takes its receives from an SRQ: use post_srq_recv",
                )));
            }
            let state = st.attr.qp_state;
            if state == QpState::Reset {
                return Err(fail(Error::invalid(
                    "cannot post receives to a QP in RESET",
                )));
            }
            check_sges(wr.sg_list, inner.cap.max_recv_sge, "max_recv_sge").map_err(fail)?;
            if state == QpState::Err {
                inner
                    .recv_cq
                    .arc()
                    .push(inner.flush_wc(wr.wr_id, WcOpcode::Recv), false);
                continue;
            }
            if st.rq.len() >= inner.cap.max_recv_wr as usize {
                return Err(fail(Error::no_memory(format!(
                    "the receive queue is full ({} requests)",
                    inner.cap.max_recv_wr
                ))));
            }
            st.rq.push_back(recv_wqe(wr));
        }
        // Packets a UC or UD QP kept while its queue was empty take these receives first.
        if !st.parked.is_empty() {
            if let Some(engine) = st.engine.clone() {
                let events = take_parked(&*engine, inner, &mut st);
                drop(st);
                for e in events {
                    inner.raise(e);
                }
                return Ok(());
            }
        }
        // An RC requester may be waiting for the credits these receives make: tell it.
        let available = st.rq.len() as u32;
        let update = st
            .transport
            .as_mut()
            .is_some_and(|t| t.recv_posted(available));
        if update {
            if let Some(engine) = st.engine.clone() {
                let events = drive_and_send(&*engine, inner, &mut st);
                drop(st);
                for e in events {
                    inner.raise(e);
                }
            }
        }
        Ok(())
    }
}
