//! Benchmark of the ZooKeeper backend beside kazoo's `Lock` (Python) on the
//! same ZooKeeper server, in one run:
//!
//! * **throughput**: 64 concurrent clients, each acquiring and releasing its own
//!   lock in a loop for a fixed time: acquire+release pairs per second. Both
//!   sides share one connection (one ZooKeeper session) among the 64, which is
//!   how each library is meant to be used (one `Client` / one `KazooClient` per
//!   process); locksmith is also measured with 64 sessions.
//! * **handoff**: 16 waiters on one lock, each with its own session, taking
//!   turns: the time from a holder's release to the next holder's grant, p50
//!   and p99.
//!
//! `cargo bench -p locksmith --features zookeeper --bench zookeeper`
//! (needs ZooKeeper, Python 3 and `pip install kazoo`). Prints a Markdown
//! table. `ZK_BENCH_SECONDS` sets the length of each throughput run (default 5).

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::ZooKeeper;

const CLIENTS: usize = 64;
const WAITERS: usize = 16;
const HANDOFFS: usize = 800;

/// The same two scenarios with kazoo: prints `throughput <pairs/s>` and
/// `handoff <p50 ms> <p99 ms> <handoffs/s>`.
const KAZOO: &str = r#"
import sys, threading, time
from kazoo.client import KazooClient

hosts, clients, waiters, handoffs, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

# Throughput: one shared KazooClient, one thread and one lock per client.
zk = KazooClient(hosts=hosts)
zk.start(timeout=30)
count = [0] * clients
stop = threading.Event()
def spin(i):
    lock = zk.Lock("/kazoo/tp/%d" % i, "t%d" % i)
    while not stop.is_set():
        lock.acquire()
        lock.release()
        count[i] += 1
threads = [threading.Thread(target=spin, args=(i,)) for i in range(clients)]
for t in threads: t.start()
time.sleep(1.0)  # warm-up
start_count, start = sum(count), time.monotonic()
time.sleep(seconds)
pairs, elapsed = sum(count) - start_count, time.monotonic() - start
stop.set()
for t in threads: t.join()
zk.stop()
print("throughput %.1f" % (pairs / elapsed), flush=True)

# Handoff: a client (session) per waiter, all on one lock.
released = [None]
samples = []
guard = threading.Lock()
done = threading.Event()
def turn(i):
    c = KazooClient(hosts=hosts)
    c.start(timeout=30)
    lock = c.Lock("/kazoo/handoff", "w%d" % i)
    while not done.is_set():
        lock.acquire()
        now = time.monotonic()
        with guard:
            if released[0] is not None:
                samples.append(now - released[0])
            if len(samples) >= handoffs:
                done.set()
            released[0] = time.monotonic()
        lock.release()
    c.stop()
threads = [threading.Thread(target=turn, args=(i,)) for i in range(waiters)]
start = time.monotonic()
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.monotonic() - start
samples.sort()
p = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1000
print("handoff %.3f %.3f %.1f" % (p(0.5), p(0.99), len(samples) / elapsed), flush=True)
"#;

struct Row {
    client: &'static str,
    throughput: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
    handoffs_per_sec: Option<f64>,
}

fn main() {
    let seconds: f64 = std::env::var("ZK_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let server = ZooKeeper::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("{}/bench", server.url());

    let mut rows = Vec::new();
    let (shared, separate, handoff) = runtime.block_on(async {
        let shared = throughput(&url, Duration::from_secs_f64(seconds), true).await;
        let separate = throughput(&url, Duration::from_secs_f64(seconds), false).await;
        let handoff = handoff(&url).await;
        (shared, separate, handoff)
    });
    rows.push(Row {
        client: "locksmith (one session)",
        throughput: shared,
        p50: Some(handoff.0),
        p99: Some(handoff.1),
        handoffs_per_sec: Some(handoff.2),
    });
    rows.push(Row {
        client: "locksmith (64 sessions)",
        throughput: separate,
        p50: None,
        p99: None,
        handoffs_per_sec: None,
    });
    let kazoo = kazoo(&server, seconds);
    rows.push(kazoo);

    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!("ZooKeeper 3.8 standalone on 127.0.0.1 (fsync on), {nproc} CPUs shared by server and clients");
    println!();
    println!("| client | acquire+release pairs/s ({CLIENTS} clients) | handoff p50 ({WAITERS} waiters) | handoff p99 | handoffs/s |");
    println!("|---|---:|---:|---:|---:|");
    for row in &rows {
        let ms = |d: Option<Duration>| {
            d.map_or("–".into(), |d| {
                format!("{:.2} ms", d.as_secs_f64() * 1000.0)
            })
        };
        println!(
            "| {} | {:.0} | {} | {} | {} |",
            row.client,
            row.throughput,
            ms(row.p50),
            ms(row.p99),
            row.handoffs_per_sec
                .map_or("–".into(), |h| format!("{h:.0}"))
        );
    }
    let ratio = rows[0].throughput / rows[2].throughput;
    println!();
    println!("throughput ratio locksmith/kazoo: {ratio:.1}× (goal ≥ 3×)");
}

async fn connect(url: &str) -> Client {
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(10));
    Client::connect_with(url, options).await.expect("connect")
}

/// Pairs per second with `CLIENTS` tasks, each on its own lock.
async fn throughput(url: &str, length: Duration, one_session: bool) -> f64 {
    let shared = connect(url).await;
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let client = if one_session {
            shared.clone()
        } else {
            connect(url).await
        };
        let (count, stop) = (count.clone(), stop.clone());
        let name = format!("tp/{}/{i}", if one_session { "one" } else { "many" });
        tasks.push(tokio::spawn(async move {
            let lock = client.lock(name);
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.expect("acquire");
                guard.release().await.expect("release");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
    let (before, started) = (count.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(length).await;
    let pairs = count.load(Ordering::Relaxed) - before;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("task");
    }
    pairs as f64 / elapsed.as_secs_f64()
}

/// Handoff latency p50, p99 and handoffs per second with `WAITERS` clients
/// (sessions) taking turns on one lock.
async fn handoff(url: &str) -> (Duration, Duration, f64) {
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for _ in 0..WAITERS {
        let client = connect(url).await;
        let (released, samples, done) = (released.clone(), samples.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let lock = client.lock("handoff");
            while !done.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.expect("acquire");
                let now = Instant::now();
                {
                    let mut samples = samples.lock().unwrap();
                    let mut released = released.lock().unwrap();
                    if let Some(at) = *released {
                        samples.push(now - at);
                    }
                    if samples.len() >= HANDOFFS {
                        done.store(true, Ordering::Relaxed);
                    }
                    *released = Some(Instant::now());
                }
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    let mut samples = samples.lock().unwrap().clone();
    samples.sort();
    let at = |q: f64| samples[((q * samples.len() as f64) as usize).min(samples.len() - 1)];
    (
        at(0.5),
        at(0.99),
        samples.len() as f64 / elapsed.as_secs_f64(),
    )
}

/// kazoo's `Lock` doing the same, in a Python subprocess.
fn kazoo(server: &ZooKeeper, seconds: f64) -> Row {
    let hosts = format!("{}/bench", server.connect_string());
    let output = Command::new("python3")
        .args(["-c", KAZOO, &hosts])
        .args([
            CLIENTS.to_string(),
            WAITERS.to_string(),
            HANDOFFS.to_string(),
            seconds.to_string(),
        ])
        .output()
        .expect("python3 is needed for the kazoo comparison");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kazoo benchmark failed (pip install kazoo): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut row = Row {
        client: "kazoo 2.x Lock (Python threads)",
        throughput: 0.0,
        p50: None,
        p99: None,
        handoffs_per_sec: None,
    };
    for line in stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["throughput", value] => row.throughput = value.parse().unwrap(),
            ["handoff", p50, p99, rate] => {
                let ms = |v: &str| Duration::from_secs_f64(v.parse::<f64>().unwrap() / 1000.0);
                row.p50 = Some(ms(p50));
                row.p99 = Some(ms(p99));
                row.handoffs_per_sec = Some(rate.parse().unwrap());
            }
            _ => {}
        }
    }
    row
}
