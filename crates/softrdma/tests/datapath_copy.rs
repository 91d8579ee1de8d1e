//! Every test of `datapath.rs` again with two copy engines (`SOFTRDMA_COPY_THREADS=2`): the
//! payload copies of runs of packets, sent into a same-host lane's ring or received, are
//! deferred and made together, shared with helper threads when a run is large, and every
//! result (data, ordering against atomics and READs, completion statuses, faults, flow
//! control) is the same as with each copy made on the spot. (A test binary of its own, run
//! after `datapath`, as `datapath_wire` is; by default a machine of fewer than 8 CPUs has no
//! copy engines.)

#[path = "datapath.rs"]
mod cases;

// Every device of this binary's process gets two copy engines.
crate::preset_env!("SOFTRDMA_COPY_THREADS", "2");

/// The runs of this binary's large transfers were shared with the two helpers (at least the
/// first ones: on a machine whose cores are all busy the helpers may then back off), and the
/// statistics say so.
#[test]
fn large_runs_are_shared_with_the_helpers() {
    use cases::pair::*;
    use softrdma::*;
    assert_eq!(copy_engines().helpers, 2);
    let before = copy_engines();
    let len = 1 << 20;
    // (Devices of its own: the same-host lane carries the WRITEs, built in runs of 17 packets
    // of up to 65,280 bytes.)
    let (a, b) = pair_on(&unique(), &unique(), QpType::Rc, 2 << 20, &Opts::default());
    let data = pattern(len, 3);
    a.buf.write(0, &data).unwrap();
    for i in 0..20 {
        send(&a, i, WrOpcode::RdmaWrite, &[a.sge(0, len)], |w| {
            w.remote_addr = b.buf.addr() + (len as u64);
            w.rkey = b.mr.rkey();
        });
        assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    }
    let mut got = vec![0u8; len];
    b.buf.read(len, &mut got).unwrap();
    assert!(got == data);
    let after = copy_engines();
    assert!(
        after.shared_runs + after.alone_runs > before.shared_runs + before.alone_runs,
        "no run of 128 KiB or more: {before:?} {after:?}"
    );
    assert!(after.shared_runs > 0, "{after:?}");
}
