//! `softrdma ping`: rping (rdma-core's librdmacm ping-pong) as a subcommand. Its engine is the
//! rping example's own file, `crates/softrdma/examples/rping/engine.rs`, included here as a
//! module, so the two cannot drift apart: same wire protocol (a Linux `rping` can be either
//! side), same output (`ping data: ...` with `--verbose`), same checks (`--validate`).

#[path = "../../softrdma/examples/rping/engine.rs"]
mod engine;

use softrdma::{Device, QpCounters};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use engine::{DEFAULT_PORT, RPING_BUFSIZE, RPING_MIN_BUFSIZE};

/// What to run.
#[derive(Debug, Clone)]
pub struct PingArgs {
    /// `Some(addr)`: be the server, listening on `addr` (unspecified: every device).
    pub server: Option<IpAddr>,
    /// `Some(addr)`: be the client of the server at `addr`.
    pub connect: Option<IpAddr>,
    pub src: Option<IpAddr>,
    pub port: u16,
    pub count: u32,
    pub size: usize,
    pub verbose: bool,
    pub validate: bool,
    pub persistent: bool,
    pub own_qp: bool,
    pub debug: bool,
}

/// What a ping run leaves to report.
pub struct PingOutcome {
    /// The device this side used, when it is known (server address, client `--src`), and
    /// its counters at the end.
    pub device: Option<(IpAddr, softrdma::DeviceCounters)>,
    /// The counters of each connection's QP, as each ended.
    pub qps: Vec<QpCounters>,
}

/// Runs rping's server or client with `args`.
pub fn run(args: &PingArgs) -> Result<PingOutcome, String> {
    if !(RPING_MIN_BUFSIZE..RPING_BUFSIZE).contains(&args.size) {
        return Err(format!(
            "size {} is out of range (rping allows {RPING_MIN_BUFSIZE} to {})",
            args.size,
            RPING_BUFSIZE - 1
        ));
    }
    engine::DEBUG.store(args.debug, std::sync::atomic::Ordering::Relaxed);
    let qps = Arc::new(Mutex::new(Vec::new()));
    let o = engine::Opts {
        server: args.server.is_some(),
        addr: args.server.or(args.connect),
        src: args.src,
        port: args.port,
        count: args.count,
        size: args.size,
        verbose: args.verbose,
        validate: args.validate,
        persistent: args.persistent,
        self_create_qp: args.own_qp,
        qp_counters: Some(qps.clone()),
    };
    // Hold the device open for the whole run, so that its counters can be read at the end.
    let dev_addr = match args.server {
        Some(a) if !a.is_unspecified() => Some(a),
        Some(_) => None,
        None => args.src,
    };
    let ctx = dev_addr
        .map(|a| Device::from_addr(a).and_then(|d| d.open()))
        .transpose()
        .map_err(|e| e.to_string())?;
    let r = if o.server {
        engine::run_server(&o)
    } else {
        engine::run_client(&o)
    };
    r?;
    let qps = std::mem::take(&mut *qps.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(PingOutcome {
        device: ctx.map(|c| (c.device().addr(), c.counters())),
        qps,
    })
}
