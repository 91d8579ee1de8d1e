//! Several processes on one device (the same IP address, the same UDP port 4791), as many
//! processes share one NIC: the test process runs itself again as echo servers (the
//! `shared_device_child` test, which only serves when `SOFTRDMA_SHARED_CHILD` names an
//! address and port), each listening with rdma_cm on the one device, and connects to them
//! from that same device. Packets reach the process that owns their QP through the device's
//! steering (see `provider::share` in the library); the CM's MADs reach the listener's or the
//! communication's process.

use softrdma::rdma_cm::*;
use softrdma::{Buffer, QpCap, SendFlags, WcStatus};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const CHILD: &str = "SOFTRDMA_SHARED_CHILD";
/// The largest message exchanged.
const MAX: usize = 256 * 1024;

fn caps() -> CmQpInitAttr {
    CmQpInitAttr {
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
        ..Default::default()
    }
}

fn passive(ip: &str, port: u16) -> Result<CmId, softrdma::Error> {
    let hints = AddrInfoHints {
        ai_flags: RAI_PASSIVE,
        ai_port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let res = getaddrinfo(Some(ip), Some(&port.to_string()), Some(&hints)).unwrap();
    let id = CmId::create_ep(&res[0], None, Some(&mut caps()))?;
    id.listen(4)?;
    Ok(id)
}

/// Echo server: every message received goes back as it came; a 1-byte message ends it.
fn serve(ip: &str, port: u16) {
    let listen = passive(ip, port).expect("listen");
    println!("listening");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    let id = listen.get_request().expect("rdma_get_request");
    let recv = Arc::new(Buffer::new(MAX));
    let send = Arc::new(Buffer::new(MAX));
    let rmr = id.reg_msgs(&recv).unwrap();
    let smr = id.reg_msgs(&send).unwrap();
    id.post_recv(0, recv.addr(), MAX, &rmr).unwrap();
    id.accept(&ConnParam::default()).expect("rdma_accept");
    let mut msg = vec![0u8; MAX];
    loop {
        let wc = id.get_recv_comp().unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        let n = wc.byte_len as usize;
        if n == 1 {
            break;
        }
        recv.read(0, &mut msg[..n]).unwrap();
        send.write(0, &msg[..n]).unwrap();
        id.post_recv(0, recv.addr(), MAX, &rmr).unwrap();
        id.post_send(0, send.addr(), n, Some(&smr), SendFlags::empty())
            .unwrap();
        assert_eq!(id.get_send_comp().unwrap().status, WcStatus::Success);
    }
    let _ = id.disconnect();
    let ctx = softrdma::rdma_cm::device_context(ip.parse().unwrap()).unwrap();
    println!("misrouted {}", ctx.counters().misrouted);
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
}

/// Echo client: `rounds` messages of every size, then the counters of its device.
fn client(ip: &str, port: u16, rounds: u8) {
    let c = Client::connect(ip, port);
    for round in 0..rounds {
        for len in [8usize, 4096, 70000] {
            c.echo(&pattern(len, round));
        }
    }
    c.finish();
    let ctx = softrdma::rdma_cm::device_context(ip.parse().unwrap()).unwrap();
    println!("misrouted {}", ctx.counters().misrouted);
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
}

#[test]
fn shared_device_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut it = spec.split(' ');
    let (role, ip, port) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    match role {
        "server" => serve(ip, port.parse().unwrap()),
        _ => client(ip, port.parse().unwrap(), 20),
    }
}

/// A child process serving on `ip:port`, running once it listens.
struct Server {
    child: Child,
    /// The rest of its output, once it ends.
    out: Option<std::thread::JoinHandle<String>>,
}

impl Server {
    fn start(ip: &str, port: u16) -> Server {
        Self::start_with(ip, port, &[])
    }

    fn start_with(ip: &str, port: u16, env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shared_device_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, format!("server {ip} {port}"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the server on {ip}:{port} ended before it listened"
            );
            if line.trim_end().ends_with("listening") {
                break;
            }
        }
        // Keep draining its output so that it never blocks on a full pipe.
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        Server {
            child,
            out: Some(out),
        }
    }

    /// Waits for the server to end; its output after "listening".
    fn output(mut self) -> String {
        let _ = self.child.wait();
        self.out.take().unwrap().join().unwrap()
    }
}

/// The count after "misrouted " in a child's output.
fn misrouted(text: &str) -> u64 {
    text.split("misrouted ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {text}"))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client connection from the device at `ip` to the server at `ip:port`.
struct Client {
    id: CmId,
    send: Arc<Buffer>,
    recv: Arc<Buffer>,
    smr: softrdma::Mr,
    rmr: softrdma::Mr,
}

impl Client {
    fn connect(ip: &str, port: u16) -> Client {
        // From the same device (the same address) as the server's, not from the one the
        // route would pick (127.0.0.1).
        let hints = AddrInfoHints {
            ai_port_space: Some(PortSpace::Tcp),
            ai_src_addr: Some(std::net::SocketAddr::new(ip.parse().unwrap(), 0)),
            ..Default::default()
        };
        let res = getaddrinfo(Some(ip), Some(&port.to_string()), Some(&hints)).unwrap();
        let id = CmId::create_ep(&res[0], None, Some(&mut caps())).unwrap();
        let send = Arc::new(Buffer::new(MAX));
        let recv = Arc::new(Buffer::new(MAX));
        let smr = id.reg_msgs(&send).unwrap();
        let rmr = id.reg_msgs(&recv).unwrap();
        id.connect(&ConnParam {
            retry_count: 3,
            ..Default::default()
        })
        .expect("rdma_connect to a process on the same device");
        Client {
            id,
            send,
            recv,
            smr,
            rmr,
        }
    }

    /// Sends `msg` and checks that it comes back byte for byte.
    fn echo(&self, msg: &[u8]) {
        self.id
            .post_recv(0, self.recv.addr(), MAX, &self.rmr)
            .unwrap();
        self.send.write(0, msg).unwrap();
        self.id
            .post_send(
                0,
                self.send.addr(),
                msg.len(),
                Some(&self.smr),
                SendFlags::empty(),
            )
            .unwrap();
        assert_eq!(self.id.get_send_comp().unwrap().status, WcStatus::Success);
        let wc = self.id.get_recv_comp().unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len as usize, msg.len());
        let mut back = vec![0u8; msg.len()];
        self.recv.read(0, &mut back).unwrap();
        assert!(back == msg, "the echo differs");
    }

    fn finish(self) {
        self.send.write(0, b"q").unwrap();
        self.id
            .post_send(0, self.send.addr(), 1, Some(&self.smr), SendFlags::empty())
            .unwrap();
        let _ = self.id.get_send_comp();
        let _ = self.id.disconnect();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn two_processes_on_one_device_connect_and_transfer() {
    let ip = softrdma::testing::unique_loopback_addr().to_string();
    let port = softrdma::testing::unused_tcp_port();
    let server = Server::start(&ip, port);
    // A second listener on the same service of the device, in another process: busy, as
    // the kernel's rdma_cm says for a port bound by another process.
    let Err(e) = passive(&ip, port) else {
        panic!("a second listener must fail");
    };
    assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
    let c = Client::connect(&ip, port);
    for (k, len) in [1usize << 4, 4096, 4097, MAX].into_iter().enumerate() {
        c.echo(&pattern(len, k as u8));
    }
    c.finish();
    // The two processes are on one host: after the first packets, a same-host lane (shared
    // memory) carried them.
    let ctx = softrdma::rdma_cm::device_context(ip.parse().unwrap()).unwrap();
    if softrdma::same_host_lanes() {
        assert!(ctx.counters().same_host_packets > 0, "{:?}", ctx.counters());
    }
    drop(server);
}

/// A process whose lanes are off (`SOFTRDMA_TRANSPORT=wire`) refuses the lane this one
/// offers: everything goes on the wire, and every byte arrives.
#[test]
fn a_process_without_lanes_refuses_them_and_both_use_the_wire() {
    let ip = softrdma::testing::unique_loopback_addr().to_string();
    let port = softrdma::testing::unused_tcp_port();
    let server = Server::start_with(&ip, port, &[("SOFTRDMA_TRANSPORT", "wire")]);
    let c = Client::connect(&ip, port);
    for round in 0..10u8 {
        for len in [8usize, 4096, 70000] {
            c.echo(&pattern(len, round));
        }
    }
    c.finish();
    let ctx = softrdma::rdma_cm::device_context(ip.parse().unwrap()).unwrap();
    assert_eq!(ctx.counters().same_host_packets, 0, "{:?}", ctx.counters());
    drop(server);
}

#[test]
fn a_process_killed_mid_run_leaves_the_device_to_the_others() {
    let ip = softrdma::testing::unique_loopback_addr().to_string();
    let ports: Vec<u16> = (0..4)
        .map(|_| softrdma::testing::unused_tcp_port())
        .collect();
    let mut servers: Vec<Option<Server>> = ports[..3]
        .iter()
        .map(|&p| Some(Server::start(&ip, p)))
        .collect();
    let clients: Vec<Client> = ports[..3]
        .iter()
        .map(|&p| Client::connect(&ip, p))
        .collect();
    for round in 0..4u8 {
        for c in &clients {
            c.echo(&pattern(8192 + usize::from(round), round));
        }
    }
    // Kill the first server: the kernel moves another member of the device's group into its
    // place, which the survivors' steering must learn (or forward around) without a loss.
    servers[0] = None;
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..20u8 {
        for c in &clients[1..] {
            c.echo(&pattern(20000 + usize::from(round), round));
        }
    }
    // A newcomer joins the device after the death and works too.
    let late = Server::start(&ip, ports[3]);
    let c4 = Client::connect(&ip, ports[3]);
    for round in 0..4u8 {
        c4.echo(&pattern(MAX - usize::from(round), round));
        for c in &clients[1..] {
            c.echo(&pattern(100 + usize::from(round), round));
        }
    }
    let mut clients = clients.into_iter();
    let dead = clients.next().unwrap();
    for c in clients {
        c.finish();
    }
    c4.finish();
    // The connection to the dead process ends in an error, not a hang: its QP's packets
    // go unanswered (the device is alive, the QP is not), so the transport gives up.
    dead.send.write(0, b"xx").unwrap();
    dead.id
        .post_send(0, dead.send.addr(), 2, Some(&dead.smr), SendFlags::empty())
        .unwrap();
    let wc = dead.id.get_send_comp();
    assert!(
        wc.as_ref().map_or(true, |w| w.status != WcStatus::Success),
        "a send to a dead process succeeded: {wc:?}"
    );
    drop(late);
    drop(servers);
}

/// Correctness never depends on the steering: with none (`SOFTRDMA_STEERING=hash`, the
/// kernel's hash sends every datagram between the two processes to one of them), the packets
/// of the other are forwarded to it, and every byte still arrives.
#[test]
fn without_steering_misrouted_packets_are_forwarded() {
    let ip = softrdma::testing::unique_loopback_addr().to_string();
    let port = softrdma::testing::unused_tcp_port();
    let hash = [("SOFTRDMA_STEERING", "hash")];
    let server = Server::start_with(&ip, port, &hash);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shared_device_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("client {ip} {port}"))
        .envs(hash)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the client failed: {text}");
    let by_client = misrouted(&text);
    let by_server = misrouted(&server.output());
    eprintln!("forwarded: {by_client} by the client, {by_server} by the server");
    assert!(by_client + by_server > 0, "nothing was forwarded");
}
