//! CPU per operation of a timed measurement, from the kernel's scheduler
//! statistics (`/proc/PID/task/TID/schedstat`): how long the bench's own
//! threads and the store's processes ran, and how long they were ready to
//! run but waited for a CPU.
//!
//! Why: on a small machine the bench's clients and the servers they measure
//! share the CPUs. A latency there is partly work and partly waits for a
//! CPU that another process of the run holds, and the waits grow with the
//! number of busy processes on the operation's path (three members of a
//! cluster and the bench, against Redis and the bench). The run's report
//! shows both, per backend, so that a figure can be read for what it is.
//!
//! The kernel counts per thread; a process's figures are the sum over its
//! threads alive at both ends of the measurement, and a store's over its
//! process tree (PostgreSQL serves each connection from a process of its
//! own). A thread or process that ends meanwhile takes its counts with it.

use std::collections::HashMap;

use serde::Serialize;

/// CPU per operation of one measurement, in µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuPerOp {
    /// This process (the clients, the client library and the bench's own
    /// bookkeeping): time run.
    pub bench_run_us: f64,
    /// This process: time ready to run, waiting for a CPU.
    pub bench_wait_us: f64,
    /// The store's processes, summed, when this run started them: time run.
    pub store_run_us: Option<f64>,
    /// The store's processes, summed: time waiting for a CPU.
    pub store_wait_us: Option<f64>,
}

/// Nanoseconds a set of threads ran and waited to run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Times {
    run_ns: u64,
    wait_ns: u64,
}

impl Times {
    fn since(self, before: Times) -> Times {
        Times {
            run_ns: self.run_ns.saturating_sub(before.run_ns),
            wait_ns: self.wait_ns.saturating_sub(before.wait_ns),
        }
    }
}

/// The figures of one measurement, taken at its start ([`CpuWindow::start`])
/// and its end ([`CpuWindow::per_op`]).
#[derive(Debug)]
pub struct CpuWindow {
    bench: Option<Times>,
    /// The store's process trees' roots, and each process's figures at the
    /// start.
    store: Option<(Vec<u32>, HashMap<u32, Times>)>,
}

impl CpuWindow {
    /// Starts a measurement of this process and of the process trees rooted
    /// at `store_roots` (none: the store's figures are left out).
    pub fn start(store_roots: Vec<u32>) -> CpuWindow {
        let store = (!store_roots.is_empty()).then(|| {
            let before = tree_times(&store_roots);
            (store_roots, before)
        });
        CpuWindow {
            bench: process_times(std::process::id()),
            store,
        }
    }

    /// Ends the measurement: what each side spent per operation of `ops`
    /// (`None` when the kernel keeps no scheduler statistics, or no
    /// operation completed).
    pub fn per_op(self, ops: u64) -> Option<CpuPerOp> {
        if ops == 0 {
            return None;
        }
        let bench = process_times(std::process::id())?.since(self.bench?);
        let store = self.store.map(|(roots, before)| {
            tree_times(&roots)
                .into_iter()
                .map(|(pid, now)| now.since(before.get(&pid).copied().unwrap_or_default()))
                .fold(Times::default(), |sum, t| Times {
                    run_ns: sum.run_ns + t.run_ns,
                    wait_ns: sum.wait_ns + t.wait_ns,
                })
        });
        let us = |ns: u64| ns as f64 / 1_000.0 / ops as f64;
        Some(CpuPerOp {
            bench_run_us: us(bench.run_ns),
            bench_wait_us: us(bench.wait_ns),
            store_run_us: store.map(|t| us(t.run_ns)),
            store_wait_us: store.map(|t| us(t.wait_ns)),
        })
    }
}

/// Each process of the trees rooted at `roots`, with its figures.
fn tree_times(roots: &[u32]) -> HashMap<u32, Times> {
    roots
        .iter()
        .flat_map(|&root| super::target::family(root))
        .filter_map(|pid| Some((pid, process_times(pid)?)))
        .collect()
}

/// The sum over the threads of `pid`; `None` when the kernel keeps no
/// scheduler statistics (or the process is gone).
fn process_times(pid: u32) -> Option<Times> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = None::<Times>;
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(times) = parse_schedstat(&text) {
            let total = sum.get_or_insert_with(Times::default);
            total.run_ns += times.run_ns;
            total.wait_ns += times.wait_ns;
        }
    }
    sum
}

/// A `schedstat` line: time run (ns), time waited on a run queue (ns), and
/// time slices run.
fn parse_schedstat(text: &str) -> Option<Times> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some(Times {
        run_ns: fields.next()?.ok()?,
        wait_ns: fields.next()?.ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_give_run_and_wait_time() {
        assert_eq!(
            parse_schedstat("5432100 1200 37\n"),
            Some(Times {
                run_ns: 5_432_100,
                wait_ns: 1_200
            })
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12 x 3"), None);
    }

    #[test]
    fn work_in_a_window_is_counted_per_operation() {
        let window = CpuWindow::start(Vec::new());
        // Some work of this thread: a millisecond of CPU at least.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let Some(cpu) = window.per_op(10) else {
            // A kernel without scheduler statistics: nothing to count.
            assert!(process_times(std::process::id()).is_none());
            return;
        };
        // 10 operations in at least 1 ms of CPU (the loop ran 20 ms of wall
        // time, most of it on a CPU even on a busy machine).
        assert!(cpu.bench_run_us >= 100.0, "{cpu:?}");
        assert!(cpu.bench_wait_us >= 0.0);
        assert_eq!(cpu.store_run_us, None);
        // No operation, no figure per operation.
        assert_eq!(CpuWindow::start(Vec::new()).per_op(0), None);
    }

    #[test]
    fn a_store_tree_is_summed_over_its_processes() {
        // This process as the "store": its figures appear on both sides.
        let window = CpuWindow::start(vec![std::process::id()]);
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::black_box(0);
        }
        if let Some(cpu) = window.per_op(1) {
            let store = cpu.store_run_us.expect("a store was named");
            assert!(store >= cpu.bench_run_us * 0.5, "{cpu:?}");
        }
    }
}
