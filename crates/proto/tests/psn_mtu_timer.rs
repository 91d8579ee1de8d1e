//! Tests of PSN arithmetic, MTU derivation and IBA time encodings.

use core::cmp::Ordering;
use core::time::Duration;

use proptest::prelude::*;
use softrdma_proto::mtu::{ROCE_PATH_MTU_OVERHEAD, RXE_PORT_MTU_OVERHEAD};
use softrdma_proto::{
    cm_timeout, cm_timeout_ms_linux, cmp_psn, local_ack_timeout, rnr_timer, Mtu, Psn, MAX_PSN,
    RNR_TIMER_USEC,
};

/// rxe's `psn_compare`, transcribed as the notes give it.
fn rxe_psn_compare(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32
}

#[test]
fn psn_new_masks_and_wraps() {
    assert_eq!(MAX_PSN, 0xFF_FFFF);
    assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
    assert_eq!(Psn::new(MAX_PSN).next(), Psn::ZERO);
    assert_eq!(Psn::ZERO.prev(), Psn::MAX);
    assert_eq!(Psn::new(0xFF_FFF0).add(0x20), Psn::new(0x10));
    assert_eq!(Psn::new(0x10).sub(0x20), Psn::new(0xFF_FFF0));
    assert_eq!(Psn::new(5).add(1 << 24), Psn::new(5));
    assert_eq!(Psn::new(5).add(u32::MAX), Psn::new(4));
    assert_eq!(u32::from(Psn::new(7)), 7);
    assert_eq!(Psn::new(0x12_3456).to_string(), "0x123456");
    assert_eq!(Psn::new(1).to_string(), "0x000001");
}

#[test]
fn psn_distance() {
    assert_eq!(Psn::new(10).distance_to(Psn::new(15)), 5);
    assert_eq!(Psn::MAX.distance_to(Psn::ZERO), 1);
    assert_eq!(Psn::new(0xFF_FFFE).distance_to(Psn::new(3)), 5);
    assert_eq!(Psn::new(3).distance_to(Psn::new(3)), 0);
    assert_eq!(Psn::new(1).distance_to(Psn::ZERO), MAX_PSN);
}

#[test]
fn psn_compare_across_wrap() {
    let max = Psn::MAX;
    let zero = Psn::ZERO;
    assert_eq!(cmp_psn(max, zero), Ordering::Less);
    assert_eq!(cmp_psn(zero, max), Ordering::Greater);
    assert!(max.is_before(zero));
    assert!(zero.is_after(max));
    assert!(max.is_before_or_eq(zero));
    assert!(zero.is_after_or_eq(max));
    assert_eq!(max.diff(zero), -1);
    assert_eq!(zero.diff(max), 1);
    assert_eq!(cmp_psn(Psn::new(7), Psn::new(7)), Ordering::Equal);
    assert!(Psn::new(7).is_before_or_eq(Psn::new(7)));
    assert!(Psn::new(7).is_after_or_eq(Psn::new(7)));
    assert!(!Psn::new(7).is_before(Psn::new(7)));
    // Half window: just under 2^23 ahead is "after".
    assert!(Psn::new(0x7F_FFFF).is_after(zero));
    assert!(Psn::new(0x80_0001).is_before(zero));
    // Exactly 2^23 apart: both compare as before the other (why Psn is not Ord).
    let half = Psn::new(0x80_0000);
    assert_eq!(cmp_psn(half, zero), Ordering::Less);
    assert_eq!(cmp_psn(zero, half), Ordering::Less);
    assert_eq!(half.diff(zero), -(1 << 23));
    assert_eq!(Psn::new(10).cmp_psn(Psn::new(9)), Ordering::Greater);
}

proptest! {
    #[test]
    fn prop_psn_matches_rxe(a in 0u32..=MAX_PSN, b in 0u32..=MAX_PSN) {
        let (pa, pb) = (Psn::new(a), Psn::new(b));
        let r = rxe_psn_compare(a, b);
        prop_assert_eq!(cmp_psn(pa, pb), r.cmp(&0));
        prop_assert_eq!(pa.diff(pb), r >> 8);
        prop_assert_eq!(pa.is_before(pb), r < 0);
        prop_assert_eq!(pa.is_after(pb), r > 0);
        prop_assert_eq!(pb.add(pb.distance_to(pa)), pa);
    }

    #[test]
    fn prop_psn_add_sub(a in any::<u32>(), n in any::<u32>()) {
        let p = Psn::new(a);
        prop_assert!(p.add(n).value() <= MAX_PSN);
        prop_assert_eq!(p.add(n).sub(n), p);
        prop_assert_eq!(p.distance_to(p.add(n)), n & MAX_PSN);
        if n & MAX_PSN != 0 && n & MAX_PSN < 1 << 23 {
            prop_assert!(p.add(n).is_after(p));
            prop_assert!(p.is_before(p.add(n)));
        }
    }
}

#[test]
fn mtu_values() {
    let table = [
        (Mtu::Mtu256, 1, 256),
        (Mtu::Mtu512, 2, 512),
        (Mtu::Mtu1024, 3, 1024),
        (Mtu::Mtu2048, 4, 2048),
        (Mtu::Mtu4096, 5, 4096),
    ];
    for (m, raw, bytes) in table {
        assert_eq!(m.as_raw(), raw);
        assert_eq!(m.bytes(), bytes);
        assert_eq!(Mtu::from_raw(raw), Some(m));
        assert_eq!(Mtu::from_bytes(bytes), Some(m));
        assert_eq!(Mtu::floor_from_bytes(bytes), Some(m));
        assert_eq!(Mtu::floor_from_bytes(bytes * 2 - 1), Some(m));
        assert_eq!(m.to_string(), bytes.to_string());
    }
    assert_eq!(Mtu::ALL.len(), 5);
    assert_eq!(Mtu::from_raw(0), None);
    assert_eq!(Mtu::from_raw(6), None);
    assert_eq!(Mtu::from_bytes(1500), None);
    assert_eq!(Mtu::from_bytes(0), None);
    assert_eq!(Mtu::floor_from_bytes(255), None);
    assert_eq!(Mtu::floor_from_bytes(0), None);
    assert_eq!(Mtu::floor_from_bytes(u32::MAX), Some(Mtu::Mtu4096));
}

#[test]
fn mtu_from_link() {
    assert_eq!(ROCE_PATH_MTU_OVERHEAD, 96);
    assert_eq!(RXE_PORT_MTU_OVERHEAD, 80);
    assert_eq!(Mtu::for_link_mtu(1500), Some(Mtu::Mtu1024));
    assert_eq!(Mtu::for_link_mtu(9000), Some(Mtu::Mtu4096));
    assert_eq!(Mtu::for_link_mtu(65536), Some(Mtu::Mtu4096));
    assert_eq!(Mtu::for_link_mtu(200), None);
    assert_eq!(Mtu::for_link_mtu(0), None);
    assert_eq!(Mtu::for_link_mtu(351), None);
    assert_eq!(Mtu::for_link_mtu(352), Some(Mtu::Mtu256));
    assert_eq!(Mtu::for_link_mtu(4191), Some(Mtu::Mtu2048));
    assert_eq!(Mtu::for_link_mtu(4192), Some(Mtu::Mtu4096));
    // Where the two overheads differ.
    assert_eq!(Mtu::for_link_mtu(1110), Some(Mtu::Mtu512));
    assert_eq!(Mtu::port_active_mtu(1110), Some(Mtu::Mtu1024));
    assert_eq!(Mtu::port_active_mtu(1500), Some(Mtu::Mtu1024));
    assert_eq!(Mtu::port_active_mtu(9000), Some(Mtu::Mtu4096));
    assert_eq!(Mtu::port_active_mtu(335), None);
    assert_eq!(Mtu::port_active_mtu(336), Some(Mtu::Mtu256));
}

#[test]
fn ack_timeout() {
    assert_eq!(local_ack_timeout(0), None);
    assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
    assert_eq!(
        local_ack_timeout(14),
        Some(Duration::from_nanos(4096 << 14))
    );
    // 18 -> ~1.07 s
    assert_eq!(
        local_ack_timeout(18),
        Some(Duration::from_nanos(1_073_741_824))
    );
    assert_eq!(
        local_ack_timeout(31),
        Some(Duration::from_nanos(4096u64 << 31))
    );
    assert_eq!(local_ack_timeout(32), local_ack_timeout(31));
    assert_eq!(local_ack_timeout(255), local_ack_timeout(31));
}

#[test]
fn rnr_table() {
    assert_eq!(RNR_TIMER_USEC[0], 655_360);
    assert_eq!(RNR_TIMER_USEC[1], 10);
    assert_eq!(RNR_TIMER_USEC[12], 640);
    assert_eq!(RNR_TIMER_USEC[25], 61_440);
    assert_eq!(RNR_TIMER_USEC[31], 491_520);
    // Codes 1..=31 strictly increase.
    for w in RNR_TIMER_USEC[1..].windows(2) {
        assert!(w[0] < w[1], "{w:?}");
    }
    // From code 2 on the table goes 2x per two codes (x1.5 then x4/3).
    for c in 2..30 {
        assert_eq!(RNR_TIMER_USEC[c + 2], RNR_TIMER_USEC[c] * 2, "code {c}");
    }
    assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
    assert_eq!(rnr_timer(25), Duration::from_micros(61_440));
    assert_eq!(rnr_timer(0x20 | 3), Duration::from_micros(30));
}

#[test]
fn cm_timeouts() {
    assert_eq!(cm_timeout(0), Duration::from_nanos(4096));
    assert_eq!(cm_timeout(20), Duration::from_nanos(4096 << 20));
    assert_eq!(cm_timeout(40), cm_timeout(31));
    assert_eq!(cm_timeout_ms_linux(0), 1);
    assert_eq!(cm_timeout_ms_linux(8), 1);
    assert_eq!(cm_timeout_ms_linux(9), 2);
    assert_eq!(cm_timeout_ms_linux(18), 1024);
    assert_eq!(cm_timeout_ms_linux(20), 4096);
    assert_eq!(cm_timeout_ms_linux(22), 16384);
    assert_eq!(cm_timeout_ms_linux(24), 65536);
    assert_eq!(cm_timeout_ms_linux(31), 1 << 23);
    assert_eq!(cm_timeout_ms_linux(200), 1 << 23);
    assert_eq!(cm_timeout_ms_linux(255), 1 << 23);
    assert_eq!(cm_timeout(200), Duration::from_nanos(4096 << 31));
    // rdma_cm's CM response timeout (20) is Linux's 4096 ms.
    assert_eq!(
        cm_timeout_ms_linux(softrdma_wire::cma::CMA_CM_RESPONSE_TIMEOUT),
        4096
    );
    // The approximation is within a factor ~1.05 of the exact value from t = 8 on.
    for t in 8..=31u8 {
        let exact = cm_timeout(t).as_secs_f64() * 1000.0;
        let approx = cm_timeout_ms_linux(t) as f64;
        assert!(exact >= approx && exact / approx < 1.05, "t={t}");
    }
}
