//! Debian's rdmacm-utils (rping, rdma_server/rdma_client, udaddy, mckey, ucmatose, cmtime),
//! unmodified, over the drop-in librdmacm.so.1/libibverbs.so.1: a server on one address of
//! the test's own, a client bound to another (where the program can bind), and a C program
//! checking the errors of bad calls.
//!
//! rdma_xserver listens on the wildcard address (it has no address option) and rdma_xclient
//! cannot bind (its device is the route's source, 127.0.0.1): the two share the 127.0.0.1
//! device, as two programs share a NIC, with whatever else on the machine uses it.
//!
//! A client starts once its server's device is up (UDP port 4791 of the server's address
//! appears in /proc/net/udp; the server listens right after binding); a client that still
//! fails while its server runs is started again, a bounded number of times. Limits are
//! hang guards only.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Whether Debian's program `name` is installed (rdmacm-utils); if not, the test says so and
/// passes without running (CI installs the package).
fn have(name: &str) -> bool {
    let ok = Path::new("/usr/bin").join(name).exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install rdmacm-utils ({name})"
        );
        eprintln!("skipped: /usr/bin/{name} is missing (rdmacm-utils)");
    }
    ok
}

/// The drop-in libraries are the ones the program loaded: their librdmacm.so.1 is a few
/// jumps, the real one is not.
fn drop_in(prog: &str, args: &[&str]) -> Command {
    let mut c = command(Path::new("/usr/bin").join(prog));
    c.args(args);
    if LOG_CM.with(std::cell::Cell::get) {
        c.env("SOFTRDMA_LOG", "softrdma::provider::gsi=debug");
    }
    c
}

thread_local! {
    /// Set by a test whose programs log each CM message they send and receive (on standard
    /// error, shown when the test fails).
    static LOG_CM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A started server whose output is collected when it ends (killed if the test fails
/// first).
struct Server {
    child: Child,
    name: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until some process has bound UDP port 4791 of `addr` (the server's softrdma device
/// is up: it is made by the server's rdma_bind_addr, just before its rdma_listen), reading
/// /proc/net/udp so as not to take the port; gives up after [`LIMIT`] (the client's retries
/// then cover it).
fn wait_device(addr: &str) {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < LIMIT && !device_taken(addr) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Server {
    /// Starts `prog` whose device is `addr` and waits until that device is up.
    fn start_on(addr: &str, prog: &str, args: &[&str]) -> Server {
        let s = Server::start(prog, args);
        wait_device(addr);
        s
    }

    fn start(prog: &str, args: &[&str]) -> Server {
        let child = drop_in(prog, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the server");
        Server {
            child,
            name: format!("{prog} {}", args.join(" ")),
        }
    }

    /// The output of the ended child.
    fn output(&mut self) -> std::process::Output {
        use std::io::Read;
        let _ = self.child.wait();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_end(&mut stdout);
        }
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_end(&mut stderr);
        }
        std::process::Output {
            status: self.child.wait().expect("waiting"),
            stdout,
            stderr,
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("waiting").is_none()
    }

    /// Stops a server that never ends by itself (cmtime's), returning its output.
    fn kill(mut self) -> (String, String) {
        let _ = self.child.kill();
        let out = self.output();
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        let se = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("--- {} (killed)\n{so}\n{se}", self.name);
        (so, se)
    }

    /// Waits (at most [`LIMIT`]) for the server to end; kills it after that.
    fn finish(mut self) -> (Option<ExitStatus>, String, String) {
        let t0 = std::time::Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().expect("waiting") {
                break Some(st);
            }
            if t0.elapsed() > LIMIT {
                let _ = self.child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.output();
        let so = String::from_utf8_lossy(&out.stdout).into_owned();
        let se = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("--- {}: {st:?}\n{so}\n{se}", self.name);
        (st, so, se)
    }
}

/// Runs the client until it succeeds, at most `tries` times while the server runs (an
/// early client finds nobody listening) and only while it fails by itself; returns the last
/// run's status and output.
fn client(
    server: &mut Server,
    prog: &str,
    args: &[&str],
    tries: usize,
) -> (Option<ExitStatus>, String, String) {
    let mut last = None;
    for i in 0..tries {
        let r = run_bounded(drop_in(prog, args), LIMIT);
        eprintln!(
            "--- {prog} {} (try {i}): {:?}\n{}\n{}",
            args.join(" "),
            r.0,
            r.1,
            r.2
        );
        // Retried only when it ended by itself with a failure (refused before the server
        // listened), not when it hung: the server may be past its connection phase then.
        let retry = r.0.is_some_and(|s| !s.success());
        last = Some(r);
        if !retry || !server.running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    last.expect("at least one try")
}

fn ok(st: Option<ExitStatus>) -> bool {
    st.is_some_and(|s| s.success())
}

/// Whether some process has UDP port 4791 of `addr` (its softrdma device).
fn device_taken(addr: &str) -> bool {
    let ip: std::net::Ipv4Addr = addr.parse().expect("an IPv4 address");
    let want = format!("{:08X}:12B7", u32::from_ne_bytes(ip.octets()));
    std::fs::read_to_string("/proc/net/udp")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
}

fn rping(extra: &[&str], count: usize) {
    if !have("rping") {
        return;
    }
    let (a, b) = (unique_addr().to_string(), unique_addr().to_string());
    let port = free_tcp_port().to_string();
    let c = count.to_string();
    let mut sargs = vec!["-s", "-a", &a, "-p", &port, "-C", &c];
    sargs.extend_from_slice(extra);
    let mut server = Server::start_on(&a, "rping", &sargs);
    let mut cargs = vec!["-c", "-a", &a, "-I", &b, "-p", &port, "-C", &c];
    cargs.extend_from_slice(extra);
    let (st, out, err) = client(&mut server, "rping", &cargs, 50);
    let (sst, sout, _) = server.finish();
    assert!(ok(st), "rping client failed: {out}\n{err}");
    assert!(ok(sst), "rping server failed");
    if extra.contains(&"-v") {
        let pings = out.lines().filter(|l| l.starts_with("ping data: ")).count();
        assert_eq!(pings, count, "client output:\n{out}");
        let pings = sout
            .lines()
            .filter(|l| l.starts_with("server ping data: "))
            .count();
        assert_eq!(pings, count, "server output:\n{sout}");
    }
}

/// rping with verbose and validated data, 10 pings of the default size.
#[test]
fn rping_verbose_validated() {
    rping(&["-v", "-V"], 10);
}

/// rping with -S: 4 KiB pings, validated.
#[test]
fn rping_large_pings() {
    rping(&["-V", "-S", "4096"], 20);
}

/// rping -q: the programs' own QPs, moved with rdma_init_qp_attr, rdma_establish.
#[test]
fn rping_self_created_qp() {
    rping(&["-v", "-V", "-q"], 5);
}

/// rping -P: a persistent server (a thread per connection) serving two clients in turn,
/// then killed. (Not at once: rping's persistent server keeps the latest connection request
/// in one variable until its main thread takes it, so two requests in quick succession
/// can overwrite each other — rping's race, not the library's.)
#[test]
fn rping_persistent_server() {
    if !have("rping") {
        return;
    }
    // (Its first client once hung in CI with no output: a recurrence shows the CM exchange.)
    LOG_CM.with(|l| l.set(true));
    let a = unique_addr().to_string();
    let port = free_tcp_port().to_string();
    let mut server = Server::start_on(&a, "rping", &["-s", "-P", "-a", &a, "-p", &port, "-V"]);
    for _ in 0..2 {
        let b = unique_addr().to_string();
        let args = ["-c", "-a", &a, "-I", &b, "-p", &port, "-C", "5", "-v", "-V"];
        let (st, out, err) = client(&mut server, "rping", &args, 50);
        if !ok(st) {
            // (The server's side of a hang says where it stopped.)
            let (so, se) = server.kill();
            panic!("rping client failed ({st:?}): {out}\n{err}\nserver:\n{so}\n{se}");
        }
        assert_eq!(
            out.lines().filter(|l| l.starts_with("ping data: ")).count(),
            5,
            "{out}"
        );
    }
    assert!(server.running(), "the persistent rping server ended");
    let _ = server.kill();
}

/// rdma_server / rdma_client: rdma_getaddrinfo, rdma_create_ep, rdma_get_request, the
/// rdma_verbs.h helpers on CM-made CQs.
#[test]
fn rdma_server_and_client() {
    if !have("rdma_server") {
        return;
    }
    let a = unique_addr().to_string();
    let port = free_tcp_port().to_string();
    let mut server = Server::start_on(&a, "rdma_server", &["-s", &a, "-p", &port]);
    let (st, out, err) = client(&mut server, "rdma_client", &["-s", &a, "-p", &port], 50);
    let (sst, sout, serr) = server.finish();
    assert!(ok(st), "rdma_client failed: {out}\n{err}");
    assert!(ok(sst), "rdma_server failed: {sout}\n{serr}");
    assert!(out.contains("rdma_client: end 0"), "{out}");
    assert!(sout.contains("rdma_server: end 0"), "{sout}");
}

/// rdma_xserver / rdma_xclient (RC): the server listens on the wildcard address, and the
/// client, which cannot bind, connects from the route's source, 127.0.0.1. Both processes
/// then share the 127.0.0.1 device (and any other process on the machine may too).
#[test]
fn rdma_xserver_and_xclient() {
    if !have("rdma_xserver") {
        return;
    }
    let port = free_tcp_port().to_string();
    let mut server = Server::start_on("127.0.0.1", "rdma_xserver", &["-p", &port]);
    let (st, out, err) = client(
        &mut server,
        "rdma_xclient",
        &["-s", "127.0.0.1", "-p", &port],
        50,
    );
    let (sst, sout, serr) = server.finish();
    assert!(ok(st), "rdma_xclient failed: {out}\n{err}");
    assert!(ok(sst), "rdma_xserver failed: {sout}\n{serr}");
    assert!(out.contains("rdma_xclient: end 0"), "{out}");
    assert!(sout.contains("rdma_xserver: end 0"), "{sout}");
}

fn udaddy(extra: &[&str]) {
    if !have("udaddy") {
        return;
    }
    let (a, b) = (unique_addr().to_string(), unique_addr().to_string());
    let mut sargs = vec!["-b", &a, "-C", "10"];
    sargs.extend_from_slice(extra);
    let mut server = Server::start_on(&a, "udaddy", &sargs);
    let mut cargs = vec!["-s", &a, "-b", &b, "-C", "10"];
    cargs.extend_from_slice(extra);
    let (st, out, err) = client(&mut server, "udaddy", &cargs, 50);
    let (sst, sout, serr) = server.finish();
    assert!(ok(st), "udaddy client failed: {out}\n{err}");
    assert!(ok(sst), "udaddy server failed: {sout}\n{serr}");
    assert!(out.contains("test complete"), "{out}");
    assert!(sout.contains("test complete"), "{sout}");
}

/// udaddy: UD over the CM (SIDR in the UDP port space), address handles from the events,
/// the GRH in front of each receive.
#[test]
fn udaddy_server_and_client() {
    udaddy(&[]);
}

/// udaddy in the IPoIB port space with a type of service (rdma_set_option TOS), three ids.
#[test]
fn udaddy_ipoib_tos() {
    udaddy(&["-P", "ipoib", "-t", "32", "-c", "3"]);
}

fn ucmatose(ps: &str, extra: &[&str]) {
    if !have("ucmatose") {
        return;
    }
    let (a, b) = (unique_addr().to_string(), unique_addr().to_string());
    let port = free_tcp_port().to_string();
    let mut sargs = vec!["-b", &a, "-p", &port, "-P", ps, "-c", "2"];
    sargs.extend_from_slice(extra);
    let mut server = Server::start_on(&a, "ucmatose", &sargs);
    let mut cargs = vec!["-s", &a, "-b", &b, "-p", &port, "-P", ps, "-c", "2"];
    cargs.extend_from_slice(extra);
    let (st, out, err) = client(&mut server, "ucmatose", &cargs, 50);
    let (sst, sout, serr) = server.finish();
    assert!(ok(st), "ucmatose client failed: {out}\n{err}");
    assert!(ok(sst), "ucmatose server failed: {sout}\n{serr}");
    assert!(out.contains("test complete"), "{out}");
    assert!(sout.contains("test complete"), "{sout}");
}

/// ucmatose in the TCP port space: 2 RC connections, messages both ways, disconnect.
#[test]
fn ucmatose_tcp() {
    ucmatose("tcp", &[]);
}

/// ucmatose with 8 connections of 20 messages of 1000 bytes each.
#[test]
fn ucmatose_many_connections() {
    ucmatose("tcp", &["-c", "8", "-C", "20", "-S", "1000"]);
}

/// ucmatose -m: every id moved to a new event channel (rdma_migrate_id) after the
/// transfers; then the disconnect on the new channel.
#[test]
fn ucmatose_migrate() {
    ucmatose("tcp", &["-m"]);
}

/// ucmatose in the IB port space.
#[test]
fn ucmatose_ib() {
    ucmatose("ib", &[]);
}

/// cmtime: 10 connections set up and torn down at once, timed by the program (not by us).
/// Its server serves until killed.
#[test]
fn cmtime_connections() {
    if !have("cmtime") {
        return;
    }
    let (a, b) = (unique_addr().to_string(), unique_addr().to_string());
    let port = free_tcp_port().to_string();
    let mut server = Server::start_on(&a, "cmtime", &["-b", &a, "-p", &port, "-c", "10"]);
    let (st, out, err) = client(
        &mut server,
        "cmtime",
        &["-s", &a, "-b", &b, "-p", &port, "-c", "10"],
        50,
    );
    assert!(server.running(), "the cmtime server ended");
    let _ = server.kill();
    assert!(ok(st), "cmtime client failed: {out}\n{err}");
    for step in [
        "create id",
        "resolve addr",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(out.contains(step), "{out}");
    }
}

fn mckey(send_only: bool) {
    if !have("mckey") {
        return;
    }
    let (a, b) = (unique_addr(), unique_addr());
    // A group of this test's own, from its receiver's address.
    let o = a.octets();
    let group = format!("239.{}.{}.{}", o[1], o[2], o[3]);
    let (a, b) = (a.to_string(), b.to_string());
    let mut receiver = Server::start_on(&a, "mckey", &["-m", &group, "-b", &a, "-C", "10"]);
    let mut sargs = vec!["-m", group.as_str(), "-b", &b, "-s", "-C", "10"];
    if send_only {
        sargs.push("-o");
    }
    // The sender does not know whether the receiver has joined yet: it sends again while
    // the receiver waits (each run sends 10 messages; the receiver wants 10 in all).
    let mut sent = Vec::new();
    for _ in 0..50 {
        if !receiver.running() {
            break;
        }
        let r = run_bounded(drop_in("mckey", &sargs), LIMIT);
        assert!(ok(r.0), "mckey sender failed: {}\n{}", r.1, r.2);
        sent.push(r.1);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, out, err) = receiver.finish();
    assert!(ok(st), "mckey receiver failed: {out}\n{err}");
    assert!(out.contains("test complete"), "{out}");
    assert!(sent[0].contains("test complete"), "{}", sent[0]);
}

/// mckey: UD multicast over the CM (rdma_join_multicast_ex, rdma_create_qp_ex, address
/// handles on the group), one receiver and a full-member sender.
#[test]
fn mckey_multicast() {
    mckey(false);
}

/// mckey -o: the sender joins as a send-only full member.
#[test]
fn mckey_send_only_member() {
    mckey(true);
}

/// The CM's errors for bad calls (tests/c/rdmacm_errors.c).
#[test]
fn rdmacm_bad_input() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("rdmacm_errors", &["rdmacm_errors.c"]);
    let a = unique_addr().to_string();
    let (st, out, err) = run_bounded(
        {
            let mut c = command(&exe);
            c.arg(&a);
            c
        },
        LIMIT,
    );
    assert!(ok(st), "rdmacm_errors failed:\n{out}\n{err}");
    assert!(out.contains("all checks passed"), "{out}");
}

/// A connection's events with both ends in one process (tests/c/rdmacm_events.c): the new
/// id of CONNECT_REQUEST, private data in REQ, REJ and REP, the QP states, DISCONNECTED.
#[test]
fn rdmacm_connection_events() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("rdmacm_events", &["rdmacm_events.c"]);
    let mut c = command(&exe);
    c.arg(unique_addr().to_string());
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(ok(st), "rdmacm_events failed:\n{out}\n{err}");
    assert!(out.contains("all checks passed"), "{out}");
}

/// Event channels destroyed while a thread of the program still waits on them, as rping does
/// at exit (tests/c/channel_destroyed_while_waiting.c): the waiting threads stay blocked, as
/// with rdma-core, and the program ends normally (a waiter that touched the freed channel
/// crashed it, or got EBADF, on which rping's CM thread exits with -1).
#[test]
fn channels_destroyed_while_a_thread_waits_leave_it_waiting() {
    if !have_headers() {
        return;
    }
    let exe = compile_c(
        "channel_destroyed_while_waiting",
        &["channel_destroyed_while_waiting.c"],
    );
    let mut c = command(&exe);
    c.arg(unique_addr().to_string());
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(
        ok(st),
        "channel_destroyed_while_waiting failed ({st:?}):\n{out}\n{err}"
    );
    assert!(out.contains("channel_destroyed_while_waiting: ok"), "{out}");
}

/// Calls on channels the program has already destroyed (tests/c/channel_used_after_destroy.c),
/// as rping's CM thread makes one when main destroys the channel between two of its calls:
/// no crash and no freed memory read; `rdma_get_cm_event`/`ibv_get_cq_event` wait on a
/// blocking descriptor and fail with EBADF on a non-blocking one, other calls fail with
/// EBADF, and channels made afterwards work.
#[test]
fn calls_on_destroyed_channels_wait_or_fail_with_ebadf() {
    if !have_headers() {
        return;
    }
    let exe = compile_c(
        "channel_used_after_destroy",
        &["channel_used_after_destroy.c"],
    );
    let mut c = command(&exe);
    c.arg(unique_addr().to_string());
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(
        ok(st),
        "channel_used_after_destroy failed ({st:?}):\n{out}\n{err}"
    );
    assert!(out.contains("channel_used_after_destroy: ok"), "{out}");
}

/// qperf (Debian's qperf 0.4.11), unmodified: its RC tests through rdma_cm (`-cm1`, which a
/// RoCE device needs: without it qperf addresses its peer by LID alone, and its UC and UD
/// tests never use rdma_cm, so on RoCE, softrdma's or a NIC's, those fail with EINVAL as the
/// kernel makes them fail). Its server forks a process per test and sends the client the
/// port before it listens (the client's request may reach the server's device before the
/// listener does); each side stops a test on SIGALRM, whose handler has no SA_RESTART and
/// must interrupt the wait in `ibv_get_cq_event`. Checks every test printed its result.
#[test]
fn qperf_rc_tests_over_rdma_cm() {
    if !Path::new("/usr/bin/qperf").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI must install qperf");
        eprintln!("skipped: /usr/bin/qperf is missing (qperf)");
        return;
    }
    let (sa, ca) = (unique_addr().to_string(), unique_addr().to_string());
    let port = free_tcp_port().to_string();
    let child = drop_in("qperf", &["--listen_port", &port])
        .env("SOFTRDMA_DEVICES", &sa)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the qperf server");
    let server = Server {
        child,
        name: format!("qperf --listen_port {port}"),
    };
    let t0 = std::time::Instant::now();
    while !tcp_listening(port.parse().unwrap()) && t0.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    let tests = [
        ("rc_lat", "latency"),
        ("rc_bw", "bw"),
        ("rc_bi_bw", "bw"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_write_poll_lat", "latency"),
        ("rc_compare_swap_mr", "msg_rate"),
        ("rc_fetch_add_mr", "msg_rate"),
        ("ver_rc_compare_swap", "msg_rate"),
        ("ver_rc_fetch_add", "msg_rate"),
    ];
    let mut args = vec![sa.as_str(), "--listen_port", &port, "-cm1", "-t", "1"];
    args.extend(tests.iter().map(|t| t.0));
    let mut c = drop_in("qperf", &args);
    c.env("SOFTRDMA_DEVICES", &ca);
    let (st, out, err) = run_bounded(c, Duration::from_secs(240));
    let (so, se) = server.kill();
    let report = format!("{out}\n{err}\n--- server\n{so}\n{se}");
    assert!(ok(st), "{st:?}\n{report}");
    // Each test's name on a line of its own, then its result ("    latency  =  30.7 us").
    let lines: Vec<&str> = out.lines().collect();
    for (name, what) in tests {
        let at = lines
            .iter()
            .position(|l| l.trim() == format!("{name}:"))
            .unwrap_or_else(|| panic!("no {name} in\n{report}"));
        let result = lines.get(at + 1).copied().unwrap_or("");
        assert!(
            result.trim_start().starts_with(what) && result.contains('='),
            "{name}: {result:?}\n{report}"
        );
    }
}
