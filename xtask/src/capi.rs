//! `xtask capi`: builds the drop-in C libraries of `crates/capi` in release mode and
//! (optionally) installs them into a prefix.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask lives one level below it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// Runs `cmd`, failing with a message naming `what` when it cannot start or exits non-zero.
fn run(mut cmd: Command, what: &str) -> Result<(), String> {
    let st = cmd
        .status()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({st})"))
    }
}

/// Builds `softrdma-capi` (release), links the libraries into `target/release/capi` with
/// `crates/capi/link.sh`, copies them into `PREFIX/lib` when a prefix is given, and returns
/// the directory to put on `LD_LIBRARY_PATH`.
///
/// Fails when cargo, the C compiler (`cc`) or the copy fails, with the step named.
pub fn build(prefix: Option<&Path>) -> Result<PathBuf, String> {
    let root = root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(&root)
        .args(["build", "--release", "-p", "softrdma-capi"]);
    run(c, "cargo build --release -p softrdma-capi")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = target.join("release").join("capi");
    let mut l = Command::new("bash");
    l.arg(root.join("crates/capi/link.sh"))
        .arg(target.join("release/libsoftrdma_capi.a"))
        .arg(&out);
    run(l, "crates/capi/link.sh")?;
    let Some(prefix) = prefix else {
        return Ok(out);
    };
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| format!("creating {}: {e}", lib.display()))?;
    for entry in std::fs::read_dir(&out).map_err(|e| format!("reading {}: {e}", out.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let dst = lib.join(&name);
        let _ = std::fs::remove_file(&dst);
        let ft = entry.file_type().map_err(|e| e.to_string())?;
        if ft.is_symlink() {
            let t = std::fs::read_link(entry.path()).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(&t, &dst)
                .map_err(|e| format!("linking {}: {e}", dst.display()))?;
        } else {
            std::fs::copy(entry.path(), &dst)
                .map_err(|e| format!("copying to {}: {e}", dst.display()))?;
        }
    }
    Ok(lib)
}
