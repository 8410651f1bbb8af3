//! Where the server's core and its Raft log's writer run, side by side in
//! one run: the core as a task of the server's runtime (`Execution::Tasks`,
//! the default; the log's writer a task writing in place on `/dev/shm`, a
//! thread of its own on a disk) on a runtime of one worker (the server's
//! default) and of two, against the core on a thread of its own too
//! (`Execution::Threads`, the layout before) beside a runtime of two.
//!
//! Three groups of one in this process, each on a tokio runtime of its own
//! (named `srv-tasks-1`, `srv-tasks-2` and `srv-threads`), with their Raft logs on
//! `/dev/shm` (no disk: only software is measured); clients on a third
//! runtime take and release locks of their own through the client library.
//! For each side and each client count it reports pairs per second, the
//! pair's p50, and what the **server's** threads spent per pair: CPU time
//! (`/proc/self/task/*/schedstat`) and context switches (voluntary and not,
//! `/proc/self/task/*/status`), counted per thread (its runtime's by name,
//! the threads its server started by id), so the clients' own work is left
//! out. Context switches count the wake-ups the
//! issue of a request costs, and depend little on the machine's load.
//!
//! `cargo bench -p locksmith-server --bench execution`;
//! `LOCKSMITH_EXECUTION_DISK=1` puts the logs on the project's disk instead
//! (under `CARGO_TARGET_TMPDIR`), where the writer's `fdatasync` counts.
//! `LOCKSMITH_EXECUTION_SECS` (default 3) is the length of each measurement,
//! `LOCKSMITH_EXECUTION_ROUNDS` (default 3) how many times each runs, in
//! turn, A B C A B C; the round with the median rate of each is reported.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith::{Client, ConnectOptions};
use locksmith_server::{Execution, Server, ServerConfig};

mod common;
use common::{load_average, BoxError, Spent};

/// The client counts measured.
const CLIENTS: [usize; 3] = [1, 16, 64];

/// Sums CPU time and context switches over the threads of this process
/// that `side` owns.
fn spent(side: &Side) -> Spent {
    common::spent_by(|name, tid| side.owns(name, tid))
}

/// The ids of this process's threads now.
fn thread_ids() -> std::collections::HashSet<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .map(|task| task.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One way of running the core, and the server started that way.
struct Side {
    label: &'static str,
    /// Its runtime's name, which its workers and blocking threads carry.
    runtime_name: &'static str,
    /// The threads its server started of its own (the core's, the log's
    /// writer), by id: the writer's name is the same on every side.
    own_threads: std::collections::HashSet<String>,
    url: String,
    _runtime: tokio::runtime::Runtime,
    _server: Server,
}

impl Side {
    fn start(
        label: &'static str,
        execution: Execution,
        (runtime_name, workers): (&'static str, usize),
        disk: Option<&std::path::Path>,
    ) -> Result<Side, BoxError> {
        let runtime = locksmith_server::runtime::build(workers, runtime_name)?;
        let mut config = match disk {
            Some(dir) => ServerConfig::durable(dir.join(runtime_name)),
            None => ServerConfig::in_memory(),
        }
        .listen("127.0.0.1:0".parse()?);
        config.execution = execution;
        let before = thread_ids();
        let server = runtime.block_on(Server::start(config))?;
        let own_threads = thread_ids()
            .into_iter()
            .filter(|tid| !before.contains(tid))
            .collect();
        Ok(Side {
            label,
            runtime_name,
            own_threads,
            url: server.url(),
            _runtime: runtime,
            _server: server,
        })
    }

    fn owns(&self, name: &str, tid: &str) -> bool {
        name == self.runtime_name || self.own_threads.contains(tid)
    }
}

/// One measurement: the rate, the pairs' p50 in microseconds, and the
/// server's CPU microseconds and context switches per pair.
struct Measured {
    per_second: f64,
    p50_us: f64,
    cpu_us: f64,
    switches: f64,
}

/// `clients` clients, each with a connection and a lock of its own, acquire
/// and release for `duration` after a warm-up.
async fn pairs(side: &Side, clients: usize, duration: Duration) -> Result<Measured, BoxError> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let recording = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let options = ConnectOptions::default()
            .session_ttl(Duration::from_secs(30))
            .client_name("execution-bench");
        let client = Client::connect_with(&side.url, options).await?;
        let lock = client.lock(format!("bench/execution/{run}/{i}"));
        let (stop, recording, count) = (stop.clone(), recording.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let _client = client;
            let mut micros = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                lock.acquire().await?.release().await?;
                count.fetch_add(1, Ordering::Relaxed);
                if recording.load(Ordering::Relaxed) {
                    micros.push(t.elapsed().as_nanos() as f64 / 1_000.0);
                }
            }
            Ok::<_, BoxError>(micros)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    recording.store(true, Ordering::SeqCst);
    let (counted, before, started) = (count.load(Ordering::SeqCst), spent(side), Instant::now());
    tokio::time::sleep(duration).await;
    let (done, after, elapsed) = (
        count.load(Ordering::SeqCst) - counted,
        spent(side),
        started.elapsed(),
    );
    recording.store(false, Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let mut micros = Vec::new();
    for task in tasks {
        micros.extend(task.await??);
    }
    micros.sort_by(f64::total_cmp);
    let per_pair = done.max(1) as f64;
    Ok(Measured {
        per_second: done as f64 / elapsed.as_secs_f64(),
        p50_us: micros.get(micros.len() / 2).copied().unwrap_or(f64::NAN),
        cpu_us: after.cpu.saturating_sub(before.cpu).as_nanos() as f64 / 1_000.0 / per_pair,
        switches: after.switches.saturating_sub(before.switches) as f64 / per_pair,
    })
}

fn main() -> Result<(), BoxError> {
    let (duration, rounds) = common::duration_and_rounds(
        "LOCKSMITH_EXECUTION_SECS",
        3,
        "LOCKSMITH_EXECUTION_ROUNDS",
        3,
    );
    // LOCKSMITH_EXECUTION_DISK=1: the logs on the project's disk instead.
    let disk = match std::env::var_os("LOCKSMITH_EXECUTION_DISK") {
        Some(_) => Some(
            tempfile::Builder::new()
                .prefix("locksmith-execution-")
                .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?,
        ),
        None => None,
    };
    let disk_path = disk.as_ref().map(|dir| dir.path());
    let sides = [
        Side::start(
            "tasks, 1 worker (default)",
            Execution::Tasks,
            ("srv-tasks-1", 1),
            disk_path,
        )?,
        Side::start(
            "tasks, 2 workers",
            Execution::Tasks,
            ("srv-tasks-2", 2),
            disk_path,
        )?,
        Side::start(
            "threads, 2 workers",
            Execution::Threads,
            ("srv-threads", 2),
            disk_path,
        )?,
    ];
    let clients = common::runtime("clients")?;
    eprintln!(
        "logs {}; {} s per measurement, {rounds} rounds; load average {}",
        disk_path.map_or("on /dev/shm".into(), |d| format!("under {}", d.display())),
        duration.as_secs(),
        load_average()
    );
    // runs[side][clients]: every round's measurement.
    let mut runs: Vec<Vec<Vec<Measured>>> = sides
        .iter()
        .map(|_| CLIENTS.iter().map(|_| Vec::new()).collect())
        .collect();
    clients.block_on(async {
        for round in 1..=rounds {
            eprintln!("round {round} of {rounds}; load average {}", load_average());
            for (c, &count) in CLIENTS.iter().enumerate() {
                for (s, side) in sides.iter().enumerate() {
                    runs[s][c].push(pairs(side, count, duration).await?);
                }
            }
        }
        Ok::<(), BoxError>(())
    })?;
    eprintln!("load average at the end {}", load_average());
    println!("| clients | core on | pairs/s | pair p50 | server CPU per pair | server context switches per pair |");
    println!("|---:|---|---:|---:|---:|---:|");
    for (c, &count) in CLIENTS.iter().enumerate() {
        for (s, side) in sides.iter().enumerate() {
            let mut measured = std::mem::take(&mut runs[s][c]);
            measured.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            let m = &measured[(measured.len() - 1) / 2];
            println!(
                "| {count} | {} | {:.0} | {:.0} µs | {:.1} µs | {:.1} |",
                side.label, m.per_second, m.p50_us, m.cpu_us, m.switches
            );
        }
    }
    Ok(())
}
