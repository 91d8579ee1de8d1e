//! The id's first calls (`struct rdma_cm_id`; its types are in `objects.rs`): create, the
//! accessors, events of a synchronous id, options, binding; and what an id's drop undoes.

use super::connect::event_error;
use super::dispatch::dispatch;
use super::event::{CmEventType, ConnParam, EventInfo, UdParam};
use super::objects::{ChanRef, CmEvent, CmId, EventChannel, IdData, IdInner, IdState};
use super::qp_state::qp_to_err;
use super::registry::{
    all_ids, device_res, engine_started, errno_err, orphans, ports, random_psn, registry_mutex,
    PortTable, PortUse,
};
use super::{
    max_backlog, CmOption, PortSpace, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT, RDMA_OPTION_ID_AFONLY, RDMA_OPTION_ID_REUSEADDR,
    RDMA_OPTION_ID_TOS,
};
use crate::error::{Error, ErrorKind, Result};
use crate::{CompChannel, Context, Cq, Mtu, Pd, Qp, QpType, Srq};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Registers this layer's entry points with the provider ([`crate::provider::CmHook`]),
/// once: every id is created here first, so the hook is in place before any listener or
/// connection is recorded in the registry, and no event for an id of this layer can reach a
/// provider that does not know where to hand it.
fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::provider::set_cm_hook(crate::provider::CmHook {
            dispatch,
            engine_started,
        })
    });
}

/// An id dropped without [`CmId::destroy`] (a panicking thread, a forgotten handle) still
/// leaves cleanly: its connection is destroyed in the CM (REJ or DREQ to the peer, so the
/// peer is not left waiting for its retries to run out) and its QP goes to ERR.
impl Drop for IdInner {
    fn drop(&mut self) {
        let me: *const IdInner = self;
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if s.state == IdState::Gone {
            return;
        }
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
        if let (Some(conn), Some(engine)) = (s.conn.take(), s.engine.clone()) {
            engine.with_cm(|g, now| g.cm.destroy(now, conn));
            // Its registry entry goes too. The registry may be locked now (by another
            // thread, or by this one around the drop of a candidate it looked up): then the
            // key waits in the orphan list, which the next lock of the registry clears. A
            // dead entry left in the map would keep this id's allocation (a `Weak` holds it)
            // for good: comm IDs are random, so no later insert replaces it.
            if let Some(src) = s.src {
                let key = (src.ip(), conn.0);
                match registry_mutex().try_lock() {
                    Ok(mut r) => {
                        if r.conns
                            .get(&key)
                            .is_some_and(|w| std::ptr::eq(w.as_ptr(), me))
                        {
                            r.conns.remove(&key);
                        }
                    }
                    Err(_) => orphans()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(key),
                }
            }
        }
        for g in s.mcast.drain(..) {
            if let Some(qp) = &g.attached {
                let _ = qp.detach_mcast(&g.gid, 0);
            }
        }
        let c = self.chan.get_mut().unwrap_or_else(|p| p.into_inner());
        c.channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
        // Out of the port table, so that its weak reference does not keep this allocation
        // (a drop under that lock, say of a handle upgraded there, leaves it to the next
        // reservation of the port, which prunes dead entries).
        if let (Some(src), Ok(mut t)) = (s.src, ports().try_lock()) {
            let key = (self.ps.to_u16(), src.port());
            if let Some(v) = t.get_mut(&key) {
                v.retain(|u| u.id.strong_count() > 0 && !std::ptr::eq(u.id.as_ptr(), me));
                if v.is_empty() {
                    t.remove(&key);
                }
            }
        }
    }
}

impl CmId {
    /// Creates an id in the port space `ps` whose events go to `channel`
    /// (`rdma_create_id`). `context` is returned in every event's id. With no channel the id
    /// is synchronous: the calls that produce an event block until it arrives, keep it as
    /// [`CmId::event`], and fail when it reports an error. TCP and IB ids make RC QPs, UDP
    /// and IPoIB ids UD QPs.
    ///
    /// Fails with the errno of `eventfd` when a synchronous id cannot get its channel.
    pub fn create(channel: Option<&EventChannel>, context: u64, ps: PortSpace) -> Result<CmId> {
        let qp_type = match ps {
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
            _ => QpType::Rc,
        };
        Self::create_typed(channel, context, ps, qp_type)
    }

    pub(super) fn create_typed(
        channel: Option<&EventChannel>,
        context: u64,
        ps: PortSpace,
        qp_type: QpType,
    ) -> Result<CmId> {
        install_hook();
        let sync = channel.is_none();
        let channel = match channel {
            Some(c) => c.clone(),
            None => EventChannel::new()?,
        };
        channel.inner.ids.fetch_add(1, Ordering::AcqRel);
        let id = CmId {
            inner: Arc::new(IdInner {
                ps,
                qp_type,
                context,
                chan: Mutex::new(ChanRef { channel, sync }),
                last_event: Mutex::new(None),
                state: Mutex::new(IdData {
                    state: IdState::Idle,
                    src: None,
                    dst: None,
                    ctx: None,
                    engine: None,
                    path_mtu: Mtu::Mtu1024,
                    qp: None,
                    pd: None,
                    srq: None,
                    send_cq: None,
                    recv_cq: None,
                    send_cq_channel: None,
                    recv_cq_channel: None,
                    conn: None,
                    conn_param: ConnParam::default(),
                    starting_psn: random_psn(),
                    req: None,
                    neg: None,
                    listening: None,
                    backlog: max_backlog(),
                    tos: 0,
                    reuseaddr: false,
                    afonly: false,
                    ack_timeout: None,
                    conn_error: false,
                    mcast: Vec::new(),
                    ep_attr: None,
                    connect_data: Vec::new(),
                }),
                reported: AtomicUsize::new(0),
                acked: AtomicUsize::new(0),
                acked_cv: Condvar::new(),
                addrinfo: Mutex::new(None),
                backlog_used: AtomicUsize::new(0),
            }),
        };
        let mut a = all_ids().lock().unwrap_or_else(|p| p.into_inner());
        if a.len() >= 64 && a.len().is_power_of_two() {
            // Amortized: the entries of dropped ids go before the list doubles.
            a.retain(|w| w.strong_count() > 0);
        }
        a.push(Arc::downgrade(&id.inner));
        drop(a);
        Ok(id)
    }

    /// The context given at creation (`id->context`).
    pub fn context(&self) -> u64 {
        self.inner.context
    }

    /// The port space (`id->ps`).
    pub fn ps(&self) -> PortSpace {
        self.inner.ps
    }

    /// The QP type the id makes (`id->qp_type`).
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The channel the id's events go to (`id->channel`; a synchronous id's private one).
    pub fn channel(&self) -> EventChannel {
        self.inner.chan().channel.clone()
    }

    /// The device context the id is bound to, once bound (`id->verbs`).
    pub fn verbs(&self) -> Option<Arc<Context>> {
        self.inner.lock().ctx.clone()
    }

    /// The port the id is bound to (`id->port_num`): 1 once bound to a device, else 0.
    pub fn port_num(&self) -> u8 {
        u8::from(self.inner.lock().ctx.is_some())
    }

    /// The id's QP, once created (`id->qp`).
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.inner.lock().qp.clone()
    }

    /// The PD of the id's QP: the one given to `create_qp`, or the device's default PD
    /// (`id->pd`).
    pub fn pd(&self) -> Option<Arc<Pd>> {
        self.inner.lock().pd.clone()
    }

    /// The id's shared receive queue (`id->srq`).
    pub fn srq(&self) -> Option<Arc<Srq>> {
        self.inner.lock().srq.clone()
    }

    /// The send CQ of the id's QP (`id->send_cq`).
    pub fn send_cq(&self) -> Option<Arc<Cq>> {
        self.inner.lock().send_cq.clone()
    }

    /// The receive CQ of the id's QP (`id->recv_cq`).
    pub fn recv_cq(&self) -> Option<Arc<Cq>> {
        self.inner.lock().recv_cq.clone()
    }

    /// The completion channel of the send CQ the CM made (`id->send_cq_channel`); `None`
    /// when the application gave its own send CQ.
    pub fn send_cq_channel(&self) -> Option<Arc<CompChannel>> {
        self.inner.lock().send_cq_channel.clone()
    }

    /// The completion channel of the receive CQ the CM made (`id->recv_cq_channel`).
    pub fn recv_cq_channel(&self) -> Option<Arc<CompChannel>> {
        self.inner.lock().recv_cq_channel.clone()
    }

    /// The local address (`rdma_get_local_addr`); `None` while unbound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().src
    }

    /// The peer's address (`rdma_get_peer_addr`); `None` until resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().dst
    }

    /// The local port (`rdma_get_src_port`, here in host byte order); 0 while unbound.
    pub fn src_port(&self) -> u16 {
        self.local_addr().map_or(0, |a| a.port())
    }

    /// The peer's port (`rdma_get_dst_port`, here in host byte order); 0 while unknown.
    pub fn dst_port(&self) -> u16 {
        self.peer_addr().map_or(0, |a| a.port())
    }

    /// Whether the id is synchronous (created with no channel, or migrated to none).
    pub fn is_sync(&self) -> bool {
        self.inner.chan().sync
    }

    /// The last event of a synchronous id (`id->event`).
    pub fn event(&self) -> Option<EventInfo> {
        self.inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn set_last_event(&self, info: EventInfo) {
        *self
            .inner
            .last_event
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(info);
    }

    /// For a synchronous id: waits for the event its last call produces, keeps it, and
    /// turns an error event into the errno librdmacm reports.
    pub(super) fn complete(&self, want: CmEventType) -> Result<()> {
        self.complete_until(want, None)
    }

    /// [`CmId::complete`], waiting until `deadline` at most (then `ETIMEDOUT`, and the event
    /// stays on the id's channel for the next taker).
    pub(super) fn complete_until(
        &self,
        want: CmEventType,
        deadline: Option<std::time::Instant>,
    ) -> Result<()> {
        let ch = {
            let c = self.inner.chan();
            if !c.sync {
                return Ok(());
            }
            c.channel.clone()
        };
        let ev = match deadline {
            None => ch.get_cm_event()?,
            Some(d) => {
                ch.get_cm_event_timeout(d.saturating_duration_since(std::time::Instant::now()))?
            }
        };
        let info = ev.info();
        ev.ack();
        self.set_last_event(info.clone());
        if info.event == want {
            return Ok(());
        }
        Err(event_error(&info))
    }

    /// Takes the next connection request of a synchronous listener (`rdma_get_request`):
    /// blocks until one arrives and returns its new (synchronous) id, whose
    /// [`CmId::event`] holds the request's parameters. If the listener was made by
    /// [`CmId::create_ep`] with QP attributes, the new id gets its QP (on the listener's PD).
    ///
    /// Fails with `EINVAL` on an asynchronous id or one that is not listening, with the
    /// event's error when something else than a connection request arrives, and like
    /// [`CmId::create_qp_ex`].
    pub fn get_request(&self) -> Result<CmId> {
        self.get_request_until(None)
    }

    pub(super) fn get_request_until(&self, deadline: Option<std::time::Instant>) -> Result<CmId> {
        // (The channel lock is never held while the state lock is taken: the event path
        // takes them the other way round.)
        let listening = self.inner.lock().state == IdState::Listen;
        let ch = {
            let c = self.inner.chan();
            if !c.sync || !listening {
                return Err(Error::invalid(
                    "rdma_get_request needs a synchronous, listening id",
                ));
            }
            c.channel.clone()
        };
        let ev = match deadline {
            None => ch.get_cm_event()?,
            Some(d) => {
                ch.get_cm_event_timeout(d.saturating_duration_since(std::time::Instant::now()))?
            }
        };
        let info = ev.info();
        if info.event != CmEventType::ConnectRequest {
            ev.ack();
            return Err(event_error(&info));
        }
        let id = ev.id.clone();
        id.set_last_event(info);
        ev.ack();
        let ep = self.inner.lock().ep_attr.clone();
        if let Some((pd, mut attr)) = ep {
            if let Err(e) = id.create_qp_ex(pd.as_ref(), &mut attr) {
                let _ = id.reject(&[]);
                id.destroy();
                return Err(e);
            }
        }
        Ok(id)
    }

    pub(super) fn post_ev(&self, mut ev: CmEvent, listen: Option<&CmId>) {
        let ch = match listen {
            Some(l) => l.channel(),
            None => self.channel(),
        };
        ev.listen_id = listen.cloned();
        ch.post(ev);
    }

    pub(super) fn post(
        &self,
        event: CmEventType,
        status: i32,
        param: ConnParam,
        listen: Option<CmId>,
    ) {
        self.post_ev(
            CmEvent::new(event, status, self.clone(), None, param),
            listen.as_ref(),
        );
    }

    pub(super) fn post_ud(
        &self,
        event: CmEventType,
        status: i32,
        ud: UdParam,
        listen: Option<&CmId>,
    ) {
        let mut ev = CmEvent::new(event, status, self.clone(), None, ConnParam::default());
        ev.ud = Some(ud);
        self.post_ev(ev, listen);
    }

    /// Writes an event of type USER with `status` and `arg` to the id's channel
    /// (`rdma_write_cm_event`), e.g. to wake a thread waiting in
    /// [`EventChannel::get_cm_event`].
    ///
    /// Fails with `EINVAL` for any other event type.
    pub fn write_cm_event(&self, event: CmEventType, status: i32, arg: u64) -> Result<()> {
        if event != CmEventType::User {
            return Err(Error::invalid(
                "rdma_write_cm_event writes USER events only",
            ));
        }
        let mut ev = CmEvent::new(event, status, self.clone(), None, ConnParam::default());
        ev.arg = arg;
        self.post_ev(ev, None);
        Ok(())
    }

    /// Sets an option (`rdma_set_option`).
    ///
    /// Fails with `EINVAL` for `ReuseAddr`/`AfOnly` once the id is bound.
    pub fn set_option(&self, opt: CmOption) -> Result<()> {
        let mut s = self.inner.lock();
        match opt {
            CmOption::Tos(t) => s.tos = t,
            CmOption::AckTimeout(t) => s.ack_timeout = Some(t.min(31)),
            CmOption::ReuseAddr(v) | CmOption::AfOnly(v) => {
                if s.state != IdState::Idle {
                    return Err(Error::invalid(
                        "REUSEADDR and AFONLY must be set before the id is bound",
                    ));
                }
                if matches!(opt, CmOption::ReuseAddr(_)) {
                    s.reuseaddr = v;
                } else {
                    s.afonly = v;
                }
            }
        }
        Ok(())
    }

    /// `rdma_set_option` with C's arguments: `level`, `optname` and the option's bytes in
    /// native byte order (u8 for TOS and ACK_TIMEOUT, a C int for REUSEADDR and AFONLY).
    ///
    /// Fails with `EINVAL` when the length does not fit the option (or as
    /// [`CmId::set_option`]), `ENOSYS` for an unknown option, and `EOPNOTSUPP` for
    /// `RDMA_OPTION_IB_PATH` (RoCE paths come from the local route table).
    pub fn set_option_raw(&self, level: i32, optname: i32, optval: &[u8]) -> Result<()> {
        let int = |v: &[u8]| -> Result<bool> {
            let b: [u8; 4] = v
                .try_into()
                .map_err(|_| Error::invalid("the option takes a C int (4 bytes)"))?;
            Ok(i32::from_ne_bytes(b) != 0)
        };
        let byte = |v: &[u8]| -> Result<u8> {
            match v {
                [b] => Ok(*b),
                _ => Err(Error::invalid("the option takes one byte")),
            }
        };
        let opt = match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => CmOption::Tos(byte(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => CmOption::ReuseAddr(int(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => CmOption::AfOnly(int(optval)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => CmOption::AckTimeout(byte(optval)?),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                return Err(Error::not_supported(
                    "RDMA_OPTION_IB_PATH: on RoCE the path comes from the local route",
                ))
            }
            _ => {
                return Err(errno_err(
                    libc::ENOSYS,
                    format!("unknown option level {level} name {optname}"),
                ))
            }
        };
        self.set_option(opt)
    }

    /// Moves the id and its waiting events to another channel, or (`None`) makes it
    /// synchronous (`rdma_migrate_id`). Waits until every event already taken for the id is
    /// acknowledged.
    ///
    /// Fails with `EINVAL` when a synchronous id is migrated to `None`, and with the errno
    /// of `eventfd` when a private channel cannot be made.
    pub fn migrate_id(&self, channel: Option<&EventChannel>) -> Result<()> {
        if self.is_sync() && channel.is_none() {
            return Err(Error::invalid("the id is already synchronous"));
        }
        let new = match channel {
            Some(ch) => ch.clone(),
            None => EventChannel::new()?,
        };
        // Before the channel lock: the event path takes the state lock, then the channel's.
        self.wait_acked();
        let mut c = self.inner.chan();
        let me = self.clone();
        let moved = c.channel.remove_queued(|ev| ev.id == me);
        for ev in moved {
            new.post(ev);
        }
        new.inner.ids.fetch_add(1, Ordering::AcqRel);
        c.channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
        c.channel = new;
        c.sync = channel.is_none();
        Ok(())
    }

    pub(super) fn wait_acked(&self) {
        let i = &self.inner;
        let mut g = i.lock();
        while i.acked.load(Ordering::Acquire) < i.reported.load(Ordering::Acquire) {
            g = i.acked_cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`); port 0 picks an
    /// ephemeral port, the unspecified address binds every device.
    ///
    /// Fails with `EINVAL` when the id is already bound, `EADDRNOTAVAIL` when the address
    /// is not an address of this machine, `EADDRINUSE` when the port is taken.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut s = self.inner.lock();
        if s.state != IdState::Idle {
            return Err(Error::invalid("the id is already bound"));
        }
        if !addr.ip().is_unspecified() {
            let (ctx, _) = device_res(addr.ip())?;
            let engine = ctx.inner.shared.engine()?;
            let port = self.reserve_port(&s, addr.ip(), addr.port())?;
            s.engine = Some(engine);
            s.ctx = Some(ctx);
            s.src = Some(SocketAddr::new(addr.ip(), port));
        } else {
            let port = self.reserve_port(&s, addr.ip(), addr.port())?;
            s.src = Some(SocketAddr::new(addr.ip(), port));
        }
        s.state = IdState::AddrBound;
        Ok(())
    }

    pub(super) fn reserve_port(&self, me: &IdData, ip: IpAddr, port: u16) -> Result<u16> {
        let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
        let ps = self.inner.ps.to_u16();
        let my_reuse = me.reuseaddr;
        // (From the table's records: another id's lock is never taken here.)
        let clash = |t: &PortTable, port: u16| {
            t.get(&(ps, port)).is_some_and(|v| {
                v.iter().any(|u| {
                    if u.id.strong_count() == 0 || u.is(&self.inner) {
                        return false;
                    }
                    let a = u.ip;
                    let overlap = a == ip
                        || (a.is_unspecified() && (a.is_ipv4() == ip.is_ipv4() || !u.afonly))
                        || (ip.is_unspecified() && (a.is_ipv4() == ip.is_ipv4() || !me.afonly));
                    let shared = my_reuse && u.reuseaddr && !u.listening;
                    overlap && !shared
                })
            })
        };
        let port = if port == 0 {
            let mut p = 0;
            for _ in 0..1000 {
                let cand = 32768 + (crate::gid::random_u32() % 28000) as u16;
                if !clash(&t, cand) {
                    p = cand;
                    break;
                }
            }
            if p == 0 {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    "no ephemeral port is free",
                ));
            }
            p
        } else {
            if clash(&t, port) {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("port {port} is already bound in this port space"),
                ));
            }
            port
        };
        let v = t.entry((ps, port)).or_default();
        v.retain(|u| u.id.strong_count() > 0);
        v.push(PortUse {
            id: Arc::downgrade(&self.inner),
            ip,
            afonly: me.afonly,
            reuseaddr: me.reuseaddr,
            listening: false,
        });
        Ok(port)
    }
}
