//! rc_pingpong: the RC ping-pong of libibverbs' examples (`ibv_rc_pingpong`), over softrdma.
//!
//! Same flags, same out-of-band exchange and same output as the rdma-core program, so that
//! either side can be a Linux `ibv_rc_pingpong` (over rxe or a RoCE NIC):
//!
//! * no host argument: the server; a host name or address: the client. The two exchange
//!   their addresses over TCP (port 18515 unless `-p`): each sends one 52-byte message,
//!   `LLLL:QQQQQQ:PPPPPP:GGGG…` — LID (4 hex digits), QP number and start PSN (6 each), GID
//!   (its 16 bytes as 32 hex digits, in wire order) — NUL-terminated. The client sends first;
//!   the server moves its QP to RTR and RTS before it answers; the client then sends `done`
//!   (with its NUL) and moves its QP;
//! * both sides post `-r` receives of `-s` bytes, then SEND `-s` bytes back and forth `-n`
//!   times (the client sends first); a side sends again once both its previous send and
//!   the matching receive have completed;
//! * at the end each side prints `N bytes in X seconds = Y Mbit/sec` and
//!   `N iters in X seconds = Y usec/iter` (N bytes = size × iterations × 2).
//!
//! The QP moves to RTR with path MTU `-m`, max_dest_rd_atomic 1 and min_rnr_timer 12, and to
//! RTS with timeout 14, retry count 7, RNR retry 7 and max_rd_atomic 1; the address vector
//! carries a GRH (hop limit 1, source GID index `-g`) when the peer's GID is not zero. As on
//! any RoCE device, `-g` is needed: without it the GID sent is zero and the QP cannot be
//! connected. softrdma devices have one GID, at index 0 (`-g 0`).
//!
//! The device: `-d` takes a softrdma device name (`srdma0`, `srdma_<address>`) or simply a
//! local IP address. Without `-d` the client takes the device of the source address the
//! kernel would use toward the server, and the server the first device that is not on
//! loopback (rdma-core takes the first device; softrdma's first is usually 127.0.0.1, which
//! no other machine can reach), or the first one if all are.
//!
//! `--stats` (softrdma's own) prints the QP's transport counters (retransmissions, NAKs) and
//! the device's packet counters after the summary.
//!
//! `-c` validates: the client marks the first byte of every 4 KiB page of its message before
//! its first send, and the server reports `invalid data in page N` where what it last received
//! lacks the mark.
//!
//! `-o` (on-demand paging) and `-t` (completion timestamps) are refused: softrdma devices
//! offer neither, as a device without the capability makes the rdma-core program refuse.
//!
//! ```text
//! rc_pingpong [-p port] [-d dev] [-i ib_port] [-s size] [-m mtu] [-r rx_depth] [-n iters]
//!             [-l sl] [-e] [-g gid_idx] [-c] [host]
//! ```

#[path = "pingpong/mod.rs"]
mod pingpong;

fn main() -> std::process::ExitCode {
    pingpong::main(pingpong::Kind::Rc)
}
