//! Benchmark of the Redis backend, side by side in one run:
//!
//! 1. acquire+release pairs/s of locksmith's Redis lock with 64 concurrent
//!    clients (each its own connection, each on its own lock name);
//! 2. `redis-benchmark` running the very same Lua scripts (EVALSHA of the
//!    acquire and of the release script) with 64 connections over 64 lock
//!    names: the ceiling any client of these scripts can reach on this Redis.
//!    redis-benchmark cannot chain two commands, so each script runs on its
//!    own; the acquire gets a 1 ms lease so that the next acquire of a name
//!    finds it free again (a grant, as in a real pair), the release mostly
//!    finds nothing to release (its cheapest path, which flatters the
//!    baseline). A pair costs one of each: 1 / (1/acquire + 1/release);
//! 3. redis-py's `Lock` (`SET NX PX` + Lua compare-and-delete) from 64 Python
//!    threads;
//! 4. contended hand-off latency: 16 clients queue on one lock, and the time
//!    from a holder's `release()` to the next holder's `acquire()` returning is
//!    measured (p50 / p99), for the default layout (every waiter's client is
//!    told, Redis pub/sub is a broadcast) and for `mode=fair` (exactly the next
//!    waiter is told).
//!
//! `cargo bench -p locksmith --features redis --bench redis`; set
//! `LOCKSMITH_BENCH_SECS` (default 5) for the length of each throughput run.
//! Prints a Markdown table.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::Redis;

const CLIENTS: usize = 64;
const WAITERS: usize = 16;
const HANDOFFS: usize = 2000;

fn seconds() -> Duration {
    let secs = std::env::var("LOCKSMITH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    Duration::from_secs(secs)
}

async fn connect(url: &str) -> Client {
    Client::connect_with(url, ConnectOptions::default())
        .await
        .expect("connect")
}

/// CPU time this process has used (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Pairs per second of 64 locksmith clients, each on its own lock, and the
/// client CPU time per pair.
async fn locksmith_pairs(url: &str, run: Duration) -> (f64, Duration) {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(url).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu = cpu_time();
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (stop, pairs) = (stop.clone(), pairs.clone());
        tasks.push(tokio::spawn(async move {
            let lock = client.lock(format!("bench/pairs/{i}"));
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.expect("acquire");
                guard.release().await.expect("release");
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let count = pairs.load(Ordering::Relaxed);
    let cpu = (cpu_time() - cpu) / count.max(1) as u32;
    (count as f64 / started.elapsed().as_secs_f64(), cpu)
}

/// Requests per second `redis-benchmark` reaches for one command.
fn redis_benchmark(port: u16, requests: u64, command: &[&str]) -> f64 {
    let output =
        std::process::Command::new(locksmith_testkit::binary("redis-benchmark", "redis-tools"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-c", &CLIENTS.to_string(), "-n", &requests.to_string()])
            .args(["-r", &CLIENTS.to_string(), "--csv"])
            .args(command)
            .output()
            .expect("run redis-benchmark");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|line| line.split(',').nth(1))
        .filter_map(|field| field.trim_matches('"').parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no rate in redis-benchmark output: {text}"))
}

const REDIS_PY: &str = r#"
import sys, threading, time, redis
port, clients, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pool = redis.ConnectionPool(host='127.0.0.1', port=port, max_connections=clients + 4)
counts = [0] * clients
barrier = threading.Barrier(clients + 1)
def run(i):
    lock = redis.Redis(connection_pool=pool).lock('bench/py/%d' % i, timeout=30)
    barrier.wait()
    n = 0
    while time.time() < stop:
        lock.acquire(blocking=False)
        lock.release()
        n += 1
    counts[i] = n
threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
for t in threads: t.start()
stop = time.time() + secs
start = time.time()
barrier.wait()
for t in threads: t.join()
print(sum(counts) / (time.time() - start))
"#;

/// Pairs per second of redis-py's Lock from 64 threads.
fn redis_py_pairs(port: u16, run: Duration) -> Option<f64> {
    let output = std::process::Command::new("python3")
        .args(["-c", REDIS_PY])
        .arg(port.to_string())
        .arg(CLIENTS.to_string())
        .arg(run.as_secs_f64().to_string())
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "redis-py run failed (pip install redis): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// Hand-off latencies (release → next holder's acquire returns) with 16
/// clients queued on one lock; only hand-offs to another client count.
async fn handoff(url: &str) -> (Duration, Duration, usize) {
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(connect(url).await);
    }
    let name = format!("bench/handoff/{}", uuid::Uuid::new_v4().simple());
    let released: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (me, client) in clients.into_iter().enumerate() {
        let (released, samples, done, name) = (
            released.clone(),
            samples.clone(),
            done.clone(),
            name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let lock = client.lock(name);
            loop {
                let guard = lock.acquire().await.expect("acquire");
                let now = Instant::now();
                if let Some((from, at)) = released.lock().unwrap().take() {
                    if from != me {
                        samples.lock().unwrap().push(now - at);
                    }
                }
                let finished = samples.lock().unwrap().len() >= HANDOFFS;
                *released.lock().unwrap() = Some((me, Instant::now()));
                guard.release().await.expect("release");
                if finished {
                    done.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut samples = samples.lock().unwrap().clone();
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), samples.len())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    // LOCKSMITH_BENCH_THREADS: tokio workers of the locksmith side (default 2).
    let workers = std::env::var("LOCKSMITH_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    let redis = Redis::start();
    // The testkit's Redis fsyncs every write (for crash tests); a benchmark
    // measures locking, not the disk.
    redis.query(&["CONFIG", "SET", "appendonly", "no"]).unwrap();
    let url = redis.url();
    let run = seconds();
    if std::env::var_os("LOCKSMITH_BENCH_PROFILE").is_some() {
        // Only the locksmith side, for a profiler.
        let (rate, cpu) = runtime.block_on(locksmith_pairs(&url, run));
        println!(
            "{rate:.0} pairs/s, {:.1} us client CPU per pair",
            cpu.as_secs_f64() * 1e6
        );
        return;
    }

    let acquire_sha = redis::Script::new(locksmith::redis::scripts::ACQUIRE_HASH)
        .get_hash()
        .to_owned();
    let release_sha = redis::Script::new(locksmith::redis::scripts::RELEASE_HASH)
        .get_hash()
        .to_owned();
    let k = "rb:__rand_int__";
    let acquire_cmd = [
        "EVALSHA",
        &acquire_sha,
        "6",
        k,
        "redisson_lock_token:{rb:__rand_int__}",
        "locksmith_meta:{rb:__rand_int__}",
        "redisson_lock_queue:{rb:__rand_int__}",
        "redisson_lock_timeout:{rb:__rand_int__}",
        "redisson_lock__channel:{rb:__rand_int__}",
        "00000000-0000-0000-0000-000000000000:bench",
        "1",
        "bench@host",
        "0",
        "0",
        "30000",
        "0",
        "x",
        "{rb}:rwlock_timeout",
    ];
    let release_cmd = [
        "EVALSHA",
        &release_sha,
        "6",
        k,
        "locksmith_meta:{rb:__rand_int__}",
        "redisson_lock_queue:{rb:__rand_int__}",
        "redisson_lock_timeout:{rb:__rand_int__}",
        "redisson_lock__channel:{rb:__rand_int__}",
        "redisson_rwlock:{rb:__rand_int__}",
        "00000000-0000-0000-0000-000000000000:bench",
        "0",
        "x",
        "{rb}:rwlock_timeout",
        "{rb}",
        "",
    ];
    // The machine may be shared: alternate the contenders round by round and
    // compare within each round.
    let rounds: usize = std::env::var("LOCKSMITH_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (mut ours, mut acquires, mut releases, mut pairs, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (rate, cpu) = runtime.block_on(locksmith_pairs(&url, run));
        for text in [
            locksmith::redis::scripts::ACQUIRE_HASH,
            locksmith::redis::scripts::RELEASE_HASH,
        ] {
            redis.query(&["SCRIPT", "LOAD", text]).unwrap();
        }
        let requests = ((rate * run.as_secs_f64()) as u64).max(50_000);
        let acquire = redis_benchmark(redis.port(), requests, &acquire_cmd);
        let release = redis_benchmark(redis.port(), requests, &release_cmd);
        // Each of the 64 connections runs acquire then release: a pair costs
        // the time of one of each.
        let pair = 1.0 / (1.0 / acquire + 1.0 / release);
        eprintln!(
            "round {round}: locksmith {rate:.0} pairs/s ({:.1} us client CPU per pair), scripts {pair:.0} pairs/s ({acquire:.0} + {release:.0} calls/s), ratio {:.2}",
            cpu.as_secs_f64() * 1e6,
            rate / pair
        );
        redis.query(&["FLUSHALL"]).unwrap();
        ours.push(rate);
        acquires.push(acquire);
        releases.push(release);
        pairs.push(pair);
        ratios.push(rate / pair);
    }
    let ours = median(&mut ours);
    let acquire = median(&mut acquires);
    let release = median(&mut releases);
    let scripts_pairs = median(&mut pairs);
    let ratio = median(&mut ratios);

    let python = redis_py_pairs(redis.port(), run);

    let (p50, p99, n) = runtime.block_on(handoff(&url));
    let (fair50, fair99, fair_n) = runtime.block_on(handoff(&format!("{url}?mode=fair")));

    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    println!();
    println!("| scenario | result | ratio |");
    println!("|---|---|---|");
    println!("| locksmith redis lock, 64 clients, acquire+release | {ours:.0} pairs/s | 1.00 |");
    println!("| redis-benchmark EVALSHA acquire script, -c 64 | {acquire:.0} calls/s | |");
    println!("| redis-benchmark EVALSHA release script, -c 64 | {release:.0} calls/s | |");
    println!(
        "| same scripts via redis-benchmark, as pairs | {scripts_pairs:.0} pairs/s | locksmith = {ratio:.2}x (goal >= 0.7x; median of {rounds} rounds) |"
    );
    match python {
        Some(py) => println!(
            "| redis-py Lock, 64 threads, acquire+release | {py:.0} pairs/s | locksmith = {:.1}x |",
            ours / py
        ),
        None => println!("| redis-py Lock, 64 threads | not run (redis-py missing) | |"),
    }
    println!(
        "| hand-off latency, 16 waiters, default layout (pub/sub broadcast) | p50 {} / p99 {} ({n} hand-offs) | |",
        ms(p50),
        ms(p99)
    );
    println!(
        "| hand-off latency, 16 waiters, mode=fair (next waiter only) | p50 {} / p99 {} ({fair_n} hand-offs) | |",
        ms(fair50),
        ms(fair99)
    );
}
