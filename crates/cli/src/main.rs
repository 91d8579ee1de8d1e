//! `softrdma`: the command-line face of softrdma.
//!
//! `softrdma devices` lists the software RDMA devices as `ibv_devinfo` does.

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
        Command::Devices { verbose, device } => devices(verbose, device.as_deref()),
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
