//! A connected pair of QPs on two loopback devices, for the live tests.
#![allow(dead_code)]

use softrdma::*;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sets the environment variable `$name` to `$value` for the whole test binary, before
/// `main` (an `.init_array` entry, run while the process has one thread), so that every device
/// it opens sees it.
#[macro_export]
macro_rules! preset_env {
    ($name:literal, $value:literal) => {
        const _: () = {
            extern "C" fn preset() {
                // SAFETY: NUL-terminated strings; no other thread exists yet to read the
                // environment.
                unsafe {
                    libc::setenv(
                        concat!($name, "\0").as_ptr().cast(),
                        concat!($value, "\0").as_ptr().cast(),
                        1,
                    )
                };
            }
            #[used]
            #[link_section = ".init_array"]
            static PRESET: extern "C" fn() = preset;
        };
    };
}

pub const ALL: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits()
    | AccessFlags::REMOTE_ATOMIC.bits();

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One side of a connection: context, PD, CQ, QP and a registered buffer.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub buf: Arc<Buffer>,
    pub mr: Mr,
    pub addr: IpAddr,
}

impl Side {
    pub fn new(addr: &str, qp_type: QpType, len: usize, srq: bool) -> (Side, Option<Srq>) {
        let addr = ip(addr);
        let ctx = Device::from_addr(addr).unwrap().open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096, 0, None, 0).unwrap();
        let srq = srq.then(|| {
            pd.create_srq(&mut SrqInitAttr {
                srq_context: 0,
                attr: SrqAttr {
                    max_wr: 1024,
                    max_sge: 4,
                    srq_limit: 0,
                },
            })
            .unwrap()
        });
        let mut init = QpInitAttr::new(
            qp_type,
            &cq,
            QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
        );
        init.srq = srq.as_ref();
        let qp = pd.create_qp(&mut init).unwrap();
        let buf = Arc::new(Buffer::new(len));
        let mr = pd.reg_buffer(&buf, ALL).unwrap();
        (
            Side {
                ctx,
                pd,
                cq,
                qp,
                buf,
                mr,
                addr,
            },
            srq,
        )
    }

    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    pub fn post_recv(&self, wr_id: u64, off: usize, len: usize) {
        let sge = [self.sge(off, len)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: &sge,
            }])
            .unwrap();
    }

    /// Polls until `n` completions arrived (or fails after a generous deadline: a hang is a
    /// bug, not slowness; the figure is not a performance assertion).
    pub fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut wc = [WorkCompletion::default(); 32];
        while out.len() < n {
            let k = self.cq.poll(&mut wc).unwrap();
            out.extend_from_slice(&wc[..k]);
            if k == 0 {
                assert!(
                    Instant::now() < deadline,
                    "completions did not arrive: {out:?}"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        out
    }
}

pub struct Opts {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub mtu: Mtu,
    pub access: u32,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            mtu: Mtu::Mtu1024,
            access: (AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC)
                .bits(),
        }
    }
}

pub fn connect(a: &Side, b: &Side, o: &Opts) {
    for (me, peer) in [(a, b), (b, a)] {
        to_rtr(me, peer.addr, peer.qp.qp_num(), o);
    }
    for me in [a, b] {
        to_rts(me, o);
    }
}

/// RESET -> INIT -> RTR for `me`'s QP, its peer QP `peer_qpn` of the device at `peer`.
pub fn to_rtr(me: &Side, peer: IpAddr, peer_qpn: u32, o: &Opts) {
    qp_to_rtr(&me.qp, peer, peer_qpn, o);
}

/// RESET -> INIT -> RTR for `qp`, its peer QP `peer_qpn` of the device at `peer`.
pub fn qp_to_rtr(qp: &Qp, peer: IpAddr, peer_qpn: u32, o: &Opts) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: 0x1111,
        ..Default::default()
    };
    let ud = qp.qp_type() == QpType::Ud;
    let m = if ud {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY
    } else {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    };
    qp.modify_qp(&init, m.bits()).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::for_ip(peer),
        path_mtu: o.mtu,
        dest_qp_num: peer_qpn,
        rq_psn: peer_qpn & 0xff_ffff ^ 0x5a5a5a,
        max_dest_rd_atomic: 16,
        min_rnr_timer: o.min_rnr_timer,
        ..init
    };
    let m = match qp.qp_type() {
        QpType::Ud => QpAttrMask::STATE,
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        _ => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
    };
    qp.modify_qp(&rtr, m.bits()).unwrap();
}

/// RTR -> RTS for `me`'s QP, with the timers and retries of `o`.
pub fn to_rts(me: &Side, o: &Opts) {
    qp_to_rts(&me.qp, o);
}

/// RTR -> RTS for `qp`, with the timers and retries of `o`.
pub fn qp_to_rts(qp: &Qp, o: &Opts) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: qp.qp_num() & 0xff_ffff ^ 0x5a5a5a,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: 16,
        ..Default::default()
    };
    let m = match qp.qp_type() {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    qp.modify_qp(&rts, m.bits()).unwrap();
}

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text.
pub fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

/// This test binary's two shared device addresses (loopback addresses of its own).
pub fn pair_addrs() -> &'static (String, String) {
    static ADDRS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    ADDRS.get_or_init(|| (unique(), unique()))
}

/// A connected pair on this binary's two shared devices ([`pair_addrs`]). Devices are
/// shared by the tests of this process and QPs are independent, so tests run in parallel on
/// the same two devices — except the tests that change a device (fault injection), which
/// have their own pair (faults are per device).
pub fn pair(qp_type: QpType, len: usize, o: &Opts) -> (Side, Side) {
    let (x, y) = pair_addrs();
    pair_on(x, y, qp_type, len, o)
}

pub fn pair_on(x: &str, y: &str, qp_type: QpType, len: usize, o: &Opts) -> (Side, Side) {
    let (a, _) = Side::new(x, qp_type, len, false);
    let (b, _) = Side::new(y, qp_type, len, false);
    connect(&a, &b, o);
    (a, b)
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn send<'a>(
    a: &Side,
    wr_id: u64,
    op: WrOpcode,
    sges: &'a [Sge],
    f: impl FnOnce(&mut SendWr<'a>),
) {
    let mut wr = SendWr {
        wr_id,
        sg_list: sges,
        opcode: op,
        send_flags: SendFlags::SIGNALED,
        ..Default::default()
    };
    f(&mut wr);
    a.qp.post_send(&[wr]).unwrap();
}

impl Side {
    pub fn wait_none(&self) -> bool {
        std::thread::sleep(Duration::from_millis(20));
        self.cq.poll(&mut [WorkCompletion::default(); 4]).unwrap() == 0
    }
}

/// A's RDMA `op` of `len` bytes from (or into) its own buffer at B's `addr` under `rkey`;
/// its status.
pub fn rdma(a: &Side, op: WrOpcode, addr: u64, rkey: u32, len: usize) -> WcStatus {
    send(a, 5, op, &[a.sge(0, len)], |w| {
        w.remote_addr = addr;
        w.rkey = rkey;
    });
    a.wait(1)[0].status
}
