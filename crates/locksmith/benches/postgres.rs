//! Benchmark of the postgres backend: acquire + release pairs per second with
//! 64 clients, session holds and lease (TTL) holds, beside `pgbench` running
//! the bare `pg_advisory_lock` / `pg_advisory_unlock` statements with the
//! same client count, all against one PostgreSQL in one run. `pgbench` also
//! runs the layout's own functions, to show where the time goes.
//!
//! ```text
//! cargo bench -p locksmith --features postgres --bench postgres
//! LOCKSMITH_BENCH_SECS=5 LOCKSMITH_BENCH_ROUNDS=3 LOCKSMITH_BENCH_CLIENTS=64
//! LOCKSMITH_BENCH_THREADS=2 (defaults; SECS: per scenario and round; THREADS:
//! tokio worker threads of the locksmith clients, as pgbench's -j 2)
//! LOCKSMITH_BENCH_ONLY=<text>: only the scenarios whose label contains it
//! (and the baseline)
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::Postgres;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs = env_number("LOCKSMITH_BENCH_SECS", 5);
    let clients = env_number("LOCKSMITH_BENCH_CLIENTS", 64) as usize;
    let pg = Postgres::start();
    // 64 clients with a holder connection and a pooled one each, plus
    // pgbench's 64: more than the default 100.
    pg.query("ALTER SYSTEM SET max_connections = 400")
        .expect("alter system");
    pg.restart();
    let pgbench = pgbench(pg.bin_dir());
    let threads = env_number("LOCKSMITH_BENCH_THREADS", 2) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    // Create the layout before pgbench calls its functions.
    runtime.block_on(async {
        Client::connect(&pg.url())
            .await
            .expect("connect")
            .close()
            .await
            .ok();
    });

    let scripts = [
        (
            "pgbench: pg_advisory_lock + pg_advisory_unlock (baseline)",
            "SELECT pg_advisory_lock(:client_id);\nSELECT pg_advisory_unlock(:client_id);\n",
        ),
        (
            "pgbench: lock + nextval(fencing_token) + unlock",
            "SELECT pg_advisory_lock(:client_id), nextval('locksmith.fencing_token');\n\
             SELECT pg_advisory_unlock(:client_id);\n",
        ),
        (
            "pgbench: acquire_session() + pg_advisory_unlock() (a session hold's slow path)",
            "SELECT token FROM locksmith.acquire_session('pgbench/' || :client_id, :client_id, '{}', 'o', 'pgbench', 'exclusive', NULL, false) \\gset\n\
             SELECT pg_advisory_unlock(:client_id);\n",
        ),
        (
            // Runs after acquire_session(), whose exclusive grants left the
            // rows quick.
            "pgbench: quick acquire + pg_advisory_unlock() (the statements of a session hold)",
            "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(:client_id) AS got), \
             h AS (UPDATE locksmith.session_holds s SET token = nextval('locksmith.fencing_token'), \
             owner = 'o', lock_by = 'pgbench', hold_count = 1, lock_time = clock_timestamp(), \
             pid = pg_backend_pid(), server_start = pg_postmaster_start_time() FROM l \
             WHERE l.got AND s.quick AND s.ctid = (SELECT o.ctid FROM locksmith.session_holds o \
             WHERE o.name = 'pgbench/' || :client_id AND o.key = :client_id AND o.quick LIMIT 1) \
             RETURNING s.token) SELECT l.got, h.token FROM l LEFT JOIN h ON true;\n\
             SELECT pg_advisory_unlock(:client_id);\n",
        ),
        (
            "pgbench: acquire_lease() + release_lease() (the statements of a lease hold)",
            "SELECT token FROM locksmith.acquire_lease('pgbench-lease/' || :client_id, :client_id, '{}', 'o', 'pgbench', 'exclusive', NULL, 30000, false) \\gset\n\
             SELECT locksmith.release_lease('pgbench-lease/' || :client_id, :token, 'o');\n",
        ),
    ];
    // Every round runs every scenario once, between two baseline runs; a
    // scenario's ratio in a round is its rate over the mean of that round's
    // baselines, and the table shows the median over the rounds: the machine
    // is shared, and its load drifts over minutes.
    let scenarios: Vec<(String, Scenario)> = vec![
        (
            format!("locksmith session holds ({clients} clients)"),
            Scenario::Locksmith {
                url: pg.url(),
                lease: None,
                read: false,
            },
        ),
        (
            format!("locksmith TTL holds, `locksmith_mode=ttl` ({clients} clients)"),
            Scenario::Locksmith {
                url: format!("{}?locksmith_mode=ttl", pg.url()),
                lease: None,
                read: false,
            },
        ),
        (
            format!("locksmith `.lease(30s)` holds, session mode ({clients} clients)"),
            Scenario::Locksmith {
                url: pg.url(),
                lease: Some(Duration::from_secs(30)),
                read: false,
            },
        ),
        (
            // The same client code through acquire_session(), the path readers
            // take: the A/B of the quick statement.
            format!("locksmith session read holds, `acquire_session()` path ({clients} clients)"),
            Scenario::Locksmith {
                url: pg.url(),
                lease: None,
                read: true,
            },
        ),
    ]
    .into_iter()
    .chain(
        scripts[1..]
            .iter()
            .map(|(label, script)| ((*label).to_owned(), Scenario::Pgbench(script))),
    )
    .filter(|(label, _)| {
        std::env::var("LOCKSMITH_BENCH_ONLY").map_or(true, |only| label.contains(&only))
    })
    .collect();
    let rounds = env_number("LOCKSMITH_BENCH_ROUNDS", 3) as usize;
    let mut baselines = Vec::new();
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    for round in 1..=rounds {
        eprintln!("round {round} of {rounds}");
        let before = run_pgbench(&pgbench, &pg, scripts[0].1, clients, secs);
        let mut round_rates = Vec::new();
        for (_, scenario) in &scenarios {
            round_rates.push(match scenario {
                Scenario::Pgbench(script) => run_pgbench(&pgbench, &pg, script, clients, secs),
                Scenario::Locksmith { url, lease, read } => {
                    runtime.block_on(run_locksmith(url, clients, secs, *lease, *read))
                }
            });
        }
        let after = run_pgbench(&pgbench, &pg, scripts[0].1, clients, secs);
        let baseline = (before + after) / 2.0;
        baselines.push(baseline);
        for (i, rate) in round_rates.into_iter().enumerate() {
            ratios[i].push(rate / baseline);
            rates[i].push(rate);
        }
    }

    println!();
    println!(
        "| scenario ({clients} clients, {secs} s each, median of {rounds} rounds) | pairs/s | vs pgbench baseline | ratio in each round |"
    );
    println!("|---|---:|---:|---|");
    println!(
        "| {} | {:.0} | 1.00x | {} |",
        scripts[0].0,
        median(&baselines),
        baselines
            .iter()
            .map(|b| format!("{b:.0}/s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (i, (label, _)) in scenarios.iter().enumerate() {
        println!(
            "| {label} | {:.0} | {:.2}x | {} |",
            median(&rates[i]),
            median(&ratios[i]),
            ratios[i]
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// One measured scenario besides the baseline.
enum Scenario {
    /// pgbench running this script.
    Pgbench(&'static str),
    /// locksmith clients acquiring and releasing (see [`run_locksmith`]).
    Locksmith {
        url: String,
        lease: Option<Duration>,
        read: bool,
    },
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn pgbench(bin_dir: &Path) -> PathBuf {
    let candidate = bin_dir.join("pgbench");
    if candidate.exists() {
        return candidate;
    }
    locksmith_testkit::binary("pgbench", "postgresql-contrib")
}

/// Runs pgbench with `script`; transactions (= pairs) per second.
fn run_pgbench(pgbench: &Path, pg: &Postgres, script: &str, clients: usize, secs: u64) -> f64 {
    let dir = std::env::temp_dir().join(format!("locksmith-pgbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("script.sql");
    std::fs::write(&file, script).expect("write script");
    let output = Command::new(pgbench)
        .args(["-n", "-M", "prepared", "-j", "2"])
        .args(["-c", &clients.to_string(), "-T", &secs.to_string()])
        .arg("-f")
        .arg(&file)
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string()])
        .args(["-U", "postgres", "postgres"])
        .output()
        .expect("run pgbench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let tps = stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix("tps = ")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| {
            panic!(
                "pgbench failed: {}\n{stdout}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    eprintln!("{script:?}: {tps:.0} tps");
    tps
}

/// `clients` clients (each its own `Client`), each acquiring and releasing a
/// lock of its own in a loop; pairs per second.
/// `read`: shared (read) holds instead of exclusive ones.
async fn run_locksmith(
    url: &str,
    clients: usize,
    secs: u64,
    lease: Option<Duration>,
    read: bool,
) -> f64 {
    let mut connected = Vec::new();
    for _ in 0..clients {
        let options = ConnectOptions::default().session_ttl(Duration::from_secs(30));
        connected.push(
            Client::connect_with(url, options)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}")),
        );
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    // Warm up: the first acquire opens the holder connection.
    for (i, client) in connected.iter().enumerate() {
        let guard = client
            .lock(format!("bench/{run}/{i}"))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    let pairs = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, client) in connected.iter().enumerate() {
        let (client, pairs, stop) = (client.clone(), pairs.clone(), stop.clone());
        let name = format!("bench/{run}/{i}");
        tasks.push(tokio::spawn(async move {
            let mut lock = if read {
                client.rw_lock(name).read()
            } else {
                client.lock(name)
            };
            if let Some(lease) = lease {
                lock = lock.lease(lease);
            }
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.expect("acquire");
                guard.release().await.expect("release");
                pairs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("bench task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu() - cpu_before;
    let done = pairs.load(Ordering::Relaxed) as f64;
    let rate = done / elapsed;
    for client in connected {
        let _ = client.close().await;
    }
    eprintln!(
        "locksmith {url} lease={lease:?} read={read}: {rate:.0} pairs/s; client CPU {:.0} us/pair ({:.0}% of a core)",
        cpu / done * 1e6,
        cpu / elapsed * 100.0
    );
    rate
}

/// CPU seconds (user + system) this process has used.
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the comm.
    (ticks(11) + ticks(12)) / 100.0
}
