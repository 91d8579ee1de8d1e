//! `softrdma`: the command-line face of softrdma.
//!
//! `softrdma devices` lists the software RDMA devices as `ibv_devinfo` does, `softrdma perf`
//! measures like perftest, `softrdma ping` pings like rping.

mod perf;
mod ping;
mod run;

use clap::{Parser, Subcommand};
use softrdma::{Context, Device};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "RDMA verbs over a userspace RoCEv2 software device"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the devices with their port, MTU and GID table (like ibv_devinfo).
    Devices {
        /// Also print every limit from query_device.
        #[arg(short, long)]
        verbose: bool,
        /// Show only this device: a name (srdma0) or an IP address (127.0.0.2).
        #[arg(short = 'd', long = "ib-dev")]
        device: Option<String>,
    },
    /// Measure bandwidth and message rate, or latency, like perftest (ib_write_bw,
    /// ib_send_lat, ...): between two loopback devices in this process, or between a server
    /// (--server) and a client (--connect) in two processes.
    Perf {
        /// The operation: write, read, send or atomic.
        #[arg(value_enum)]
        op: perf::Op,
        /// Message size in bytes (default 65536 for bandwidth, 8 for latency).
        #[arg(short, long)]
        size: Option<usize>,
        /// Every size from 8 bytes to 1 MiB (latency: to 64 KiB), in powers of two.
        #[arg(short, long, conflicts_with = "size")]
        all: bool,
        /// Messages per size (default: enough for about 1 GiB, 2k..200k).
        #[arg(short = 'n', long)]
        iters: Option<u64>,
        /// Run each size for this many seconds instead of a number of messages.
        #[arg(short = 'D', long, conflicts_with = "iters")]
        duration: Option<f64>,
        /// Measure latency (ping-pong for send; round trips otherwise) instead of bandwidth.
        #[arg(long)]
        lat: bool,
        /// Send messages up to this size inline.
        #[arg(short = 'I', long, default_value_t = 0)]
        inline: u32,
        /// Path MTU: 256, 512, 1024, 2048 or 4096.
        #[arg(short, long, default_value_t = 4096)]
        mtu: u32,
        /// Outstanding work requests.
        #[arg(short = 't', long, default_value_t = 128)]
        tx_depth: usize,
        /// QPs measured at once (perftest's -q): that many connections, each driven by a
        /// thread of its own; the table shows their aggregate (bandwidth tests only).
        #[arg(short = 'q', long = "qps", default_value_t = 1, value_name = "N")]
        qps: usize,
        /// Address of the client device.
        #[arg(long, default_value = "127.0.0.1")]
        client_addr: std::net::IpAddr,
        /// Address of the server device (both sides in this process).
        #[arg(long, default_value = "127.0.0.2")]
        server_addr: std::net::IpAddr,
        /// Be the server only: listen on the device ADDR (default: --server-addr) for one
        /// client, whose request sets the test; exit when it disconnects.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, conflicts_with = "connect")]
        server: Option<Option<std::net::IpAddr>>,
        /// Be the client only: connect to a `softrdma perf --server` at ADDR (from the
        /// device --client-addr).
        #[arg(short = 'c', long, value_name = "ADDR")]
        connect: Option<std::net::IpAddr>,
        /// The server's port (with --server / --connect).
        #[arg(short = 'p', long, default_value_t = perf::DEFAULT_PORT)]
        port: u16,
        /// Print one JSON object with the results as the last line.
        #[arg(long)]
        json: bool,
        /// Check every message (SEND bandwidth, both sides in this process): each carries
        /// its own number and a pattern from it, in a buffer slot of its own on both sides,
        /// and the receiver fails the run unless every message arrives exactly once, in
        /// order, byte-exact. For soaks under SOFTRDMA_FAULTS (scripts/loss_bench.sh).
        #[arg(long)]
        verify: bool,
        /// Capture every packet of this process's devices into FILE (pcap, with the IP and
        /// UDP headers they have on the wire; Wireshark decodes them as RoCEv2).
        #[arg(long, value_name = "FILE")]
        pcap: Option<std::path::PathBuf>,
    },
    /// Ping-pong over RDMA like rping (its engine and protocol): the client SENDs its
    /// buffer's address, the server RDMA READs it and RDMA WRITEs it back.
    Ping {
        #[command(flatten)]
        role: PingRole,
        /// The client's source address (its device).
        #[arg(short = 'I', long, value_name = "ADDR")]
        src: Option<std::net::IpAddr>,
        /// The server's port.
        #[arg(short = 'p', long, default_value_t = ping::DEFAULT_PORT)]
        port: u16,
        /// Pings to make (0: until the server goes away).
        #[arg(short = 'C', long, default_value_t = 0)]
        count: u32,
        /// Bytes per ping (26 to 65535).
        #[arg(short = 'S', long, default_value_t = 64)]
        size: usize,
        /// Print each ping's data.
        #[arg(short, long)]
        verbose: bool,
        /// Check that the data came back unchanged (fails at the first difference).
        #[arg(short = 'V', long)]
        validate: bool,
        /// Server: serve clients one after another until killed.
        #[arg(short = 'P', long)]
        persistent: bool,
        /// Own QPs moved through INIT/RTR/RTS by the application (rping -q).
        #[arg(short = 'q', long)]
        own_qp: bool,
        /// rping's debug prints.
        #[arg(short, long)]
        debug: bool,
    },
    /// Run an unmodified C program (ibv_devinfo, rping, ib_write_bw, ...) on softrdma: puts
    /// the drop-in libibverbs.so.1 and librdmacm.so.1 first on its library path (build them
    /// with `cargo run --release -p xtask -- capi`).
    Run {
        /// Where the drop-in libraries are (default: $SOFTRDMA_CAPI_DIR, else `capi/` beside
        /// this binary, as `xtask capi` leaves them, else `../lib` of an installed prefix).
        #[arg(long, value_name = "DIR")]
        lib_dir: Option<std::path::PathBuf>,
        /// Also list a device for this local address (SOFTRDMA_DEVICES), named srdma_ADDR,
        /// for programs that pick a device by name (-d); may be repeated.
        #[arg(long = "device", value_name = "ADDR")]
        devices: Vec<std::net::IpAddr>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<std::ffi::OsString>,
    },
}

#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct PingRole {
    /// Be the server: listen on ADDR (default: every device, as rping) and answer pings.
    #[arg(short = 's', long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "0.0.0.0")]
    server: Option<std::net::IpAddr>,
    /// Be the client: ping the server at ADDR.
    #[arg(short = 'c', long, value_name = "ADDR")]
    connect: Option<std::net::IpAddr>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SOFTRDMA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            lib_dir,
            devices,
            program,
        } => return run::run(lib_dir, &devices, &program),
        Command::Ping {
            role,
            src,
            port,
            count,
            size,
            verbose,
            validate,
            persistent,
            own_qp,
            debug,
        } => {
            let args = ping::PingArgs {
                server: role.server,
                connect: role.connect,
                src,
                port,
                count,
                size,
                verbose,
                validate,
                persistent,
                own_qp,
                debug,
            };
            return match run_ping(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("softrdma: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Devices { verbose, device } => devices(verbose, device.as_deref()),
        Command::Perf {
            op,
            size,
            all,
            iters,
            duration,
            lat,
            inline,
            mtu,
            tx_depth,
            qps,
            client_addr,
            server_addr,
            server,
            connect,
            port,
            json,
            verify,
            pcap,
        } => (|| {
            if let Some(path) = &pcap {
                softrdma::start_capture(path)?;
            }
            let mtu = softrdma::Mtu::from_bytes(mtu).ok_or_else(|| {
                softrdma::Error::invalid(format!(
                    "MTU {mtu} is not one of 256, 512, 1024, 2048, 4096"
                ))
            })?;
            if tx_depth == 0 {
                return Err(softrdma::Error::invalid("tx depth must be at least 1"));
            }
            let sizes = if all {
                let top = if lat { 16 } else { 20 };
                (3..=top).map(|p| 1usize << p).collect()
            } else {
                vec![size.unwrap_or(if lat { 8 } else { 65536 })]
            };
            if sizes.iter().any(|&s| s > 1 << 30) {
                return Err(softrdma::Error::invalid(
                    "sizes above 1 GiB are not supported",
                ));
            }
            let mode = match (server, connect) {
                (Some(addr), _) => perf::Mode::Server(addr.unwrap_or(server_addr)),
                (None, Some(addr)) => perf::Mode::Client(addr),
                (None, None) => perf::Mode::Local,
            };
            if verify && (mode != perf::Mode::Local || op != perf::Op::Send || lat) {
                return Err(softrdma::Error::invalid(
                    "--verify is for SEND bandwidth with both sides in this process \
                     (no --server, --connect or --lat)",
                ));
            }
            if qps == 0 || qps > perf::MAX_QPS {
                return Err(softrdma::Error::invalid(format!(
                    "-q {qps}: from 1 to {} QPs",
                    perf::MAX_QPS
                )));
            }
            if qps > 1 && lat {
                return Err(softrdma::Error::invalid(
                    "latency tests use one QP (as perftest's): leave out -q or --lat",
                ));
            }
            let args = perf::PerfArgs {
                op,
                qps,
                sizes,
                iters: iters.unwrap_or(0),
                duration: duration.map(std::time::Duration::from_secs_f64),
                lat,
                inline,
                mtu,
                tx_depth,
                client: client_addr,
                server: server_addr,
                json,
                verify,
                mode,
                port: if mode == perf::Mode::Local { 0 } else { port },
            };
            let r = match mode {
                perf::Mode::Server(addr) => run_perf_server(&args, addr),
                _ => run_perf(&args),
            };
            if pcap.is_some() {
                softrdma::stop_capture()?;
            }
            r
        })(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::FAILURE
        }
    }
}

fn find_device(spec: &str) -> softrdma::Result<Device> {
    match spec.parse() {
        Ok(addr) => Device::from_addr(addr),
        Err(_) => Device::by_name(spec),
    }
}

fn devices(verbose: bool, only: Option<&str>) -> softrdma::Result<()> {
    let list = match only {
        Some(spec) => vec![find_device(spec)?],
        None => softrdma::get_device_list()?,
    };
    if list.is_empty() {
        println!("No devices found: this machine has no usable IP address.");
        return Ok(());
    }
    for dev in &list {
        let ctx = dev.open()?;
        print_device(&ctx, verbose)?;
    }
    Ok(())
}

fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn print_device(ctx: &Context, verbose: bool) -> softrdma::Result<()> {
    let dev = ctx.device();
    let a = ctx.query_device()?;
    println!("hca_id:\t{}", dev.name());
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    println!("\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
    println!("\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid));
    println!("\tnetdev:\t\t\t\t{} ({})", dev.ifname(), dev.addr());
    println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if verbose {
        println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
        println!("\tpage_size_cap:\t\t\t{:#x}", a.page_size_cap);
        println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
        println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        println!("\tdevice_cap_flags:\t\t{:#010x}", a.device_cap_flags.bits());
        println!("\tmax_sge:\t\t\t{}", a.max_sge);
        println!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
        println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
        println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
        println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
        println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
        println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        println!("\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
        println!("\tatomic_cap:\t\t\t{:?}", a.atomic_cap);
        println!("\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
        println!("\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
        println!(
            "\tmax_total_mcast_qp_attach:\t{}",
            a.max_total_mcast_qp_attach
        );
        println!("\tmax_ah:\t\t\t\t{}", a.max_ah);
        println!("\tmax_srq:\t\t\t{}", a.max_srq);
        println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        println!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        println!("\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
        println!("\tmax_inline_data:\t\t{}", a.max_inline_data);
    }
    let p = ctx.query_port(softrdma::PORT_NUM)?;
    println!("\t\tport:\t{}", softrdma::PORT_NUM);
    println!(
        "\t\t\tstate:\t\t\t{} ({})",
        p.state.as_str(),
        p.state as i32
    );
    println!(
        "\t\t\tmax_mtu:\t\t{} ({})",
        p.max_mtu.bytes(),
        p.max_mtu as u32
    );
    println!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu.bytes(),
        p.active_mtu as u32
    );
    println!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    println!("\t\t\tport_lid:\t\t{}", p.lid);
    println!("\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
    println!("\t\t\tlink_layer:\t\tEthernet");
    if verbose {
        println!("\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
        println!("\t\t\tport_cap_flags:\t\t{:#010x}", p.port_cap_flags.bits());
        println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
    }
    for e in ctx.query_gid_table() {
        println!(
            "\t\t\tGID[{:3}]:\t\t{}, RoCE v2 ({})",
            e.gid_index,
            e.gid,
            e.gid.to_ip()
        );
    }
    println!();
    Ok(())
}

fn run_perf(args: &perf::PerfArgs) -> softrdma::Result<()> {
    let name = match (args.op, args.lat) {
        (perf::Op::Write, false) => "RDMA_Write BW Test",
        (perf::Op::Read, false) => "RDMA_Read BW Test",
        (perf::Op::Send, false) => "Send BW Test",
        (perf::Op::Atomic, false) => "Atomic FETCH_AND_ADD BW Test",
        (perf::Op::Write, true) => "RDMA_Write Latency Test (round trip / 2)",
        (perf::Op::Read, true) => "RDMA_Read Latency Test (round trip / 2)",
        (perf::Op::Send, true) => "Send Latency Test (ping-pong, one way)",
        (perf::Op::Atomic, true) => "Atomic FETCH_AND_ADD Latency Test (round trip / 2)",
    };
    println!("{}", "-".repeat(88));
    println!("                    {name}");
    let server = match args.mode {
        perf::Mode::Client(addr) => format!("{addr} port {} (another process)", args.port),
        _ => args.server.to_string(),
    };
    println!(
        " Devices        : {} -> {server}   Transport: RC over RoCEv2/{}   MTU: {}",
        args.client,
        if softrdma::same_host_lanes() {
            "UDP, same-host lanes"
        } else {
            "UDP"
        },
        args.mtu.bytes()
    );
    println!(
        " TX depth       : {}   Inline: {}   QPs: {}",
        args.tx_depth, args.inline, args.qps
    );
    println!("{}", "-".repeat(88));
    if args.lat {
        println!(" #bytes  #iterations  t_min[usec]  t_max[usec]  t_typical[usec]  t_avg[usec]  99% percentile[usec]");
    } else {
        println!(
            " #bytes     #iterations    BW average[Gb/sec]    BW average[GB/s]    MsgRate[Mpps]"
        );
    }
    let outcome = perf::run(args, |p| {
        if args.lat {
            let avg = p.lat_us.iter().sum::<f64>() / p.lat_us.len().max(1) as f64;
            println!(
                " {:<7} {:<12} {:<12.2} {:<12.2} {:<16.2} {:<12.2} {:.2}",
                p.size,
                p.iters,
                p.lat_us.first().copied().unwrap_or(f64::NAN),
                p.lat_us.last().copied().unwrap_or(f64::NAN),
                perf::quantile(&p.lat_us, 0.5),
                avg,
                perf::quantile(&p.lat_us, 0.99)
            );
        } else {
            println!(
                " {:<10} {:<14} {:<21.2} {:<19.3} {:.3}",
                p.size,
                p.iters,
                p.bw_gbps * 8.0,
                p.bw_gbps,
                p.msg_rate_mps
            );
        }
    })?;
    println!("{}", "-".repeat(88));
    for side in &outcome.sides {
        print_counters(side);
    }
    print_copy_engines();
    let outcome_sides = outcome.sides;
    let points = outcome.points;
    if args.json {
        let last = points.last().cloned().unwrap_or_default();
        let mode = match args.mode {
            perf::Mode::Local => "local",
            perf::Mode::Client(_) => "client",
            perf::Mode::Server(_) => "server",
        };
        let mut items = vec![
            format!("\"op\":\"{}\"", args.op.name()),
            format!("\"mode\":\"{mode}\""),
            format!("\"qps\":{}", args.qps),
            format!("\"size\":{}", last.size),
            format!("\"iters\":{}", last.iters),
            format!("\"secs\":{:.4}", last.secs),
        ];
        if args.lat {
            items.push(format!(
                "\"lat_us_p50\":{:.3}",
                perf::quantile(&last.lat_us, 0.5)
            ));
            items.push(format!(
                "\"lat_us_p99\":{:.3}",
                perf::quantile(&last.lat_us, 0.99)
            ));
            items.push(format!(
                "\"lat_us_min\":{:.3}",
                last.lat_us.first().copied().unwrap_or(f64::NAN)
            ));
        } else {
            items.push(format!("\"bw_gbps\":{:.4}", last.bw_gbps));
            items.push(format!("\"msg_rate_mps\":{:.4}", last.msg_rate_mps));
        }
        let all: Vec<String> = points
            .iter()
            .map(|p| {
                if args.lat {
                    format!(
                        "{{\"size\":{},\"lat_us_p50\":{:.3},\"lat_us_p99\":{:.3},\"preemptions\":{}}}",
                        p.size,
                        perf::quantile(&p.lat_us, 0.5),
                        perf::quantile(&p.lat_us, 0.99),
                        p.preemptions
                    )
                } else {
                    format!(
                        "{{\"size\":{},\"bw_gbps\":{:.4},\"msg_rate_mps\":{:.4},\"preemptions\":{}}}",
                        p.size, p.bw_gbps, p.msg_rate_mps, p.preemptions
                    )
                }
            })
            .collect();
        items.push(format!("\"points\":[{}]", all.join(",")));
        let sides: Vec<String> = outcome_sides_json(&outcome_sides);
        items.push(format!("\"counters\":[{}]", sides.join(",")));
        println!("{{{}}}", items.join(","));
    }
    Ok(())
}

/// The counters of each side as JSON objects: `who`, `addr`, and the device's and the QP's
/// packet, byte, retransmission and NAK counts.
fn outcome_sides_json(sides: &[perf::SideCounters]) -> Vec<String> {
    sides
        .iter()
        .map(|s| {
            let (d, q) = (&s.device, &s.qp);
            format!(
                "{{\"who\":\"{}\",\"addr\":\"{}\",\"device\":{{\"tx_packets\":{},\"tx_bytes\":{},\"rx_packets\":{},\"rx_bytes\":{},\"icrc_errors\":{},\"malformed\":{},\"tx_errors\":{},\"unknown_qp\":{},\"misrouted\":{},\"same_host_packets\":{},\"wr_records\":{},\"pair_records\":{},\"tx_in_place_bytes\":{},\"tx_gso_numbered\":{}}},\"qp\":{{\"tx_packets\":{},\"tx_bytes\":{},\"rx_packets\":{},\"rx_bytes\":{},\"retransmitted_packets\":{},\"retries\":{},\"timeouts\":{},\"probes\":{},\"duplicates\":{},\"rnr_naks_sent\":{},\"rnr_naks_received\":{},\"seq_naks_sent\":{},\"seq_naks_received\":{},\"err_naks_sent\":{},\"err_naks_received\":{},\"credit_waits\":{}}}}}",
                s.who,
                s.addr,
                d.tx_packets,
                d.tx_bytes,
                d.rx_packets,
                d.rx_bytes,
                d.icrc_errors,
                d.malformed,
                d.tx_errors,
                d.unknown_qp,
                d.misrouted,
                d.same_host_packets,
                d.wr_records,
                d.pair_records,
                d.tx_in_place_bytes,
                d.tx_gso_numbered,
                q.tx_packets,
                q.tx_bytes,
                q.rx_packets,
                q.rx_bytes,
                q.retransmitted_packets,
                q.retries,
                q.timeouts,
                q.probes,
                q.duplicates,
                q.rnr_naks_sent,
                q.rnr_naks_received,
                q.seq_naks_sent,
                q.seq_naks_received,
                q.err_naks_sent,
                q.err_naks_received,
                q.credit_waits
            )
        })
        .collect()
}

/// The device and QP counters of one side, at the end of `perf`.
fn print_counters(side: &perf::SideCounters) {
    print_device_counters(side.who, side.addr, &side.device);
    let label = if side.qps > 1 {
        format!("{} QPs ({}, summed)", side.who, side.qps)
    } else {
        format!("{} QP", side.who)
    };
    print_qp_counters(&label, &side.qp);
}

/// One line on the process's copy engines (helper threads sharing the payload copies of
/// large runs), when it has any.
fn print_copy_engines() {
    let c = softrdma::copy_engines();
    if c.helpers > 0 {
        println!(
            " copy engines: {} helpers, {} runs shared ({} copies made by helpers), {} large runs alone, {} back-offs",
            c.helpers, c.shared_runs, c.helper_copies, c.alone_runs, c.back_offs
        );
    }
}

fn print_device_counters(who: &str, addr: std::net::IpAddr, d: &softrdma::DeviceCounters) {
    println!(
        " {who} device {addr}: tx {} pkts / {} B, rx {} pkts / {} B, ICRC errors {}, malformed {}, unknown QP {}, wrong source {}, tx errors {}, misrouted {}, same-host {} (records {}, {} by QP rings), sent in place {} B, GSO-numbered {}, identifications solved {}",
        d.tx_packets, d.tx_bytes, d.rx_packets, d.rx_bytes, d.icrc_errors, d.malformed, d.unknown_qp, d.wrong_source, d.tx_errors,
        d.misrouted, d.same_host_packets, d.wr_records, d.pair_records, d.tx_in_place_bytes,
        d.tx_gso_numbered, d.icrc_ident_solved
    );
}

/// One line of QP counters, after `label` ("client QP", ...).
fn print_qp_counters(label: &str, q: &softrdma::QpCounters) {
    println!(
        " {label}: tx {} pkts / {} B, rx {} pkts / {} B, retransmitted {} (retries {}, timeouts {}, probes {}), duplicates {}, \
         RNR NAKs {}/{}, sequence NAKs {}/{}, error NAKs {}/{} (sent/received), waits for credits {}",
        q.tx_packets, q.tx_bytes, q.rx_packets, q.rx_bytes, q.retransmitted_packets, q.retries, q.timeouts, q.probes, q.duplicates,
        q.rnr_naks_sent, q.rnr_naks_received, q.seq_naks_sent, q.seq_naks_received, q.err_naks_sent, q.err_naks_received,
        q.credit_waits
    );
}

/// `softrdma perf --server`: one client's test, then the server's counters.
fn run_perf_server(args: &perf::PerfArgs, addr: std::net::IpAddr) -> softrdma::Result<()> {
    use std::io::Write;
    let side = perf::serve(
        args,
        addr,
        |local| {
            println!(
                "waiting for a client on {local} (softrdma perf ... --connect {})",
                local.ip()
            );
            let _ = std::io::stdout().flush();
        },
        |peer, req| {
            println!(
                "client {peer}: {} {}, messages up to {} B, {} outstanding, inline {}, {} QP{}",
                req.op.name(),
                if req.lat { "latency" } else { "bandwidth" },
                req.max_size,
                req.tx_depth,
                req.inline,
                req.qps,
                if req.qps == 1 { "" } else { "s" }
            );
            let _ = std::io::stdout().flush();
        },
    )?;
    println!("{}", "-".repeat(88));
    print_counters(&side);
    print_copy_engines();
    if args.json {
        println!(
            "{{\"mode\":\"server\",\"qp_rx_packets\":{},\"qp_tx_packets\":{}}}",
            side.qp.rx_packets, side.qp.tx_packets
        );
    }
    Ok(())
}

/// `softrdma ping`: rping's run, then the counters (the device's when known, each QP's).
fn run_ping(args: &ping::PingArgs) -> Result<(), String> {
    let out = ping::run(args)?;
    let who = if args.server.is_some() {
        "server"
    } else {
        "client"
    };
    if who == "client" && args.count > 0 {
        println!(
            "{} pings of {} B{}",
            args.count,
            args.size,
            if args.validate { ", data verified" } else { "" }
        );
    }
    if let Some((addr, d)) = &out.device {
        print_device_counters(who, *addr, d);
    }
    for q in &out.qps {
        print_qp_counters(&format!("{who} QP"), q);
    }
    Ok(())
}
