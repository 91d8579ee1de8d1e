//! `rdma_create_ep` / `rdma_destroy_ep`, and the asynchronous address lookup
//! `rdma_resolve_addrinfo` / `rdma_query_addrinfo`.

use super::{getaddrinfo, AddrInfo, AddrInfoHints, CmEventType, CmId, CmQpInitAttr, RAI_PASSIVE};
use crate::error::{Error, ErrorKind, Result};
use crate::Pd;
use std::sync::Arc;

/// How long `rdma_create_ep` gives address and route resolution, as librdmacm does.
const EP_TIMEOUT_MS: u32 = 2000;

impl CmId {
    /// Creates a synchronous id from an address lookup's result (`rdma_create_ep`).
    ///
    /// Active (`res` without `RAI_PASSIVE`): resolves the address and the route to
    /// `ai_dst_addr` (from `ai_src_addr` if given) and, with `qp_init_attr`, creates the QP
    /// (its type becomes `ai_qp_type`); `ai_connect` data go before the private data of the
    /// later [`CmId::connect`]. Passive: binds to `ai_src_addr` and keeps `pd` and
    /// `qp_init_attr`, so that [`CmId::get_request`] gives each new id its QP.
    ///
    /// Fails with `EINVAL` when an active `res` has no destination or a passive one no
    /// source address, and like [`CmId::bind_addr`], [`CmId::resolve_addr`] (the errno of
    /// ADDR_ERROR), [`CmId::resolve_route`] and [`CmId::create_qp_ex`]; the id is destroyed
    /// on failure.
    pub fn create_ep(
        res: &AddrInfo,
        pd: Option<&Arc<Pd>>,
        qp_init_attr: Option<&mut CmQpInitAttr>,
    ) -> Result<CmId> {
        let id = CmId::create_typed(None, 0, res.ai_port_space, res.ai_qp_type)?;
        let r = (|| {
            if res.ai_flags & RAI_PASSIVE != 0 {
                let src = res
                    .ai_src_addr
                    .ok_or_else(|| Error::invalid("a passive rdma_addrinfo needs ai_src_addr"))?;
                id.bind_addr(src)?;
                let mut s = id.inner.lock();
                s.ep_attr = qp_init_attr.map(|a| {
                    a.qp_type = Some(res.ai_qp_type);
                    (pd.cloned(), a.clone())
                });
                return Ok(());
            }
            let dst = res
                .ai_dst_addr
                .ok_or_else(|| Error::invalid("an active rdma_addrinfo needs ai_dst_addr"))?;
            id.resolve_addr(res.ai_src_addr, dst, EP_TIMEOUT_MS)?;
            id.resolve_route(EP_TIMEOUT_MS)?;
            id.inner.lock().connect_data = res.ai_connect.clone();
            if let Some(a) = qp_init_attr {
                a.qp_type = Some(res.ai_qp_type);
                id.create_qp_ex(pd, a)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok(id),
            Err(e) => {
                id.destroy_qp();
                id.destroy();
                Err(e)
            }
        }
    }

    /// Destroys an id made by [`CmId::create_ep`] (or any id) with its QP, its SRQ and the
    /// CQs and channels the connection manager made (`rdma_destroy_ep`).
    pub fn destroy_ep(self) {
        self.destroy_qp();
        self.destroy_srq();
        self.destroy();
    }

    /// Looks up `node`/`service` for this id in the background (`rdma_resolve_addrinfo`):
    /// ADDRINFO_RESOLVED follows (fetch the result with [`CmId::query_addrinfo`]), or
    /// ADDRINFO_ERROR with a negative errno (`-EADDRNOTAVAIL` when the name does not
    /// resolve). A synchronous id waits for it.
    ///
    /// Fails with `EINVAL` when neither node nor service is given, or the lookup's event
    /// reports an error on a synchronous id.
    pub fn resolve_addrinfo(
        &self,
        node: Option<&str>,
        service: Option<&str>,
        hints: Option<&AddrInfoHints>,
    ) -> Result<()> {
        if node.is_none() && service.is_none() {
            return Err(Error::invalid(
                "rdma_resolve_addrinfo needs a node or a service",
            ));
        }
        let me = self.clone();
        let node = node.map(str::to_owned);
        let service = service.map(str::to_owned);
        let hints = hints.cloned();
        let work = move || match getaddrinfo(node.as_deref(), service.as_deref(), hints.as_ref()) {
            Ok(list) => {
                *me.inner.addrinfo.lock().unwrap_or_else(|p| p.into_inner()) = Some(list);
                me.post(CmEventType::AddrinfoResolved, 0, Default::default(), None);
            }
            Err(e) => {
                let errno = e.errno().unwrap_or(libc::EADDRNOTAVAIL);
                me.post(CmEventType::AddrinfoError, -errno, Default::default(), None);
            }
        };
        if self.is_sync() {
            work();
        } else {
            crate::provider::spawn_quiet("rdma_resolve_addrinfo".into(), work)
                .map_err(|e| Error::from_io(e, "starting the lookup"))?;
        }
        self.complete(CmEventType::AddrinfoResolved)
    }

    /// The result of the last [`CmId::resolve_addrinfo`] (`rdma_query_addrinfo`).
    ///
    /// Fails with `ENODATA` when no lookup has completed.
    pub fn query_addrinfo(&self) -> Result<Vec<AddrInfo>> {
        self.inner
            .addrinfo
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::new(ErrorKind::NoData, "no address lookup has completed"))
    }
}
