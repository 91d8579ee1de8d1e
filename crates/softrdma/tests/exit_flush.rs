//! A program that posts a send and exits at once (returns from `main`, calls `exit`) sends
//! it, as a program whose NIC's doorbell was rung does: a UD send that softrdma held back for
//! a batch (see `Provider::note_held_send`) goes from an `atexit` hook. The test process
//! receives; it runs itself again as the sender (the `ud_sender_that_exits_at_once` test,
//! which only runs when asked for, with the addresses and the QP number in
//! `SOFTRDMA_EXIT_CHILD`), over the wire (`SOFTRDMA_TRANSPORT=wire`: a send to a same-host
//! lane is never held).

#[path = "common/pair.rs"]
pub(crate) mod pair;

use pair::*;
use softrdma::*;
use std::process::Command;
use std::time::Duration;

/// The sender: one UD send that leaves and completes, a pause, then a second send posted
/// just before `exit`. The pause lets the progress thread (woken by the first send's note)
/// go back to sleep for the hand-off period, which the parent sets to ten minutes: the
/// second send is then held until something sends it, and only the exit hook can.
#[test]
#[ignore = "run by a_ud_send_posted_just_before_the_program_exits_arrives"]
fn ud_sender_that_exits_at_once() {
    let Ok(spec) = std::env::var("SOFTRDMA_EXIT_CHILD") else {
        return;
    };
    let f: Vec<&str> = spec.split(',').collect();
    let (server, server_qpn, client) = (ip(f[0]), f[1].parse::<u32>().unwrap(), f[2]);
    let (me, _) = Side::new(client, QpType::Ud, 4096, false);
    qp_to_rtr(&me.qp, server, 0, &Opts::default());
    qp_to_rts(&me.qp, &Opts::default());
    let ah = me.pd.create_ah(&AhAttr::for_ip(server)).unwrap();
    let post = |wr_id: u64, value: u64| {
        me.buf
            .write(wr_id as usize * 64, &value.to_le_bytes())
            .unwrap();
        send(
            &me,
            wr_id,
            WrOpcode::Send,
            &[me.sge(wr_id as usize * 64, 8)],
            |w| {
                w.ah = Some(&ah);
                w.remote_qpn = server_qpn;
                w.remote_qkey = 0x1111;
            },
        );
    };
    post(1, 41);
    assert_eq!(me.wait(1)[0].status, WcStatus::Success);
    std::thread::sleep(Duration::from_millis(50));
    post(2, 42);
    // No poll, no destroy: QPs, CQ and device are still open when the process ends.
    std::process::exit(0);
}

#[test]
fn a_ud_send_posted_just_before_the_program_exits_arrives() {
    let server = unique();
    let client = unique();
    let (me, _) = Side::new(&server, QpType::Ud, 4096, false);
    qp_to_rtr(&me.qp, ip(&client), 0, &Opts::default());
    qp_to_rts(&me.qp, &Opts::default());
    me.post_recv(1, 0, 128);
    me.post_recv(2, 128, 128);
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ud_sender_that_exits_at_once",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "SOFTRDMA_EXIT_CHILD",
            format!("{server},{},{client}", me.qp.qp_num()),
        )
        .env("SOFTRDMA_TRANSPORT", "wire")
        .env("SOFTRDMA_POLL_HANDOFF_US", "600000000")
        .env_remove("SOFTRDMA_UNRELIABLE_BATCH")
        .status()
        .unwrap();
    assert!(status.success(), "the sender failed: {status}");
    // Both messages, in order, each in its own receive (behind its 40-byte GRH).
    let wcs = me.wait(2);
    let mut got = Vec::new();
    for w in &wcs {
        assert_eq!(w.status, WcStatus::Success);
        assert_eq!(w.byte_len, 40 + 8);
        let mut v = [0u8; 8];
        me.buf
            .read(w.wr_id as usize * 128 - 128 + 40, &mut v)
            .unwrap();
        got.push((w.wr_id, u64::from_le_bytes(v)));
    }
    assert_eq!(got, [(1, 41), (2, 42)]);
}
