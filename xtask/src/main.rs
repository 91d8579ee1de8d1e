//! `cargo run --release -p xtask -- bench-report --csv RESULTS.csv ...`: see the crate docs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "softrdma's project chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Markdown tables and an SVG plot from the CSV of scripts/bench.sh.
    BenchReport {
        /// The results CSV (group,tool,transport,test,size,rep,metric,value,unit).
        #[arg(long)]
        csv: PathBuf,
        /// The versions file of the run (machine, kernel, peer packages).
        #[arg(long)]
        versions: Option<PathBuf>,
        /// Where to write the markdown fragment (default: standard output).
        #[arg(long)]
        out_md: Option<PathBuf>,
        /// Where to write the SVG plot (linked from the fragment as given, relative to the
        /// repository root).
        #[arg(long)]
        svg: Option<PathBuf>,
        /// The exact command of the run, quoted in the fragment's header.
        #[arg(long)]
        command: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::BenchReport {
            csv,
            versions,
            out_md,
            svg,
            command,
        } => {
            let to_stdout = out_md.is_none();
            let opts = xtask::BenchReport {
                csv,
                versions,
                out_md,
                svg,
                command,
            };
            match xtask::bench_report(&opts, &mut |w| eprintln!("warning: {w}")) {
                Ok(md) => {
                    if to_stdout {
                        print!("{md}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
