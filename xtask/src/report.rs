//! The markdown fragment: softrdma's figures (table A), softrdma against each peer (table B)
//! and the targets of the data-path issue (table C).

use crate::data::{Dataset, Samples, Series};
use crate::machine::Machine;
use crate::stats::{fmt_num, fmt_ratio, fmt_size, ratio, verdict, Better, Summary};

/// softrdma's tool column.
pub const SR_TOOL: &str = "softrdma perf";
/// softrdma's transport column.
pub const SR_TRANSPORT: &str = "rc";

/// A softrdma series of `softrdma perf` over RC.
pub const fn sr(test: &'static str, metric: &'static str) -> Series<'static> {
    Series::new(SR_TOOL, SR_TRANSPORT, test, metric)
}

/// Which sizes a comparison is made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sizes {
    /// Every size both softrdma and the peer were run at.
    Common,
    /// Each of the peer's sizes, against softrdma at the same size or the nearest one.
    Nearest,
    /// One size only, where both were run.
    Only(u64),
}

/// A peer series with its name in the tables.
struct Peer {
    series: Series<'static>,
    label: &'static str,
}

const fn peer(
    tool: &'static str,
    transport: &'static str,
    test: &'static str,
    metric: &'static str,
    label: &'static str,
) -> Peer {
    Peer {
        series: Series::new(tool, transport, test, metric),
        label,
    }
}

/// One softrdma figure against a list of peers.
struct Comparison {
    /// Rows of comparisons with the same `order` are listed together, by size.
    order: u8,
    figure: &'static str,
    sr: Series<'static>,
    better: Better,
    unit: &'static str,
    sizes: Sizes,
    peers: Vec<Peer>,
}

const GBS: &str = "GB/s";
const MMS: &str = "M msg/s";
const US: &str = "µs";

fn comparisons() -> Vec<Comparison> {
    use Better::{Higher, Lower};
    vec![
        Comparison {
            order: 0,
            figure: "RC WRITE bandwidth",
            sr: sr("write_bw", "bw"),
            better: Higher,
            unit: GBS,
            sizes: Sizes::Common,
            peers: vec![
                peer(
                    "ucx_perftest",
                    "tcp",
                    "ucp_put_bw",
                    "bw",
                    "UCX tcp `ucp_put_bw`",
                ),
                peer(
                    "ucx_perftest",
                    "posix",
                    "ucp_put_bw",
                    "bw",
                    "UCX posix `ucp_put_bw`",
                ),
                peer(
                    "fi_pingpong",
                    "tcp",
                    "pingpong",
                    "bw",
                    "libfabric tcp `fi_pingpong`",
                ),
                peer(
                    "fi_pingpong",
                    "shm",
                    "pingpong",
                    "bw",
                    "libfabric shm `fi_pingpong`",
                ),
                peer("memcpy_bw", "self", "memcpy", "bw", "memcpy (1 thread)"),
            ],
        },
        Comparison {
            order: 0,
            figure: "RC WRITE bandwidth",
            sr: sr("write_bw", "bw"),
            better: Higher,
            unit: GBS,
            sizes: Sizes::Nearest,
            peers: vec![
                peer(
                    "iperf3",
                    "tcp",
                    "stream_ldefault",
                    "bw",
                    "iperf3 tcp stream (default `-l`)",
                ),
                peer(
                    "iperf3",
                    "tcp",
                    "stream_l1M",
                    "bw",
                    "iperf3 tcp stream (`-l 1M`)",
                ),
                peer("qperf", "tcp", "tcp_bw", "bw", "qperf `tcp_bw`"),
            ],
        },
        Comparison {
            order: 1,
            figure: "RC SEND bandwidth",
            sr: sr("send_bw", "bw"),
            better: Higher,
            unit: GBS,
            sizes: Sizes::Common,
            peers: vec![
                peer("ucx_perftest", "tcp", "tag_bw", "bw", "UCX tcp `tag_bw`"),
                peer(
                    "ucx_perftest",
                    "tcp",
                    "ucp_am_bw",
                    "bw",
                    "UCX tcp `ucp_am_bw`",
                ),
            ],
        },
        Comparison {
            order: 2,
            figure: "RC WRITE message rate",
            sr: sr("write_bw", "msgrate"),
            better: Higher,
            unit: MMS,
            sizes: Sizes::Only(8),
            peers: vec![
                peer(
                    "ucx_perftest",
                    "tcp",
                    "ucp_put_bw",
                    "msgrate",
                    "UCX tcp `ucp_put_bw`",
                ),
                peer(
                    "ucx_perftest",
                    "tcp",
                    "tag_bw",
                    "msgrate",
                    "UCX tcp `tag_bw`",
                ),
            ],
        },
        Comparison {
            order: 3,
            figure: "RC SEND message rate",
            sr: sr("send_bw", "msgrate"),
            better: Higher,
            unit: MMS,
            sizes: Sizes::Only(8),
            peers: vec![
                peer(
                    "ucx_perftest",
                    "tcp",
                    "tag_bw",
                    "msgrate",
                    "UCX tcp `tag_bw`",
                ),
                peer(
                    "ucx_perftest",
                    "tcp",
                    "ucp_put_bw",
                    "msgrate",
                    "UCX tcp `ucp_put_bw`",
                ),
            ],
        },
        Comparison {
            order: 4,
            figure: "SEND one-way latency p50",
            sr: sr("send_lat", "lat_p50"),
            better: Lower,
            unit: US,
            sizes: Sizes::Common,
            peers: vec![
                peer(
                    "ucx_perftest",
                    "tcp",
                    "tag_lat",
                    "lat_p50",
                    "UCX tcp `tag_lat` p50",
                ),
                peer(
                    "ucx_perftest",
                    "posix",
                    "tag_lat",
                    "lat_p50",
                    "UCX posix `tag_lat` p50",
                ),
                peer(
                    "fi_pingpong",
                    "tcp",
                    "pingpong",
                    "lat",
                    "libfabric tcp `fi_pingpong`",
                ),
                peer(
                    "fi_pingpong",
                    "udp",
                    "pingpong",
                    "lat",
                    "libfabric udp `fi_pingpong`",
                ),
                peer(
                    "fi_pingpong",
                    "shm",
                    "pingpong",
                    "lat",
                    "libfabric shm `fi_pingpong`",
                ),
            ],
        },
        Comparison {
            order: 4,
            figure: "SEND one-way latency p50",
            sr: sr("send_lat", "lat_p50"),
            better: Lower,
            unit: US,
            sizes: Sizes::Nearest,
            peers: vec![
                peer(
                    "sockperf",
                    "tcp",
                    "pingpong",
                    "lat_p50",
                    "sockperf tcp ping-pong p50",
                ),
                peer(
                    "sockperf",
                    "udp",
                    "pingpong",
                    "lat_p50",
                    "sockperf udp ping-pong p50",
                ),
                peer(
                    "qperf",
                    "tcp",
                    "tcp_lat",
                    "latency",
                    "qperf `tcp_lat` (mean)",
                ),
                peer(
                    "qperf",
                    "udp",
                    "udp_lat",
                    "latency",
                    "qperf `udp_lat` (mean)",
                ),
            ],
        },
        Comparison {
            order: 5,
            figure: "RC WRITE one-way latency p50",
            sr: sr("write_lat", "lat_p50"),
            better: Lower,
            unit: US,
            sizes: Sizes::Common,
            peers: vec![peer(
                "ucx_perftest",
                "tcp",
                "ucp_put_lat",
                "lat_p50",
                "UCX tcp `ucp_put_lat` p50",
            )],
        },
    ]
}

/// One row of table B.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The figure and softrdma's message size, e.g. `RC WRITE bandwidth, 64 KiB`.
    pub figure: String,
    /// softrdma's median with its unit, or `failed`.
    pub softrdma: String,
    /// The peer, with its message size when it differs from softrdma's.
    pub peer: String,
    /// The peer's median with its unit, or `failed`.
    pub peer_value: String,
    /// The ratio (more than 1: softrdma is better), when both have a median.
    pub ratio: Option<f64>,
    /// `ahead 2.3x`, `behind 0.41x (higher latency)`, `peer failed`, ...
    pub verdict: String,
}

/// A median with its unit, `failed`, plus the failed repetitions if some failed.
fn median_cell(s: &Samples, unit: &str) -> String {
    match Summary::of(s) {
        None => "failed".to_string(),
        Some(sum) if sum.failed > 0 => format!(
            "{} {unit} ({} of {} failed)",
            fmt_num(sum.median),
            sum.failed,
            sum.failed + sum.n
        ),
        Some(sum) => format!("{} {unit}", fmt_num(sum.median)),
    }
}

/// The size of `sizes` nearest to `size` on a log scale (the smaller one on a tie).
fn nearest(sizes: &[u64], size: u64) -> Option<u64> {
    let dist = |s: u64| ((s.max(1) as f64).log2() - (size.max(1) as f64).log2()).abs();
    sizes
        .iter()
        .copied()
        .min_by(|&a, &b| dist(a).total_cmp(&dist(b)).then(a.cmp(&b)))
}

/// Table B's rows: every comparison the CSV holds both sides of, in table order.
pub fn comparison_rows(d: &Dataset) -> Vec<Row> {
    // (comparison order, softrdma size, comparison, peer, peer size): the table's order.
    type Key = (u8, u64, usize, usize, u64);
    let mut keyed: Vec<(Key, Row)> = Vec::new();
    for (ci, c) in comparisons().iter().enumerate() {
        let sr_sizes = d.sizes(c.sr);
        for (pi, p) in c.peers.iter().enumerate() {
            for psize in d.sizes(p.series) {
                let ssize = match c.sizes {
                    Sizes::Common => Some(psize).filter(|s| sr_sizes.contains(s)),
                    Sizes::Only(only) => {
                        Some(psize).filter(|&s| s == only && sr_sizes.contains(&s))
                    }
                    Sizes::Nearest => nearest(&sr_sizes, psize),
                };
                let Some(ssize) = ssize else { continue };
                let ss = d.samples(c.sr, ssize);
                let ps = d.samples(p.series, psize);
                if ss.is_absent() || ps.is_absent() {
                    continue;
                }
                let peer = if psize == ssize {
                    p.label.to_string()
                } else {
                    format!(
                        "{} at {} (not {})",
                        p.label,
                        fmt_size(psize),
                        fmt_size(ssize)
                    )
                };
                let (sm, pm) = (Summary::of(&ss), Summary::of(&ps));
                let r = match (sm, pm) {
                    (Some(a), Some(b)) => ratio(a.median, b.median, c.better),
                    _ => None,
                };
                let verdict = match (sm, pm, r) {
                    (_, _, Some(r)) => verdict(r, c.better),
                    (None, None, _) => "both failed".to_string(),
                    (None, _, _) => "softrdma failed".to_string(),
                    (_, None, _) => "peer failed".to_string(),
                    _ => "no ratio (a median ≤ 0)".to_string(),
                };
                let row = Row {
                    figure: format!("{}, {}", c.figure, fmt_size(ssize)),
                    softrdma: median_cell(&ss, c.unit),
                    peer,
                    peer_value: median_cell(&ps, c.unit),
                    ratio: r,
                    verdict,
                };
                keyed.push(((c.order, ssize, ci, pi, psize), row));
            }
        }
    }
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, r)| r).collect()
}

/// How a target came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Met, with room to spare (or exactly).
    Met,
    /// Not met.
    NotMet,
    /// Not measured in this run, or failed: why.
    Unknown(String),
}

/// One row of table C.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The target, as the issue states it.
    pub target: String,
    /// The medians it is judged on.
    pub measured: String,
    /// Met or not.
    pub outcome: Outcome,
    /// How far past (+) or short of (-) the threshold, absolute and relative to it.
    pub margin: String,
}

/// The margin of `value` over `threshold`, absolute and relative to the threshold, both
/// positive when the target is met (above it for [`Better::Higher`], below for
/// [`Better::Lower`]).
pub fn margin(value: f64, threshold: f64, better: Better) -> (f64, f64) {
    let abs = match better {
        Better::Higher => value - threshold,
        Better::Lower => threshold - value,
    };
    (abs, abs / threshold)
}

fn signed(v: f64) -> String {
    if v < 0.0 {
        format!("-{}", fmt_num(-v))
    } else {
        format!("+{}", fmt_num(v))
    }
}

/// Judges `value` against `threshold` and fills the outcome and margin of a target.
fn judged(
    target: String,
    measured: String,
    value: f64,
    threshold: f64,
    better: Better,
    unit: &str,
) -> Target {
    let (abs, rel) = margin(value, threshold, better);
    let bound = match better {
        Better::Higher => "≥",
        Better::Lower => "≤",
    };
    Target {
        target,
        measured,
        outcome: if abs >= 0.0 {
            Outcome::Met
        } else {
            Outcome::NotMet
        },
        margin: if rel.is_finite() {
            format!(
                "{} {unit} ({}%; needs {bound} {} {unit})",
                signed(abs),
                signed(rel * 100.0),
                fmt_num(threshold)
            )
        } else {
            format!(
                "{} {unit} (needs {bound} {} {unit})",
                signed(abs),
                fmt_num(threshold)
            )
        },
    }
}

/// Why a figure has no median: `not measured` or `failed`.
fn missing(name: &str, s: &Samples) -> String {
    if s.is_absent() {
        format!("{name} not measured")
    } else {
        format!("{name} failed")
    }
}

/// A target that sets softrdma against a peer at one size.
struct PeerTarget<'a> {
    text: &'a str,
    sr: Series<'a>,
    peer: Series<'a>,
    peer_name: &'a str,
    size: u64,
    /// Met when softrdma is at least (most, for latency) `factor` × the peer.
    factor: f64,
    better: Better,
    unit: &'a str,
}

/// Judges a [`PeerTarget`] on the medians of the run.
fn against_peer(d: &Dataset, t: &PeerTarget<'_>) -> Target {
    let (ss, ps) = (d.samples(t.sr, t.size), d.samples(t.peer, t.size));
    let unit = t.unit;
    match (Summary::of(&ss), Summary::of(&ps)) {
        (Some(a), Some(b)) => {
            let r = ratio(a.median, b.median, t.better)
                .map_or("no ratio".to_string(), |r| format!("{}x", fmt_num(r)));
            let measured = format!(
                "softrdma {} {unit}, {} {} {unit}: {r}",
                fmt_num(a.median),
                t.peer_name,
                fmt_num(b.median)
            );
            let threshold = t.factor * b.median;
            judged(
                t.text.to_string(),
                measured,
                a.median,
                threshold,
                t.better,
                unit,
            )
        }
        (a, b) => {
            let mut why = Vec::new();
            if a.is_none() {
                why.push(missing("softrdma", &ss));
            }
            if b.is_none() {
                why.push(missing(t.peer_name, &ps));
            }
            Target {
                target: t.text.to_string(),
                measured: "–".to_string(),
                outcome: Outcome::Unknown(why.join(", ")),
                margin: "–".to_string(),
            }
        }
    }
}

/// Table C: the targets of the data-path issue, judged on this run's medians.
pub fn targets(d: &Dataset) -> Vec<Target> {
    let put_bw = Series::new("ucx_perftest", "tcp", "ucp_put_bw", "bw");
    let fi_bw = Series::new("fi_pingpong", "tcp", "pingpong", "bw");
    let tag_lat = Series::new("ucx_perftest", "tcp", "tag_lat", "lat_p50");
    let mut out = vec![
        against_peer(
            d,
            &PeerTarget {
                text: "RC WRITE bandwidth at 64 KiB ≥ 2x UCX tcp `ucp_put_bw`",
                sr: sr("write_bw", "bw"),
                peer: put_bw,
                peer_name: "UCX tcp",
                size: 65536,
                factor: 2.0,
                better: Better::Higher,
                unit: GBS,
            },
        ),
        against_peer(
            d,
            &PeerTarget {
                text: "RC WRITE bandwidth at 64 KiB ≥ libfabric tcp (`fi_pingpong` bw)",
                sr: sr("write_bw", "bw"),
                peer: fi_bw,
                peer_name: "libfabric tcp",
                size: 65536,
                factor: 1.0,
                better: Better::Higher,
                unit: GBS,
            },
        ),
        against_peer(
            d,
            &PeerTarget {
                text: "8-byte SEND one-way latency p50 ≤ UCX tcp `tag_lat` p50",
                sr: sr("send_lat", "lat_p50"),
                peer: tag_lat,
                peer_name: "UCX tcp",
                size: 8,
                factor: 1.0,
                better: Better::Lower,
                unit: US,
            },
        ),
    ];
    // Message rate: the better of SEND and WRITE at 8 bytes.
    let target = "8-byte message rate ≥ 1 M msg/s (best of RC SEND and WRITE)".to_string();
    let rates: Vec<(&str, Samples)> = [("SEND", "send_bw"), ("WRITE", "write_bw")]
        .into_iter()
        .map(|(name, test)| (name, d.samples(sr(test, "msgrate"), 8)))
        .collect();
    let medians: Vec<(&str, f64)> = rates
        .iter()
        .filter_map(|(n, s)| Summary::of(s).map(|m| (*n, m.median)))
        .collect();
    let best = medians.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
    out.push(match best {
        Some((name, v)) => {
            let others: Vec<String> = medians
                .iter()
                .filter(|(n, _)| *n != name)
                .map(|(n, m)| format!("{n} {}", fmt_num(*m)))
                .collect();
            let measured = if others.is_empty() {
                format!("{} {MMS} ({name})", fmt_num(v))
            } else {
                format!("{} {MMS} ({name}; {})", fmt_num(v), others.join(", "))
            };
            judged(target, measured, v, 1.0, Better::Higher, MMS)
        }
        None => Target {
            target,
            measured: "–".to_string(),
            outcome: Outcome::Unknown(
                if rates.iter().all(|(_, s)| s.is_absent()) {
                    "softrdma not measured"
                } else {
                    "softrdma failed"
                }
                .to_string(),
            ),
            margin: "–".to_string(),
        },
    });
    out
}

/// The order of softrdma's tests in table A (others follow in name order).
const SR_TEST_ORDER: [&str; 5] = ["write_bw", "read_bw", "send_bw", "send_lat", "write_lat"];

/// `RC WRITE (write_bw)` from `write_bw`.
fn test_name(test: &str) -> String {
    let op = test.split('_').next().unwrap_or(test).to_uppercase();
    format!("RC {op} `{test}`")
}

/// Escapes what would break a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A markdown table.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for r in rows {
        let cells: Vec<String> = r.iter().map(|c| cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// A command as a markdown code span (longer fences when it holds backticks).
fn code_span(s: &str) -> String {
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// What goes into the fragment besides the data.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The machine, from the versions file.
    pub machine: Machine,
    /// The exact command of the run.
    pub command: Option<String>,
    /// The plot's path relative to the repository root, when there is a plot.
    pub svg: Option<String>,
}

/// The whole markdown fragment.
pub fn markdown(d: &Dataset, ctx: &Context) -> String {
    let mut out = String::new();
    let command = ctx
        .command
        .as_deref()
        .map_or("not recorded".to_string(), code_span);
    out.push_str(&format!(
        "Machine: {}. Command: {command}\n",
        ctx.machine.describe()
    ));
    if !ctx.machine.packages.is_empty() {
        let p: Vec<String> = ctx
            .machine
            .packages
            .iter()
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        out.push_str(&format!("Peers (Debian packages): {}.\n", p.join(", ")));
    }
    let reps = d.reps("softrdma");
    out.push_str(&format!(
        "\nMedians [min–max] over {reps} repetition{} per figure, softrdma and the peers \
         interleaved in the same invocation. 1 GB = 10^9 bytes; latency is one-way \
         (round trip ÷ 2).\n",
        if reps == 1 { "" } else { "s" }
    ));

    // Table A.
    out.push_str("\n### A. softrdma\n\n");
    let mut tests = d.tests(SR_TOOL, SR_TRANSPORT);
    tests.sort_by_key(|t| {
        (
            SR_TEST_ORDER
                .iter()
                .position(|o| o == t)
                .unwrap_or(SR_TEST_ORDER.len()),
            t.clone(),
        )
    });
    let metrics = ["bw", "msgrate", "lat_p50", "lat_p99"];
    let mut rows = Vec::new();
    for t in &tests {
        let mut sizes: Vec<u64> = metrics.iter().flat_map(|m| d.sizes(sr_dyn(t, m))).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for s in sizes {
            let mut row = vec![test_name(t), fmt_size(s)];
            for m in metrics {
                let samples = d.samples(sr_dyn(t, m), s);
                row.push(match Summary::of(&samples) {
                    Some(sum) => sum.cell(),
                    None if samples.is_failed() => "failed".to_string(),
                    None => "–".to_string(),
                });
            }
            rows.push(row);
        }
    }
    if rows.is_empty() {
        out.push_str("_No softrdma rows in the CSV._\n");
    } else {
        table(
            &mut out,
            &[
                "test",
                "size",
                "bandwidth (GB/s)",
                "message rate (M msg/s)",
                "latency p50 (µs)",
                "latency p99 (µs)",
            ],
            &rows,
        );
    }

    // Table B.
    out.push_str("\n### B. softrdma against each peer, same run, medians\n\n");
    let comps = comparison_rows(d);
    if comps.is_empty() {
        out.push_str("_No peer was measured at a size softrdma was._\n");
    } else {
        out.push_str(
            "Ratio: more than 1 means softrdma is better (softrdma ÷ peer for bandwidth and \
             message rate, peer ÷ softrdma for latency).\n\n",
        );
        let rows: Vec<Vec<String>> = comps
            .iter()
            .map(|r| {
                vec![
                    r.figure.clone(),
                    r.softrdma.clone(),
                    r.peer.clone(),
                    r.peer_value.clone(),
                    r.ratio.map_or("–".to_string(), fmt_ratio),
                    r.verdict.clone(),
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "figure",
                "softrdma median",
                "peer",
                "peer median",
                "ratio",
                "verdict",
            ],
            &rows,
        );
        let mut notes = Vec::new();
        if comps.iter().any(|r| r.peer.contains("fi_pingpong")) {
            notes.push(
                "libfabric's `fi_pingpong` is a ping-pong: its bandwidth is the message size ÷ \
                 the one-way time.",
            );
        }
        if comps.iter().any(|r| r.peer.contains(" (not ")) {
            notes.push(
                "A peer run at a size softrdma was not is set against softrdma at the nearest \
                 size (named in the peer column).",
            );
        }
        if comps.iter().any(|r| r.peer.contains("qperf `")) {
            notes.push("qperf reports a mean latency, not a median of the round trips.");
        }
        if !notes.is_empty() {
            out.push('\n');
            out.push_str(&notes.join(" "));
            out.push('\n');
        }
    }

    // Table C.
    out.push_str("\n### C. Targets\n\n");
    let rows: Vec<Vec<String>> = targets(d)
        .into_iter()
        .map(|t| {
            let result = match &t.outcome {
                Outcome::Met => "**met**".to_string(),
                Outcome::NotMet => "**not met**".to_string(),
                Outcome::Unknown(why) => format!("unknown: {why}"),
            };
            vec![t.target, t.measured, result, t.margin]
        })
        .collect();
    table(
        &mut out,
        &[
            "target",
            "measured (medians)",
            "result",
            "margin (+: to spare)",
        ],
        &rows,
    );

    if let Some(svg) = &ctx.svg {
        out.push_str(&format!(
            "\n![bandwidth and latency against message size]({svg})\n"
        ));
    }
    out
}

/// A softrdma series named at run time (table A walks the tests the CSV has).
fn sr_dyn<'a>(test: &'a str, metric: &'a str) -> Series<'a> {
    Series::new(SR_TOOL, SR_TRANSPORT, test, metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_sizes() {
        let s = [8, 64, 512, 4096, 65536, 262144, 1048576];
        assert_eq!(nearest(&s, 64), Some(64));
        assert_eq!(
            nearest(&s, 131072),
            Some(65536),
            "a tie goes to the smaller"
        );
        assert_eq!(nearest(&s, 100), Some(64));
        assert_eq!(nearest(&s, 1 << 26), Some(1048576));
        assert_eq!(nearest(&[], 64), None);
    }

    #[test]
    fn margins_are_positive_when_met() {
        let (a, r) = margin(4.09, 4.66, Better::Higher);
        assert!(a < 0.0 && (r + 0.1223).abs() < 1e-3);
        let (a, r) = margin(3.0, 4.0, Better::Lower);
        assert_eq!((a, r), (1.0, 0.25));
        let (a, _) = margin(1.0, 1.0, Better::Higher);
        assert_eq!(a, 0.0);
    }
}
