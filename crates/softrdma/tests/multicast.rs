//! IP multicast for UD QPs over real UDP sockets: devices on loopback addresses of this run's
//! own join groups of this run's own (see `softrdma::testing`: devices of every process on a
//! host that join one group get each other's datagrams, so a shared group would mix runs), a
//! UD SEND to the group reaches every attached QP (and only those), Q_Keys
//! are checked, detach stops delivery, the sender does not get its own copy back, bad
//! datagrams on a group socket are counted and dropped, and IPv6 where this host can loop
//! IPv6 multicast back.
//!
//! "Nothing arrives" is never shown by sleeping: a later message that must arrive on the
//! same path (same sender socket, same group socket, hence in order) is awaited first.

#[path = "common/pair.rs"]
mod pair;

use pair::*;
use softrdma::*;
use std::net::IpAddr;

const QKEY: u32 = 0x1111;
const GRH: usize = 40;

/// A UD QP on `addr` with Q_Key `qkey`, in RTS, with a 64 KiB registered buffer.
fn ud(addr: &str, qkey: u32) -> Side {
    let (s, _) = Side::new(addr, QpType::Ud, 65536, false);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    s.qp.modify_qp(&a, m.bits()).unwrap();
    a.qp_state = QpState::Rtr;
    s.qp.modify_qp(&a, QpAttrMask::STATE.bits()).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 7;
    s.qp.modify_qp(&a, (QpAttrMask::STATE | QpAttrMask::SQ_PSN).bits())
        .unwrap();
    s
}

/// Sends `data` (placed at offset 32768 of the sender's buffer) as a UD SEND to `dst`
/// (a group or a unicast address) and waits for the send completion.
fn send_to(s: &Side, wr_id: u64, dst: IpAddr, remote_qpn: u32, qkey: u32, data: &[u8]) {
    let ah = s.pd.create_ah(&AhAttr::for_ip(dst)).unwrap();
    s.buf.write(32768, data).unwrap();
    send(s, wr_id, WrOpcode::Send, &[s.sge(32768, data.len())], |w| {
        w.ah = Some(&ah);
        w.remote_qpn = remote_qpn;
        w.remote_qkey = qkey;
    });
    let c = next_wc(s);
    assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::Success));
}

/// The next completion of the side's CQ (one at a time, so that none is lost between calls).
fn next_wc(s: &Side) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    eventually("a completion arrives", || s.cq.poll(&mut wc).unwrap() == 1);
    wc[0]
}

/// Waits for the next receive completion, checks it and that the message (after the GRH
/// area at offset `off`) is `data`; returns the GRH area.
fn expect_recv(r: &Side, wr_id: u64, off: usize, src_qp: u32, data: &[u8]) -> [u8; GRH] {
    let c = [next_wc(r)];
    assert_eq!(
        (
            c[0].wr_id,
            c[0].status,
            c[0].opcode,
            c[0].byte_len,
            c[0].src_qp
        ),
        (
            wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            (GRH + data.len()) as u32,
            src_qp
        ),
        "receive completion"
    );
    assert!(c[0].wc_flags.contains(WcFlags::GRH));
    let mut got = vec![0u8; GRH + data.len()];
    r.buf.read(off, &mut got).unwrap();
    assert_eq!(&got[GRH..], data, "payload byte-exact");
    got[..GRH].try_into().unwrap()
}

fn cq_is_empty(s: &Side) -> bool {
    s.cq.poll(&mut [WorkCompletion::default(); 4]).unwrap() == 0
}

/// The IPv4 source and destination in the GRH area of an IPv4 datagram (RFC 4391 layout:
/// the IPv4 header in the last 20 bytes).
fn grh_v4(g: &[u8; GRH]) -> (IpAddr, IpAddr) {
    let h = &g[20..];
    assert_eq!(h[0], 0x45, "IPv4 header in the GRH area");
    assert_eq!(h[9], 17, "UDP");
    let a = |o: usize| IpAddr::from([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    (a(12), a(16))
}

/// How many sockets of this process are bound to `group:4791` (IPv4): each descriptor in
/// /proc/self/fd asked with `getsockname`. Not /proc/net/udp: the kernel prints that table a
/// page per read, walking its hash chain again from the start for each page, so while other
/// sockets of port 4791 (every device's) open and close beside the test a line can come twice
/// or not at all (measured: about 2% of reads under such churn).
fn sockets_bound_to(group: std::net::Ipv4Addr) -> usize {
    let want = std::net::SocketAddrV4::new(group, 4791);
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::c_int>().ok())
        .filter(|&fd| bound_v4(fd) == Some(want))
        .count()
}

/// The IPv4 address descriptor `fd` is bound to, when it is an IPv4 socket (a descriptor
/// closed meanwhile, or of another kind, gives `None`).
fn bound_v4(fd: libc::c_int) -> Option<std::net::SocketAddrV4> {
    // SAFETY: sockaddr_in is plain old data; getsockname writes at most `len` bytes into it
    // and only reads the descriptor (any number: a bad one fails with EBADF or ENOTSOCK).
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let r = unsafe { libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len) };
    (r == 0 && sa.sin_family == libc::AF_INET as libc::sa_family_t).then(|| {
        std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        )
    })
}

/// Polls `f` until it holds; fails (a hang, not slowness) after a generous deadline.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !f() {
        if std::time::Instant::now() > deadline {
            panic!("never: {what}");
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

#[test]
fn a_send_to_the_group_reaches_every_attached_qp_of_every_device() {
    let ip_60 = unique();
    let ip_61 = unique();
    let ip_62 = unique();
    let group4 = softrdma::testing::unique_multicast_group();
    let group = IpAddr::V4(group4);
    let mgid = Gid::from_ip(group);
    let s = ud(&ip_60, QKEY);
    let a = ud(&ip_61, QKEY);
    let b = ud(&ip_62, QKEY);
    // On a's device too, but not attached.
    let a2 = ud(&ip_61, QKEY);
    a.qp.attach_mcast(&mgid, 0).unwrap();
    b.qp.attach_mcast(&mgid, 0).unwrap();
    assert_eq!(
        sockets_bound_to(group4),
        2,
        "one group socket per joined device"
    );
    let (s0, a0, b0) = (s.ctx.counters(), a.ctx.counters(), b.ctx.counters());
    for r in [&a, &b, &a2] {
        r.post_recv(1, 0, 4096);
        r.post_recv(2, 8192, 4096);
    }
    let data = pattern(1000, 60);
    // Whatever QP number the request names, a send to a group carries 0xFFFFFF (a receiver
    // drops anything else that arrives on a group socket).
    send_to(&s, 10, group, 0x1234, QKEY, &data);
    // Nobody polls a's or b's CQ yet: their progress threads receive the datagram.
    eventually("the progress threads receive the datagram", || {
        a.ctx.counters().mcast_rx_packets > a0.mcast_rx_packets
            && b.ctx.counters().mcast_rx_packets > b0.mcast_rx_packets
    });
    for r in [&a, &b] {
        let g = expect_recv(r, 1, 0, s.qp.qp_num(), &data);
        assert_eq!(
            grh_v4(&g),
            (s.addr, group),
            "GRH: from the sender to the group"
        );
    }
    // A second message: once a has it, the first was fully handled on a's device.
    let data2 = pattern(77, 61);
    send_to(&s, 11, group, 0xff_ffff, QKEY, &data2);
    expect_recv(&a, 2, 8192, s.qp.qp_num(), &data2);
    expect_recv(&b, 2, 8192, s.qp.qp_num(), &data2);
    assert!(cq_is_empty(&a2), "a QP that is not attached gets nothing");
    // And a2 still has both receive requests: a unicast takes the first.
    let hello = b"unicast to a2";
    send_to(&s, 12, a2.addr, a2.qp.qp_num(), QKEY, hello);
    let g = expect_recv(&a2, 1, 0, s.qp.qp_num(), hello);
    assert_eq!(grh_v4(&g), (s.addr, a2.addr));

    let (s1, a1, b1) = (s.ctx.counters(), a.ctx.counters(), b.ctx.counters());
    assert_eq!(s1.mcast_tx_packets - s0.mcast_tx_packets, 2);
    assert_eq!(a1.mcast_rx_packets - a0.mcast_rx_packets, 2);
    assert_eq!(b1.mcast_rx_packets - b0.mcast_rx_packets, 2);
    assert_eq!(
        (a1.icrc_errors, a1.malformed),
        (a0.icrc_errors, a0.malformed)
    );

    a.qp.detach_mcast(&mgid, 0).unwrap();
    b.qp.detach_mcast(&mgid, 0).unwrap();
    eventually("the group sockets close after the last detach", || {
        sockets_bound_to(group4) == 0
    });
}

#[test]
fn qkey_mismatch_is_dropped_and_detach_stops_delivery() {
    let ip_63 = unique();
    let ip_64 = unique();
    let ip_65 = unique();
    let group4 = softrdma::testing::unique_multicast_group();
    let group = IpAddr::V4(group4);
    let mgid = Gid::from_ip(group);
    let s = ud(&ip_63, QKEY);
    // Three QPs on one device: two with the sender's Q_Key, one with another.
    let r1 = ud(&ip_64, QKEY);
    let r2 = ud(&ip_64, 0x2222);
    let r3 = ud(&ip_64, QKEY);
    // And one more device that stays attached throughout.
    let t = ud(&ip_65, QKEY);
    for r in [&r1, &r2, &r3, &t] {
        r.qp.attach_mcast(&mgid, 0).unwrap();
        for i in 0..8 {
            r.post_recv(i, i as usize * 4096, 4096);
        }
    }
    let m1 = pattern(300, 1);
    send_to(&s, 1, group, 0, QKEY, &m1);
    expect_recv(&r1, 0, 0, s.qp.qp_num(), &m1);
    expect_recv(&r3, 0, 0, s.qp.qp_num(), &m1);
    expect_recv(&t, 0, 0, s.qp.qp_num(), &m1);
    // r2's Q_Key differs: m1 did not take its first receive request, m2 does.
    let m2 = pattern(200, 2);
    send_to(&s, 2, group, 0, 0x2222, &m2);
    expect_recv(&r2, 0, 0, s.qp.qp_num(), &m2);
    // A Q_Key with the high bit set means "use the sender QP's own Q_Key" (0x1111).
    let m3 = pattern(100, 3);
    send_to(&s, 3, group, 0, 0x8000_0000, &m3);
    expect_recv(&r1, 1, 4096, s.qp.qp_num(), &m3);
    expect_recv(&r3, 1, 4096, s.qp.qp_num(), &m3);
    expect_recv(&t, 1, 4096, s.qp.qp_num(), &m3);
    assert!(cq_is_empty(&r2), "m1 and m3 have the wrong Q_Key for r2");

    // r1 detaches; r3 on the same device stays: m4 then m5 arrive in order at the device,
    // so once r3 has m5, r1 would have had m4.
    r1.qp.detach_mcast(&mgid, 0).unwrap();
    let m4 = pattern(50, 4);
    let m5 = pattern(60, 5);
    send_to(&s, 4, group, 0, QKEY, &m4);
    send_to(&s, 5, group, 0, QKEY, &m5);
    expect_recv(&r3, 2, 8192, s.qp.qp_num(), &m4);
    expect_recv(&r3, 3, 12288, s.qp.qp_num(), &m5);
    assert!(cq_is_empty(&r1), "a detached QP gets nothing");
    expect_recv(&t, 2, 8192, s.qp.qp_num(), &m4);
    expect_recv(&t, 3, 12288, s.qp.qp_num(), &m5);

    // The device's last QPs detach: it leaves the group (its socket closes) while t's device
    // still gets what is sent.
    r2.qp.detach_mcast(&mgid, 0).unwrap();
    r3.qp.detach_mcast(&mgid, 0).unwrap();
    eventually("r's device closes its group socket", || {
        sockets_bound_to(group4) == 1
    });
    let before = r1.ctx.counters();
    let m6 = pattern(70, 6);
    send_to(&s, 6, group, 0, QKEY, &m6);
    expect_recv(&t, 4, 16384, s.qp.qp_num(), &m6);
    // r1 got m1 and m3 only: a unicast takes its next receive request.
    let hi = b"after detach";
    send_to(&s, 7, r1.addr, r1.qp.qp_num(), QKEY, hi);
    expect_recv(&r1, 2, 8192, s.qp.qp_num(), hi);
    assert_eq!(
        r1.ctx.counters().mcast_rx_packets,
        before.mcast_rx_packets,
        "nothing reached the device after it left the group"
    );
    // Attaching again joins again.
    r1.qp.attach_mcast(&mgid, 0).unwrap();
    let m7 = pattern(80, 7);
    send_to(&s, 8, group, 0, QKEY, &m7);
    expect_recv(&r1, 3, 12288, s.qp.qp_num(), &m7);
    expect_recv(&t, 5, 20480, s.qp.qp_num(), &m7);
    r1.qp.detach_mcast(&mgid, 0).unwrap();
    t.qp.detach_mcast(&mgid, 0).unwrap();
    // Destroying a QP while attached also detaches (Drop), leaving no socket behind.
    let u = ud(&ip_65, QKEY);
    u.qp.attach_mcast(&mgid, 0).unwrap();
    drop(u);
    eventually("every group socket closes", || {
        sockets_bound_to(group4) == 0
    });
}

#[test]
fn the_sender_gets_no_copy_and_bad_datagrams_are_dropped() {
    let ip_66 = unique();
    let ip_67 = unique();
    let group4 = softrdma::testing::unique_multicast_group();
    let group = IpAddr::V4(group4);
    let mgid = Gid::from_ip(group);
    // Two QPs on the sender's device, both attached; one receiver elsewhere.
    let s = ud(&ip_66, QKEY);
    let s2 = ud(&ip_66, QKEY);
    let a = ud(&ip_67, QKEY);
    for q in [&s, &s2, &a] {
        q.qp.attach_mcast(&mgid, 0).unwrap();
        q.post_recv(1, 0, 4096);
        q.post_recv(2, 8192, 4096);
    }
    a.post_recv(3, 16384, 4096);
    let before = a.ctx.counters();
    // Garbage straight to the group from a plain socket: too short, then a bad ICRC.
    let raw_ip = softrdma::testing::unique_loopback_addr();
    let raw = std::net::UdpSocket::bind((raw_ip, 0)).unwrap();
    let ifaddr = libc::in_addr {
        s_addr: u32::from_ne_bytes(raw_ip.octets()),
    };
    // SAFETY: a valid socket and a pointer to a live in_addr of the right size.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&raw),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&ifaddr as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "IP_MULTICAST_IF");
    raw.send_to(&[1, 2, 3], (group, 4791)).unwrap();
    let mut bogus = vec![0x64u8, 0, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0, 0, 0, 1];
    bogus.extend_from_slice(&[0; 8]); // DETH
    bogus.extend_from_slice(b"payload");
    bogus.extend_from_slice(&[0, 0, 0, 0]); // a wrong ICRC
    raw.send_to(&bogus, (group, 4791)).unwrap();

    let m1 = pattern(500, 1);
    send_to(&s, 1, group, 0, QKEY, &m1);
    expect_recv(&s2, 1, 0, s.qp.qp_num(), &m1);
    expect_recv(&a, 1, 0, s.qp.qp_num(), &m1);
    // s2 sends next: s gets that, and it is the first thing s gets (not its own m1).
    let m2 = pattern(400, 2);
    send_to(&s2, 2, group, 0, QKEY, &m2);
    expect_recv(&s, 1, 0, s2.qp.qp_num(), &m2);
    expect_recv(&a, 2, 8192, s2.qp.qp_num(), &m2);
    // s2 got m1 only, not its own m2: a third message from s is its second receive.
    let m3 = pattern(300, 3);
    send_to(&s, 3, group, 0, QKEY, &m3);
    expect_recv(&s2, 2, 8192, s.qp.qp_num(), &m3);
    expect_recv(&a, 3, 16384, s.qp.qp_num(), &m3);
    assert!(cq_is_empty(&s), "s gets no copy of m3");

    let after = a.ctx.counters();
    assert_eq!(after.malformed - before.malformed, 1, "the short datagram");
    assert_eq!(after.icrc_errors - before.icrc_errors, 1, "the bad ICRC");
    assert_eq!(after.mcast_rx_packets - before.mcast_rx_packets, 3);
    for q in [&s, &s2, &a] {
        q.qp.detach_mcast(&mgid, 0).unwrap();
    }
}

/// Whether this host loops IPv6 multicast back from `addr` on interface `ifindex`: a plain
/// socket sends to `group` and a socket that joined it has the datagram at once (loopback
/// delivery happens inside the send call), without waiting.
fn v6_multicast_loops(addr: std::net::Ipv6Addr, ifindex: u32, group: std::net::Ipv6Addr) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(rx) = std::net::UdpSocket::bind(std::net::SocketAddrV6::new(group, 0, 0, ifindex))
    else {
        return false;
    };
    if rx.join_multicast_v6(&group, ifindex).is_err() || rx.set_nonblocking(true).is_err() {
        return false;
    }
    let port = rx.local_addr().unwrap().port();
    let Ok(tx) = std::net::UdpSocket::bind(std::net::SocketAddrV6::new(addr, 0, 0, 0)) else {
        return false;
    };
    let idx = ifindex as libc::c_int;
    // SAFETY: a valid socket and a pointer to a live c_int.
    let r = unsafe {
        libc::setsockopt(
            tx.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_IF,
            (&idx as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 || tx.set_multicast_loop_v6(true).is_err() {
        return false;
    }
    if tx.send_to(b"probe", (group, port)).is_err() {
        return false;
    }
    let mut b = [0u8; 16];
    matches!(rx.recv_from(&mut b), Ok((5, _)))
}

#[test]
fn ipv6_group_on_one_device() {
    let group = softrdma::testing::unique_multicast_group_v6();
    let candidates: Vec<Device> = std::iter::once(Device::from_addr("::1".parse().unwrap()))
        .filter_map(|d| d.ok())
        .chain(
            get_device_list()
                .unwrap_or_default()
                .into_iter()
                .filter(|d| d.addr().is_ipv6() && !d.addr().is_loopback()),
        )
        .collect();
    let Some(dev) = candidates.into_iter().find(|d| match d.addr() {
        IpAddr::V6(a) => v6_multicast_loops(a, d.ifindex(), group),
        IpAddr::V4(_) => false,
    }) else {
        eprintln!(
            "SKIPPED ipv6_group_on_one_device: no IPv6 address of this host loops IPv6 \
             multicast back (lo has no MULTICAST flag, and no other interface with an IPv6 \
             address delivered a probe)"
        );
        return;
    };
    // IPv6 has no loopback range to give each run an address of its own: another run may
    // hold this one's port 4791. Starting the engine here keeps it for the QPs below.
    if let Err(e) = dev.open().and_then(|c| c.local_udp_addr()) {
        if e.errno() == libc::EADDRINUSE {
            eprintln!(
                "SKIPPED ipv6_group_on_one_device: {}:4791 is in use: {e}",
                dev.addr()
            );
            return;
        }
        panic!("starting the device on {}: {e}", dev.addr());
    }
    let addr = dev.addr().to_string();
    eprintln!(
        "ipv6_group_on_one_device on {addr} (ifindex {})",
        dev.ifindex()
    );
    let mgid = Gid::from_ip(IpAddr::V6(group));
    let s = ud(&addr, QKEY);
    let a = ud(&addr, QKEY);
    let b = ud(&addr, QKEY);
    for q in [&s, &a, &b] {
        if let Err(e) = q.qp.attach_mcast(&mgid, 0) {
            if e.errno() == libc::EADDRINUSE {
                eprintln!("SKIPPED ipv6_group_on_one_device: {addr}:4791 is in use: {e}");
                return;
            }
            panic!("attach_mcast on {addr}: {e}");
        }
        q.post_recv(1, 0, 4096);
        q.post_recv(2, 8192, 4096);
    }
    let m1 = pattern(700, 6);
    send_to(&s, 1, IpAddr::V6(group), 0, QKEY, &m1);
    for r in [&a, &b] {
        let g = expect_recv(r, 1, 0, s.qp.qp_num(), &m1);
        assert_eq!(g[0] >> 4, 6, "IPv6 header in the GRH area");
        assert_eq!(&g[8..24], &Gid::from_ip(s.addr).raw, "GRH source");
        assert_eq!(&g[24..40], &mgid.raw, "GRH destination: the group");
    }
    // a sends next: s's first receive is a's message, not its own m1.
    let m2 = pattern(90, 7);
    send_to(&a, 2, IpAddr::V6(group), 0, QKEY, &m2);
    expect_recv(&s, 1, 0, a.qp.qp_num(), &m2);
    expect_recv(&b, 2, 8192, a.qp.qp_num(), &m2);
    for q in [&s, &a, &b] {
        q.qp.detach_mcast(&mgid, 0).unwrap();
    }
}

/// A plain UDP socket bound to `group:4791` (with `SO_REUSEADDR`, as the devices bind it) and
/// joined on the interface of `ifaddr`, with a read timeout that only catches a hang.
fn plain_member(group: std::net::Ipv4Addr, ifaddr: std::net::Ipv4Addr) -> std::net::UdpSocket {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2); the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: fd is fresh and owned by nobody else.
    let sock = unsafe { std::net::UdpSocket::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: a pointer to a live c_int of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_REUSEADDR");
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 4791u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(group.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in and its size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "bind {group}:4791");
    sock.join_multicast_v4(&group, &ifaddr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    sock
}

#[test]
fn on_the_wire_a_ud_send_to_qpn_ffffff_with_the_icrc_of_the_group() {
    let group = softrdma::testing::unique_multicast_group();
    let me = softrdma::testing::unique_loopback_addr();
    let plain = plain_member(group, me);
    let s = ud(&me.to_string(), QKEY);
    let data = pattern(333, 9);
    send_to(&s, 1, IpAddr::V4(group), 0x42, 0x1234_5678, &data);
    let mut b = [0u8; 2048];
    let (n, from) = plain.recv_from(&mut b).expect("the datagram (or a hang)");
    assert_eq!(from, std::net::SocketAddr::new(s.addr, 4791));
    let pkt = &b[..n];
    let v = softrdma_wire::roce::Packet::new_checked(pkt).unwrap();
    assert_eq!(v.bth().opcode(), softrdma_wire::opcode::Opcode(0x64)); // UD SEND only
    assert_eq!(v.bth().dest_qp(), 0xff_ffff, "the multicast QP number");
    let d = v.deth().unwrap();
    assert_eq!((d.qkey(), d.src_qp()), (0x1234_5678, s.qp.qp_num()));
    assert_eq!(v.payload(), &data[..]);
    // The ICRC over the IPv4 and UDP headers the kernel put in front of it: ID 0 and DF
    // (IP_PMTUDISC_DO), TTL 1, from the device to the group, both on port 4791.
    let total = 20 + 8 + n;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 1, 17, 0, 0];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&me.octets());
    ip.extend_from_slice(&group.octets());
    ip.extend_from_slice(&4791u16.to_be_bytes());
    ip.extend_from_slice(&4791u16.to_be_bytes());
    ip.extend_from_slice(&((8 + n) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(pkt);
    softrdma_wire::icrc::verify(&ip).expect("ICRC computed with the group as destination");
    // With the device's own address as destination it would not verify.
    ip[16..20].copy_from_slice(&me.octets());
    assert!(softrdma_wire::icrc::verify(&ip).is_err());
    assert_eq!(s.ctx.counters().mcast_tx_packets, 1);
}
