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
//! `tests/c/ex_api.c`.
//!
//! With `-R` (connections and the exchange of results through rdma_cm) Debian's perftest
//! (4.5-0.17) parses `--source_ip` as the raw-Ethernet option, so the client connects from
//! the routed source, 127.0.0.1, and the server listens on the wildcard address: both use
//! the shared 127.0.0.1 device (as two programs share a NIC), or, with `-d` on each side
//! (`ib_write_lat_rdma_cm_on_named_devices`), the server listens on the `SOFTRDMA_DEVICES`
//! devices too and the client connects to the server's. The client starts once the
//! server's listener holds its service on that device; perftest's own race between the
//! client's connect and the server's second listen (see `perftest_cm`) can refuse the
//! client, and that pair is then run again. Their teardown destroys the QP of the rdma_cm
//! control connection with `ibv_destroy_qp` (not `rdma_destroy_qp`), then deallocates its
//! PD.

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

/// Whether the service of rdma_cm port `port` (TCP port space) of the device of address
/// `addr` is claimed by a listener of this user (the abstract socket softrdma's shared
/// devices name after it, read from /proc/net/unix).
fn listening_cm_on(addr: &str, port: u16) -> bool {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    let sid = 0x0106_0000u64 | u64::from(port);
    let want = format!("@softrdma-{uid}/{addr}/svc/{sid:016x}");
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(7) == Some(want.as_str()))
}

/// A started program whose output is read as it comes (so a test can act on a line before
/// the program ends); killed if dropped while it runs.
struct Running {
    child: std::process::Child,
    out: [std::sync::Arc<std::sync::Mutex<Vec<u8>>>; 2],
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        use std::io::Read;
        use std::process::Stdio;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the program");
        let out: [std::sync::Arc<std::sync::Mutex<Vec<u8>>>; 2] = Default::default();
        let pipes: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        let readers = pipes
            .into_iter()
            .zip(out.clone())
            .map(|(mut pipe, buf)| {
                std::thread::spawn(move || {
                    let mut chunk = [0u8; 4096];
                    while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                        buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                    }
                })
            })
            .collect();
        Running {
            child,
            out,
            readers,
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("waiting").is_none()
    }

    /// Whether the program has written `what` to standard error.
    fn stderr_has(&self, what: &str) -> bool {
        String::from_utf8_lossy(&self.out[1].lock().unwrap()).contains(what)
    }

    /// Waits until it ends, at most [`LIMIT`], or until `stop` says so; a program still
    /// running then is killed (status `None`). Returns the status and the output.
    fn finish(
        mut self,
        mut stop: impl FnMut(&Running) -> bool,
    ) -> (Option<std::process::ExitStatus>, String, String) {
        let t0 = std::time::Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().expect("waiting") {
                break Some(st);
            }
            if stop(&self) || t0.elapsed() > LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let text = |i: usize| String::from_utf8_lossy(&self.out[i].lock().unwrap()).into_owned();
        (st, text(0), text(1))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What Debian's perftest (4.5-0.17) prints when the server refused its data connection:
/// see [`perftest_cm`].
const DATA_REQ_REFUSED: &str = "Event: RDMA_CM_EVENT_REJECTED; error: 8.";

/// Runs perftest's `prog -R` (rdma_cm) as server and client with `args`, both on the
/// shared 127.0.0.1 device; checks both exit with status 0, report no failure and print the
/// result table whose header names `title`. Returns the client's stdout.
///
/// The client starts once the server listens for the control connection. perftest then
/// makes its test QPs' connection (a second listener on the same port) right after a
/// handshake on the control connection, with no ordering between the server's listen and
/// the client's connect, so the client may be refused (as by the kernel's CM: no listener,
/// reason 8); 4.5-0.17 then retries on the ids it has just destroyed and crashes (fixed
/// upstream after it, perftest 3d9d8d0). Such a client is stopped as soon as it reports
/// the refusal, with its server, and the pair is started again on a new port, a bounded
/// number of times.
fn perftest_cm(prog: &str, args: &[&str], title: &str) -> String {
    perftest_cm_on(prog, args, title, None)
}

/// [`perftest_cm`], or, with `devices` (server, client), each side on a device of its own
/// named with `-d` and listed through `SOFTRDMA_DEVICES`, the client connecting to the
/// server's address (from the routed source, 127.0.0.1) and the server listening on the
/// wildcard address, which must cover the `SOFTRDMA_DEVICES` devices.
fn perftest_cm_on(
    prog: &str,
    args: &[&str],
    title: &str,
    devices: Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)>,
) -> String {
    let mut refused = String::new();
    let srv = devices.map_or_else(|| "127.0.0.1".to_string(), |(s, _)| s.to_string());
    for _ in 0..20 {
        let port = free_tcp_port();
        let cmd = |peer: Option<&str>| {
            let mut c = command(format!("/usr/bin/{prog}"));
            match devices {
                Some((s, cl)) => {
                    let me = if peer.is_some() { cl } else { s };
                    c.env("SOFTRDMA_DEVICES", format!("{s},{cl}"))
                        .arg("-d")
                        .arg(format!("srdma_{me}"));
                }
                None => {
                    c.env("SOFTRDMA_DEVICES", "127.0.0.1");
                }
            }
            c.args(["-R", "-x", "0", "-p"])
                .arg(port.to_string())
                .args(args)
                .args(peer);
            c
        };
        let mut server = Running::start(cmd(None));
        let t0 = std::time::Instant::now();
        while !listening_cm_on(&srv, port) && server.running() && t0.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A refused client is stopped at once: its retry would use the ids it destroyed.
        let (cst, cout, cerr) =
            Running::start(cmd(Some(&srv))).finish(|c| c.stderr_has(DATA_REQ_REFUSED));
        let retry = cerr.contains(DATA_REQ_REFUSED);
        let (sst, sout, serr) = server.finish(|_| retry);
        let report =
            format!("--- client ({cst:?}):\n{cout}\n{cerr}\n--- server ({sst:?}):\n{sout}\n{serr}");
        if retry {
            eprintln!("{prog} -R: the data connection was refused; again");
            refused.push_str(&format!("--- refused:\n{cerr}\n"));
            continue;
        }
        let report = format!("{refused}{report}");
        assert!(
            cst.is_some_and(|s| s.success()),
            "{prog} -R client failed:\n{report}"
        );
        assert!(
            sst.is_some_and(|s| s.success()),
            "{prog} -R server failed:\n{report}"
        );
        for out in [&cout, &sout] {
            assert!(
                out.contains(title) && out.contains("rdma_cm QPs\t : ON"),
                "{report}"
            );
            assert!(out.contains("#bytes") && !rows(out).is_empty(), "{report}");
        }
        assert!(
            !cerr.contains("Failed") && !serr.contains("Failed"),
            "{report}"
        );
        return cout;
    }
    panic!("{prog} -R: the data connection was refused every time:\n{refused}");
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

/// perftest's `--odp`: buffers registered with IBV_ACCESS_ON_DEMAND once `odp_caps` say the
/// operation may use them.
#[test]
fn ib_write_and_read_bw_on_demand() {
    if have_perftest() {
        perftest("ib_write_bw", &["-n", "50", "--odp"], "RDMA_Write BW Test");
        perftest("ib_read_bw", &["-n", "50", "--odp"], "RDMA_Read BW Test");
        perftest("ib_send_bw", &["-n", "50", "--odp"], "Send BW Test");
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

#[test]
fn ib_write_bw_rdma_cm() {
    if have_perftest() {
        perftest_cm("ib_write_bw", &["-n", "50"], "RDMA_Write BW Test");
    }
}

#[test]
fn ib_read_bw_rdma_cm() {
    if have_perftest() {
        perftest_cm("ib_read_bw", &["-n", "50"], "RDMA_Read BW Test");
    }
}

#[test]
fn ib_send_bw_rdma_cm() {
    if have_perftest() {
        perftest_cm("ib_send_bw", &["-n", "50"], "Send BW Test");
    }
}

#[test]
fn ib_send_lat_rdma_cm() {
    if have_perftest() {
        perftest_cm("ib_send_lat", &["-n", "20"], "Send Latency Test");
    }
}

#[test]
fn ib_write_lat_rdma_cm_on_named_devices() {
    // Before the wildcard listen covered the SOFTRDMA_DEVICES devices, the server listened
    // only on the host's addresses and the client's request found no one (ECONNREFUSED).
    if have_perftest() {
        let devices = (unique_addr(), unique_addr());
        perftest_cm_on(
            "ib_write_lat",
            &["-n", "20"],
            "RDMA_Write Latency Test",
            Some(devices),
        );
    }
}
