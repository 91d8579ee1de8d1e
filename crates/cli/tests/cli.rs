//! The `softrdma` binary, run as a user would.

use std::process::Command;

fn softrdma(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn devices_lists_loopback_like_ibv_devinfo() {
    let (ok, out, err) = softrdma(&["devices"]);
    assert!(ok, "{err}");
    assert!(out.contains("hca_id:\tsrdma0"), "{out}");
    assert!(out.contains("PORT_ACTIVE (4)"), "{out}");
    assert!(
        out.contains("::ffff:127.0.0.1, RoCE v2 (127.0.0.1)"),
        "{out}"
    );
    assert!(out.contains("link_layer:\t\tEthernet"), "{out}");
}

#[test]
fn devices_verbose_for_a_loopback_alias_prints_the_limits() {
    let (ok, out, err) = softrdma(&["devices", "-v", "-d", "127.0.0.5"]);
    assert!(ok, "{err}");
    assert!(out.contains("hca_id:\tsrdma_127.0.0.5"), "{out}");
    assert!(out.contains("max_qp_wr:"), "{out}");
    assert!(out.contains("active_mtu:\t\t4096 (5)"), "{out}");
    assert_eq!(out.matches("hca_id").count(), 1);
}

#[test]
fn devices_with_an_unknown_device_fails_with_a_clear_message() {
    let (ok, _, err) = softrdma(&["devices", "-d", "mlx5_0"]);
    assert!(!ok);
    assert!(err.contains("no device named \"mlx5_0\" (ENODEV)"), "{err}");
    let (ok, _, err) = softrdma(&["devices", "-d", "192.0.2.9"]);
    assert!(!ok);
    assert!(err.contains("EADDRNOTAVAIL"), "{err}");
}
