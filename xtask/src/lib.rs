//! Project chores for softrdma, run as `cargo run --release -p xtask -- <command>`.
//!
//! `bench-report` turns the CSV of `scripts/bench.sh` (softrdma's rows and those of the peers
//! from `../shared/anchors/run_anchors.sh`) into a markdown fragment for `BENCHMARKS.md` and an
//! SVG plot; see [`bench_report`]. `udp-floor` measures the loopback latency floor under
//! softrdma (a busy-polling UDP ping-pong); see [`floor::udp_floor`]. `layers` checks that no
//! crate has an import circle between files or an import from a layer above; see [`layers`].

#![warn(missing_docs)]

pub mod bwfloor;
pub mod capi;
pub mod data;
pub mod floor;
pub mod layers;
pub mod machine;
pub mod plot;
pub mod report;
pub mod stats;

use std::fmt;
use std::path::{Path, PathBuf};

use data::Dataset;
use machine::Machine;

/// What `bench-report` reads and writes.
#[derive(Debug, Clone, Default)]
pub struct BenchReport {
    /// The results CSV (`group,tool,transport,test,size,rep,metric,value,unit`).
    pub csv: PathBuf,
    /// The harness's versions file (machine and peer versions), if any.
    pub versions: Option<PathBuf>,
    /// Where the markdown fragment goes; `None` for standard output.
    pub out_md: Option<PathBuf>,
    /// Where the SVG plot goes; `None` for no plot.
    pub svg: Option<PathBuf>,
    /// The exact command of the run, for the fragment's header.
    pub command: Option<String>,
}

/// An error of a chore: a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub(crate) fn read(path: &Path, what: &str) -> Result<String, Error> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error(format!("cannot read the {what} {}: {e}", path.display())))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn write(path: &Path, what: &str, text: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error(format!(
                "cannot create the directory {} for the {what}: {e}",
                dir.display()
            ))
        })?;
    }
    std::fs::write(path, text)
        .map_err(|e| Error(format!("cannot write the {what} {}: {e}", path.display())))
}

/// The plot's path as the markdown links it: relative to the current directory (the
/// repository root, where `scripts/bench.sh` runs) when it lies below it, with `/`.
pub fn link_path(svg: &Path) -> String {
    let rel = std::env::current_dir()
        .ok()
        .and_then(|cwd| svg.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| svg.to_path_buf());
    let s = rel.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").unwrap_or(&s).to_string()
}

/// Runs `bench-report`: reads the CSV and the versions file, writes the SVG plot and the
/// markdown fragment, and returns the fragment. Lines of the CSV it skips are reported through
/// `warn`. Fails on a file it cannot read or write.
pub fn bench_report(opts: &BenchReport, warn: &mut dyn FnMut(&str)) -> Result<String, Error> {
    let csv = read(&opts.csv, "results CSV")?;
    let machine = match &opts.versions {
        Some(p) => Machine::parse(&read(p, "versions file")?),
        None => Machine::default(),
    };
    let (d, warnings) = Dataset::from_csv(&csv);
    for w in &warnings {
        warn(&format!("{}: {w}", opts.csv.display()));
    }
    if d.reps("softrdma") == 0 {
        warn(&format!("{}: no softrdma rows", opts.csv.display()));
    }
    let ctx = report::Context {
        machine,
        command: opts.command.clone(),
        svg: opts.svg.as_deref().map(link_path),
    };
    if let Some(svg_path) = &opts.svg {
        let reps = d.reps("softrdma");
        let subtitle = format!(
            "{} · medians of {reps} repetition{} · latency one-way · dashed: shared memory",
            ctx.machine.describe(),
            if reps == 1 { "" } else { "s" }
        );
        let svg = plot::render_svg(&d, &subtitle).map_err(Error)?;
        write(svg_path, "plot", &svg)?;
    }
    let md = report::markdown(&d, &ctx);
    if let Some(p) = &opts.out_md {
        write(p, "markdown fragment", &md)?;
    }
    Ok(md)
}
