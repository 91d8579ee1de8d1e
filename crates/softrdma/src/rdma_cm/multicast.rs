//! Multicast through the connection manager: `rdma_join_multicast`,
//! `rdma_join_multicast_ex` and `rdma_leave_multicast` on UDP/IPoIB ids. Over RoCE a group
//! is the IP multicast group itself; the device joins it when a QP is attached.

use super::connect::event_error;
use super::event::{CmEventType, ConnParam, UdParam};
use super::objects::{CmEvent, CmId, GroupCount, McGroup};
use super::registry::errno_err;
use super::{
    JoinMcAttrEx, MULTICAST_QPN, RDMA_CM_JOIN_MC_ATTR_ADDRESS, RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
    RDMA_CM_JOIN_MC_ATTR_RESERVED, RDMA_MC_JOIN_FLAG_FULLMEMBER, RDMA_MC_JOIN_FLAG_RESERVED,
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, RDMA_UDP_QKEY,
};
use crate::error::{Error, ErrorKind, Result};
use crate::{AhAttr, Gid, QpType};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl CmId {
    /// Joins the multicast group `addr` as a full member (`rdma_join_multicast`);
    /// MULTICAST_JOIN follows with the group's address vector, QPN 0xFFFFFF and Q_Key in
    /// [`CmEvent::ud`] and `context` in [`CmEvent::arg`]. The id's QP (if it has one by then)
    /// is attached to the group, so it receives what is sent to it.
    ///
    /// Fails like [`CmId::join_multicast_ex`].
    pub fn join_multicast(&self, addr: IpAddr, context: u64) -> Result<()> {
        self.join_multicast_ex(
            &JoinMcAttrEx {
                comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
                join_flags: RDMA_MC_JOIN_FLAG_FULLMEMBER,
                addr: Some(addr),
            },
            context,
        )
    }

    /// Joins a multicast group (`rdma_join_multicast_ex`): as
    /// [`CmId::join_multicast`], and a send-only member is not attached (it only sends to
    /// the group). Over RoCE the group is the IP multicast group itself: the device joins it
    /// on its interface.
    ///
    /// Fails with `ENOTSUP` for unknown `comp_mask` bits; `EINVAL` when the address or the
    /// flags are missing or unknown, the address is not a multicast address of the id's
    /// family, the id is not bound to a device, or its port space is not UDP/IPoIB;
    /// `EADDRINUSE` when the id already joined the group. An attach that fails arrives as
    /// MULTICAST_ERROR with its negative errno.
    pub fn join_multicast_ex(&self, attr: &JoinMcAttrEx, context: u64) -> Result<()> {
        if attr.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(errno_err(libc::ENOTSUP, "unknown comp_mask bits"));
        }
        let addr = match (attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS, attr.addr) {
            (0, _) | (_, None) => return Err(Error::invalid("no group address given")),
            (_, Some(a)) => a,
        };
        if attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0 {
            return Err(Error::invalid("no join flags given"));
        }
        if attr.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED {
            return Err(Error::invalid("unknown join flag"));
        }
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::invalid("multicast needs a UDP or IPoIB id"));
        }
        if !addr.is_multicast() {
            return Err(Error::invalid(format!("{addr} is not a multicast address")));
        }
        let send_only = attr.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        let mut s = self.inner.lock();
        let Some(src) = s.src.filter(|_| s.ctx.is_some()) else {
            return Err(Error::invalid("the id is not bound to a device"));
        };
        if src.is_ipv4() != addr.is_ipv4() {
            return Err(Error::invalid("the group's family differs from the id's"));
        }
        if s.mcast.iter().any(|g| g.addr == addr) {
            return Err(Error::new(
                ErrorKind::AddrInUse,
                format!("the id already joined {addr}"),
            ));
        }
        let gid = Gid::from_ip(addr);
        let count = Arc::new(GroupCount::default());
        let mut attached = None;
        let mut status = 0;
        if !send_only {
            if let Some(qp) = s.qp.clone() {
                match qp.attach_mcast(&gid, 0) {
                    Ok(()) => attached = Some(qp),
                    Err(e) => status = -e.errno(),
                }
            }
        }
        s.mcast.push(McGroup {
            addr,
            gid,
            send_only,
            attached,
            count: count.clone(),
        });
        drop(s);
        let (event, ud) = if status == 0 {
            let mut ah = AhAttr::for_ip(addr);
            ah.grh.hop_limit = 1;
            (
                CmEventType::MulticastJoin,
                Some(UdParam {
                    private_data: Vec::new(),
                    ah_attr: ah,
                    qp_num: MULTICAST_QPN,
                    qkey: RDMA_UDP_QKEY,
                }),
            )
        } else {
            (CmEventType::MulticastError, None)
        };
        let mut ev = CmEvent::new(event, status, self.clone(), None, ConnParam::default());
        ev.ud = ud;
        ev.arg = context;
        ev.group = Some(count);
        self.post_ev(ev, None);
        let ch = {
            let c = self.inner.chan();
            c.sync.then(|| c.channel.clone())
        };
        if let Some(ch) = ch {
            let ev = ch.get_cm_event()?;
            let info = ev.info();
            ev.ack();
            self.set_last_event(info.clone());
            if info.event != CmEventType::MulticastJoin {
                return Err(event_error(&info));
            }
        }
        Ok(())
    }

    /// Leaves the multicast group `addr` (`rdma_leave_multicast`): detaches the QP (unless
    /// the join was send-only) and waits until the group's events that were taken are
    /// acknowledged. Messages already received stay queued.
    ///
    /// Fails with `EADDRNOTAVAIL` when the id has not joined `addr`.
    pub fn leave_multicast(&self, addr: IpAddr) -> Result<()> {
        let g = {
            let mut s = self.inner.lock();
            let Some(pos) = s.mcast.iter().position(|g| g.addr == addr) else {
                return Err(Error::new(
                    ErrorKind::AddrNotAvailable,
                    format!("the id has not joined {addr}"),
                ));
            };
            s.mcast.remove(pos)
        };
        self.drop_group(g);
        Ok(())
    }

    pub(super) fn drop_group(&self, g: McGroup) {
        if let Some(qp) = &g.attached {
            let _ = qp.detach_mcast(&g.gid, 0);
        }
        let _ = g.send_only;
        // Events of the group still queued are dropped; taken ones must be acknowledged.
        let c = g.count.clone();
        let ch = self.channel();
        drop(ch.remove_queued(|ev| ev.group.as_ref().is_some_and(|x| Arc::ptr_eq(x, &c))));
        let i = &self.inner;
        let mut guard = i.lock();
        while c.acked.load(Ordering::Acquire) < c.reported.load(Ordering::Acquire) {
            guard = i.acked_cv.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }
}
