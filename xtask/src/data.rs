//! The benchmark CSV: parsing and look-ups.
//!
//! The CSV is the one `../shared/anchors/run_anchors.sh` writes (and `scripts/bench.sh`
//! appends softrdma's rows to): header `group,tool,transport,test,size,rep,metric,value,unit`,
//! one sample per line. A failed peer run is a row whose metric is `FAIL` (value `NaN`); a
//! measurement the harness could not parse has the value `NaN` (or nothing).

use std::collections::{BTreeMap, BTreeSet};

/// The header line the harness writes (it may be repeated when files are concatenated).
pub const HEADER: &str = "group,tool,transport,test,size,rep,metric,value,unit";

/// One sample: one line of the CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The group of tools (`softrdma`, `ucx`, `fi`, `sock`, `memcpy`).
    pub group: String,
    /// The tool (`softrdma perf`, `ucx_perftest`, `fi_pingpong`, `iperf3`, ...).
    pub tool: String,
    /// The transport or provider (`rc`, `tcp`, `posix`, `shm`, ...).
    pub transport: String,
    /// The test (`write_bw`, `ucp_put_bw`, `pingpong`, ...).
    pub test: String,
    /// The message size in bytes.
    pub size: u64,
    /// The repetition, as written (usually 1, 2, 3).
    pub rep: String,
    /// The metric (`bw`, `msgrate`, `lat_p50`, ...; `FAIL` for a failed run).
    pub metric: String,
    /// The value; NaN when the measurement failed.
    pub value: f64,
    /// The unit (`GB/s`, `Mmsg/s`, `us`, ...).
    pub unit: String,
}

/// What [`parse_csv`] found: the records and one warning per line it skipped.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The well-formed rows, in file order.
    pub records: Vec<Record>,
    /// One message per skipped line (with its line number).
    pub warnings: Vec<String>,
}

/// Splits one CSV line into fields. Double-quoted fields may contain commas and `""` for a
/// quote; whitespace around fields is trimmed.
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' if quoted => quoted = false,
            '"' if cur.trim().is_empty() => {
                cur.clear();
                quoted = true;
            }
            ',' if !quoted => fields.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    fields.push(cur.trim().to_string());
    fields
}

/// Parses a value: a number, `NaN`, or nothing (also NaN: the harness writes an empty value
/// when it could not read a tool's output). Infinite values count as failures too.
fn parse_value(s: &str) -> Option<f64> {
    if s.is_empty() || s == "-" {
        return Some(f64::NAN);
    }
    let v: f64 = s.parse().ok()?;
    Some(if v.is_finite() { v } else { f64::NAN })
}

/// Parses the CSV text. Never fails: blank lines and header lines are skipped silently, a
/// malformed line (wrong number of fields, a size or value that is not a number) is skipped
/// with a warning.
pub fn parse_csv(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = raw.trim_start_matches('\u{feff}').trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f = split_fields(line);
        if f.first().map(String::as_str) == Some("group") {
            if line.replace(' ', "") != HEADER {
                out.warnings.push(format!(
                    "line {lineno}: unexpected header `{line}` (ignored)"
                ));
            }
            continue;
        }
        if f.len() != 9 {
            out.warnings.push(format!(
                "line {lineno}: {} fields instead of 9, skipped: `{line}`",
                f.len()
            ));
            continue;
        }
        let Ok(size) = f[4].parse::<u64>() else {
            out.warnings.push(format!(
                "line {lineno}: size `{}` is not a whole number, skipped",
                f[4]
            ));
            continue;
        };
        let Some(value) = parse_value(&f[7]) else {
            out.warnings.push(format!(
                "line {lineno}: value `{}` is not a number, skipped",
                f[7]
            ));
            continue;
        };
        if [0, 1, 2, 3, 6].iter().any(|&k| f[k].is_empty()) {
            out.warnings.push(format!(
                "line {lineno}: an empty name field, skipped: `{line}`"
            ));
            continue;
        }
        let mut f = f.into_iter();
        let mut next = || f.next().unwrap_or_default();
        let (group, tool, transport, test) = (next(), next(), next(), next());
        let _size = next();
        let (rep, metric, _value, unit) = (next(), next(), next(), next());
        out.records.push(Record {
            group,
            tool,
            transport,
            test,
            size,
            rep,
            metric,
            value,
            unit,
        });
    }
    out
}

/// Names one measured series: a tool's test over a transport, and one of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series<'a> {
    /// The tool column (`softrdma perf`, `ucx_perftest`, ...).
    pub tool: &'a str,
    /// The transport column.
    pub transport: &'a str,
    /// The test column.
    pub test: &'a str,
    /// The metric column.
    pub metric: &'a str,
}

impl<'a> Series<'a> {
    /// A series by its four names.
    pub const fn new(tool: &'a str, transport: &'a str, test: &'a str, metric: &'a str) -> Self {
        Series {
            tool,
            transport,
            test,
            metric,
        }
    }
}

/// The samples of one series at one size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// The finite values, in file order.
    pub values: Vec<f64>,
    /// How many repetitions failed (a `FAIL` row of the test, or a NaN value of the metric).
    pub failed: usize,
}

impl Samples {
    /// True when the series was not run at this size at all.
    pub fn is_absent(&self) -> bool {
        self.values.is_empty() && self.failed == 0
    }

    /// True when it was run but no repetition gave a value.
    pub fn is_failed(&self) -> bool {
        self.values.is_empty() && self.failed > 0
    }
}

type TestKey = (String, String, String);

/// The records, indexed by series and size.
#[derive(Debug, Default)]
pub struct Dataset {
    /// (tool, transport, test) -> metric -> size -> values (NaN included).
    values: BTreeMap<TestKey, BTreeMap<String, BTreeMap<u64, Vec<f64>>>>,
    /// (tool, transport, test) -> size -> number of FAIL rows.
    fails: BTreeMap<TestKey, BTreeMap<u64, usize>>,
    /// group -> distinct repetitions seen.
    reps: BTreeMap<String, BTreeSet<String>>,
}

fn key(tool: &str, transport: &str, test: &str) -> TestKey {
    (tool.to_string(), transport.to_string(), test.to_string())
}

impl Dataset {
    /// Indexes the records.
    pub fn new(records: &[Record]) -> Self {
        let mut d = Dataset::default();
        for r in records {
            let k = key(&r.tool, &r.transport, &r.test);
            d.reps
                .entry(r.group.clone())
                .or_default()
                .insert(r.rep.clone());
            if r.metric == "FAIL" {
                *d.fails.entry(k).or_default().entry(r.size).or_default() += 1;
            } else {
                d.values
                    .entry(k)
                    .or_default()
                    .entry(r.metric.clone())
                    .or_default()
                    .entry(r.size)
                    .or_default()
                    .push(r.value);
            }
        }
        d
    }

    /// Parses CSV text into a dataset (see [`parse_csv`]); returns the warnings too.
    pub fn from_csv(text: &str) -> (Self, Vec<String>) {
        let p = parse_csv(text);
        (Dataset::new(&p.records), p.warnings)
    }

    /// The samples of `s` at `size`.
    pub fn samples(&self, s: Series<'_>, size: u64) -> Samples {
        let k = key(s.tool, s.transport, s.test);
        let raw = self
            .values
            .get(&k)
            .and_then(|m| m.get(s.metric))
            .and_then(|m| m.get(&size));
        let fails = self
            .fails
            .get(&k)
            .and_then(|m| m.get(&size))
            .copied()
            .unwrap_or(0);
        let mut out = Samples {
            values: Vec::new(),
            failed: fails,
        };
        for &v in raw.into_iter().flatten() {
            if v.is_finite() {
                out.values.push(v);
            } else {
                out.failed += 1;
            }
        }
        out
    }

    /// The sizes at which `s` has a sample or its test a failed run, ascending.
    pub fn sizes(&self, s: Series<'_>) -> Vec<u64> {
        let k = key(s.tool, s.transport, s.test);
        let mut out: BTreeSet<u64> = self
            .values
            .get(&k)
            .and_then(|m| m.get(s.metric))
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        if let Some(f) = self.fails.get(&k) {
            out.extend(f.keys().copied());
        }
        out.into_iter().collect()
    }

    /// The tests of `tool` over `transport`, in name order.
    pub fn tests(&self, tool: &str, transport: &str) -> Vec<String> {
        let mut out: BTreeSet<String> = BTreeSet::new();
        for (t, tr, test) in self.values.keys().chain(self.fails.keys()) {
            if t == tool && tr == transport {
                out.insert(test.clone());
            }
        }
        out.into_iter().collect()
    }

    /// How many distinct repetitions the rows of `group` name.
    pub fn reps(&self, group: &str) -> usize {
        self.reps.get(group).map_or(0, BTreeSet::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_quotes() {
        assert_eq!(split_fields("a, b ,c"), ["a", "b", "c"]);
        assert_eq!(split_fields("\"x,y\",\"q\"\"\",z"), ["x,y", "q\"", "z"]);
        assert_eq!(split_fields(""), [""]);
    }

    #[test]
    fn skips_malformed_lines_with_warnings() {
        let text = format!(
            "{HEADER}\n\
             softrdma,softrdma perf,rc,write_bw,65536,1,bw,4.1,GB/s\n\
             softrdma,softrdma perf,rc,write_bw,65536,2,bw,NaN,GB/s\n\
             too,few,fields\n\
             ucx,ucx_perftest,tcp,ucp_put_bw,64K,1,bw,2.0,GB/s\n\
             ucx,ucx_perftest,tcp,ucp_put_bw,65536,1,bw,fast,GB/s\n\
             ucx,ucx_perftest,tcp,ucp_put_bw,65536,2,FAIL,NaN,-\n\
             \n\
             memcpy,memcpy_bw,self,memcpy,65536,1,bw,,GB/s\n"
        );
        let p = parse_csv(&text);
        assert_eq!(p.records.len(), 4);
        assert_eq!(p.warnings.len(), 3, "{:?}", p.warnings);
        assert!(p.warnings[0].starts_with("line 4:"));
        let d = Dataset::new(&p.records);
        let w = d.samples(Series::new("softrdma perf", "rc", "write_bw", "bw"), 65536);
        assert_eq!(w.values, [4.1]);
        assert_eq!(w.failed, 1);
        let u = d.samples(
            Series::new("ucx_perftest", "tcp", "ucp_put_bw", "bw"),
            65536,
        );
        assert!(u.is_failed());
        let m = d.samples(Series::new("memcpy_bw", "self", "memcpy", "bw"), 65536);
        assert!(m.is_failed());
        let none = d.samples(Series::new("memcpy_bw", "self", "memcpy", "bw"), 8);
        assert!(none.is_absent());
        assert_eq!(
            d.sizes(Series::new("ucx_perftest", "tcp", "ucp_put_bw", "bw")),
            [65536]
        );
        assert_eq!(d.reps("softrdma"), 2);
    }

    #[test]
    fn values() {
        assert_eq!(parse_value("1.5"), Some(1.5));
        assert_eq!(parse_value(".25"), Some(0.25));
        assert!(parse_value("NaN").unwrap().is_nan());
        assert!(parse_value("-nan").unwrap().is_nan());
        assert!(parse_value("inf").unwrap().is_nan());
        assert!(parse_value("").unwrap().is_nan());
        assert_eq!(parse_value("1.2.3"), None);
    }
}
