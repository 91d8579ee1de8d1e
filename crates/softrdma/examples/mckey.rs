//! mckey: librdmacm's multicast example, on softrdma.
//!
//! `mckey -m multicast_address [-b bind_address] [-s] [-c connections] [-C message_count]
//! [-S message_size] [-p 0x111|0x2] [-o]`. Each connection is a UDP id that resolves the
//! group address (binding the device of `-b`), creates a UD QP, posts its receives and joins
//! the group (`-o`: as a send-only member, which is not attached). On MULTICAST_JOIN it makes
//! an address handle from the event's address vector; a sender (`-s`) then sends
//! `message_count` datagrams of `message_size` bytes to the group (QPN 0xFFFFFF, the rdma_cm
//! Q_Key), a receiver waits for as many completions, of any status, as rdma-core's does:
//! failed completions, messages of another size or with mixed bytes are reported on stderr
//! and do not change the exit status. Over RoCE the group is the IP multicast group: on
//! loopback every process that joined it gets a copy.

use softrdma::rdma_cm::*;
use softrdma::*;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = std::result::Result<T, String>;

const GRH: usize = 40;

struct Opts {
    group: Option<IpAddr>,
    bind: Option<IpAddr>,
    sender: bool,
    connections: usize,
    count: usize,
    size: usize,
    ps: PortSpace,
    send_only: bool,
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
}

fn create_node(id: CmId, o: &Opts) -> Res<Node> {
    let ctx = id.verbs().ok_or("the id is not bound to a device")?;
    let pd = Arc::new(ctx.alloc_pd().map_err(|e| format!("ibv_alloc_pd: {e}"))?);
    let n = o.count.max(1) as u32;
    let cq = Arc::new(
        ctx.create_cq(2 * n, 0, None, 0)
            .map_err(|e| format!("ibv_create_cq: {e}"))?,
    );
    let mut attr = CmQpInitAttr {
        send_cq: Some(cq.clone()),
        recv_cq: Some(cq.clone()),
        cap: QpCap {
            max_send_wr: n,
            max_recv_wr: n,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..Default::default()
    };
    id.create_qp_ex(Some(&pd), &mut attr)
        .map_err(|e| format!("rdma_create_qp: {e}"))?;
    let buf = Arc::new(Buffer::new((o.size + GRH) * o.count.max(1)));
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
    };
    if !o.sender {
        let qp = node.id.qp().ok_or("no QP")?;
        for i in 0..o.count {
            let off = (i * (o.size + GRH)) as u64;
            qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: &[Sge {
                    addr: node.buf.addr() + off,
                    length: (o.size + GRH) as u32,
                    lkey: node.mr.lkey(),
                }],
            }])
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
        }
    }
    Ok(node)
}

fn post_sends(n: &Node, o: &Opts) -> Res<()> {
    let qp = n.id.qp().ok_or("no QP")?;
    let ah = n.ah.as_ref().ok_or("no address handle")?;
    for i in 0..o.count {
        let byte = (i % 251) as u8;
        let msg = vec![byte; o.size];
        n.buf.write(0, &msg).map_err(|e| e.to_string())?;
        qp.post_send(&[SendWr {
            wr_id: i as u64,
            sg_list: &[Sge {
                addr: n.buf.addr(),
                length: o.size as u32,
                lkey: n.mr.lkey(),
            }],
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ah: Some(ah),
            remote_qpn: n.remote_qpn,
            remote_qkey: n.remote_qkey,
            ..Default::default()
        }])
        .map_err(|e| format!("ibv_post_send: {e}"))?;
        // One at a time: the next send reuses the buffer.
        wait(n, 1, WcOpcode::Send)?;
    }
    Ok(())
}

/// Polls `n`'s CQ for `want` completions of `op`. As rdma-core's mckey, a completion with an
/// error status counts as one too and fails nothing: it is reported on stderr
/// ("mckey: completion failed: ..."), and the program's status does not change.
fn wait(n: &Node, want: usize, op: WcOpcode) -> Res<Vec<WorkCompletion>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    while got.len() < want {
        let k =
            n.cq.poll(&mut wc)
                .map_err(|e| format!("ibv_poll_cq: {e}"))?;
        for w in &wc[..k] {
            if w.status != WcStatus::Success {
                eprintln!("mckey: completion failed: {}", w.status.as_str());
                got.push(*w);
            } else if w.opcode == op {
                got.push(*w);
            }
        }
        if k == 0 {
            if Instant::now() > deadline {
                return Err(format!("timed out: {} of {want} completions", got.len()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    Ok(got)
}

fn run(o: &Opts, ch: &EventChannel, group: IpAddr) -> Res<()> {
    println!("mckey: joining");
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..o.connections {
        let id =
            CmId::create(Some(ch), i as u64, o.ps).map_err(|e| format!("rdma_create_id: {e}"))?;
        let src = o.bind.map(|ip| SocketAddr::new(ip, 0));
        id.resolve_addr(src, SocketAddr::new(group, 0), 2000)
            .map_err(|e| format!("rdma_resolve_addr: {e}"))?;
    }
    let mut joined = 0;
    while joined < o.connections {
        let ev = ch
            .get_cm_event()
            .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
        let id = ev.id.clone();
        match ev.event {
            CmEventType::AddrResolved => {
                ev.ack();
                nodes.push(create_node(id.clone(), o)?);
                let attr = JoinMcAttrEx {
                    comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
                    join_flags: if o.send_only {
                        RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
                    } else {
                        RDMA_MC_JOIN_FLAG_FULLMEMBER
                    },
                    addr: Some(group),
                };
                id.join_multicast_ex(&attr, id.context())
                    .map_err(|e| format!("rdma_join_multicast: {e}"))?;
            }
            CmEventType::MulticastJoin => {
                let ud = ev
                    .ud
                    .clone()
                    .ok_or("MULTICAST_JOIN without UD parameters")?;
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
                joined += 1;
            }
            other => {
                let status = ev.status;
                ev.ack();
                return Err(format!(
                    "event: {}, error: {status}",
                    other.as_str().to_lowercase()
                ));
            }
        }
    }
    // rdma-core prints the group's GID: an IPv4 group as its IPv4-mapped IPv6 address.
    let dgid = match group {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    println!("mckey: joined dgid: {dgid} mlid 0x0 sl 0");
    if o.count > 0 {
        if o.sender {
            println!("initiating data transfers");
            for n in &nodes {
                post_sends(n, o)?;
            }
        } else {
            println!("receiving data transfers");
            for n in &nodes {
                let wcs = wait(n, o.count, WcOpcode::Recv)?;
                // rdma-core's mckey only counts the messages; this one also checks them and
                // says on stderr what it finds, without failing for it (as rdma-core's).
                for w in wcs.iter().filter(|w| w.status == WcStatus::Success) {
                    if w.byte_len as usize != o.size + GRH {
                        eprintln!("mckey: a message of {} bytes", w.byte_len);
                        continue;
                    }
                    let off = w.wr_id as usize * (o.size + GRH) + GRH;
                    let mut got = vec![0u8; o.size];
                    n.buf.read(off, &mut got).map_err(|e| e.to_string())?;
                    let want = (got.first().copied().unwrap_or(0), o.size);
                    if got.iter().any(|b| *b != want.0) {
                        eprintln!("mckey: a message with mixed bytes");
                    }
                }
            }
        }
        println!("data transfers complete");
    }
    for n in nodes {
        let _ = n.id.leave_multicast(group);
        n.id.destroy_qp();
        drop(n.ah);
        drop(n.mr);
        n.id.destroy();
    }
    Ok(())
}

/// The usage text, on stdout as rdma-core prints it (less -M and -l, which this mckey
/// lacks); exit status 1.
fn usage() -> ExitCode {
    println!("usage: mckey");
    println!("\t-m multicast_address");
    println!("\t[-s(ender)]");
    println!("\t[-b bind_address]");
    println!("\t[-c connections]");
    println!("\t[-C message_count]");
    println!("\t[-S message_size]");
    println!("\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]");
    println!("\t[-o join as a send-only full-member]");
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let mut o = Opts {
        group: None,
        bind: None,
        sender: false,
        connections: 1,
        count: 10,
        size: 100,
        ps: PortSpace::Udp,
        send_only: false,
    };
    let mut group_arg: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let ok = match a.as_str() {
            "-s" => {
                o.sender = true;
                true
            }
            "-o" => {
                o.send_only = true;
                true
            }
            flag => {
                let Some(v) = args.next() else {
                    return usage();
                };
                match flag {
                    // Resolved after "starting", as rdma-core's getaddrinfo of it.
                    "-m" => {
                        group_arg = Some(v);
                        true
                    }
                    "-b" => v.parse().map(|x| o.bind = Some(x)).is_ok(),
                    "-c" => v.parse().map(|x| o.connections = x).is_ok(),
                    "-C" => v.parse().map(|x| o.count = x).is_ok(),
                    "-S" => v.parse().map(|x| o.size = x).is_ok(),
                    // The port space's number, as rdma-core's strtol(optarg, NULL, 0).
                    "-p" => match v.to_ascii_lowercase().as_str() {
                        "0x111" | "273" => {
                            o.ps = PortSpace::Udp;
                            true
                        }
                        "0x2" | "2" | "02" => {
                            o.ps = PortSpace::Ipoib;
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                }
            }
        };
        if !ok {
            return usage();
        }
    }
    if o.send_only && !o.sender {
        eprintln!("mckey: a send-only member must be a sender (-s)");
        return usage();
    }
    let ch = match EventChannel::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mckey: rdma_create_event_channel: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "mckey: starting {}",
        if o.sender { "client" } else { "server" }
    );
    // No -m, or a group that is not an address: rdma-core's getaddrinfo fails (EAI_NONAME,
    // -2), and mckey returns that (exit status 254).
    let Some(group) = group_arg.as_deref().and_then(|g| g.parse::<IpAddr>().ok()) else {
        println!("getaddrinfo failed (Name or service not known) - invalid hostname or IP address");
        println!("test complete");
        println!("return status -2");
        return ExitCode::from(254);
    };
    o.group = Some(group);
    match run(&o, &ch, group) {
        Ok(()) => {
            println!("test complete");
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mckey: {e}");
            println!("test complete");
            println!("return status -1");
            ExitCode::from(1)
        }
    }
}
