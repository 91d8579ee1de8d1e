//! Resolving, listening, connecting, accepting, rejecting, disconnecting and destroying an
//! id, and the helpers those steps share.

use super::event::{CmEventType, ConnParam, EventInfo};
use super::objects::{CmId, IdState, McGroup};
use super::qp_state::qp_to_err;
use super::registry::{
    device_res, errno_err, ports, registry, resources, update_port_use, wildcards,
};
use super::{max_backlog, RDMA_MAX_RESP_RES, RDMA_UDP_QKEY};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::Provider;
use crate::{Mtu, QpType};
use softrdma_proto::cm::{AcceptParams, ConnId, ConnectRequest};
use softrdma_wire::cm::{RejectReason, SidrStatus, TransportServiceType};
use softrdma_wire::cma::{self, CmaHeader, CmaHeaderRepr};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl CmId {
    /// Resolves the destination and binds the id to the device of the local address that
    /// reaches it (`rdma_resolve_addr`); `src`, when given, binds the id first as
    /// [`CmId::bind_addr`] does. ADDR_RESOLVED (or ADDR_ERROR) follows on the channel.
    ///
    /// Fails with `EINVAL` in the wrong state or for a destination of another family than
    /// the source, like [`CmId::bind_addr`] for `src`; the resolution's own failure arrives
    /// as ADDR_ERROR with a negative errno (`-EADDRNOTAVAIL`: no softrdma device owns the
    /// source address; `-ENETUNREACH`: no route).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout_ms: u32,
    ) -> Result<()> {
        crate::provider::release_held_acks();
        {
            let s = self.inner.lock();
            if !matches!(s.state, IdState::Idle | IdState::AddrBound) {
                return Err(Error::invalid("rdma_resolve_addr in the wrong state"));
            }
            if let Some(a) = s.src {
                if !a.ip().is_unspecified() && a.is_ipv4() != dst.is_ipv4() {
                    return Err(Error::invalid(
                        "the destination's family differs from the bound address",
                    ));
                }
            }
        }
        if let Some(src) = src {
            if self.inner.lock().state == IdState::Idle {
                self.bind_addr(src)?;
            }
        }
        self.inner.lock().dst = Some(dst);
        let local = match self.inner.lock().src {
            Some(a) if !a.ip().is_unspecified() => Ok(a.ip()),
            _ => route_source(dst.ip()),
        };
        let res = local.and_then(|ip| {
            let (ctx, _) = device_res(ip)?;
            let engine = ctx.inner.shared.engine()?;
            Ok((ip, ctx, engine))
        });
        let res = res.and_then(|(ip, ctx, engine)| {
            let mut s = self.inner.lock();
            let port = if s.state == IdState::Idle {
                self.reserve_port(&s, ip, 0)?
            } else {
                let port = s.src.map_or(0, |a| a.port());
                // (An id bound to the wildcard now uses this device's address.)
                update_port_use(&self.inner, port, |u| u.ip = ip);
                port
            };
            s.src = Some(SocketAddr::new(ip, port));
            s.ctx = Some(ctx);
            s.engine = Some(engine);
            s.state = IdState::AddrResolved;
            Ok(())
        });
        match res {
            Ok(()) => self.post(CmEventType::AddrResolved, 0, ConnParam::default(), None),
            Err(e) => self.post(
                CmEventType::AddrError,
                -e.errno(),
                ConnParam::default(),
                None,
            ),
        }
        self.complete(CmEventType::AddrResolved)
    }

    /// Resolves the route (`rdma_resolve_route`): on RoCE a local computation (path MTU from
    /// the interface MTU); ROUTE_RESOLVED follows.
    ///
    /// Fails with `EINVAL` unless the address is resolved.
    pub fn resolve_route(&self, _timeout_ms: u32) -> Result<()> {
        crate::provider::release_held_acks();
        let mut s = self.inner.lock();
        if s.state != IdState::AddrResolved {
            return Err(Error::invalid("rdma_resolve_route before ADDR_RESOLVED"));
        }
        let dev = s.ctx.as_ref().expect("resolved").device().clone();
        s.path_mtu = Mtu::for_link_mtu(dev.netdev_mtu()).unwrap_or(Mtu::Mtu1024);
        s.state = IdState::RouteResolved;
        drop(s);
        self.post(CmEventType::RouteResolved, 0, ConnParam::default(), None);
        self.complete(CmEventType::RouteResolved)
    }

    /// Listens for connection requests (`rdma_listen`); CONNECT_REQUEST events follow, each
    /// with a new id. At most `backlog` requests (0 or less, or above [`max_backlog`]: that
    /// maximum, 1024 unless `SOFTRDMA_CM_MAX_BACKLOG` sets it) wait to be taken with
    /// [`EventChannel::get_cm_event`](super::EventChannel::get_cm_event); one beyond is
    /// dropped unanswered and forgotten, as
    /// Linux drops it, so that the peer's CM retries it later (its REQ timer, about 4 s a
    /// try): the memory a flood of requests takes is bounded by the backlog, whether or not
    /// the application ever takes them. An id bound to a specific address listens on that device, one bound to
    /// the wildcard on every device (including those started later by this process, once
    /// they exist when the request arrives).
    ///
    /// Fails with `EINVAL` in the wrong state (an unbound id is bound to the wildcard address
    /// and an ephemeral port first, as the kernel does) and `EADDRINUSE` when another id
    /// listens on the same address and port, in this process or in another one that shares
    /// the device (a wildcard listener skips a device where another process listens).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.listen_starting(backlog, &[])
    }

    /// [`CmId::listen`], where a wildcard listener starts the devices of the local addresses
    /// `first` (those a program was told to use: the drop-in librdmacm passes the
    /// `SOFTRDMA_DEVICES` addresses) before the host's other devices, each listening as it
    /// starts. Starting a device takes a few milliseconds; a peer told the port before the
    /// listen (qperf's server sends it first) connects meanwhile, and the device it names
    /// should be up by then. (Addresses that are not local are skipped.)
    ///
    /// Fails as [`CmId::listen`] does.
    pub fn listen_starting(&self, backlog: i32, first: &[IpAddr]) -> Result<()> {
        crate::provider::release_held_acks();
        if self.inner.lock().state == IdState::Idle {
            self.bind_addr(SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let mut s = self.inner.lock();
        if s.state != IdState::AddrBound {
            return Err(Error::invalid("rdma_listen in the wrong state"));
        }
        let src = s.src.expect("bound");
        let sid = cma::service_id(self.inner.ps, src.port());
        let wildcard = s.engine.is_none();
        if wildcard {
            // Engines that start from now on listen too (see below).
            wildcards()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((sid, Arc::downgrade(&self.inner)));
        }
        let engines: Vec<Arc<dyn Provider>> = match &s.engine {
            Some(e) => vec![e.clone()],
            None => crate::provider::all_open(),
        };
        {
            let t = ports().lock().unwrap_or_else(|p| p.into_inner());
            // (From the table's records: another id's lock is never taken here.)
            let busy = t
                .get(&(self.inner.ps.to_u16(), src.port()))
                .is_some_and(|v| {
                    v.iter().any(|u| {
                        u.listening
                            && u.id.strong_count() > 0
                            && !u.is(&self.inner)
                            && (u.ip == src.ip()
                                || u.ip.is_unspecified()
                                || src.ip().is_unspecified())
                    })
                });
            if busy {
                forget_wildcard(&self.inner);
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("something already listens on {src}"),
                ));
            }
        }
        // Registered before the devices' CMs take requests for the service: a request that
        // a CM takes in between must find its listener (dropped, it left the peer's REQ
        // retransmits answered by nothing: perftest's rdma_cm client connects right after
        // its server's rdma_listen, and hung 1 run in 16-80).
        let mut r = registry();
        for e in &engines {
            let list = r.listeners.entry((e.local().ip(), sid)).or_default();
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&self.inner));
        }
        drop(r);
        // Then claim the service on every device: another process listening on it on a
        // device this id would listen on makes the port busy (EADDRINUSE), and then this id
        // listens nowhere.
        let mut claimed = Vec::new();
        for e in &engines {
            match e.cm_listen(sid) {
                Ok(true) => claimed.push(e.clone()),
                Ok(false) => {}
                Err(err) => {
                    for c in claimed {
                        c.cm_unlisten(sid);
                    }
                    registry().forget_listener(sid, &self.inner);
                    forget_wildcard(&self.inner);
                    return Err(err);
                }
            }
        }
        s.listening = Some(sid);
        let max = max_backlog();
        s.backlog = match usize::try_from(backlog) {
            Ok(b) if b > 0 && b <= max => b,
            _ => max,
        };
        s.state = IdState::Listen;
        update_port_use(&self.inner, src.port(), |u| u.listening = true);
        if wildcard {
            // Every device of this machine listens, as the kernel's wildcard listen does:
            // the devices open in this process listen from here on (above); now the engines
            // of the other local addresses start, and each listens as it starts
            // (`engine_started`: a device where another process listens on the service is
            // skipped). In this order because finding the local addresses takes a while
            // (netlink, sysfs: ~0.2 ms): a request that arrives meanwhile on an open device
            // finds the listener (perftest's rdma_cm mode connects its test QPs right after
            // the server's rdma_listen; refused, its client gives up).
            drop(s);
            let hosts = crate::get_device_list().unwrap_or_default();
            let addrs = first.iter().copied().chain(hosts.iter().map(|d| d.addr()));
            for addr in addrs {
                if crate::provider::if_open(addr).is_some() {
                    continue;
                }
                if addr.is_ipv4() == src.is_ipv4() || !self.inner.lock().afonly {
                    if let Err(e) = device_res(addr).and_then(|(c, _)| c.inner.shared.engine()) {
                        tracing::debug!(%addr, error = %e, "wildcard listen skips a device");
                    }
                }
            }
        }
        Ok(())
    }

    /// Connects to the resolved peer (`rdma_connect`). RC: sends the IB CM REQ with the
    /// rdma_cm header; ESTABLISHED follows (the QP then in RTS), or CONNECT_RESPONSE when the
    /// id has no QP (then call [`CmId::establish`]), REJECTED or UNREACHABLE. UD: sends a
    /// SIDR_REQ; ESTABLISHED carries the peer's QPN and Q_Key in
    /// [`CmEvent::ud`](super::CmEvent::ud), or
    /// UNREACHABLE (status: the SIDR status, or `-ETIMEDOUT`). On a synchronous id it
    /// returns once that event came, failing with `ECONNREFUSED` (REJECTED), `ETIMEDOUT`
    /// (UNREACHABLE) or the event's errno.
    ///
    /// Fails with `EINVAL` unless the route is resolved, when an RC id has neither a QP nor
    /// `param.qp_num`, when the private data exceeds 56 bytes (UD: 180), or when the
    /// resources exceed the device's limits.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        self.connect_until(param, None)
    }

    pub(super) fn connect_until(
        &self,
        param: &ConnParam,
        deadline: Option<std::time::Instant>,
    ) -> Result<()> {
        crate::provider::release_held_acks();
        let mut s = self.inner.lock();
        if s.state != IdState::RouteResolved {
            return Err(Error::invalid("rdma_connect before ROUTE_RESOLVED"));
        }
        let ud = self.inner.qp_type == QpType::Ud
            || s.qp.as_ref().is_some_and(|q| q.qp_type() == QpType::Ud);
        let mut user = s.connect_data.clone();
        user.extend_from_slice(&param.private_data);
        let max = if ud {
            cma::MAX_PRIVATE_DATA_SIDR_REQ
        } else {
            cma::MAX_PRIVATE_DATA_REQ
        };
        if user.len() > max {
            return Err(Error::invalid(format!(
                "{} bytes of private data exceed {max}",
                user.len()
            )));
        }
        let (qpn, srq, uc) = match &s.qp {
            Some(qp) => (qp.qp_num(), s.srq.is_some(), qp.qp_type() == QpType::Uc),
            None if ud => (0, false, false),
            None if param.qp_num != 0 => (param.qp_num, param.srq, false),
            None => {
                return Err(Error::invalid(
                    "rdma_connect needs a QP (rdma_create_qp) or param.qp_num",
                ))
            }
        };
        let ctx = s.ctx.clone().expect("resolved");
        let dev = ctx.query_device()?;
        check_rd_limits(param, &dev)?;
        let (src, dst) = (s.src.expect("resolved"), s.dst.expect("resolved"));
        let mut pd = vec![0u8; cma::CMA_HDR_LEN];
        CmaHeaderRepr::new(src.ip(), src.port(), dst.ip())
            .emit(&mut CmaHeader::new_unchecked(&mut pd[..]));
        pd.extend_from_slice(&user);
        let service_id = cma::service_id(self.inner.ps, dst.port());
        let engine = s.engine.clone().expect("resolved");
        let me = Arc::downgrade(&self.inner);
        let register = |id: ConnId| {
            registry().conns.insert((src.ip(), id.0), me.clone());
        };
        let id = if ud {
            engine.with_cm(|g, now| {
                let id = g.cm.sidr_request(now, dst.ip(), service_id, &pd)?;
                register(id);
                Ok::<_, softrdma_proto::cm::CmError>(id)
            })
        } else {
            let req = ConnectRequest {
                dst: dst.ip(),
                service_id,
                local_qpn: qpn,
                starting_psn: s.starting_psn,
                transport: if uc {
                    TransportServiceType::Uc
                } else {
                    TransportServiceType::Rc
                },
                responder_resources: resources(param.responder_resources, dev.max_qp_rd_atom),
                initiator_depth: resources(param.initiator_depth, dev.max_qp_init_rd_atom),
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                srq,
                flow_control: param.flow_control,
                path_mtu: s.path_mtu as u8,
                traffic_class: s.tos,
                hop_limit: 64,
                flow_label: 0,
                sl: 0,
                packet_rate: 0,
                private_data: pd,
            };
            // Register the communication while the CM is locked, so that a REP processed
            // on another thread finds this id.
            engine.with_cm(|g, now| {
                let id = g.cm.connect(now, req)?;
                register(id);
                Ok::<_, softrdma_proto::cm::CmError>(id)
            })
        }
        .map_err(|e| cm_error("connect", e))?;
        s.conn = Some(id);
        s.conn_param = param.clone();
        s.state = IdState::Connect;
        drop(s);
        self.complete_until(CmEventType::Established, deadline)
    }

    /// Completes a connection whose id has no QP (`rdma_establish`), after CONNECT_RESPONSE:
    /// sends the RTU (the passive side then gets ESTABLISHED). Move the QP to RTR and RTS
    /// first with [`CmId::init_qp_attr`].
    ///
    /// Fails with `EINVAL` when the id has a QP or no connection response is pending.
    pub fn establish(&self) -> Result<()> {
        let mut s = self.inner.lock();
        if s.qp.is_some() {
            return Err(Error::invalid("rdma_establish is for ids without a QP"));
        }
        let (Some(conn), Some(engine), IdState::Connect, Some(_)) =
            (s.conn, s.engine.clone(), s.state, s.neg)
        else {
            return Err(Error::invalid("no connection response is pending"));
        };
        engine
            .with_cm(|g, now| g.cm.send_rtu(now, conn, &[]))
            .map_err(|e| cm_error("establish", e))?;
        s.state = IdState::Established;
        Ok(())
    }

    /// Accepts the connection request this id was created for (`rdma_accept`). RC: moves
    /// the QP to RTR and RTS (an id without a QP uses `param.qp_num`; the application moves
    /// its QP) and sends the REP; ESTABLISHED follows when the RTU arrives (a synchronous id
    /// waits for it). UD: answers the SIDR_REQ with the QP number and [`RDMA_UDP_QKEY`]; no
    /// event follows. Responder resources and initiator depth of 0xFF mean the device
    /// maximum; both are clipped to what the requester offered.
    ///
    /// Fails with `EINVAL` for an id that is not a pending request, has no QP and no
    /// `param.qp_num`, private data above 196 bytes (UD: 136), or resources above the
    /// device's limits.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        crate::provider::release_held_acks();
        let mut s = self.inner.lock();
        let (Some(conn), Some(engine)) = (s.conn, s.engine.clone()) else {
            return Err(Error::invalid(
                "rdma_accept needs an id from CONNECT_REQUEST",
            ));
        };
        if s.state != IdState::Connect || s.listening.is_some() {
            return Err(Error::invalid("rdma_accept in the wrong state"));
        }
        if self.inner.qp_type == QpType::Ud {
            if param.private_data.len() > cma::MAX_PRIVATE_DATA_SIDR_REP {
                return Err(Error::invalid("private data exceeds 136 bytes"));
            }
            let qpn = s.qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
            engine
                .with_cm(|g, now| {
                    g.cm.sidr_reply(
                        now,
                        conn,
                        SidrStatus::Success,
                        qpn,
                        RDMA_UDP_QKEY,
                        &param.private_data,
                    )
                })
                .map_err(|e| cm_error("accept", e))?;
            s.state = IdState::Established;
            return Ok(());
        }
        let Some(req) = s.req.clone() else {
            return Err(Error::invalid("rdma_accept without a request"));
        };
        let qpn = match &s.qp {
            Some(q) => q.qp_num(),
            None if param.qp_num != 0 => param.qp_num,
            None => {
                return Err(Error::invalid(
                    "rdma_accept needs a QP (rdma_create_qp) or param.qp_num",
                ))
            }
        };
        if param.private_data.len() > cma::MAX_PRIVATE_DATA_REP {
            return Err(Error::invalid("private data exceeds 196 bytes"));
        }
        let ctx = s.ctx.clone().expect("bound");
        let dev = ctx.query_device()?;
        check_rd_limits(param, &dev)?;
        // The request's values are already from our point of view (swapped).
        let resp =
            resources(param.responder_resources, dev.max_qp_rd_atom).min(req.responder_resources);
        let init =
            resources(param.initiator_depth, dev.max_qp_init_rd_atom).min(req.initiator_depth);
        if let Some(n) = s.neg.as_mut() {
            n.resp = resp;
            n.init = init;
            n.rnr = req.rnr_retry_count;
        }
        if let Err(e) = self.qp_to_rts(&s) {
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            return Err(e);
        }
        let params = AcceptParams {
            local_qpn: qpn,
            starting_psn: s.starting_psn,
            responder_resources: resp,
            initiator_depth: init,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: s.srq.is_some() || (s.qp.is_none() && param.srq),
            flow_control: param.flow_control,
            private_data: param.private_data.clone(),
        };
        if let Err(e) = engine.with_cm(|g, now| g.cm.accept(now, conn, params)) {
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            return Err(Error::invalid(format!("accept: {e:?}")));
        }
        drop(s);
        self.complete(CmEventType::Established)
    }

    /// Rejects the connection request this id was created for (`rdma_reject`): the peer gets
    /// REJECTED with status 28 and the private data (UD: a SIDR_REP with status 2, which the
    /// peer sees as UNREACHABLE with status 2).
    ///
    /// Fails with `EINVAL` for an id that is not a pending request, or private data above
    /// 148 bytes (UD: 136).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::ConsumerDefined, private_data)
    }

    /// Rejects with reason 35, "vendor option not supported" (`rdma_reject_ece`).
    ///
    /// Fails like [`CmId::reject`].
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::from_u16(35), private_data)
    }

    pub(super) fn reject_with(&self, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        let mut s = self.inner.lock();
        let (Some(conn), Some(engine), IdState::Connect, None) =
            (s.conn, s.engine.clone(), s.state, s.listening)
        else {
            return Err(Error::invalid(
                "rdma_reject needs an id from CONNECT_REQUEST",
            ));
        };
        let r = if self.inner.qp_type == QpType::Ud {
            if private_data.len() > cma::MAX_PRIVATE_DATA_SIDR_REP {
                return Err(Error::invalid("private data exceeds 136 bytes"));
            }
            engine.with_cm(|g, now| {
                g.cm.sidr_reply(now, conn, SidrStatus::Reject, 0, 0, private_data)
            })
        } else {
            if private_data.len() > cma::MAX_PRIVATE_DATA_REJ {
                return Err(Error::invalid("private data exceeds 148 bytes"));
            }
            engine.with_cm(|g, now| g.cm.reject(now, conn, reason, private_data))
        };
        r.map_err(|e| cm_error("reject", e))?;
        s.state = IdState::Disconnected;
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR (flushing its work), a DREQ goes
    /// out, and both sides get DISCONNECTED. On a synchronous id it returns once
    /// DISCONNECTED arrived — at once if the peer disconnected first.
    ///
    /// Fails with `EINVAL` when the id never connected (UD ids never do).
    pub fn disconnect(&self) -> Result<()> {
        crate::provider::release_held_acks();
        let mut s = self.inner.lock();
        if self.inner.qp_type == QpType::Ud {
            return Err(Error::invalid("rdma_disconnect on a UD id"));
        }
        if s.state == IdState::Disconnected && s.conn.is_some() {
            // The peer disconnected first (its DREQ was answered by the CM): our side only
            // has to stop its QP, as the kernel's rdma_disconnect answering a DREQ does. A
            // synchronous id keeps the DISCONNECTED that is queued for it as its event (the
            // application may also have taken it from the id's channel already).
            if let Some(qp) = &s.qp {
                qp_to_err(qp);
            }
            drop(s);
            if self.is_sync() {
                let me = self.clone();
                let queued = self
                    .channel()
                    .remove_queued(|ev| ev.id == me && ev.event == CmEventType::Disconnected);
                if let Some(ev) = queued.first() {
                    self.set_last_event(ev.info());
                }
            }
            return Ok(());
        }
        let (Some(conn), Some(engine), IdState::Established) = (s.conn, s.engine.clone(), s.state)
        else {
            return Err(Error::invalid(
                "rdma_disconnect on an id that is not connected",
            ));
        };
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
        engine
            .with_cm(|g, now| g.cm.disconnect(now, conn, &[]))
            .map_err(|e| cm_error("disconnect", e))?;
        s.state = IdState::Disconnected;
        drop(s);
        self.complete(CmEventType::Disconnected)
    }

    /// Tells the connection manager about a QP event (`rdma_notify`): with
    /// `IBV_EVENT_COMM_EST` (data arrived on the passive side's QP before the RTU), the
    /// connection is established at once and ESTABLISHED follows. Other events are ignored,
    /// as in librdmacm.
    ///
    /// Fails with `EISCONN` when the connection is already established, `EINVAL` when the
    /// id is not a passive connection waiting for its RTU.
    pub fn notify(&self, event: crate::EventType) -> Result<()> {
        if event != crate::EventType::CommEst {
            return Ok(());
        }
        let (conn, engine, state) = {
            let s = self.inner.lock();
            (s.conn, s.engine.clone(), s.state)
        };
        if state == IdState::Established {
            return Err(errno_err(libc::EISCONN, "the connection is established"));
        }
        let (Some(conn), Some(engine), IdState::Connect) = (conn, engine, state) else {
            return Err(Error::invalid(
                "rdma_notify on an id that is not connecting",
            ));
        };
        engine
            .with_cm(|g, now| g.cm.notify_established(now, conn))
            .map_err(|e| match e {
                softrdma_proto::cm::CmError::AlreadyEstablished => {
                    errno_err(libc::EISCONN, "the connection is established")
                }
                e => Error::invalid(format!("rdma_notify: {e:?}")),
            })
    }

    /// Destroys the id (`rdma_destroy_id`): drops its events still queued (a listener's
    /// pending requests are rejected), waits until every event taken for it is
    /// acknowledged, leaves its multicast groups, and releases its port, its connection (an
    /// established one is disconnected with a DREQ) and its QP, if it still has one.
    pub fn destroy(self) {
        let me = self.clone();
        let ch = self.channel();
        let queued = ch.remove_queued(|ev| ev.id == me || ev.listen_id.as_ref() == Some(&me));
        for ev in queued {
            if ev.event == CmEventType::ConnectRequest {
                if let Some(l) = &ev.listen_id {
                    l.inner.backlog_used.fetch_sub(1, Ordering::AcqRel);
                }
            }
            if ev.listen_id.as_ref() == Some(&me) && ev.event == CmEventType::ConnectRequest {
                let child = ev.id.clone();
                drop(ev);
                let _ = child.reject(&[]);
                child.destroy();
            }
        }
        self.wait_acked();
        let groups: Vec<McGroup> = std::mem::take(&mut self.inner.lock().mcast);
        for g in groups {
            self.drop_group(g);
        }
        let i = &self.inner;
        let mut g = i.lock();
        if let (Some(conn), Some(engine)) = (g.conn.take(), g.engine.clone()) {
            if let Some(src) = g.src {
                let mut r = registry();
                let mine = r
                    .conns
                    .get(&(src.ip(), conn.0))
                    .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(i)));
                if mine {
                    r.conns.remove(&(src.ip(), conn.0));
                }
            }
            if let Some(qp) = &g.qp {
                qp_to_err(qp);
            }
            engine.with_cm(|gsi, now| gsi.cm.destroy(now, conn));
        }
        if let Some(src) = g.src {
            let mut t = ports().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = t.get_mut(&(i.ps.to_u16(), src.port())) {
                v.retain(|u| u.id.strong_count() > 0 && !u.is(i));
            }
        }
        if let Some(sid) = g.listening.take() {
            forget_wildcard(i);
            let idle = registry().forget_listener(sid, i);
            for e in crate::provider::all_open() {
                if idle.contains(&e.local().ip()) {
                    e.cm_unlisten(sid);
                }
            }
        }
        g.state = IdState::Gone;
        g.qp = None;
        g.pd = None;
        g.srq = None;
        Self::clear_qp(&mut g);
        drop(g);
        i.chan().channel.inner.ids.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The errno of a failure of the device's CM, as the kernel's rdma_cm would report it.
pub(super) fn cm_error(call: &str, e: softrdma_proto::cm::CmError) -> Error {
    use softrdma_proto::cm::CmError as E;
    let errno = match e {
        E::TooManyConnections => libc::ENOMEM,
        E::AlreadyEstablished => libc::EISCONN,
        E::AlreadyListening => libc::EADDRINUSE,
        E::UnknownId | E::InvalidState | E::PrivateDataTooLong | E::InvalidParam(_) => libc::EINVAL,
    };
    errno_err(errno, format!("rdma_{call}: {e:?}"))
}

/// `rdma_connect`'s and `rdma_accept`'s check of `responder_resources` and
/// `initiator_depth` against the device (`RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`, 0xff,
/// mean "the device's most"): EINVAL beyond it.
fn check_rd_limits(param: &ConnParam, dev: &crate::DeviceAttr) -> Result<()> {
    for (v, lim, what) in [
        (
            param.responder_resources,
            dev.max_qp_rd_atom,
            "responder_resources",
        ),
        (
            param.initiator_depth,
            dev.max_qp_init_rd_atom,
            "initiator_depth",
        ),
    ] {
        if v != RDMA_MAX_RESP_RES && u32::from(v) > lim {
            return Err(Error::invalid(format!(
                "{what} {v} exceeds the device's {lim}"
            )));
        }
    }
    Ok(())
}

/// The errno librdmacm reports for an event a synchronous call did not want.
pub(crate) fn event_error(info: &EventInfo) -> Error {
    let errno = match info.event {
        CmEventType::Rejected => libc::ECONNREFUSED,
        CmEventType::Unreachable if info.status > 0 => libc::ECONNREFUSED,
        CmEventType::Unreachable if info.status == -libc::ECONNREFUSED => libc::ECONNREFUSED,
        CmEventType::Unreachable => libc::ETIMEDOUT,
        _ if info.status < 0 => -info.status,
        _ => libc::EINVAL,
    };
    errno_err(
        errno,
        format!("{} (status {})", info.event.as_str(), info.status),
    )
}

/// The source address the kernel would use to reach `dst` (no packet is sent).
pub(super) fn route_source(dst: IpAddr) -> Result<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let s = std::net::UdpSocket::bind(any).map_err(|e| Error::from_io(e, "route lookup"))?;
    s.connect(SocketAddr::new(dst, 4791))
        .map_err(|e| Error::from_io(e, format!("no route to {dst}")))?;
    Ok(s.local_addr()
        .map_err(|e| Error::from_io(e, "route lookup"))?
        .ip())
}

/// Takes `id` off the wildcard listeners (it stopped listening, or never started).
fn forget_wildcard(id: &Arc<super::objects::IdInner>) {
    wildcards()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(_, w)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(id)));
}
