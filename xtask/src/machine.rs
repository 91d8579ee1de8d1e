//! The machine a run was made on, from the harness's `versions.txt`.
//!
//! `run_anchors.sh`'s `versions` writes `date: <ISO date>`, `uname -a`, the first
//! `model name` line of `/proc/cpuinfo`, `nproc: N`, the `MemTotal` line of `/proc/meminfo`,
//! `os: <PRETTY_NAME>`, then `dpkg-query -W` lines (`package<TAB>version`) and a few
//! `key: value` lines about the peers.

/// What the versions file says about the machine; every field may be missing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    /// The date of the run, as written (`date -Is`).
    pub date: Option<String>,
    /// The kernel release (third field of `uname -a`).
    pub kernel: Option<String>,
    /// The CPU model name.
    pub cpu: Option<String>,
    /// The number of CPUs (`nproc`).
    pub nproc: Option<String>,
    /// Memory in KiB (`MemTotal`).
    pub mem_kib: Option<u64>,
    /// The operating system (`PRETTY_NAME`).
    pub os: Option<String>,
    /// The peers' Debian packages and versions (`dpkg-query -W`).
    pub packages: Vec<(String, String)>,
}

/// The value after the first `:` of a line, trimmed.
fn after_colon(line: &str) -> String {
    line.split_once(':')
        .map_or("", |(_, v)| v)
        .trim()
        .to_string()
}

impl Machine {
    /// Reads the versions file's text; lines it does not know are ignored.
    pub fn parse(text: &str) -> Self {
        let mut m = Machine::default();
        for line in text.lines() {
            let t = line.trim();
            if t.is_empty() {
                continue;
            }
            if t.starts_with("date:") {
                m.date = Some(after_colon(t));
            } else if t.starts_with("model name") {
                m.cpu.get_or_insert_with(|| after_colon(t));
            } else if t.starts_with("nproc:") {
                m.nproc = Some(after_colon(t));
            } else if t.starts_with("MemTotal:") {
                m.mem_kib = after_colon(t)
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok());
            } else if t.starts_with("os:") {
                m.os = Some(after_colon(t));
            } else if t.starts_with("Linux ") {
                m.kernel = t.split_whitespace().nth(2).map(str::to_string);
            } else if let Some((name, version)) = line.split_once('\t') {
                let (name, version) = (name.trim(), version.trim());
                if !name.is_empty() && !name.contains(' ') && !name.ends_with(':') {
                    let version = if version.is_empty() {
                        "not installed"
                    } else {
                        version
                    };
                    m.packages.push((name.to_string(), version.to_string()));
                }
            }
        }
        m
    }

    /// One line for the report: CPU, nproc, memory, OS, kernel, date (what is known).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = &self.cpu {
            parts.push(c.clone());
        }
        if let Some(n) = &self.nproc {
            parts.push(format!("nproc {n}"));
        }
        if let Some(k) = self.mem_kib {
            parts.push(format!("{:.1} GiB", k as f64 / (1024.0 * 1024.0)));
        }
        if let Some(o) = &self.os {
            parts.push(o.clone());
        }
        if let Some(k) = &self.kernel {
            parts.push(format!("Linux {k}"));
        }
        if let Some(d) = &self.date {
            parts.push(d.clone());
        }
        if parts.is_empty() {
            "unknown (no versions file)".to_string()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_harness_file() {
        let text = "date: 2026-11-22T10:11:12+00:00\n\
                    Linux box 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian x86_64 GNU/Linux\n\
                    model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n\
                    nproc: 2\n\
                    MemTotal:       24591632 kB\n\
                    os: Debian GNU/Linux 12 (bookworm)\n\
                    iperf3\t3.12-1+deb12u1\n\
                    ucx-utils\t1.13.1-1\n\
                    qperf\t\n\
                    fi_info -l: tcp:udp:shm:\n";
        let m = Machine::parse(text);
        assert_eq!(m.cpu.as_deref(), Some("Intel(R) Xeon(R) CPU @ 2.20GHz"));
        assert_eq!(m.kernel.as_deref(), Some("6.1.0-28-amd64"));
        assert_eq!(m.mem_kib, Some(24591632));
        assert_eq!(m.packages.len(), 3);
        assert_eq!(m.packages[2], ("qperf".into(), "not installed".into()));
        assert_eq!(
            m.describe(),
            "Intel(R) Xeon(R) CPU @ 2.20GHz, nproc 2, 23.5 GiB, Debian GNU/Linux 12 (bookworm), \
             Linux 6.1.0-28-amd64, 2026-11-22T10:11:12+00:00"
        );
        assert_eq!(Machine::parse("").describe(), "unknown (no versions file)");
    }
}
