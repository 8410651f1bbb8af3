//! The nemesis: the faults a round injects, each selectable with `--fault`.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::checker::FaultRecord;
use super::protocol::{now, Request};
use super::resource::Who;
use super::round::Round;
use crate::bench::target::{Kind, ServeCluster, Spawned, Target};
use locksmith_testkit::proxy::Mode;
use locksmith_testkit::Server;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// No fault: the baseline. Any overlap here is a violation.
    None,
    /// `kill -9` the client inside the critical section, then respawn it.
    KillClient,
    /// `SIGSTOP` the client inside the critical section for twice its session
    /// TTL (a GC pause), then `SIGCONT`.
    PauseClient,
    /// `kill -9` the backend server and restart it (needs a server this run
    /// started).
    RestartBackend,
    /// Blackhole all traffic between the holder and the backend for twice the
    /// session TTL, then heal.
    Partition,
    /// Delay every client's traffic to and from the backend by a quarter of the
    /// session TTL each way, for twice the session TTL.
    Delay,
    /// Take the holder's session away behind its back, the store's own way:
    /// etcd `lease revoke`, PostgreSQL `pg_terminate_backend`, ZooKeeper session
    /// expiry (by partitioning the holder past its session timeout: ZooKeeper
    /// has no admin call for it), and an administrator's `force_release` on the
    /// locksmith server and Redis.
    ExpireSession,
    /// Replicated setups: `kill -9` the primary (Redis behind Sentinel; on a
    /// Redis Cluster the primary of the holder's lock) or the leader (etcd,
    /// ZooKeeper, the locksmith cluster) while a holder stays inside, wait
    /// until another member took over, then restart the killed one (it
    /// rejoins as a replica/follower).
    #[value(alias = "kill-leader")]
    KillPrimary,
    /// Replicated setups: freeze the primary or leader (`SIGSTOP`) for twice
    /// the session TTL, past its failover, then let it come back: a minority
    /// cut off from everyone, which wakes up believing it still leads.
    #[value(alias = "pause-leader")]
    PausePrimary,
    /// Replicated setups, their members on hosts of their own: cut the
    /// leader (etcd, ZooKeeper, the locksmith cluster) or the primary (Redis
    /// behind Sentinel; on a Redis Cluster the primary of the lock) off from
    /// every other member, a minority of one that its clients still reach,
    /// for twice the session TTL, then heal. The majority elects a new leader
    /// (the Sentinels or the cluster promote a replica); the old one must
    /// stop granting first, which a Redis primary does not do on its own.
    /// On the locksmith cluster a holder stays inside meanwhile (does it keep
    /// its lock?); elsewhere the clients keep taking turns (does the lock go
    /// to two of them at once?).
    #[value(alias = "partition-primary")]
    PartitionLeader,
    /// The locksmith cluster: while a holder stays inside, a new member
    /// joins as a learner, is promoted to voter, and the leader is removed
    /// from the cluster and stopped (a machine replaced under load).
    MembershipChange,
    /// Consensus clusters (etcd, ZooKeeper, the locksmith cluster): `kill -9`
    /// a follower while a holder stays inside, let the others carry on, then
    /// restart it: it must catch up from the leader (log or snapshot).
    RestartFollower,
    /// Redlock: while two of five masters are cut off from every client, the
    /// next holder wins the other three; one of them is killed, loses its data
    /// and restarts at once, empty; then every master is reachable again. The
    /// case of Kleppmann's critique: a second client can win a majority with
    /// the restarted master and the two that never saw the first grant.
    RestartEmpty,
    /// Redlock: as `restart-empty`, but the master comes back only after a
    /// session TTL (every lease it had has run out): antirez's "delayed
    /// restart" mitigation.
    RestartEmptyLate,
    /// Redlock: the last two of five masters stop answering every client
    /// (their traffic held, as a partition holds it, and delivered late when
    /// it heals) for twice the session TTL while a holder stays inside. The
    /// failure Redlock is made to survive: the other three keep granting. The
    /// holder keeps its lock if its grant's majority included all three
    /// (a grant made while one of them still held the last holder's key
    /// did not, and is rightly lost).
    PartitionMinority,
}

impl FaultKind {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::KillClient => "kill-client",
            FaultKind::PauseClient => "pause-client",
            FaultKind::RestartBackend => "restart-backend",
            FaultKind::Partition => "partition",
            FaultKind::Delay => "delay",
            FaultKind::ExpireSession => "expire-session",
            FaultKind::KillPrimary => "kill-primary",
            FaultKind::PausePrimary => "pause-primary",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::MembershipChange => "membership-change",
            FaultKind::RestartFollower => "restart-follower",
            FaultKind::RestartEmpty => "restart-empty",
            FaultKind::RestartEmptyLate => "restart-empty-late",
            FaultKind::PartitionMinority => "partition-minority",
        }
    }

    /// Why this fault cannot run against `target`, if it cannot.
    pub fn unavailable(self, target: &Target) -> Option<String> {
        let spawned = target.spawned.as_deref();
        match self {
            FaultKind::RestartBackend if spawned.is_none() => {
                Some("needs a server started by this run (--spawn)".into())
            }
            FaultKind::RestartBackend if spawned.and_then(Spawned::single).is_none() => Some(
                "restarts one server; on a replicated setup kill-primary restarts a member".into(),
            ),
            FaultKind::Partition | FaultKind::Delay
                if matches!(target.kind, Kind::RedisSentinel | Kind::RedisCluster)
                    || matches!(spawned, Some(Spawned::ServeCluster(_))) =>
            {
                Some(
                    "clients reach the data nodes (the leader) at the addresses the Sentinels or \
                     the cluster announce, which the fault proxy cannot stand in for"
                        .into(),
                )
            }
            FaultKind::ExpireSession
                if spawned.is_none()
                    && matches!(target.kind, Kind::Etcd | Kind::EtcdCluster | Kind::Postgres) =>
            {
                Some("needs a server started by this run (--spawn)".into())
            }
            FaultKind::KillPrimary | FaultKind::PausePrimary
                if !matches!(
                    spawned,
                    Some(
                        Spawned::RedisSentinel(_)
                            | Spawned::RedisCluster(_)
                            | Spawned::EtcdCluster(_)
                            | Spawned::ZooKeeperEnsemble(_)
                            | Spawned::ServeCluster(_)
                    )
                ) =>
            {
                Some(
                    "needs a replicated setup started by this run (--spawn redis-sentinel, \
                     redis-cluster, etcd-cluster, zookeeper-ensemble, server-cluster or server-cluster-tls)"
                        .into(),
                )
            }
            FaultKind::RestartFollower
                if !matches!(
                    spawned,
                    Some(
                        Spawned::EtcdCluster(_)
                            | Spawned::ZooKeeperEnsemble(_)
                            | Spawned::ServeCluster(_)
                    )
                ) =>
            {
                Some(
                    "needs a consensus cluster started by this run (--spawn etcd-cluster, \
                     zookeeper-ensemble, server-cluster or server-cluster-tls)"
                        .into(),
                )
            }
            FaultKind::PartitionLeader if spawned.and_then(Spawned::network).is_none() => Some(
                "needs a replicated setup started by this run with each member on a host of its \
                 own (--spawn redis-sentinel, redis-cluster, etcd-cluster, zookeeper-ensemble, \
                 server-cluster or server-cluster-tls, run as root with iproute2 for network \
                 namespaces)"
                    .into(),
            ),
            FaultKind::MembershipChange if !matches!(spawned, Some(Spawned::ServeCluster(_))) => {
                Some(
                    "needs the locksmith cluster started by this run (--spawn server-cluster or server-cluster-tls)"
                        .into(),
                )
            }
            FaultKind::RestartEmpty | FaultKind::RestartEmptyLate | FaultKind::PartitionMinority
                if !matches!(spawned, Some(Spawned::Redlock(_))) =>
            {
                Some("needs Redlock masters started by this run (--spawn redlock)".into())
            }
            _ => None,
        }
    }
}

/// Timing of the faults.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The clients' session TTL.
    pub session_ttl: Duration,
    /// Quiet time after each fault.
    pub settle: Duration,
}

impl Timing {
    /// How long pauses and partitions last: well past the session TTL.
    fn outage(&self) -> Duration {
        self.session_ttl * 2 + Duration::from_millis(500)
    }
}

/// Injects `kind` again and again for `during` (at least once), returning what
/// was done and what could not be.
///
/// Cancel safety: not cancel safe: dropped midway, the fault being injected
/// is left as `inject` describes, not undone.
pub async fn run(
    kind: FaultKind,
    round: &mut Round,
    target: &Arc<Target>,
    during: Duration,
    timing: Timing,
) -> (Vec<FaultRecord>, Vec<String>) {
    let end = tokio::time::Instant::now() + during;
    let (mut records, mut skipped) = (Vec::new(), Vec::new());
    if kind == FaultKind::None {
        wait_reaping(round, during).await;
        return (records, skipped);
    }
    loop {
        match inject(kind, round, target, timing).await {
            Ok(record) => records.push(record),
            Err(why) => skipped.push(why),
        }
        wait_reaping(round, timing.settle).await;
        if tokio::time::Instant::now() >= end {
            break;
        }
    }
    (records, skipped)
}

/// Sleeps, respawning clients that crashed meanwhile.
///
/// Cancel safety: safe; it only sleeps between synchronous reaps.
pub async fn wait_reaping(round: &mut Round, duration: Duration) {
    let end = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < end {
        if let Err(error) = round.reap() {
            round.notes.push(error);
        }
        tokio::time::sleep_until(end.min(tokio::time::Instant::now() + Duration::from_millis(100)))
            .await;
    }
}

/// A client inside its critical section right now (waits up to 5 s for one).
///
/// Cancel safety: safe, read-only.
async fn holder(round: &Round) -> Result<Holder, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        for (who, inside) in round.resource.inside() {
            if let Some(pid) = round.pid(who) {
                return Ok(Holder {
                    who,
                    pid,
                    lock: inside.lock,
                    token: inside.token,
                    lingers: false,
                });
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err("no client was inside its critical section for 5 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Asks the next client entering its critical section to stay inside
/// `extra` longer, and returns it once it is inside (waits up to 5 s), so that
/// a slow fault (a process to start, a server to restart) still finds it there.
/// If none enters in time (the last fault's holder still lingers), the request
/// is withdrawn: left standing, it would keep a client inside after the
/// round's faults, its waiters stuck past the round's end.
///
/// Cancel safety: not cancel safe: dropped before it returns, it leaves the
/// linger request standing (the next client to enter lingers with nothing
/// waiting for it), the case the withdrawal above avoids.
async fn lingering_holder(round: &Round, extra: Duration) -> Result<Holder, String> {
    let asked = now();
    round.resource.request_linger(extra);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let timed_out = tokio::time::Instant::now() >= deadline;
        let lingering = match timed_out {
            true => round.resource.withdraw_linger(),
            false => round.resource.lingering(),
        };
        if let Some((who, inside)) = lingering {
            if let Some(pid) = round.pid(who) {
                return Ok(Holder {
                    who,
                    pid,
                    lock: inside.lock,
                    token: inside.token,
                    lingers: true,
                });
            }
        }
        if timed_out {
            return Err(format!(
                "no client entered its critical section for 5 s ({})",
                what_clients_reported_since(round, asked)
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What the clients reported since `since`, for a fault that found nobody
/// to hit: grants that skipped their write, acquires that failed, and the
/// last reason of each, so that the failure explains itself.
fn what_clients_reported_since(round: &Round, since: u64) -> String {
    let (mut asks, mut grants, mut aborts, mut failures, mut refused) = (0, 0, 0, 0, 0);
    let (mut last_abort, mut last_failure) = (None, None);
    for event in round.resource.events() {
        let Some(request) = event.request.filter(|_| event.at >= since) else {
            continue;
        };
        match request {
            Request::Waiting { .. } => asks += 1,
            Request::Granted { .. } => grants += 1,
            Request::Abort { reason, .. } => {
                aborts += 1;
                last_abort = Some(reason);
            }
            Request::Failed { error, .. } => {
                failures += 1;
                last_failure = Some(error);
            }
            Request::Write { .. } if !event.accepted => refused += 1,
            _ => {}
        }
    }
    let mut said = format!(
        "since the fault began waiting: {asks} acquires begun, {grants} grants, {aborts} writes skipped as lost, \
         {refused} writes refused, {failures} acquires failed"
    );
    if let Some(reason) = last_abort {
        said += &format!("; last skipped: {reason}");
    }
    if let Some(error) = last_failure {
        said += &format!("; last failure: {error}");
    }
    said
}

/// The client a fault targets.
struct Holder {
    who: Who,
    pid: u32,
    lock: String,
    token: u64,
    /// Asked to stay inside through the fault.
    lingers: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "client {:?} (pid {}) inside {} with token {}",
            self.who, self.pid, self.lock, self.token
        )
    }
}

fn signal(pid: u32, signal: Signal) -> Result<(), String> {
    kill(Pid::from_raw(pid as i32), signal).map_err(|e| format!("{signal} to {pid}: {e}"))
}

fn record(kind: FaultKind, start: u64, targets: Option<Vec<Who>>, note: String) -> FaultRecord {
    FaultRecord {
        kind: kind.name().into(),
        start,
        end: now(),
        targets,
        note,
    }
}

/// Injects `kind` once (and undoes it, where the fault has an end), and
/// records what was done, or says why it could not be.
///
/// Cancel safety: not cancel safe; a dropped call leaves its fault in place:
/// a `pause-client` victim stays SIGSTOPped, `partition` (and
/// `expire-session` on ZooKeeper) leaves the victim's proxies blackholed,
/// `delay` every proxy delaying, `restart-empty(-late)` the cut-off masters'
/// proxies refusing, `partition-minority` theirs blackholed, each until the
/// round drops; `kill-client` may leave its
/// slot without a client for the rest of the round (`reap` respawns only a
/// client that exited); a wait for a lingering holder leaves its linger
/// request standing; a fault on the setup runs on to its end on its
/// blocking thread, unrecorded; a force-release may or may not have
/// happened.
async fn inject(
    kind: FaultKind,
    round: &mut Round,
    target: &Arc<Target>,
    timing: Timing,
) -> Result<FaultRecord, String> {
    match kind {
        FaultKind::None => Err("no fault".into()),
        FaultKind::KillClient => {
            let victim = holder(round).await?;
            let start = now();
            round
                .kill_and_respawn(victim.who, Duration::from_millis(100))
                .await?;
            Ok(record(
                kind,
                start,
                Some(vec![victim.who]),
                format!("killed {victim}"),
            ))
        }
        FaultKind::PauseClient => {
            let victim = holder(round).await?;
            let start = now();
            signal(victim.pid, Signal::SIGSTOP)?;
            tokio::time::sleep(timing.outage()).await;
            signal(victim.pid, Signal::SIGCONT)?;
            Ok(record(
                kind,
                start,
                Some(vec![victim.who]),
                format!("paused {victim} for {:?}", timing.outage()),
            ))
        }
        FaultKind::RestartBackend => {
            // A holder stays inside across the restart: a durable store must
            // not give its lock to anyone else meanwhile (unless it tells the
            // holder the lock is lost).
            let victim = lingering_holder(round, timing.outage()).await?;
            let server = target.clone();
            let start = now();
            let note = tokio::task::spawn_blocking(move || {
                let server = server
                    .spawned
                    .as_deref()
                    .and_then(Spawned::single)
                    .ok_or("no server started by this run")?;
                server.kill();
                std::thread::sleep(Duration::from_millis(300));
                server
                    .try_restart()
                    .map_err(|e| format!("restart failed: {e}"))?;
                Ok::<_, String>(format!("killed -9 and restarted {}", server.name()))
            })
            .await
            .map_err(|e| e.to_string())??;
            Ok(record(
                kind,
                start,
                Some(Vec::new()),
                format!("{note} while {victim} stayed inside"),
            ))
        }
        FaultKind::Partition => {
            let victim = lingering_holder(round, timing.outage()).await?;
            Ok(partition(round, victim.who, timing, victim.to_string()).await)
        }
        FaultKind::Delay => {
            let delay = (timing.session_ttl / 4).max(Duration::from_millis(50));
            let victim = lingering_holder(round, timing.outage()).await?;
            let start = now();
            for proxy in round.all_proxies() {
                proxy.set(Mode::Delay(delay));
            }
            tokio::time::sleep(timing.outage()).await;
            for proxy in round.all_proxies() {
                proxy.set(Mode::Pass);
            }
            Ok(record(
                kind,
                start,
                Some(Vec::new()),
                format!(
                    "delayed every client's traffic by {delay:?} each way for {:?} while {victim} stayed inside",
                    timing.outage()
                ),
            ))
        }
        FaultKind::ExpireSession => expire_session(round, target, timing).await,
        FaultKind::KillPrimary => {
            let victim = lingering_holder(round, timing.outage() * 2).await?;
            on_setup(kind, target, &victim, kill_primary).await
        }
        FaultKind::PausePrimary => {
            let victim = lingering_holder(round, timing.outage()).await?;
            let outage = timing.outage();
            on_setup(kind, target, &victim, move |spawned, lock| {
                let primary = primary_of(spawned, lock)?;
                primary.pause();
                std::thread::sleep(outage);
                primary.resume();
                Ok(format!(
                    "froze the primary on port {} for {outage:?}",
                    primary.port()
                ))
            })
            .await
        }
        FaultKind::RestartFollower => {
            let victim = lingering_holder(round, timing.outage() * 2).await?;
            let outage = timing.outage();
            on_setup(kind, target, &victim, move |spawned, lock| {
                restart_follower(spawned, lock, outage)
            })
            .await
        }
        FaultKind::PartitionLeader => {
            let outage = timing.outage();
            if let Some(Spawned::ServeCluster(_)) = target.spawned.as_deref() {
                // Does the holder keep its lock across the new election?
                let victim = lingering_holder(round, outage * 2).await?;
                on_setup(kind, target, &victim, move |spawned, _| match spawned {
                    Spawned::ServeCluster(cluster) => partition_leader(cluster, outage),
                    _ => unreachable!("checked above"),
                })
                .await
            } else {
                // Nobody lingers: the lock keeps changing hands, so a Redis
                // primary cut off from its peers but not from its clients
                // grants it to those still attached to it while the promoted
                // replica grants it to those that moved (the split brain).
                let victim = holder(round).await?;
                on_setup(kind, target, &victim, move |spawned, lock| {
                    partition_primary(spawned, lock, outage)
                })
                .await
            }
        }
        FaultKind::MembershipChange => {
            let victim = lingering_holder(round, timing.outage() * 2).await?;
            on_setup(kind, target, &victim, move |spawned, _| {
                let Spawned::ServeCluster(cluster) = spawned else {
                    return Err("no locksmith cluster started by this run".to_owned());
                };
                replace_leader(cluster)
            })
            .await
        }
        FaultKind::PartitionMinority => {
            let Some(Spawned::Redlock(masters)) = target.spawned.as_deref() else {
                return Err("no Redlock masters started by this run".into());
            };
            let cut_off = masters.len() / 2 + 1..masters.len();
            let victim = lingering_holder(round, timing.outage()).await?;
            let start = now();
            for host in cut_off.clone() {
                round.proxies_to(host).for_each(|p| p.set(Mode::Blackhole));
            }
            tokio::time::sleep(timing.outage()).await;
            for host in cut_off.clone() {
                round.proxies_to(host).for_each(|p| p.set(Mode::Pass));
            }
            Ok(record(
                kind,
                start,
                Some(Vec::new()),
                format!(
                    "masters {}..{} answered no client for {:?} while {victim} stayed inside",
                    cut_off.start + 1,
                    cut_off.end,
                    timing.outage()
                ),
            ))
        }
        FaultKind::RestartEmpty | FaultKind::RestartEmptyLate => {
            let Some(Spawned::Redlock(masters)) = target.spawned.as_deref() else {
                return Err("no Redlock masters started by this run".into());
            };
            // Kleppmann's sequence: the holder reaches only a bare majority
            // (the last masters are cut off from every client), one master of
            // that majority restarts without its data, then everyone reaches
            // every master again.
            let majority = masters.len() / 2 + 1;
            let cut_off = majority..masters.len();
            // Refused, not held: a request sent meanwhile must not arrive late.
            for host in cut_off.clone() {
                round.proxies_to(host).for_each(|p| p.set(Mode::Refuse));
            }
            let heal = |round: &Round| {
                for host in cut_off.clone() {
                    round.proxies_to(host).for_each(|p| p.set(Mode::Pass));
                }
            };
            let victim = match lingering_holder(round, timing.outage()).await {
                Ok(victim) => victim,
                Err(e) => {
                    heal(round);
                    return Err(e);
                }
            };
            let (setup, lock) = (target.clone(), victim.lock.clone());
            let late = (kind == FaultKind::RestartEmptyLate)
                .then_some(timing.session_ttl + Duration::from_millis(500));
            let start = now();
            let restarted = tokio::task::spawn_blocking(move || {
                let Some(Spawned::Redlock(masters)) = setup.spawned.as_deref() else {
                    unreachable!("checked above")
                };
                restart_empty(&masters[..majority], &lock, late)
            })
            .await
            .map_err(|e| e.to_string());
            heal(round);
            let note = restarted??;
            Ok(record(
                kind,
                start,
                Some(Vec::new()),
                format!(
                    "with masters {majority}..{} cut off from every client, {note} while {victim} \
                     stayed inside; then healed",
                    masters.len()
                ),
            ))
        }
    }
}

/// Runs `fault` on a blocking thread against the setup this run started
/// (given the lingering holder's lock), and records it with its note.
///
/// Cancel safety: a dropped call leaves the fault running to its end on its
/// blocking thread, unrecorded.
async fn on_setup<F>(
    kind: FaultKind,
    target: &Arc<Target>,
    victim: &Holder,
    fault: F,
) -> Result<FaultRecord, String>
where
    F: FnOnce(&Spawned, &str) -> Result<String, String> + Send + 'static,
{
    let (setup, lock) = (target.clone(), victim.lock.clone());
    let start = now();
    let note = tokio::task::spawn_blocking(move || {
        let spawned = setup.spawned.as_deref().ok_or("nothing started")?;
        fault(spawned, &lock)
    })
    .await
    .map_err(|e| e.to_string())??;
    let during = if victim.lingers {
        format!("while {victim} stayed inside")
    } else {
        format!("while the clients took turns ({victim} when it began)")
    };
    Ok(record(
        kind,
        start,
        Some(Vec::new()),
        format!("{note} {during}"),
    ))
}

/// The member a primary fault hits: the Sentinel setup's primary, the primary
/// of `lock`'s slot on a cluster, the etcd or ZooKeeper leader.
///
/// Blocking: it asks the servers.
fn primary_of<'a>(spawned: &'a Spawned, lock: &str) -> Result<&'a dyn Server, String> {
    Ok(match spawned {
        Spawned::RedisSentinel(setup) => setup.try_primary().map_err(|e| e.to_string())?,
        Spawned::RedisCluster(cluster) => cluster.primary_of(lock).map_err(|e| e.to_string())?,
        Spawned::EtcdCluster(cluster) => cluster.leader().map_err(|e| e.to_string())?,
        Spawned::ZooKeeperEnsemble(ensemble) => ensemble.leader().map_err(|e| e.to_string())?,
        Spawned::ServeCluster(cluster) => cluster.leader(None)?,
        _ => return Err("not a replicated setup".into()),
    })
}

/// Kills a member that is not the leader, lets the others serve without it
/// for `outage`, restarts it; says what happened.
///
/// Blocking: it waits for the setup.
fn restart_follower(spawned: &Spawned, lock: &str, outage: Duration) -> Result<String, String> {
    let leader = primary_of(spawned, lock)?.port();
    let follower = spawned
        .members()
        .into_iter()
        .find(|m| m.port() != leader)
        .ok_or("no follower")?;
    follower.kill();
    std::thread::sleep(outage);
    follower
        .try_restart()
        .map_err(|e| format!("restart failed: {e}"))?;
    Ok(format!(
        "killed -9 the follower on port {} (leader on {leader}) for {outage:?}, then restarted it",
        follower.port()
    ))
}

/// Kills the primary or leader, waits for the failover, restarts the killed
/// member; says what happened.
///
/// Blocking: it waits for the setup.
fn kill_primary(spawned: &Spawned, lock: &str) -> Result<String, String> {
    let old = primary_of(spawned, lock)?;
    let port = old.port();
    let killed = std::time::Instant::now();
    old.kill();
    let error = |e: locksmith_testkit::Error| e.to_string();
    let successor = match spawned {
        Spawned::RedisSentinel(setup) => {
            let old = setup
                .nodes()
                .iter()
                .find(|n| n.port() == port)
                .ok_or("lost the node")?;
            setup.wait_for_failover(old).map_err(error)?.port()
        }
        Spawned::RedisCluster(cluster) => {
            let old = cluster
                .nodes()
                .iter()
                .find(|n| n.port() == port)
                .ok_or("lost the node")?;
            cluster.wait_for_failover(old).map_err(error)?;
            cluster.primary_of(lock).map_err(error)?.port()
        }
        Spawned::EtcdCluster(cluster) => cluster.leader().map_err(error)?.port(),
        Spawned::ZooKeeperEnsemble(ensemble) => ensemble.leader().map_err(error)?.port(),
        Spawned::ServeCluster(cluster) => {
            let old = cluster
                .members()
                .into_iter()
                .find(|m| m.port() == port)
                .ok_or("lost the member")?;
            cluster.leader(Some(old.id()))?.port()
        }
        _ => return Err("not a replicated setup".into()),
    };
    let took = killed.elapsed();
    old.try_restart()
        .map_err(|e| format!("restart failed: {e}"))?;
    Ok(format!(
        "killed -9 the primary on port {port}; {successor} took over after {took:.1?}; restarted {port}"
    ))
}

/// Cuts the leader off from every other member for `outage`, then heals;
/// says what happened.
///
/// Blocking: it waits for the cluster.
fn partition_leader(cluster: &ServeCluster, outage: Duration) -> Result<String, String> {
    let network = cluster
        .network()
        .ok_or("the members share one host: nothing to cut")?;
    let leader = cluster.leader(None)?;
    let at = cluster.host_of(leader);
    let peers: Vec<usize> = cluster
        .members()
        .into_iter()
        .filter(|m| m.id() != leader.id())
        .map(|m| cluster.host_of(m))
        .collect();
    let cut = std::time::Instant::now();
    let successor = peers
        .iter()
        .try_for_each(|&peer| network.cut(at, peer))
        .map_err(|e| format!("cannot cut the network: {e}"))
        .and_then(|()| cluster.leader(Some(leader.id())))
        .map(|new| (new.id(), cut.elapsed()));
    std::thread::sleep(outage.saturating_sub(cut.elapsed()));
    for &peer in &peers {
        // Every cut is healed, whatever failed: a route that was never added
        // fails to go, which is fine.
        let _ = network.heal(at, peer);
    }
    let (successor, took) = successor?;
    Ok(format!(
        "cut the leader (member {}) off from its peers for {outage:?}; member {successor} led \
         after {took:.1?}; healed",
        leader.id()
    ))
}

/// Cuts the primary or leader of a Redis, etcd or ZooKeeper setup off from
/// every other member for `outage`, then heals; says what happened. Its
/// clients still reach it all along: the network cuts hosts from hosts only.
///
/// Blocking: it asks the setup and waits.
fn partition_primary(spawned: &Spawned, lock: &str, outage: Duration) -> Result<String, String> {
    let network = spawned
        .network()
        .ok_or("the members share one host: nothing to cut")?;
    let port = primary_of(spawned, lock)?.port();
    // Member i runs on host i.
    let members = spawned.members();
    let at = members
        .iter()
        .position(|m| m.port() == port)
        .ok_or("the primary is not a member")?;
    let peers: Vec<usize> = (0..members.len()).filter(|&i| i != at).collect();
    let cut = std::time::Instant::now();
    let result = peers
        .iter()
        .try_for_each(|&peer| network.cut(at, peer))
        .map_err(|e| format!("cannot cut the network: {e}"));
    std::thread::sleep(outage.saturating_sub(cut.elapsed()));
    for &peer in &peers {
        // Every cut is healed, whatever failed: a route that was never added
        // fails to go, which is fine.
        let _ = network.heal(at, peer);
    }
    result?;
    Ok(format!(
        "cut the leading member (port {port}) off from its {} peers for {outage:?}; healed",
        peers.len()
    ))
}

/// Brings in a spare member (it joins as a learner), promotes it, and removes
/// the leader from the cluster; says what happened.
///
/// Blocking: it waits for the cluster.
fn replace_leader(cluster: &ServeCluster) -> Result<String, String> {
    let old = cluster.leader(None)?;
    let started = std::time::Instant::now();
    let new = cluster.start_spare()?;
    // The new member adds itself as a learner (`--join`); it can be promoted
    // once the leader has it.
    let deadline = started + Duration::from_secs(30);
    change_members_by(cluster, &["promote", &new.id().to_string()], deadline)
        .map_err(|e| format!("could not promote member {}: {e}", new.id()))?;
    let promoted = started.elapsed();
    // On a loaded machine the promotion can cost the leader its leadership:
    // the removal, too, is asked again until a leader takes it.
    change_members_by(cluster, &["remove", &old.id().to_string()], deadline)
        .map_err(|e| format!("could not remove member {}: {e}", old.id()))?;
    let successor = cluster.leader(Some(old.id()))?.id();
    let took = started.elapsed();
    cluster.retire(old);
    Ok(format!(
        "member {} joined and was a voter after {promoted:.1?}; the leader (member {}) was \
         removed and stopped; member {successor} led after {took:.1?}",
        new.id(),
        old.id()
    ))
}

/// Asks `cluster` for a membership `change` every 100 ms until it is taken
/// (the member is not there yet, no leader answers yet) or `deadline`
/// passes; the last refusal then.
///
/// Blocking: it runs `locksmith cluster` and sleeps between attempts.
fn change_members_by(
    cluster: &ServeCluster,
    change: &[&str],
    deadline: std::time::Instant,
) -> Result<(), String> {
    loop {
        match cluster.change_members(change) {
            Ok(()) => return Ok(()),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Kills one of `masters` that has `lock`, deletes its data, and restarts it
/// empty, after `late` if given.
///
/// Blocking: it restarts a server.
fn restart_empty(
    masters: &[locksmith_testkit::Redis],
    lock: &str,
    late: Option<Duration>,
) -> Result<String, String> {
    let master = masters
        .iter()
        .find(|m| {
            m.query(&["EXISTS", lock])
                .is_ok_and(|e| e.as_int() == Some(1))
        })
        .ok_or_else(|| format!("no master has {lock}"))?;
    master.kill();
    for data in ["appendonlydir", "dump.rdb"] {
        let path = master.dir().join(data);
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(format!("cannot delete {}: {e}", path.display()))
            }
        })?;
    }
    if let Some(late) = late {
        std::thread::sleep(late);
    }
    master
        .try_restart()
        .map_err(|e| format!("restart failed: {e}"))?;
    Ok(match late {
        Some(late) => format!(
            "killed -9 master {}, deleted its data, restarted it empty after {late:?}",
            master.port()
        ),
        None => format!(
            "killed -9 master {}, deleted its data, restarted it empty at once",
            master.port()
        ),
    })
}

/// Blackholes the proxies of client `who` for the outage, then heals them.
///
/// Cancel safety: not cancel safe: dropped during the outage, it leaves the
/// client cut off (its proxies blackholed) until the round drops.
async fn partition(round: &Round, who: Who, timing: Timing, whom: String) -> FaultRecord {
    let start = now();
    for proxy in round.proxies(who.0) {
        proxy.set(Mode::Blackhole);
    }
    tokio::time::sleep(timing.outage()).await;
    for proxy in round.proxies(who.0) {
        proxy.set(Mode::Pass);
    }
    record(
        FaultKind::Partition,
        start,
        Some(vec![who]),
        format!("cut off {whom} from the backend for {:?}", timing.outage()),
    )
}

/// Takes a lingering holder's session away, the store's own way (see
/// `FaultKind::ExpireSession`).
///
/// Cancel safety: not cancel safe: on ZooKeeper, as `partition` (the
/// holder's proxies stay blackholed); etcd's lease revoke and PostgreSQL's
/// terminate run on to their end on a blocking thread; a force-release may
/// or may not have happened; a wait for the holder leaves its linger
/// request standing.
async fn expire_session(
    round: &Round,
    target: &Arc<Target>,
    timing: Timing,
) -> Result<FaultRecord, String> {
    let kind = FaultKind::ExpireSession;
    let victim = lingering_holder(round, timing.outage()).await?;
    let (who, lock, whom) = (victim.who, victim.lock.clone(), victim.to_string());
    match (target.kind, target.spawned.as_deref()) {
        (Kind::ZooKeeper | Kind::ZooKeeperEnsemble, _) => {
            let mut record = partition(round, who, timing, whom).await;
            record.kind = kind.name().into();
            record.note = format!(
                "expired the ZooKeeper session by partition: {}",
                record.note
            );
            Ok(record)
        }
        (Kind::Etcd | Kind::EtcdCluster, Some(Spawned::Etcd(_) | Spawned::EtcdCluster(_))) => {
            let start = now();
            let server = target.clone();
            let lock_name = lock.clone();
            let lease = tokio::task::spawn_blocking(move || {
                let etcd = match server.spawned.as_deref() {
                    Some(Spawned::Etcd(etcd)) => etcd,
                    Some(Spawned::EtcdCluster(cluster)) => {
                        cluster.leader().map_err(|e| e.to_string())?
                    }
                    _ => unreachable!("checked above"),
                };
                // The holder is the key with the lowest create revision under
                // `<name>/`, named `<name>/<lease hex>` (etcd's concurrency.Mutex).
                let out = etcd
                    .etcdctl()
                    .args(["get", &format!("{lock_name}/"), "--prefix", "--keys-only"])
                    .args(["--sort-by=CREATE", "--order=ASCEND", "--limit=1"])
                    .output()
                    .map_err(|e| format!("etcdctl get: {e}"))?;
                let key = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("no holder key under {lock_name}/"))?;
                let lease = key.rsplit('/').next().unwrap_or_default().to_owned();
                let revoke = etcd
                    .etcdctl()
                    .args(["lease", "revoke", &lease])
                    .output()
                    .map_err(|e| format!("etcdctl lease revoke: {e}"))?;
                if !revoke.status.success() {
                    return Err(format!(
                        "etcdctl lease revoke {lease}: {}",
                        String::from_utf8_lossy(&revoke.stderr).trim()
                    ));
                }
                Ok(lease)
            })
            .await
            .map_err(|e| e.to_string())??;
            Ok(record(
                kind,
                start,
                Some(vec![who]),
                format!("revoked etcd lease {lease} of {whom}"),
            ))
        }
        (Kind::Postgres, Some(Spawned::Postgres(_))) => {
            let start = now();
            let server = target.clone();
            let killed = tokio::task::spawn_blocking(move || {
                let Some(Spawned::Postgres(pg)) = server.spawned.as_deref() else {
                    unreachable!("checked above")
                };
                pg.query(
                    "select count(pg_terminate_backend(pid)) from pg_locks \
                     where locktype = 'advisory' and granted and pid <> pg_backend_pid()",
                )
                .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())??;
            Ok(record(
                kind,
                start,
                Some(vec![who]),
                format!(
                    "pg_terminate_backend on {killed} advisory-lock holder connection(s) ({whom})"
                ),
            ))
        }
        _ => {
            let start = now();
            // The cluster may still be between leaders from the last
            // round's fault (a member restarted moments ago): the admin
            // waits that out, as an operator would, within a bound, instead
            // of one session setup (a TTL at most).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            let admin = loop {
                match target.connect(timing.session_ttl, "torture-admin").await {
                    Ok(admin) => break admin,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(error = %e, "admin connect: trying again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(format!("admin connect: {e}")),
                }
            };
            let result = admin.force_release(&lock).await;
            let _ = admin.close().await;
            result.map_err(|e| format!("force_release: {e}"))?;
            Ok(record(
                kind,
                start,
                Some(vec![who]),
                format!("force-released the lock of {whom}"),
            ))
        }
    }
}
