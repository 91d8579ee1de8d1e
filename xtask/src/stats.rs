//! Medians, ratios, verdicts and the way numbers are written.

use crate::data::Samples;

/// The median of the finite values (the mean of the two middle ones for an even count);
/// `None` when there is none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median, minimum and maximum of a series at one size, and how many repetitions failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median of the values.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values there are.
    pub n: usize,
    /// How many repetitions failed.
    pub failed: usize,
}

impl Summary {
    /// Summarises samples; `None` when no repetition gave a value.
    pub fn of(s: &Samples) -> Option<Self> {
        let median = median(&s.values)?;
        let min = s.values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Summary {
            median,
            min,
            max,
            n: s.values.len(),
            failed: s.failed,
        })
    }

    /// `median [min–max]` (only the median for a single value), with the failed
    /// repetitions if any, e.g. `3.09 [2.85–3.14]` or `3.1 (1 of 3 failed)`.
    pub fn cell(&self) -> String {
        let mut s = fmt_num(self.median);
        if self.n > 1 {
            s += &format!(" [{}–{}]", fmt_num(self.min), fmt_num(self.max));
        }
        if self.failed > 0 {
            s += &format!(" ({} of {} failed)", self.failed, self.failed + self.n);
        }
        s
    }
}

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Bandwidth, message rate: more is better.
    Higher,
    /// Latency: less is better.
    Lower,
}

/// softrdma against a peer as one number where more than 1 always means softrdma is better:
/// softrdma ÷ peer when higher is better, peer ÷ softrdma when lower is better. `None` unless
/// both are finite and positive.
pub fn ratio(softrdma: f64, peer: f64, better: Better) -> Option<f64> {
    if !(softrdma.is_finite() && peer.is_finite() && softrdma > 0.0 && peer > 0.0) {
        return None;
    }
    Some(match better {
        Better::Higher => softrdma / peer,
        Better::Lower => peer / softrdma,
    })
}

/// A ratio as written in the tables: two significant digits (`2.3`, `0.41`, `12`), three
/// when two would round a ratio that is not 1 to `1.0` (`0.996`, `1.02`).
pub fn fmt_ratio(r: f64) -> String {
    let two = fmt_sig(r, 2);
    if two == "1.0" {
        fmt_sig(r, 3)
    } else {
        two
    }
}

/// The verdict for a ratio from [`ratio`]: `ahead 2.3x`, `behind 0.41x`, or `even 1.00x`;
/// for latency it says which way (`ahead 1.5x (lower latency)`).
pub fn verdict(r: f64, better: Better) -> String {
    let shown = fmt_ratio(r);
    let (word, way) = if shown == "1.00" {
        ("even", "same latency")
    } else if r > 1.0 {
        ("ahead", "lower latency")
    } else {
        ("behind", "higher latency")
    };
    match better {
        Better::Higher => format!("{word} {shown}x"),
        Better::Lower => format!("{word} {shown}x ({way})"),
    }
}

/// `v` with `digits` significant digits (`4.09`, `21.6`, `0.0123`, `1234`); with an exponent
/// only outside 0.0001 to a million (`1.00e9`).
pub fn fmt_sig(v: f64, digits: u32) -> String {
    if !v.is_finite() {
        return "NaN".to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-4..1e6).contains(&v.abs()) {
        return format!("{:.*e}", digits.saturating_sub(1) as usize, v);
    }
    let mag = v.abs().log10().floor() as i32;
    let mut decimals = (digits as i32 - 1 - mag).max(0);
    // Rounding may carry into the next power of ten (9.96 -> 10.0): one decimal less then.
    let rounded = format!("{:.*}", decimals as usize, v);
    if decimals > 0 {
        if let Ok(x) = rounded.parse::<f64>() {
            if x.abs().log10().floor() as i32 > mag {
                decimals -= 1;
            }
        }
    }
    format!("{:.*}", decimals.min(9) as usize, v)
}

/// A measured figure as written in the tables: three significant digits.
pub fn fmt_num(v: f64) -> String {
    fmt_sig(v, 3)
}

/// A message size: `8 B`, `4 KiB`, `1 MiB` (bytes when not a whole number of KiB).
pub fn fmt_size(bytes: u64) -> String {
    const KI: u64 = 1024;
    const MI: u64 = 1024 * 1024;
    if bytes >= MI && bytes.is_multiple_of(MI) {
        format!("{} MiB", bytes / MI)
    } else if bytes >= KI && bytes.is_multiple_of(KI) {
        format!("{} KiB", bytes / KI)
    } else {
        format!("{bytes} B")
    }
}

/// A short size label for a plot axis: `8B`, `4K`, `1M`.
pub fn short_size(bytes: u64) -> String {
    fmt_size(bytes)
        .replace(" KiB", "K")
        .replace(" MiB", "M")
        .replace(' ', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, f64::NAN, 1.0]), Some(3.0));
    }

    #[test]
    fn summary_cells() {
        let s = Samples {
            values: vec![3.16, 2.85, 3.09],
            failed: 0,
        };
        let sum = Summary::of(&s).unwrap();
        assert_eq!((sum.median, sum.min, sum.max), (3.09, 2.85, 3.16));
        assert_eq!(sum.cell(), "3.09 [2.85–3.16]");
        let one = Samples {
            values: vec![21.6],
            failed: 2,
        };
        assert_eq!(Summary::of(&one).unwrap().cell(), "21.6 (2 of 3 failed)");
        assert_eq!(
            Summary::of(&Samples {
                values: vec![],
                failed: 3
            }),
            None
        );
    }

    #[test]
    fn ratios_say_more_is_better_for_softrdma() {
        assert_eq!(ratio(4.0, 2.0, Better::Higher), Some(2.0));
        assert_eq!(ratio(6.0, 3.0, Better::Lower), Some(0.5));
        assert_eq!(ratio(3.0, 6.0, Better::Lower), Some(2.0));
        assert_eq!(ratio(1.0, 0.0, Better::Higher), None);
        assert_eq!(ratio(f64::NAN, 1.0, Better::Higher), None);
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(2.3, Better::Higher), "ahead 2.3x");
        assert_eq!(verdict(0.41, Better::Higher), "behind 0.41x");
        assert_eq!(verdict(0.6, Better::Lower), "behind 0.60x (higher latency)");
        assert_eq!(verdict(1.5, Better::Lower), "ahead 1.5x (lower latency)");
        assert_eq!(verdict(0.996, Better::Higher), "behind 0.996x");
        assert_eq!(verdict(1.0004, Better::Higher), "even 1.00x");
        assert_eq!(verdict(12.4, Better::Higher), "ahead 12x");
    }

    #[test]
    fn numbers_and_sizes() {
        assert_eq!(fmt_num(4.0912), "4.09");
        assert_eq!(fmt_num(21.64), "21.6");
        assert_eq!(fmt_num(0.012345), "0.0123");
        assert_eq!(fmt_num(1234.7), "1235");
        assert_eq!(fmt_num(9.996), "10.0");
        assert_eq!(fmt_sig(0.996, 2), "1.0");
        assert_eq!(fmt_num(1e300), "1.00e300");
        assert_eq!(fmt_num(-2.5e-7), "-2.50e-7");
        assert_eq!(fmt_size(8), "8 B");
        assert_eq!(fmt_size(65536), "64 KiB");
        assert_eq!(fmt_size(1048576), "1 MiB");
        assert_eq!(fmt_size(1500), "1500 B");
        assert_eq!(short_size(131072), "128K");
        assert_eq!(short_size(64), "64B");
    }
}
