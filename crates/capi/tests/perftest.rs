//! Debian's perftest binaries (`/usr/bin/ib_*`, unmodified) between two processes over the
//! drop-in libraries: each test runs a server and a client on devices of their own
//! (`-d srdma_<addr>`, listed through `SOFTRDMA_DEVICES`), GID index 0, a free port and a
//! few iterations, and checks both exit cleanly with a result table. The binaries need
//! libmlx5.so.1 and libefa.so.1, which `link.sh` provides as stand-ins next to
//! libibverbs.so.1.
//!
//! perftest takes its ibv_wr_* path only on the devices it knows by vendor part ID
//! (ConnectX, BlueField, EFA, HNS) and `ibv_post_send` everywhere else, so its runs here
//! all say "ibv_wr* API : OFF"; the builders are exercised by `ibv_rc_pingpong -N` and
//! `tests/c/ex_api.c`. Not here: `-R` (rdma_cm). Debian's perftest (4.5-0.17) parses
//! `--source_ip` as the raw-Ethernet option, so both sides use the routed source, and on one
//! host both then need the softrdma device of the same address (127.0.0.1 for any 127.x
//! destination: one UDP port 4791, one process): the client gets ADDR_ERROR.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The hang guard for one program (never a timing assertion).
const LIMIT: Duration = Duration::from_secs(60);

/// Whether Debian's perftest is installed (CI installs it; elsewhere the tests say so and
/// pass without running).
fn have_perftest() -> bool {
    let ok = Path::new("/usr/bin/ib_write_bw").exists();
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "CI must install perftest");
        eprintln!("skipped: perftest (/usr/bin/ib_*) is not installed");
    }
    ok
}

/// A perftest command on the device of `addr`, with both devices of the pair listed.
fn perftest_cmd(
    prog: &str,
    addr: std::net::Ipv4Addr,
    devices: &str,
    port: u16,
    args: &[&str],
) -> Command {
    let mut c = command(format!("/usr/bin/{prog}"));
    c.env("SOFTRDMA_DEVICES", devices)
        .arg("-d")
        .arg(format!("srdma_{addr}"))
        .args(["-x", "0", "-p"])
        .arg(port.to_string())
        .args(args);
    c
}

/// Runs perftest's `prog` as server and client with `args` on two devices of their own;
/// returns the client's stdout, which must hold a result table.
fn run_pair(prog: &str, args: &[&str]) -> String {
    let srv = unique_addr();
    let cli = unique_addr();
    let devices = format!("{srv},{cli}");
    let port = free_tcp_port();
    let server = perftest_cmd(prog, srv, &devices, port, args);
    let mut client = perftest_cmd(prog, cli, &devices, port, args);
    client.arg(srv.to_string());
    let out = server_client(server, client, port, LIMIT);
    assert!(
        out.contains("#bytes") && !rows(&out).is_empty(),
        "{prog} {args:?}: no result table:\n{out}"
    );
    out
}

/// The data rows of a perftest result table (lines starting with a message size).
fn rows(out: &str) -> Vec<&str> {
    out.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect()
}

/// One perftest run with `args` on both sides, checking its header names `title`. Debian's
/// perftest (4.5-0.17, as HEAD) uses the ibv_wr_* API only on the ConnectX/BlueField/EFA/HNS
/// devices it knows by vendor part ID and takes `ibv_post_send` on any other, so every run
/// here says "ibv_wr* API : OFF" (the builders are exercised by `ibv_rc_pingpong_new_send`
/// and `ex_api_c`).
fn perftest(prog: &str, args: &[&str], title: &str) -> String {
    let out = run_pair(prog, args);
    assert!(out.contains(title), "{out}");
    assert!(out.contains("ibv_wr* API     : OFF"), "{out}");
    out
}

#[test]
fn ib_write_bw() {
    if have_perftest() {
        perftest("ib_write_bw", &["-n", "50"], "RDMA_Write BW Test");
    }
}

#[test]
fn ib_write_bw_old_post_send_report_gbits() {
    if have_perftest() {
        let args = [
            "-n",
            "20",
            "-s",
            "8192",
            "--use_old_post_send",
            "--report_gbits",
        ];
        let out = perftest("ib_write_bw", &args, "RDMA_Write BW Test");
        assert!(out.contains("BW peak[Gb/sec]"), "{out}");
        assert!(rows(&out).iter().any(|r| r.starts_with("8192")), "{out}");
    }
}

#[test]
fn ib_write_lat() {
    if have_perftest() {
        perftest("ib_write_lat", &["-n", "20"], "RDMA_Write Latency Test");
    }
}

#[test]
fn ib_write_bw_all_sizes() {
    if have_perftest() {
        let out = perftest("ib_write_bw", &["-a", "-n", "5"], "RDMA_Write BW Test");
        // -a: every power of two from 2 bytes to 8 MiB.
        let r = rows(&out);
        assert_eq!(r.len(), 23, "{out}");
        assert!(
            r[0].starts_with("2 ") && r[22].starts_with("8388608"),
            "{out}"
        );
    }
}

#[test]
fn ib_read_bw() {
    if have_perftest() {
        perftest("ib_read_bw", &["-n", "50"], "RDMA_Read BW Test");
    }
}

#[test]
fn ib_read_lat() {
    if have_perftest() {
        perftest("ib_read_lat", &["-n", "20"], "RDMA_Read Latency Test");
    }
}

#[test]
fn ib_send_bw() {
    if have_perftest() {
        perftest("ib_send_bw", &["-n", "50"], "Send BW Test");
    }
}

#[test]
fn ib_send_lat() {
    if have_perftest() {
        perftest("ib_send_lat", &["-n", "20"], "Send Latency Test");
    }
}

#[test]
fn ib_atomic_bw() {
    if have_perftest() {
        perftest(
            "ib_atomic_bw",
            &["-n", "50"],
            "Atomic FETCH_AND_ADD BW Test",
        );
    }
}

#[test]
fn ib_atomic_bw_cmp_and_swap() {
    if have_perftest() {
        perftest(
            "ib_atomic_bw",
            &["-n", "50", "-A", "CMP_AND_SWAP"],
            "Atomic CMP_AND_SWAP BW Test",
        );
    }
}

/// Debian's `ibv_rc_pingpong -N` (v44): `ibv_create_qp_ex` with SEND_OPS_FLAGS,
/// `ibv_qp_to_qp_ex` and `ibv_wr_start`/`ibv_wr_send`/`ibv_wr_set_sge`/`ibv_wr_complete` for
/// every message, between two processes, with `-c` checking the data.
#[test]
fn ibv_rc_pingpong_new_send() {
    if !Path::new("/usr/bin/ibv_rc_pingpong").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install ibverbs-utils"
        );
        eprintln!("skipped: ibverbs-utils is not installed");
        return;
    }
    let srv = unique_addr();
    let cli = unique_addr();
    let devices = format!("{srv},{cli}");
    let port = free_tcp_port();
    let cmd = |addr: std::net::Ipv4Addr| {
        let mut c = command("/usr/bin/ibv_rc_pingpong");
        c.env("SOFTRDMA_DEVICES", &devices)
            .arg("-d")
            .arg(format!("srdma_{addr}"))
            .args(["-g", "0", "-N", "-c", "-n", "200", "-s", "1024", "-p"])
            .arg(port.to_string());
        c
    };
    let mut client = cmd(cli);
    client.arg(srv.to_string());
    let out = server_client(cmd(srv), client, port, LIMIT);
    assert!(out.contains("200 iters in"), "{out}");
}

/// The extended API from C in one process: create_qp_ex with send_ops_flags, the ibv_wr_*
/// builders (SEND, RDMA WRITE, SEND with immediate and inline data, RDMA READ, atomics, UD
/// with ibv_wr_set_ud_addr, an aborted batch, a batch failed by a setter), ibv_cq_ex
/// polling, query_device_ex, ibv_qp_to_qp_ex on plain QPs (NULL), and EOPNOTSUPP for a
/// timestamp CQ and a TSO QP.
#[test]
fn ex_api_c() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("ex_api", &["ex_api.c"]);
    let addr = unique_addr();
    let mut c = command(&exe);
    c.env("SOFTRDMA_DEVICES", addr.to_string())
        .arg(format!("srdma_{addr}"));
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(
        st.is_some_and(|s| s.success()) && out.contains("ex_api: ok"),
        "ex_api ({st:?}):\n{out}\n{err}"
    );
}
