//! etcd lock clients side by side, on one fresh etcd, in one run:
//!
//! - **locksmith**: this crate's `etcd://` backend.
//! - **Go concurrency.Mutex (port)**: the client-side algorithm of Go's
//!   `concurrency.Mutex` (what `etcdctl lock` and Go programs run), ported
//!   call for call onto the same Rust client, since there is no Go toolchain
//!   here.
//! - **etcd v3lock**: etcd's own lock service (`v3lockpb.Lock` / `Unlock`, here
//!   through the generated client in `locksmith::etcd::rpc`). The server runs Go's
//!   `concurrency.NewMutex(session, name).Lock()` on the caller's lease, so this
//!   is Go's `concurrency.Mutex`, measured without needing a Go toolchain
//!   (the client's extra hop is inside etcd, on loopback).
//! - **etcdctl lock**: `etcdctl lock <name> -- <cmd>` processes (Debian's
//!   etcd-client); every pair is a process spawn, a connection and a session.
//!
//! Scenarios: acquire+release pairs per second with 64 clients (each on a lock
//! of its own, and all on one lock), and the handoff latency with 16 waiters
//! on one lock (from the holder's release call to the next holder's grant;
//! for etcdctl, from one command's start to the next one's, which includes a
//! `bash` exec).
//!
//! ```text
//! cargo bench -p locksmith --features etcd --bench etcd
//! LOCKSMITH_BENCH_SECS=10 cargo bench -p locksmith --features etcd --bench etcd
//! ```

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith::etcd::rpc::etcdserverpb::range_request::SortOrder;
use locksmith::etcd::rpc::etcdserverpb::{RangeRequest, TxnRequest, WatchCreateRequest};
use locksmith::etcd::rpc::mvccpb::event::EventType;
use locksmith::etcd::rpc::v3lockpb::{LockRequest, UnlockRequest};
use locksmith::etcd::rpc::{self, EtcdClient};
use locksmith::{Client, ConnectOptions};
use locksmith_testkit::Etcd;
use tokio::time::Instant;

/// Bench clients of the throughput scenarios (`LOCKSMITH_BENCH_CLIENTS`).
static CLIENTS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| knob("LOCKSMITH_BENCH_CLIENTS", 64));
/// Waiters of the handoff scenario (`LOCKSMITH_BENCH_WAITERS`).
static WAITERS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| knob("LOCKSMITH_BENCH_WAITERS", 16));

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
const WARMUP: Duration = Duration::from_millis(500);

/// Whether to run a scenario (`LOCKSMITH_BENCH_SCENARIOS=own,one,handoff`,
/// default all).
fn scenario(name: &str) -> bool {
    let only = std::env::var("LOCKSMITH_BENCH_SCENARIOS").unwrap_or_default();
    only.is_empty() || only.split(',').any(|s| s == name)
}

/// Rounds per scenario (`LOCKSMITH_BENCH_ROUNDS`).
fn rounds() -> usize {
    knob("LOCKSMITH_BENCH_ROUNDS", 3)
}

fn seconds() -> Duration {
    let secs = std::env::var("LOCKSMITH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    Duration::from_secs(secs)
}

/// The etcd server's pid, for its CPU time.
static ETCD_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// CPU time (user + system) of a process so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime, in clock ticks of 10 ms.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// CPU per pair spent in this process and in etcd during a throughput run.
#[derive(Default, Clone, Copy)]
struct CpuPerPair {
    client: Duration,
    etcd: Duration,
}

static LAST_CPU: Mutex<CpuPerPair> = Mutex::new(CpuPerPair {
    client: Duration::ZERO,
    etcd: Duration::ZERO,
});

/// Pairs per second over `seconds()`, after a warm-up, of `CLIENTS` loops.
async fn throughput<F, Fut>(make: F) -> f64
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..*CLIENTS)
        .map(|i| tokio::spawn(make(i, stop.clone(), done.clone())))
        .collect();
    tokio::time::sleep(WARMUP).await;
    let etcd = ETCD_PID.get().map_or(String::new(), u32::to_string);
    let (client_before, etcd_before) = (cpu_time("self"), cpu_time(&etcd));
    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(seconds()).await;
    let pairs = done.load(Ordering::Relaxed) - before;
    let rate = pairs as f64 / start.elapsed().as_secs_f64();
    *LAST_CPU.lock().unwrap() = CpuPerPair {
        client: (cpu_time("self") - client_before) / pairs.max(1) as u32,
        etcd: (cpu_time(&etcd) - etcd_before) / pairs.max(1) as u32,
    };
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("bench task");
    }
    rate
}

/// Handoff latencies: `WAITERS` loops on one lock; each grant measures the time
/// since the previous holder called release.
struct Handoffs {
    last_release: Mutex<Option<Instant>>,
    samples: Mutex<Vec<Duration>>,
}

impl Handoffs {
    fn new() -> Arc<Self> {
        Arc::new(Handoffs {
            last_release: Mutex::new(None),
            samples: Mutex::new(Vec::new()),
        })
    }

    fn granted(&self) {
        if let Some(at) = self.last_release.lock().unwrap().take() {
            self.samples.lock().unwrap().push(at.elapsed());
        }
    }

    fn releasing(&self) {
        *self.last_release.lock().unwrap() = Some(Instant::now());
    }
}

async fn handoff<F, Fut>(make: F) -> Vec<Duration>
where
    F: Fn(usize, Arc<AtomicBool>, Arc<Handoffs>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let handoffs = Handoffs::new();
    let tasks: Vec<_> = (0..*WAITERS)
        .map(|i| tokio::spawn(make(i, stop.clone(), handoffs.clone())))
        .collect();
    tokio::time::sleep(WARMUP).await;
    handoffs.samples.lock().unwrap().clear();
    tokio::time::sleep(seconds()).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("bench task");
    }
    let samples = std::mem::take(&mut *handoffs.samples.lock().unwrap());
    samples
}

struct Percentiles {
    count: usize,
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

impl Percentiles {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at =
            |q: usize| samples.get((samples.len() * q / 100).min(samples.len().saturating_sub(1)));
        let total: Duration = samples.iter().sum();
        Percentiles {
            count: samples.len(),
            p50: at(50).copied().unwrap_or_default(),
            p99: at(99).copied().unwrap_or_default(),
            mean: total / samples.len().max(1) as u32,
        }
    }

    fn cell(&self) -> String {
        format!(
            "{:.2} ms | {:.2} ms | {:.2} ms | {}",
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.mean.as_secs_f64() * 1e3,
            self.count
        )
    }
}

async fn locksmith_client(url: &str) -> Client {
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(30));
    Client::connect_with(url, options).await.expect("connect")
}

/// The scenarios, for one in-process client kind.
trait Contender: Sync {
    /// Pairs/s with each client on the lock `names(i)`.
    async fn pairs(&self, names: &(dyn Fn(usize) -> String + Sync)) -> f64;
    /// Handoff latencies on the lock `name`.
    async fn handoffs(&self, name: &str) -> Vec<Duration>;
}

struct Locksmith {
    clients: Vec<Client>,
}

impl Locksmith {
    async fn connect(url: &str) -> Self {
        let mut clients = Vec::new();
        for _ in 0..*CLIENTS {
            clients.push(locksmith_client(url).await);
        }
        Locksmith { clients }
    }
}

impl Contender for Locksmith {
    async fn pairs(&self, names: &(dyn Fn(usize) -> String + Sync)) -> f64 {
        throughput(|i, stop, done| {
            let lock = self.clients[i].lock(names(i));
            async move {
                while !stop.load(Ordering::Relaxed) {
                    lock.acquire().await.unwrap().release().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await
    }

    async fn handoffs(&self, name: &str) -> Vec<Duration> {
        handoff(|i, stop, handoffs| {
            let lock = self.clients[i % self.clients.len()].lock(name);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.acquire().await.unwrap();
                    handoffs.granted();
                    handoffs.releasing();
                    guard.release().await.unwrap();
                }
            }
        })
        .await
    }
}

/// Which lock protocol a [`Raw`] contender speaks.
#[derive(Clone, Copy)]
enum Protocol {
    /// etcd's lock service: `Lock` / `Unlock` RPCs.
    V3Lock,
    /// Go's client-side `concurrency.Mutex`, ported line by line
    /// (`client/v3/concurrency/mutex.go` `Lock`/`Unlock`, `key.go`
    /// `waitDeletes`) onto the same Rust etcd client: the algorithm `etcdctl
    /// lock` and Go programs run, without a Go toolchain.
    GoMutex,
}

/// One etcd client and one lease (long enough for the run) per bench client,
/// locking with `protocol`.
struct Raw {
    protocol: Protocol,
    clients: Vec<(EtcdClient, i64)>,
}

impl Raw {
    async fn connect(endpoint: &str, protocol: Protocol) -> Self {
        let mut clients = Vec::new();
        for _ in 0..*CLIENTS {
            let client = EtcdClient::connect(&[endpoint.to_owned()], None, None)
                .await
                .expect("connect");
            let lease = client.grant_lease(600).await.expect("lease").id;
            clients.push((client, lease));
        }
        Raw { protocol, clients }
    }

    async fn revoke(self) {
        for (client, lease) in self.clients {
            let _ = client.revoke_lease(lease).await;
        }
    }
}

impl Protocol {
    /// Acquires; returns the key to release.
    async fn lock(self, client: &EtcdClient, name: &str, lease: i64) -> Vec<u8> {
        match self {
            Protocol::V3Lock => {
                let request = LockRequest {
                    name: name.as_bytes().to_vec(),
                    lease,
                };
                client
                    .lock()
                    .lock(request)
                    .await
                    .expect("lock")
                    .into_inner()
                    .key
            }
            Protocol::GoMutex => go_lock(client, name, lease).await.into_bytes(),
        }
    }

    async fn unlock(self, client: &EtcdClient, key: Vec<u8>) {
        match self {
            Protocol::V3Lock => drop(
                client
                    .lock()
                    .unlock(UnlockRequest { key })
                    .await
                    .expect("unlock"),
            ),
            // `Mutex.Unlock`: `Delete(myKey)`.
            Protocol::GoMutex => drop(client.delete(rpc::delete(key)).await.expect("unlock")),
        }
    }
}

/// `Mutex.Lock`: returns `myKey`.
async fn go_lock(client: &EtcdClient, name: &str, lease: i64) -> String {
    let pfx = format!("{name}/");
    let my_key = format!("{pfx}{lease:x}");
    let first = RangeRequest {
        limit: 1,
        ..rpc::by_create(&pfx, SortOrder::Ascend)
    };
    let txn = TxnRequest {
        compare: vec![rpc::create_revision_is(my_key.as_str(), 0)],
        success: vec![
            rpc::put(my_key.as_str(), "", lease).into(),
            first.clone().into(),
        ],
        failure: vec![rpc::get(my_key.as_str()).into(), first.into()],
    };
    let response = client.txn(txn).await.expect("tryAcquire");
    let header_revision = rpc::revision(response.header.as_ref());
    let succeeded = response.succeeded;
    let gets = rpc::read_results(response);
    let my_rev = if succeeded {
        header_revision
    } else {
        gets[0][0].create_revision
    };
    if gets[1].is_empty() || gets[1][0].create_revision == my_rev {
        return my_key;
    }
    // waitDeletes(ctx, client, m.pfx, m.myRev-1)
    let last = RangeRequest {
        limit: 1,
        max_create_revision: my_rev - 1,
        ..rpc::by_create(&pfx, SortOrder::Descend)
    };
    loop {
        let response = client.range(last.clone()).await.expect("get");
        let Some(last_key) = response.kvs.first().map(|kv| kv.key.clone()) else {
            break;
        };
        // waitDelete(ctx, client, lastKey, resp.Header.Revision)
        let rev = rpc::revision(response.header.as_ref());
        let mut watch = client
            .watch_stream(WatchCreateRequest {
                key: last_key,
                start_revision: rev,
                ..WatchCreateRequest::default()
            })
            .await
            .expect("watch");
        'watch: while let Some(message) = watch.message().await.expect("watch message") {
            for event in &message.events {
                if event.r#type == EventType::Delete as i32 {
                    break 'watch;
                }
            }
        }
    }
    // The session key must still exist (etcd #11408).
    let mine = client.range(rpc::get(my_key.as_str())).await.expect("get");
    assert!(!mine.kvs.is_empty(), "session expired");
    my_key
}

impl Contender for Raw {
    async fn pairs(&self, names: &(dyn Fn(usize) -> String + Sync)) -> f64 {
        throughput(|i, stop, done| {
            let ((client, lease), name) = (self.clients[i].clone(), names(i));
            let protocol = self.protocol;
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let key = protocol.lock(&client, &name, lease).await;
                    protocol.unlock(&client, key).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await
    }

    async fn handoffs(&self, name: &str) -> Vec<Duration> {
        handoff(|i, stop, handoffs| {
            let (client, lease) = self.clients[i % self.clients.len()].clone();
            let (name, protocol) = (name.to_owned(), self.protocol);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let key = protocol.lock(&client, &name, lease).await;
                    handoffs.granted();
                    handoffs.releasing();
                    protocol.unlock(&client, key).await;
                }
            }
        })
        .await
    }
}

/// One row of the table.
#[derive(Default)]
struct Row {
    own: Vec<f64>,
    /// CPU per pair in the own-locks scenario, per round.
    cpu: Vec<CpuPerPair>,
    one: Vec<f64>,
    handoffs: Vec<Duration>,
}

impl Row {
    /// Median client and etcd CPU per pair, in µs, or "–".
    fn cpu_cells(&self) -> String {
        if self.cpu.is_empty() {
            return "– | –".into();
        }
        let median = |pick: fn(&CpuPerPair) -> Duration| {
            let mut values: Vec<Duration> = self.cpu.iter().map(pick).collect();
            values.sort();
            values[values.len() / 2].as_micros()
        };
        format!("{} µs | {} µs", median(|c| c.client), median(|c| c.etcd))
    }

    fn median(rates: &[f64]) -> f64 {
        let mut sorted = rates.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    }
}

/// Runs every scenario `rounds()` times, alternating the contenders within
/// each round so that load drifting on the machine hits them alike.
async fn interleaved(contenders: &[(&str, &dyn ContenderDyn)], run: &str) -> Vec<Row> {
    let mut rows: Vec<Row> = contenders.iter().map(|_| Row::default()).collect();
    for round in 0..rounds() {
        for (k, (label, contender)) in contenders.iter().enumerate() {
            eprintln!("round {round}: {label}");
            if scenario("own") {
                let own = |i: usize| format!("bench/{run}/{label}/own-{i}");
                rows[k].own.push(contender.pairs_dyn(&own).await);
                rows[k].cpu.push(*LAST_CPU.lock().unwrap());
            }
            if scenario("one") {
                let one = |_: usize| format!("bench/{run}/{label}/one");
                rows[k].one.push(contender.pairs_dyn(&one).await);
            }
            if scenario("handoff") {
                let name = format!("bench/{run}/{label}/handoff");
                let samples = contender.handoffs_dyn(&name).await;
                rows[k].handoffs.extend(samples);
            }
        }
    }
    rows
}

/// Object-safe face of [`Contender`].
trait ContenderDyn: Sync {
    fn pairs_dyn<'a>(
        &'a self,
        names: &'a (dyn Fn(usize) -> String + Sync),
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = f64> + 'a>>;
    fn handoffs_dyn<'a>(
        &'a self,
        name: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Duration>> + 'a>>;
}

impl<T: Contender> ContenderDyn for T {
    fn pairs_dyn<'a>(
        &'a self,
        names: &'a (dyn Fn(usize) -> String + Sync),
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = f64> + 'a>> {
        Box::pin(self.pairs(names))
    }

    fn handoffs_dyn<'a>(
        &'a self,
        name: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Duration>> + 'a>> {
        Box::pin(self.handoffs(name))
    }
}

/// `etcdctl lock <name> -- <command…>` until `stop`; returns each run's stdout.
fn etcdctl_loop(
    etcd: &Etcd,
    name: String,
    command: &[&str],
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<String> {
    let mut outputs = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let output = etcd
            .etcdctl()
            .args(["lock", &name, "--"])
            .args(command)
            .stderr(Stdio::null())
            .output()
            .expect("etcdctl lock");
        assert!(output.status.success(), "{output:?}");
        done.fetch_add(1, Ordering::Relaxed);
        outputs.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    outputs
}

fn etcdctl_rows(etcd: &'static Etcd, run: &str) -> Row {
    let rate = |names: &dyn Fn(usize) -> String| {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..*CLIENTS)
            .map(|i| {
                let (name, stop, done) = (names(i), stop.clone(), done.clone());
                std::thread::spawn(move || etcdctl_loop(etcd, name, &["true"], stop, done))
            })
            .collect();
        std::thread::sleep(WARMUP);
        let (start, before) = (std::time::Instant::now(), done.load(Ordering::Relaxed));
        std::thread::sleep(seconds());
        let rate = (done.load(Ordering::Relaxed) - before) as f64 / start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread.join().expect("etcdctl thread");
        }
        rate
    };
    let own = rate(&|i| format!("bench/{run}/etcdctl/own-{i}"));
    let one = rate(&|_| format!("bench/{run}/etcdctl/one"));

    // Each command prints when it started (bash's $EPOCHREALTIME, no extra exec);
    // consecutive starts on one lock are one handoff plus the command's run.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let name = format!("bench/{run}/etcdctl/handoff");
    let threads: Vec<_> = (0..*WAITERS)
        .map(|_| {
            let (name, stop, done) = (name.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                etcdctl_loop(
                    etcd,
                    name,
                    &["bash", "-c", "echo $EPOCHREALTIME"],
                    stop,
                    done,
                )
            })
        })
        .collect();
    std::thread::sleep(WARMUP + seconds());
    stop.store(true, Ordering::Relaxed);
    let mut starts: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("etcdctl thread"))
        .filter_map(|out| out.trim().parse::<f64>().ok())
        .collect();
    starts.sort_by(f64::total_cmp);
    let gaps = starts
        .windows(2)
        .skip(*WAITERS) // warm-up: the queue fills
        .map(|w| Duration::from_secs_f64(w[1] - w[0]))
        .collect();
    Row {
        own: vec![own],
        cpu: Vec::new(),
        one: vec![one],
        handoffs: gaps,
    }
}

fn main() {
    let etcd: &'static Etcd = Box::leak(Box::new(Etcd::start()));
    if let Some(pid) = etcd.pid() {
        let _ = ETCD_PID.set(pid);
    }
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // LOCKSMITH_BENCH_ONLY=locksmith,go,v3lock,etcdctl picks clients (default: all).
    let only = std::env::var("LOCKSMITH_BENCH_ONLY").unwrap_or_default();
    let wanted = |client: &str| only.is_empty() || only.split(',').any(|c| c == client);
    let mut rows = Vec::new();
    runtime.block_on(async {
        let locksmith = Locksmith::connect(&etcd.url()).await;
        let v3lock = Raw::connect(&etcd.endpoint(), Protocol::V3Lock).await;
        let go = Raw::connect(&etcd.endpoint(), Protocol::GoMutex).await;
        let mut contenders: Vec<(&str, &dyn ContenderDyn)> = Vec::new();
        if wanted("locksmith") {
            contenders.push(("locksmith", &locksmith));
        }
        if wanted("go") {
            contenders.push(("go", &go));
        }
        if wanted("v3lock") {
            contenders.push(("v3lock", &v3lock));
        }
        let measured = interleaved(&contenders, &run).await;
        for ((label, _), row) in contenders.iter().zip(measured) {
            let label = match *label {
                "locksmith" => "locksmith etcd backend",
                "go" => "Go concurrency.Mutex algorithm (Rust port, same client)",
                _ => "etcd v3lock service (Go concurrency.Mutex inside etcd)",
            };
            rows.push((label, row));
        }
        for client in &locksmith.clients {
            client.close().await.unwrap();
        }
        v3lock.revoke().await;
        go.revoke().await;
    });
    if wanted("etcdctl") {
        eprintln!("etcdctl lock …");
        rows.push(("etcdctl lock (process per pair)", etcdctl_rows(etcd, &run)));
    }

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let version = Command::new(locksmith_testkit::binary("etcd", "etcd-server"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.lines().next().map(str::to_owned))
        .unwrap_or_default();
    println!(
        "{} CPUs ({cpu}), {version}, single member on loopback; in-process clients: median of {} interleaved rounds of {} s per scenario, etcdctl: one round\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        rounds(),
        seconds().as_secs()
    );
    println!(
        "| client | pairs/s, {} clients, own locks | client CPU / pair | etcd CPU / pair | pairs/s, {} clients, one lock | handoff p50 ({} waiters) | handoff p99 | handoff mean | handoffs |",
        *CLIENTS, *CLIENTS, *WAITERS
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, row) in rows {
        let latency = Percentiles::of(row.handoffs.clone());
        println!(
            "| {label} | {:.0} | {} | {:.0} | {} |",
            Row::median(&row.own),
            row.cpu_cells(),
            Row::median(&row.one),
            latency.cell()
        );
    }
}
