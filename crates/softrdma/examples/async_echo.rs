//! async_echo: an echo server and its client on softrdma's async face (feature `tokio`).
//!
//! ```text
//! async_echo server ADDR PORT [CLIENTS]
//! async_echo client ADDR PORT [-b BIND_ADDR] [-n COUNT] [-S SIZE]
//! ```
//!
//! The server listens on ADDR:PORT, prints "async_echo: listening on ADDR:PORT", serves
//! CLIENTS connections (default 1) at once, each in a task of its own that receives a message
//! and sends it back until the peer disconnects, then exits. The client connects (from
//! BIND_ADDR when given), sends COUNT messages (default 10) of SIZE bytes (default 64, at
//! most 4096), checks that each comes back unchanged, disconnects, and prints
//! "async_echo: N messages of S bytes echoed".
//!
//! Both sides connect with `softrdma::tokio::conn_param()`: `rnr_retry_count` 7, so a
//! message that reaches the server before its next receive is posted waits (RNR NAK and
//! retry) instead of failing the connection. Errors end the program with "async_echo:
//! error: …" and exit status 1.

use softrdma::tokio::{AsyncConn, AsyncListener};
use softrdma::Buffer;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;

const MAX: usize = 4096;

fn usage() -> ExitCode {
    eprintln!("usage: async_echo server ADDR PORT [CLIENTS]");
    eprintln!("       async_echo client ADDR PORT [-b BIND_ADDR] [-n COUNT] [-S SIZE]");
    ExitCode::from(2)
}

/// Echoes what one connection sends until the peer disconnects.
async fn echo(conn: AsyncConn) -> Result<u64, String> {
    let buf = Arc::new(Buffer::new(MAX));
    let mr = conn
        .id()
        .reg_msgs(&buf)
        .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
    let mut n = 0;
    loop {
        let wc = match conn.qp().recv(&mr, 0..MAX).await {
            Ok(wc) => wc,
            // The peer disconnected: our QP was flushed.
            Err(e) if e.errno() == libc::ECONNRESET => break,
            Err(e) => return Err(format!("receive: {e}")),
        };
        // (The async face turns a failed completion into an error: this one succeeded.)
        let _sent = conn
            .qp()
            .send(&mr, 0..wc.byte_len as usize)
            .await
            .map_err(|e| format!("send: {e}"))?;
        n += 1;
    }
    conn.disconnect()
        .await
        .map_err(|e| format!("rdma_disconnect: {e}"))?;
    conn.destroy();
    Ok(n)
}

async fn server(addr: SocketAddr, clients: usize) -> Result<(), String> {
    let listener = AsyncListener::bind(addr, 16).map_err(|e| format!("rdma_listen: {e}"))?;
    println!(
        "async_echo: listening on {}",
        listener.local_addr().expect("bound")
    );
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let conn = listener
            .accept()
            .await
            .map_err(|e| format!("rdma_accept: {e}"))?;
        println!(
            "async_echo: connection from {}",
            conn.id().peer_addr().expect("connected")
        );
        tasks.push(tokio::spawn(echo(conn)));
    }
    for t in tasks {
        let n = t.await.map_err(|e| format!("task: {e}"))??;
        println!("async_echo: echoed {n} messages");
    }
    Ok(())
}

async fn client(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    count: usize,
    size: usize,
) -> Result<(), String> {
    let conn = AsyncConn::connect_with(
        bind.map(|ip| SocketAddr::new(ip, 0)),
        addr,
        softrdma::tokio::default_cap(),
        softrdma::tokio::conn_param(),
    )
    .await
    .map_err(|e| format!("rdma_connect: {e}"))?;
    let out = Arc::new(Buffer::new(size));
    let back = Arc::new(Buffer::new(size));
    let out_mr = conn
        .id()
        .reg_msgs(&out)
        .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
    let back_mr = conn
        .id()
        .reg_msgs(&back)
        .map_err(|e| format!("rdma_reg_msgs: {e}"))?;
    for i in 0..count {
        let msg: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
        out.write(0, &msg).map_err(|e| e.to_string())?;
        // The receive for the echo is posted before the send, and both are awaited together.
        let (r, s) = tokio::join!(
            conn.qp().recv(&back_mr, 0..size),
            conn.qp().send(&out_mr, 0..size)
        );
        let _sent = s.map_err(|e| format!("send {i}: {e}"))?;
        let wc = r.map_err(|e| format!("receive {i}: {e}"))?;
        if wc.byte_len as usize != size || back.to_vec() != msg {
            return Err(format!("message {i} came back changed"));
        }
    }
    conn.disconnect()
        .await
        .map_err(|e| format!("rdma_disconnect: {e}"))?;
    conn.destroy();
    println!("async_echo: {count} messages of {size} bytes echoed");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return usage();
    }
    let Ok(ip) = args[1].parse::<IpAddr>() else {
        return usage();
    };
    let Ok(port) = args[2].parse::<u16>() else {
        return usage();
    };
    let addr = SocketAddr::new(ip, port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let r = match args[0].as_str() {
        "server" => {
            let clients = match args.get(3).map(|s| s.parse::<usize>()) {
                None => 1,
                Some(Ok(n)) => n,
                Some(Err(_)) => return usage(),
            };
            rt.block_on(server(addr, clients))
        }
        "client" => {
            let (mut bind, mut count, mut size) = (None, 10, 64);
            let mut it = args[3..].iter();
            while let Some(flag) = it.next() {
                let Some(v) = it.next() else {
                    return usage();
                };
                match (flag.as_str(), v) {
                    ("-b", v) => match v.parse() {
                        Ok(ip) => bind = Some(ip),
                        Err(_) => return usage(),
                    },
                    ("-n", v) => match v.parse() {
                        Ok(n) => count = n,
                        Err(_) => return usage(),
                    },
                    ("-S", v) => match v.parse() {
                        Ok(s) if (1..=MAX).contains(&s) => size = s,
                        _ => return usage(),
                    },
                    _ => return usage(),
                }
            }
            rt.block_on(client(addr, bind, count, size))
        }
        _ => return usage(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_echo: error: {e}");
            ExitCode::from(1)
        }
    }
}
