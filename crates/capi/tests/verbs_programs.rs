//! Debian's ibverbs-utils (`ibv_devices`, `ibv_devinfo`, the ping-pongs, `ibv_asyncwatch`)
//! and C programs compiled against the installed headers, run unmodified on the drop-in
//! `libibverbs.so.1`. Each server/client pair has addresses and a TCP port of its own;
//! the time limits only guard against a hang.

mod common;

use common::*;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Whether Debian's `prog` is installed (else the test says so and passes, outside CI).
fn have(prog: &str) -> bool {
    let ok = Path::new(prog).exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install ibverbs-utils ({prog})"
        );
        eprintln!("skipped: {prog} is not installed (ibverbs-utils)");
    }
    ok
}

/// A command for `prog` that sees the devices of `addrs` (SOFTRDMA_DEVICES).
fn with_devices(prog: &str, addrs: &[Ipv4Addr]) -> Command {
    let mut c = command(prog);
    let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    c.env("SOFTRDMA_DEVICES", list.join(","));
    c
}

/// Waits until something listens on TCP `port` (read from /proc/net/tcp{,6}, so that the
/// one-connection servers of the ping-pongs are not disturbed); gives up after LIMIT and
/// lets the client report the failure.
fn wait_listening(port: u16) {
    let needle = format!(":{port:04X} ");
    let t0 = std::time::Instant::now();
    while t0.elapsed() < LIMIT {
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(s) = std::fs::read_to_string(f) {
                // Column 4 ("st") is 0A for LISTEN.
                if s.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
                }) {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `prog` as server and client (`-g 0`, each on a device of its own, `-n 20`, plus
/// `extra`) and checks that both finish successfully with their summary lines.
fn pingpong(prog: &str, extra: &[&str]) {
    if !have(prog) {
        return;
    }
    let (a, b) = (unique_addr(), unique_addr());
    let port = free_tcp_port().to_string();
    let mk = |dev: Ipv4Addr, server: bool| {
        let mut c = with_devices(prog, &[a, b]);
        c.args([
            "-g",
            "0",
            "-d",
            &format!("srdma_{dev}"),
            "-p",
            &port,
            "-n",
            "20",
        ])
        .args(extra);
        if !server {
            c.arg("127.0.0.1");
        }
        c
    };
    let server_cmd = mk(a, true);
    let server = std::thread::spawn(move || run_bounded(server_cmd, LIMIT));
    wait_listening(port.parse().unwrap());
    let (cst, cout, cerr) = run_bounded(mk(b, false), LIMIT);
    let (sst, sout, serr) = server.join().unwrap();
    let report =
        format!("{prog} {extra:?}\nserver {sst:?}\n{sout}{serr}\nclient {cst:?}\n{cout}{cerr}");
    assert!(sst.is_some_and(|s| s.success()), "{report}");
    assert!(cst.is_some_and(|s| s.success()), "{report}");
    for out in [&sout, &cout] {
        assert!(out.contains("iters in"), "{report}");
        assert!(out.contains("remote address"), "{report}");
    }
    assert!(cout.contains(&format!("GID ::ffff:{a}")), "{report}");
    // (ibv_rc_pingpong -P goes on when its prefetch fails, saying so.)
    assert!(!report.contains("Couldn't prefetch"), "{report}");
}

#[test]
fn rc_pingpong() {
    pingpong("/usr/bin/ibv_rc_pingpong", &[]);
}

#[test]
fn rc_pingpong_events() {
    pingpong("/usr/bin/ibv_rc_pingpong", &["-e"]);
}

#[test]
fn rc_pingpong_validated_small() {
    pingpong("/usr/bin/ibv_rc_pingpong", &["-c", "-s", "64"]);
}

/// On-demand paging (`-o`): the buffer registered with IBV_ACCESS_ON_DEMAND, after the
/// program checked `odp_caps` through `ibv_query_device_ex`; data validated.
#[test]
fn rc_pingpong_on_demand() {
    pingpong("/usr/bin/ibv_rc_pingpong", &["-o", "-c"]);
}

/// Implicit on-demand paging (`-O`: one region over the whole address space, a NULL address
/// and SIZE_MAX bytes) with the buffer prefetched through `ibv_advise_mr` (`-P`).
#[test]
fn rc_pingpong_implicit_on_demand_prefetched() {
    pingpong("/usr/bin/ibv_rc_pingpong", &["-O", "-P", "-c"]);
}

#[test]
fn uc_pingpong() {
    pingpong("/usr/bin/ibv_uc_pingpong", &[]);
}

#[test]
fn uc_pingpong_events() {
    pingpong("/usr/bin/ibv_uc_pingpong", &["-e"]);
}

#[test]
fn ud_pingpong() {
    pingpong("/usr/bin/ibv_ud_pingpong", &[]);
}

#[test]
fn ud_pingpong_events() {
    pingpong("/usr/bin/ibv_ud_pingpong", &["-e"]);
}

#[test]
fn srq_pingpong() {
    pingpong("/usr/bin/ibv_srq_pingpong", &[]);
}

#[test]
fn srq_pingpong_events() {
    pingpong("/usr/bin/ibv_srq_pingpong", &["-e"]);
}

#[test]
fn ibv_devices_lists_softrdma_devices() {
    if !have("/usr/bin/ibv_devices") {
        return;
    }
    let a = unique_addr();
    let (st, out, err) = run_bounded(with_devices("/usr/bin/ibv_devices", &[a]), LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.contains(&format!("srdma_{a}")), "{out}");
    // Entries that are not addresses of this machine are left out.
    let mut c = command("/usr/bin/ibv_devices");
    c.env("SOFTRDMA_DEVICES", format!("not-an-ip, 192.0.2.1,{a}"));
    let (st, out2, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out2}{err}");
    assert!(out2.contains(&format!("srdma_{a}")), "{out2}");
    assert!(
        !out2.contains("192.0.2.1") && !out2.contains("not-an-ip"),
        "{out2}"
    );
    assert!(out.contains("srdma0"), "{out}");
    assert!(out.contains("025352"), "GUIDs start with 02:53:52: {out}");
}

/// `SOFTRDMA_DEVICES` entries `NAME=IP` list the address under that name (how two
/// processes on one host each get a device of the same name); an empty name is skipped.
#[test]
fn ibv_devices_lists_named_devices() {
    if !have("/usr/bin/ibv_devinfo") {
        return;
    }
    let (a, b) = (unique_addr(), unique_addr());
    let mut c = command("/usr/bin/ibv_devinfo");
    c.env("SOFTRDMA_DEVICES", format!("rdma_a={a}, ={b}"))
        .args(["-v", "-d", "rdma_a"]);
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.contains("hca_id:\trdma_a"), "{out}");
    assert!(out.contains(&format!("::ffff:{a}")), "{out}");
    let mut c = command("/usr/bin/ibv_devices");
    c.env("SOFTRDMA_DEVICES", format!("rdma_a={a}, ={b}"));
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.contains("rdma_a"), "{out}");
    assert!(
        !out.contains(&format!("srdma_{a}")) && !out.contains(&b.to_string()),
        "{out}"
    );
}

#[test]
fn ibv_devinfo_shows_a_roce_port() {
    if !have("/usr/bin/ibv_devinfo") {
        return;
    }
    let a = unique_addr();
    let dev = format!("srdma_{a}");
    let mut c = with_devices("/usr/bin/ibv_devinfo", &[a]);
    c.args(["-d", &dev]);
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.contains(&format!("hca_id:\t{dev}")), "{out}");
    assert!(out.contains("PORT_ACTIVE (4)"), "{out}");
    assert!(out.contains("link_layer:\t\tEthernet"), "{out}");
    assert!(out.contains("transport:\t\t\tInfiniBand (0)"), "{out}");

    let mut c = with_devices("/usr/bin/ibv_devinfo", &[a]);
    c.args(["-v", "-d", &dev]);
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(
        out.contains(&format!("GID[  0]:\t\t::ffff:{a}, RoCE v2")),
        "{out}"
    );
    assert!(out.contains("max_qp_wr:"), "{out}");
    assert!(out.contains("num_comp_vectors:\t\t1"), "{out}");

    // Every device, as without arguments.
    let (st, out, err) = run_bounded(with_devices("/usr/bin/ibv_devinfo", &[a]), LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.contains("hca_id:\tsrdma0"), "{out}");
}

#[test]
fn ibv_asyncwatch_waits_on_the_async_fd() {
    if !have("/usr/bin/ibv_asyncwatch") {
        return;
    }
    use std::io::BufRead;
    let a = unique_addr();
    let mut c = with_devices("/usr/bin/ibv_asyncwatch", &[a]);
    c.args(["-d", &format!("srdma_{a}")])
        .stdout(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // It blocks in ibv_get_async_event (nothing happens on the device): stop it.
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains(&format!("srdma_{a}: async event FD")),
        "{line}"
    );
    assert!(still_running, "ibv_asyncwatch exited: {line}");
}

#[test]
fn c_bad_input_on_the_verbs_side() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("verbs_bad_input", &["verbs_bad_input.c"]);
    let (a, b) = (unique_addr(), unique_addr());
    let mut c = command(&exe);
    c.env("SOFTRDMA_DEVICES", format!("{a},{b}"))
        .arg(format!("srdma_{a}"))
        .arg(format!("srdma_{b}"));
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}{err}");
    assert!(out.starts_with("ok "), "{out}{err}");
}
