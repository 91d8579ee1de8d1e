//! `softrdma run -- PROGRAM ARGS...`: runs a C program on the drop-in libraries.

use std::ffi::{OsStr, OsString};
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The library file whose presence marks a directory of drop-in libraries.
const MARK: &str = "libibverbs.so.1";

/// Where the drop-in libraries are: the `--lib-dir` given, `$SOFTRDMA_CAPI_DIR`, `capi/`
/// beside this executable (`xtask capi` builds them into target/release/capi) or `../lib`
/// of an installed prefix. Fails with a message saying how to build them.
fn find_lib_dir(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(d) = given {
        return if d.join(MARK).exists() {
            Ok(d)
        } else {
            Err(format!("{} has no {MARK}", d.display()))
        };
    }
    let mut tried = Vec::new();
    if let Some(d) = std::env::var_os("SOFTRDMA_CAPI_DIR") {
        tried.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            tried.push(dir.join("capi"));
            tried.push(dir.join("../lib"));
        }
    }
    tried
        .iter()
        .find(|d| d.join(MARK).exists())
        .cloned()
        .ok_or_else(|| {
            format!(
                "the drop-in libraries are not built (looked in {}): run `cargo run --release -p xtask -- capi` first, or pass --lib-dir",
                tried
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// `dir` in front of the existing `LD_LIBRARY_PATH`.
fn library_path(dir: &Path) -> OsString {
    let mut v = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Replaces this process with `program` (so its exit status and signals are the program's
/// own), with the drop-in libraries first on its library path and `devices` added to
/// SOFTRDMA_DEVICES. Returns only on failure, with a message on stderr.
pub fn run(lib_dir: Option<PathBuf>, devices: &[IpAddr], program: &[OsString]) -> ExitCode {
    let dir = match find_lib_dir(lib_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma run: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    let (prog, args) = program.split_first().expect("clap requires a program");
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_LIBRARY_PATH", library_path(&dir));
    if !devices.is_empty() {
        let mut list: Vec<String> = std::env::var("SOFTRDMA_DEVICES")
            .ok()
            .filter(|s| !s.is_empty())
            .into_iter()
            .collect();
        list.extend(devices.iter().map(IpAddr::to_string));
        cmd.env("SOFTRDMA_DEVICES", list.join(","));
    }
    let err = cmd.exec();
    eprintln!(
        "softrdma run: cannot run {}: {err}",
        Path::new(OsStr::new(prog)).display()
    );
    ExitCode::from(127)
}
