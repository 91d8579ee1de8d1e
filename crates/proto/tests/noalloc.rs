//! The data path allocates nothing per message: two RC QPs back to back in memory, SENDs and
//! RDMA WRITEs with one-entry lists or small inline data, heap allocations counted by a global
//! allocator once the queues have grown to their steady size; and the same with every packet
//! sealed by one sans-IO device and checked and routed by another, their timer tables set
//! after every drive.

use softrdma_proto::device::{Device, DeviceConfig, Received};
use softrdma_proto::transport::{InlineData, Qp, WcStatus};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The system allocator, counting allocations (and reallocations) per thread.
struct Counting;

thread_local! {
    /// Allocations made by this thread (the test harness's own threads do not count).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Counts one allocation of the calling thread.
fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

/// This thread's allocations so far.
fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[path = "common/mem_pair.rs"]
mod mem_pair;
use mem_pair::{config, request, MemEnv, META};

/// Posts `batch` messages of `len` bytes (SEND, or RDMA WRITE when `write`; their data
/// copied at post time, as `IBV_SEND_INLINE` does, when `inline`), moves every packet both
/// ways and reaps every completion, checking they all succeeded.
fn round(
    qps: &mut [(Qp, MemEnv); 2],
    now: &mut Instant,
    buf: &mut [u8],
    (write, len, batch, inline): (bool, u32, u64, bool),
) {
    *now += Duration::from_micros(1);
    let [(a, ea), (b, eb)] = qps;
    for i in 0..batch {
        let mut r = request(i, write, len);
        if inline {
            r.inline = Some(InlineData::zeroed(len as usize));
        }
        assert!(a.post_send(r).is_ok(), "send queue full");
    }
    loop {
        let mut moved = 0;
        while let Some(t) = a.poll_transmit(*now, buf, ea) {
            b.handle_packet(*now, &buf[..t.len], &META, eb);
            moved += 1;
        }
        while let Some(t) = b.poll_transmit(*now, buf, eb) {
            a.handle_packet(*now, &buf[..t.len], &META, ea);
            moved += 1;
        }
        if moved == 0 {
            break;
        }
    }
    let mut done = 0;
    for qp in [a, b] {
        while let Some(c) = qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            done += 1;
        }
    }
    assert_eq!(done, if write { batch } else { 2 * batch });
}

/// The device of QP `i` (0x11 or 0x22), both at port 4791.
fn addr(i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + i as u8)), 4791)
}

/// Moves the packets QP `from` has to send through its device (sealed) and the other's
/// (checked, routed) into the other QP; sets both QPs' deadlines. Returns the packets moved.
fn move_via_devices(
    qps: &mut [(Qp, MemEnv); 2],
    devs: &mut [Device<usize>; 2],
    from: usize,
    now: Instant,
    buf: &mut [u8],
) -> usize {
    let to = 1 - from;
    let mut moved = 0;
    loop {
        let (qp, env) = &mut qps[from];
        let Some(t) = qp.poll_transmit(now, buf, env) else {
            break;
        };
        devs[from].seal(addr(to).ip(), &mut buf[..t.len]).unwrap();
        match devs[to].handle_datagram(now, addr(from), addr(to).ip(), &buf[..t.len]) {
            Received::Qp {
                handle,
                packet,
                meta,
                ..
            } => {
                let (qp, env) = &mut qps[handle];
                qp.handle_packet(now, packet, &meta, env);
            }
            other => panic!("not routed: {other:?}"),
        }
        moved += 1;
    }
    for i in 0..2 {
        let qp = &qps[i].0;
        devs[i].set_timer(qp.config().qp_num, qp.poll_timeout());
    }
    moved
}

/// [`round`] through two devices.
fn round_via_devices(
    qps: &mut [(Qp, MemEnv); 2],
    devs: &mut [Device<usize>; 2],
    now: &mut Instant,
    buf: &mut [u8],
    due: &mut Vec<u32>,
    (write, len, batch, inline): (bool, u32, u64, bool),
) {
    *now += Duration::from_micros(1);
    for i in 0..batch {
        let mut r = request(i, write, len);
        if inline {
            r.inline = Some(InlineData::zeroed(len as usize));
        }
        assert!(qps[0].0.post_send(r).is_ok(), "send queue full");
    }
    while move_via_devices(qps, devs, 0, *now, buf) + move_via_devices(qps, devs, 1, *now, buf) > 0
    {
    }
    for d in devs.iter_mut() {
        due.clear();
        d.handle_timeout(*now, due);
    }
    let mut done = 0;
    for (qp, _) in qps.iter_mut() {
        while let Some(c) = qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            done += 1;
        }
    }
    assert_eq!(done, if write { batch } else { 2 * batch });
}

#[test]
fn steady_state_messages_through_devices_do_not_allocate() {
    let env = MemEnv::new;
    let mut qps = [
        (Qp::new(config(0x11, 0x22)), env()),
        (Qp::new(config(0x22, 0x11)), env()),
    ];
    let mut devs = [0, 1].map(|i| {
        let mut d = Device::new(DeviceConfig::new(addr(i).ip()));
        d.register(qps[i].0.config().qp_num, i);
        d
    });
    let mut now = Instant::now();
    let mut buf = vec![0u8; 4096 + 128];
    let mut due = Vec::new();
    let cases = [
        (false, 8, 1, false),
        (false, 8, 32, false),
        (true, 64, 8, true),
        (false, 4096, 32, false),
        (true, 65536, 1, false),
    ];
    for _ in 0..8 {
        for &case in &cases {
            round_via_devices(&mut qps, &mut devs, &mut now, &mut buf, &mut due, case);
        }
    }
    let before = allocs();
    for _ in 0..16 {
        for &case in &cases {
            round_via_devices(&mut qps, &mut devs, &mut now, &mut buf, &mut due, case);
        }
    }
    assert_eq!(allocs() - before, 0, "heap allocations");
    assert!(devs[1].counters().rx_packets > 1000);
    assert_eq!(devs[1].counters().icrc_errors, 0);
}

#[test]
fn steady_state_messages_do_not_allocate() {
    let env = MemEnv::new;
    let mut qps = [
        (Qp::new(config(0x11, 0x22)), env()),
        (Qp::new(config(0x22, 0x11)), env()),
    ];
    let mut now = Instant::now();
    let mut buf = vec![0u8; 4096 + 128];
    let cases = [
        (false, 8, 1, false),
        (false, 8, 32, false),
        (false, 8, 32, true),
        (true, 64, 8, true),
        (false, 4096, 32, false),
        (true, 65536, 1, false),
    ];
    // Let every queue grow to the size these rounds need.
    for _ in 0..8 {
        for &case in &cases {
            round(&mut qps, &mut now, &mut buf, case);
        }
    }
    let before = allocs();
    for _ in 0..16 {
        for &case in &cases {
            round(&mut qps, &mut now, &mut buf, case);
        }
    }
    assert_eq!(allocs() - before, 0, "heap allocations");
    // The counter does see this thread's allocations.
    std::hint::black_box(vec![0u8; 16]);
    assert_eq!(allocs() - before, 1);
}
