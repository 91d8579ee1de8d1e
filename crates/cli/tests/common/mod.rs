//! Helpers shared by the tests of the `softrdma` binary.
#![allow(dead_code)]

use std::process::Command;

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text: a device address of the test's own.
pub fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

/// Runs `softrdma ARGS` to its end: (success, stdout, stderr). Connections between its
/// devices keep the path MTU (`SOFTRDMA_SAME_HOST_SEGMENT=0`), so that packet counts are
/// those of two hosts.
pub fn softrdma(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .env("SOFTRDMA_SAME_HOST_SEGMENT", "0")
        .output()
        .expect("run softrdma");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The value of `"key":` in a one-line JSON object (numbers and strings only).
pub fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let start = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"')
}

/// The packets counted on a QP counters line starting with `label`: (tx, rx).
pub fn qp_packets_of(out: &str, label: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!(" {label}: tx ")))
        .unwrap_or_else(|| panic!("no {label} line in {out}"));
    let num = |after: &str| -> u64 {
        let i = line.find(after).unwrap() + after.len();
        line[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (num(": tx "), num(", rx "))
}
