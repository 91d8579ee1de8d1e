//! The examples as programs: `examples/rping` runs as server and client in two processes on
//! loopback addresses of their own (each test's, see `softrdma::testing`), pings with verification at several
//! sizes and with self-created QPs (`-q`), serves two clients in a row as a persistent
//! server, and fails clearly against a port nobody listens on.
//!
//! `cargo test -p softrdma` builds the examples into target/<profile>/examples/ next to
//! this test's deps/ directory; when only this test target is built (`--test examples`),
//! build them first with `cargo build -p softrdma --examples`.
//!
//! Every wait is bounded: a process still running after a generous deadline is killed and
//! the test fails, so a hang cannot stall CI. No assertion depends on timing.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A loopback address no other process on this machine uses (see `softrdma::testing`), as
/// text: a device address of the test's own.
fn unique() -> String {
    softrdma::testing::unique_loopback_addr().to_string()
}

/// How long any one process may take before it is killed (a hang, not a slow machine).
const DEADLINE: Duration = Duration::from_secs(180);

fn rping_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    // target/<profile>/deps/<test> → target/<profile>/examples/rping
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = dir.join("examples").join("rping");
    assert!(
        bin.exists(),
        "{} is missing: build the examples (cargo build -p softrdma --examples)",
        bin.display()
    );
    bin
}

/// A running example with its output collected by reader threads; killed on drop.
struct Proc {
    name: String,
    child: Child,
    lines: Receiver<String>,
    out: Vec<String>,
    stdout_thread: Option<JoinHandle<()>>,
    stderr_thread: Option<JoinHandle<String>>,
}

impl Proc {
    fn spawn(name: &str, args: &[&str]) -> Proc {
        let mut child = Command::new(rping_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting rping");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = channel();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Proc {
            name: name.to_string(),
            child,
            lines,
            out: Vec::new(),
            stdout_thread: Some(stdout_thread),
            stderr_thread: Some(stderr_thread),
        }
    }

    /// Reads stdout until a line equal to `want` (bounded by the deadline).
    fn wait_for_line(&mut self, want: &str) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l == want;
                    self.out.push(l);
                    if hit {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("{}: no {want:?} line before the deadline", self.name);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.wait();
                    let err = self.stderr_thread.take().map(|t| t.join().unwrap());
                    panic!(
                        "{} ended ({st:?}) before printing {want:?}\nstdout: {:?}\nstderr: {}",
                        self.name,
                        self.out,
                        err.unwrap_or_default()
                    );
                }
            }
        }
    }

    /// Whether the process is still running.
    fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the exit (killing the process after the deadline) and returns the exit
    /// status (None when it had to be killed), the stdout lines and stderr.
    fn finish(mut self) -> (Option<ExitStatus>, Vec<String>, String) {
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break Some(s);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.collect(status)
    }

    /// Kills the process (a persistent server) and returns its output.
    fn kill(mut self) -> (Option<ExitStatus>, Vec<String>, String) {
        let _ = self.child.kill();
        let st = self.child.wait().ok();
        self.collect(st)
    }

    fn collect(&mut self, status: Option<ExitStatus>) -> (Option<ExitStatus>, Vec<String>, String) {
        if let Some(t) = self.stdout_thread.take() {
            t.join().unwrap();
        }
        while let Ok(l) = self.lines.try_recv() {
            self.out.push(l);
        }
        let err = self
            .stderr_thread
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        (status, std::mem::take(&mut self.out), err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The data of ping `n` of `size` bytes as rping fills it: "rdma-ping-N: ", then letters
/// from 'A' + n (mod 58) upwards, 'A'..='z' rotating, and a NUL at the end.
fn ping_data(n: u32, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{n}: ").into_bytes();
    let mut c = b'A' + (n % 58) as u8;
    while v.len() < size {
        v.push(c);
        c = if c == b'z' { b'A' } else { c + 1 };
    }
    v.truncate(size);
    v[size - 1] = 0;
    v
}

fn expected_line(prefix: &str, n: u32, size: usize) -> String {
    let d = ping_data(n, size);
    format!(
        "{prefix}{}",
        String::from_utf8(d[..size - 1].to_vec()).unwrap()
    )
}

/// A server that is listening (it says so with -d).
fn server(name: &str, args: &[&str]) -> Proc {
    let mut s = Proc::spawn(name, args);
    s.wait_for_line("rdma_listen successful");
    s
}

/// Runs a client to completion and checks its 20 verified pings.
fn ping_ok(name: &str, args: &[&str], size: usize, count: u32) {
    let (st, out, err) = Proc::spawn(name, args).finish();
    assert!(
        st.is_some_and(|s| s.success()),
        "{name}: {st:?}\nstderr: {err}\nstdout: {out:?}"
    );
    let pings: Vec<&String> = out
        .iter()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    assert_eq!(pings.len(), count as usize, "{name}: {out:?}");
    for (n, l) in pings.iter().enumerate() {
        assert_eq!(**l, expected_line("ping data: ", n as u32, size), "{name}");
    }
}

#[test]
fn rping_pings_with_verification_at_several_sizes() {
    let ip_70 = unique();
    let ip_71 = unique();
    // Small, the minimum, around the 4096-byte path MTU, and the largest rping allows
    // (RPING_BUFSIZE - 1 = 65535). Default port (7174).
    // 23 is rping's minimum as rdma-core builds it (its ping header is then cut short).
    for size in [64usize, 23, 4095, 4096, 4097, 65535] {
        let s = size.to_string();
        let srv = server(
            &format!("server -S {size}"),
            &["-s", "-a", &ip_70, "-S", &s, "-v", "-d"],
        );
        ping_ok(
            &format!("client -S {size}"),
            &[
                "-c", "-a", &ip_70, "-I", &ip_71, "-S", &s, "-C", "20", "-v", "-V",
            ],
            size,
            20,
        );
        // A one-shot server ends when its client disconnects.
        let (st, out, err) = srv.finish();
        assert!(
            st.is_some_and(|s| s.success()),
            "server -S {size}: {st:?}\nstderr: {err}"
        );
        let lines: Vec<&String> = out
            .iter()
            .filter(|l| l.starts_with("server ping data: "))
            .collect();
        assert_eq!(lines.len(), 20, "server -S {size}");
        for (n, l) in lines.iter().enumerate() {
            assert_eq!(
                **l,
                expected_line("server ping data: ", n as u32, size),
                "server -S {size}"
            );
        }
    }
}

/// `-q`: the QPs are the applications' own, moved through INIT/RTR/RTS with
/// rdma_init_qp_attr (the server before rdma_accept, the client on CONNECT_RESPONSE, then
/// rdma_establish). Both sides with -q, and each side with -q against a peer without it
/// (the wire is the same).
#[test]
fn rping_with_self_created_qps_pings_with_verification() {
    let ip_70 = unique();
    let ip_71 = unique();
    for (server_q, client_q) in [(true, true), (false, true), (true, false)] {
        let name = format!("server -q {server_q}, client -q {client_q}");
        let mut sargs = vec!["-s", "-a", &ip_70, "-p", "7320", "-S", "1000", "-v", "-d"];
        let mut cargs = vec![
            "-c", "-a", &ip_70, "-p", "7320", "-I", &ip_71, "-S", "1000", "-C", "20", "-v", "-V",
        ];
        if server_q {
            sargs.push("-q");
        }
        if client_q {
            cargs.push("-q");
        }
        let srv = server(&format!("{name}: server"), &sargs);
        ping_ok(&format!("{name}: client"), &cargs, 1000, 20);
        let (st, out, err) = srv.finish();
        assert!(
            st.is_some_and(|s| s.success()),
            "{name}: server {st:?}\nstderr: {err}"
        );
        let lines: Vec<&String> = out
            .iter()
            .filter(|l| l.starts_with("server ping data: "))
            .collect();
        assert_eq!(lines.len(), 20, "{name}");
        for (n, l) in lines.iter().enumerate() {
            assert_eq!(
                **l,
                expected_line("server ping data: ", n as u32, 1000),
                "{name}"
            );
        }
        if server_q {
            assert!(
                out.iter().any(|l| l.ends_with("moved to RTS")),
                "{name}: {out:?}"
            );
        }
    }
}

#[test]
fn rping_persistent_server_serves_two_clients_in_a_row() {
    let ip_72 = unique();
    let ip_73 = unique();
    let mut srv = server(
        "persistent server",
        &["-s", "-P", "-a", &ip_72, "-p", "7301", "-S", "1000", "-d"],
    );
    for i in 0..2 {
        ping_ok(
            &format!("client {i}"),
            &[
                "-c", "-a", &ip_72, "-p", "7301", "-I", &ip_73, "-S", "1000", "-C", "20", "-v",
                "-V",
            ],
            1000,
            20,
        );
        assert!(srv.running(), "the persistent server stays up");
    }
    let (_, _, err) = srv.kill();
    assert!(!err.contains("rping:"), "server errors: {err}");
}

#[test]
fn rping_client_to_a_port_nobody_listens_on_fails_clearly() {
    let ip_74 = unique();
    let ip_75 = unique();
    // A server on ip_74 port 7310 makes the address a live device; port 7311 has no
    // listener, so the server side's CM rejects the request (reason 8).
    let _srv = server("server", &["-s", "-a", &ip_74, "-p", "7310", "-d"]);
    let (st, out, err) = Proc::spawn(
        "client",
        &["-c", "-a", &ip_74, "-p", "7311", "-I", &ip_75, "-C", "1"],
    )
    .finish();
    let st = st.expect("the client ends");
    // rping's CM thread exits with -1 on a REJECTED event: status 255.
    assert_eq!(st.code(), Some(255), "stdout: {out:?}\nstderr: {err}");
    assert!(err.contains("RDMA_CM_EVENT_REJECTED"), "{err}");
    assert!(err.contains("nobody listens"), "{err}");
}

/// Command lines rping refuses, refused as rping does: getopt's refusals print the usage
/// (stdout) and exit EINVAL (22); values out of range say so on stderr, without the usage,
/// EINVAL; an address that does not resolve is reported on stdout with status 254
/// (EAI_NONAME, -2).
#[test]
fn rping_usage_errors_exit_non_zero() {
    let ip_70 = unique();
    // (arguments, stderr says, stdout says, usage printed, exit status)
    let cases: [(&[&str], &str, &str, bool, i32); 8] = [
        (
            &["-c", "-a", &ip_70, "-S", "22"],
            "Invalid size 22 (valid range is 23 to 65536)",
            "",
            false,
            22,
        ),
        (
            &["-c", "-a", &ip_70, "-S", "65536"],
            "Invalid size 65536",
            "",
            false,
            22,
        ),
        (
            &["-c", "-a", &ip_70, "-C", "-1"],
            "Invalid count -1",
            "",
            false,
            22,
        ),
        (&["-a", &ip_70], "-s (server) or -c (client)", "", true, 22),
        (&["-c"], "needs the server's address", "", true, 22),
        (&["-c", "-x"], "unknown option -x", "", true, 22),
        // -C is read with atoi, as rping does: "abc" is 0 (ping forever), not an error.
        (
            &["-c", "-a", &ip_70, "-C", "abc", "-x"],
            "unknown option -x",
            "",
            true,
            22,
        ),
        (
            &["-c", "-a", "no-such-host.invalid"],
            "",
            "getaddrinfo failed",
            false,
            254,
        ),
    ];
    for (args, err_says, out_says, with_usage, code) in cases {
        let (st, out, err) = Proc::spawn("usage", args).finish();
        let st = st.expect("ends");
        assert_eq!(st.code(), Some(code), "{args:?}: {out:?} {err}");
        assert!(err.contains(err_says), "{args:?}: {err}");
        assert!(
            out_says.is_empty() || out.iter().any(|l| l.contains(out_says)),
            "{args:?}: {out:?}"
        );
        assert_eq!(
            out.iter().any(|l| l.starts_with("rping -c")),
            with_usage,
            "{args:?}: usage {out:?}"
        );
    }
}
