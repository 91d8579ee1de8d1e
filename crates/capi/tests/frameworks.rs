//! Debian's UCX (ucx-utils 1.13) and libfabric (libfabric-bin 1.17) tools, unmodified, on
//! the drop-in libraries: each server/client pair runs on devices of its own
//! (`SOFTRDMA_DEVICES`), with a free TCP port for the out-of-band exchange; the time limits
//! only guard against a hang.
//!
//! UCX lists only the devices whose `/dev/infiniband/<ibv_device.dev_name>` is a character
//! device it may open (`uct_ib_device_is_accessible`), which softrdma has no kernel driver
//! for. The UCX programs therefore run in a private user and mount namespace
//! (`unshare -rm`, no root needed) whose `/dev` is a tmpfs of links to the real entries
//! plus `infiniband/uverbs_<name>` links to `/dev/null`; nothing changes outside it.
//! UCX 1.13 further needs, on any RoCE device that is not a Mellanox one:
//! - `UCX_UD_VERBS_ETH_DGID_CHECK=n` for `ud_verbs`: it takes the packet type (IPv4 or
//!   IPv6) of a UD receive from `ibv_wc.sl` as ConnectX reports it, and drops every
//!   packet of a device that reports the service level there (UCX 1.18 reads the GRH);
//! - an auxiliary transport for `rc_verbs` through UCP (`UCX_TLS=rc_verbs,ud_verbs:aux`,
//!   what `UCX_TLS=rc` means): `rc_verbs` alone cannot connect a UCP endpoint.
//!
//! UCX keeps 15 characters of a device name (`UCT_MD_NAME_MAX`), fewer than `srdma_<ip>`
//! may have, and its transport-level tests (`-x`) send the device name to the server, which
//! opens the device of that name: so every process names its own address `srdma_ucx`
//! (`SOFTRDMA_DEVICES=srdma_ucx=<addr>`).
//!
//! Open MPI 4.1 (Debian's openmpi-bin) runs an MPI program of ours, `tests/c/mpi_check.c`,
//! in the same namespace, its ranks talking through UCX (`pml ucx`, `osc ucx`) over `rc_verbs` on one
//! shared softrdma device, with Open MPI's and UCX's shared-memory transports left out.
//!
//! libfabric 1.17's verbs provider (Debian's libfabric-bin has only fi_info and
//! fi_pingpong) offers MSG endpoints, and so RDM over them (`verbs;ofi_rxm`), only on the
//! devices it finds by binding an rdma_cm id to each address of a non-loopback interface
//! (`vrb_getifaddrs` skips `IFF_LOOPBACK`), or that have a GID with a non-zero subnet
//! prefix (`vrb_get_sib`; a RoCE GID of an IPv4 address has none). Given a node, those run
//! here: `fi_info -n <this host's address>` lists them (`fi_info_msg_and_rxm_with_a_node`).
//! fi_pingpong, however, calls `fi_getinfo` with no node and no service on both sides; the
//! provider then binds an id to "localhost" and keeps only the infos of that id's device.
//! Where "localhost" is 127.0.0.1, that device has no MSG info, and `fi_pingpong -e msg -p
//! verbs` and `-e rdm -p 'verbs;ofi_rxm'` fail in `fi_getinfo` with -61 (FI_ENODATA) before
//! any connection; Linux fails likewise, by the same code (its rdma_bind_addr to 127.0.0.1
//! finds no RDMA device, and an rxe on `lo` is skipped as above). So those two run in a
//! private user and mount namespace whose `/etc/hosts` names this host's non-loopback
//! address "localhost" (`localhost_cmd`), as they would on a host whose RDMA interface has
//! that name's address. Its DGRAM endpoints, and RDM over them (`verbs;ofi_rxd`), run as
//! they are.
//! The provider binds an id on every interface address while it builds its list (the
//! devices of those addresses are shared with any other process).

mod common;

use common::*;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The hang guard for one program (never a timing assertion).
const LIMIT: Duration = Duration::from_secs(60);

/// Whether `prog` (of Debian's package `pkg`) is installed; outside CI a missing one skips
/// the test with a message.
fn have(prog: &str, pkg: &str) -> bool {
    let ok = Path::new(prog).exists();
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "CI must install {pkg}");
        eprintln!("skipped: {prog} is not installed ({pkg})");
    }
    ok
}

/// Whether private user and mount namespaces can be made (`unshare -rm`), which the UCX
/// tests need; outside CI their absence skips the test with a message.
fn have_userns() -> bool {
    let ok = Command::new("unshare")
        .args(["-rm", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must allow user namespaces (unshare -rm)"
        );
        eprintln!("skipped: `unshare -rm` fails (no user namespaces)");
    }
    ok
}

/// Whether UCX's tools and the namespaces they need here are available.
fn have_ucx() -> bool {
    have("/usr/bin/ucx_perftest", "ucx-utils") && have_userns()
}

/// Whether libfabric's tools are installed.
fn have_fabric() -> bool {
    have("/usr/bin/fi_pingpong", "libfabric-bin")
}

/// Run as `sh -c SCRIPT sh OLD NAMES PROG ARGS...` in a new user and mount namespace: moves
/// the real `/dev` to the empty directory `OLD`, makes `/dev` a tmpfs of links to its
/// entries plus `infiniband/uverbs_<name>` links to `/dev/null` for each of `NAMES`, then
/// runs `PROG` (see the module notes).
const UCX_DEV_SCRIPT: &str = r#"set -e
old="$1"; names="$2"; shift 2
mount --rbind /dev "$old"
mount -t tmpfs softrdma-dev /dev
for e in "$old"/* "$old"/.[!.]*; do
  if [ -e "$e" ] || [ -L "$e" ]; then ln -s "$e" "/dev/${e##*/}"; fi
done
mkdir /dev/infiniband
for n in $names; do ln -s "$old/null" "/dev/infiniband/uverbs_$n"; done
exec "$@"
"#;

/// A scratch path of this test process (`$TMPDIR/softrdma-<what>-<pid>-<n>`), removed when
/// dropped (even when the test fails): an empty directory or a file.
struct TempPath(PathBuf);

impl TempPath {
    /// A new path, nothing created yet.
    fn new(what: &str) -> TempPath {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        TempPath(std::env::temp_dir().join(format!(
            "softrdma-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0).or_else(|_| std::fs::remove_file(&self.0));
    }
}

/// A UCX command: `prog args` in a namespace where the devices `names` pass UCX's
/// `/dev/infiniband` check, with the drop-in libraries and `SOFTRDMA_DEVICES=devices`.
/// Returns the command and the directory (empty outside the namespace) it needs while it
/// runs.
fn ucx_cmd(names: &[&str], devices: &str, prog: &str, args: &[&str]) -> (Command, TempPath) {
    let old = TempPath::new("ucx-dev");
    std::fs::create_dir_all(&old.0).unwrap();
    let mut c = command("unshare");
    c.args(["-rm", "sh", "-c", UCX_DEV_SCRIPT, "sh"])
        .arg(&old.0)
        .arg(names.join(" "))
        .arg(prog)
        .args(args)
        .env("SOFTRDMA_DEVICES", devices)
        .env("UCX_WARN_UNUSED_ENV_VARS", "n");
    (c, old)
}

#[test]
fn ucx_info_lists_the_device() {
    if !have_ucx() {
        return;
    }
    let name = "srdma_ucx";
    let devices = format!("{name}={}", unique_addr());
    for tls in [None, Some("rc_verbs,ud_verbs")] {
        let (mut cmd, _dir) = ucx_cmd(&[name], &devices, "ucx_info", &["-d"]);
        if let Some(t) = tls {
            cmd.env("UCX_TLS", t);
        }
        let (st, out, err) = run_bounded(cmd, LIMIT);
        assert!(st.is_some_and(|s| s.success()), "{out}\n{err}");
        for want in [
            format!("Memory domain: {name}"),
            "Transport: rc_verbs".to_string(),
            "Transport: ud_verbs".to_string(),
            format!("Device: {name}:1"),
        ] {
            assert!(
                out.contains(&want),
                "UCX_TLS={tls:?}: no {want:?} in\n{out}"
            );
        }
    }
}

/// Runs `ucx_perftest` between two processes, each on a device of its own named
/// `srdma_ucx`. Unless `args` name a transport (`-x`, with `-d srdma_ucx:1`), `UCX_TLS=tls`
/// and `UCX_NET_DEVICES` pick them (UCP tests). Checks the client prints its result line.
fn ucx_perftest(tls: &str, args: &[&str]) {
    if !have_ucx() {
        return;
    }
    let port = free_tcp_port().to_string();
    let side = |args: &[&str]| {
        let devices = format!("srdma_ucx={}", unique_addr());
        let (mut c, dir) = ucx_cmd(&["srdma_ucx"], &devices, "ucx_perftest", args);
        c.env("UCX_TLS", tls)
            .env("UCX_NET_DEVICES", "srdma_ucx:1")
            .env("UCX_UD_VERBS_ETH_DGID_CHECK", "n");
        (c, dir)
    };
    let (server, _sdir) = side(&["-p", &port]);
    let mut cargs = vec!["127.0.0.1", "-p", &port];
    cargs.extend_from_slice(args);
    let (client, _cdir) = side(&cargs);
    let out = server_client(server, client, port.parse().unwrap(), LIMIT);
    assert!(out.contains("Final:"), "{tls} {args:?}: no result:\n{out}");
}

#[test]
fn ucx_perftest_rc_verbs_tag_lat() {
    ucx_perftest("rc_verbs,ud_verbs:aux", &["-t", "tag_lat", "-n", "500"]);
}

#[test]
fn ucx_perftest_rc_verbs_ucp_put_bw() {
    ucx_perftest("rc_verbs,ud_verbs:aux", &["-t", "ucp_put_bw", "-n", "500"]);
}

#[test]
fn ucx_perftest_ud_verbs_tag_lat() {
    ucx_perftest("ud_verbs", &["-t", "tag_lat", "-n", "500"]);
}

#[test]
fn ucx_perftest_ud_verbs_ucp_put_bw() {
    ucx_perftest("ud_verbs", &["-t", "ucp_put_bw", "-n", "500"]);
}

#[test]
fn ucx_perftest_uct_rc_verbs_put_bw() {
    let args = [
        "-t",
        "put_bw",
        "-x",
        "rc_verbs",
        "-d",
        "srdma_ucx:1",
        "-n",
        "500",
    ];
    ucx_perftest("rc_verbs", &args);
}

#[test]
fn ucx_perftest_uct_ud_verbs_am_lat() {
    let args = [
        "-t",
        "am_lat",
        "-x",
        "ud_verbs",
        "-d",
        "srdma_ucx:1",
        "-n",
        "500",
    ];
    ucx_perftest("ud_verbs", &args);
}

/// A libfabric command with the drop-in libraries and the device of `addr` listed.
fn fabric_cmd(prog: &str, addr: Ipv4Addr) -> Command {
    let mut c = command(prog);
    c.env("SOFTRDMA_DEVICES", addr.to_string())
        .env("FI_VERBS_DGRAM_USE_NAME_SERVER", "0");
    c
}

/// `fi_info -p verbs` lists the device's DGRAM domain (and its `rdma_freeaddrinfo` of an
/// `rdma_addrinfo` whose addresses it replaced no longer crashes at exit).
#[test]
fn fi_info_lists_the_device() {
    if !have_fabric() {
        return;
    }
    let a = unique_addr();
    let mut c = fabric_cmd("fi_info", a);
    c.args(["-p", "verbs"]);
    let (st, out, err) = run_bounded(c, LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{out}\n{err}");
    assert!(out.contains("provider: verbs"), "{out}");
    assert!(out.contains(&format!("domain: srdma_{a}-dgram")), "{out}");
}

/// `fi_pingpong` with `provider` and endpoint type `ep` between two devices' DGRAM domains,
/// messages of `size` (`all`: 64 B to the largest); checks the client's result row `row`.
fn fi_pingpong(provider: &str, ep: &str, size: &str, row: &str) {
    if !have_fabric() {
        return;
    }
    let port = free_tcp_port().to_string();
    let side = |addr: Ipv4Addr| {
        let mut c = fabric_cmd("fi_pingpong", addr);
        c.args(["-p", provider, "-e", ep, "-I", "20", "-S", size, "-d"])
            .arg(format!("srdma_{addr}-dgram"));
        c
    };
    let mut server = side(unique_addr());
    server.args(["-B", &port]);
    let mut client = side(unique_addr());
    client.args(["-P", &port, "127.0.0.1"]);
    let out = server_client(server, client, port.parse().unwrap(), LIMIT);
    assert!(out.contains("#sent"), "{out}");
    assert!(out.lines().any(|l| l.starts_with(row)), "{out}");
}

#[test]
fn fi_pingpong_verbs_dgram() {
    fi_pingpong("verbs", "dgram", "all", "4k ");
}

#[test]
fn fi_pingpong_verbs_rxd_rdm() {
    fi_pingpong("verbs;ofi_rxd", "rdm", "65536", "64k ");
}

/// A non-loopback IPv4 address of this host: the source of its route to a TEST-NET-3
/// address (nothing is sent). `None` without such a route, which skips the test with a
/// message (and fails it under CI, which must have one).
fn host_addr() -> Option<Ipv4Addr> {
    let found = (|| {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
        s.connect("203.0.113.1:9").ok()?;
        match s.local_addr().ok()?.ip() {
            std::net::IpAddr::V4(a) if !a.is_loopback() && !a.is_unspecified() => Some(a),
            _ => None,
        }
    })();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have a non-loopback IPv4 address"
        );
        eprintln!("skipped: this host has no non-loopback IPv4 address");
    }
    found
}

/// Run as `sh -c SCRIPT sh HOSTS PROG ARGS...` in a new user and mount namespace: makes the
/// file `HOSTS` this namespace's `/etc/hosts`, then runs `PROG`.
const HOSTS_SCRIPT: &str = r#"set -e
mount --bind "$1" /etc/hosts
shift
exec "$@"
"#;

/// A libfabric command (`prog args`, the drop-in libraries, the device of `addr` listed) in
/// a namespace where "localhost" is `addr` (see the module notes); returns it and the hosts
/// file it needs while it runs.
fn localhost_cmd(addr: Ipv4Addr, prog: &str, args: &[&str]) -> (Command, TempPath) {
    let hosts = TempPath::new("hosts");
    std::fs::write(&hosts.0, format!("{addr} localhost\n::1 ip6-localhost\n")).unwrap();
    let mut c = fabric_cmd("unshare", addr);
    c.args(["-rm", "sh", "-c", HOSTS_SCRIPT, "sh"])
        .arg(&hosts.0)
        .arg(prog)
        .args(args);
    (c, hosts)
}

/// `fi_pingpong` over MSG endpoints (`verbs`, or RDM over them with `verbs;ofi_rxm`), every
/// size from 64 B to 1 MiB with its data checked (`-c`), in transmit mode `mode`: server and
/// client share the device of this host's non-loopback address, named "localhost".
fn fi_pingpong_msg(provider: &str, ep: &str, mode: &str) {
    if !have_fabric() || !have_userns() {
        return;
    }
    let Some(a) = host_addr() else {
        return;
    };
    let port = free_tcp_port().to_string();
    let args = ["-p", provider, "-e", ep, "-m", mode, "-c", "-I", "20"];
    let (mut server, _s) = localhost_cmd(a, "fi_pingpong", &args);
    server.args(["-B", &port]);
    let (mut client, _c) = localhost_cmd(a, "fi_pingpong", &args);
    client.args(["-P", &port]).arg(a.to_string());
    let out = server_client(server, client, port.parse().unwrap(), LIMIT);
    for row in ["64 ", "4k ", "64k ", "1m "] {
        assert!(
            out.lines().any(|l| l.starts_with(row)),
            "no {row:?} row:\n{out}"
        );
    }
}

#[test]
fn fi_pingpong_verbs_msg() {
    fi_pingpong_msg("verbs", "msg", "msg");
}

/// RDM over MSG endpoints: ofi_rxm sizes one verbs CQ for its whole universe of peers (256
/// by default) times the queue depth, which needs a `max_cqe` past 65,536.
#[test]
fn fi_pingpong_verbs_rxm_rdm() {
    fi_pingpong_msg("verbs;ofi_rxm", "rdm", "msg");
}

#[test]
fn fi_pingpong_verbs_rxm_rdm_tagged() {
    fi_pingpong_msg("verbs;ofi_rxm", "rdm", "tagged");
}

/// Given a node (this host's non-loopback address), the verbs provider offers the MSG
/// endpoints of that address's device, and `verbs;ofi_rxm` RDM endpoints over them.
#[test]
fn fi_info_msg_and_rxm_with_a_node() {
    if !have_fabric() {
        return;
    }
    let Some(a) = host_addr() else {
        return;
    };
    for (prov, ty, proto) in [
        ("verbs", "FI_EP_MSG", "FI_PROTO_RDMA_CM_IB_RC"),
        ("verbs;ofi_rxm", "FI_EP_RDM", "FI_PROTO_RXM"),
    ] {
        let mut c = fabric_cmd("fi_info", unique_addr());
        c.args(["-p", prov, "-t", ty, "-n"]).arg(a.to_string());
        let (st, out, err) = run_bounded(c, LIMIT);
        assert!(st.is_some_and(|s| s.success()), "{prov}: {out}\n{err}");
        let want = [
            format!("provider: {prov}"),
            format!("type: {ty}"),
            format!("protocol: {proto}"),
        ];
        for w in want {
            assert!(out.contains(&w), "{prov}: no {w:?} in\n{out}");
        }
        assert!(!out.contains("-dgram"), "{prov}: {out}");
    }
}

/// Whether Debian's Open MPI (`mpirun`, and `mpicc` to build the test program) is installed.
fn have_mpi() -> bool {
    have("/usr/bin/mpirun", "openmpi-bin")
        && have("/usr/bin/mpicc", "libopenmpi-dev")
        && have_userns()
}

/// The hang guard of an MPI run (never a timing assertion): up to four ranks busy-poll on
/// the two cores of a CI machine that runs other tests at the same time.
const MPI_LIMIT: Duration = Duration::from_secs(240);

/// Builds tests/c/mpi_check.c with Open MPI's `mpicc` (its libraries load the drop-in
/// libibverbs.so.1 at run time through `LD_LIBRARY_PATH`); returns the program's path.
fn mpi_check_program() -> PathBuf {
    let exe = libdir().join(format!("mpi_check-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let out = Command::new("mpicc")
        .args(["-O1", "-g", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running mpicc");
    assert!(
        out.status.success(),
        "mpicc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs tests/c/mpi_check.c under Open MPI with `ranks` ranks on this host, every rank on
/// the one softrdma device `srdma_ucx` (a fresh address): MPI's point-to-point and one-sided
/// traffic goes through UCX (`pml ucx`, `osc ucx`) over `rc_verbs` (with `ud_verbs` as its auxiliary transport, and
/// `self`), with no shared-memory transport of Open MPI's (`btl self` only) or UCX's
/// (`UCX_TLS` lists none), so every byte between ranks crosses softrdma. `wire`: the ranks
/// talk over RoCEv2 packets (`SOFTRDMA_TRANSPORT=wire`), each capturing its own to a pcap
/// file that tshark (when installed; required in CI) must decode, with RDMA READs among
/// them (UCX fetches large messages with them); otherwise through the same-host lanes.
/// Returns rank 0's output.
fn mpi_check(ranks: usize, wire: bool) -> Option<String> {
    if !have_mpi() {
        return None;
    }
    let exe = mpi_check_program();
    let _exe = TempPath(exe.clone());
    let pcaps = TempPath::new("mpi-pcap");
    let np = ranks.to_string();
    let mut args: Vec<String> = [
        "mpirun",
        "--oversubscribe",
        "-np",
        &np,
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "osc",
        "ucx",
        "--mca",
        "btl",
        "self",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for v in [
        "LD_LIBRARY_PATH",
        "SOFTRDMA_DEVICES",
        "UCX_TLS",
        "UCX_NET_DEVICES",
        "UCX_UD_VERBS_ETH_DGID_CHECK",
        "UCX_WARN_UNUSED_ENV_VARS",
    ] {
        args.push("-x".into());
        args.push(v.into());
    }
    if wire {
        args.extend(["-x", "SOFTRDMA_TRANSPORT"].map(String::from));
        std::fs::create_dir_all(&pcaps.0).unwrap();
        // (Each rank its own capture file, named by its rank.)
        args.extend(
            [
                "sh",
                "-c",
                "SOFTRDMA_PCAP=\"$0/$OMPI_COMM_WORLD_RANK.pcap\" exec \"$1\"",
            ]
            .map(String::from),
        );
        args.push(pcaps.0.display().to_string());
    }
    args.push(exe.display().to_string());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let devices = format!("srdma_ucx={}", unique_addr());
    let (mut cmd, _dir) = ucx_cmd(&["srdma_ucx"], &devices, argv[0], &argv[1..]);
    cmd.env("UCX_TLS", "self,rc_verbs,ud_verbs:aux")
        .env("UCX_NET_DEVICES", "srdma_ucx:1")
        .env("UCX_UD_VERBS_ETH_DGID_CHECK", "n")
        .env("SOFTRDMA_TRANSPORT", "wire")
        // (Root inside the test's user namespace.)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    if !wire {
        cmd.env_remove("SOFTRDMA_TRANSPORT");
    }
    let (st, out, err) = run_bounded(cmd, MPI_LIMIT);
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{out}\n{err}");
    assert!(
        out.contains(&format!("mpi_check: ok ({ranks} ranks)")),
        "{out}\n{err}"
    );
    if wire {
        for r in 0..ranks {
            let file = pcaps.0.join(format!("{r}.pcap"));
            let opcodes = pcap_opcodes(&file);
            let _ = std::fs::remove_file(&file);
            let Some(opcodes) = opcodes else {
                continue;
            };
            let n = opcodes.len();
            let count = |want: &[u8]| opcodes.iter().filter(|o| want.contains(o)).count();
            // (RC SEND first/middle/last/only, RDMA WRITE first/middle/last/only, RDMA READ
            // request: 4 MiB messages go as READs between ranks 0 and 1, 1 MiB ones between
            // all in the Bcast; every rank's MPI_Put is a WRITE.)
            let sends = count(&[0, 1, 2, 3, 4, 5]);
            let writes = count(&[6, 7, 8, 9, 10, 11]);
            let reads = count(&[12]);
            let what = format!(
                "rank {r}: {n} packets captured, {sends} SEND, {writes} RDMA WRITE, {reads} READ request"
            );
            eprintln!("{what}");
            assert!(sends > 0 && writes > 0 && reads > 0, "{what}");
        }
    }
    Some(out)
}

/// The BTH opcodes of every packet of the capture `file`, as tshark decodes them (none
/// when tshark is not installed, outside CI). Wireshark's guesses at what an InfiniBand
/// payload carries (RPC over RDMA, SMB Direct, NVMe over RDMA, ...) are off: MPI's
/// messages are none of those, and a guess that fails marks the frame malformed.
fn pcap_opcodes(file: &Path) -> Option<Vec<u8>> {
    let mut tshark = Command::new("tshark");
    if let Ok(o) = Command::new("tshark")
        .args(["-G", "heuristic-decodes"])
        .output()
    {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if let ["infiniband.payload", name, ..] = l.split('\t').collect::<Vec<_>>()[..] {
                tshark.args(["--disable-protocol", name]);
            }
        }
    }
    let out = match tshark
        .arg("-r")
        .arg(file)
        .args([
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "_ws.malformed",
        ])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!(
            "tshark -r {}: {}",
            file.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => {
            assert!(std::env::var_os("CI").is_none(), "CI must install tshark");
            eprintln!("tshark is not installed: the capture is not decoded");
            return None;
        }
    };
    let opcodes = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(f.get(1).is_none_or(|m| m.is_empty()), "malformed: {l}");
            f[0].parse()
                .unwrap_or_else(|_| panic!("not decoded as InfiniBand: {l}"))
        })
        .collect();
    Some(opcodes)
}

/// Open MPI (pml ucx and osc ucx over rc_verbs), two ranks on one device, through the
/// same-host lanes: ping-pong from 1 byte to 4 MiB, a burst of non-blocking sends,
/// collectives, one-sided puts, gets and atomics; every byte checked.
#[test]
fn open_mpi_two_ranks_on_one_device() {
    if let Some(out) = mpi_check(2, false) {
        eprintln!("{out}");
    }
}

/// Open MPI with four ranks on one device over RoCEv2 packets, each rank's traffic captured
/// and decoded (SENDs, RDMA WRITEs and READs among it).
#[test]
fn open_mpi_four_ranks_over_the_wire() {
    if let Some(out) = mpi_check(4, true) {
        eprintln!("{out}");
    }
}
