//! The typed work requests cost nothing extra: building them allocates nothing, and posting
//! one allocates exactly what posting the same faithful request does (the same path).

use softrdma::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

/// Counts this thread's allocations (other threads, like a device engine, are not counted).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a plain thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (r, ALLOCS.with(Cell::get) - before)
}

#[test]
fn typed_requests_allocate_nothing_more_than_faithful_ones() {
    let pid = std::process::id();
    let addr = std::net::IpAddr::from([127, 79, (pid >> 8) as u8, pid as u8]);
    let ctx = Device::from_addr(addr).unwrap().open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_send_sge: 2,
        ..Default::default()
    };
    let qp = pd
        .create_qp(&mut QpInitAttr::new(QpType::Rc, &cq, cap))
        .unwrap();
    // In ERR a post runs every check and completes at once (flushed): the whole post path
    // without a peer.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    qp.modify_qp(&init, mask.bits()).unwrap();
    let to_err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    qp.modify_qp(&to_err, QpAttrMask::STATE.bits()).unwrap();
    let buf = Arc::new(Buffer::new(4096));
    let mr = pd
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .unwrap();
    let remote = RemoteMr {
        addr: 0x10000,
        len: 4096,
        rkey: 7,
    };

    // The counter counts.
    let (v, n) = allocs(|| vec![1u8; 3]);
    assert_eq!((v.len(), n), (3, 1));

    // Building typed requests allocates nothing.
    let (local, n) = allocs(|| [mr.slice(0..64).unwrap(), mr.slice(128..256).unwrap()]);
    assert_eq!(n, 0);
    let (_, n) = allocs(|| {
        let w = SendWr::write(1, &local, remote.slice(64..).unwrap())
            .unwrap()
            .signaled();
        let r = SendWr::read(2, &local, remote).unwrap();
        let s = SendWr::send(3, &local).with_imm(5);
        let word = mr.slice(8..16).unwrap();
        let f = SendWr::fetch_add(4, &word, remote.slice(8..16).unwrap(), 1).unwrap();
        let rc = RecvWr::new(5, &local);
        std::hint::black_box((w.opcode, r.opcode, s.opcode, f.opcode, rc.sg_list.len()));
    });
    assert_eq!(n, 0);

    // Posting: the same allocations as the faithful request it equals.
    let typed = SendWr::write(1, &local, remote).unwrap().signaled();
    let sges = [local[0].sge(), local[1].sge()];
    let faithful = SendWr {
        wr_id: 1,
        sg_list: &sges,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SendFlags::SIGNALED,
        remote_addr: remote.addr,
        rkey: remote.rkey,
        ..Default::default()
    };
    let mut wc = [WorkCompletion::default(); 4];
    for _ in 0..3 {
        // Warm up the CQ's queue, then compare.
        qp.post_send(&[faithful]).unwrap();
        qp.post_send(&[typed]).unwrap();
        while cq.poll(&mut wc).unwrap() > 0 {}
    }
    let (r, a) = allocs(|| qp.post_send(&[faithful]));
    r.unwrap();
    let (r, b) = allocs(|| qp.post_send(&[typed]));
    r.unwrap();
    assert_eq!(a, b, "typed and faithful posts allocate alike");
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 2);
    assert!(wc[..2]
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr && w.wr_id == 1));
}
