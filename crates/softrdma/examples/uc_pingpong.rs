//! uc_pingpong: the UC ping-pong of libibverbs' examples (`ibv_uc_pingpong`), over softrdma.
//!
//! rc_pingpong over an unreliable connection: the same flags (less `-o` and `-t`), the same
//! out-of-band exchange over TCP (port 18515 unless `-p`, the 52-byte
//! `LLLL:QQQQQQ:PPPPPP:GGGG…` message, `done`) and the same output, so that either side can be
//! a Linux `ibv_uc_pingpong`. The QP is a UC QP: it moves to RTR with the address vector, path
//! MTU `-m`, remote QP number and PSN only, and to RTS with its send PSN only (no timeout,
//! retries or RDMA-read depth: UC acknowledges nothing and never resends, so a lost message
//! stalls the ping-pong, as it does with the C program).
//!
//! `-c` validates (see rc_pingpong); `--stats` and `--late-recv=MS` are softrdma's own, as
//! in rc_pingpong. softrdma devices have one GID, at index 0: pass `-g 0`.
//!
//! ```text
//! uc_pingpong [-p port] [-d dev] [-i ib_port] [-s size] [-m mtu] [-r rx_depth] [-n iters]
//!             [-l sl] [-e] [-g gid_idx] [-c] [host]
//! ```

#[path = "pingpong/mod.rs"]
mod pingpong;

fn main() -> std::process::ExitCode {
    pingpong::main(pingpong::Kind::Uc)
}
