//! `bench-report` end to end: a small synthetic CSV with known medians, and the binary's
//! behaviour on the fixture and on missing files.

use std::path::PathBuf;
use std::process::Command;

use xtask::data::Dataset;
use xtask::report::{comparison_rows, markdown, targets, Context, Outcome};

/// Known medians: softrdma WRITE 64 KiB 4.2 GB/s against UCX tcp 2.0 (2.1x, target met) and
/// libfabric tcp 5.0 (0.84x, not met); SEND 8 B p50 6.5 µs against UCX tcp 3.25 µs (0.5x, not
/// met); 8-byte rate SEND 1.5, WRITE 1.2 M msg/s (met); libfabric shm failed.
const CSV: &str = "\
group,tool,transport,test,size,rep,metric,value,unit
softrdma,softrdma perf,rc,write_bw,65536,1,bw,4.2,GB/s
softrdma,softrdma perf,rc,write_bw,65536,2,bw,4.4,GB/s
softrdma,softrdma perf,rc,write_bw,65536,3,bw,3.9,GB/s
ucx,ucx_perftest,tcp,ucp_put_bw,65536,1,bw,2.1,GB/s
ucx,ucx_perftest,tcp,ucp_put_bw,65536,2,bw,1.9,GB/s
ucx,ucx_perftest,tcp,ucp_put_bw,65536,3,bw,2.0,GB/s
fi,fi_pingpong,tcp,pingpong,65536,1,bw,5.0,GB/s
fi,fi_pingpong,tcp,pingpong,65536,1,lat,13.1,us
fi,fi_pingpong,shm,pingpong,65536,1,FAIL,NaN,-
softrdma,softrdma perf,rc,send_lat,8,1,lat_p50,6.5,us
softrdma,softrdma perf,rc,send_lat,8,1,lat_p99,20.0,us
softrdma,softrdma perf,rc,send_lat,64,1,lat_p50,6.6,us
ucx,ucx_perftest,tcp,tag_lat,8,1,lat_p50,3.25,us
ucx,ucx_perftest,tcp,tag_lat,8,1,lat_avg,3.5,us
sock,sockperf,tcp,pingpong,64,1,lat_p50,13.2,us
softrdma,softrdma perf,rc,send_bw,8,1,msgrate,1.5,Mmsg/s
softrdma,softrdma perf,rc,send_bw,8,1,bw,0.012,GB/s
softrdma,softrdma perf,rc,write_bw,8,1,msgrate,1.2,Mmsg/s
softrdma,softrdma perf,rc,write_bw,8,1,bw,0.0096,GB/s
ucx,ucx_perftest,tcp,ucp_put_bw,8,1,msgrate,NaN,Mmsg/s
sock,iperf3,tcp,stream_ldefault,131072,1,bw,3.5,GB/s
this line is broken
";

#[test]
fn verdicts_of_a_synthetic_run() {
    let (d, warnings) = Dataset::from_csv(CSV);
    assert_eq!(warnings.len(), 1, "{warnings:?}");

    let rows = comparison_rows(&d);
    let find = |figure: &str, peer: &str| {
        rows.iter()
            .find(|r| r.figure == figure && r.peer.starts_with(peer))
            .unwrap_or_else(|| panic!("no row {figure} / {peer} in {rows:#?}"))
    };
    let r = find("RC WRITE bandwidth, 64 KiB", "UCX tcp `ucp_put_bw`");
    assert_eq!(r.softrdma, "4.20 GB/s");
    assert_eq!(r.peer_value, "2.00 GB/s");
    assert_eq!(r.verdict, "ahead 2.1x");
    let r = find("RC WRITE bandwidth, 64 KiB", "libfabric tcp");
    assert_eq!(r.verdict, "behind 0.84x");
    let r = find("RC WRITE bandwidth, 64 KiB", "libfabric shm");
    assert_eq!((r.peer_value.as_str(), r.ratio), ("failed", None));
    assert_eq!(r.verdict, "peer failed");
    let r = find("RC WRITE bandwidth, 64 KiB", "iperf3");
    assert!(r.peer.contains("at 128 KiB (not 64 KiB)"), "{}", r.peer);
    let r = find("SEND one-way latency p50, 8 B", "UCX tcp `tag_lat`");
    assert_eq!(r.verdict, "behind 0.50x (higher latency)");
    let r = find("SEND one-way latency p50, 64 B", "sockperf tcp");
    assert_eq!(r.verdict, "ahead 2.0x (lower latency)");
    let r = find("RC WRITE message rate, 8 B", "UCX tcp `ucp_put_bw`");
    assert_eq!(r.verdict, "peer failed");
    // Peers that were not run are not listed, and nothing is compared at a size softrdma
    // was not run at (UCX tcp tag_lat has no 64 B, libfabric tcp latency no 8 B).
    assert!(!rows.iter().any(|r| r.peer.contains("posix")));
    assert!(!rows
        .iter()
        .any(|r| r.figure.contains("latency") && r.peer.contains("libfabric")));

    let t = targets(&d);
    assert_eq!(t.len(), 4);
    assert_eq!(t[0].outcome, Outcome::Met, "{:?}", t[0]);
    assert!(
        t[0].margin.starts_with("+0.200 GB/s (+5.00%"),
        "{}",
        t[0].margin
    );
    assert_eq!(t[1].outcome, Outcome::NotMet);
    assert_eq!(t[2].outcome, Outcome::NotMet);
    assert!(
        t[2].margin.starts_with("-3.25 µs (-100%"),
        "{}",
        t[2].margin
    );
    assert_eq!(t[3].outcome, Outcome::Met);
    assert!(t[3].measured.starts_with("1.50 M msg/s (SEND; WRITE 1.20)"));

    let md = markdown(
        &d,
        &Context {
            command: Some("REPS=1 scripts/bench.sh".into()),
            svg: Some("docs/bench.svg".into()),
            ..Context::default()
        },
    );
    assert!(md.contains("Command: `REPS=1 scripts/bench.sh`"));
    assert!(md.contains("| RC WRITE bandwidth, 64 KiB | 4.20 GB/s | UCX tcp `ucp_put_bw` | 2.00 GB/s | 2.1 | ahead 2.1x |"));
    assert!(md.contains("| RC SEND `send_lat` | 8 B | – | – | 6.50 | 20.0 |"));
    assert!(md.contains("| RC WRITE `write_bw` | 64 KiB | 4.20 [3.90–4.40] | – | – | – |"));
    assert!(md.contains("| 8-byte message rate ≥ 1 M msg/s (best of RC SEND and WRITE) | 1.50 M msg/s (SEND; WRITE 1.20) | **met** |"));
    assert!(md.contains("![bandwidth and latency against message size](docs/bench.svg)"));
}

#[test]
fn targets_without_peers_are_unknown() {
    let (d, _) = Dataset::from_csv("softrdma,softrdma perf,rc,write_bw,65536,1,bw,4,GB/s\n");
    let t = targets(&d);
    assert_eq!(
        t[0].outcome,
        Outcome::Unknown("UCX tcp not measured".into())
    );
    assert_eq!(
        t[2].outcome,
        Outcome::Unknown("softrdma not measured, UCX tcp not measured".into())
    );
    assert_eq!(
        t[3].outcome,
        Outcome::Unknown("softrdma not measured".into())
    );
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xtask-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn binary_writes_fragment_and_plot() {
    let dir = scratch("ok");
    let md = dir.join("fragment.md");
    let svg = dir.join("docs/bench.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench-report", "--csv"])
        .arg(fixture("bench.csv"))
        .arg("--versions")
        .arg(fixture("versions.txt"))
        .arg("--out-md")
        .arg(&md)
        .arg("--svg")
        .arg(&svg)
        .args(["--command", "scripts/bench.sh"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.starts_with("Machine: Intel(R) Xeon(R) CPU @ 2.20GHz, nproc 2, 23.5 GiB"));
    assert!(text.contains("Linux 6.1.0-28-amd64"));
    assert!(text.contains("### A. softrdma"));
    assert!(text.contains("### B. softrdma against each peer, same run, medians"));
    assert!(text.contains("### C. Targets"));
    assert!(text.contains("libfabric shm `fi_pingpong` | failed | – | peer failed |"));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert!(plot.contains("softrdma RC WRITE") && plot.contains("UCX tcp put_bw"));
    assert!(plot.contains("libfabric shm pingpong (failed)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn binary_fails_cleanly_on_missing_files() {
    let dir = scratch("missing");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench-report", "--csv"])
        .arg(dir.join("nope.csv"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: cannot read the results CSV"),
        "{err}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench-report", "--csv"])
        .arg(fixture("bench.csv"))
        .arg("--versions")
        .arg(dir.join("nope.txt"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the versions file"));
}

#[test]
fn binary_warns_about_malformed_lines_and_goes_on() {
    let dir = scratch("warn");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("r.csv");
    std::fs::write(&csv, CSV).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench-report", "--csv"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning:") && err.contains("line 23"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("### C. Targets"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_input_neither_panics_nor_fails() {
    let csv = "\
softrdma,softrdma perf,rc,write_bw,0,1,bw,1,GB/s
softrdma,softrdma perf,rc,write_bw,18446744073709551615,1,bw,1e300,GB/s
softrdma,softrdma perf,rc,write_bw,65536,1,bw,-3,GB/s
softrdma,softrdma perf,rc,send_lat,8,1,lat_p50,1e-300,us
ucx,ucx_perftest,tcp,ucp_put_bw,65536,1,bw,0,GB/s
ucx,ucx_perftest,tcp,tag_lat,8,1,lat_p50,inf,us
\"unterminated,quote
,,,,,,,,
a,b,c,d,-1,1,bw,1,GB/s
a,b,c,d,1,1,bw,1,GB/s,extra
\u{feff}group,tool
";
    let dir = scratch("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.csv");
    std::fs::write(&path, csv).unwrap();
    let mut warnings = Vec::new();
    let opts = xtask::BenchReport {
        csv: path,
        svg: Some(dir.join("p.svg")),
        ..Default::default()
    };
    let md = xtask::bench_report(&opts, &mut |w| warnings.push(w.to_string())).unwrap();
    assert_eq!(warnings.len(), 5, "{warnings:#?}");
    assert!(md.contains("no ratio (a median ≤ 0)"));
    assert!(md.contains("| 8-byte SEND one-way latency p50 ≤ UCX tcp `tag_lat` p50 | – | unknown: UCX tcp failed | – |"));
    let svg = std::fs::read_to_string(dir.join("p.svg")).unwrap();
    assert!(svg.trim_end().ends_with("</svg>"));
    let _ = std::fs::remove_dir_all(&dir);
}
