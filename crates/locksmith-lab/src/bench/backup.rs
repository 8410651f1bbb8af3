//! (f) Backup and restore: what `locksmith snapshot save` and `snapshot
//! restore` cost with a big lock table, as an operator runs them.
//!
//! The server (or cluster) this run started is filled with `--scale-server`
//! held locks, taken by `--scale-clients` sessions in acquires of
//! [`NAMES_PER_ACQUIRE`] names each (all or nothing, one request: the
//! quickest way the API offers to hold a million locks; each name is a hold
//! of its own in the lock table, as if taken one by one). Then a handoff
//! loop (scenario (b)'s: `--waiters` clients on one lock) runs throughout
//! while `--saves` times, the loop runs alone for `--duration`, and then
//! `locksmith snapshot save FILE` (the `locksmith` executable, as an
//! operator runs it) takes a backup, from the member it chooses by default
//! (a caught-up follower; the leader of a group of one). Reported: each
//! save's wall time (process start to exit: taking, sending, checking and
//! writing the file durably), the member it came from, the file's size and
//! what `snapshot status` says it holds, the handoff p99 of the grants that
//! fell inside the saves beside that of the grants in the windows alone,
//! and each member's CPU in both (on one machine the members share its
//! CPUs, so a follower's save still slows the leader's answers there; its
//! CPU says on which member the work falls).
//!
//! On a cluster (started with a spare for this scenario), after the saves
//! and another window alone, a new member joins as a learner, as an
//! operator adds one: the leader sends it the state as a snapshot, it
//! installs it and catches up with the log. Reported: the time from its
//! start until it trails the leader by at most [`CAUGHT_UP`] entries (as
//! `locksmith cluster status` reports its lag), and the handoff latency of
//! the grants meanwhile. On one machine that includes the new member's
//! own CPU (decoding the snapshot) beside the others'.
//!
//! Then a new cluster of as many members is made from the last backup:
//! `locksmith snapshot restore` into each member's empty data directory
//! (the slowest one's time is reported; an operator restores members on
//! their own machines at once), and `locksmith serve` on each, timed from
//! the start of the processes to the first grant a client gets from them
//! (the restored leader has read the snapshot, been elected and answers).
//! That grant's token must be above the backup's restore floor.
//!
//! The data directories and the backup file are in the temporary
//! directory; the report says which file system that is.

use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use indicatif::ProgressBar;
use locksmith::{Client, Guard};
use serde::Serialize;

use super::scenario::{close_all, connect_all, Settings};
use super::stats::{Samples, Summary};
use super::target::{cpu_percent, cpu_ticks, ServeCluster, Spawned, Target};
use locksmith_testkit::Server;

/// Names in one acquire while filling: the server's default most names in
/// one acquire (`Limits::max_names_per_acquire`).
pub const NAMES_PER_ACQUIRE: u64 = 64;

/// What (f) measured on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackupRestore {
    /// Locks held while the backups were taken.
    pub locks: u64,
    /// Sessions holding them.
    pub sessions: usize,
    /// Time to hold them all (s).
    pub fill_secs: f64,
    /// The 1-minute load average just before the first save.
    pub load_before_saves: f64,
    /// Wall time of each `locksmith snapshot save` (s).
    pub saves_secs: Vec<f64>,
    /// Size of the backup file (bytes).
    pub file_bytes: u64,
    /// Locks held, as `snapshot status --json` reads the last backup.
    pub backup_locks: u64,
    /// Sessions in it, as `snapshot status --json` reads it.
    pub backup_sessions: u64,
    /// Handoff latency of the grants in the windows without a save.
    pub handoff_alone: Summary,
    /// Handoff latency of the grants while a save ran.
    pub handoff_during: Summary,
    /// A new member's catching up, on a cluster with a spare: after the
    /// saves, it joins as a learner and the leader sends it the state.
    pub join: Option<Join>,
    /// The member that led while the saves were taken.
    pub leader_id: u64,
    /// The member each save came from: its id, and whether it led then.
    pub saved_from: Vec<(u64, bool)>,
    /// Each member's id, and its CPU in the windows alone and while the
    /// saves ran (% of one core).
    pub member_cpu: Vec<MemberCpu>,
    /// Members of the source and of the restored cluster.
    pub members: usize,
    /// The slowest member's `locksmith snapshot restore` (s).
    pub restore_secs: f64,
    /// From starting the restored members to the first grant (s).
    pub serve_secs: f64,
    /// Where the data directories and the backup were: the temporary
    /// directory and its file system.
    pub data_on: String,
}

/// A member joining the cluster of (f) with its lock table in place.
#[derive(Debug, Clone, Serialize)]
pub struct Join {
    /// From starting the new member to its being caught up: its log within
    /// [`CAUGHT_UP`] entries of the leader's (s).
    pub secs: f64,
    /// Handoff latency of the grants meanwhile.
    pub handoff: Summary,
}

/// Entries a joining member may trail the leader by and count as caught up
/// (the handoff loop goes on writing while it catches up).
const CAUGHT_UP: u64 = 64;

/// Longest a joining member may take to catch up.
pub const JOIN_LIMIT: Duration = Duration::from_secs(120);

/// One member's CPU in (f).
#[derive(Debug, Clone, Serialize)]
pub struct MemberCpu {
    pub id: u64,
    /// In the windows without a save (% of one core).
    pub alone_percent: f64,
    /// While the saves ran (% of one core).
    pub during_percent: f64,
}

/// The sizes of a run of (f).
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Locks to hold.
    pub locks: u64,
    /// Sessions holding them.
    pub clients: usize,
    /// Acquires in flight while filling.
    pub concurrency: usize,
    /// Backups to take.
    pub saves: usize,
    /// Clients in the handoff loop.
    pub waiters: usize,
}

/// (f) against `target`: `sizes.locks` locks held, `sizes.saves` backups
/// beside a handoff loop, then a restore.
///
/// Cancel safety: dropping it drops the clients (their sessions end) and
/// the restored cluster, if started (killed as it drops).
pub async fn backup_restore(
    target: &Target,
    sizes: Sizes,
    settings: &Settings,
    progress: &ProgressBar,
) -> Result<BackupRestore, String> {
    let Sizes {
        locks,
        clients,
        concurrency,
        saves,
        waiters,
    } = sizes;
    let servers = match target.spawned.as_deref() {
        Some(Spawned::Serve(server)) => vec![server],
        Some(Spawned::ServeCluster(cluster)) if target.url.starts_with("locksmith://") => {
            cluster.members()
        }
        _ => return Err("only a locksmith server or cluster this run started, without TLS".into()),
    };
    let members = servers.len();
    let pids = servers
        .iter()
        .map(|s| s.process().pid().ok_or("a member is not running"))
        .collect::<Result<Vec<u32>, _>>()?;
    let addresses: Vec<(String, u64)> = servers.iter().map(|s| (s.address(), s.id())).collect();
    let dir = tempfile::Builder::new()
        .prefix("locksmith-backup-")
        .tempdir()
        .map_err(|e| format!("cannot create a directory for the backup: {e}"))?;
    let file = dir.path().join("locks.lsbk");

    let holders = connect_all(target, clients, settings).await?;
    let started = Instant::now();
    let guards = fill(target, &holders, locks, concurrency, settings, progress).await?;
    let fill_secs = started.elapsed().as_secs_f64();

    progress.set_message(format!("{}: backup, {saves} saves", target.label));
    let handoffs = Handoffs::start(target, waiters, settings).await?;
    let load_before_saves = super::machine::load_average();
    let leader = leader_id(target).await?;
    let (mut alone, mut during) = (Vec::new(), Vec::new());
    let mut saves_secs = Vec::new();
    let mut saved_from = Vec::new();
    let ticks = || pids.iter().map(|&pid| cpu_ticks(pid)).collect::<Vec<u64>>();
    let (mut alone_ticks, mut during_ticks) = (vec![0; members], vec![0; members]);
    let add = |sum: &mut Vec<u64>, from: &[u64], to: &[u64]| {
        for ((sum, from), to) in sum.iter_mut().zip(from).zip(to) {
            *sum += to.saturating_sub(*from);
        }
    };
    for _ in 0..saves {
        let quiet = Instant::now();
        let before = ticks();
        tokio::time::sleep(settings.duration).await;
        alone.push((quiet, Instant::now()));
        let save = Instant::now();
        let between = ticks();
        add(&mut alone_ticks, &before, &between);
        let printed = locksmith(&[
            "snapshot".into(),
            "save".into(),
            file.clone().into(),
            "--backend".into(),
            target.url.clone().into(),
        ])
        .await?;
        let saved = Instant::now();
        add(&mut during_ticks, &between, &ticks());
        saves_secs.push((saved - save).as_secs_f64());
        during.push((save, saved));
        let source = source_of(&printed, &addresses)?;
        saved_from.push((source, source == leader));
    }
    let (alone_for, during_for) = (total(&alone), total(&during));
    let member_cpu = addresses
        .iter()
        .zip(alone_ticks.iter().zip(&during_ticks))
        .map(|((_, id), (&alone, &during))| MemberCpu {
            id: *id,
            alone_percent: cpu_percent(alone, alone_for),
            during_percent: cpu_percent(during, during_for),
        })
        .collect();
    let joined = match target.spawned.clone() {
        Some(spawned) if matches!(&*spawned, Spawned::ServeCluster(c) if c.has_spare()) => {
            progress.set_message(format!("{}: a member joins", target.label));
            // What the last save left behind settles, then a window alone
            // just before the join.
            tokio::time::sleep(settings.duration).await;
            let quiet = Instant::now();
            tokio::time::sleep(settings.duration).await;
            alone.push((quiet, Instant::now()));
            Some(join_spare(spawned).await?)
        }
        _ => None,
    };
    let samples = handoffs.stop().await?;
    let handoff_alone = within(&samples, &alone).summary();
    let handoff_during = within(&samples, &during).summary();
    let join = joined.map(|window| Join {
        secs: total(&[window]).as_secs_f64(),
        handoff: within(&samples, &[window]).summary(),
    });
    let file_bytes = std::fs::metadata(&file)
        .map_err(|e| format!("the backup file: {e}"))?
        .len();
    let status = locksmith(&[
        "snapshot".into(),
        "status".into(),
        file.clone().into(),
        "--json".into(),
    ])
    .await?;
    let status: serde_json::Value =
        serde_json::from_str(&status).map_err(|e| format!("snapshot status --json: {e}"))?;
    let count = |field: &str| status[field].as_u64().unwrap_or(0);
    let (backup_locks, backup_sessions) = (count("locks"), count("sessions"));
    if backup_locks < locks {
        return Err(format!(
            "the backup holds {backup_locks} locks, not the {locks} held"
        ));
    }

    // The holders stay connected, idle, while the restore is timed: the
    // source is not busy ending their sessions meanwhile.
    progress.set_message(format!("{}: restore", target.label));
    let backup = file.clone();
    let (restored, restore_time) =
        tokio::task::spawn_blocking(move || ServeCluster::restore(&backup, members))
            .await
            .map_err(|e| format!("restore panicked: {e}"))??;
    let restored = Arc::new(restored);
    let launched = Instant::now();
    let starting = restored.clone();
    tokio::task::spawn_blocking(move || starting.launch())
        .await
        .map_err(|e| format!("start panicked: {e}"))??;
    let client = first_client(&restored.url()).await?;
    let guard = client
        .lock(format!("{}/after-restore", settings.prefix))
        .acquire()
        .await
        .map_err(|e| format!("acquire on the restored cluster: {e}"))?;
    let serve_secs = launched.elapsed().as_secs_f64();
    let floor = count("restore_floor");
    if guard.fencing_token() <= floor {
        return Err(format!(
            "a token after the restore ({}) is not above the backup's floor {floor}",
            guard.fencing_token()
        ));
    }
    drop(guard);
    drop(client);
    // Kill the restored members (a blocking kill and wait each).
    let _ = tokio::task::spawn_blocking(move || drop(restored)).await;
    drop(guards);
    close_all(holders).await;

    Ok(BackupRestore {
        locks,
        sessions: clients,
        fill_secs,
        load_before_saves,
        saves_secs,
        file_bytes,
        backup_locks,
        backup_sessions,
        handoff_alone,
        handoff_during,
        join,
        leader_id: leader,
        saved_from,
        member_cpu,
        members,
        restore_secs: restore_time.as_secs_f64(),
        serve_secs,
        data_on: data_on(&std::env::temp_dir()),
    })
}

/// The id of the member of `target` that leads now (blocking calls
/// `ServeCluster::leader`, on the blocking pool).
///
/// Cancel safety: dropped, the asking runs on to its end unwatched.
async fn leader_id(target: &Target) -> Result<u64, String> {
    const ONLY: &str = "only a locksmith server or cluster this run started";
    let spawned = target.spawned.clone().ok_or(ONLY)?;
    tokio::task::spawn_blocking(move || match spawned.as_ref() {
        Spawned::Serve(server) => Ok(server.id()),
        Spawned::ServeCluster(cluster) => cluster.leader(None).map(|m| m.id()),
        _ => Err(ONLY.into()),
    })
    .await
    .map_err(|e| format!("finding the leader panicked: {e}"))?
}

/// The id of the member a save came from, by the address `snapshot save`
/// printed (`saved FILE (N bytes) from HOST:PORT in ...`).
fn source_of(printed: &str, members: &[(String, u64)]) -> Result<u64, String> {
    let address = printed
        .split_once(" from ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .ok_or_else(|| format!("`snapshot save` did not say where from: {printed}"))?;
    members
        .iter()
        .find(|(member, _)| member == address)
        .map(|(_, id)| *id)
        .ok_or_else(|| format!("`snapshot save` took it from {address}, not a member"))
}

/// Starts the cluster's next spare, which joins as a learner, and waits
/// until it is caught up (as `locksmith cluster status` reports its lag):
/// the window from its start to then.
///
/// Cancel safety: dropped, the spare runs on (the cluster stops it when it
/// drops).
async fn join_spare(spawned: Arc<Spawned>) -> Result<(Instant, Instant), String> {
    let start = Instant::now();
    let (id, url) = tokio::task::spawn_blocking(move || match spawned.as_ref() {
        Spawned::ServeCluster(cluster) => cluster
            .start_spare()
            .map(|spare| (spare.id(), cluster.url())),
        _ => Err("only a locksmith cluster has spares".to_string()),
    })
    .await
    .map_err(|e| format!("starting the spare panicked: {e}"))??;
    let deadline = start + JOIN_LIMIT;
    loop {
        let status = locksmith(&[
            "cluster".into(),
            "--backend".into(),
            url.clone().into(),
            "status".into(),
            "--json".into(),
        ])
        .await?;
        let status: serde_json::Value =
            serde_json::from_str(&status).map_err(|e| format!("cluster status --json: {e}"))?;
        let lag = status["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|member| member["id"].as_u64() == Some(id))
            .and_then(|member| member["lag"].as_u64());
        if lag.is_some_and(|lag| lag <= CAUGHT_UP) {
            return Ok((start, Instant::now()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "member {id} did not catch up in {} s ({status})",
                JOIN_LIMIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long `windows` last together.
fn total(windows: &[(Instant, Instant)]) -> Duration {
    windows.iter().map(|(from, to)| *to - *from).sum()
}

/// A client of the restored cluster at `url`, once one of its members
/// opens sessions: a member reading a big snapshot may not yet answer
/// within a client's connect timeout, so connecting is tried again, for up
/// to two minutes.
///
/// Cancel safety: safe, as `Client::connect`.
async fn first_client(url: &str) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match Client::connect(url).await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() > deadline => {
                return Err(format!("connect to the restored cluster: {error}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Holds `locks` distinct locks between `clients`, [`NAMES_PER_ACQUIRE`]
/// to an acquire, `concurrency` acquires in flight.
///
/// Cancel safety: dropping it drops the guards taken so far (released in
/// the background).
async fn fill(
    target: &Target,
    clients: &[Client],
    locks: u64,
    concurrency: usize,
    settings: &Settings,
    progress: &ProgressBar,
) -> Result<Vec<Guard>, String> {
    let held = AtomicU64::new(0);
    let held = &held;
    futures::stream::iter((0..locks.div_ceil(NAMES_PER_ACQUIRE)).enumerate())
        .map(|(n, batch)| async move {
            let first = batch * NAMES_PER_ACQUIRE;
            let names = (first..locks.min(first + NAMES_PER_ACQUIRE))
                .map(|i| format!("{}/backup/{i}", settings.prefix));
            let guard = clients[n % clients.len()]
                .multi_lock(names)
                .acquire()
                .await
                .map_err(|e| format!("after {} locks held: {e}", held.load(Ordering::Relaxed)))?;
            let now = held.fetch_add(NAMES_PER_ACQUIRE, Ordering::Relaxed) + NAMES_PER_ACQUIRE;
            if now % (NAMES_PER_ACQUIRE * 1_000) == 0 {
                progress.set_message(format!("{}: backup, {now} locks held", target.label));
            }
            Ok::<_, String>(guard)
        })
        .buffer_unordered(concurrency)
        .try_collect()
        .await
}

/// Clients taking turns on one lock until stopped, each grant timed from
/// the release before it, with the instant it came.
struct Handoffs {
    stop: Arc<AtomicBool>,
    workers: tokio::task::JoinSet<locksmith::Result<Vec<(Instant, Duration)>>>,
    clients: Vec<Client>,
}

impl Handoffs {
    /// Connects `waiters` clients and starts their loop.
    ///
    /// Cancel safety: safe; the clients connected so far are dropped.
    async fn start(
        target: &Target,
        waiters: usize,
        settings: &Settings,
    ) -> Result<Handoffs, String> {
        let clients = connect_all(target, waiters, settings).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(Mutex::new(None::<Instant>));
        let name = format!("{}/backup-handoff", settings.prefix);
        let mut workers = tokio::task::JoinSet::new();
        for client in &clients {
            let lock = client.lock(name.clone());
            let (stop, released) = (stop.clone(), released.clone());
            workers.spawn(async move {
                let mut grants = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.acquire().await?;
                    let granted = Instant::now();
                    if let Some(at) = released.lock().expect("released").take() {
                        grants.push((granted, granted - at));
                    }
                    *released.lock().expect("released") = Some(Instant::now());
                    guard.release().await?;
                }
                Ok(grants)
            });
        }
        Ok(Handoffs {
            stop,
            workers,
            clients,
        })
    }

    /// Stops the loop: every grant, when it came and its handoff time.
    ///
    /// Cancel safety: dropping it drops the workers and the clients.
    async fn stop(mut self) -> Result<Vec<(Instant, Duration)>, String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut grants = Vec::new();
        while let Some(joined) = self.workers.join_next().await {
            grants.extend(
                joined
                    .map_err(|e| format!("a handoff worker panicked: {e}"))?
                    .map_err(|e| format!("handoff: {e}"))?,
            );
        }
        close_all(self.clients).await;
        Ok(grants)
    }
}

/// The handoff times of the grants that came inside one of `windows`.
fn within(grants: &[(Instant, Duration)], windows: &[(Instant, Instant)]) -> Samples {
    let mut samples = Samples::new();
    for (at, handoff) in grants {
        if windows.iter().any(|(from, to)| from <= at && at <= to) {
            samples.push(*handoff);
        }
    }
    samples
}

/// Runs `locksmith ARGS` (warnings only) and returns what it printed, or
/// why it failed.
///
/// Cancel safety: dropped, the command runs on to its end unwatched.
async fn locksmith(args: &[OsString]) -> Result<String, String> {
    let exe = crate::server_executable::path()?;
    let args = args.to_vec();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(exe)
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run `locksmith`: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let command: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
            Err(format!(
                "locksmith {}: {}",
                command.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    })
    .await
    .map_err(|e| format!("running `locksmith` panicked: {e}"))?
}

/// `DIR (TYPE on DEVICE)`: the file system `dir` is on, from the longest
/// mount point above it in /proc/self/mounts.
fn data_on(dir: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mount = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point)
                .then_some((point.len(), device, kind))
        })
        .max_by_key(|(len, _, _)| *len);
    match mount {
        Some((_, device, kind)) => format!("{} ({kind} on {device})", dir.display()),
        None => dir.display().to_string(),
    }
}
