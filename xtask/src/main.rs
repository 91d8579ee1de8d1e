//! `cargo run --release -p xtask -- bench-report --csv RESULTS.csv ...`, `... udp-floor` and
//! `... capi [--prefix DIR]`, `... layers`: see the crate docs and `--help`.

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
    /// The loopback latency floor: a busy-polling UDP ping-pong between two threads, with
    /// one datagram per direction and with one more before it (what an RC ACK costs when it
    /// goes first). Prints one line per case.
    UdpFloor {
        /// Round trips per case.
        #[arg(short, long, default_value_t = 50_000)]
        iters: usize,
        /// The two addresses (port 0: any).
        #[arg(long, default_value = "127.0.0.50:0")]
        a: std::net::SocketAddr,
        #[arg(long, default_value = "127.0.0.51:0")]
        b: std::net::SocketAddr,
    },
    /// The loopback bandwidth floor of one stream: UDP datagrams of RoCEv2's size sent
    /// with GSO and received with GRO between two threads, without softrdma, with no copy in
    /// user space and with one copy a side (what a device needs at least); and one TCP stream
    /// (iperf3's measure). Prints one line per case, GB/s received.
    UdpBwFloor {
        /// Seconds per case.
        #[arg(short, long, default_value_t = 2.0)]
        secs: f64,
        /// Bytes of one datagram (a RoCEv2 packet of a 4096-byte path MTU: BTH, payload,
        /// ICRC).
        #[arg(long, default_value_t = 4112)]
        segment: usize,
        /// Datagrams per system call (UDP GSO).
        #[arg(long, default_value_t = 15)]
        segments: usize,
        /// The two addresses (port 0: any).
        #[arg(long, default_value = "127.0.0.50:0")]
        a: std::net::SocketAddr,
        #[arg(long, default_value = "127.0.0.51:0")]
        b: std::net::SocketAddr,
    },
    /// Build the drop-in C libraries (libibverbs.so.1, librdmacm.so.1 and the empty
    /// libmlx5.so.1/libefa.so.1 that Debian's perftest needs) in release mode into
    /// target/release/capi, where `softrdma run` finds them; with --prefix also install them
    /// into PREFIX/lib, so that LD_LIBRARY_PATH=PREFIX/lib (or an ld.so.conf entry) is all a
    /// C program needs.
    Capi {
        /// Install into PREFIX/lib too.
        #[arg(long)]
        prefix: Option<PathBuf>,
    },
    /// The file-level import graph of each crate: import circles (more than one file) and
    /// imports from a layer above. Fails on a finding in a crate held clean (see
    /// xtask::layers::RULES); reports the others.
    Layers {
        /// The workspace root.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Print every import edge too.
        #[arg(short, long)]
        verbose: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Layers { root, verbose } => {
            let mut out = String::new();
            let res = xtask::layers::check(&root, xtask::layers::RULES, verbose, &mut out);
            print!("{out}");
            match res {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("error: import circles or layer breaches in a crate held clean");
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Capi { prefix } => match xtask::capi::build(prefix.as_deref()) {
            Ok(dir) => {
                println!("{}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::UdpFloor { iters, a, b } => {
            for extra in [0, 1] {
                match xtask::floor::udp_floor(a, b, iters, extra) {
                    Ok(f) => println!(
                        "udp busy-poll ping-pong, {} datagram(s) per one-way: one-way p50 {:.2} us, min {:.2} us",
                        1 + extra,
                        f.p50_us,
                        f.min_us
                    ),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(1);
                    }
                }
            }
            match xtask::floor::udp_floor_trailing(a, b, iters) {
                Ok(f) => println!(
                    "udp busy-poll ping-pong, 1 datagram per one-way with a second behind it in the same sendmmsg: one-way p50 {:.2} us, min {:.2} us",
                    f.p50_us, f.min_us
                ),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            }
            ExitCode::SUCCESS
        }
        Command::UdpBwFloor {
            secs,
            segment,
            segments,
            a,
            b,
        } => {
            for copy in [false, true] {
                let what = if copy {
                    "one copy a side"
                } else {
                    "no user-space copy"
                };
                match xtask::bwfloor::udp_bw_floor(a, b, secs, segment, segments, copy) {
                    Ok(f) => println!(
                        "udp stream, {segments} x {segment} B per send, {what}: {:.2} GB/s received ({:.1}% lost)",
                        f.gbps,
                        f.lost * 100.0
                    ),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(1);
                    }
                }
                match xtask::bwfloor::tcp_bw(b, secs, 1 << 20, copy) {
                    Ok(f) => println!("tcp stream, 1 MiB writes, {what}: {:.2} GB/s", f.gbps),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::from(1);
                    }
                }
            }
            ExitCode::SUCCESS
        }
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
