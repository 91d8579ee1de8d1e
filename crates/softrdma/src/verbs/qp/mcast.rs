//! `ibv_attach_mcast` and `ibv_detach_mcast`: a UD QP's multicast groups.

use super::Qp;
use crate::error::{Error, Result};
use crate::gid::Gid;
use softrdma_proto::QpType;

impl Qp {
    /// Attaches the (UD) QP to the multicast group `gid` (`ibv_attach_mcast`); `lid` is
    /// ignored on RoCE. Attaching twice is allowed and still delivers one copy per message.
    ///
    /// The first QP of the device attached to a group makes the device join the IP group
    /// (starting the device engine if needed): from then on every UD SEND to the group that
    /// reaches this host — from this device, another device of this process or another
    /// process — is delivered to every attached QP of the device that is in RTR or later and
    /// whose Q_Key matches the DETH's, each copy taking a receive request of its own, except
    /// to the QP that sent it. A group of the other IP family than the device's address is
    /// recorded but receives nothing.
    ///
    /// Fails, changing nothing, with `EINVAL` for a QP that is not UD or a GID that is not
    /// multicast (IPv6 `ff00::/8` or IPv4-mapped 224.0.0.0/4); `ENOMEM` when the group already
    /// has the device's `max_mcast_qp_attach` QPs or the device its `max_mcast_grp` groups;
    /// `EADDRINUSE` when the device engine has to start and a socket that does not share it
    /// holds UDP port 4791 on the device address; and with the socket error when the IP group cannot be
    /// joined (say `ENOBUFS` past the kernel's `igmp_max_memberships`).
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::invalid(format!(
                "only UD QPs can join multicast groups, not {:?}",
                self.inner.qp_type
            )));
        }
        if !gid.is_multicast() {
            return Err(Error::invalid(format!("{gid} is not a multicast GID")));
        }
        let mut st = self.inner.lock();
        if st.mcast.contains(gid) {
            return Ok(());
        }
        let shared = self.inner.pd.shared();
        let qpn = self.inner.qp_num;
        shared.resources.mcast_attach(*gid, qpn, &shared.attr)?;
        // The QP's lock is held until the group is in its list: a datagram the new socket
        // receives meanwhile waits for it, then finds the QP attached.
        if let Err(e) = shared.engine().and_then(|e| e.mcast_join(gid, qpn)) {
            shared.resources.mcast_detach(*gid, qpn);
            return Err(e);
        }
        st.mcast.push(*gid);
        Ok(())
    }

    /// Detaches the QP from the multicast group `gid` (`ibv_detach_mcast`): once this returns
    /// the QP receives nothing more sent to the group. The last QP of the device to detach
    /// makes the device leave the IP group and close its socket for it.
    ///
    /// Fails with `EINVAL` when the QP is not attached to that group.
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let mut st = self.inner.lock();
        let Some(pos) = st.mcast.iter().position(|g| g == gid) else {
            return Err(Error::invalid(format!(
                "the QP is not attached to the multicast group {gid}"
            )));
        };
        st.mcast.swap_remove(pos);
        let shared = self.inner.pd.shared();
        shared.resources.mcast_detach(*gid, self.inner.qp_num);
        if let Some(e) = shared.engine_if_started() {
            e.mcast_leave(gid, self.inner.qp_num);
        }
        Ok(())
    }
}
