//! udaddy: librdmacm's unreliable-datagram example, on softrdma.
//!
//! `udaddy [-s server_address] [-b bind_address] [-f address_format] [-P udp|ipoib]
//! [-c connections] [-C message_count] [-S message_size] [-t tos] [-p port_space]`, as
//! rdma-core's (`-p` takes the number of the port space, 0x111 or 0x2; `-f` is accepted and
//! only numeric addresses are taken). The server (no `-s`) waits for `-c` SIDR
//! requests on port 7174, gives each a UD QP, receives `-C` messages on each, and answers
//! every message with one of its own through an address handle made from the received
//! work completion (ibv_create_ah_from_wc). The client resolves the server, creates UD QPs,
//! looks the service up with SIDR (rdma_connect on a UDP id), sends `-C` messages per
//! connection through the address handle of the ESTABLISHED event and waits for the
//! replies. Both use one asynchronous event channel, as the original does.

use softrdma::rdma_cm::*;
use softrdma::*;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A failure: what udaddy returns from main (its exit status, modulo 256) and prints.
struct Fail {
    /// rdma-core's `ret`: -1 for most failures, an event's status, or -EINVAL.
    status: i32,
    msg: String,
    /// Printed on stdout as it is (rdma-core's printf lines), not as "udaddy: msg" on stderr.
    stdout: bool,
}

impl From<String> for Fail {
    fn from(msg: String) -> Fail {
        Fail {
            status: -1,
            msg,
            stdout: false,
        }
    }
}

impl From<&str> for Fail {
    fn from(msg: &str) -> Fail {
        msg.to_string().into()
    }
}

type Res<T> = std::result::Result<T, Fail>;

/// rdma-core's verify_test_params: a message must fit the port's active MTU (-EINVAL).
fn verify_test_params(id: &CmId, o: &Opts) -> Res<()> {
    let ctx = id.verbs().ok_or("the id is not bound to a device")?;
    let port = ctx
        .query_port(id.port_num())
        .map_err(|e| format!("ibv_query_port: {e}"))?;
    let mtu = port.active_mtu.bytes() as usize;
    if o.count > 0 && o.size > mtu {
        return Err(Fail {
            status: -libc::EINVAL,
            msg: format!(
                "udaddy: message_size {} is larger than active mtu {mtu}",
                o.size
            ),
            stdout: true,
        });
    }
    Ok(())
}

const PORT: u16 = 7174;
const GRH: usize = 40;

struct Opts {
    dst: Option<IpAddr>,
    src: Option<IpAddr>,
    connections: usize,
    count: usize,
    size: usize,
    tos: Option<u8>,
    ps: PortSpace,
}

struct Node {
    id: CmId,
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    buf: Arc<Buffer>,
    mr: Mr,
    ah: Option<Ah>,
    remote_qpn: u32,
    remote_qkey: u32,
    /// Send and receive completions taken so far (a poll for one kind counts the other
    /// too: a reply can complete while the client still waits for its sends).
    sends_done: usize,
    recvs_done: usize,
}

fn create_node(id: CmId, o: &Opts) -> Res<Node> {
    let ctx = id.verbs().ok_or("the id is not bound to a device")?;
    let pd = Arc::new(ctx.alloc_pd().map_err(|e| format!("ibv_alloc_pd: {e}"))?);
    let depth = (o.count.max(1) * 2) as u32;
    let cq = Arc::new(
        ctx.create_cq(depth, 0, None, 0)
            .map_err(|e| format!("ibv_create_cq: {e}"))?,
    );
    let mut attr = CmQpInitAttr {
        send_cq: Some(cq.clone()),
        recv_cq: Some(cq.clone()),
        cap: QpCap {
            max_send_wr: o.count.max(1) as u32,
            max_recv_wr: o.count.max(1) as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..Default::default()
    };
    id.create_qp_ex(Some(&pd), &mut attr)
        .map_err(|e| format!("rdma_create_qp: {e}"))?;
    let buf = Arc::new(Buffer::new(o.size + GRH));
    let mr = pd
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .map_err(|e| format!("ibv_reg_mr: {e}"))?;
    let node = Node {
        id,
        pd,
        cq,
        buf,
        mr,
        ah: None,
        remote_qpn: 0,
        remote_qkey: 0,
        sends_done: 0,
        recvs_done: 0,
    };
    for i in 0..o.count {
        post_recv(&node, o, i as u64)?;
    }
    Ok(node)
}

fn post_recv(n: &Node, o: &Opts, wr_id: u64) -> Res<()> {
    let qp = n.id.qp().ok_or("no QP")?;
    qp.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[Sge {
            addr: n.buf.addr(),
            length: (o.size + GRH) as u32,
            lkey: n.mr.lkey(),
        }],
    }])
    .map_err(|e| format!("ibv_post_recv: {e}").into())
}

fn post_sends(n: &Node, o: &Opts) -> Res<()> {
    let qp = n.id.qp().ok_or("no QP")?;
    let ah = n.ah.as_ref().ok_or("no address handle")?;
    for i in 0..o.count {
        qp.post_send(&[SendWr {
            wr_id: i as u64,
            sg_list: &[Sge {
                addr: n.buf.addr() + GRH as u64,
                length: o.size as u32,
                lkey: n.mr.lkey(),
            }],
            // As rdma-core's udaddy: the immediate data carries our QP number, which the
            // peer's server answers (it reads the reply's QPN from there, not from the GRH).
            opcode: WrOpcode::SendWithImm,
            imm_data: qp.qp_num(),
            send_flags: SendFlags::SIGNALED,
            ah: Some(ah),
            remote_qpn: n.remote_qpn,
            remote_qkey: n.remote_qkey,
            ..Default::default()
        }])
        .map_err(|e| format!("ibv_post_send: {e}"))?;
    }
    Ok(())
}

/// Polls every node's CQ until each has `want` completions of sends (`recv` false) or of
/// receives (`recv` true) in all; completions of the other kind met on the way are counted
/// for the poll that waits for them, not lost. The server makes its reply address handle
/// from the first receive.
fn poll_cqs(nodes: &mut [Node], want: usize, recv: bool) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in nodes.iter_mut() {
        let mut wc = [WorkCompletion::default(); 8];
        while if recv { n.recvs_done } else { n.sends_done } < want {
            let k =
                n.cq.poll(&mut wc)
                    .map_err(|e| format!("ibv_poll_cq: {e}"))?;
            for w in &wc[..k] {
                if w.status != WcStatus::Success {
                    return Err(format!("completion failed: {}", w.status.as_str()).into());
                }
                if w.opcode == WcOpcode::Recv {
                    if n.ah.is_none() {
                        let mut grh = [0u8; GRH];
                        n.buf.read(0, &mut grh).map_err(|e| e.to_string())?;
                        let ah =
                            n.pd.create_ah_from_wc(1, w, &grh)
                                .map_err(|e| format!("ibv_create_ah_from_wc: {e}"))?;
                        n.ah = Some(ah);
                        // The sender's QP number, from the immediate data (rdma-core's
                        // create_reply_ah); the DETH's source QP is the same for softrdma
                        // and rxe peers, but the immediate is what udaddy defines.
                        n.remote_qpn = if w.wc_flags.contains(WcFlags::WITH_IMM) {
                            w.imm_data
                        } else {
                            w.src_qp
                        };
                        n.remote_qkey = RDMA_UDP_QKEY;
                    }
                    n.recvs_done += 1;
                } else if w.opcode == WcOpcode::Send {
                    n.sends_done += 1;
                }
            }
            if k == 0 {
                if Instant::now() > deadline {
                    return Err("timed out waiting for completions".into());
                }
                std::thread::yield_now();
            }
        }
    }
    Ok(())
}

fn server(o: &Opts, ch: &EventChannel) -> Res<()> {
    let listen = CmId::create(Some(ch), 0, o.ps).map_err(|e| format!("rdma_create_id: {e}"))?;
    let ip = o.src.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    listen
        .bind_addr(SocketAddr::new(ip, PORT))
        .map_err(|e| format!("rdma_bind_addr: {e}"))?;
    listen.listen(0).map_err(|e| format!("rdma_listen: {e}"))?;
    println!("udaddy: listening on {}", listen.local_addr().unwrap());
    let mut nodes = Vec::new();
    while nodes.len() < o.connections {
        let ev = ch
            .get_cm_event()
            .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
        if ev.event != CmEventType::ConnectRequest {
            let e = format!("unexpected event {}", ev.event.as_str());
            ev.ack();
            return Err(e.into());
        }
        let id = ev.id.clone();
        ev.ack();
        let node = match verify_test_params(&id, o).and_then(|()| create_node(id.clone(), o)) {
            Ok(n) => n,
            Err(e) => {
                if e.stdout {
                    println!("{}", e.msg);
                } else {
                    eprintln!("udaddy: {}", e.msg);
                }
                println!("udaddy: failing connection request");
                let _ = id.reject(&[]);
                // As rdma-core's server: a failed request ends the wait for requests, and
                // the test goes on with the connections it has (none: it completes at once).
                break;
            }
        };
        node.id
            .accept(&ConnParam::default())
            .map_err(|e| format!("rdma_accept: {e}"))?;
        nodes.push(node);
    }
    if o.count > 0 {
        println!("receiving data transfers");
        poll_cqs(&mut nodes, o.count, true)?;
        println!("sending replies");
        for n in &nodes {
            post_sends(n, o)?;
        }
        poll_cqs(&mut nodes, o.count, false)?;
        println!("data transfers complete");
    }
    for n in nodes {
        n.id.destroy_qp();
        drop(n.ah);
        drop(n.mr);
        n.id.destroy();
    }
    listen.destroy();
    Ok(())
}

fn client(o: &Opts, ch: &EventChannel, dst: IpAddr) -> Res<()> {
    let mut pending = Vec::new();
    for i in 0..o.connections {
        let id =
            CmId::create(Some(ch), i as u64, o.ps).map_err(|e| format!("rdma_create_id: {e}"))?;
        if let Some(t) = o.tos {
            id.set_option(CmOption::Tos(t))
                .map_err(|e| format!("rdma_set_option: {e}"))?;
        }
        let src = o.src.map(|ip| SocketAddr::new(ip, 0));
        id.resolve_addr(src, SocketAddr::new(dst, PORT), 2000)
            .map_err(|e| format!("rdma_resolve_addr: {e}"))?;
        pending.push(id);
    }
    println!("udaddy: connecting");
    let mut nodes: Vec<Node> = Vec::new();
    let mut established = 0;
    while established < o.connections {
        let ev = ch
            .get_cm_event()
            .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
        let id = ev.id.clone();
        match ev.event {
            CmEventType::AddrResolved => {
                ev.ack();
                verify_test_params(&id, o)?;
                nodes.push(create_node(id.clone(), o)?);
                id.resolve_route(2000)
                    .map_err(|e| format!("rdma_resolve_route: {e}"))?;
            }
            CmEventType::RouteResolved => {
                ev.ack();
                id.connect(&ConnParam::default())
                    .map_err(|e| format!("rdma_connect: {e}"))?;
            }
            CmEventType::Established => {
                let ud = ev.ud.clone().ok_or("ESTABLISHED without UD parameters")?;
                ev.ack();
                let n = nodes
                    .iter_mut()
                    .find(|n| n.id == id)
                    .ok_or("an event for an unknown id")?;
                n.remote_qpn = ud.qp_num;
                n.remote_qkey = ud.qkey;
                n.ah = Some(
                    n.pd.create_ah(&ud.ah_attr)
                        .map_err(|e| format!("ibv_create_ah: {e}"))?,
                );
                established += 1;
            }
            other => {
                let status = ev.status;
                ev.ack();
                // rdma-core's udaddy returns the event's status.
                return Err(Fail {
                    status,
                    msg: format!("udaddy: event: {}, error: {status}", other.as_str()),
                    stdout: true,
                });
            }
        }
    }
    if o.count > 0 {
        println!("initiating data transfers");
        for n in &nodes {
            post_sends(n, o)?;
        }
        poll_cqs(&mut nodes, o.count, false)?;
        println!("receiving data transfers");
        poll_cqs(&mut nodes, o.count, true)?;
        println!("data transfers complete");
    }
    drop(pending);
    for n in nodes {
        n.id.destroy_qp();
        drop(n.ah);
        drop(n.mr);
        n.id.destroy();
    }
    Ok(())
}

/// The usage text, on stdout as rdma-core prints it; exit status 1.
fn usage() -> ExitCode {
    println!("usage: udaddy");
    println!("\t[-s server_address]");
    println!("\t[-b bind_address]");
    println!("\t[-f address_format]");
    println!("\t    name, ip, ipv6, or gid");
    println!("\t[-P port_space]");
    println!("\t    udp or ipoib");
    println!("\t[-c connections]");
    println!("\t[-C message_count]");
    println!("\t[-S message_size]");
    println!("\t[-t type_of_service]");
    println!("\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]");
    ExitCode::from(1)
}

/// C's strtol(s, NULL, 0) for the values udaddy takes: decimal, 0x hex, 0 octal.
fn strtol0(s: &str) -> Option<i64> {
    let t = s.trim();
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()
    } else {
        t.parse().ok()
    }
}

fn main() -> ExitCode {
    let mut o = Opts {
        dst: None,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        tos: None,
        ps: PortSpace::Udp,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let Some(v) = args.next() else {
            return usage();
        };
        let ok = match a.as_str() {
            "-s" => v.parse().map(|x| o.dst = Some(x)).is_ok(),
            "-b" => v.parse().map(|x| o.src = Some(x)).is_ok(),
            "-c" => v.parse().map(|x| o.connections = x).is_ok(),
            "-C" => v.parse().map(|x| o.count = x).is_ok(),
            "-S" => v.parse().map(|x| o.size = x).is_ok(),
            "-t" => strtol0(&v).map(|x| o.tos = Some(x as u8)).is_some(),
            // The port space's number (RDMA_PS_UDP 0x111, RDMA_PS_IPOIB 0x2).
            "-p" => match strtol0(&v) {
                Some(0x111) => {
                    o.ps = PortSpace::Udp;
                    true
                }
                Some(0x2) => {
                    o.ps = PortSpace::Ipoib;
                    true
                }
                _ => false,
            },
            "-P" => {
                if v.to_ascii_lowercase().starts_with("ipoib") {
                    o.ps = PortSpace::Ipoib;
                } else if !v.to_ascii_lowercase().starts_with("udp") {
                    eprintln!("Warning: unknown port space format");
                }
                true
            }
            // Address formats: the addresses are taken as numeric ones whatever it says.
            "-f" => {
                let f = v.to_ascii_lowercase();
                if !(f.starts_with("ip") || f.starts_with("gid") || f.starts_with("name")) {
                    eprintln!("Warning: unknown address format");
                }
                true
            }
            _ => false,
        };
        if !ok {
            return usage();
        }
    }
    let ch = match EventChannel::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("udaddy: rdma_create_event_channel: {e}");
            return ExitCode::from(1);
        }
    };
    let r = match o.dst {
        None => {
            println!("udaddy: starting server");
            server(&o, &ch)
        }
        Some(dst) => {
            println!("udaddy: starting client");
            client(&o, &ch, dst)
        }
    };
    match r {
        Ok(()) => {
            println!("test complete");
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            if e.stdout {
                println!("{}", e.msg);
            } else {
                eprintln!("udaddy: {}", e.msg);
            }
            println!("test complete");
            println!("return status {}", e.status);
            // main's return value, as the shell sees it.
            ExitCode::from(e.status as u8)
        }
    }
}
