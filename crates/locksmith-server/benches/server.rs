//! The locksmith server against Redis, side by side, in one run (issue 3's
//! benchmark).
//!
//! - locksmith: a durable server (fsync on, data directory under
//!   `CARGO_TARGET_TMPDIR`, on the project's disk) on its own runtime, clients
//!   through the `locksmith://` backend of the client library.
//! - Redis: a real `redis-server` (locksmith-testkit), as it ships (no
//!   persistence) and again with `appendfsync always`, with a Lua lock script
//!   (`SET NX PX` + `INCR` of a fencing-token key to acquire, compare-and-`DEL`
//!   to release) through the `redis` crate's multiplexed connection; handoff
//!   by pub/sub (the release script publishes, waiters retry on the message).
//!
//! Scenarios:
//! - (a) 64 concurrent clients, each acquire + release on its own lock, for N
//!   seconds: pairs per second. Each side runs twice: 64 connections (one per
//!   client), and one connection shared by the 64 tasks (the redis crate then
//!   pipelines; the locksmith client multiplexes on its one session stream).
//! - (b) 16 clients contending for one lock: handoff latency from the start of
//!   a release to the next grant (p50/p99), and transfers per second.
//!
//! `cargo bench -p locksmith-server --bench server` (N = `LOCKSMITH_BENCH_SECS`,
//! default 5). For profiling: `LOCKSMITH_BENCH_IN_MEMORY=1` runs the server
//! without its log, `LOCKSMITH_BENCH_ONLY_SERVER=1` skips the Redis runs,
//! `LOCKSMITH_BENCH_ONLY=a64|a1|b` runs only that locksmith scenario,
//! `LOCKSMITH_BENCH_ROUNDS=N` runs every measurement N times in turn and
//! reports the run with the median rate of each. The run prints the disk's
//! `fdatasync` latency (150-byte writes over zeros, as the log commits) and
//! the load average at its start and end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use locksmith::{Client, ConnectOptions};
use locksmith_server::{Server, ServerConfig, ServerStats};

const ACQUIRE: &str = r"
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('incr', KEYS[2])
end
return 0";
const RELEASE: &str = r"
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  if KEYS[2] then redis.call('publish', KEYS[2], ARGV[1]) end
  return 1
end
return 0";

mod common;
use common::{load_average, BoxError};

/// Latencies in microseconds.
#[derive(Default)]
struct Samples(Vec<u32>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_micros().min(u32::MAX as u128) as u32);
    }

    fn percentile(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let index = ((self.0.len() - 1) as f64 * p).round() as usize;
        self.0[index] as f64
    }
}

struct Throughput {
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

struct Handoff {
    transfers_per_second: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

impl Throughput {
    /// A measurement that did not run.
    fn none() -> Throughput {
        Throughput {
            per_second: f64::NAN,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            cpu_us: f64::NAN,
        }
    }
}

impl Handoff {
    /// A measurement that did not run.
    fn none() -> Handoff {
        Handoff {
            transfers_per_second: f64::NAN,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            cpu_us: f64::NAN,
        }
    }
}

/// The run with the median rate (the lower middle one of an even count).
fn median<T>(mut runs: Vec<T>, rate: impl Fn(&T) -> f64) -> Option<T> {
    runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let middle = runs.len().checked_sub(1)? / 2;
    Some(runs.swap_remove(middle))
}

/// Runs `tasks` until `duration` has been measured after a warmup; the tasks
/// count operations and record latencies.
/// The pid of `redis-server`, to count its CPU time too.
static REDIS_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// CPU time (user + system) of this process (server and clients) plus the
/// Redis server.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let own = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        tv(usage.ru_utime) + tv(usage.ru_stime)
    };
    let pid = REDIS_PID.load(Ordering::Relaxed);
    let redis = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name: state is field 3; utime, stime are 14, 15.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 =
                fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
            Some(Duration::from_micros(ticks * 1_000_000 / hz))
        })
        .unwrap_or_default();
    own + redis
}

/// Operations per second, latency samples, and CPU microseconds per operation.
async fn measure<F, Fut>(
    tasks: usize,
    duration: Duration,
    task: F,
) -> Result<(f64, Samples, f64), BoxError>
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = Result<Samples, BoxError>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let recording = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|i| tokio::spawn(task(i, stop.clone(), recording.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    recording.store(true, Ordering::SeqCst);
    let start_count = count.load(Ordering::SeqCst);
    let started = Instant::now();
    let cpu_started = cpu_time();
    tokio::time::sleep(duration).await;
    let done = count.load(Ordering::SeqCst) - start_count;
    let elapsed = started.elapsed();
    let cpu = cpu_time().saturating_sub(cpu_started);
    recording.store(false, Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let mut samples = Samples::default();
    for handle in handles {
        samples.0.extend(handle.await??.0);
    }
    let cpu_per_op = cpu.as_micros() as f64 / done.max(1) as f64;
    Ok((done as f64 / elapsed.as_secs_f64(), samples, cpu_per_op))
}

fn options() -> ConnectOptions {
    ConnectOptions::default()
        .session_ttl(Duration::from_secs(30))
        .client_name("bench")
}

async fn locksmith_pairs(
    url: &str,
    clients: usize,
    shared: bool,
    duration: Duration,
) -> Result<Throughput, BoxError> {
    let connections = if shared { 1 } else { clients };
    let mut pool = Vec::new();
    for _ in 0..connections {
        pool.push(Client::connect_with(url, options()).await?);
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (per_second, mut samples, cpu_us) =
        measure(clients, duration, |i, stop, recording, count| {
            let client = pool[i % connections].clone();
            let name = format!("bench/a/{run}/{i}");
            async move {
                let lock = client.lock(name);
                let mut samples = Samples::default();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let guard = lock.acquire().await?;
                    guard.release().await?;
                    count.fetch_add(1, Ordering::Relaxed);
                    if recording.load(Ordering::Relaxed) {
                        samples.push(t.elapsed());
                    }
                }
                Ok(samples)
            }
        })
        .await?;
    Ok(Throughput {
        per_second,
        p50_us: samples.percentile(0.5),
        p99_us: samples.percentile(0.99),
        cpu_us,
    })
}

async fn redis_pairs(
    url: &str,
    clients: usize,
    shared: bool,
    duration: Duration,
) -> Result<Throughput, BoxError> {
    let redis = redis::Client::open(url)?;
    let connections = if shared { 1 } else { clients };
    let mut pool = Vec::new();
    for _ in 0..connections {
        pool.push(redis.get_multiplexed_async_connection().await?);
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (per_second, mut samples, cpu_us) =
        measure(clients, duration, |i, stop, recording, count| {
            let mut con = pool[i % connections].clone();
            let key = format!("bench:a:{run}:{i}");
            let token_key = format!("{key}:token");
            let owner = format!("owner-{i}");
            async move {
                let (acquire, release) = (redis::Script::new(ACQUIRE), redis::Script::new(RELEASE));
                let mut samples = Samples::default();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let token: u64 = acquire
                        .key(&key)
                        .key(&token_key)
                        .arg(&owner)
                        .arg(30_000)
                        .invoke_async(&mut con)
                        .await?;
                    assert!(token > 0, "own lock was busy");
                    let released: u64 =
                        release.key(&key).arg(&owner).invoke_async(&mut con).await?;
                    assert_eq!(released, 1);
                    count.fetch_add(1, Ordering::Relaxed);
                    if recording.load(Ordering::Relaxed) {
                        samples.push(t.elapsed());
                    }
                }
                Ok(samples)
            }
        })
        .await?;
    Ok(Throughput {
        per_second,
        p50_us: samples.percentile(0.5),
        p99_us: samples.percentile(0.99),
        cpu_us,
    })
}

/// When the last release started, for the handoff latency of the next grant.
type LastRelease = Arc<Mutex<Option<Instant>>>;

fn handoff_sample(last: &LastRelease, recording: &AtomicBool, samples: &mut Samples) {
    if let Some(released) = last.lock().unwrap().take() {
        if recording.load(Ordering::Relaxed) {
            samples.push(released.elapsed());
        }
    }
}

async fn locksmith_handoff(
    url: &str,
    clients: usize,
    duration: Duration,
) -> Result<Handoff, BoxError> {
    let mut pool = Vec::new();
    for _ in 0..clients {
        pool.push(Client::connect_with(url, options()).await?);
    }
    let name = format!("bench/b/{}", uuid::Uuid::new_v4().simple());
    let last: LastRelease = Arc::default();
    let (per_second, mut samples, cpu_us) =
        measure(clients, duration, |i, stop, recording, count| {
            let lock = pool[i].lock(name.as_str());
            let last = last.clone();
            async move {
                let mut samples = Samples::default();
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.acquire().await?;
                    handoff_sample(&last, &recording, &mut samples);
                    count.fetch_add(1, Ordering::Relaxed);
                    *last.lock().unwrap() = Some(Instant::now());
                    guard.release().await?;
                }
                Ok(samples)
            }
        })
        .await?;
    Ok(Handoff {
        transfers_per_second: per_second,
        p50_us: samples.percentile(0.5),
        p99_us: samples.percentile(0.99),
        cpu_us,
    })
}

async fn redis_handoff(url: &str, clients: usize, duration: Duration) -> Result<Handoff, BoxError> {
    let redis = redis::Client::open(url)?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("bench:b:{run}");
    let channel = format!("{key}:released");
    let mut connections = Vec::new();
    for _ in 0..clients {
        let con = redis.get_multiplexed_async_connection().await?;
        let mut pubsub = redis.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        connections.push(Mutex::new(Some((con, pubsub))));
    }
    let last: LastRelease = Arc::default();
    let (per_second, mut samples, cpu_us) =
        measure(clients, duration, |i, stop, recording, count| {
            let (mut con, mut pubsub) = connections[i]
                .lock()
                .unwrap()
                .take()
                .expect("one task per client");
            let (key, channel, last) = (key.clone(), channel.clone(), last.clone());
            let owner = format!("owner-{i}");
            async move {
                let (acquire, release) = (redis::Script::new(ACQUIRE), redis::Script::new(RELEASE));
                let token_key = format!("{key}:token");
                let mut messages = pubsub.on_message();
                let mut samples = Samples::default();
                while !stop.load(Ordering::Relaxed) {
                    let token: u64 = acquire
                        .key(&key)
                        .key(&token_key)
                        .arg(&owner)
                        .arg(30_000)
                        .invoke_async(&mut con)
                        .await?;
                    if token == 0 {
                        // Busy: wait for a release message (or re-check after a
                        // while, in case one was missed), then retry.
                        let _ =
                            tokio::time::timeout(Duration::from_millis(100), messages.next()).await;
                        continue;
                    }
                    handoff_sample(&last, &recording, &mut samples);
                    count.fetch_add(1, Ordering::Relaxed);
                    *last.lock().unwrap() = Some(Instant::now());
                    let released: u64 = release
                        .key(&key)
                        .key(&channel)
                        .arg(&owner)
                        .invoke_async(&mut con)
                        .await?;
                    assert_eq!(released, 1);
                }
                Ok(samples)
            }
        })
        .await?;
    Ok(Handoff {
        transfers_per_second: per_second,
        p50_us: samples.percentile(0.5),
        p99_us: samples.percentile(0.99),
        cpu_us,
    })
}

fn delta(after: ServerStats, before: ServerStats) -> String {
    let ops = after.ops - before.ops;
    let batches = (after.batches - before.batches).max(1);
    let records = after.records - before.records;
    let fsyncs = (after.fsyncs - before.fsyncs).max(1);
    let commit = after.commit_time.saturating_sub(before.commit_time);
    format!(
        "{ops} ops in {batches} batches ({:.1} per batch), {records} log records in {fsyncs} \
         fsyncs ({:.1} per fsync), write + fdatasync {:.0} µs on average",
        ops as f64 / batches as f64,
        records as f64 / fsyncs as f64,
        commit.as_micros() as f64 / fsyncs as f64
    )
}

/// The disk as the log sees it: 200 writes of 150 bytes over zeros, each
/// followed by `fdatasync` (the log's commit), as "p50 / p99".
fn fdatasync_probe(dir: &std::path::Path) -> String {
    use std::os::unix::fs::FileExt;
    let probe = || -> std::io::Result<String> {
        let path = dir.join("fdatasync-probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        file.write_all_at(&[0; 64 << 10], 0)?;
        file.sync_all()?;
        let mut samples = Samples::default();
        for i in 0..200u64 {
            let started = Instant::now();
            file.write_all_at(&[7; 150], i * 150)?;
            file.sync_data()?;
            samples.push(started.elapsed());
        }
        std::fs::remove_file(&path)?;
        Ok(format!(
            "p50 {:.0} µs / p99 {:.0} µs",
            samples.percentile(0.5),
            samples.percentile(0.99)
        ))
    };
    probe().unwrap_or_else(|e| format!("probe failed: {e}"))
}

/// The filesystem type of the mount holding `path` (from /proc/mounts).
fn filesystem_of(path: &std::path::Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_dev, mount, fs) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount)
                .then(|| (mount.len(), fs.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, fs)| fs)
}

fn main() -> Result<(), BoxError> {
    let (duration, rounds) =
        common::duration_and_rounds("LOCKSMITH_BENCH_SECS", 5, "LOCKSMITH_BENCH_ROUNDS", 1);
    let seconds = duration.as_secs();

    let dir = tempfile::Builder::new()
        .prefix("locksmith-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let filesystem = filesystem_of(dir.path());
    let server_runtime = common::runtime("server")?;
    // For profiling: the same server without the log.
    let in_memory = std::env::var_os("LOCKSMITH_BENCH_IN_MEMORY").is_some();
    let config = if in_memory {
        ServerConfig::in_memory()
    } else {
        ServerConfig::durable(dir.path())
    }
    .listen("127.0.0.1:0".parse()?);
    let server = server_runtime.block_on(Server::start(config))?;
    let url = server.url();
    let redis = locksmith_testkit::Redis::start();
    let redis_url = redis.url();
    REDIS_PID.store(redis.pid().unwrap_or(0), Ordering::Relaxed);

    let clients = common::runtime("clients")?;
    eprintln!(
        "data dir {} ({filesystem}), {seconds} s per measurement; fdatasync {}; load average {}",
        dir.path().display(),
        fdatasync_probe(dir.path()),
        load_average()
    );
    // Redis as it ships (no persistence: the issue's baseline), and with an
    // fsync per write (appendfsync always, as durable as the locksmith server).
    let redis_mode = |durable: bool| {
        let set = |k: &str, v: &str| redis.query(&["CONFIG", "SET", k, v]).map(drop);
        if durable {
            set("appendonly", "yes").and_then(|()| set("appendfsync", "always"))
        } else {
            set("appendonly", "no")
        }
    };
    clients.block_on(async {
        // For profiling one scenario: LOCKSMITH_BENCH_ONLY=a64|a1|b.
        let only = std::env::var("LOCKSMITH_BENCH_ONLY").ok();
        let runs = |scenario: &str| only.as_deref().is_none_or(|o| o == scenario);
        let with_redis =
            only.is_none() && std::env::var_os("LOCKSMITH_BENCH_ONLY_SERVER").is_none();
        let mut stats = server.stats();
        let mut report = |label: &str| {
            let now = server.stats();
            eprintln!("{label}: {}", delta(now, stats));
            stats = now;
        };
        // Rounds run every measurement in turn, so that a noisy moment on the
        // machine (other jobs, a busy disk) hits every side alike.
        let (mut ls_a, mut ls_a_shared, mut ls_b) = (Vec::new(), Vec::new(), Vec::new());
        let (mut redis_a, mut redis_a_shared, mut redis_b) = (Vec::new(), Vec::new(), Vec::new());
        let (mut durable_a, mut durable_a_shared, mut durable_b) =
            (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            eprintln!("round {round} of {rounds}; load average {}", load_average());
            if runs("a64") {
                ls_a.push(locksmith_pairs(&url, 64, false, duration).await?);
                report("(a) locksmith, 64 connections");
            }
            if runs("a1") {
                ls_a_shared.push(locksmith_pairs(&url, 64, true, duration).await?);
                report("(a) locksmith, 1 connection");
            }
            if runs("b") {
                ls_b.push(locksmith_handoff(&url, 16, duration).await?);
                report("(b) locksmith");
            }
            if with_redis {
                redis_mode(false)?;
                redis_a.push(redis_pairs(&redis_url, 64, false, duration).await?);
                redis_a_shared.push(redis_pairs(&redis_url, 64, true, duration).await?);
                redis_b.push(redis_handoff(&redis_url, 16, duration).await?);
                redis_mode(true)?;
                durable_a.push(redis_pairs(&redis_url, 64, false, duration).await?);
                durable_a_shared.push(redis_pairs(&redis_url, 64, true, duration).await?);
                durable_b.push(redis_handoff(&redis_url, 16, duration).await?);
            }
        }
        let [ls_a, ls_a_shared, redis_a, redis_a_shared, durable_a, durable_a_shared] = [
            ls_a,
            ls_a_shared,
            redis_a,
            redis_a_shared,
            durable_a,
            durable_a_shared,
        ]
        .map(|runs| median(runs, |t| t.per_second).unwrap_or_else(Throughput::none));
        let [ls_b, redis_b, durable_b] = [ls_b, redis_b, durable_b]
            .map(|runs| median(runs, |h| h.transfers_per_second).unwrap_or_else(Handoff::none));
        for (label, t) in [("64 connections", &ls_a), ("1 connection", &ls_a_shared)] {
            eprintln!(
                "(a) locksmith, {label}: {:.0} pairs/s, p50 {:.0} µs, p99 {:.0} µs, {:.1} µs CPU per pair",
                t.per_second, t.p50_us, t.p99_us, t.cpu_us
            );
        }
        eprintln!(
            "(b) locksmith: {:.0} transfers/s, handoff p50 {:.0} µs, p99 {:.0} µs, {:.1} µs CPU per transfer",
            ls_b.transfers_per_second, ls_b.p50_us, ls_b.p99_us, ls_b.cpu_us
        );
        if !with_redis {
            return Ok(());
        }
        let best_redis = redis_a.per_second.max(redis_a_shared.per_second);
        let best_ls = ls_a.per_second.max(ls_a_shared.per_second);
        let of_rounds = if rounds > 1 {
            format!(", median of {rounds} rounds")
        } else {
            String::new()
        };
        println!(
            "### (a) 64 clients, acquire + release of their own lock ({seconds} s{of_rounds})\n"
        );
        println!("| | pairs/s | pair p50 | pair p99 | CPU per pair |");
        println!("|---|---:|---:|---:|---:|");
        for (label, t) in [
            ("locksmith (durable), 64 connections", &ls_a),
            ("locksmith (durable), 1 shared connection", &ls_a_shared),
            ("Redis Lua, 64 multiplexed connections", &redis_a),
            (
                "Redis Lua, 1 shared multiplexed connection",
                &redis_a_shared,
            ),
            ("Redis Lua + appendfsync always, 64 connections", &durable_a),
            (
                "Redis Lua + appendfsync always, 1 shared connection",
                &durable_a_shared,
            ),
        ] {
            println!(
                "| {label} | {:.0} | {:.0} µs | {:.0} µs | {:.0} µs |",
                t.per_second, t.p50_us, t.p99_us, t.cpu_us
            );
        }
        println!(
            "\nRatio locksmith / Redis (best configuration of each, Redis without persistence): \
             **{:.2}×** (goal ≥ 2×); against Redis with appendfsync always: {:.2}×\n",
            best_ls / best_redis,
            best_ls / durable_a.per_second.max(durable_a_shared.per_second)
        );
        println!("### (b) 16 clients contending for one lock ({seconds} s{of_rounds})\n");
        println!("| | transfers/s | handoff p50 | handoff p99 | CPU per transfer |");
        println!("|---|---:|---:|---:|---:|");
        for (label, h) in [
            ("locksmith (durable, FIFO push)", &ls_b),
            ("Redis Lua + pub/sub", &redis_b),
            ("Redis Lua + pub/sub, appendfsync always", &durable_b),
        ] {
            println!(
                "| {label} | {:.0} | {:.0} µs | {:.0} µs | {:.0} µs |",
                h.transfers_per_second, h.p50_us, h.p99_us, h.cpu_us
            );
        }
        println!(
            "\nRatio of transfers/s locksmith / Redis: **{:.2}×** (goal ≥ 3×); \
             against Redis with appendfsync always: {:.2}×; goal p50 ≤ 150 µs, p99 ≤ 1000 µs",
            ls_b.transfers_per_second / redis_b.transfers_per_second,
            ls_b.transfers_per_second / durable_b.transfers_per_second
        );
        Ok::<_, BoxError>(())
    })?;
    drop(clients);
    eprintln!(
        "at the end: fdatasync {}; load average {}",
        fdatasync_probe(dir.path()),
        load_average()
    );
    server_runtime.block_on(server.shutdown())?;
    Ok(())
}
