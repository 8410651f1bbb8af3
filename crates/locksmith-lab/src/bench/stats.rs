//! Latency samples and the summaries the report prints.

use std::time::Duration;

use serde::Serialize;

/// Latency samples of one measurement, in nanoseconds.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    nanos: Vec<u64>,
    sorted: bool,
}

impl Samples {
    /// An empty set.
    pub fn new() -> Self {
        Samples::default()
    }

    /// Adds one sample.
    pub fn push(&mut self, value: Duration) {
        self.nanos
            .push(u64::try_from(value.as_nanos()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: Samples) {
        self.nanos.extend(other.nanos);
        self.sorted = false;
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.nanos.is_empty()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.nanos.sort_unstable();
            self.sorted = true;
        }
    }

    /// The `q` quantile (0.0..=1.0), nearest rank; zero when empty.
    pub fn quantile(&mut self, q: f64) -> Duration {
        self.sort();
        if self.nanos.is_empty() {
            return Duration::ZERO;
        }
        let rank = (q * self.nanos.len() as f64).ceil() as usize;
        Duration::from_nanos(self.nanos[rank.clamp(1, self.nanos.len()) - 1])
    }

    /// p50, p99, p99.9, max and mean.
    pub fn summary(&mut self) -> Summary {
        let mean = if self.nanos.is_empty() {
            0.0
        } else {
            self.nanos.iter().map(|&n| n as f64).sum::<f64>() / self.nanos.len() as f64
        };
        Summary {
            count: self.nanos.len() as u64,
            p50_us: micros(self.quantile(0.50)),
            p99_us: micros(self.quantile(0.99)),
            p999_us: micros(self.quantile(0.999)),
            max_us: micros(self.quantile(1.0)),
            mean_us: mean / 1_000.0,
        }
    }

    /// The empirical distribution as at most `points` (latency µs, fraction ≤)
    /// pairs, for charts.
    pub fn cdf(&mut self, points: usize) -> Vec<(f64, f64)> {
        self.sort();
        let n = self.nanos.len();
        if n == 0 || points == 0 {
            return Vec::new();
        }
        let step = (n / points).max(1);
        let mut cdf: Vec<(f64, f64)> = (0..n)
            .step_by(step)
            .map(|i| (self.nanos[i] as f64 / 1_000.0, (i + 1) as f64 / n as f64))
            .collect();
        cdf.push((self.nanos[n - 1] as f64 / 1_000.0, 1.0));
        cdf
    }
}

/// A latency distribution in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1_000.0
}

/// Jain's fairness index of `shares`: 1.0 when all are equal, 1/n when one
/// client got everything. `(Σx)² / (n·Σx²)`.
pub fn jain(shares: &[u64]) -> f64 {
    let n = shares.len() as f64;
    let sum: f64 = shares.iter().map(|&x| x as f64).sum();
    let squares: f64 = shares.iter().map(|&x| (x as f64) * (x as f64)).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (n * squares)
}

/// Formats microseconds for tables: `850 µs`, `12.3 ms`, `2.10 s`.
pub fn fmt_us(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}

/// Formats a rate with thousands separators: `12 345`.
pub fn fmt_rate(rate: f64) -> String {
    let whole = rate.round() as u64;
    if rate < 10.0 {
        return format!("{rate:.1}");
    }
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    out
}

/// Formats bytes: `512 KiB`, `41.2 MiB`.
pub fn fmt_bytes(bytes: f64) -> String {
    if bytes.abs() < 1024.0 * 1024.0 {
        format!("{:.0} KiB", bytes / 1024.0)
    } else if bytes.abs() < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", bytes / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", bytes / 1024.0 / 1024.0 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let mut samples = Samples::new();
        for ms in 1..=100 {
            samples.push(Duration::from_millis(ms));
        }
        assert_eq!(samples.quantile(0.5), Duration::from_millis(50));
        assert_eq!(samples.quantile(0.99), Duration::from_millis(99));
        assert_eq!(samples.quantile(1.0), Duration::from_millis(100));
        assert_eq!(Samples::new().quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[20, 0, 0, 0]) - 0.25).abs() < 1e-9);
        assert_eq!(jain(&[0, 0]), 1.0);
    }

    #[test]
    fn formats_are_readable() {
        assert_eq!(fmt_us(850.0), "850 µs");
        assert_eq!(fmt_us(12_300.0), "12.3 ms");
        assert_eq!(fmt_rate(1_234_567.0), "1\u{202f}234\u{202f}567");
        assert_eq!(fmt_bytes(2.0 * 1024.0 * 1024.0), "2.0 MiB");
    }
}
