//! `locksmith-lab bench`: the same scenarios against every backend in one run.
//!
//! Every comparison of Redis, ZooKeeper, etcd and databases for locking ends
//! with "which one should I choose?"; this command answers with measurements.
//! It drives each backend through the public client API only
//! (`Client::connect_with`, `lock`, `acquire`, `release`), so the figures are
//! what an application sees, client library included, and one code path
//! measures every store.
//!
//! # Scenarios
//!
//! - **(a) uncontended**: C clients (`--clients 1,16,64`), each its own
//!   connection, loop acquire + release on a lock of their own: pairs per
//!   second and pair latency.
//! - **(b) handoff**: W waiters (`--waiters`) on one lock, no hold time. The
//!   releaser records the instant just before it calls release; the next
//!   grantee measures from there to the return of its acquire. Both run in this
//!   process, so the figure is exact: p50 / p99 / max and transfers per second.
//! - **(c) fairness**: F clients (`--fair-clients`) on one lock, each holding it
//!   `--fair-hold`: the spread of wait times and Jain's index of grants per
//!   client.
//! - **(d) scale**: `--scale-clients` clients hold N distinct locks at once
//!   between them (`--scale`, and `--scale-server` for the locksmith server):
//!   time to hold them all, and the server's memory (PSS of its process tree,
//!   from /proc) when this run started the server.
//! - **(e) sessions** (not by default; the locksmith server and cluster,
//!   etcd, ZooKeeper and Redis this run started): `--idle-sessions`
//!   sessions kept alive and doing nothing else (a Redis hold under a
//!   watchdog), beside the handoff loop of (b): each member's CPU and
//!   memory, the renewal answer p50 / p99, and the handoff p50 with and
//!   without them (module `sessions`).
//! - **(f) backup** (locksmith server and cluster only, not by default):
//!   `--scale-server` held locks, then `--saves` runs of `locksmith
//!   snapshot save` beside the handoff loop of (b): each save's wall time,
//!   the file's size, and the handoff p99 during the saves and without;
//!   on a cluster, a new member joining (the time until it is caught up,
//!   and the handoff p99 meanwhile); then `snapshot restore` into a new
//!   cluster and the time until it grants (module `backup`).
//!
//! # Backends
//!
//! `--backend [LABEL=]URL` (repeatable) measures a running store;
//! `--spawn server,redis,zookeeper,etcd,postgres,memory` (or `all`) starts real
//! servers on loopback ports with `locksmith-testkit` (the locksmith server as
//! `locksmith serve`, the `locksmith` executable run as a child of this one;
//! [`crate::server_executable`] says where it is found) and kills them at the
//! end.
//! Replicated setups are named one by one: `redis-sentinel` (a primary, 2
//! replicas, 3 Sentinels), `redis-cluster` (3 primaries with a replica each),
//! `redlock` (5 masters), `zookeeper-ensemble` (also `zookeeper-cluster`) and
//! `etcd-cluster` (3 members each). A Sentinel setup and a Cluster are
//! measured twice, as clients connect by default (each grant waits for a
//! replica) and with `wait_replicas=0` (`…-nowait`): the difference is the
//! cost of replica acknowledgement.
//!
//! The timed scenarios (a)–(c) run in rounds (`--repeat N`): each round
//! measures every backend once, in turn, so that load from elsewhere on the
//! machine spreads over all backends instead of spoiling one, and the report
//! shows each backend's median round. The report also records the load
//! average and the disk's `fdatasync` latency at the start and the end, since
//! every durable store waits for the disk, and for each measurement of (a)
//! and (b) the CPU per operation of the bench's process and of the store's
//! processes this run started, each as time run and time spent waiting for
//! a CPU (module `cpu`): on a small machine the bench shares its CPUs with
//! the servers it measures, and those waits are part of the latencies.
//! With neither, the run measures `memory://`. Ratios are against the locksmith
//! server when it is part of the run.
//!
//! # Output
//!
//! A Markdown report on stdout and in `--out` (default `locksmith-bench/`):
//! `report.md`, `report.json`, and SVG charts `throughput.svg`,
//! `handoff-latency.svg`, `fairness-wait.svg`. A progress bar runs on stderr.
//! The exit status is 1 when any scenario failed (the report still lists the
//! others).

mod backup;
mod chart;
mod cpu;
mod machine;
mod report;
mod scenario;
mod serve_process;
mod sessions;
mod stats;
pub(crate) mod target;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::parse_duration;
use machine::Machine;
use report::{BackendReport, Outcome, Report, RunSettings};
use scenario::{Contended, Scale, Settings, Uncontended};
use stats::Samples;
use target::{BackendSpec, Kind, Placement, Target};

/// The scenarios of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScenarioName {
    /// (a) uncontended acquire + release pairs per second.
    Uncontended,
    /// (b) contended handoff latency and transfers per second.
    Handoff,
    /// (c) fairness of waits under contention.
    Fairness,
    /// (d) time and memory to hold many locks.
    Scale,
    /// (e) idle sessions beside a handoff loop (stores this run started).
    Sessions,
    /// (f) backups of many held locks beside a handoff loop, a member
    /// joining (on a cluster), and a restore (locksmith server only).
    Backup,
}

/// A comma-separated list of backend kinds, for `--spawn`.
#[derive(Debug, Clone)]
pub struct KindList(pub Vec<Kind>);

fn parse_kind_list(text: &str) -> Result<KindList, String> {
    target::parse_kinds(text).map(KindList)
}

/// Options of `locksmith-lab bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A lock store to measure, as URL or LABEL=URL (repeatable).
    #[arg(long = "backend", value_name = "[LABEL=]URL")]
    backends: Vec<BackendSpec>,
    /// Start real servers on loopback ports and measure them: a comma-separated
    /// list of server, memory, redis, zookeeper, etcd, postgres, or `all`, and
    /// the replicated setups redis-sentinel, redis-cluster, redlock,
    /// zookeeper-ensemble (or zookeeper-cluster), etcd-cluster.
    #[arg(long, value_name = "LIST", value_parser = parse_kind_list)]
    spawn: Option<KindList>,
    /// Which scenarios to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "uncontended,handoff,fairness,scale"
    )]
    scenarios: Vec<ScenarioName>,
    /// Small counts and short runs (for CI): 1 s per measurement, 2 000 locks
    /// for scale (20 000 on the server), unless set explicitly.
    #[arg(long)]
    quick: bool,
    /// Client counts of the uncontended scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Run each timed measurement this many times and report the median run
    /// (every run's rate goes to report.json).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Length of each timed measurement [default: 5s, quick: 1s].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Waiters in the handoff scenario.
    #[arg(long, default_value_t = 8)]
    waiters: usize,
    /// Clients in the fairness scenario.
    #[arg(long, default_value_t = 16)]
    fair_clients: usize,
    /// How long each holder keeps the lock in the fairness scenario.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    fair_hold: Duration,
    /// Locks held at once in the scale scenario [default: 100000, quick: 2000].
    #[arg(long)]
    scale: Option<u64>,
    /// Locks held at once in the scale scenario on the locksmith server
    /// [default: 1000000, quick: 20000].
    #[arg(long)]
    scale_server: Option<u64>,
    /// Clients holding the scale scenario's locks between them (each its own
    /// connection and session).
    #[arg(long, default_value_t = 16)]
    scale_clients: usize,
    /// Acquires in flight at once in the scale scenario (over all its clients).
    #[arg(long, default_value_t = 256)]
    scale_concurrency: usize,
    /// Session TTL of every client.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    session_ttl: Duration,
    /// The kernel's time slice for this bench's own threads (Linux 6.12 or
    /// later; 100us to 100ms). A short one lets a client woken by an answer
    /// run at once instead of after the server thread holding its CPU: on a
    /// machine the bench shares with the servers it measures, that wait is
    /// otherwise part of every latency. The stores it starts keep the
    /// default. [default: the kernel's]
    #[arg(long, value_parser = crate::scheduling::parse_slice, value_name = "DURATION")]
    pub client_slice: Option<Duration>,
    /// Idle sessions in the sessions scenario [default: 10000, quick: 1000].
    #[arg(long)]
    idle_sessions: Option<usize>,
    /// Sessions to an HTTP/2 connection in the sessions scenario (the
    /// server allows 256 by default).
    #[arg(long, default_value_t = 200)]
    sessions_per_connection: usize,
    /// Renew each idle session at its own instant (to within about 50 µs),
    /// as independent clients' renewals arrive, rather than on tokio's
    /// timer, which sends every renewal due within a millisecond at once
    /// (as one client process's do).
    #[arg(long)]
    spread_renewals: bool,
    /// In the sessions scenario on the locksmith server, open a session
    /// stream for each idle session instead of channels of one `Sessions`
    /// stream per connection.
    #[arg(long)]
    stream_per_session: bool,
    /// Backups taken in the backup scenario, each after `--duration` of the
    /// handoff loop alone.
    #[arg(long, default_value_t = 3)]
    saves: usize,
    /// Directory for report.md, report.json and the SVG charts.
    #[arg(long, default_value = "locksmith-bench")]
    out: PathBuf,
}

impl BenchArgs {
    fn duration(&self) -> Duration {
        self.duration.unwrap_or(if self.quick {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(5)
        })
    }

    fn scale_count(&self, kind: Kind) -> u64 {
        match (kind, self.quick) {
            (Kind::Server, false) => self.scale_server.unwrap_or(1_000_000),
            (Kind::Server, true) => self.scale_server.unwrap_or(20_000),
            (_, false) => self.scale.unwrap_or(100_000),
            (_, true) => self.scale.unwrap_or(2_000),
        }
    }

    /// Locks held in the backup scenario (the server's scale count).
    fn backup_locks(&self) -> u64 {
        self.scale_count(Kind::Server)
    }

    fn runs(&self, scenario: ScenarioName) -> bool {
        self.scenarios.contains(&scenario)
    }
}

/// One backend to measure: a running store, or one to start.
enum Plan {
    Given(BackendSpec),
    Spawn(Kind),
}

impl Plan {
    fn kind(&self) -> Kind {
        match self {
            Plan::Given(spec) => Kind::of_url(&spec.url).unwrap_or(Kind::Memory),
            Plan::Spawn(kind) => *kind,
        }
    }
}

/// Samples kept for the charts.
#[derive(Default)]
struct ChartData {
    handoff: Vec<(String, Samples)>,
    waits: Vec<(String, Samples)>,
}

/// Runs the benchmark scenarios.
///
/// Cancel safety: dropped midway, it writes no report; the servers it
/// started are killed as they drop (one still starting on a blocking thread
/// when that start returns), and the running scenario's holds end with its
/// clients.
pub async fn bench(args: BenchArgs) -> std::process::ExitCode {
    if args.clients.is_empty()
        || args.clients.contains(&0)
        || args.waiters == 0
        || args.fair_clients == 0
        || args.scale_clients == 0
        || args.scale_concurrency == 0
    {
        eprintln!(
            "locksmith-lab bench: client, waiter, fair-client, scale-client and scale-concurrency \
             counts must be at least 1"
        );
        return ExitCode::from(2);
    }
    let spawn = args.spawn.as_ref().map(|k| k.0.clone()).unwrap_or_default();
    if let Err(error) = target::check_can_spawn(&spawn) {
        eprintln!("locksmith-lab bench: {error}");
        return ExitCode::from(2);
    }
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let load_at_start = machine::load_average();
    let fsync_at_start = tokio::task::spawn_blocking(machine::fsync_probe)
        .await
        .ok()
        .flatten();

    // What to measure, the reference (the locksmith server) first.
    let given = if args.backends.is_empty() && spawn.is_empty() {
        vec![BackendSpec {
            label: "memory".into(),
            url: format!("memory://locksmith-bench-{}", std::process::id()),
        }]
    } else {
        args.backends.clone()
    };
    let mut plan: Vec<Plan> = given
        .into_iter()
        .map(Plan::Given)
        .chain(spawn.into_iter().map(Plan::Spawn))
        .collect();
    plan.sort_by_key(Plan::kind);
    let mut labels = std::collections::HashSet::new();
    let mut unique = |label: String| {
        let mut candidate = label.clone();
        let mut n = 2;
        while !labels.insert(candidate.clone()) {
            candidate = format!("{label}#{n}");
            n += 1;
        }
        candidate
    };

    let settings = Settings {
        duration: args.duration(),
        session_ttl: args.session_ttl,
        prefix: format!(
            "bench/{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ),
    };
    let mut reports = Vec::new();
    let mut live: Vec<Target> = Vec::new();
    for step in plan {
        let targets = match step {
            Plan::Given(spec) => Ok(vec![Target::given(spec)]),
            Plan::Spawn(kind) => {
                eprintln!("locksmith-lab bench: starting {kind}…");
                let scale_locks = args
                    .runs(ScenarioName::Scale)
                    .then(|| args.scale_count(kind));
                // The backup scenario ends with a member joining a cluster.
                let placement = Placement {
                    spares: usize::from(args.runs(ScenarioName::Backup)),
                    ..Placement::default()
                };
                let start = move || -> Result<Vec<Target>, String> {
                    let mut target = Target::spawn_placed(kind, placement)?;
                    if let Some(locks) = scale_locks {
                        target.make_room_for_locks(locks)?;
                    }
                    // Replica acknowledgement's cost: the same setup without it.
                    let twin = target.without_replica_wait();
                    Ok(std::iter::once(target).chain(twin).collect())
                };
                match tokio::task::spawn_blocking(start).await {
                    Ok(Ok(targets)) => Ok(targets),
                    Ok(Err(error)) => Err((kind, format!("cannot start: {error}"))),
                    Err(panic) => Err((kind, format!("starting it panicked: {panic}"))),
                }
            }
        };
        match targets {
            Ok(targets) => {
                for mut target in targets {
                    target.label = unique(target.label);
                    // One connection first: a backend that cannot connect fails
                    // every scenario with one clear error instead of timing out in each.
                    match check_connect(&target, &settings).await {
                        Ok(()) => live.push(target),
                        Err(error) => {
                            eprintln!("locksmith-lab bench: {}: {error}", target.label);
                            let report = failed_report(
                                target.label.clone(),
                                target.kind,
                                &target.url,
                                &error,
                                &args,
                            );
                            reports.push(report);
                        }
                    }
                }
            }
            Err((kind, error)) => {
                eprintln!("locksmith-lab bench: {kind}: {error}");
                reports.push(failed_report(
                    unique(kind.name().into()),
                    kind,
                    "",
                    &error,
                    &args,
                ));
            }
        }
    }
    let mut failed = !reports.is_empty();

    let repeat = args.repeat.max(1);
    let steps = live.len() as u64
        * (repeat as u64 * timed_steps(&args) + u64::from(args.runs(ScenarioName::Scale)));
    let progress = ProgressBar::new(steps.max(1));
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid progress template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));

    // The timed scenarios run in rounds: each round measures every backend
    // once, in turn, so that load from elsewhere on the machine (a shared CI
    // box, a neighbour's fsyncs) spreads over all backends instead of spoiling
    // one; each backend's median round is reported.
    let mut rounds: Vec<Rounds> = live.iter().map(|_| Rounds::default()).collect();
    for round in 0..repeat {
        for (target, runs) in live.iter().zip(rounds.iter_mut()) {
            timed_round(target, &args, &settings, &progress, runs, round).await;
        }
    }
    let mut charts = ChartData::default();
    for (target, runs) in live.iter().zip(rounds) {
        let mut report = summarize(target, runs, &args, &progress, &mut charts);
        if args.runs(ScenarioName::Scale) {
            report.scale = Some(run_scale(target, &args, &settings, &progress).await);
            progress.inc(1);
        }
        if args.runs(ScenarioName::Sessions) && sessions::drives(target.kind) {
            report.sessions = Some(run_sessions(target, &args, &settings, &progress).await);
        }
        if args.runs(ScenarioName::Backup) && target.kind.runs_locksmith() {
            report.backup = Some(run_backup(target, &args, &settings, &progress).await);
        }
        failed |= report_failed(&report);
        reports.push(report);
    }
    // Stop the servers (a blocking kill and wait each).
    let _ = tokio::task::spawn_blocking(move || drop(live)).await;
    progress.finish_and_clear();
    reports.sort_by_key(|r| r.kind);

    let report = Report {
        command: command_line(),
        started,
        machine: Machine {
            load_at_start,
            fsync_us_at_start: fsync_at_start,
            fsync_us_at_end: tokio::task::spawn_blocking(machine::fsync_probe)
                .await
                .ok()
                .flatten(),
            ..Machine::describe()
        },
        settings: RunSettings {
            duration_ms: settings.duration.as_millis() as u64,
            session_ttl_ms: args.session_ttl.as_millis() as u64,
            clients: args.clients.clone(),
            waiters: args.waiters,
            fair_clients: args.fair_clients,
            fair_hold_us: args.fair_hold.as_micros() as u64,
            scale_clients: args.scale_clients,
            scale_concurrency: args.scale_concurrency,
            repeat: args.repeat.max(1),
            quick: args.quick,
            client_workers: tokio::runtime::Handle::current().metrics().num_workers(),
            client_slice_us: args.client_slice.map(|slice| slice.as_micros() as u64),
        },
        reference: reports
            .iter()
            .find(|r| r.kind == Kind::Server && r.uncontended.iter().any(|o| o.ok().is_some()))
            .or_else(|| reports.iter().find(|r| r.kind == Kind::Server))
            .map(|r| r.label.clone()),
        backends: reports,
    };
    match write_outputs(&report, &args.out, &mut charts) {
        Ok(markdown) => println!("{markdown}"),
        Err(error) => {
            eprintln!(
                "locksmith-lab bench: cannot write the report to {}: {error}",
                args.out.display()
            );
            return ExitCode::FAILURE;
        }
    }
    eprintln!(
        "locksmith-lab bench: report written to {}",
        args.out.display()
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn report_failed(report: &BackendReport) -> bool {
    report.uncontended.iter().any(|o| o.ok().is_none())
        || [report.handoff.as_ref().map(|o| o.ok().is_none())]
            .into_iter()
            .chain([report.fairness.as_ref().map(|o| o.ok().is_none())])
            .chain([report.scale.as_ref().map(|o| o.ok().is_none())])
            .chain([report.backup.as_ref().map(|o| o.ok().is_none())])
            .flatten()
            .any(|f| f)
}

/// The report of a backend that could not be measured at all.
fn failed_report(
    label: String,
    kind: Kind,
    url: &str,
    error: &str,
    args: &BenchArgs,
) -> BackendReport {
    fn failed<T>(error: &str) -> Outcome<T> {
        Outcome::Failed {
            error: error.to_owned(),
        }
    }
    BackendReport {
        label,
        kind,
        url: report::redact(url),
        version: None,
        spawned: false,
        tuning: Vec::new(),
        uncontended: if args.runs(ScenarioName::Uncontended) {
            args.clients.iter().map(|_| failed(error)).collect()
        } else {
            Vec::new()
        },
        handoff: args.runs(ScenarioName::Handoff).then(|| failed(error)),
        fairness: args.runs(ScenarioName::Fairness).then(|| failed(error)),
        scale: args.runs(ScenarioName::Scale).then(|| failed(error)),
        sessions: None,
        backup: None,
    }
}

/// Connects once and closes again.
///
/// Cancel safety: safe; a client dropped before its close ends its session.
async fn check_connect(target: &Target, settings: &Settings) -> Result<(), String> {
    match tokio::time::timeout(
        Duration::from_secs(30),
        target.connect(settings.session_ttl, "bench"),
    )
    .await
    {
        Ok(Ok(client)) => {
            let _ = client.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(format!("connect: {error}")),
        Err(_) => Err("connect timed out after 30s".into()),
    }
}

/// One backend's results of every round of the timed scenarios.
#[derive(Default)]
struct Rounds {
    /// Per client count, one result per round.
    uncontended: Vec<Vec<Result<Uncontended, String>>>,
    handoff: Vec<Result<(Contended, Samples), String>>,
    fairness: Vec<Result<(Contended, Samples), String>>,
}

/// Runs the timed scenarios once against `target`.
///
/// Cancel safety: as the scenarios: dropping it drops the running
/// scenario's clients, whose sessions end; the results so far stay in `runs`.
async fn timed_round(
    target: &Target,
    args: &BenchArgs,
    settings: &Settings,
    progress: &ProgressBar,
    runs: &mut Rounds,
    round: usize,
) {
    let label = &target.label;
    let of = if args.repeat > 1 {
        format!(" (round {}/{})", round + 1, args.repeat)
    } else {
        String::new()
    };
    // Generous: a measurement that takes this long has hung.
    let limit = settings.duration * 4 + Duration::from_secs(60);
    if args.runs(ScenarioName::Uncontended) {
        runs.uncontended.resize_with(args.clients.len(), Vec::new);
        for (i, &clients) in args.clients.iter().enumerate() {
            progress.set_message(format!("{label}: uncontended, {clients} clients{of}"));
            let outcome = bounded(limit, scenario::uncontended(target, clients, settings)).await;
            match &outcome {
                Ok((u, _)) => say(
                    progress,
                    format!(
                        "{label}: uncontended C={clients}{of}: {} pairs/s, p50 {} p99 {}",
                        stats::fmt_rate(u.pairs_per_sec),
                        stats::fmt_us(u.latency.p50_us),
                        stats::fmt_us(u.latency.p99_us)
                    ),
                ),
                Err(error) => say(
                    progress,
                    format!("{label}: uncontended C={clients}{of} failed: {error}"),
                ),
            }
            runs.uncontended[i].push(outcome.map(|(u, _)| u));
            progress.inc(1);
        }
    }
    if args.runs(ScenarioName::Handoff) {
        progress.set_message(format!("{label}: handoff, {} waiters{of}", args.waiters));
        let outcome = bounded(
            limit,
            scenario::contended(target, args.waiters, Duration::ZERO, "handoff", settings),
        )
        .await;
        match &outcome {
            Ok((h, _, _)) => say(
                progress,
                format!(
                    "{label}: handoff{of}: {} transfers/s, p50 {} p99 {} max {}",
                    stats::fmt_rate(h.grants_per_sec),
                    stats::fmt_us(h.handoff.p50_us),
                    stats::fmt_us(h.handoff.p99_us),
                    stats::fmt_us(h.handoff.max_us)
                ),
            ),
            Err(error) => say(progress, format!("{label}: handoff{of} failed: {error}")),
        }
        runs.handoff
            .push(outcome.map(|(h, handoffs, _)| (h, handoffs)));
        progress.inc(1);
    }
    if args.runs(ScenarioName::Fairness) {
        progress.set_message(format!(
            "{label}: fairness, {} clients{of}",
            args.fair_clients
        ));
        let outcome = bounded(
            limit,
            scenario::contended(
                target,
                args.fair_clients,
                args.fair_hold,
                "fairness",
                settings,
            ),
        )
        .await;
        match &outcome {
            Ok((f, _, _)) => say(
                progress,
                format!(
                    "{label}: fairness{of}: wait p50 {} p99 {} max {}, Jain {:.3}",
                    stats::fmt_us(f.wait.p50_us),
                    stats::fmt_us(f.wait.p99_us),
                    stats::fmt_us(f.wait.max_us),
                    f.jain
                ),
            ),
            Err(error) => say(progress, format!("{label}: fairness{of} failed: {error}")),
        }
        runs.fairness.push(outcome.map(|(f, _, waits)| (f, waits)));
        progress.inc(1);
    }
}

/// The run with the median rate, and every run's rate; a failure in any run
/// fails the scenario.
fn median<T>(
    runs: Vec<Result<T, String>>,
    rate: impl Fn(&T) -> f64,
) -> Result<(T, Vec<f64>), String> {
    let mut done = runs.into_iter().collect::<Result<Vec<T>, String>>()?;
    let rates: Vec<f64> = done.iter().map(&rate).collect();
    done.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let middle = done.len() / 2;
    Ok((done.swap_remove(middle), rates))
}

/// One backend's report from its rounds (the median round of each scenario).
fn summarize(
    target: &Target,
    runs: Rounds,
    args: &BenchArgs,
    progress: &ProgressBar,
    charts: &mut ChartData,
) -> BackendReport {
    let label = &target.label;
    let mut report = BackendReport {
        label: label.clone(),
        kind: target.kind,
        url: report::redact(&target.url),
        version: target.version(),
        spawned: target.spawned.is_some(),
        tuning: target.tuning.clone(),
        uncontended: Vec::new(),
        handoff: None,
        fairness: None,
        scale: None,
        sessions: None,
        backup: None,
    };
    for per_count in runs.uncontended {
        report
            .uncontended
            .push(match median(per_count, |u| u.pairs_per_sec) {
                Ok((mut u, rates)) => {
                    u.runs = rates;
                    Outcome::Ok(u)
                }
                Err(error) => Outcome::Failed { error },
            });
    }
    if args.runs(ScenarioName::Handoff) {
        report.handoff = Some(match median(runs.handoff, |(h, _)| h.grants_per_sec) {
            Ok(((mut h, handoffs), rates)) => {
                h.runs = rates;
                charts.handoff.push((label.clone(), handoffs));
                Outcome::Ok(h)
            }
            Err(error) => failed_line(progress, label, "handoff", error),
        });
    }
    if args.runs(ScenarioName::Fairness) {
        report.fairness = Some(match median(runs.fairness, |(f, _)| f.grants_per_sec) {
            Ok(((mut f, waits), rates)) => {
                f.runs = rates;
                charts.waits.push((label.clone(), waits));
                Outcome::Ok(f)
            }
            Err(error) => failed_line(progress, label, "fairness", error),
        });
    }
    report
}

/// Scenario (d) against one backend.
///
/// Cancel safety: as `scenario::scale`: the guards are released in the
/// background and the clients dropped.
async fn run_scale(
    target: &Target,
    args: &BenchArgs,
    settings: &Settings,
    progress: &ProgressBar,
) -> Outcome<Scale> {
    let label = &target.label;
    let locks = args.scale_count(target.kind);
    progress.set_message(format!("{label}: scale, {locks} locks"));
    // Scale gets its own, longer limit: a million locks take a while anywhere.
    let limit = Duration::from_secs(120) + Duration::from_millis(locks);
    match bounded(
        limit,
        scenario::scale(
            target,
            locks,
            args.scale_clients,
            args.scale_concurrency,
            settings,
            progress,
        ),
    )
    .await
    {
        Ok(d) => {
            say(
                progress,
                format!(
                    "{label}: scale: {} locks in {:.2} s ({} /s), memory {}",
                    d.locks,
                    d.hold_secs,
                    stats::fmt_rate(d.holds_per_sec),
                    d.memory_held
                        .map_or("n/a".into(), |m| stats::fmt_bytes(m as f64))
                ),
            );
            Outcome::Ok(d)
        }
        Err(error) => failed_line(progress, label, "scale", error),
    }
}

/// Scenario (e) against one backend.
///
/// Cancel safety: as `sessions::idle_sessions`: the streams are dropped.
async fn run_sessions(
    target: &Target,
    args: &BenchArgs,
    settings: &Settings,
    progress: &ProgressBar,
) -> Outcome<sessions::IdleSessions> {
    let label = &target.label;
    let count = args
        .idle_sessions
        .unwrap_or(if args.quick { 1_000 } else { 10_000 });
    progress.set_message(format!("{label}: sessions, {count} idle"));
    let limit = Duration::from_secs(120) + Duration::from_millis(count as u64 * 2);
    let plan = sessions::Plan {
        sessions: count,
        per_connection: args.sessions_per_connection,
        ttl: settings.session_ttl,
        spread_renewals: args.spread_renewals,
        stream_per_session: args.stream_per_session,
    };
    let measured = sessions::idle_sessions(target, plan, args.waiters, settings);
    match bounded(limit, measured).await {
        Ok(e) => {
            say(
                progress,
                format!(
                    "{label}: sessions: {} idle, renewal p50 {} p99 {}, {:.0} B each, \
                     handoff p50 {} alone, {} beside",
                    e.sessions,
                    e.heartbeat.map_or("-".into(), |h| stats::fmt_us(h.p50_us)),
                    e.heartbeat.map_or("-".into(), |h| stats::fmt_us(h.p99_us)),
                    e.bytes_per_session,
                    stats::fmt_us(e.handoff_p50_alone_us),
                    stats::fmt_us(e.handoff_p50_beside_us),
                ),
            );
            Outcome::Ok(e)
        }
        Err(error) => failed_line(progress, label, "sessions", error),
    }
}

/// Scenario (f) against one backend.
///
/// Cancel safety: as `backup::backup_restore`.
async fn run_backup(
    target: &Target,
    args: &BenchArgs,
    settings: &Settings,
    progress: &ProgressBar,
) -> Outcome<backup::BackupRestore> {
    let label = &target.label;
    let sizes = backup::Sizes {
        locks: args.backup_locks(),
        clients: args.scale_clients,
        concurrency: args.scale_concurrency,
        saves: args.saves.max(1),
        waiters: args.waiters,
    };
    progress.set_message(format!("{label}: backup, {} locks", sizes.locks));
    // Filling as scale does, then each save beside its window alone, a
    // member joining, then the restore.
    let limit = Duration::from_secs(180)
        + Duration::from_millis(sizes.locks / 4)
        + (settings.duration + Duration::from_secs(30)) * sizes.saves as u32
        + settings.duration * 2
        + backup::JOIN_LIMIT;
    match bounded(
        limit,
        backup::backup_restore(target, sizes, settings, progress),
    )
    .await
    {
        Ok(f) => {
            say(
                progress,
                format!(
                    "{label}: backup: {} locks, saves {} s, {}, handoff p99 {} alone, {} during;{} \
                     restore {:.2} s + {:.2} s to the first grant",
                    f.locks,
                    f.saves_secs
                        .iter()
                        .map(|s| format!("{s:.2}"))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    stats::fmt_bytes(f.file_bytes as f64),
                    stats::fmt_us(f.handoff_alone.p99_us),
                    stats::fmt_us(f.handoff_during.p99_us),
                    f.join.as_ref().map_or(String::new(), |join| format!(
                        " a member caught up in {:.2} s, handoff p99 {} meanwhile;",
                        join.secs,
                        stats::fmt_us(join.handoff.p99_us)
                    )),
                    f.restore_secs,
                    f.serve_secs,
                ),
            );
            Outcome::Ok(f)
        }
        Err(error) => failed_line(progress, label, "backup", error),
    }
}

/// Timed measurements in one round.
fn timed_steps(args: &BenchArgs) -> u64 {
    (if args.runs(ScenarioName::Uncontended) {
        args.clients.len()
    } else {
        0
    } + [ScenarioName::Handoff, ScenarioName::Fairness]
        .iter()
        .filter(|s| args.runs(**s))
        .count()) as u64
}

/// Prints a line above the progress bar (or plainly, when stderr is not a
/// terminal and the bar is hidden).
fn say(progress: &ProgressBar, line: String) {
    if progress.is_hidden() {
        eprintln!("{line}");
    } else {
        progress.println(line);
    }
}

fn failed_line<T>(
    progress: &ProgressBar,
    label: &str,
    scenario: &str,
    error: String,
) -> Outcome<T> {
    say(progress, format!("{label}: {scenario} failed: {error}"));
    Outcome::Failed { error }
}

/// Runs a scenario with a time limit.
///
/// Cancel safety: as `scenario`'s own, which is dropped with it (as it is
/// when the limit passes).
async fn bounded<T>(
    limit: Duration,
    scenario: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(limit, scenario)
        .await
        .unwrap_or_else(|_| Err(format!("did not finish within {limit:?}")))
}

fn command_line() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .and_then(|p| {
            Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "locksmith".into());
    std::iter::once(program)
        .chain(args.map(|a| report::redact(&a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes report.md, report.json and the charts; returns the Markdown.
fn write_outputs(report: &Report, out: &Path, data: &mut ChartData) -> Result<String, String> {
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let mut charts: Vec<(&str, &str)> = Vec::new();
    let throughput: Vec<chart::Series> = report
        .backends
        .iter()
        .filter_map(|b| {
            let points: Vec<(f64, f64)> = b
                .uncontended
                .iter()
                .filter_map(|o| o.ok())
                .map(|u| (u.clients as f64, u.pairs_per_sec))
                .collect();
            (!points.is_empty()).then(|| chart::Series {
                label: b.label.clone(),
                points,
            })
        })
        .collect();
    if !throughput.is_empty() {
        chart::throughput(
            &out.join("throughput.svg"),
            "Uncontended throughput vs clients",
            &throughput,
        )?;
        charts.push((
            "throughput.svg",
            "Uncontended acquire + release pairs/s vs concurrent clients",
        ));
    }
    let cdf = |samples: &mut Vec<(String, Samples)>| -> Vec<chart::Series> {
        samples
            .iter_mut()
            .filter(|(_, s)| !s.is_empty())
            .map(|(label, s)| chart::Series {
                label: label.clone(),
                points: s.cdf(400),
            })
            .collect()
    };
    let handoff = cdf(&mut data.handoff);
    if !handoff.is_empty() {
        chart::cdf(
            &out.join("handoff-latency.svg"),
            "Handoff latency: release → next grant",
            "latency (log scale)",
            &handoff,
        )?;
        charts.push(("handoff-latency.svg", "Handoff latency distribution (CDF)"));
    }
    let waits = cdf(&mut data.waits);
    if !waits.is_empty() {
        chart::cdf(
            &out.join("fairness-wait.svg"),
            "Wait time under contention",
            "wait (log scale)",
            &waits,
        )?;
        charts.push((
            "fairness-wait.svg",
            "Wait time distribution under contention (CDF)",
        ));
    }
    let markdown = report.markdown(&charts);
    std::fs::write(out.join("report.md"), &markdown).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(out.join("report.json"), json + "\n").map_err(|e| e.to_string())?;
    Ok(markdown)
}
