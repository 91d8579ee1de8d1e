//! C programs that use one device of their own in one process, over the drop-in
//! libibverbs.so.1:
//! - `tests/c/mem_windows.c`: `ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`,
//!   `IBV_WR_LOCAL_INV`, `ibv_wr_bind_mw`, `ibv_wr_send_inv`, a peer's RDMA WRITE through each
//!   window and the remote access error once it is invalidated or unbound;
//! - `tests/c/cq_events.c`: `ibv_destroy_cq` waits until the completion events taken about
//!   the CQ are acknowledged (as rdma-core's), and says EBUSY at once while a QP uses it.

mod common;

use common::*;
use std::time::Duration;

/// Compiles `tests/c/NAME.c`, runs it on a device of its own and checks it printed
/// "NAME: ok".
fn run_one_device(name: &str) {
    if !have_headers() {
        return;
    }
    let exe = compile_c(name, &[&format!("{name}.c")]);
    let addr = unique_addr();
    let mut c = command(&exe);
    c.env("SOFTRDMA_DEVICES", addr.to_string())
        .arg(format!("srdma_{addr}"));
    let (st, out, err) = run_bounded(c, Duration::from_secs(60));
    assert!(
        st.is_some_and(|s| s.success()) && out.contains(&format!("{name}: ok")),
        "{name} ({st:?}):\n{out}\n{err}"
    );
}

#[test]
fn mem_windows_c() {
    run_one_device("mem_windows");
}

#[test]
fn destroy_cq_waits_for_the_events_to_be_acknowledged_c() {
    run_one_device("cq_events");
}
