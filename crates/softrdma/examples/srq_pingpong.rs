//! srq_pingpong: the SRQ ping-pong of libibverbs' examples (`ibv_srq_pingpong`), over
//! softrdma.
//!
//! rc_pingpong with `-q` RC QPs (default 16) whose receives all come from one shared receive
//! queue of `-r` requests, so that either side can be a Linux `ibv_srq_pingpong`:
//!
//! * the TCP exchange (port 18515 unless `-p`) carries 256 of rc_pingpong's 52-byte
//!   `LLLL:QQQQQQ:PPPPPP:GGGG…` messages each way, one per QP and the rest all zero (both
//!   sides must use the same `-q`); the server connects all its QPs before it answers;
//! * every QP moves to RTR and RTS as rc_pingpong's does, its GRH toward the first address's
//!   GID;
//! * the client first sends once on every QP; a QP sends again once its send and a receive
//!   matched to it by QP number have completed; the counts of sends and receives are shared
//!   by all QPs and end the run at `-n` each (so `-n` is a total, whatever the help says, as
//!   in the C program); the SRQ is refilled when no more than `-q` receives remain;
//! * the summary counts `-s` × `-n` × 2 bytes.
//!
//! `-q` must not exceed `-r` (`rx_depth N is too small for M QPs -- must have at least one
//! receive per QP.`) and must be below 256. `-c` validates as in rc_pingpong; `-o` is refused
//! (no on-demand paging). softrdma devices have one GID, at index 0: pass `-g 0`.
//!
//! ```text
//! srq_pingpong [-p port] [-d dev] [-i ib_port] [-s size] [-m mtu] [-q num_qp] [-r rx_depth]
//!              [-n iters] [-l sl] [-e] [-g gid_idx] [-c] [host]
//! ```

#[path = "pingpong/mod.rs"]
mod pingpong;

fn main() -> std::process::ExitCode {
    pingpong::main(pingpong::Kind::Srq)
}
