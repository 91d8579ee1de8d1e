//! rdma_client: the synchronous-verbs client of librdmacm's examples, on softrdma.
//!
//! `rdma_client [-s SERVER] [-p PORT] [-b BIND_ADDR]` connects to rdma_server (default
//! 127.0.0.1 port 7471), sends a 16-byte message, waits for the answer and disconnects:
//! rdma_getaddrinfo, rdma_create_ep (address, route and QP), rdma_reg_msgs, rdma_post_recv,
//! rdma_connect, rdma_post_send, rdma_get_send_comp, rdma_get_recv_comp, rdma_disconnect,
//! rdma_destroy_ep. (`-b` is softrdma's addition: the source address, so that client and
//! server can be two loopback "devices".) A failure ends with "rdma_client: end -1" and exit
//! status 255 (main returns -1), as rdma-core's.

use softrdma::rdma_cm::*;
use softrdma::{Buffer, QpCap, SendFlags, WcStatus};
use std::process::ExitCode;
use std::sync::Arc;

/// rdma-core's usage text on stdout (and softrdma's `-b`); exit status 1.
fn usage() -> ExitCode {
    println!("usage: rdma_client");
    println!("\t[-s server_address]");
    println!("\t[-p port_number]");
    println!("\t[-b bind_address] (softrdma's addition)");
    ExitCode::from(1)
}

fn run(server: &str, port: &str, bind: Option<&str>) -> Result<(), String> {
    let mut hints = AddrInfoHints {
        ai_port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    if let Some(b) = bind {
        let ip: std::net::IpAddr = b.parse().map_err(|_| format!("bad bind address {b}"))?;
        hints.ai_src_addr = Some(std::net::SocketAddr::new(ip, 0));
    }
    let res = getaddrinfo(Some(server), Some(port), Some(&hints))
        .map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
    let mut attr = CmQpInitAttr {
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        },
        sq_sig_all: true,
        ..Default::default()
    };
    let id = CmId::create_ep(&res[0], None, Some(&mut attr))
        .map_err(|e| format!("rdma_create_ep: {e}"))?;
    let send = Arc::new(Buffer::from_slice(b"softrdma client!"));
    let recv = Arc::new(Buffer::new(16));
    let result = (|| {
        let smr = id
            .reg_msgs(&send)
            .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
        let rmr = id
            .reg_msgs(&recv)
            .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
        id.post_recv(0, recv.addr(), 16, &rmr)
            .map_err(|e| format!("rdma_post_recv: {e}"))?;
        // rnr_retry_count 7: a SEND that beats the server's receive is retried, not failed
        // (ConnParam::default() has 0, which fails it with RNR_RETRY_EXC_ERR).
        id.connect(&ConnParam {
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        })
        .map_err(|e| format!("rdma_connect: {e}"))?;
        id.post_send(0, send.addr(), 16, Some(&smr), SendFlags::INLINE)
            .map_err(|e| format!("rdma_post_send: {e}"))?;
        // As rdma-core's rdma_client: the counts matter, not the statuses (reported on
        // stderr) nor the answer's content (rdma-core's rdma_server answers with 16 bytes
        // it never fills).
        let wc = id
            .get_send_comp()
            .map_err(|e| format!("rdma_get_send_comp: {e}"))?;
        note_status("send", wc.status);
        let wc = id
            .get_recv_comp()
            .map_err(|e| format!("rdma_get_recv_comp: {e}"))?;
        note_status("receive", wc.status);
        id.disconnect().map_err(|e| format!("rdma_disconnect: {e}"))
    })();
    id.destroy_ep();
    result
}

/// Says on stderr that a completion failed; the run goes on, as rdma-core's does.
fn note_status(what: &str, status: WcStatus) {
    if status != WcStatus::Success {
        eprintln!("rdma_client: the {what} completed with {}", status.as_str());
    }
}

fn main() -> ExitCode {
    let mut server = "127.0.0.1".to_string();
    let mut port = "7471".to_string();
    let mut bind = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next();
        match (a.as_str(), v) {
            ("-s", Some(v)) => server = v,
            ("-p", Some(v)) => port = v,
            ("-b", Some(v)) => bind = Some(v),
            _ => return usage(),
        }
    }
    println!("rdma_client: start");
    match run(&server, &port, bind.as_deref()) {
        Ok(()) => {
            println!("rdma_client: end 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma_client: {e}");
            println!("rdma_client: end -1");
            // rdma-core's main returns -1: status 255.
            ExitCode::from(255)
        }
    }
}
