//! Memory windows from C (`tests/c/mem_windows.c`) over the drop-in libibverbs.so.1:
//! `ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`, `ibv_wr_bind_mw`,
//! `ibv_wr_send_inv`, a peer's RDMA WRITE through each window and the remote access error
//! once it is invalidated or unbound.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn mem_windows_c() {
    if !have_headers() {
        return;
    }
    let exe = compile_c("mem_windows", &["mem_windows.c"]);
    let addr = unique_addr();
    let mut c = command(&exe);
    c.env("SOFTRDMA_DEVICES", addr.to_string())
        .arg(format!("srdma_{addr}"));
    let (st, out, err) = run_bounded(c, Duration::from_secs(60));
    assert!(
        st.is_some_and(|s| s.success()) && out.contains("mem_windows: ok"),
        "mem_windows ({st:?}):\n{out}\n{err}"
    );
}
