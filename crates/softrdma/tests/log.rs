//! SOFTRDMA_LOG works in a program that installs no tracing subscriber of its own (a library
//! user, or a C program on the drop-in libraries): the test runs itself as that program.

use std::process::Command;

const CHILD: &str = "SOFTRDMA_LOG_TEST_CHILD";

/// The child: starts a device engine (on an address of this test's own) and exits.
#[test]
fn child_starts_a_device() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dev = softrdma::Device::from_addr("127.31.7.9".parse().unwrap()).unwrap();
    let ctx = dev.open().unwrap();
    ctx.local_udp_addr().unwrap();
}

fn run_child(log: Option<&str>) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_starts_a_device",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
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
    let err = run_child(Some("softrdma=debug"));
    assert!(err.contains("device engine started"), "{err}");
    assert!(err.contains("127.31.7.9:4791"), "{err}");
    // Unset: the library installs nothing and prints nothing.
    let err = run_child(None);
    assert!(!err.contains("device engine started"), "{err}");
    // A filter that excludes it: nothing either.
    let err = run_child(Some("softrdma=warn"));
    assert!(!err.contains("device engine started"), "{err}");
}
