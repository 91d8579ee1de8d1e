//! Shared by the C-facing tests: links the drop-in libraries once per test binary and runs C
//! programs (compiled here against the installed rdma-core headers, or Debian's binaries)
//! with them on the library path.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// `target/<profile>`: the directory above the test binary's `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The static library cargo built with this test binary: `cargo test` leaves it in
/// `deps/` with its metadata hash (only `cargo build` copies it up to `target/<profile>`), so
/// the newest `deps/libsoftrdma_capi-*.a` is this build's.
fn staticlib(t: &Path) -> PathBuf {
    let newest = std::fs::read_dir(t.join("deps"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("libsoftrdma_capi-") && n.ends_with(".a")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    let a = newest
        .map(|(_, p)| p)
        .unwrap_or_else(|| t.join("libsoftrdma_capi.a"));
    assert!(
        a.exists(),
        "{} is missing: cargo builds it with the tests",
        a.display()
    );
    a
}

/// The directory holding `libibverbs.so.1` and `librdmacm.so.1`, linked by `link.sh` from
/// the static library cargo built for this test run (one directory per test binary, so
/// parallel test binaries never race on the files).
pub fn libdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let t = target_dir();
        let a = staticlib(&t);
        let name = std::env::current_exe()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let out = t.join("capi-test").join(name);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("link.sh");
        let st = Command::new("bash")
            .arg(&script)
            .arg(&a)
            .arg(&out)
            .status()
            .expect("running link.sh");
        assert!(st.success(), "link.sh failed");
        out
    })
}

/// Whether `cc` and the rdma-core headers are installed (CI installs libibverbs-dev and
/// librdmacm-dev; elsewhere the C tests say what is missing and pass without running).
pub fn have_headers() -> bool {
    let ok = Path::new("/usr/include/infiniband/verbs.h").exists()
        && Path::new("/usr/include/rdma/rdma_cma.h").exists()
        && Command::new("cc").arg("--version").output().is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install libibverbs-dev, librdmacm-dev and cc"
        );
        eprintln!(
            "skipped: cc or the rdma-core headers (libibverbs-dev, librdmacm-dev) are missing"
        );
    }
    ok
}

/// Compiles the C sources `srcs` (paths relative to tests/c, or absolute) into an
/// executable linked against the drop-in libraries; returns its path.
pub fn compile_c(name: &str, srcs: &[&str]) -> PathBuf {
    let dir = libdir();
    let exe = dir.join(name);
    let cdir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let mut cmd = Command::new("cc");
    cmd.args(["-O1", "-g", "-Wall", "-o"]).arg(&exe);
    for s in srcs {
        cmd.arg(cdir.join(s));
    }
    cmd.arg(format!("-L{}", dir.display()))
        .args(["-lrdmacm", "-libverbs", "-lpthread"]);
    let out = cmd.output().expect("running cc");
    assert!(
        out.status.success(),
        "cc {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A command for `prog` that loads the drop-in libraries instead of any installed ones.
pub fn command(prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_LIBRARY_PATH", libdir());
    c
}

/// Runs `cmd` to completion, returning its output (stdout and stderr as text).
pub fn run(mut cmd: Command) -> (Output, String, String) {
    let out = cmd.output().expect("spawning the program");
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, so, se)
}

/// Runs `cmd` and waits at most `limit` for it (a guard against a hang, not a timing
/// check): a program still running then is killed and its output returned with `None` as
/// the status.
pub fn run_bounded(
    mut cmd: Command,
    limit: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String, String) {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the program");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("collecting output");
    (
        status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A loopback address of this test run's own (127.A.B.C from the process id and a
/// counter), so that no other process on the machine holds its softrdma device (UDP port
/// 4791 of that address).
pub fn unique_addr() -> std::net::Ipv4Addr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    let pid = std::process::id();
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::net::Ipv4Addr::new(
        127,
        100 + (pid % 100) as u8,
        ((pid / 100) % 250) as u8,
        (n % 250) as u8 + 2,
    )
}

/// A TCP port that was free a moment ago (the kernel's choice), for a program's
/// out-of-band exchange.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on TCP `port` (any address, IPv4 or IPv6), from /proc/net.
pub fn tcp_listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut w = l.split_whitespace();
                let local = w.nth(1).unwrap_or("");
                let state = w.nth(1).unwrap_or("");
                local.ends_with(&want) && state == "0A"
            })
        })
    })
}

/// A fresh command with the program, arguments, environment and directory of `c`.
pub fn clone_command(c: &Command) -> Command {
    let mut n = Command::new(c.get_program());
    n.args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        n.current_dir(d);
    }
    n
}

/// Runs `server`, waits until it listens on TCP `port`, runs `client` (each bounded by
/// `limit`); checks both exit with status 0 and returns the client's stdout.
pub fn server_client(
    server: Command,
    client: Command,
    port: u16,
    limit: std::time::Duration,
) -> String {
    let server = std::thread::spawn(move || run_bounded(server, limit));
    while !tcp_listening(port) && !server.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A client refused at once while its server runs (the listener seen was another
    // program's on the same port number, or the server's was not ready) is started again,
    // a bounded number of times; a client that ran and failed is not.
    let mut tries = 0;
    let (cst, cout, cerr) = loop {
        let t0 = std::time::Instant::now();
        let (st, out, err) = run_bounded(clone_command(&client), limit);
        let failed_fast =
            !st.is_some_and(|s| s.success()) && t0.elapsed() < std::time::Duration::from_secs(2);
        tries += 1;
        if !failed_fast || server.is_finished() || tries == 10 {
            break (st, out, err);
        }
        eprintln!("client failed at once (try {tries}), starting it again:\n{out}\n{err}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let (sst, sout, serr) = server.join().expect("server thread");
    let report =
        format!("--- client ({cst:?}):\n{cout}\n{cerr}\n--- server ({sst:?}):\n{sout}\n{serr}");
    assert!(cst.is_some_and(|s| s.success()), "client failed:\n{report}");
    assert!(sst.is_some_and(|s| s.success()), "server failed:\n{report}");
    cout
}
