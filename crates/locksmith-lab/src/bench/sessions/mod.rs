//! (e) Idle sessions: what sessions that do nothing but stay alive cost a
//! store, and what they do to the clients that work beside them.
//!
//! N sessions are opened and kept alive, each renewed every third of its
//! TTL at its own phase, with the answer timed where the store lets a client
//! see it. tokio's timer wakes the renewals due within a millisecond
//! together, as one client process's arrive; with `--spread-renewals` each
//! leaves at its own instant, as independent clients' do ([`pacer`]). The foreground handoff (scenario (b)'s loop) runs once before
//! they open, and once beside them after a third of their TTL with them
//! alone. Reported: each member's memory (PSS) without and with them, and
//! its growth per session; each member's CPU (user + system time, from
//! /proc) while they are alone, so that it is theirs; the renewal answer
//! p50 / p99 while they are alone and beside the loop; and the handoff p50
//! both ways.
//!
//! What a session is differs per store, and each is driven the way that
//! store's own clients keep one alive, many to a connection where the store
//! allows it ([`server`], [`etcd`], [`zookeeper`], [`redis`]): a locksmith
//! session on a channel of its connection's `Sessions` stream (or a session
//! stream of its own) with its heartbeats; an etcd lease with a keep-alive
//! stream; a ZooKeeper session, which is a connection of its own and pings
//! by itself (its answers are not visible to a client, so they are not
//! timed); a Redis hold renewed by a watchdog's script. Raw protocol
//! clients rather than the `locksmith` client, which keeps one session per
//! client and does not time its renewals; the stores see the same messages.

mod etcd;
mod pacer;
mod redis;
mod server;
mod zookeeper;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Future, StreamExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::scenario::{contended, Settings};
use super::stats::{Samples, Summary};
use super::target::{cpu_percent, cpu_ticks, Kind, Target};

/// What (e) measured on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct IdleSessions {
    /// What a session is on this store.
    pub session_kind: &'static str,
    /// Sessions kept open.
    pub sessions: usize,
    /// Sessions per connection.
    pub per_connection: usize,
    /// Their TTL (ms); each is renewed every third of it.
    pub ttl_ms: u64,
    /// Whether each renewed at its own instant (`--spread-renewals`) rather
    /// than on tokio's millisecond timer.
    pub renewals_spread: bool,
    /// Renewals answered per second over both windows (0 where not timed).
    pub heartbeats_per_sec: f64,
    /// Time from sending a renewal to its answer, over both windows (the
    /// sessions alone, then beside the handoff loop), where the store lets a
    /// client see it.
    pub heartbeat: Option<Summary>,
    /// Each member's CPU with the sessions alone (a third of their TTL), in
    /// % of one core.
    pub member_cpu_percent: Vec<f64>,
    /// Each member's memory (PSS) before the sessions opened, in bytes.
    pub member_memory_before: Vec<u64>,
    /// Each member's memory with the sessions open, in bytes.
    pub member_memory_with: Vec<u64>,
    /// Growth of the most grown member's memory per session, in bytes.
    pub bytes_per_session: f64,
    /// Foreground handoff p50 without idle sessions (µs).
    pub handoff_p50_alone_us: f64,
    /// Foreground handoff p50 beside the idle sessions (µs).
    pub handoff_p50_beside_us: f64,
}

/// Connections whose sessions open at the same time.
const CONNECTIONS_OPENING_AT_ONCE: usize = 8;

/// Whether this scenario drives stores of `kind`.
pub fn drives(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Server
            | Kind::ServerCluster
            | Kind::Etcd
            | Kind::EtcdCluster
            | Kind::ZooKeeper
            | Kind::ZooKeeperEnsemble
            | Kind::Redis
    )
}

/// How the idle sessions of one store are opened: `sessions` of `ttl`,
/// `per_connection` to a connection.
pub struct Plan {
    /// Sessions to open.
    pub sessions: usize,
    /// Sessions to a connection, where the store allows more than one.
    pub per_connection: usize,
    /// Each session's TTL.
    pub ttl: Duration,
    /// Each session renews at its own instant ([`pacer`]), not when tokio's
    /// millisecond timer wakes every session due within the millisecond.
    pub spread_renewals: bool,
    /// On the locksmith server: a session stream for each session rather
    /// than channels of one `Sessions` stream per connection.
    pub stream_per_session: bool,
}

impl Plan {
    /// When session `index` first renews: the phases spread over a third of
    /// the TTL, so renewals arrive evenly.
    fn phase(&self, index: usize) -> Duration {
        self.ttl / 3 * index as u32 / self.sessions.max(1) as u32
    }
}

/// What every keeper of a run shares: when to stop, where the timed
/// answers go, and what wakes it to renew.
#[derive(Clone)]
pub(super) struct Shared {
    stop: Arc<watch::Sender<bool>>,
    /// Open (since the instant given) while the window is measured.
    window: Arc<Mutex<Option<Instant>>>,
    samples: Arc<Mutex<Samples>>,
    /// With `--spread-renewals`: wakes each keeper at its own instant.
    pacer: Option<pacer::Pacer>,
}

impl Shared {
    /// Records one renewal sent at `sent` and answered now, if it was sent
    /// within the window.
    fn answered(&self, sent: Instant) {
        let answered = Instant::now();
        let open = *self.window.lock().expect("window");
        if open.is_some_and(|opened| sent >= opened) {
            self.samples.lock().expect("samples").push(answered - sent);
        }
    }

    fn new(pacer: Option<pacer::Pacer>) -> Shared {
        Shared {
            stop: Arc::new(watch::Sender::new(false)),
            window: Arc::default(),
            samples: Arc::default(),
            pacer,
        }
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Returns once the run stops.
    ///
    /// Cancel safety: safe, it only waits.
    async fn until_stopped(&self) {
        // The sender lives in `self`, so the wait ends only by the stop.
        let _ = self.stop.subscribe().wait_for(|stopped| *stopped).await;
    }
}

/// One idle session, renewed by [`keep`].
pub(super) trait Renew {
    /// Renews the session once and waits for the answer.
    ///
    /// Cancel safety: dropped mid-way, the renewal may or may not reach the
    /// store; the session lives until its TTL either way.
    fn renew(&mut self) -> impl Future<Output = Result<(), String>> + Send;

    /// Ends the session, best effort, once the run is over.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// Opens the plan's sessions a connection's worth at a time, a few
/// connections at once (`open(first, last)` opens sessions `first..last` on
/// a connection of their own), and spawns a keeper for each: the stores log
/// each open, and commit opens that arrive together in one write.
///
/// Cancel safety: dropped, the sessions opened so far live until their TTL.
async fn open_by_connection<S, F, Opening>(
    plan: &Plan,
    shared: &Shared,
    keepers: &mut JoinSet<Result<(), String>>,
    open: F,
) -> Result<(), String>
where
    S: Renew + Send + 'static,
    F: Fn(usize, usize) -> Opening,
    Opening: Future<Output = Result<Vec<S>, String>>,
{
    let per_connection = plan.per_connection.max(1);
    let mut connections = futures::stream::iter((0..plan.sessions).step_by(per_connection))
        .map(|first| {
            let opening = open(first, (first + per_connection).min(plan.sessions));
            async move { opening.await.map(|sessions| (first, sessions)) }
        })
        .buffer_unordered(CONNECTIONS_OPENING_AT_ONCE);
    while let Some(opened) = connections.next().await {
        let (first, sessions) = opened?;
        for (index, session) in (first..).zip(sessions) {
            keepers.spawn(keep(session, plan.ttl, plan.phase(index), shared.clone()));
        }
    }
    Ok(())
}

/// Renews `session` every third of the plan's TTL, the first after `phase`,
/// until the run stops; then closes it.
///
/// Cancel safety: dropped, the session is left to its TTL.
async fn keep<S: Renew>(
    mut session: S,
    ttl: Duration,
    phase: Duration,
    shared: Shared,
) -> Result<(), String> {
    let mut wakeup = Wakeup::new(shared.pacer.clone(), phase, ttl / 3);
    while !shared.stopped() {
        wakeup.wait().await;
        let sent = Instant::now();
        session.renew().await?;
        shared.answered(sent);
    }
    session.close().await;
    Ok(())
}

/// What wakes a keeper to renew: tokio's timer, or the run's pacer
/// (`--spread-renewals`).
enum Wakeup {
    Timer(tokio::time::Interval),
    Pacer {
        pacer: pacer::Pacer,
        wake: Arc<tokio::sync::Notify>,
        next: std::time::Instant,
        period: Duration,
    },
}

impl Wakeup {
    /// Every `period`, the first after `phase`.
    fn new(pacer: Option<pacer::Pacer>, phase: Duration, period: Duration) -> Wakeup {
        match pacer {
            Some(pacer) => Wakeup::Pacer {
                pacer,
                wake: Arc::default(),
                next: std::time::Instant::now() + phase,
                period,
            },
            None => {
                let mut tick = tokio::time::interval_at(Instant::now() + phase, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                Wakeup::Timer(tick)
            }
        }
    }

    /// Returns at the next renewal's time. Woken late (the renewal before
    /// took longer than a period), the next is a period from then, as the
    /// timer's `MissedTickBehavior::Delay` does past 5 ms late.
    ///
    /// Cancel safety: the timer's tick is cancel safe. Dropped while waiting
    /// for the pacer, its notice still comes later and ends a later wait
    /// that much early (one renewal early); keepers are dropped only with
    /// their run.
    async fn wait(&mut self) {
        match self {
            Wakeup::Timer(tick) => {
                tick.tick().await;
            }
            Wakeup::Pacer {
                pacer,
                wake,
                next,
                period,
            } => {
                pacer.wake_at(*next, wake);
                wake.notified().await;
                let now = std::time::Instant::now();
                *next = if now > *next + Duration::from_millis(5) {
                    now + *period
                } else {
                    *next + *period
                };
            }
        }
    }
}

/// (e) against `target`: the idle sessions of `plan` beside a handoff loop
/// of `waiters`.
///
/// Cancel safety: dropping it drops the sessions' tasks; the sessions live
/// on until their TTL runs out on the store.
pub async fn idle_sessions(
    target: &Target,
    plan: Plan,
    waiters: usize,
    settings: &Settings,
) -> Result<IdleSessions, String> {
    // A store given by URL has no members to measure here: only the
    // renewals and the handoff are.
    let members = match &target.spawned {
        Some(spawned) => spawned
            .processes()
            .iter()
            .map(|p| p.pid().ok_or("a member is not running"))
            .collect::<Result<Vec<u32>, _>>()?,
        None => Vec::new(),
    };
    let hosts = hosts_of(&target.url)?;
    let memory_before: Vec<u64> = members.iter().map(|&p| memory(p)).collect();
    let (alone, _, _) = contended(target, waiters, Duration::ZERO, "idle-alone", settings).await?;

    let pacer = plan.spread_renewals.then(pacer::Pacer::start).transpose()?;
    let shared = Shared::new(pacer);
    let mut keepers = JoinSet::new();
    let (session_kind, per_connection) = match target.kind {
        Kind::Server | Kind::ServerCluster => {
            server::open(&hosts, &plan, &shared, &mut keepers).await?
        }
        Kind::Etcd | Kind::EtcdCluster => etcd::open(&hosts, &plan, &shared, &mut keepers).await?,
        Kind::ZooKeeper | Kind::ZooKeeperEnsemble => {
            zookeeper::open(&hosts, &plan, &shared, &mut keepers).await?
        }
        Kind::Redis => redis::open(&target.url, &plan, &shared, &mut keepers).await?,
        other => return Err(format!("the sessions scenario does not drive {other}")),
    };
    // A whole round of renewals before anything is measured.
    tokio::time::sleep(plan.ttl / 3 + Duration::from_millis(200)).await;
    let memory_with: Vec<u64> = members.iter().map(|&p| memory(p)).collect();
    // The sessions alone for a round of renewals: what they cost the
    // members, with nothing else running.
    let cpu_before: Vec<u64> = members.iter().map(|&p| cpu_ticks(p)).collect();
    let started = Instant::now();
    *shared.window.lock().expect("window") = Some(started);
    tokio::time::sleep(plan.ttl / 3).await;
    let alone_for = started.elapsed();
    let cpu_after: Vec<u64> = members.iter().map(|&p| cpu_ticks(p)).collect();
    // Then the handoff loop beside them; renewals stay timed.
    let (beside, _, _) =
        contended(target, waiters, Duration::ZERO, "idle-beside", settings).await?;
    let elapsed = started.elapsed();
    *shared.window.lock().expect("window") = None;
    shared.stop.send_replace(true);
    let mut failures = Vec::new();
    while let Some(kept) = keepers.join_next().await {
        match kept {
            Ok(Err(error)) => failures.push(error),
            Err(panicked) => failures.push(panicked.to_string()),
            Ok(Ok(())) => {}
        }
    }
    if let Some(first) = failures.first() {
        return Err(format!(
            "{} sessions failed, first: {first}",
            failures.len()
        ));
    }
    let member_cpu_percent = cpu_before
        .iter()
        .zip(&cpu_after)
        .map(|(b, a)| cpu_percent(a.saturating_sub(*b), alone_for))
        .collect();
    let grown = memory_before
        .iter()
        .zip(&memory_with)
        .map(|(b, w)| w.saturating_sub(*b))
        .max()
        .unwrap_or(0);
    let mut samples = std::mem::take(&mut *shared.samples.lock().expect("samples"));
    let timed = !samples.is_empty();
    Ok(IdleSessions {
        session_kind,
        sessions: plan.sessions,
        per_connection,
        ttl_ms: plan.ttl.as_millis() as u64,
        renewals_spread: plan.spread_renewals,
        heartbeats_per_sec: samples.len() as f64 / elapsed.as_secs_f64(),
        heartbeat: timed.then(|| samples.summary()),
        member_cpu_percent,
        member_memory_before: memory_before,
        member_memory_with: memory_with,
        bytes_per_session: grown as f64 / plan.sessions as f64,
        handoff_p50_alone_us: alone.handoff.p50_us,
        handoff_p50_beside_us: beside.handoff.p50_us,
    })
}

/// The `host:port` list of a store URL (`scheme://a:1,b:2/path?query`).
fn hosts_of(url: &str) -> Result<Vec<String>, String> {
    let rest = url.split_once("://").ok_or("no scheme in the URL")?.1;
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if hosts.is_empty() {
        return Err(format!("no host in {url}"));
    }
    Ok(hosts)
}

/// The memory (PSS) of the process tree of `pid`, in bytes.
fn memory(pid: u32) -> u64 {
    super::target::tree_memory(pid).unwrap_or(0)
}
