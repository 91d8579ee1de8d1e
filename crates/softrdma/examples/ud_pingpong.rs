//! ud_pingpong: the UD ping-pong of libibverbs' examples (`ibv_ud_pingpong`), over softrdma.
//!
//! The same out-of-band exchange as rc_pingpong (TCP port 18515 unless `-p`, the 52-byte
//! `LLLL:QQQQQQ:PPPPPP:GGGG…` message, `done`) and the same output, so that either side can be
//! a Linux `ibv_ud_pingpong`; the differences are those of the C program:
//!
//! * a UD QP with Q_Key 0x11111111: INIT with P_Key index, port and Q_Key, then RTR and RTS
//!   (send PSN) with nothing else; then an address handle for the peer (GRH with hop limit
//!   64 when the peer's GID is not zero), made by the server before it answers and by the
//!   client after the exchange;
//! * the buffer holds 40 bytes of room for the GRH in front of the message: receives take
//!   `-s` + 40 bytes, sends carry the `-s` bytes after it;
//! * `-s` defaults to 1024 and may not exceed the port's active MTU (`Requested size larger
//!   than port MTU (N)`); there is no `-m`, `-o` or `-t`;
//! * the local address line has a colon after the PSN.
//!
//! `-c` validates (see rc_pingpong, here after the GRH's room); `--stats` and
//! `--late-recv=MS` are softrdma's own. softrdma devices have one GID, at index 0: pass
//! `-g 0`.
//!
//! ```text
//! ud_pingpong [-p port] [-d dev] [-i ib_port] [-s size] [-r rx_depth] [-n iters] [-l sl]
//!             [-e] [-g gid_idx] [-c] [host]
//! ```

#[path = "pingpong/mod.rs"]
mod pingpong;

fn main() -> std::process::ExitCode {
    pingpong::main(pingpong::Kind::Ud)
}
