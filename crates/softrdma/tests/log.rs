//! SOFTRDMA_LOG works in a program that installs no tracing subscriber of its own (a library
//! user, or a C program on the drop-in libraries): the test runs itself as that program.

#[path = "common/pair.rs"]
mod pair;

use pair::{connect, Opts, Side};
use softrdma::{QpType, SendFlags, SendWr, WrOpcode};
use std::process::Command;

/// Set in the child's environment: the device address the parent reserved for it.
const CHILD: &str = "SOFTRDMA_LOG_TEST_CHILD";

/// The child: starts a device engine (on the address its parent reserved, a loopback
/// address of this run's own) and exits.
#[test]
fn child_starts_a_device() {
    let Some(addr) = std::env::var_os(CHILD) else {
        return;
    };
    let addr = addr.to_str().unwrap().parse().unwrap();
    let dev = softrdma::Device::from_addr(addr).unwrap();
    let ctx = dev.open().unwrap();
    ctx.local_udp_addr().unwrap();
}

fn run_child(addr: &str, log: Option<&str>) -> String {
    run_test_child("child_starts_a_device", CHILD, addr, log)
}

/// Runs this test binary's test `name` alone, with `key=value` and `SOFTRDMA_LOG` set to `log`
/// (or unset), and returns its standard error.
fn run_test_child(name: &str, key: &str, value: &str, log: Option<&str>) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(key, value);
    match log {
        Some(l) => cmd.env(softrdma::log::ENV, l),
        None => cmd.env_remove(softrdma::log::ENV),
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn softrdma_log_turns_on_logging_without_a_subscriber() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let addr = softrdma::testing::unique_loopback_addr().to_string();
    let err = run_child(&addr, Some("softrdma=debug"));
    assert!(err.contains("device engine started"), "{err}");
    assert!(err.contains(&format!("{addr}:4791")), "{err}");
    // Unset: the library installs nothing and prints nothing.
    let err = run_child(&addr, None);
    assert!(!err.contains("device engine started"), "{err}");
    // A filter that excludes it: nothing either.
    let err = run_child(&addr, Some("softrdma=warn"));
    assert!(!err.contains("device engine started"), "{err}");
}

/// Set in the child's environment: the two device addresses, for the counters child.
const COUNTERS_CHILD: &str = "SOFTRDMA_LOG_TEST_COUNTERS_CHILD";

/// The child: one RC SEND between two QPs of its own, then the QPs are freed.
#[test]
fn child_sends_one_message() {
    let Some(addrs) = std::env::var_os(COUNTERS_CHILD) else {
        return;
    };
    let addrs = addrs.into_string().unwrap();
    let (a, b) = addrs.split_once(',').unwrap();
    let (a, _) = Side::new(a, QpType::Rc, 4096, false);
    let (b, _) = Side::new(b, QpType::Rc, 4096, false);
    connect(&a, &b, &Opts::default());
    b.post_recv(1, 0, 100);
    a.qp.post_send(&[SendWr {
        wr_id: 2,
        sg_list: &[a.sge(0, 100)],
        opcode: WrOpcode::Send,
        send_flags: SendFlags::SIGNALED,
        ..Default::default()
    }])
    .unwrap();
    a.wait(1);
    b.wait(1);
    eprintln!("qps {} {}", a.qp.qp_num(), b.qp.qp_num());
}

/// `SOFTRDMA_LOG=softrdma::counters=debug`: each QP freed logs its transport's counters (what a
/// C program on the drop-in libraries has no other way to read).
#[test]
fn a_freed_qp_logs_its_counters() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(COUNTERS_CHILD).is_some() {
        return;
    }
    let a = softrdma::testing::unique_loopback_addr().to_string();
    let b = softrdma::testing::unique_loopback_addr().to_string();
    let addrs = format!("{a},{b}");
    let run = |log| run_test_child("child_sends_one_message", COUNTERS_CHILD, &addrs, log);
    let err = run(Some("softrdma::counters=debug"));
    let qps = err
        .lines()
        .find_map(|l| l.strip_prefix("qps "))
        .unwrap_or_else(|| panic!("{err}"));
    let freed: Vec<&str> = err.lines().filter(|l| l.contains("QP freed")).collect();
    for qpn in qps.split(' ') {
        let line = freed
            .iter()
            .find(|l| l.contains(&format!("qp_num={qpn} ")))
            .unwrap_or_else(|| panic!("no line for QP {qpn}: {err}"));
        assert!(line.contains("softrdma::counters"), "{line}");
        // The sender sent the SEND (and took its ACK); the receiver took it (and acknowledged).
        assert!(line.contains("tx_packets: "), "{line}");
        assert!(!line.contains("tx_packets: 0,"), "{line}");
        assert!(!line.contains("rx_packets: 0,"), "{line}");
    }
    // Not asked for: nothing.
    let err = run(None);
    assert!(!err.contains("QP freed"), "{err}");
}
