//! The librdmacm and libibverbs example programs (examples/rdma_server, rdma_client, udaddy,
//! mckey, cmtime, rc_pingpong, uc_pingpong, ud_pingpong, srq_pingpong) run as their rdma-core
//! originals do: server and client in two processes on loopback "devices" (addresses of each
//! test's own, see `softrdma::testing`; the TCP ports of the pingpong exchanges are free ones
//! the kernel picked), each bounded by a deadline so that a hang fails the test instead of hanging CI.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text: a device address of the test's own.
fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

/// The example binary `name`, which `cargo test` builds into target/<profile>/examples.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: `cargo test` builds the examples (cargo build --examples)",
        p.display()
    );
    p
}

fn spawn(name: &str, args: &[&str]) -> Child {
    Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` up to `limit`, killing it past that; returns its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts a server and waits until it prints `ready` (it is listening).
fn server(name: &str, args: &[&str], ready: &str) -> Child {
    server_with_output(name, args, ready).0
}

/// [`server`], with the server's whole standard output delivered on the receiver once the
/// server closes it.
fn server_with_output(
    name: &str,
    args: &[&str],
    ready: &str,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = spawn(name, args);
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (all_tx, all_rx) = std::sync::mpsc::channel();
    let ready = ready.to_string();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut all = String::new();
        let mut line = String::new();
        let mut sent = false;
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            all.push_str(&line);
            if !sent && line.contains(&ready) {
                let _ = tx.send(());
                sent = true;
            }
            line.clear();
        }
        let _ = all_tx.send(all);
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the server did not start listening");
    (child, all_rx)
}

/// Waits until some process listens on TCP `port` (any address), as /proc/net/tcp{,6} show.
/// rc_pingpong prints its local address before it listens, as ibv_rc_pingpong does, so the
/// client must not be started on that line alone; connecting to probe would take the
/// server's only accept.
fn wait_listening(port: u16) {
    let t = Instant::now();
    let want = format!(":{port:04X}");
    loop {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(s) = std::fs::read_to_string(table) else {
                continue;
            };
            // "sl local_address rem_address st ...": st 0A is LISTEN.
            let listening = s.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
            });
            if listening {
                return;
            }
        }
        if t.elapsed() > Duration::from_secs(60) {
            panic!("nothing listens on TCP port {port} after 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn rdma_server_and_rdma_client_exchange_a_message() {
    let ip_80 = unique();
    let ip_81 = unique();
    let (s, s_out) = server_with_output(
        "rdma_server",
        // rdma-core's flag for the address to listen on.
        &["-s", ip_80.as_str(), "-p", "7480"],
        "listening",
    );
    let c = finish(
        spawn(
            "rdma_client",
            &["-s", ip_80.as_str(), "-p", "7480", "-b", ip_81.as_str()],
        ),
        LIMIT,
    );
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(text(&c).contains("rdma_client: end 0"));
    let s = finish(s, LIMIT);
    let st = format!("{}{}", s_out.recv().unwrap_or_default(), text(&s));
    assert!(s.status.success(), "server: {st}");
    // The server got the client's message, and (as rdma-core's pair) answered with its own
    // unfilled buffer, which the client takes as it is.
    assert!(
        st.contains("rdma_server: received \"softrdma client!\""),
        "{st}"
    );
}

/// A device that does not listen on the port answers the REQ with REJ 8 (invalid service
/// ID): the synchronous rdma_connect fails with ECONNREFUSED at once.
#[test]
fn rdma_client_to_a_port_nobody_listens_on_fails_with_connection_refused() {
    let ip_82 = unique();
    let ip_83 = unique();
    let mut s = server(
        "rdma_server",
        &["-a", ip_82.as_str(), "-p", "7482"],
        "listening",
    );
    let c = finish(
        spawn(
            "rdma_client",
            &["-s", ip_82.as_str(), "-p", "7481", "-b", ip_83.as_str()],
        ),
        LIMIT,
    );
    let _ = s.kill();
    let _ = s.wait();
    // rdma-core's rdma_client returns -1 from main: status 255.
    assert_eq!(c.status.code(), Some(255), "{}", text(&c));
    let t = text(&c);
    assert!(
        t.contains("rdma_connect") && t.contains("REJECTED") && t.contains("rdma_client: end -1"),
        "{t}"
    );
}

/// rdma_server and rdma_client print rdma-core's usage on stdout and exit with status 1.
#[test]
fn rdma_server_and_rdma_client_usage_goes_to_stdout_with_status_1() {
    for prog in ["rdma_server", "rdma_client"] {
        let o = finish(spawn(prog, &["-x"]), LIMIT);
        assert_eq!(o.status.code(), Some(1), "{prog}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.starts_with(&format!(
                "usage: {prog}\n\t[-s server_address]\n\t[-p port_number]\n"
            )),
            "{prog}: {out}"
        );
    }
}

/// udaddy's server on `server_ip` and client on `client_ip`: two SIDR lookups, ten 100-byte
/// datagrams each way per connection, replies through address handles made from the
/// received work completions; both must end with status 0.
fn udaddy_pair(server_ip: &str, client_ip: &str) {
    let s = server("udaddy", &["-b", server_ip, "-c", "2"], "listening");
    let c = finish(
        spawn(
            "udaddy",
            &[
                "-s", server_ip, "-b", client_ip, "-c", "2", "-C", "10", "-S", "100",
            ],
        ),
        LIMIT,
    );
    assert!(c.status.success(), "client: {}", text(&c));
    let s = finish(s, LIMIT);
    assert!(s.status.success(), "server: {}", text(&s));
    // (The server's stdout is read by `server`; its exit status says it completed.)
    let t = text(&c);
    assert!(
        t.contains("data transfers complete") && t.contains("return status 0"),
        "{t}"
    );
}

/// udaddy with server and client on devices of their own.
#[test]
fn udaddy_server_and_client_exchange_datagrams_over_sidr() {
    udaddy_pair(&unique(), &unique());
}

/// udaddy's server and client as two processes on one shared device: the SIDR_REQ reaches
/// the process that listens on the service, the SIDR_REP the one that asked, and the UD
/// datagrams each QP's process.
#[test]
fn udaddy_server_and_client_share_one_device() {
    let ip = unique();
    udaddy_pair(&ip, &ip);
}

/// A udaddy client with no server behind the port: the SIDR lookup fails (status 1).
#[test]
fn udaddy_client_without_a_server_reports_unreachable() {
    let ip_86 = unique();
    let ip_87 = unique();
    let mut s = server(
        "rdma_server",
        &["-a", ip_86.as_str(), "-p", "7486"],
        "listening",
    );
    let c = finish(
        spawn("udaddy", &["-s", ip_86.as_str(), "-b", ip_87.as_str()]),
        LIMIT,
    );
    let _ = s.kill();
    let _ = s.wait();
    // rdma-core's udaddy prints the event on stdout and returns its status (1 here).
    assert_eq!(c.status.code(), Some(1), "{}", text(&c));
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(
        out.contains("udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1\n")
            && out.contains("return status 1\n"),
        "{out}"
    );
}

/// udaddy checks the message size against the port's active MTU (4096 on loopback) as
/// rdma-core's does: a client returns -EINVAL (exit status 234) before it connects; a server
/// rejects the request and completes with nothing to transfer (status 0), and its client
/// sees the SIDR lookup fail. `-p 0x111`, `-P udp` and `-f ip` are rdma-core's flags.
#[test]
fn udaddy_refuses_messages_larger_than_the_active_mtu() {
    let ip_0_3_1 = unique();
    let ip_0_3_2 = unique();
    let ip_0_3_3 = unique();
    let ip_0_3_4 = unique();
    let c = finish(
        spawn(
            "udaddy",
            &[
                "-s",
                ip_0_3_1.as_str(),
                "-b",
                ip_0_3_2.as_str(),
                "-S",
                "5000",
                "-p",
                "0x111",
                "-P",
                "udp",
                "-f",
                "ip",
            ],
        ),
        LIMIT,
    );
    assert_eq!(c.status.code(), Some(234), "{}", text(&c));
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(
        out.contains("udaddy: message_size 5000 is larger than active mtu 4096\n")
            && out.contains("return status -22\n"),
        "{out}"
    );

    let (s, s_out) = server_with_output(
        "udaddy",
        &["-b", ip_0_3_3.as_str(), "-S", "5000"],
        "listening",
    );
    let c = finish(
        spawn(
            "udaddy",
            &[
                "-s",
                ip_0_3_3.as_str(),
                "-b",
                ip_0_3_4.as_str(),
                "-S",
                "1000",
                "-C",
                "1",
            ],
        ),
        LIMIT,
    );
    assert!(!c.status.success(), "client: {}", text(&c));
    assert!(
        text(&c).contains("RDMA_CM_EVENT_UNREACHABLE"),
        "{}",
        text(&c)
    );
    let s = finish(s, LIMIT);
    let st = s_out.recv().unwrap_or_default();
    assert!(s.status.success(), "server: {st}{}", text(&s));
    assert!(
        st.contains("udaddy: failing connection request\n") && st.contains("return status 0\n"),
        "{st}"
    );
}

/// Usage errors print rdma-core's usage text on stdout and exit with status 1.
#[test]
fn udaddy_usage_goes_to_stdout_with_status_1() {
    let ip_0_3_5 = unique();
    for args in [
        &["-x"][..],
        &["-s"][..],
        &["-b", ip_0_3_5.as_str(), "-C"][..],
    ] {
        let o = finish(spawn("udaddy", args), LIMIT);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.starts_with("usage: udaddy\n") && out.contains("\t[-P port_space]\n"),
            "{args:?}: {out}"
        );
    }
}

/// mckey: two receivers in two processes join a group; a sender (a send-only member, not
/// attached) sends ten datagrams to it; each receiver gets all ten, byte-exact.
#[test]
fn mckey_receivers_in_two_processes_get_every_datagram_a_sender_multicasts() {
    let ip_88 = unique();
    let ip_92 = unique();
    let ip_89 = unique();
    let group = softrdma::testing::unique_multicast_group().to_string();
    let g = group.as_str();
    let r1 = server(
        "mckey",
        &["-m", g, "-b", ip_88.as_str(), "-C", "10"],
        "joined",
    );
    let r2 = server(
        "mckey",
        &["-m", g, "-b", ip_92.as_str(), "-C", "10"],
        "joined",
    );
    let s = finish(
        spawn(
            "mckey",
            &[
                "-m",
                g,
                "-b",
                ip_89.as_str(),
                "-s",
                "-o",
                "-C",
                "10",
                "-S",
                "200",
            ],
        ),
        LIMIT,
    );
    assert!(s.status.success(), "sender: {}", text(&s));
    assert!(text(&s).contains("return status 0"));
    // rdma-core's lines: "joining", then the group's GID (IPv4-mapped).
    assert!(
        text(&s).contains(&format!(
            "mckey: joining\nmckey: joined dgid: ::ffff:{g} mlid 0x0 sl 0\n"
        )),
        "{}",
        text(&s)
    );
    // The receivers post 100-byte buffers by default: 200-byte datagrams do not fit
    // (IBV_WC_LOC_LEN_ERR), as on a real device. rdma-core's mckey counts those completions
    // as received and ends with status 0; this one does too, and says what failed.
    for r in [r1, r2] {
        let o = finish(r, LIMIT);
        assert!(o.status.success(), "as rdma-core's mckey: {}", text(&o));
        assert!(
            text(&o).contains("mckey: completion failed: local length error"),
            "{}",
            text(&o)
        );
    }
    let r1 = server(
        "mckey",
        &["-m", g, "-b", ip_88.as_str(), "-C", "10", "-S", "200"],
        "joined",
    );
    let r2 = server(
        "mckey",
        &["-m", g, "-b", ip_92.as_str(), "-C", "10", "-S", "200"],
        "joined",
    );
    let s = finish(
        spawn(
            "mckey",
            &["-m", g, "-b", ip_89.as_str(), "-s", "-C", "10", "-S", "200"],
        ),
        LIMIT,
    );
    assert!(s.status.success(), "sender: {}", text(&s));
    for r in [r1, r2] {
        let o = finish(r, LIMIT);
        assert!(o.status.success(), "receiver: {}", text(&o));
        // Every datagram whole and of the sender's size.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("mckey: "), "receiver: {err}");
    }
}

/// mckey with two receivers and the sender as three processes on one shared device: each
/// receiver's group socket gets its own copy, and each ends after all ten datagrams.
#[test]
fn mckey_receivers_and_sender_share_one_device() {
    let ip = unique();
    let group = softrdma::testing::unique_multicast_group().to_string();
    let g = group.as_str();
    let args = ["-m", g, "-b", ip.as_str(), "-C", "10", "-S", "200"];
    let r1 = server("mckey", &args, "joined");
    let r2 = server("mckey", &args, "joined");
    let mut sargs = args.to_vec();
    sargs.push("-s");
    let s = finish(spawn("mckey", &sargs), LIMIT);
    assert!(s.status.success(), "sender: {}", text(&s));
    for r in [r1, r2] {
        let o = finish(r, LIMIT);
        assert!(o.status.success(), "receiver: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("mckey: "), "receiver: {err}");
    }
}

#[test]
fn mckey_refuses_bad_arguments() {
    let ip_93 = unique();
    // Usage on stdout, status 1, as rdma-core's; -p takes the port space's number.
    for args in [&["-x"][..], &["-m", "239.255.88.2", "-C"][..]] {
        let o = finish(spawn("mckey", args), LIMIT);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with("usage: mckey\n"), "{args:?}: {out}");
    }
    // Without -m (or with a group that is no address) rdma-core's mckey fails in
    // getaddrinfo and returns EAI_NONAME (-2): status 254.
    for args in [
        &["-b", ip_93.as_str()][..],
        &["-m", "no-such-group", "-b", ip_93.as_str()],
    ] {
        let o = finish(spawn("mckey", args), LIMIT);
        assert_eq!(o.status.code(), Some(254), "{args:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("getaddrinfo failed") && out.contains("return status -2\n"),
            "{args:?}: {out}"
        );
    }
    let o = finish(
        spawn("mckey", &["-m", "127.0.0.1", "-b", ip_93.as_str()]),
        LIMIT,
    );
    assert!(
        !o.status.success() && text(&o).contains("rdma_join_multicast"),
        "{}",
        text(&o)
    );
}

/// The number after `"key":` in a `cmtime-json {...}` line.
fn json_number(line: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let at = line
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + pat.len();
    let end = line[at..].find([',', '}']).map_or(line.len(), |e| at + e);
    line[at..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {line}"))
}

/// cmtime: 50 connections with RC QPs set up concurrently over one event channel (own QPs
/// moved with rdma_init_qp_attr, completed with rdma_establish), torn down, then 50 without
/// QPs; the client's machine-readable line carries the rates and the memory per QP.
#[test]
fn cmtime_server_and_client_connect_and_disconnect_fifty_connections() {
    let ip_90 = unique();
    let ip_91 = unique();
    let s = server(
        "cmtime",
        &["-b", ip_90.as_str(), "-p", "7490", "-c", "50"],
        "Server warmup",
    );
    let c = finish(
        spawn(
            "cmtime",
            &[
                "-s",
                ip_90.as_str(),
                "-b",
                ip_91.as_str(),
                "-p",
                "7490",
                "-c",
                "50",
            ],
        ),
        LIMIT,
    );
    assert!(c.status.success(), "client: {}", text(&c));
    let s = finish(s, LIMIT);
    assert!(s.status.success(), "server: {}", text(&s));
    let t = text(&c);
    assert!(t.contains("Connect (50) QPs test"), "{t}");
    assert!(t.contains("Connect (50) test - no QPs"), "{t}");
    assert!(t.contains("cm connect   :"), "{t}");
    let json = t
        .lines()
        .find(|l| l.starts_with("cmtime-json {"))
        .unwrap_or_else(|| panic!("no cmtime-json line: {t}"));
    assert_eq!(json_number(json, "connections"), 50.0, "{json}");
    assert!(json_number(json, "connect_per_sec") > 0.0, "{json}");
    assert!(json_number(json, "disconnect_per_sec") > 0.0, "{json}");
    assert!(json.contains("\"role\":\"client\""), "{json}");
    // Memory per QP is reported (its value depends on the allocator: no bound here).
    json_number(json, "rss_per_qp_bytes");
}

/// rc_pingpong (libibverbs' ibv_rc_pingpong): server and client exchange their QP number,
/// PSN and GID over TCP, connect their QPs by hand and SEND 300 messages each way, polling
/// (first run) and sleeping on completion events (second run); both print the summary.
#[test]
fn rc_pingpong_server_and_client_ping_pong_over_their_own_exchange() {
    let ip_150 = unique();
    let ip_151 = unique();
    for extra in [None, Some("-e")] {
        let port = softrdma::testing::unused_tcp_port().to_string();
        let port = port.as_str();
        let mut args = vec![
            "-d",
            ip_150.as_str(),
            "-g",
            "0",
            "-p",
            port,
            "-n",
            "300",
            "-s",
            "2000",
        ];
        args.extend(extra);
        let s = server("rc_pingpong", &args, "local address:");
        wait_listening(port.parse().unwrap());
        args[1] = ip_151.as_str();
        args.push(ip_150.as_str());
        let c = finish(spawn("rc_pingpong", &args), LIMIT);
        assert!(c.status.success(), "client: {}", text(&c));
        let s = finish(s, LIMIT);
        assert!(s.status.success(), "server: {}", text(&s));
        let t = text(&c);
        assert!(
            t.contains("remote address: LID 0x0000, QPN 0x")
                && t.contains(&format!("GID ::ffff:{ip_150}")),
            "{t}"
        );
        assert!(t.contains("1200000 bytes in "), "{t}");
        assert!(t.contains("300 iters in "), "{t}");
        assert!(t.contains(" usec/iter") && t.contains(" Mbit/sec"), "{t}");
    }
}

/// Without -g the GID sent is zero, and a RoCE QP cannot be connected without a GRH: both
/// sides fail, as ibv_rc_pingpong does on RoCE without -g.
#[test]
fn rc_pingpong_without_a_gid_index_cannot_connect() {
    let ip_152 = unique();
    let ip_153 = unique();
    let port = softrdma::testing::unused_tcp_port().to_string();
    let s = server(
        "rc_pingpong",
        &["-d", ip_152.as_str(), "-p", port.as_str()],
        "local address:",
    );
    wait_listening(port.parse().unwrap());
    let c = finish(
        spawn(
            "rc_pingpong",
            &["-d", ip_153.as_str(), "-p", port.as_str(), ip_152.as_str()],
        ),
        LIMIT,
    );
    let s = finish(s, LIMIT);
    assert!(!s.status.success(), "server: {}", text(&s));
    assert!(text(&s).contains("RTR"), "server: {}", text(&s));
    assert!(!c.status.success(), "client: {}", text(&c));
}

/// A client with no server behind the port fails as ibv_rc_pingpong does: "Couldn't connect
/// to host:port", exit status 1.
#[test]
fn rc_pingpong_client_without_a_server_cannot_connect() {
    let ip_0_3_7 = unique();
    let ip_0_3_6 = unique();
    // A port nobody listens on (a listener on another address's port would answer).
    let port = softrdma::testing::unused_tcp_port().to_string();
    let o = finish(
        spawn(
            "rc_pingpong",
            &[
                "-d",
                ip_0_3_7.as_str(),
                "-g",
                "0",
                "-p",
                port.as_str(),
                ip_0_3_6.as_str(),
            ],
        ),
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("Couldn't connect to {ip_0_3_6}:{port}")),
        "{}",
        text(&o)
    );
}

/// uc_pingpong and ud_pingpong (libibverbs' ibv_uc_pingpong and ibv_ud_pingpong): the same
/// exchange as rc_pingpong, then 300 SENDs each way over a UC QP, and over a UD QP through
/// an address handle (the GRH's 40 bytes in front of each received message), with `-c`:
/// the server finds the client's marks. UD's local address line has its colon after the PSN.
#[test]
fn uc_and_ud_pingpong_server_and_client_ping_pong() {
    let ip_154 = unique();
    let ip_155 = unique();
    for (prog, size, bytes) in [
        ("uc_pingpong", "2000", "1200000"),
        ("ud_pingpong", "1024", "614400"),
    ] {
        let port = softrdma::testing::unused_tcp_port().to_string();
        let port = port.as_str();
        let mut args = vec![
            "-d",
            ip_154.as_str(),
            "-g",
            "0",
            "-p",
            port,
            "-n",
            "300",
            "-s",
            size,
            "-c",
        ];
        let (s, out) = server_with_output(prog, &args, "local address:");
        wait_listening(port.parse().unwrap());
        args[1] = ip_155.as_str();
        args.push(ip_154.as_str());
        let c = finish(spawn(prog, &args), LIMIT);
        assert!(c.status.success(), "{prog} client: {}", text(&c));
        let s = finish(s, LIMIT);
        let st = format!("{}{}", out.recv().unwrap_or_default(), text(&s));
        assert!(s.status.success(), "{prog} server: {st}");
        let t = text(&c);
        assert!(
            t.contains("remote address: LID 0x0000, QPN 0x")
                && t.contains(&format!("GID ::ffff:{ip_154}")),
            "{t}"
        );
        assert!(t.contains(&format!("{bytes} bytes in ")), "{t}");
        assert!(
            t.contains("300 iters in ") && st.contains("300 iters in "),
            "{t}\n{st}"
        );
        assert!(!st.contains("invalid data"), "{st}");
        let colon = st.lines().any(|l| {
            l.contains("local address:") && l.contains(", PSN 0x") && l.contains(": GID ")
        });
        assert_eq!(colon, prog == "ud_pingpong", "{st}");
    }
}

/// rc, uc and ud_pingpong with server and client as two processes on one shared device:
/// the QP numbers they exchange carry each process's slot, and every SEND reaches its QP.
#[test]
fn pingpongs_share_one_device() {
    let ip = unique();
    for (prog, size) in [
        ("rc_pingpong", "4096"),
        ("uc_pingpong", "2000"),
        ("ud_pingpong", "1024"),
    ] {
        let port = softrdma::testing::unused_tcp_port().to_string();
        let port = port.as_str();
        let mut args = vec![
            "-d",
            ip.as_str(),
            "-g",
            "0",
            "-p",
            port,
            "-n",
            "200",
            "-s",
            size,
            "-c",
        ];
        let (s, out) = server_with_output(prog, &args, "local address:");
        wait_listening(port.parse().unwrap());
        args.push(ip.as_str());
        let c = finish(spawn(prog, &args), LIMIT);
        assert!(c.status.success(), "{prog} client: {}", text(&c));
        let s = finish(s, LIMIT);
        let st = format!("{}{}", out.recv().unwrap_or_default(), text(&s));
        assert!(s.status.success(), "{prog} server: {st}");
        assert!(text(&c).contains("200 iters in "), "{}", text(&c));
        assert!(!st.contains("invalid data"), "{st}");
    }
}

/// ud_pingpong refuses a message larger than the port's MTU (4096 on loopback) before it
/// creates anything, and `-m` (a flag of rc and uc only); uc_pingpong refuses rc's `-o`.
#[test]
fn ud_pingpong_refuses_sizes_above_the_port_mtu_and_foreign_flags() {
    let ip_156 = unique();
    let o = finish(
        spawn(
            "ud_pingpong",
            &["-d", ip_156.as_str(), "-s", "5000", ip_156.as_str()],
        ),
        LIMIT,
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("Requested size larger than port MTU (4096)"),
        "{}",
        text(&o)
    );
    for (prog, flag) in [("ud_pingpong", "-m"), ("uc_pingpong", "-o")] {
        let args: &[&str] = if flag == "-m" {
            &[flag, "1024"]
        } else {
            &[flag]
        };
        let o = finish(spawn(prog, args), LIMIT);
        assert!(!o.status.success(), "{prog} {flag}");
        assert!(text(&o).contains("Usage:"), "{prog} {flag}: {}", text(&o));
    }
}

/// srq_pingpong (libibverbs' ibv_srq_pingpong): 16 RC QPs per side whose receives come from
/// one SRQ, 256 addresses exchanged each way, 600 SENDs in all (the counts are shared by the
/// QPs), polling and then with completion events, with `-c`; and `-q` above `-r` refused.
#[test]
fn srq_pingpong_server_and_client_over_16_qps_and_one_srq() {
    let ip_157 = unique();
    let ip_158 = unique();
    for extra in [None, Some("-e")] {
        let port = softrdma::testing::unused_tcp_port().to_string();
        let port = port.as_str();
        let mut args = vec![
            "-d",
            ip_157.as_str(),
            "-g",
            "0",
            "-p",
            port,
            "-n",
            "600",
            "-s",
            "1000",
            "-c",
        ];
        args.extend(extra);
        let (s, out) = server_with_output("srq_pingpong", &args, "local address:");
        wait_listening(port.parse().unwrap());
        args[1] = ip_158.as_str();
        args.push(ip_157.as_str());
        let c = finish(spawn("srq_pingpong", &args), LIMIT);
        assert!(c.status.success(), "client: {}", text(&c));
        let s = finish(s, LIMIT);
        let st = format!("{}{}", out.recv().unwrap_or_default(), text(&s));
        assert!(s.status.success(), "server: {st}");
        let t = text(&c);
        assert_eq!(
            t.matches("local address:  LID 0x0000, QPN 0x").count(),
            16,
            "{t}"
        );
        assert_eq!(
            t.matches("remote address: LID 0x0000, QPN 0x").count(),
            16,
            "{t}"
        );
        assert!(
            t.contains("1200000 bytes in ") && t.contains("600 iters in "),
            "{t}"
        );
        assert!(
            st.contains("600 iters in ") && !st.contains("invalid data"),
            "{st}"
        );
    }
    let o = finish(
        spawn("srq_pingpong", &["-q", "20", "-r", "10", ip_157.as_str()]),
        LIMIT,
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "rx_depth 10 is too small for 20 QPs -- must have at least one receive per QP."
        ),
        "{}",
        text(&o)
    );
}
