//! What every benchmark of this crate needs around its measurement: its
//! settings from the environment, the runtimes it runs the server and the
//! clients on, and the machine's load to print beside the figures (on a
//! shared machine a figure means little without it).
//!
//! A module directory, so that Cargo does not take it for a bench target.
//! Each bench uses some of it, so the rest is dead code to that bench.
#![allow(dead_code)]

use std::time::Duration;

/// Every bench's error type: anything, printed as it is.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The number in the environment variable `name`, or `default` when it is
/// unset or not a number.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The length of each measurement from `name` in seconds, and how many
/// rounds from `rounds_name` (at least one).
pub fn duration_and_rounds(
    name: &str,
    default_secs: u64,
    rounds_name: &str,
    default_rounds: u64,
) -> (Duration, usize) {
    (
        Duration::from_secs(env_number(name, default_secs)),
        env_number(rounds_name, default_rounds).max(1) as usize,
    )
}

/// A runtime of two workers whose threads carry `name`, so a profile or a
/// per-thread CPU count can tell the server's work from the clients'.
/// (The servers' own runtimes are `locksmith_server::runtime::build`'s.)
pub fn runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|line| {
            line.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// What some of this process's threads have spent so far.
#[derive(Clone, Copy, Default)]
pub struct Spent {
    pub cpu: std::time::Duration,
    pub switches: u64,
}

/// Sums CPU time (`/proc/self/task/*/schedstat`) and context switches,
/// voluntary and not (`/proc/self/task/*/status`), over the threads of this
/// process that `owns(name, tid)` picks, so that one runtime's work can be
/// told from another's in one process.
pub fn spent_by(owns: impl Fn(&str, &str) -> bool) -> Spent {
    let mut total = Spent::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return total;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let read = |file: &str| std::fs::read_to_string(path.join(file)).unwrap_or_default();
        let tid = task.file_name().to_string_lossy().into_owned();
        if !owns(read("comm").trim(), &tid) {
            continue;
        }
        let nanos = read("schedstat")
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse().ok())
            .unwrap_or(0);
        total.cpu += std::time::Duration::from_nanos(nanos);
        total.switches += read("status")
            .lines()
            .filter(|line| line.contains("ctxt_switches"))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}
