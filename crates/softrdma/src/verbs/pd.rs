//! Protection domains (`ibv_alloc_pd`, `ibv_dealloc_pd`).

use crate::error::{DestroyError, Error, Result};
use crate::verbs::context::{Context, ContextInner};
use crate::verbs::hold::{users_of, Counted, Hold};
use crate::verbs::resources::DeviceShared;
use crate::verbs::resources::{CountGuard, Kind, Resources};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// A protection domain (`struct ibv_pd`): memory regions, QPs, SRQs and address handles
/// created in one PD can only be used with each other.
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pub(crate) id: u32,
    pub(crate) ctx: Hold<ContextInner>,
    users: AtomicUsize,
    _count: CountGuard,
}

impl Counted for PdInner {
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

impl PdInner {
    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.ctx.shared
    }
}

static NEXT_PD_ID: AtomicU32 = AtomicU32::new(1);

impl Context {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// Fails with `ENOMEM` when the device already has `max_pd` PDs.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let count = Resources::acquire(&self.inner.shared, Kind::Pd)?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                id: NEXT_PD_ID.fetch_add(1, Ordering::Relaxed),
                ctx: Hold::new(&self.inner),
                users: AtomicUsize::new(0),
                _count: count,
            }),
        })
    }
}

impl Pd {
    /// Deallocates the PD (`ibv_dealloc_pd`).
    ///
    /// Fails with `EBUSY`, giving the PD back, while a memory region, QP, SRQ or address handle
    /// created in it still exists.
    pub fn dealloc(self) -> std::result::Result<(), DestroyError<Pd>> {
        let n = users_of(&*self.inner);
        if n != 0 {
            return Err(DestroyError {
                object: self,
                error: Error::busy(format!(
                    "the PD is still used by {n} memory region(s), QP(s), SRQ(s) or address handle(s)"
                )),
            });
        }
        Ok(())
    }

    /// Whether a memory region, QP, SRQ or address handle created in the PD still exists:
    /// what makes [`Pd::dealloc`] fail with `EBUSY`. Never fails.
    pub fn in_use(&self) -> bool {
        users_of(&*self.inner) != 0
    }

    /// The device context the PD belongs to.
    pub fn device(&self) -> &crate::Device {
        &self.inner.shared().device
    }

    /// Whether `self` and `other` are the same PD.
    pub fn same_as(&self, other: &Pd) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("id", &self.inner.id)
            .field("device", self.device())
            .finish()
    }
}
