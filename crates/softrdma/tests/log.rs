//! SOFTRDMA_LOG works in a program that installs no tracing subscriber of its own (a library
//! user, or a C program on the drop-in libraries): the test runs itself as that program.

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
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_starts_a_device",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, addr);
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
