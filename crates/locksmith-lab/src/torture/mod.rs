//! `locksmith-lab torture`: a Jepsen-style safety check on one machine.
//!
//! K client **processes** (this executable again, in a hidden client mode)
//! loop acquire → write to a **fenced resource** → release on a lock of the
//! backend under test, while a **nemesis** injects faults. The resource is a
//! small TCP service inside this coordinator that refuses any write whose
//! fencing token is below the highest it has accepted for the lock, and logs
//! everything the clients report. After each round the **checker** reads the
//! log (see [`checker`] for exactly what counts as a violation).
//!
//! ```text
//!   client 0 ──proxy 0──┐                      ┌── fenced resource (TCP, in here)
//!   client 1 ──proxy 1──┼── backend server     │     ▲ Begin/End writes + reports
//!   …                   │   (killed, restarted)│     │
//!   client K ──proxy K──┘                      └─────┴── every client
//!        ▲ kill -9 / SIGSTOP        ▲ blackhole / delay       nemesis
//! ```
//!
//! Faults (`--fault`, comma-separated): `none` (the baseline),
//! `kill-client`, `pause-client`, `restart-backend`, `partition`, `delay`,
//! `expire-session` (these by default), and for replicated setups
//! `kill-primary`, `pause-primary` and `partition-leader` (Sentinel, Cluster,
//! etcd cluster, ZooKeeper ensemble, the locksmith cluster; for
//! `partition-leader` every member runs on a host of its own, network
//! namespaces), `restart-follower` (the consensus clusters),
//! `membership-change` (the locksmith cluster), `restart-empty`,
//! `restart-empty-late` and `partition-minority` (Redlock); see
//! [`nemesis::FaultKind`]. Each backend × fault is one
//! round with fresh clients and fresh lock names: warm-up, `--before` without
//! faults, `--during` with the fault injected again and again, `--after`
//! without faults, then the clients are told to stop.
//!
//! The summary table goes to stdout (and `torture.md` / `torture.json` in
//! `--out`). The exit status is 1 on any safety violation (a stale write the
//! resource could not refuse, a token regression or duplicate, two holders at
//! once that no fault excuses), any liveness failure (a waiter stuck after the
//! faults ended, no grant after the faults, a hold lost in a round without
//! faults) or a round that could not run.
//!
//! Backends are `--backend URL` (repeatable; restart and some session faults
//! need a server this run started) or `--spawn server,redis,zookeeper,etcd,postgres`
//! and the replicated setups `redis-sentinel`, `redis-cluster`, `redlock`,
//! `etcd-cluster`, `zookeeper-ensemble` (started as `locksmith-lab bench` starts
//! them; with `--nowait-twins` a Sentinel setup and a Cluster are tortured
//! twice, with and without replica acknowledgement, as `…-nowait`). `memory://` lives inside one
//! process and cannot be shared by client processes, so it is refused.

mod checker;
mod client;
mod nemesis;
mod protocol;
mod resource;
mod round;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::bench::target::{check_can_spawn, parse_kinds, BackendSpec, Kind, Placement, Target};
use crate::parse_duration;
use checker::{FaultRecord, Phases, Verdict};
use nemesis::{FaultKind, Timing};
use protocol::now;
use round::{Round, RoundConfig};

/// How a replicated setup is started for `faults`: each member on a host of
/// its own for `partition-leader`, and a locksmith cluster with spare members
/// for `membership-change` (each change uses one; more than a round
/// injects).
fn placement(faults: &[FaultKind]) -> Placement {
    Placement {
        separate_hosts: faults.contains(&FaultKind::PartitionLeader),
        spares: if faults.contains(&FaultKind::MembershipChange) {
            8
        } else {
            0
        },
        secured: false,
    }
}

/// Longest wait for the first grant after the faults stop.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// A comma-separated list of backend kinds, for `--spawn`.
#[derive(Debug, Clone)]
pub struct KindList(Vec<Kind>);

fn parse_kind_list(text: &str) -> Result<KindList, String> {
    parse_kinds(text).map(KindList)
}

/// Options of `locksmith-lab torture`.
#[derive(Debug, clap::Args)]
pub struct TortureArgs {
    /// A running lock store to torture, as URL or LABEL=URL (repeatable).
    #[arg(long = "backend", value_name = "[LABEL=]URL")]
    backends: Vec<BackendSpec>,
    /// Start real servers on loopback ports and torture them: a
    /// comma-separated list of server, redis, zookeeper, etcd, postgres, or `all`,
    /// and the replicated setups redis-sentinel, redis-cluster, redlock,
    /// etcd-cluster, zookeeper-ensemble.
    #[arg(long, value_name = "LIST", value_parser = parse_kind_list)]
    spawn: Option<KindList>,
    /// Faults to inject, one round each.
    #[arg(
        long = "fault",
        value_delimiter = ',',
        default_value = "none,kill-client,pause-client,restart-backend,partition,delay,expire-session"
    )]
    faults: Vec<FaultKind>,
    /// Also torture each spawned Sentinel setup and Redis Cluster as clients
    /// with `wait_replicas=0` see it (labelled `…-nowait`), beside the default.
    #[arg(long)]
    nowait_twins: bool,
    /// Client processes per round.
    #[arg(long, default_value_t = 5)]
    clients: u32,
    /// Locks the clients take turns on.
    #[arg(long, default_value_t = 1)]
    locks: u32,
    /// Time each client spends inside the critical section.
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    hold: Duration,
    /// Session TTL of the clients; pauses and partitions last twice as long.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    session_ttl: Duration,
    /// Time without faults before they start [default: 3s, quick: 1s].
    #[arg(long, value_parser = parse_duration)]
    before: Option<Duration>,
    /// Time during which faults are injected (at least one) [default: 20s, quick: 4s].
    #[arg(long, value_parser = parse_duration)]
    during: Option<Duration>,
    /// Time without faults after them [default: 5s, quick: 2s].
    #[arg(long, value_parser = parse_duration)]
    after: Option<Duration>,
    /// Short rounds, for CI.
    #[arg(long)]
    quick: bool,
    /// Directory for torture.md, torture.json and the logs of the clients
    /// and of the servers the run started (default: a temporary directory,
    /// kept and named when something fails).
    #[arg(long)]
    out: Option<PathBuf>,

    /// Internal: run as one torture client process.
    #[arg(long, hide = true)]
    client_mode: bool,
    /// Internal: client slot.
    #[arg(long, hide = true, default_value_t = 0)]
    client_id: u32,
    /// Internal: client respawn count.
    #[arg(long, hide = true, default_value_t = 0)]
    incarnation: u32,
    /// Internal: backend URL of the client (through its fault proxy).
    #[arg(long, hide = true)]
    client_url: Option<String>,
    /// Internal: the fenced resource's address.
    #[arg(long, hide = true)]
    resource: Option<SocketAddr>,
    /// Internal: a lock the client uses (repeatable).
    #[arg(long = "lock-name", hide = true)]
    lock_names: Vec<String>,
}

impl TortureArgs {
    fn phase(&self, set: Option<Duration>, full: u64, quick: u64) -> Duration {
        set.unwrap_or(Duration::from_millis(if self.quick { quick } else { full }))
    }
}

/// One row of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct RoundReport {
    /// Backend label.
    pub backend: String,
    /// Fault injected.
    pub fault: FaultKind,
    /// Faults injected, with what exactly was done.
    pub injected: Vec<FaultRecord>,
    /// Injections that could not be made (no holder found, ...).
    pub skipped: Vec<String>,
    /// Why the round did not run at all (fault unavailable), if so.
    pub not_run: Option<String>,
    /// Why the round failed to run to the end, if it did.
    pub error: Option<String>,
    /// Events outside the checker's view (client crashes).
    pub notes: Vec<String>,
    /// The checker's findings.
    pub verdict: Verdict,
}

impl RoundReport {
    fn failed(&self) -> bool {
        self.error.is_some()
            || self.verdict.violations() > 0
            || self.verdict.liveness_failures() > 0
    }

    fn verdict_cell(&self) -> String {
        if let Some(why) = &self.not_run {
            return format!("not run: {why}");
        }
        if let Some(error) = &self.error {
            return format!(
                "**ERROR**: {}",
                error.lines().next().unwrap_or("").replace('|', "/")
            );
        }
        let v = &self.verdict;
        match (v.violations(), v.liveness_failures()) {
            (0, 0) => "ok".into(),
            (0, n) => format!("**LIVENESS** ({n})"),
            (n, _) => format!("**VIOLATION** ({n})"),
        }
    }
}

/// Runs the fault-injection checker (or, with the hidden `--client-mode`, one
/// of its client processes).
///
/// Cancel safety: as `coordinate`, or in client mode as `client::run`.
pub async fn torture(args: TortureArgs) -> std::process::ExitCode {
    if args.client_mode {
        let (Some(url), Some(resource)) = (args.client_url.clone(), args.resource) else {
            eprintln!("locksmith-lab torture --client-mode needs --client-url and --resource");
            return ExitCode::from(2);
        };
        if args.lock_names.is_empty() {
            eprintln!("locksmith-lab torture --client-mode needs --lock-name");
            return ExitCode::from(2);
        }
        return client::run(client::ClientConfig {
            id: args.client_id,
            incarnation: args.incarnation,
            url,
            resource,
            locks: args.lock_names,
            hold: args.hold,
            session_ttl: args.session_ttl,
        })
        .await;
    }
    coordinate(args).await
}

/// Runs every backend × fault round and writes the summary.
///
/// Cancel safety: dropped midway, it writes no summary; the current round
/// goes as for `run_round`, and the servers it started are killed as they
/// drop (one that a blocking start or fault still holds, once that returns).
async fn coordinate(args: TortureArgs) -> ExitCode {
    if args.clients < 2 || args.locks == 0 {
        eprintln!("locksmith-lab torture: needs at least 2 clients and 1 lock");
        return ExitCode::from(2);
    }
    if args.faults.is_empty() {
        eprintln!("locksmith-lab torture: name at least one --fault");
        return ExitCode::from(2);
    }
    let spawn = args.spawn.as_ref().map(|k| k.0.clone()).unwrap_or_default();
    if args.backends.is_empty() && spawn.is_empty() {
        eprintln!(
            "locksmith-lab torture: name a backend with --backend URL or --spawn server,redis,…"
        );
        return ExitCode::from(2);
    }
    if spawn.contains(&Kind::Memory) || args.backends.iter().any(|b| b.url.starts_with("memory:")) {
        eprintln!(
            "locksmith-lab torture: memory:// lives inside one process; torture needs a store that \
             separate client processes can share"
        );
        return ExitCode::from(2);
    }
    if let Err(error) = check_can_spawn(&spawn) {
        eprintln!("locksmith-lab torture: {error}");
        return ExitCode::from(2);
    }
    let (dir, _keep) = match &args.out {
        Some(out) => match std::fs::create_dir_all(out) {
            Ok(()) => (out.clone(), None),
            Err(e) => {
                eprintln!(
                    "locksmith-lab torture: cannot create {}: {e}",
                    out.display()
                );
                return ExitCode::FAILURE;
            }
        },
        None => match tempfile::Builder::new()
            .prefix("locksmith-torture-")
            .tempdir()
        {
            Ok(tmp) => (tmp.path().to_owned(), Some(tmp)),
            Err(e) => {
                eprintln!("locksmith-lab torture: cannot create a temporary directory: {e}");
                return ExitCode::FAILURE;
            }
        },
    };

    let mut reports = Vec::new();
    let run_id = format!("{}-{}", std::process::id(), now() / 1_000_000);
    // Backends one at a time; a server this run starts lives only for its rounds.
    let plan = args
        .backends
        .iter()
        .cloned()
        .map(Ok)
        .chain(spawn.into_iter().map(Err));
    for step in plan {
        let targets = match step {
            Ok(spec) => vec![Arc::new(Target::given(spec))],
            Err(kind) => {
                eprintln!("locksmith-lab torture: starting {kind}…");
                let twins = args.nowait_twins;
                let placement = placement(&args.faults);
                let start = move || -> Result<Vec<Target>, String> {
                    let target = match Target::spawn_placed(kind, placement) {
                        // Where hosts cannot be made (no root, no iproute2)
                        // the setup runs on loopback; the faults that need
                        // hosts then say why they cannot run.
                        Err(error) if placement.separate_hosts => {
                            eprintln!(
                                "locksmith-lab torture: cannot give each member a host of its own \
                                 ({error}); starting on loopback"
                            );
                            Target::spawn_placed(
                                kind,
                                Placement {
                                    separate_hosts: false,
                                    ..placement
                                },
                            )?
                        }
                        target => target?,
                    };
                    let twin = twins.then(|| target.without_replica_wait()).flatten();
                    Ok(std::iter::once(target).chain(twin).collect())
                };
                match tokio::task::spawn_blocking(start).await {
                    Ok(Ok(targets)) => targets.into_iter().map(Arc::new).collect(),
                    Ok(Err(error)) => {
                        reports.push(error_report(
                            kind.name(),
                            FaultKind::None,
                            format!("cannot start: {error}"),
                        ));
                        continue;
                    }
                    Err(panic) => {
                        reports.push(error_report(
                            kind.name(),
                            FaultKind::None,
                            format!("start panicked: {panic}"),
                        ));
                        continue;
                    }
                }
            }
        };
        for target in targets {
            torture_target(&target, &args, &dir, &run_id, &mut reports).await;
            keep_server_logs(&target, &dir);
            // Stop the server (a blocking kill and wait) before the next backend.
            let _ = tokio::task::spawn_blocking(move || drop(target)).await;
        }
    }
    let markdown = summary(&reports, &args);
    println!("{markdown}");
    let failed = reports.iter().any(RoundReport::failed);
    let _ = std::fs::write(dir.join("torture.md"), &markdown);
    if let Ok(json) = serde_json::to_string_pretty(&reports) {
        let _ = std::fs::write(dir.join("torture.json"), json + "\n");
    }
    if failed {
        if let Some(tmp) = _keep {
            let kept = tmp.keep();
            eprintln!(
                "locksmith-lab torture: FAILED; logs kept in {}",
                kept.display()
            );
        } else {
            eprintln!("locksmith-lab torture: FAILED; logs in {}", dir.display());
        }
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Copies the logs of the servers this run started for `target` into `dir`
/// (`servers-LABEL-N.log`), beside its clients' logs: they go with the
/// setup's own directories. `LOCKSMITH_SERVE_LOG` sets what the locksmith
/// server logs (a `RUST_LOG` filter; warnings by default).
fn keep_server_logs(target: &Target, dir: &Path) {
    let Some(spawned) = &target.spawned else {
        return;
    };
    for (i, log) in spawned.logs().into_iter().enumerate() {
        if !log.exists() {
            continue; // a spare that was never started
        }
        let to = dir.join(format!("servers-{}-{}.log", target.label, i + 1));
        if let Err(error) = std::fs::copy(log, &to) {
            eprintln!(
                "locksmith-lab torture: cannot keep {}: {error}",
                log.display()
            );
        }
    }
}

/// Every fault's round against one target.
///
/// Cancel safety: as `run_round`; a health wait on a blocking thread runs
/// to its end.
async fn torture_target(
    target: &Arc<Target>,
    args: &TortureArgs,
    dir: &Path,
    run_id: &str,
    reports: &mut Vec<RoundReport>,
) {
    for &fault in &args.faults {
        if let Some(why) = fault.unavailable(target) {
            let mut report = error_report(&target.label, fault, String::new());
            report.error = None;
            report.not_run = Some(why);
            reports.push(report);
            continue;
        }
        if let Some(spawned) = target.spawned.clone() {
            // Every round starts from a whole setup, whatever the last one did.
            match tokio::task::spawn_blocking(move || spawned.wait_healthy()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    reports.push(error_report(&target.label, fault, error));
                    continue;
                }
                Err(panic) => {
                    reports.push(error_report(&target.label, fault, panic.to_string()));
                    continue;
                }
            }
        }
        eprintln!(
            "locksmith-lab torture: {} × {}…",
            target.label,
            fault.name()
        );
        let report = run_round(target, fault, args, dir, run_id).await;
        eprintln!(
            "locksmith-lab torture: {} × {}: {} ({} grants, {} stale writes rejected, {} overlaps)",
            target.label,
            fault.name(),
            report.verdict_cell(),
            report.verdict.grants,
            report.verdict.stale_rejected,
            report.verdict.overlaps
        );
        reports.push(report);
    }
}

fn error_report(backend: &str, fault: FaultKind, error: String) -> RoundReport {
    RoundReport {
        backend: backend.into(),
        fault,
        injected: Vec::new(),
        skipped: Vec::new(),
        not_run: None,
        error: Some(error),
        notes: Vec::new(),
        verdict: Verdict::default(),
    }
}

/// Runs one backend × fault round.
///
/// Cancel safety: dropping it drops the round: its clients are killed
/// (`kill_on_drop`, stopped ones too) and its proxies and resource stop, so
/// no fault on a client or a proxy outlives it; but a fault on the setup
/// (`nemesis::inject` on a blocking thread) runs on to its end, unrecorded,
/// and may overlap whatever the caller does next with the setup.
async fn run_round(
    target: &Arc<Target>,
    fault: FaultKind,
    args: &TortureArgs,
    dir: &Path,
    run_id: &str,
) -> RoundReport {
    let log = dir.join(format!("clients-{}-{}.log", target.label, fault.name()));
    let config = RoundConfig {
        clients: args.clients,
        locks: (0..args.locks)
            .map(|i| {
                format!(
                    "torture/{run_id}/{}/{}/lock-{i}",
                    target.label,
                    fault.name()
                )
            })
            .collect(),
        hold: args.hold,
        session_ttl: args.session_ttl,
        log: log.clone(),
    };
    let mut round = match Round::start(&target.url, config).await {
        Ok(round) => round,
        Err(error) => return error_report(&target.label, fault, error),
    };
    // Warm-up: every client connected and the lock changing hands.
    let warm_up = tokio::time::Instant::now() + Duration::from_secs(30);
    while round.resource.grants() < u64::from(args.clients) && tokio::time::Instant::now() < warm_up
    {
        nemesis::wait_reaping(&mut round, Duration::from_millis(50)).await;
    }
    if round.resource.grants() == 0 {
        let _ = round.finish(Duration::from_secs(1)).await;
        return error_report(
            &target.label,
            fault,
            format!(
                "no client got the lock within 30 s of starting; client log {}:\n{}",
                log.display(),
                tail(&log, 10)
            ),
        );
    }
    let start = now();
    nemesis::wait_reaping(&mut round, args.phase(args.before, 3_000, 1_000)).await;
    let faults_from = now();
    let timing = Timing {
        session_ttl: args.session_ttl,
        settle: Duration::from_secs(1),
    };
    let (injected, skipped) = nemesis::run(
        fault,
        &mut round,
        target,
        args.phase(args.during, 20_000, 4_000),
        timing,
    )
    .await;
    let faults_until = now();
    // Give the store time to recover before the after phase is measured: a
    // restarted JVM or an etcd election takes seconds. No grant at all within
    // the limit is a liveness failure.
    let granted = round.resource.grants();
    let recovery_limit = tokio::time::Instant::now() + RECOVERY_LIMIT.max(args.session_ttl * 5);
    while round.resource.grants() == granted && tokio::time::Instant::now() < recovery_limit {
        nemesis::wait_reaping(&mut round, Duration::from_millis(20)).await;
    }
    nemesis::wait_reaping(&mut round, args.phase(args.after, 5_000, 2_000)).await;
    let end = now();
    let stuck = round
        .finish(args.session_ttl * 2 + Duration::from_secs(5))
        .await;
    let events = round.resource.events();
    let verdict = checker::check(
        &events,
        &injected,
        Phases {
            faults_from,
            faults_until,
            start,
            end,
        },
        stuck,
    );
    let mut notes = std::mem::take(&mut round.notes);
    if fault != FaultKind::None && injected.is_empty() {
        notes.push("no fault could be injected".into());
    }
    RoundReport {
        backend: target.label.clone(),
        fault,
        error: (fault != FaultKind::None && injected.is_empty()).then(|| {
            format!(
                "no fault could be injected: {}",
                skipped.first().cloned().unwrap_or_default()
            )
        }),
        injected,
        skipped,
        not_run: None,
        notes,
        verdict,
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The summary table and the details of every finding.
fn summary(reports: &[RoundReport], args: &TortureArgs) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{} client processes, {} lock(s), {} inside the critical section, session TTL {}; \
         phases: {} before, {} with faults, {} after.\n",
        args.clients,
        args.locks,
        humantime::format_duration(args.hold),
        humantime::format_duration(args.session_ttl),
        humantime::format_duration(args.phase(args.before, 3_000, 1_000)),
        humantime::format_duration(args.phase(args.during, 20_000, 4_000)),
        humantime::format_duration(args.phase(args.after, 5_000, 2_000)),
    );
    md.push_str(
        "| backend | fault | injected | grants | grants/s before → during → after | longest gap | \
         recovery | stale writes rejected | overlaps (unexcused) | longest overlap | lost signals | writes skipped (lost) | \
         acquire errors | token regressions | duplicate tokens | accepted stale writes | stuck waiters | verdict |\n\
         |---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in reports {
        let v = &r.verdict;
        let ran = r.not_run.is_none() && r.error.is_none();
        if !ran {
            let _ = writeln!(
                md,
                "| {} | {} | | | | | | | | | | | | | | | | {} |",
                r.backend,
                r.fault.name(),
                r.verdict_cell()
            );
            continue;
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} → {} → {} | {:.0} ms | {} | {} | {} ({}) | {:.0} ms | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.backend,
            r.fault.name(),
            r.injected.len(),
            v.grants,
            rate(v.rate_before),
            rate(v.rate_during),
            rate(v.rate_after),
            v.max_gap_ms,
            v.recovery_ms.map_or("never".into(), |ms| format!("{ms:.0} ms")),
            v.stale_rejected,
            v.overlaps,
            count(&v.unexcused_overlaps),
            v.max_overlap_ms,
            v.lost,
            v.aborted,
            v.acquire_errors,
            count(&v.regressions),
            count(&v.duplicate_tokens),
            count(&v.accepted_stale),
            v.stuck.len(),
            r.verdict_cell()
        );
    }
    let mut details = String::new();
    for r in reports {
        let v = &r.verdict;
        let findings: Vec<(&str, &Vec<String>)> = vec![
            ("unexcused overlap", &v.unexcused_overlaps),
            ("token regression", &v.regressions),
            ("duplicate token", &v.duplicate_tokens),
            ("accepted stale write", &v.accepted_stale),
            ("resource error", &v.resource_errors),
            ("stuck", &v.stuck),
            ("lost without a fault", &v.lost_without_fault),
            ("note", &r.notes),
        ];
        let mut lines = Vec::new();
        if let Some(error) = &r.error {
            lines.push(format!("- error: {error}"));
        }
        for (what, list) in findings {
            lines.extend(list.iter().map(|l| format!("- {what}: {l}")));
        }
        if v.no_progress_after && r.error.is_none() && r.not_run.is_none() {
            lines.push("- liveness: nothing was granted after the faults stopped".into());
        }
        if !lines.is_empty() {
            let _ = writeln!(
                details,
                "\n**{} × {}**\n\n{}",
                r.backend,
                r.fault.name(),
                lines.join("\n")
            );
        }
    }
    if !details.is_empty() {
        md.push_str("\nFindings:\n");
        md.push_str(&details);
    }
    md
}

/// A rate for the table: one decimal below 10.
fn rate(per_sec: f64) -> String {
    if per_sec < 10.0 {
        format!("{per_sec:.1}")
    } else {
        format!("{per_sec:.0}")
    }
}

/// The number of findings in an example list (the last entry may say "… N more").
fn count(list: &[String]) -> usize {
    match list
        .last()
        .and_then(|l| l.strip_prefix("… "))
        .and_then(|l| l.split(' ').next()?.parse::<usize>().ok())
    {
        Some(more) => list.len() - 1 + more,
        None => list.len(),
    }
}
