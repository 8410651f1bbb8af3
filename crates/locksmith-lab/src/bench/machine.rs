//! The machine a run takes place on, and what else loads it: its CPUs,
//! memory and system, the load average and how long a synced write takes in
//! the directory the servers keep their data in.

use serde::Serialize;

use super::stats::{fmt_bytes, fmt_us, Samples};

/// The machine the run took place on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs available (`nproc`).
    pub nproc: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// Total RAM in bytes.
    pub ram_bytes: u64,
    /// Kernel release.
    pub kernel: String,
    /// Operating system.
    pub os: String,
    /// The 1-minute load average when the run started: other work on the
    /// machine skews every figure.
    pub load_at_start: f64,
    /// The 1-minute load average when the run ended.
    pub load_at_end: f64,
    /// Median latency of a 4 KiB write + `fdatasync` in the temporary
    /// directory (where the servers keep their data) when the run started (µs).
    pub fsync_us_at_start: Option<f64>,
    /// The same when the run ended (µs).
    pub fsync_us_at_end: Option<f64>,
}

impl Machine {
    /// Describes this machine.
    pub fn describe() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_else(|| "unknown CPU".into());
        let ram_bytes = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
        let os = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|n| n.trim_matches('"').to_owned())
            .unwrap_or_else(|| "Linux".into());
        Machine {
            load_at_start: load_average(),
            load_at_end: load_average(),
            fsync_us_at_start: None,
            fsync_us_at_end: None,
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            ram_bytes,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            os,
        }
    }

    /// One line: `2 CPUs (AMD EPYC …), 23.4 GiB RAM, Debian 12, Linux 6.1,
    /// load average 0.3 at the start and 1.9 at the end`.
    pub fn line(&self) -> String {
        format!(
            "{} CPUs ({}), {} RAM, {}, Linux {}; load average {:.1} at the start, {:.1} at the end; \
             4 KiB write + fdatasync p50 {} at the start, {} at the end",
            self.nproc,
            self.cpu,
            fmt_bytes(self.ram_bytes as f64),
            self.os,
            self.kernel,
            self.load_at_start,
            self.load_at_end,
            self.fsync_us_at_start.map_or("n/a".into(), fmt_us),
            self.fsync_us_at_end.map_or("n/a".into(), fmt_us),
        )
    }
}

/// The median latency of a 4 KiB write + `fdatasync` in the temporary
/// directory, over 50 tries (µs). Blocking.
pub fn fsync_probe() -> Option<f64> {
    use std::io::Write;
    let file = tempfile::NamedTempFile::new().ok()?;
    let mut samples = Samples::new();
    let block = [0u8; 4096];
    for _ in 0..50 {
        let start = std::time::Instant::now();
        (&mut file.as_file()).write_all(&block).ok()?;
        file.as_file().sync_data().ok()?;
        samples.push(start.elapsed());
    }
    Some(samples.quantile(0.5).as_nanos() as f64 / 1_000.0)
}

/// The 1-minute load average (0 where unknown).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_is_described() {
        let machine = Machine::describe();
        assert!(machine.nproc >= 1);
        assert!(machine.line().contains("CPUs"));
    }
}
