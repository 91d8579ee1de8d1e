//! rdma_server: the synchronous-verbs server of librdmacm's examples, on softrdma.
//!
//! `rdma_server [-s ADDR] [-p PORT]` waits for one rdma_client (default port 7471, every
//! address), receives its 16-byte message, answers with a 16-byte message of its own (zeros,
//! as rdma-core's never fills it), and disconnects: rdma_getaddrinfo
//! (RAI_PASSIVE), rdma_create_ep with QP attributes, rdma_listen, rdma_get_request,
//! rdma_reg_msgs, rdma_post_recv, rdma_accept, rdma_get_recv_comp, rdma_post_send,
//! rdma_get_send_comp, rdma_disconnect, rdma_destroy_ep. (`-a` is softrdma's older name
//! for `-s`.) A failure ends with "rdma_server: end -1" and exit status 255 (main returns -1).

use softrdma::rdma_cm::*;
use softrdma::{Buffer, QpCap, SendFlags, WcStatus};
use std::process::ExitCode;
use std::sync::Arc;

/// rdma-core's usage text on stdout (and softrdma's `-a`); exit status 1.
fn usage() -> ExitCode {
    println!("usage: rdma_server");
    println!("\t[-s server_address]");
    println!("\t[-p port_number]");
    println!("\t[-a bind_address] (softrdma: the same as -s)");
    ExitCode::from(1)
}

fn run(addr: Option<&str>, port: &str) -> Result<(), String> {
    let hints = AddrInfoHints {
        ai_flags: RAI_PASSIVE,
        ai_port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let res = getaddrinfo(addr, Some(port), Some(&hints))
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
    let listen_id = CmId::create_ep(&res[0], None, Some(&mut attr))
        .map_err(|e| format!("rdma_create_ep: {e}"))?;
    listen_id
        .listen(0)
        .map_err(|e| format!("rdma_listen: {e}"))?;
    println!(
        "rdma_server: listening on {}",
        listen_id.local_addr().unwrap()
    );
    let id = listen_id
        .get_request()
        .map_err(|e| format!("rdma_get_request: {e}"))?;
    // As rdma-core's rdma_server: a receive buffer and a send buffer of 16 bytes each; the
    // answer is the send buffer as it is (zeros), not an echo. A completion's status is
    // reported but, as there, does not fail the run.
    let recv = Arc::new(Buffer::new(16));
    let send = Arc::new(Buffer::new(16));
    let mr = id
        .reg_msgs(&recv)
        .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
    let send_mr = id
        .reg_msgs(&send)
        .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
    let result = (|| {
        id.post_recv(0, recv.addr(), 16, &mr)
            .map_err(|e| format!("rdma_post_recv: {e}"))?;
        // rnr_retry_count 7 (ConnParam::default() has 0): our answer is retried, not
        // failed, if it beats the client's receive.
        id.accept(&ConnParam {
            rnr_retry_count: 7,
            ..Default::default()
        })
        .map_err(|e| format!("rdma_accept: {e}"))?;
        let wc = id
            .get_recv_comp()
            .map_err(|e| format!("rdma_get_recv_comp: {e}"))?;
        note_status("receive", wc.status);
        id.post_send(0, send.addr(), 16, Some(&send_mr), SendFlags::empty())
            .map_err(|e| format!("rdma_post_send: {e}"))?;
        let wc = id
            .get_send_comp()
            .map_err(|e| format!("rdma_get_send_comp: {e}"))?;
        note_status("send", wc.status);
        let mut msg = [0u8; 16];
        recv.read(0, &mut msg).map_err(|e| e.to_string())?;
        println!("rdma_server: received {:?}", String::from_utf8_lossy(&msg));
        id.disconnect().map_err(|e| format!("rdma_disconnect: {e}"))
    })();
    drop(send_mr);
    drop(mr);
    id.destroy_ep();
    listen_id.destroy_ep();
    result
}

/// Says on stderr that a completion failed; the run goes on, as rdma-core's does (its
/// rdma_get_*_comp loops look at the count, not at the status).
fn note_status(what: &str, status: WcStatus) {
    if status != WcStatus::Success {
        eprintln!("rdma_server: the {what} completed with {}", status.as_str());
    }
}

fn main() -> ExitCode {
    let mut port = "7471".to_string();
    let mut addr = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-p" => match args.next() {
                Some(v) => port = v,
                None => return usage(),
            },
            // rdma-core's -s (the address to listen on), and softrdma's older -a.
            "-s" | "-a" => match args.next() {
                Some(v) => addr = Some(v),
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    println!("rdma_server: start");
    match run(addr.as_deref(), &port) {
        Ok(()) => {
            println!("rdma_server: end 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma_server: {e}");
            println!("rdma_server: end -1");
            // rdma-core's main returns -1: status 255.
            ExitCode::from(255)
        }
    }
}
