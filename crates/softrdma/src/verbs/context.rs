//! Device contexts (`struct ibv_context`) and their asynchronous event queue.

use crate::error::{Error, Result};
use crate::gid::{Gid, GidType};
use crate::verbs::device::{self, Device, DeviceAttr, GidEntry, PortAttr, PORT_NUM};
use crate::verbs::event::{AsyncEvent, AsyncQueue};
use crate::verbs::resources::DeviceShared;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// An open device (`struct ibv_context`), from [`Device::open`].
///
/// Objects created from it (PDs, CQs, channels, …) keep the device state alive: closing or
/// dropping the context does not destroy them, as `ibv_close_device` does not.
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) async_events: AsyncQueue,
    pub(crate) users: AtomicUsize,
}

impl crate::verbs::hold::Counted for ContextInner {
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

/// How many completion vectors each context offers (`num_comp_vectors`).
pub const NUM_COMP_VECTORS: u32 = 1;

impl Device {
    /// Opens the device (`ibv_open_device`).
    ///
    /// Fails with the errno of `eventfd` if the asynchronous event descriptor cannot be made
    /// (`EMFILE`, `ENFILE`, `ENOMEM`).
    pub fn open(&self) -> Result<Context> {
        Ok(Context {
            inner: Arc::new(ContextInner {
                shared: DeviceShared::get(self),
                async_events: AsyncQueue::new()?,
                users: AtomicUsize::new(0),
            }),
        })
    }
}

fn check_port(port: u8) -> Result<()> {
    if port != PORT_NUM {
        return Err(Error::invalid(format!(
            "port {port} does not exist: softrdma devices have one port, numbered 1"
        )));
    }
    Ok(())
}

impl Context {
    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.inner.shared.device
    }

    /// The device's attributes and limits (`ibv_query_device`). Never fails on a softrdma
    /// device; the `Result` keeps the verbs contract.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.inner.shared.attr.clone())
    }

    /// The attributes of `port` (`ibv_query_port`).
    ///
    /// Fails with `EINVAL` for any port but 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        check_port(port)?;
        Ok(device::port_attr(self.device()))
    }

    /// The GID at `index` of `port`'s table (`ibv_query_gid`): the IPv4-mapped or IPv6
    /// address of the device at index 0.
    ///
    /// Fails with `EINVAL` for a port other than 1 or an index outside the table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        Ok(self.query_gid_ex(port, index)?.gid)
    }

    /// The GID table entry at `index` with its type and interface (`ibv_query_gid_ex`).
    ///
    /// Fails with `EINVAL` for a port other than 1 or an index outside the table.
    pub fn query_gid_ex(&self, port: u8, index: u32) -> Result<GidEntry> {
        check_port(port)?;
        if index >= device::GID_TABLE_LEN {
            return Err(Error::invalid(format!(
                "GID index {index} is outside the table of {} entries",
                device::GID_TABLE_LEN
            )));
        }
        Ok(GidEntry {
            gid: self.device().gid(),
            gid_index: index,
            port_num: u32::from(port),
            gid_type: GidType::RoceV2,
            ndev_ifindex: self.device().ifindex(),
        })
    }

    /// Every valid GID table entry of every port (`ibv_query_gid_table`).
    pub fn query_gid_table(&self) -> Vec<GidEntry> {
        (0..device::GID_TABLE_LEN)
            .filter_map(|i| self.query_gid_ex(PORT_NUM, i).ok())
            .collect()
    }

    /// The P_Key at `index` of `port`'s table (`ibv_query_pkey`): 0xFFFF at index 0.
    ///
    /// Fails with `EINVAL` for a port other than 1 or an index other than 0.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        check_port(port)?;
        if index != 0 {
            return Err(Error::invalid(format!(
                "P_Key index {index} is outside the table of 1 entry"
            )));
        }
        Ok(device::DEFAULT_PKEY)
    }

    /// The index of `pkey` in `port`'s table (`ibv_get_pkey_index`).
    ///
    /// Fails with `EINVAL` for a port other than 1 and `ENOENT`-like `EINVAL` when the P_Key
    /// is not in the table.
    pub fn get_pkey_index(&self, port: u8, pkey: u16) -> Result<u16> {
        check_port(port)?;
        if pkey == device::DEFAULT_PKEY {
            Ok(0)
        } else {
            Err(Error::invalid(format!(
                "P_Key {pkey:#06x} is not in the table"
            )))
        }
    }

    /// How many completion vectors CQs may be spread over (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        NUM_COMP_VECTORS
    }

    /// The descriptor that becomes readable when an asynchronous event is waiting
    /// (`ctx->async_fd`). Set `O_NONBLOCK` on it to make [`Context::get_async_event`] fail with
    /// `EAGAIN` instead of blocking.
    pub fn async_fd(&self) -> RawFd {
        self.inner.async_events.fd().as_raw_fd()
    }

    /// Takes the next asynchronous event (`ibv_get_async_event`): blocks until one arrives,
    /// unless `O_NONBLOCK` is set on [`Context::async_fd`], in which case it fails with
    /// `EAGAIN` when none is waiting. When several threads wait, one of them gets each event.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        self.inner.async_events.pop()
    }

    /// The device's packet counters (zero until the device has carried traffic).
    pub fn counters(&self) -> crate::DeviceCounters {
        self.inner
            .shared
            .engine_if_started()
            .map(|e| e.counters())
            .unwrap_or_default()
    }

    /// The counters of the device's connection manager (QP 1) and how many communications
    /// and unanswered requests it holds, against its bounds (zero until the device has
    /// carried traffic). Read-only; see [`crate::GsiStats`].
    pub fn cm_stats(&self) -> crate::GsiStats {
        self.inner
            .shared
            .engine_if_started()
            .map(|e| e.cm_stats())
            .unwrap_or_default()
    }

    /// Sets the bounds of the device's connection manager (QP 1) from now on: most
    /// communication records (connections in any state, timewait included) and most
    /// incoming requests not answered yet. Beyond either, an incoming REQ is rejected with
    /// REJ 3 (no resources; the peer's `rdma_connect` gets REJECTED, status 3) and
    /// `rdma_connect` fails with `ENOMEM`. Records already held stay. The defaults, 262,144
    /// and 65,536, can be set for every device of a process with the environment variables
    /// `SOFTRDMA_CM_MAX_CONNECTIONS` and `SOFTRDMA_CM_MAX_PENDING_REQS`; read them back with
    /// [`Context::cm_stats`].
    ///
    /// Fails like the start of the device engine (`EADDRINUSE` when a socket that does not
    /// share it holds UDP port 4791 on the device's address).
    pub fn set_cm_limits(&self, max_connections: usize, max_pending_reqs: usize) -> Result<()> {
        let e = self.inner.shared.engine()?;
        e.with_cm(|g, _| g.cm.set_limits(max_connections, max_pending_reqs));
        Ok(())
    }

    /// Makes the device inject faults into every packet it sends from now on (`None`
    /// stops it), for tests of loss and corruption; see [`crate::FaultConfig`].
    ///
    /// Fails like the start of the device engine (`EADDRINUSE` when a socket that does not
    /// share it holds UDP port 4791 on the device's address).
    pub fn set_fault_injection(&self, cfg: Option<crate::FaultConfig>) -> Result<()> {
        self.inner.shared.engine()?.set_faults(cfg);
        Ok(())
    }

    /// Makes the device stop (`true`) or resume taking packets from its same-host lanes (see
    /// [`crate::same_host_lanes`]), as a receiver that has fallen behind would, for tests of
    /// flow control: peers of this host that send to it find their lanes' rings full. Packets
    /// that arrive on the wire are still received. A test knob: while paused, what waits in
    /// a lane is not taken before a connection-manager message either.
    ///
    /// Fails like [`Context::set_fault_injection`].
    pub fn pause_same_host_receive(&self, paused: bool) -> Result<()> {
        self.inner.shared.engine()?.pause_lanes(paused);
        Ok(())
    }

    /// Sets how many receive queues the device spreads the RC and UC QPs that this process
    /// creates on it from now on over (as `ethtool -L` sets a NIC's queues; QPs created
    /// before stay where they are). Each queue beyond the first is a socket of the device's
    /// own, in its reuseport group, with a progress thread of its own: the device's steering
    /// program sends each packet to the queue its destination QP is on, and the queues
    /// receive, check and deliver in parallel, so that several QPs are not limited by one
    /// thread's receive path. QPs take the queues in turn; UD QPs, QP 1 (the connection
    /// manager) and multicast stay on queue 0. Every context on the device in this process
    /// shares the setting. The default is `SOFTRDMA_QUEUES` when set (1 to 16), else one
    /// queue per two CPUs, at most 8 (one on a machine of up to 3 CPUs); read it with
    /// [`Context::receive_queues`]. Faults ([`Context::set_fault_injection`]) hold for every
    /// queue, and [`Context::counters`] sums them.
    ///
    /// Fails with `EINVAL` for 0 or more than 16.
    pub fn set_receive_queues(&self, queues: u8) -> Result<()> {
        self.inner.shared.set_queues(queues)
    }

    /// How many receive queues the device spreads this process's new RC and UC QPs over
    /// (see [`Context::set_receive_queues`]).
    pub fn receive_queues(&self) -> u8 {
        self.inner.shared.queues()
    }

    /// The UDP address the device's engine is bound to, starting the engine if needed.
    ///
    /// Fails like [`Context::set_fault_injection`].
    pub fn local_udp_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.inner.shared.engine()?.local())
    }

    /// Closes the context (`ibv_close_device`). Objects created from it stay valid until they
    /// are destroyed. Never fails on a softrdma device.
    pub fn close(self) -> Result<()> {
        Ok(())
    }
}

impl AsFd for Context {
    /// The asynchronous event descriptor.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.async_events.fd().as_fd()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", self.device())
            .finish_non_exhaustive()
    }
}
