//! Random mixes of RC operations and sizes through the simulated network (proptest).

#[path = "common/sim_harness.rs"]
mod harness;

use harness::*;
use proptest::prelude::*;
use softrdma_proto::{Mtu, QpType};
use std::time::Duration;

const KINDS: [OpKind; 7] = [
    OpKind::Send,
    OpKind::SendImm,
    OpKind::Write,
    OpKind::WriteImm,
    OpKind::Read,
    OpKind::Faa,
    OpKind::Cas,
];

fn op() -> impl Strategy<Value = OpSpec> {
    (
        0..KINDS.len(),
        0u32..9000,
        1u8..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(k, len, nsge, signaled, inline, solicited)| {
            let kind = KINDS[k];
            let len = if matches!(kind, OpKind::Faa | OpKind::Cas) {
                8
            } else {
                len
            };
            OpSpec {
                kind,
                len,
                nsge,
                signaled,
                inline: inline && len <= 256,
                solicited,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn rc_random_mix(
        mut a in prop::collection::vec(op(), 1..14),
        mut b in prop::collection::vec(op(), 0..6),
        loss in prop::sample::select(vec![0.0, 0.02, 0.1, 0.2]),
        mtu in prop::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]),
        seed in any::<u64>(),
    ) {
        if let Some(l) = a.last_mut() { l.signaled = true; }
        if let Some(l) = b.last_mut() { l.signaled = true; }
        let net = if loss == 0.0 { NetCfg::perfect() } else { NetCfg::lossy(loss) };
        let mut sim = Sim::new(QpType::Rc, mtu, net, seed);
        let mut rng = Rng(seed);
        let exp = Expect::setup(&mut sim, &[a, b], &mut rng);
        prop_assert!(sim.run(Duration::from_secs(3600), |s| exp.done(s)));
        exp.verify(&sim, &format!("seed {seed} loss {loss}"));
    }
}
