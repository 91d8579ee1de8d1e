//! Helpers shared by the integration tests.
#![allow(dead_code)]

use softrdma::*;
use std::net::IpAddr;
use std::sync::Arc;

/// A loopback address no other process on this machine uses (see `softrdma::testing`).
pub fn unique_addr() -> IpAddr {
    softrdma::testing::unique_loopback_addr().into()
}

/// The same, as text (for `Side::new`, `SocketAddr` strings, program arguments).
pub fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

/// This test binary's own loopback device address, shared by the tests that need just one
/// device (as they once shared 127.0.0.1).
pub fn lo_addr() -> IpAddr {
    static ADDR: std::sync::OnceLock<IpAddr> = std::sync::OnceLock::new();
    *ADDR.get_or_init(unique_addr)
}

pub fn lo() -> Device {
    Device::from_addr(lo_addr()).expect("this binary's loopback device")
}

pub fn ctx() -> Context {
    lo().open().expect("open this binary's loopback device")
}

pub fn caps(wr: u32, sge: u32) -> QpCap {
    QpCap {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: 0,
    }
}

pub const RW: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits();

pub fn buffer_mr(pd: &Pd, len: usize) -> (Arc<Buffer>, Mr) {
    let b = Arc::new(Buffer::new(len));
    let mr = pd.reg_buffer(&b, RW).expect("reg_buffer");
    (b, mr)
}

/// Moves an RC/UC QP RESET → INIT → RTR → RTS with exactly the required attributes.
pub fn connect_rc(qp: &Qp, dest_qp: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: AccessFlags::REMOTE_WRITE.bits(),
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
            .bits(),
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr::for_ip(lo_addr());
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = dest_qp;
    a.rq_psn = 0x123;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    let mut m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    if qp.qp_type() == QpType::Rc {
        m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
    }
    qp.modify_qp(&a, m.bits()).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x456;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
    if qp.qp_type() == QpType::Rc {
        m |= QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    qp.modify_qp(&a, m.bits()).unwrap();
}

/// Moves a UD QP to RTS.
pub fn ud_to_rts(qp: &Qp, qkey: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    qp.modify_qp(
        &a,
        (QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).bits(),
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 1;
    qp.modify_qp(&a, (QpAttrMask::STATE | QpAttrMask::SQ_PSN).bits())
        .unwrap();
}

pub fn to_err(qp: &Qp) {
    let a = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap();
}

pub fn poll_all(cq: &Cq) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

pub fn fd_readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

pub fn set_nonblocking(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl on a descriptor the test owns through its object.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert!(fl >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
    }
}
