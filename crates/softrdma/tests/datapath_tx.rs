//! Every test of `datapath.rs` again over the wire with each device's transmit thread on
//! (`SOFTRDMA_TX_THREAD=1`; off by default): the full
//! batches of a stream of large RC requests or READ responses are sent by the device's transmit thread while
//! the thread that built them builds the next ones, and every result (data, ordering
//! against atomics, READs and ACKs, completion statuses, faults, flow control) is the same.
//! (A test binary of its own, run after `datapath`, as `datapath_wire` is.)

#[path = "datapath.rs"]
mod cases;

// Every device of this binary sends on the wire, through its transmit thread (every stream
// at once may have one, not one per eight CPUs).
crate::preset_env!("SOFTRDMA_TRANSPORT", "wire");
crate::preset_env!("SOFTRDMA_TX_THREAD", "1");
crate::preset_env!("SOFTRDMA_TX_THREADS_MAX", "64");

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The loopback's count of UDP datagrams dropped for want of room in a receiving socket
/// (`RcvbufErrors` of /proc/net/snmp, every process's), if it can be read.
fn udp_receive_drops() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let i = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Large WRITEs one way and large SENDs the other at once: the WRITEs' full batches go
/// through the transmit thread of `a`'s device while `a` also acknowledges `b`'s SENDs (ACKs
/// wait for the queue), and `b`'s through its own. Then WRITEs with a READ right behind them
/// on the same QP (the READ request joins the queue behind them). Every byte arrives where it
/// belongs, in order: the last WRITE to each place wins, the READ sees the WRITEs before it.
#[test]
fn streams_both_ways_go_through_the_transmit_thread_and_keep_their_order() {
    use cases::pair::*;
    use softrdma::*;
    let mb = 1 << 20;
    let drops = udp_receive_drops();
    let (a, b) = pair_on(&unique(), &unique(), QpType::Rc, 10 << 20, &Opts::default());
    // a: sources of the WRITEs at 0..4 MiB, SEND receive buffers at 4..6 MiB, READ target
    // at 8..10 MiB. b: WRITE targets at 0..2 MiB, SEND sources at 2..4 MiB.
    let sources: Vec<Vec<u8>> = (0..4).map(|i| pattern(mb, 10 + i as u8)).collect();
    for (i, s) in sources.iter().enumerate() {
        a.buf.write(i * mb, s).unwrap();
    }
    let sends: Vec<Vec<u8>> = (0..8).map(|i| pattern(256 << 10, 40 + i as u8)).collect();
    for (i, s) in sends.iter().enumerate() {
        b.buf.write(2 * mb + i * (256 << 10), s).unwrap();
    }
    for round in 0..3u64 {
        for i in 0..8u64 {
            a.post_recv(
                1000 + round * 8 + i,
                4 * mb + i as usize * (256 << 10),
                256 << 10,
            );
        }
        // Eight 1 MiB WRITEs into two places of b: sources 0,1,2,3,0,1,2,3 -> the last two win.
        for i in 0..8u64 {
            let src = (i % 4) as usize;
            send(
                &a,
                round * 100 + i,
                WrOpcode::RdmaWrite,
                &[a.sge(src * mb, mb)],
                |w| {
                    w.remote_addr = b.buf.addr() + (i % 2) * mb as u64;
                    w.rkey = b.mr.rkey();
                },
            );
        }
        // b's SENDs go at the same time.
        for i in 0..8u64 {
            let off = 2 * mb + i as usize * (256 << 10);
            send(
                &b,
                500 + round * 100 + i,
                WrOpcode::Send,
                &[b.sge(off, 256 << 10)],
                |_| {},
            );
        }
        // a's one CQ has its WRITEs' completions and its receives', each kind in order.
        let wa = a.wait(16);
        let writes: Vec<_> = wa
            .iter()
            .filter(|c| c.opcode == WcOpcode::RdmaWrite)
            .collect();
        let recvs: Vec<_> = wa.iter().filter(|c| c.opcode == WcOpcode::Recv).collect();
        assert_eq!((writes.len(), recvs.len()), (8, 8), "{wa:?}");
        for (k, c) in writes.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (round * 100 + k as u64, WcStatus::Success)
            );
        }
        for (k, c) in recvs.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (1000 + round * 8 + k as u64, WcStatus::Success)
            );
            assert_eq!(c.byte_len as usize, 256 << 10);
        }
        let wb = b.wait(8);
        for (k, c) in wb.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (500 + round * 100 + k as u64, WcStatus::Success)
            );
        }
        for (i, s) in sends.iter().enumerate() {
            let mut buf = vec![0u8; 256 << 10];
            a.buf.read(4 * mb + i * (256 << 10), &mut buf).unwrap();
            assert!(buf == *s, "round {round}: SEND {i}");
        }
        // Eight more WRITEs, and a READ of both places right behind them on the same QP: the
        // READ is answered after the WRITEs before it, so it sees the last two.
        for i in 0..8u64 {
            let src = (i % 4) as usize;
            send(
                &a,
                300 + round * 100 + i,
                WrOpcode::RdmaWrite,
                &[a.sge(src * mb, mb)],
                |w| {
                    w.remote_addr = b.buf.addr() + (i % 2) * mb as u64;
                    w.rkey = b.mr.rkey();
                },
            );
        }
        send(
            &a,
            900 + round,
            WrOpcode::RdmaRead,
            &[a.sge(8 * mb, 2 * mb)],
            |w| {
                w.remote_addr = b.buf.addr();
                w.rkey = b.mr.rkey();
            },
        );
        let r = a.wait(9);
        for (k, c) in r.iter().enumerate() {
            let want = if k < 8 {
                300 + round * 100 + k as u64
            } else {
                900 + round
            };
            assert_eq!((c.wr_id, c.status), (want, WcStatus::Success));
        }
        for (place, src) in [(0usize, 2usize), (1, 3)] {
            let mut buf = vec![0u8; mb];
            b.buf.read(place * mb, &mut buf).unwrap();
            assert!(buf == sources[src], "round {round}: place {place}");
            a.buf.read(8 * mb + place * mb, &mut buf).unwrap();
            assert!(buf == sources[src], "round {round}: READ of place {place}");
        }
    }
    // A packet that overtook one before it would be NAKed as out of sequence: with nothing
    // lost on the way (no datagram dropped on this machine meanwhile), there is none.
    let (ca, cb) = (a.qp.counters(), b.qp.counters());
    if drops.is_some() && udp_receive_drops() == drops {
        assert_eq!(
            (ca.seq_naks_sent, cb.seq_naks_sent),
            (0, 0),
            "{ca:?} {cb:?}"
        );
    }
    // (A batch goes to the transmit thread from 128 KiB, 64 packets of 2 KiB: with packets of
    // the path MTU, 1 KiB here, `SOFTRDMA_SAME_HOST_SEGMENT=0`, none does.)
    if std::env::var_os("SOFTRDMA_SAME_HOST_SEGMENT").is_none() {
        assert!(
            thread_names().iter().any(|n| n.starts_with("softrdma-tx-")),
            "no transmit thread: {:?}",
            thread_names()
        );
    }
}
