//! The ping-pong programs of libibverbs' examples over softrdma: `ibv_rc_pingpong`,
//! `ibv_uc_pingpong` and `ibv_ud_pingpong` in one module, run by the examples `rc_pingpong`,
//! `uc_pingpong` and `ud_pingpong` (each file's comment says what its program does), and
//! `ibv_srq_pingpong` in the submodule `srq`.

#![allow(dead_code)]

mod srq;

use softrdma::{
    AccessFlags, Ah, AhAttr, Buffer, CompChannel, Context, Cq, Device, Gid, GlobalRoute, LinkLayer,
    Mr, Mtu, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Which of the three programs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `ibv_rc_pingpong`: a reliable connection.
    Rc,
    /// `ibv_uc_pingpong`: an unreliable connection (no ACKs, no retransmission).
    Uc,
    /// `ibv_ud_pingpong`: unreliable datagrams, through an address handle, with the 40-byte
    /// GRH in front of each received message.
    Ud,
    /// `ibv_srq_pingpong`: `-q` RC QPs whose receives all come from one shared receive queue.
    Srq,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Rc => "rc_pingpong",
            Kind::Uc => "uc_pingpong",
            Kind::Ud => "ud_pingpong",
            Kind::Srq => "srq_pingpong",
        }
    }
}

/// The Q_Key of ud_pingpong's QPs.
const UD_QKEY: u32 = 0x1111_1111;
/// The bytes of the GRH at the front of every UD receive buffer.
const GRH_LEN: usize = 40;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// The length of the address message with its NUL: "0000:000000:000000:" + 32 hex digits.
const MSG_LEN: usize = 4 + 1 + 6 + 1 + 6 + 1 + 32 + 1;
/// The client's final word, NUL included.
const DONE: &[u8] = b"done\0";

struct Opts {
    kind: Kind,
    port: u16,
    dev: Option<String>,
    ib_port: u8,
    size: usize,
    mtu: Mtu,
    rx_depth: u32,
    iters: u32,
    sl: u8,
    events: bool,
    gidx: i32,
    odp: bool,
    ts: bool,
    /// `-c`: the client writes 0 at every page of its buffer (after the GRH for UD) before
    /// the first send, and the server checks those bytes at the end.
    chk: bool,
    stats: bool,
    /// `-q` (srq_pingpong): the number of QPs.
    num_qp: usize,
    /// `--late-recv MS` (softrdma's own): post the receives only MS milliseconds after the
    /// connection is up, so that the peer's first SENDs meet an empty receive queue (RNR).
    late_recv_ms: u64,
    server_name: Option<String>,
}

fn usage(argv0: &str, kind: Kind) {
    println!("Usage:");
    println!("  {argv0}            start a server and wait for connection");
    println!("  {argv0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    println!("  -p, --port=<port>      TCP port of the address exchange (default 18515)");
    println!("  -d, --ib-dev=<dev>     device name (srdma0, srdma_<addr>) or local address");
    println!("  -i, --ib-port=<port>   port of the device (default 1)");
    if kind == Kind::Ud {
        println!("  -s, --size=<size>      message size (default 1024; at most the port's MTU)");
    } else {
        println!("  -s, --size=<size>      message size (default 4096)");
        println!("  -m, --mtu=<size>       path MTU (default 1024)");
    }
    if kind == Kind::Srq {
        println!("  -q, --num-qp=<num>     number of QPs to use (default 16)");
    }
    println!("  -r, --rx-depth=<dep>   receives posted at a time (default 500)");
    if kind == Kind::Srq {
        println!("  -n, --iters=<iters>    number of exchanges per QP(default 1000)");
    } else {
        println!("  -n, --iters=<iters>    number of exchanges (default 1000)");
    }
    println!("  -l, --sl=<sl>          service level");
    println!("  -e, --events           wait for completion events instead of polling");
    println!("  -g, --gid-idx=<index>  local GID index (softrdma: 0)");
    println!("  -c, --chk              validate the received buffer");
    if matches!(kind, Kind::Rc | Kind::Srq) {
        println!("  -o, --odp              on-demand paging (not supported by softrdma)");
    }
    if kind == Kind::Rc {
        println!("  -t, --ts               completion timestamps (not supported by softrdma)");
    }
    println!("      --stats            at the end, print softrdma's QP and device counters");
    println!(
        "      --late-recv=MS     post the receives MS ms after connecting (provokes RNR NAKs)"
    );
}

/// A number as `strtoul(s, NULL, 0)` reads it: decimal, `0x` hex or leading-`0` octal.
fn parse_num(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if s.len() > 1 && s.starts_with('0') {
        i64::from_str_radix(&s[1..], 8).ok()?
    } else {
        s.parse().ok()?
    };
    Some(if neg { -v } else { v })
}

fn mtu_from_bytes(n: i64) -> Option<Mtu> {
    Some(match n {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// Parses the flags as the program's getopt_long does: "p:d:i:s:m:r:n:l:eg:cot" for rc,
/// without "ot" for uc, without "mot" for ud. `Err(())`: print usage.
fn parse_args(kind: Kind, args: &[String]) -> Result<Opts, ()> {
    let mut o = Opts {
        kind,
        port: 18515,
        dev: None,
        ib_port: 1,
        size: if kind == Kind::Ud { 1024 } else { 4096 },
        mtu: Mtu::Mtu1024,
        rx_depth: 500,
        iters: 1000,
        sl: 0,
        events: false,
        gidx: -1,
        odp: false,
        ts: false,
        chk: false,
        stats: false,
        num_qp: 16,
        late_recv_ms: 0,
        server_name: None,
    };
    const LONG: [(&str, char); 16] = [
        ("port", 'p'),
        ("ib-dev", 'd'),
        ("ib-port", 'i'),
        ("size", 's'),
        ("mtu", 'm'),
        ("rx-depth", 'r'),
        ("iters", 'n'),
        ("sl", 'l'),
        ("events", 'e'),
        ("gid-idx", 'g'),
        ("odp", 'o'),
        ("ts", 't'),
        ("chk", 'c'),
        ("num-qp", 'q'),
        ("stats", 'S'),
        ("late-recv", 'L'),
    ];
    let takes_value = |c: char| "pdismrnlgLq".contains(c);
    // The letters this program does not take (its getopt string lacks them).
    let refused = match kind {
        Kind::Rc => "q",
        Kind::Uc => "otq",
        Kind::Ud => "motq",
        Kind::Srq => "t",
    };
    let mut opts: Vec<(char, Option<String>, bool)> = Vec::new();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            // getopt_long accepts unambiguous prefixes.
            let hits: Vec<_> = LONG.iter().filter(|(l, _)| l.starts_with(name)).collect();
            let c = match hits.iter().find(|(l, _)| *l == name).or(hits.first()) {
                Some((_, c)) if hits.len() == 1 || hits.iter().any(|(l, _)| *l == name) => *c,
                _ => return Err(()),
            };
            let v = if takes_value(c) {
                match inline {
                    Some(v) => Some(v),
                    None if i < args.len() => {
                        i += 1;
                        Some(args[i - 1].clone())
                    }
                    None => return Err(()),
                }
            } else if inline.is_some() {
                return Err(());
            } else {
                None
            };
            opts.push((c, v, true));
            continue;
        }
        match arg.strip_prefix('-').filter(|f| !f.is_empty()) {
            None => positional.push(arg.clone()),
            Some(flags) => {
                for (pos, c) in flags.char_indices() {
                    if takes_value(c) {
                        let rest = &flags[pos + c.len_utf8()..];
                        let v = if !rest.is_empty() {
                            rest.to_string()
                        } else if i < args.len() {
                            i += 1;
                            args[i - 1].clone()
                        } else {
                            return Err(());
                        };
                        opts.push((c, Some(v), false));
                        break;
                    }
                    opts.push((c, None, false));
                }
            }
        }
    }
    for (c, v, from_long) in opts {
        let num = || v.as_deref().and_then(parse_num).ok_or(());
        if refused.contains(c) {
            return Err(());
        }
        match c {
            'p' => o.port = u16::try_from(num()?).map_err(|_| ())?,
            'd' => o.dev = v,
            'i' => {
                let p = num()?;
                if p < 1 {
                    return Err(());
                }
                o.ib_port = u8::try_from(p).unwrap_or(u8::MAX);
            }
            's' => {
                o.size = usize::try_from(num()?).map_err(|_| ())?;
                if kind == Kind::Srq && o.size < 1 {
                    return Err(());
                }
            }
            'q' => o.num_qp = usize::try_from(num()?).map_err(|_| ())?,
            'm' => o.mtu = mtu_from_bytes(num()?).ok_or(())?,
            'r' => o.rx_depth = u32::try_from(num()?).map_err(|_| ())?,
            'n' => o.iters = u32::try_from(num()?).map_err(|_| ())?,
            'l' => o.sl = u8::try_from(num()?).map_err(|_| ())?,
            'e' => o.events = true,
            'g' => o.gidx = i32::try_from(num()?).map_err(|_| ())?,
            'o' => o.odp = true,
            't' => o.ts = true,
            'c' => o.chk = true,
            'S' if from_long => o.stats = true,
            'L' if from_long => o.late_recv_ms = u64::try_from(num()?).map_err(|_| ())?,
            _ => return Err(()),
        }
    }
    match positional.len() {
        0 => {}
        1 => o.server_name = positional.pop(),
        _ => return Err(()),
    }
    Ok(o)
}

/// One side's address: what the 52-byte message carries.
#[derive(Clone, Copy)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: Gid,
}

impl Dest {
    /// The message: the four fields as hex text, colon-separated, NUL-padded to 52 bytes.
    fn to_msg(self) -> [u8; MSG_LEN] {
        let hex: String = self.gid.raw.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{hex}",
            self.lid & 0xffff,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Reads a message as the C program's sscanf("%x:%x:%x:%s") and its GID decoding do.
    fn from_msg(msg: &[u8]) -> Option<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).ok()?;
        let mut parts = text.splitn(4, ':');
        let mut field = || u32::from_str_radix(parts.next()?.trim(), 16).ok();
        let (lid, qpn, psn) = (field()?, field()?, field()?);
        let g = parts.next()?;
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Dest {
            lid,
            qpn,
            psn,
            gid: Gid { raw },
        })
    }

    /// The address line; ud_pingpong's local one has a colon after the PSN (`ud`).
    fn print(&self, what: &str, ud: bool) {
        println!(
            "  {what} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{} GID {}",
            self.lid,
            self.qpn,
            self.psn,
            if ud { ":" } else { "," },
            self.gid
        );
    }
}

struct Pingpong {
    ctx: Context,
    channel: Option<CompChannel>,
    pd: Pd,
    buf: Arc<Buffer>,
    mr: Mr,
    cq: Cq,
    qp: Qp,
    /// UD: the address handle of the peer, made by `connect`.
    ah: Option<Ah>,
    /// UD: the remote QP number, from the exchange.
    remote_qpn: u32,
    kind: Kind,
    size: usize,
    send_flags: SendFlags,
    rx_depth: u32,
    pending: u64,
}

impl Pingpong {
    fn new(dev: &Device, o: &Opts) -> Result<Pingpong, String> {
        // UD: a GRH's room in front of the message.
        let grh = if o.kind == Kind::Ud { GRH_LEN } else { 0 };
        let mut buf = Buffer::new((o.size + grh).max(1));
        // Not registered yet: the bytes can be written in place.
        buf.as_mut_slice().fill(0x7b);
        let buf = Arc::new(buf);
        let ctx = dev
            .open()
            .map_err(|e| format!("cannot open {}: {e}", dev.name()))?;
        if o.kind == Kind::Ud {
            let port = ctx
                .query_port(o.ib_port)
                .map_err(|_| format!("Unable to query port info for port {}", o.ib_port))?;
            let mtu = port.active_mtu.bytes() as usize;
            if o.size > mtu {
                return Err(format!("Requested size larger than port MTU ({mtu})"));
            }
        }
        let channel = if o.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(|e| format!("cannot create a completion channel: {e}"))?,
            )
        } else {
            None
        };
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("cannot allocate a PD: {e}"))?;
        if o.odp {
            return Err("on-demand paging (-o): the device does not support it".into());
        }
        if o.ts {
            return Err("completion timestamps (-t): the device does not support them".into());
        }
        let mr = pd
            .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
            .map_err(|e| format!("cannot register the buffer: {e}"))?;
        let cq = ctx
            .create_cq(o.rx_depth + 1, 0, channel.as_ref(), 0)
            .map_err(|e| format!("cannot create a CQ: {e}"))?;
        let qp_type = match o.kind {
            Kind::Rc | Kind::Srq => QpType::Rc,
            Kind::Uc => QpType::Uc,
            Kind::Ud => QpType::Ud,
        };
        let mut init = QpInitAttr::new(
            qp_type,
            &cq,
            QpCap {
                max_send_wr: 1,
                max_recv_wr: o.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
        );
        let qp = pd
            .create_qp(&mut init)
            .map_err(|e| format!("cannot create the QP: {e}"))?;
        let mut send_flags = SendFlags::SIGNALED;
        if let Ok((_, info)) = qp.query_qp() {
            if info.cap.max_inline_data as usize >= o.size {
                send_flags |= SendFlags::INLINE;
            }
        }
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: o.ib_port,
            qp_access_flags: 0,
            qkey: UD_QKEY,
            ..Default::default()
        };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        let mask = if o.kind == Kind::Ud {
            mask | QpAttrMask::QKEY
        } else {
            mask | QpAttrMask::ACCESS_FLAGS
        };
        qp.modify_qp(&attr, mask.bits())
            .map_err(|e| format!("cannot move the QP to INIT: {e}"))?;
        Ok(Pingpong {
            ctx,
            channel,
            pd,
            buf,
            mr,
            cq,
            qp,
            ah: None,
            remote_qpn: 0,
            kind: o.kind,
            size: o.size,
            send_flags,
            rx_depth: o.rx_depth,
            pending: 0,
        })
    }

    /// Where the message is in the buffer (after the GRH's room for UD).
    fn msg_offset(&self) -> usize {
        if self.kind == Kind::Ud {
            GRH_LEN
        } else {
            0
        }
    }

    /// The message: `size` bytes at `msg_offset`.
    fn sge(&self) -> Sge {
        Sge {
            addr: self.buf.addr() + self.msg_offset() as u64,
            length: self.size as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Posts up to `n` receives of the whole buffer (GRH room and message); returns how many
    /// were posted.
    fn post_recv(&self, n: u32) -> u32 {
        let sge = [Sge {
            addr: self.buf.addr(),
            length: (self.size + self.msg_offset()) as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        };
        (0..n)
            .take_while(|_| self.qp.post_recv(std::slice::from_ref(&wr)).is_ok())
            .count() as u32
    }

    fn post_send(&self) -> Result<(), String> {
        let sge = [self.sge()];
        let wr = SendWr {
            wr_id: SEND_WRID,
            sg_list: &sge,
            opcode: WrOpcode::Send,
            send_flags: self.send_flags,
            ah: self.ah.as_ref(),
            remote_qpn: self.remote_qpn,
            remote_qkey: UD_QKEY,
            ..Default::default()
        };
        self.qp
            .post_send(&[wr])
            .map_err(|e| format!("cannot post a send: {}", e.error))
    }

    /// RTR then RTS toward `dest` (RC and UC); UD: RTR and RTS, then the address handle of
    /// `dest`.
    fn connect(&mut self, o: &Opts, my_psn: u32, dest: &Dest) -> Result<(), String> {
        let ah_attr = move_to_rts(&self.qp, o, my_psn, dest)?;
        if o.kind == Kind::Ud {
            let ah = self
                .pd
                .create_ah(&ah_attr)
                .map_err(|e| format!("Failed to create AH: {e}"))?;
            self.ah = Some(ah);
            self.remote_qpn = dest.qpn;
        }
        Ok(())
    }

    /// Destroys everything, in the order of the C program.
    fn close(self) -> Result<(), String> {
        let Pingpong {
            ctx,
            channel,
            pd,
            buf,
            mr,
            cq,
            qp,
            ah,
            ..
        } = self;
        qp.destroy()
            .map_err(|e| format!("cannot destroy the QP: {e}"))?;
        cq.destroy()
            .map_err(|e| format!("cannot destroy the CQ: {e}"))?;
        mr.dereg()
            .map_err(|e| format!("cannot deregister the MR: {e}"))?;
        if let Some(ah) = ah {
            ah.destroy()
                .map_err(|e| format!("Couldn't destroy AH: {}", e.error))?;
        }
        pd.dealloc()
            .map_err(|e| format!("cannot deallocate the PD: {e}"))?;
        if let Some(ch) = channel {
            ch.destroy()
                .map_err(|e| format!("cannot destroy the completion channel: {e}"))?;
        }
        ctx.close()
            .map_err(|e| format!("cannot close the device: {e}"))?;
        drop(buf);
        Ok(())
    }
}

/// Moves `qp` (of `o.kind`; RC for srq_pingpong) to RTR then RTS toward `dest`, with the
/// attributes and masks of the C programs; returns the address vector toward `dest` (UD's
/// address handle is made from it).
fn move_to_rts(qp: &Qp, o: &Opts, my_psn: u32, dest: &Dest) -> Result<AhAttr, String> {
    let mut ah_attr = AhAttr {
        is_global: false,
        dlid: dest.lid as u16,
        sl: o.sl,
        src_path_bits: 0,
        port_num: o.ib_port,
        ..Default::default()
    };
    if dest.gid.interface_id() != 0 {
        ah_attr.is_global = true;
        ah_attr.grh = GlobalRoute {
            dgid: dest.gid,
            // ud_pingpong's address handle crosses routers (64); the connected
            // programs' path stays on the link (1).
            hop_limit: if o.kind == Kind::Ud { 64 } else { 1 },
            sgid_index: o.gidx as u8,
            ..Default::default()
        };
    }
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: o.mtu,
        dest_qp_num: dest.qpn,
        rq_psn: dest.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr,
        ..Default::default()
    };
    let m = match o.kind {
        Kind::Ud => QpAttrMask::STATE,
        _ => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
    };
    let m = if matches!(o.kind, Kind::Rc | Kind::Srq) {
        m | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER
    } else {
        m
    };
    qp.modify_qp(&attr, m.bits())
        .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
    attr.qp_state = QpState::Rts;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = my_psn;
    attr.max_rd_atomic = 1;
    let m = match o.kind {
        Kind::Rc | Kind::Srq => {
            QpAttrMask::STATE
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::SQ_PSN
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        Kind::Uc | Kind::Ud => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    qp.modify_qp(&attr, m.bits())
        .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
    Ok(ah_attr)
}

/// The device to use: `-d` (a name or a local address), else see the module comment.
fn pick_device(o: &Opts) -> Result<Device, String> {
    if let Some(d) = &o.dev {
        if let Ok(addr) = d.parse::<IpAddr>() {
            return Device::from_addr(addr).map_err(|e| format!("device {d}: {e}"));
        }
        return Device::by_name(d).map_err(|_| format!("device {d} not found"));
    }
    let list = softrdma::get_device_list().map_err(|e| format!("cannot list the devices: {e}"))?;
    if let Some(host) = &o.server_name {
        // The source address the kernel picks toward the server.
        let src = (host.as_str(), o.port)
            .to_socket_addrs()
            .ok()
            .into_iter()
            .flatten()
            .find_map(|peer| {
                let any: IpAddr = if peer.is_ipv4() {
                    [0u8; 4].into()
                } else {
                    [0u16; 8].into()
                };
                let s = UdpSocket::bind((any, 0)).ok()?;
                s.connect(peer).ok()?;
                Some(s.local_addr().ok()?.ip())
            });
        if let Some(src) = src {
            if let Ok(d) = Device::from_addr(src) {
                return Ok(d);
            }
        }
    }
    list.iter()
        .find(|d| !d.addr().is_loopback())
        .or(list.first())
        .cloned()
        .ok_or_else(|| "no RDMA devices found".to_string())
}

/// The client's half of the exchange: send ours (one message per entry of `mine`), read
/// as many of theirs, say done.
fn client_exchange(host: &str, port: u16, mine: &[Dest]) -> Result<Vec<Dest>, String> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {host}:{port}"))?;
    let mut s = addrs
        .into_iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| format!("Couldn't connect to {host}:{port}"))?;
    for me in mine {
        s.write_all(&me.to_msg())
            .map_err(|e| format!("cannot send the local address: {e}"))?;
    }
    let mut theirs = Vec::with_capacity(mine.len());
    for i in 0..mine.len() {
        let mut msg = [0u8; MSG_LEN];
        s.read_exact(&mut msg)
            .map_err(|e| format!("cannot read remote address [{i}]: {e}"))?;
        theirs.push(
            Dest::from_msg(&msg).ok_or_else(|| "the remote address is malformed".to_string())?,
        );
    }
    s.write_all(DONE)
        .map_err(|e| format!("cannot send done: {e}"))?;
    Ok(theirs)
}

/// The server's half: wait for one client on `port`, read its addresses (as many as
/// `mine`), connect the QPs (`connect`), answer with ours, wait for done.
fn server_exchange(
    port: u16,
    mine: &[Dest],
    connect: impl FnOnce(&[Dest]) -> Result<(), String>,
) -> Result<Vec<Dest>, String> {
    // Every address, as the C program's passive getaddrinfo gives: IPv6 (dual stack) first,
    // then IPv4.
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
    let (mut s, _) = listener
        .accept()
        .map_err(|e| format!("accept failed: {e}"))?;
    drop(listener);
    let mut theirs = Vec::with_capacity(mine.len());
    for i in 0..mine.len() {
        let mut msg = [0u8; MSG_LEN];
        s.read_exact(&mut msg)
            .map_err(|e| format!("cannot read remote address [{i}]: {e}"))?;
        theirs.push(
            Dest::from_msg(&msg).ok_or_else(|| "the remote address is malformed".to_string())?,
        );
    }
    connect(&theirs).map_err(|e| format!("{e}\ncannot connect to the remote QP"))?;
    for me in mine {
        s.write_all(&me.to_msg())
            .map_err(|e| format!("cannot send the local address: {e}"))?;
    }
    // The client answers "done" (5 bytes) and closes.
    let mut done = Vec::new();
    let _ = (&mut s).take(MSG_LEN as u64).read_to_end(&mut done);
    if done.len() != DONE.len() {
        return Err(format!(
            "expected done from the client, got {} bytes",
            done.len()
        ));
    }
    Ok(theirs)
}

fn run(o: &Opts) -> Result<(), String> {
    let dev = pick_device(o)?;
    let mut pp = Pingpong::new(&dev, o)?;
    let mut routs = if o.late_recv_ms == 0 {
        pp.post_recv(pp.rx_depth)
    } else {
        0
    };
    if o.late_recv_ms == 0 && routs < pp.rx_depth {
        return Err(format!("could post only {routs} receives"));
    }
    if o.events {
        pp.cq
            .req_notify_cq(false)
            .map_err(|e| format!("cannot arm the CQ: {e}"))?;
    }
    let port = pp
        .ctx
        .query_port(o.ib_port)
        .map_err(|e| format!("cannot query port {}: {e}", o.ib_port))?;
    if port.link_layer != LinkLayer::Ethernet && port.lid == 0 {
        return Err("the port has no LID".into());
    }
    let gid = if o.gidx >= 0 {
        pp.ctx
            .query_gid(o.ib_port, o.gidx as u32)
            .map_err(|_| format!("cannot read the GID at index {}", o.gidx))?
    } else {
        Gid::ZERO
    };
    let mut psn = [0u8; 4];
    getrandom::fill(&mut psn).map_err(|e| format!("getrandom: {e}"))?;
    let me = Dest {
        lid: u32::from(port.lid),
        qpn: pp.qp.qp_num(),
        psn: u32::from_le_bytes(psn) & 0xff_ffff,
        gid,
    };
    me.print("local address: ", o.kind == Kind::Ud);
    let rem = match &o.server_name {
        Some(host) => client_exchange(host, o.port, &[me])?[0],
        None => server_exchange(o.port, &[me], |d| pp.connect(o, me.psn, &d[0]))?[0],
    };
    rem.print("remote address:", false);
    if o.server_name.is_some() {
        pp.connect(o, me.psn, &rem)?;
    }
    if o.late_recv_ms > 0 {
        // The peer may send already: until these receives are posted it gets RNR NAKs.
        std::thread::sleep(std::time::Duration::from_millis(o.late_recv_ms));
        routs = pp.post_recv(pp.rx_depth);
        if routs < pp.rx_depth {
            return Err(format!("could post only {routs} receives"));
        }
    }
    pp.pending = RECV_WRID;
    if o.server_name.is_some() && o.chk {
        mark_pages(&pp.buf, pp.msg_offset(), o.size);
    }
    if o.server_name.is_some() {
        pp.post_send()?;
        pp.pending |= SEND_WRID;
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut num_cq_events = 0u32;
    let mut wc = [WorkCompletion::default(); 2];
    while rcnt < o.iters || scnt < o.iters {
        let ne = next_completions(pp.channel.as_ref(), &pp.cq, &mut wc, &mut num_cq_events)?;
        for w in &wc[..ne] {
            check_status(w)?;
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += pp.post_recv(pp.rx_depth - routs);
                        if routs < pp.rx_depth {
                            return Err(format!("could post only {routs} receives"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("a completion for unknown wr_id {other}")),
            }
            pp.pending &= !w.wr_id;
            if scnt < o.iters && pp.pending == 0 {
                pp.post_send()?;
                pp.pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    print_summary(o, start);
    if o.server_name.is_none() && o.chk {
        check_pages(&pp.buf, pp.msg_offset(), o.size);
    }
    if o.stats {
        let q = pp.qp.counters();
        let d = pp.ctx.counters();
        println!(
            "softrdma QP counters: tx_packets {} rx_packets {} retransmitted_packets {} \
             retries {} timeouts {} seq_naks_received {} seq_naks_sent {} \
             rnr_naks_received {} rnr_naks_sent {} duplicates {} out_of_sequence {}",
            q.tx_packets,
            q.rx_packets,
            q.retransmitted_packets,
            q.retries,
            q.timeouts,
            q.seq_naks_received,
            q.seq_naks_sent,
            q.rnr_naks_received,
            q.rnr_naks_sent,
            q.duplicates,
            q.out_of_sequence
        );
        println!(
            "softrdma device counters: tx_packets {} rx_packets {} fault_drops {} \
             icrc_errors {} icrc_ident_solved {}",
            d.tx_packets, d.rx_packets, d.fault_drops, d.icrc_errors, d.icrc_ident_solved
        );
    }
    pp.cq.ack_cq_events(num_cq_events);
    pp.close()
}

/// The page size of `-c`'s marks.
const PAGE_SIZE: usize = 4096;

/// The mark `-c` puts at byte `i` (a page start) of the message: the C programs compute
/// `i / page_size % sizeof(char)`, which is always 0.
fn chk_byte(i: usize) -> u8 {
    (i / PAGE_SIZE % std::mem::size_of::<u8>()) as u8
}

/// `-c`, client: marks the first byte of every page of the `size`-byte message at `offset`.
fn mark_pages(buf: &Buffer, offset: usize, size: usize) {
    for i in (0..size).step_by(PAGE_SIZE) {
        let _ = buf.write(offset + i, &[chk_byte(i)]);
    }
}

/// `-c`, server: reports every page of the message at `offset` whose mark is missing from
/// what it last received.
fn check_pages(buf: &Buffer, offset: usize, size: usize) {
    for i in (0..size).step_by(PAGE_SIZE) {
        let mut b = [0u8; 1];
        let _ = buf.read(offset + i, &mut b);
        if b[0] != chk_byte(i) {
            println!("invalid data in page {}", i / PAGE_SIZE);
        }
    }
}

/// The next completions of `cq` into `wc`: with a completion channel, after its next event
/// (counted in `num_cq_events`, the CQ re-armed) and one poll, which may find none; without,
/// polling until at least one.
fn next_completions(
    channel: Option<&CompChannel>,
    cq: &Cq,
    wc: &mut [WorkCompletion],
    num_cq_events: &mut u32,
) -> Result<usize, String> {
    if let Some(ch) = channel {
        let ev = ch
            .get_cq_event()
            .map_err(|e| format!("cannot get a CQ event: {e}"))?;
        *num_cq_events += 1;
        if !ev.is_for(cq) {
            return Err("a CQ event for an unknown CQ".into());
        }
        cq.req_notify_cq(false)
            .map_err(|e| format!("cannot arm the CQ: {e}"))?;
    }
    loop {
        let ne = cq
            .poll(wc)
            .map_err(|e| format!("polling the CQ failed: {e}"))?;
        if ne > 0 || channel.is_some() {
            return Ok(ne);
        }
    }
}

/// A failed completion ends the program, with its status and work request ID.
fn check_status(w: &WorkCompletion) -> Result<(), String> {
    if w.status == WcStatus::Success {
        return Ok(());
    }
    Err(format!(
        "completion with status {} ({}) for wr_id {}",
        w.status.as_str(),
        w.status as u32,
        w.wr_id
    ))
}

/// The two summary lines of every ping-pong, for `-s` × `-n` × 2 bytes since `start`.
fn print_summary(o: &Opts, start: Instant) {
    let usec = start.elapsed().as_micros().max(1) as f64;
    let bytes = o.size as u64 * u64::from(o.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / f64::from(o.iters.max(1))
    );
}

/// Runs the program `kind` with the process's arguments.
pub fn main(kind: Kind) -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args.first().cloned().unwrap_or_else(|| kind.name().into());
    let Ok(o) = parse_args(kind, &args[1..]) else {
        usage(&argv0, kind);
        return ExitCode::FAILURE;
    };
    let result = if kind == Kind::Srq {
        srq::run(&o)
    } else {
        run(&o)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_is_52_bytes_and_round_trips() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ip("198.18.0.1".parse().unwrap()),
        };
        let m = d.to_msg();
        assert_eq!(m.len(), 52);
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(m[51], 0);
        let r = Dest::from_msg(&m).unwrap();
        assert_eq!((r.lid, r.qpn, r.psn, r.gid), (0, 0x11, 0xabcdef, d.gid));
    }
}
