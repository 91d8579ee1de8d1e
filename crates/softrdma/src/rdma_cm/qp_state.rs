//! The QP moves the connection manager makes from several of its files (to a state, to
//! ERR) and the MTU rule of a path: below the registry and the dispatch, which use them too.

use crate::error::Result;
use crate::{Mtu, Qp, QpAttr, QpAttrMask, QpState};

/// The smaller of two MTUs.
pub(super) fn mtu_min(a: Mtu, b: Mtu) -> Mtu {
    if a.bytes() <= b.bytes() {
        a
    } else {
        b
    }
}

/// Moves `qp` as `am` says (the attributes of a transition, or why there are none).
pub(super) fn modify_to(qp: &Qp, am: Result<(QpAttr, QpAttrMask)>) -> Result<()> {
    let (a, m) = am?;
    qp.modify_qp(&a, m.bits())
}

/// Moves `qp` to ERR, flushing its work; never fails (a QP already gone stays so).
pub(super) fn qp_to_err(qp: &Qp) {
    let _ = qp.modify_qp(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        QpAttrMask::STATE.bits(),
    );
}
