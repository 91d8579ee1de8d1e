//! Connection-manager events in: the device's sans-IO CM reports REQs, REPs, SIDR lookups,
//! rejections and disconnections, and this module hands each to the rdma_cm id it concerns
//! (creating the new id of an incoming request), moving QPs as librdmacm does.

use super::event::{CmEventType, ConnParam, UdParam};
use super::objects::{CmEvent, CmId, IdInner, IdState, Neg, RecvHold};
use super::qp_state::{mtu_min, qp_to_err};
use super::registry::{device_res, registry};
use crate::error::Error;
use crate::provider::Provider;
use crate::{AhAttr, Mtu, QpType};
use softrdma_proto::cm::{CmEvent as ProtoEvent, ConnId, RepInfo, ReqInfo};
use softrdma_wire::cm::{RejectReason, SidrStatus};
use softrdma_wire::cma::CmaHeaderRepr;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

fn param_from(
    private_data: &[u8],
    resp: u8,
    init: u8,
    retry: u8,
    rnr: u8,
    srq: bool,
    qpn: u32,
) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources: resp,
        initiator_depth: init,
        flow_control: false,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq,
        qp_num: qpn,
    }
}

fn find_conn(local: IpAddr, id: ConnId) -> Option<CmId> {
    registry()
        .conns
        .get(&(local, id.0))
        .and_then(Weak::upgrade)
        .map(|inner| CmId { inner })
}

/// The listener for a request to `dst_addr` on (device `local`, `service_id`).
/// Whether an id listens on this device for `service_id` (whatever its address): then the
/// IB CM has a listener for the service, and Linux rejects a request that rdma_cm cannot
/// take (a header it cannot read, another destination address, the wrong QP type) with REJ
/// 28 (consumer defined) or SIDR_REP status 2 (rejected), where no listener at all gets REJ
/// 8 (invalid service ID) or SIDR_REP status 1 (unsupported). Both seen from the kernel's
/// rdma_cm in the interop VM.
fn service_listened(local: IpAddr, service_id: u64) -> bool {
    registry()
        .listeners
        .get(&(local, service_id))
        .is_some_and(|v| v.iter().any(|w| w.strong_count() > 0))
}

fn find_listener(local: IpAddr, service_id: u64, dst_addr: IpAddr) -> Option<CmId> {
    // The candidates are taken out under the registry lock and looked at after it: the last
    // handle of an id may go with a candidate, and its drop uses the CM.
    let candidates: Vec<Arc<IdInner>> = registry()
        .listeners
        .get(&(local, service_id))
        .map(|v| v.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    candidates
        .into_iter()
        .find(|l| {
            let s = l.lock();
            s.src.is_some_and(|a| {
                a.ip() == dst_addr
                    || (a.ip().is_unspecified() && (a.is_ipv4() == dst_addr.is_ipv4() || !s.afonly))
            })
        })
        .map(|inner| CmId { inner })
}

/// Whether `listener` has as many untaken CONNECT_REQUESTs as its backlog allows: then the
/// request `id` is forgotten without an answer (the peer's CM retries it), as Linux drops it.
fn over_backlog(listener: &CmId, engine: &Arc<dyn Provider>, id: ConnId) -> bool {
    let full = listener.inner.backlog_used.load(Ordering::Acquire) >= listener.inner.lock().backlog;
    if full {
        engine.with_cm(|g, _| g.cm.abandon(id));
        tracing::debug!(%id, "a connection request beyond the listen backlog is dropped");
    }
    full
}

/// Posts a CONNECT_REQUEST for `child` on `listener`'s channel, counting it in the backlog.
fn post_request(listener: &CmId, mut ev: CmEvent) {
    listener.inner.backlog_used.fetch_add(1, Ordering::AcqRel);
    ev.listen_id = Some(listener.clone());
    listener.channel().post(ev);
}

/// A new id for an incoming request on `listener`, bound to this device.
fn child_of(
    listener: &CmId,
    engine: &Arc<dyn Provider>,
    conn: ConnId,
    peer: SocketAddr,
) -> Option<CmId> {
    let local = engine.local().ip();
    // The new id of a synchronous listener is synchronous too.
    let chan = (!listener.is_sync()).then(|| listener.channel());
    let child = CmId::create_typed(
        chan.as_ref(),
        listener.inner.context,
        listener.inner.ps,
        listener.inner.qp_type,
    )
    .ok()?;
    let (ctx, _) = device_res(local).ok()?;
    let (port, tos) = {
        let l = listener.inner.lock();
        (l.src.map_or(0, |a| a.port()), l.tos)
    };
    {
        let mut s = child.inner.lock();
        s.src = Some(SocketAddr::new(local, port));
        s.dst = Some(peer);
        s.path_mtu = Mtu::for_link_mtu(ctx.device().netdev_mtu()).unwrap_or(Mtu::Mtu1024);
        s.ctx = Some(ctx);
        s.engine = Some(engine.clone());
        s.conn = Some(conn);
        s.state = IdState::Connect;
        s.tos = tos;
    }
    registry()
        .conns
        .insert((local, conn.0), Arc::downgrade(&child.inner));
    Some(child)
}

/// Hands the events of a device's CM to the ids they concern (called by the engine with no
/// lock held). Returns the event when no rdma_cm id is behind it (the CM is driven directly).
pub(crate) fn dispatch(engine: &Arc<dyn Provider>, ev: ProtoEvent) -> Option<ProtoEvent> {
    let local = engine.local().ip();
    let listened = |sid: u64| registry().listeners.contains_key(&(local, sid));
    let ours = match &ev {
        ProtoEvent::ReqReceived { req, .. } => listened(req.service_id),
        ProtoEvent::SidrReqReceived { service_id, .. } => listened(*service_id),
        ProtoEvent::RepReceived { id, .. }
        | ProtoEvent::Established { id, .. }
        | ProtoEvent::Rejected { id, .. }
        | ProtoEvent::Unreachable { id }
        | ProtoEvent::Refused { id }
        | ProtoEvent::DisconnectRequested { id, .. }
        | ProtoEvent::Disconnected { id }
        | ProtoEvent::TimewaitExit { id }
        | ProtoEvent::SidrRepReceived { id, .. } => find_conn(local, *id).is_some(),
        ProtoEvent::MraReceived { .. } => false,
    };
    if !ours {
        return Some(ev);
    }
    match ev {
        ProtoEvent::ReqReceived { id, src, req } => on_req(engine, id, src, req),
        ProtoEvent::SidrReqReceived {
            id,
            src,
            service_id,
            private_data,
            ..
        } => {
            let reject = |status| {
                engine.with_cm(|g, now| {
                    let _ = g.cm.sidr_reply(now, id, status, 0, 0, &[]);
                });
            };
            let refused = || {
                if service_listened(local, service_id) {
                    SidrStatus::Reject
                } else {
                    SidrStatus::Unsupported
                }
            };
            let Ok((hdr, user)) = CmaHeaderRepr::parse_private_data(&private_data) else {
                reject(refused());
                return None;
            };
            let Some(listener) = find_listener(local, service_id, hdr.dst_addr) else {
                reject(refused());
                return None;
            };
            if over_backlog(&listener, engine, id) {
                return None;
            }
            let Some(child) = child_of(&listener, engine, id, SocketAddr::new(src, hdr.src_port))
            else {
                reject(SidrStatus::NoQp);
                return None;
            };
            let ud = UdParam {
                private_data: user.to_vec(),
                ah_attr: AhAttr::for_ip(src),
                qp_num: 0,
                qkey: 0,
            };
            let mut ev = CmEvent::new(
                CmEventType::ConnectRequest,
                0,
                child.clone(),
                None,
                ConnParam::default(),
            );
            ev.ud = Some(ud);
            post_request(&listener, ev);
        }
        ProtoEvent::SidrRepReceived {
            id,
            status,
            qpn,
            qkey,
            private_data,
        } => {
            let cid = find_conn(local, id)?;
            let peer = {
                let mut s = cid.inner.lock();
                s.conn = None;
                if status == SidrStatus::Success {
                    s.state = IdState::Established;
                } else {
                    s.state = IdState::RouteResolved;
                }
                s.dst
            };
            registry().conns.remove(&(local, id.0));
            let peer = peer?;
            if status == SidrStatus::Success {
                let ud = UdParam {
                    private_data,
                    ah_attr: AhAttr::for_ip(peer.ip()),
                    qp_num: qpn,
                    qkey,
                };
                cid.post_ud(CmEventType::Established, 0, ud, None);
            } else {
                let ud = UdParam {
                    private_data,
                    ..Default::default()
                };
                cid.post_ud(
                    CmEventType::Unreachable,
                    i32::from(status.to_u8()),
                    ud,
                    None,
                );
            }
        }
        ProtoEvent::RepReceived { id, rep } => {
            on_rep(engine, id, &rep);
        }
        ProtoEvent::Established { id, private_data } => {
            if let Some(cid) = find_conn(local, id) {
                cid.inner.lock().state = IdState::Established;
                let p = param_from(&private_data, 0, 0, 0, 0, false, 0);
                cid.post(CmEventType::Established, 0, p, None);
            }
        }
        ProtoEvent::Rejected {
            id,
            reason,
            private_data,
        } => {
            if let Some(cid) = find_conn(local, id) {
                let p = param_from(&private_data, 0, 0, 0, 0, false, 0);
                end_connection(&cid, CmEventType::Rejected, i32::from(reason.to_u16()), p);
            }
        }
        ProtoEvent::Unreachable { id } | ProtoEvent::Refused { id } => {
            // No answer at all: -ETIMEDOUT, as Linux rdma_cm reports it; the peer's host
            // said no device listens there: -ECONNREFUSED at once.
            let status = if matches!(ev, ProtoEvent::Refused { .. }) {
                -libc::ECONNREFUSED
            } else {
                -libc::ETIMEDOUT
            };
            if let Some(cid) = find_conn(local, id) {
                let ud = {
                    let mut s = cid.inner.lock();
                    if let Some(qp) = &s.qp {
                        if qp.qp_type() != QpType::Ud {
                            qp_to_err(qp);
                        }
                    }
                    let ud = cid.inner.qp_type == QpType::Ud;
                    s.state = if ud {
                        IdState::RouteResolved
                    } else {
                        IdState::Disconnected
                    };
                    if ud {
                        s.conn = None;
                    }
                    ud
                };
                if ud {
                    registry().conns.remove(&(local, id.0));
                }
                cid.post(CmEventType::Unreachable, status, ConnParam::default(), None);
            }
        }
        ProtoEvent::DisconnectRequested { id, .. } | ProtoEvent::Disconnected { id } => {
            if let Some(cid) = find_conn(local, id) {
                end_connection(&cid, CmEventType::Disconnected, 0, ConnParam::default());
            }
        }
        ProtoEvent::TimewaitExit { id } => {
            if let Some(cid) = find_conn(local, id) {
                cid.post(CmEventType::TimewaitExit, 0, ConnParam::default(), None);
            }
        }
        ProtoEvent::MraReceived { .. } => {}
    }
    None
}

/// The connection of `cid` ended (rejected, or disconnected by either side): its QP goes to
/// ERR and `event` is posted — unless a local CONNECT_ERROR came first, as librdmacm swallows
/// it. The event is posted under the id's lock, with the state change, so that
/// `rdma_disconnect` finds either a connected id or one whose event is already queued.
fn end_connection(cid: &CmId, event: CmEventType, status: i32, param: ConnParam) {
    // What the peer sent before this message reaches the QP first: the CM runs on the
    // device's queue 0, the QP's packets may come in on another receive queue.
    let qp = cid.inner.lock().qp.clone();
    if let Some(qp) = qp {
        qp.inner.drain_own_queue();
    }
    let mut s = cid.inner.lock();
    s.state = IdState::Disconnected;
    if let Some(qp) = &s.qp {
        qp_to_err(qp);
    }
    if !s.conn_error {
        let mut ev = CmEvent::new(event, status, cid.clone(), None, param);
        // The peer's last messages are polled before the program learns that it left (see
        // `RecvHold`).
        if event == CmEventType::Disconnected {
            ev.hold = s.qp.as_ref().and_then(|q| RecvHold::of(q));
        }
        cid.post_ev(ev, None);
    }
}

fn on_req(engine: &Arc<dyn Provider>, id: ConnId, src: IpAddr, req: Box<ReqInfo>) {
    let local = engine.local().ip();
    let reject = |reason| {
        engine.with_cm(|g, now| {
            let _ = g.cm.reject(now, id, reason, &[]);
        });
    };
    let refused = || {
        if service_listened(local, req.service_id) {
            RejectReason::ConsumerDefined
        } else {
            RejectReason::InvalidServiceId
        }
    };
    let Ok((hdr, user)) = CmaHeaderRepr::parse_private_data(&req.private_data) else {
        reject(refused());
        return;
    };
    let Some(listener) = find_listener(local, req.service_id, hdr.dst_addr) else {
        reject(refused());
        return;
    };
    if listener.inner.qp_type == QpType::Ud {
        reject(RejectReason::ConsumerDefined);
        return;
    }
    if over_backlog(&listener, engine, id) {
        return;
    }
    let Some(child) = child_of(&listener, engine, id, SocketAddr::new(src, hdr.src_port)) else {
        reject(RejectReason::NoResources);
        return;
    };
    {
        let mut s = child.inner.lock();
        let mtu =
            Mtu::from_raw(u32::from(req.path_mtu)).map_or(s.path_mtu, |m| mtu_min(m, s.path_mtu));
        s.neg = Some(Neg {
            remote_qpn: req.remote_qpn,
            remote_psn: req.starting_psn,
            mtu,
            resp: req.responder_resources,
            init: req.initiator_depth,
            timeout: req.qp_timeout,
            retry: req.retry_count,
            rnr: req.rnr_retry_count,
        });
        s.req = Some(req.clone());
    }
    let p = param_from(
        user,
        req.responder_resources,
        req.initiator_depth,
        req.retry_count,
        req.rnr_retry_count,
        req.srq,
        req.remote_qpn,
    );
    let ev = CmEvent::new(CmEventType::ConnectRequest, 0, child.clone(), None, p);
    post_request(&listener, ev);
}

fn on_rep(engine: &Arc<dyn Provider>, id: ConnId, rep: &RepInfo) -> Option<ProtoEvent> {
    let cid = find_conn(engine.local().ip(), id)?;
    let mut s = cid.inner.lock();
    let retry = s.conn_param.retry_count;
    s.neg = Some(Neg {
        remote_qpn: rep.remote_qpn,
        remote_psn: rep.starting_psn,
        mtu: s.path_mtu,
        resp: rep.responder_resources,
        init: rep.initiator_depth,
        timeout: rep.qp_timeout,
        retry,
        rnr: rep.rnr_retry_count,
    });
    let p = param_from(
        &rep.private_data,
        rep.responder_resources,
        rep.initiator_depth,
        retry,
        rep.rnr_retry_count,
        rep.srq,
        rep.remote_qpn,
    );
    if s.qp.is_none() {
        drop(s);
        cid.post(CmEventType::ConnectResponse, 0, p, None);
        return None;
    }
    let r = cid.qp_to_rts(&s);
    if r.is_ok() {
        s.state = IdState::Established;
    } else {
        s.conn_error = true;
        s.state = IdState::Disconnected;
        if let Some(qp) = &s.qp {
            qp_to_err(qp);
        }
    }
    let qp = s.qp.clone();
    drop(s);
    let r = r.and_then(|()| {
        engine
            .with_cm(|g, now| g.cm.send_rtu(now, id, &[]))
            .map_err(|e| Error::invalid(format!("{e:?}")))
    });
    match r {
        Ok(()) => cid.post(CmEventType::Established, 0, p, None),
        Err(e) => {
            {
                let mut s = cid.inner.lock();
                s.conn_error = true;
                s.state = IdState::Disconnected;
            }
            if let Some(qp) = &qp {
                qp_to_err(qp);
            }
            engine.with_cm(|g, now| {
                let _ = g.cm.reject(now, id, RejectReason::ConsumerDefined, &[]);
            });
            cid.post(CmEventType::ConnectError, -e.errno(), p, None);
        }
    }
    None
}
