//! `softrdma perf -q N`: several QPs measured at once, in one process and in two.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn perf_q3_send_verifies_every_message_on_every_qp() {
    let (c, s) = (unique(), unique());
    let (ok, out, err) = softrdma(&[
        "perf",
        "send",
        "-s",
        "1024",
        "-n",
        "3000",
        "-q",
        "3",
        "--verify",
        "--client-addr",
        &c,
        "--server-addr",
        &s,
        "--json",
    ]);
    assert!(ok, "{err}\n{out}");
    assert!(out.contains("QPs: 3"), "{out}");
    let json = out.lines().last().unwrap();
    assert_eq!(json_field(json, "qps"), "3");
    // -n is per QP, as in perftest; the table shows the aggregate.
    assert_eq!(json_field(json, "iters"), "9000");
    let (ctx, _) = qp_packets_of(&out, "client QPs (3, summed)");
    let (_, srx) = qp_packets_of(&out, "server QPs (3, summed)");
    assert!(ctx >= 9000 && srx >= 9000, "{out}");
}

#[test]
fn perf_q2_write_and_read_report_the_aggregate() {
    for op in ["write", "read", "atomic"] {
        let (c, s) = (unique(), unique());
        let (ok, out, err) = softrdma(&[
            "perf",
            op,
            "-s",
            "8192",
            "-n",
            "500",
            "-q",
            "2",
            "--client-addr",
            &c,
            "--server-addr",
            &s,
            "--json",
        ]);
        assert!(ok, "{op}: {err}");
        let json = out.lines().last().unwrap();
        assert_eq!(json_field(json, "iters"), "1000", "{op}: {json}");
        assert!(json_field(json, "bw_gbps").parse::<f64>().unwrap() > 0.0);
    }
}

#[test]
fn perf_q_with_a_server_process() {
    let (c, s) = (unique(), unique());
    let mut server = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf", "send", "--server", &s, "--port", "18777"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("waiting for a client"), "{first}");
    let (ok, out, err) = softrdma(&[
        "perf",
        "send",
        "-s",
        "512",
        "-n",
        "2000",
        "-q",
        "4",
        "--connect",
        &s,
        "--port",
        "18777",
        "--client-addr",
        &c,
    ]);
    let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
    let sout = rest.join("\n");
    let st = server.wait().unwrap();
    assert!(ok, "{err}\n{out}");
    assert!(st.success(), "server:\n{sout}");
    assert!(
        sout.contains("send bandwidth, messages up to 512 B"),
        "{sout}"
    );
    assert!(sout.contains(", 4 QPs"), "{sout}");
    let (ctx, _) = qp_packets_of(&out, "client QPs (4, summed)");
    let (_, srx) = qp_packets_of(&format!("\n{sout}"), "server QPs (4, summed)");
    // Every message of every QP reached the server (resent packets may add to both).
    assert!(ctx >= 8000 && srx >= 8000, "{out}\n{sout}");
}

#[test]
fn perf_q_refuses_what_it_cannot_measure() {
    let (ok, _, err) = softrdma(&["perf", "send", "--lat", "-q", "2"]);
    assert!(!ok);
    assert!(err.contains("latency tests use one QP"), "{err}");
    let (ok, _, err) = softrdma(&["perf", "write", "-q", "0"]);
    assert!(!ok);
    assert!(err.contains("-q 0: from 1 to 256 QPs"), "{err}");
}
