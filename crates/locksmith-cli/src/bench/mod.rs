//! `locksmith bench`: the same scenarios against every backend in one run.
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
//! - **(d) scale**: one client holds N distinct locks at once (`--scale`, and
//!   `--scale-server` for the locksmith server): time to hold them all, and the
//!   server's memory (PSS of its process group, from /proc) when this run
//!   started the server.
//!
//! # Backends
//!
//! `--backend [LABEL=]URL` (repeatable) measures a running store;
//! `--spawn server,redis,zookeeper,etcd,postgres,memory` (or `all`) starts real
//! servers on loopback ports with `locksmith-testkit` (the locksmith server as
//! `locksmith serve`, a child of this executable), one at a time: each runs
//! only while it is measured, so an idle JVM takes no CPU from the others.
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

mod chart;
mod report;
mod scenario;
mod stats;
pub(crate) mod target;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::common::parse_duration;
use report::{BackendReport, Machine, Outcome, Report, RunSettings};
use scenario::Settings;
use stats::Samples;
use target::{BackendSpec, Kind, Target};

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
}

/// A comma-separated list of backend kinds, for `--spawn`.
#[derive(Debug, Clone)]
pub struct KindList(pub Vec<Kind>);

fn parse_kind_list(text: &str) -> Result<KindList, String> {
    target::parse_kinds(text).map(KindList)
}

/// Options of `locksmith bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A lock store to measure, as URL or LABEL=URL (repeatable).
    #[arg(long = "backend", value_name = "[LABEL=]URL")]
    backends: Vec<BackendSpec>,
    /// Start real servers on loopback ports and measure them: a comma-separated
    /// list of server, memory, redis, zookeeper, etcd, postgres, or `all`.
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
    /// Acquires in flight at once in the scale scenario.
    #[arg(long, default_value_t = 256)]
    scale_concurrency: usize,
    /// Session TTL of every client.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    session_ttl: Duration,
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
pub async fn bench(args: BenchArgs) -> std::process::ExitCode {
    if args.clients.is_empty()
        || args.clients.contains(&0)
        || args.waiters == 0
        || args.fair_clients == 0
    {
        eprintln!("locksmith bench: client, waiter and fair-client counts must be at least 1");
        return ExitCode::from(2);
    }
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let load_at_start = report::load_average();

    // What to measure, the reference (the locksmith server) first. A server
    // this run starts runs only while it is measured, so idle servers take no
    // CPU from the others' figures.
    let spawn = args.spawn.as_ref().map(|k| k.0.clone()).unwrap_or_default();
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

    let progress = ProgressBar::new((plan.len() as u64 * step_count(&args)).max(1));
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid progress template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));

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
    let mut charts = ChartData::default();
    let mut failed = false;
    let mut reports = Vec::new();
    for step in plan {
        let target = match step {
            Plan::Given(spec) => Ok(Target::given(spec)),
            Plan::Spawn(kind) => {
                progress.set_message(format!("starting {kind}"));
                match tokio::task::spawn_blocking(move || Target::spawn(kind)).await {
                    Ok(Ok(target)) => Ok(target),
                    Ok(Err(error)) => Err((kind, error)),
                    Err(panic) => Err((kind, format!("starting it panicked: {panic}"))),
                }
            }
        };
        let report = match target {
            Ok(mut target) => {
                target.label = unique(target.label);
                let report = run_backend(&target, &args, &settings, &progress, &mut charts).await;
                // Stop the server before measuring the next one.
                let _ = tokio::task::spawn_blocking(move || drop(target)).await;
                report
            }
            Err((kind, error)) => {
                say(&progress, format!("{kind}: cannot start: {error}"));
                progress.inc(step_count(&args));
                failed_report(
                    unique(kind.name().into()),
                    kind,
                    "",
                    &format!("cannot start: {error}"),
                    &args,
                )
            }
        };
        failed |= report_failed(&report);
        reports.push(report);
    }
    progress.finish_and_clear();
    reports.sort_by_key(|r| r.kind);

    let report = Report {
        command: command_line(),
        started,
        machine: Machine {
            load_at_start,
            ..Machine::describe()
        },
        settings: RunSettings {
            duration_ms: settings.duration.as_millis() as u64,
            session_ttl_ms: args.session_ttl.as_millis() as u64,
            clients: args.clients.clone(),
            waiters: args.waiters,
            fair_clients: args.fair_clients,
            fair_hold_us: args.fair_hold.as_micros() as u64,
            scale_concurrency: args.scale_concurrency,
            repeat: args.repeat.max(1),
            quick: args.quick,
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
                "locksmith bench: cannot write the report to {}: {error}",
                args.out.display()
            );
            return ExitCode::FAILURE;
        }
    }
    eprintln!("locksmith bench: report written to {}", args.out.display());
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
        uncontended: if args.runs(ScenarioName::Uncontended) {
            args.clients.iter().map(|_| failed(error)).collect()
        } else {
            Vec::new()
        },
        handoff: args.runs(ScenarioName::Handoff).then(|| failed(error)),
        fairness: args.runs(ScenarioName::Fairness).then(|| failed(error)),
        scale: args.runs(ScenarioName::Scale).then(|| failed(error)),
    }
}

/// Runs every selected scenario against one backend.
async fn run_backend(
    target: &Target,
    args: &BenchArgs,
    settings: &Settings,
    progress: &ProgressBar,
    charts: &mut ChartData,
) -> BackendReport {
    let label = &target.label;
    progress.set_message(format!("{label}: connecting"));
    // One connection first: a backend that cannot connect fails every scenario
    // with the same clear error instead of timing out in each.
    match tokio::time::timeout(
        Duration::from_secs(30),
        target.connect(settings.session_ttl, "bench"),
    )
    .await
    {
        Ok(Ok(client)) => {
            let _ = client.close().await;
        }
        Ok(Err(error)) => {
            progress.inc(step_count(args));
            say(progress, format!("{label}: cannot connect: {error}"));
            return failed_report(
                label.clone(),
                target.kind,
                &target.url,
                &format!("connect: {error}"),
                args,
            );
        }
        Err(_) => {
            progress.inc(step_count(args));
            say(progress, format!("{label}: connect timed out"));
            return failed_report(
                label.clone(),
                target.kind,
                &target.url,
                "connect timed out after 30s",
                args,
            );
        }
    }
    let mut report = BackendReport {
        label: label.clone(),
        kind: target.kind,
        url: report::redact(&target.url),
        version: target.version(),
        spawned: target.spawned.is_some(),
        uncontended: Vec::new(),
        handoff: None,
        fairness: None,
        scale: None,
    };
    // Generous: a measurement that takes this long has hung.
    let limit = settings.duration * 4 + Duration::from_secs(60);

    if args.runs(ScenarioName::Uncontended) {
        for &clients in &args.clients {
            progress.set_message(format!("{label}: uncontended, {clients} clients"));
            let outcome = median_of(
                args.repeat,
                limit,
                || scenario::uncontended(target, clients, settings),
                |(u, _)| u.pairs_per_sec,
            )
            .await;
            let outcome = match outcome {
                Ok(((mut u, _), rates)) => {
                    u.runs = rates;
                    say(
                        progress,
                        format!(
                            "{label}: uncontended C={clients}: {} pairs/s, p50 {} p99 {}",
                            stats::fmt_rate(u.pairs_per_sec),
                            stats::fmt_us(u.latency.p50_us),
                            stats::fmt_us(u.latency.p99_us)
                        ),
                    );
                    Outcome::Ok(u)
                }
                Err(error) => failed_line(progress, label, "uncontended", error),
            };
            report.uncontended.push(outcome);
            progress.inc(1);
        }
    }
    if args.runs(ScenarioName::Handoff) {
        progress.set_message(format!("{label}: handoff, {} waiters", args.waiters));
        let outcome = median_of(
            args.repeat,
            limit,
            || scenario::contended(target, args.waiters, Duration::ZERO, "handoff", settings),
            |(h, _, _)| h.grants_per_sec,
        )
        .await;
        report.handoff = Some(match outcome {
            Ok(((mut h, handoffs, _), rates)) => {
                h.runs = rates;
                say(
                    progress,
                    format!(
                        "{label}: handoff: {} transfers/s, p50 {} p99 {} max {}",
                        stats::fmt_rate(h.grants_per_sec),
                        stats::fmt_us(h.handoff.p50_us),
                        stats::fmt_us(h.handoff.p99_us),
                        stats::fmt_us(h.handoff.max_us)
                    ),
                );
                charts.handoff.push((label.clone(), handoffs));
                Outcome::Ok(h)
            }
            Err(error) => failed_line(progress, label, "handoff", error),
        });
        progress.inc(1);
    }
    if args.runs(ScenarioName::Fairness) {
        progress.set_message(format!("{label}: fairness, {} clients", args.fair_clients));
        let outcome = median_of(
            args.repeat,
            limit,
            || {
                scenario::contended(
                    target,
                    args.fair_clients,
                    args.fair_hold,
                    "fairness",
                    settings,
                )
            },
            |(f, _, _)| f.grants_per_sec,
        )
        .await;
        report.fairness = Some(match outcome {
            Ok(((mut f, _, waits), rates)) => {
                f.runs = rates;
                say(
                    progress,
                    format!(
                        "{label}: fairness: wait p50 {} p99 {} max {}, Jain {:.3}",
                        stats::fmt_us(f.wait.p50_us),
                        stats::fmt_us(f.wait.p99_us),
                        stats::fmt_us(f.wait.max_us),
                        f.jain
                    ),
                );
                charts.waits.push((label.clone(), waits));
                Outcome::Ok(f)
            }
            Err(error) => failed_line(progress, label, "fairness", error),
        });
        progress.inc(1);
    }
    if args.runs(ScenarioName::Scale) {
        let locks = args.scale_count(target.kind);
        progress.set_message(format!("{label}: scale, {locks} locks"));
        // Scale gets its own, longer limit: a million locks take a while anywhere.
        let scale_limit = Duration::from_secs(120) + Duration::from_millis(locks);
        let outcome = bounded(
            scale_limit,
            scenario::scale(target, locks, args.scale_concurrency, settings, progress),
        )
        .await;
        report.scale = Some(match outcome {
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
        });
        progress.inc(1);
    }
    report
}

fn step_count(args: &BenchArgs) -> u64 {
    (if args.runs(ScenarioName::Uncontended) {
        args.clients.len()
    } else {
        0
    } + [
        ScenarioName::Handoff,
        ScenarioName::Fairness,
        ScenarioName::Scale,
    ]
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

/// Runs a timed measurement `repeat` times (each within `limit`) and keeps the
/// run with the median rate, with every run's rate: on a shared machine one run
/// can be off by a wide margin.
async fn median_of<T, Fut>(
    repeat: usize,
    limit: Duration,
    mut run: impl FnMut() -> Fut,
    rate: impl Fn(&T) -> f64,
) -> Result<(T, Vec<f64>), String>
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut results = Vec::new();
    for _ in 0..repeat.max(1) {
        results.push(bounded(limit, run()).await?);
    }
    let rates: Vec<f64> = results.iter().map(&rate).collect();
    results.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let median = results.swap_remove(results.len() / 2);
    Ok((median, rates))
}

/// Runs a scenario with a time limit.
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
            .filter(|(_, s)| s.len() > 0)
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
