//! Two processes, two devices (loopback addresses of this run's own, see `softrdma::testing`):
//! the test process is the client, and it runs itself again as the server (the
//! `server_process` test, which only runs when asked for, with both addresses in
//! `SOFTRDMA_TWO_PROCESS_CHILD`). The two exchange QP numbers, PSNs and the server's buffer address and rkey over the
//! child's stdin/stdout, as ibv_rc_pingpong does over TCP, then talk RoCEv2 on loopback.

use softrdma::*;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ALL: u32 = AccessFlags::LOCAL_WRITE.bits()
    | AccessFlags::REMOTE_WRITE.bits()
    | AccessFlags::REMOTE_READ.bits()
    | AccessFlags::REMOTE_ATOMIC.bits();

struct End {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: Arc<Buffer>,
    mr: Mr,
}

fn end(addr: &str) -> End {
    let ctx = Device::from_addr(addr.parse().unwrap())
        .unwrap()
        .open()
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&mut QpInitAttr::new(
            QpType::Rc,
            &cq,
            QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
        ))
        .unwrap();
    let buf = Arc::new(Buffer::new(2 << 20));
    let mr = pd.reg_buffer(&buf, ALL).unwrap();
    End {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        buf,
        mr,
    }
}

fn connect(e: &End, peer: IpAddr, peer_qpn: u32, peer_psn: u32, my_psn: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ).bits(),
        ..Default::default()
    };
    e.qp.modify_qp(
        &a,
        (QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
            .bits(),
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr::for_ip(peer);
    a.path_mtu = Mtu::Mtu4096;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    e.qp.modify_qp(
        &a,
        (QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER)
            .bits(),
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = my_psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    e.qp.modify_qp(
        &a,
        (QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC)
            .bits(),
    )
    .unwrap();
}

fn wait_one(cq: &Cq) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            return wc[0];
        }
        if Instant::now() > deadline {
            // A hang guard, not a speed check.
            panic!("no completion");
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn post_recv(e: &End, off: usize, len: usize) {
    let sge = [Sge {
        addr: e.buf.addr() + off as u64,
        length: len as u32,
        lkey: e.mr.lkey(),
    }];
    e.qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: &sge,
    }])
    .unwrap();
}

fn send(e: &End, wr: SendWr) {
    e.qp.post_send(&[wr]).unwrap();
}

/// The server half; runs only when the client test starts it.
#[test]
#[ignore = "run by rc_between_two_processes"]
fn server_process() {
    let Some(addrs) = std::env::var_os("SOFTRDMA_TWO_PROCESS_CHILD") else {
        return;
    };
    let addrs = addrs.into_string().unwrap();
    let (server, client) = addrs.split_once(',').unwrap();
    let e = end(server);
    let psn = 0x1234;
    println!(
        "SERVER {} {} {} {}",
        e.qp.qp_num(),
        psn,
        e.buf.addr(),
        e.mr.rkey()
    );
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let v: Vec<u32> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    connect(&e, client.parse().unwrap(), v[0], v[1], psn);
    post_recv(&e, 0, 4096);
    println!("READY");
    std::io::stdout().flush().unwrap();
    // The client RDMA-WRITEs 512 KiB at offset 65536, then SENDs its checksum.
    let wc = wait_one(&e.cq);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    let mut sum = [0u8; 8];
    e.buf.read(0, &mut sum).unwrap();
    let mut data = vec![0; 512 * 1024];
    e.buf.read(65536, &mut data).unwrap();
    let mine: u64 = data.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(mine, u64::from_le_bytes(sum), "the written data differs");
    // Answer with the checksum doubled.
    e.buf.write(8, &(mine * 2).to_le_bytes()).unwrap();
    let sge = [Sge {
        addr: e.buf.addr() + 8,
        length: 8,
        lkey: e.mr.lkey(),
    }];
    send(
        &e,
        SendWr {
            wr_id: 9,
            sg_list: &sge,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        },
    );
    let _ = wait_one(&e.cq); // checked for success inside
                             // Stay until the client is done reading our buffer.
    line.clear();
    std::io::stdin().read_line(&mut line).unwrap();
}

#[test]
fn rc_between_two_processes() {
    let server = softrdma::testing::unique_loopback_addr().to_string();
    let client = softrdma::testing::unique_loopback_addr().to_string();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "server_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SOFTRDMA_TWO_PROCESS_CHILD", format!("{server},{client}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A watchdog: a hang is a bug, and must not keep the test suite waiting forever.
    let pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    std::thread::spawn(move || {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(120) {
            if d2.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: kill(2) on the child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    let fields: Vec<u64> = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the server process ended early"
        );
        // libtest prints "test server_process ... " before the test's own output.
        if let Some((_, rest)) = line.split_once("SERVER ") {
            break rest
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
        }
    };
    let (sqpn, spsn, saddr, srkey) = (
        fields[0] as u32,
        fields[1] as u32,
        fields[2],
        fields[3] as u32,
    );
    let e = end(&client);
    let psn = 0xabcde;
    writeln!(stdin, "{} {}", e.qp.qp_num(), psn).unwrap();
    connect(&e, server.parse().unwrap(), sqpn, spsn, psn);
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the server process ended early"
        );
        if line.contains("READY") {
            break;
        }
    }
    let data: Vec<u8> = (0..512 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let sum: u64 = data.iter().map(|&b| u64::from(b)).sum();
    e.buf.write(65536, &data).unwrap();
    e.buf.write(0, &sum.to_le_bytes()).unwrap();
    post_recv(&e, 1024, 64);
    let w = [Sge {
        addr: e.buf.addr() + 65536,
        length: data.len() as u32,
        lkey: e.mr.lkey(),
    }];
    send(
        &e,
        SendWr {
            wr_id: 1,
            sg_list: &w,
            opcode: WrOpcode::RdmaWrite,
            remote_addr: saddr + 65536,
            rkey: srkey,
            ..Default::default()
        },
    );
    let s = [Sge {
        addr: e.buf.addr(),
        length: 8,
        lkey: e.mr.lkey(),
    }];
    send(
        &e,
        SendWr {
            wr_id: 2,
            sg_list: &s,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        },
    );
    let mut got_send = false;
    let mut got_recv = false;
    while !(got_send && got_recv) {
        let wc = wait_one(&e.cq);
        match wc.opcode {
            WcOpcode::Send => got_send = true,
            WcOpcode::Recv => got_recv = true,
            o => panic!("unexpected {o:?}"),
        }
    }
    let mut reply = [0u8; 8];
    e.buf.read(1024, &mut reply).unwrap();
    assert_eq!(u64::from_le_bytes(reply), sum * 2);
    // READ the server's copy back.
    let r = [Sge {
        addr: e.buf.addr() + 600_000,
        length: data.len() as u32,
        lkey: e.mr.lkey(),
    }];
    send(
        &e,
        SendWr {
            wr_id: 3,
            sg_list: &r,
            opcode: WrOpcode::RdmaRead,
            send_flags: SendFlags::SIGNALED,
            remote_addr: saddr + 65536,
            rkey: srkey,
            ..Default::default()
        },
    );
    assert_eq!(wait_one(&e.cq).opcode, WcOpcode::RdmaRead);
    let mut back = vec![0; data.len()];
    e.buf.read(600_000, &mut back).unwrap();
    assert_eq!(back, data);
    writeln!(stdin, "done").unwrap();
    assert!(child.wait().unwrap().success(), "the server process failed");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
}
