//! rping: the RDMA ping-pong of rdma-core's librdmacm examples, over softrdma.
//!
//! Same flags, same wire protocol, same output as `rping(1)`, so that it can talk to a Linux
//! `rping` over RoCEv2:
//!
//! * the client connects (responder resources 1, initiator depth 1, retry 7, RNR retry 7,
//!   no private data) and, for every ping, fills its source buffer with the ping pattern
//!   (`rdma-ping-N: ` and then the letters `A`..`z` rotating, NUL-terminated) and SENDs a
//!   16-byte `rping_rdma_info` (buffer address, rkey, size; big-endian);
//! * the server RDMA READs the source buffer, SENDs a go-ahead, receives the client's sink
//!   buffer advertisement, RDMA WRITEs the data back into it, and SENDs another go-ahead;
//! * after `-C` pings the client disconnects; `-V` compares source and sink, `-v` prints
//!   `ping data: ...` (client) / `server ping data: ...` (server).
//!
//! The connection manager is used through asynchronous ids: one event channel, read by a
//! connection-manager thread, and one completion channel per connection, read by a CQ
//! thread, as rping does.
//!
//! With `-q` the QP is the application's own, as in rping: created with `ibv_create_qp` and
//! moved to INIT by hand, then through INIT, RTR and RTS with the attributes of
//! `rdma_init_qp_attr` — by the server before `rdma_accept` (which carries the QP number),
//! by the client on CONNECT_RESPONSE (its `rdma_connect` carried the QP number), followed by
//! `rdma_establish`; before `rdma_disconnect` the QP is moved to ERR.
//!
//! ```text
//! rping -s [-vVdq] [-S size] [-C count] [-a addr] [-p port] [-P]
//! rping -c [-vVdq] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```

#[macro_use]
mod engine;

use engine::*;
use softrdma::rdma_cm;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

fn usage() {
    println!("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]");
    println!("rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]");
    println!("\t-c\t\tclient side");
    println!("\t-I\t\tSource address to bind to for client.");
    println!("\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0");
    println!("\t-v\t\tdisplay ping data to stdout");
    println!("\t-V\t\tvalidate ping data");
    println!("\t-d\t\tdebug printfs");
    println!("\t-S size \tping data size");
    println!("\t-C count\tping count times");
    println!("\t-a addr\t\taddress");
    println!("\t-p port\t\tport");
    println!("\t-P\t\tpersistent server mode allowing multiple connections");
    println!("\t-q\t\tuse self-created, self-modified QP");
}

/// How a command line is refused, as rping refuses it.
enum ArgError {
    /// getopt's refusals (and no -s/-c): the reason on stderr, the usage on stdout, EINVAL.
    Usage(String),
    /// A value out of range (-S, -C): the reason on stderr, no usage, EINVAL.
    Value(String),
    /// An address that does not resolve: rping's message on stdout, no usage, and
    /// getaddrinfo's EAI_NONAME (-2) as the status (254).
    Addr(String),
}

/// Resolves a host name or address as rping's `get_addr` does (with rdma_getaddrinfo).
fn get_addr(s: &str) -> Result<IpAddr, ArgError> {
    match rdma_cm::getaddrinfo(Some(s), None, None) {
        Ok(v) => v
            .first()
            .and_then(|a| a.ai_dst_addr)
            .map(|a| a.ip())
            .ok_or_else(|| ArgError::Addr(format!("getaddrinfo gave no address for {s}"))),
        Err(e) => Err(ArgError::Addr(format!(
            "getaddrinfo failed ({e}) - invalid hostname or IP address"
        ))),
    }
}

/// C's `atoi`: leading blanks, an optional sign, then as many digits as there are; 0 when
/// there are none (rping takes `-C abc` as 0, pinging until the server goes away).
fn atoi(s: &str) -> i64 {
    let t = s.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut n: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        n = n.saturating_mul(10).saturating_add(i64::from(b - b'0'));
    }
    // atoi returns an int: values past its range wrap as glibc's strtol-then-truncate does.
    (if neg { -n } else { n }) as i32 as i64
}

/// Parses the flags as getopt("a:I:Pp:C:S:scvVdq") does: bundled flags (`-vV`), values
/// attached (`-C20`) or separate (`-C 20`). Usage errors return the message to print.
fn parse_args(args: &[String]) -> Result<Opts, ArgError> {
    let mut server: Option<bool> = None;
    let mut o = Opts {
        server: false,
        addr: None,
        src: None,
        port: DEFAULT_PORT,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        persistent: false,
        self_create_qp: false,
        qp_counters: None,
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(ArgError::Usage(format!("unexpected argument {arg:?}")));
        };
        for (pos, c) in flags.char_indices() {
            let takes_value = matches!(c, 'a' | 'I' | 'p' | 'C' | 'S');
            let value = if takes_value {
                let rest = &flags[pos + c.len_utf8()..];
                let v = if !rest.is_empty() {
                    rest.to_string()
                } else if i < args.len() {
                    i += 1;
                    args[i - 1].clone()
                } else {
                    return Err(ArgError::Usage(format!("option -{c} needs a value")));
                };
                Some(v)
            } else {
                None
            };
            match (c, value) {
                ('a', Some(v)) => o.addr = Some(get_addr(&v)?),
                ('I', Some(v)) => o.src = Some(get_addr(&v)?),
                ('p', Some(v)) => {
                    // htobe16(atoi(optarg)): the low 16 bits.
                    o.port = atoi(&v) as u16;
                    debug_log!("port {}", o.port);
                }
                ('C', Some(v)) => {
                    let n = atoi(&v);
                    if n < 0 {
                        return Err(ArgError::Value(format!("Invalid count {n}")));
                    }
                    o.count = n as u32;
                    debug_log!("count {}", o.count);
                }
                ('S', Some(v)) => {
                    let n = atoi(&v);
                    if n < RPING_MIN_BUFSIZE as i64 || n > (RPING_BUFSIZE - 1) as i64 {
                        // rping's message names RPING_BUFSIZE as the top, which it refuses.
                        return Err(ArgError::Value(format!(
                            "Invalid size {n} (valid range is {RPING_MIN_BUFSIZE} to {RPING_BUFSIZE})"
                        )));
                    }
                    o.size = n as usize;
                    debug_log!("size {}", o.size);
                }
                ('P', None) => o.persistent = true,
                ('s', None) => {
                    server = Some(true);
                    debug_log!("server");
                }
                ('c', None) => {
                    server = Some(false);
                    debug_log!("client");
                }
                ('v', None) => o.verbose = true,
                ('V', None) => o.validate = true,
                ('d', None) => DEBUG.store(true, Ordering::Relaxed),
                ('q', None) => o.self_create_qp = true,
                _ => return Err(ArgError::Usage(format!("unknown option -{c}"))),
            }
            if takes_value {
                break;
            }
        }
    }
    o.server = server
        .ok_or_else(|| ArgError::Usage("one of -s (server) or -c (client) is required".into()))?;
    if !o.server && o.addr.is_none() {
        return Err(ArgError::Usage(
            "the client needs the server's address (-a addr)".into(),
        ));
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(ArgError::Usage(e)) => {
            eprintln!("rping: {e}");
            usage();
            std::process::exit(libc::EINVAL);
        }
        Err(ArgError::Value(e)) => {
            eprintln!("{e}");
            std::process::exit(libc::EINVAL);
        }
        Err(ArgError::Addr(e)) => {
            println!("{e}");
            std::process::exit(254);
        }
    };
    let r = if o.server {
        run_server(&o)
    } else {
        run_client(&o)
    };
    if let Err(e) = r {
        eprintln!("rping: {e}");
        // rping's failures return -1 from main (or exit(-1) from its CM thread): status 255.
        std::process::exit(255);
    }
}
