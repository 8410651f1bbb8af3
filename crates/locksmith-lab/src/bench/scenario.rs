//! The four scenarios, written once against the public client API so that one
//! code path measures every backend.
//!
//! Every "client" is its own [`locksmith::Client`] (its own connection and
//! session), connected before the clock starts; workers line up on a barrier
//! and then run for the same wall-clock time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use indicatif::ProgressBar;
use locksmith::Client;
use serde::Serialize;
use tokio::sync::Barrier;

use super::cpu::{CpuPerOp, CpuWindow};
use super::stats::{jain, Samples, Summary};
use super::target::Target;

/// Settings shared by the scenarios.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Run time of each timed measurement.
    pub duration: Duration,
    /// Session TTL of every client.
    pub session_ttl: Duration,
    /// Prefix of every lock name of this run (unique per run).
    pub prefix: String,
}

/// (a) Uncontended acquire + release pairs.
#[derive(Debug, Clone, Serialize)]
pub struct Uncontended {
    /// Concurrent clients, each on its own lock.
    pub clients: usize,
    /// Pairs completed.
    pub pairs: u64,
    /// Aggregate pairs per second.
    pub pairs_per_sec: f64,
    /// Latency of one acquire + release pair.
    pub latency: Summary,
    /// CPU per pair: the bench's and the store's, run and waited for.
    pub cpu: Option<CpuPerOp>,
    /// With `--repeat`: the rate of every run (this one is the median).
    pub runs: Vec<f64>,
}

/// A contended run: workers taking turns on one lock.
#[derive(Debug, Clone, Serialize)]
pub struct Contended {
    /// Clients contending for the lock.
    pub clients: usize,
    /// How long each holder kept the lock (µs).
    pub hold_us: u64,
    /// Grants in the run.
    pub grants: u64,
    /// Grants per second (lock transfers per second).
    pub grants_per_sec: f64,
    /// Time from a release (just before the call) to the next grant (the moment
    /// the grantee's acquire returned).
    pub handoff: Summary,
    /// Time each acquire waited, from the call to its return.
    pub wait: Summary,
    /// Share of grants that went back to the client that had just released.
    pub self_regrant_ratio: f64,
    /// Grants per client.
    pub per_client: Vec<u64>,
    /// Jain's fairness index of `per_client` (1.0 = perfectly even).
    pub jain: f64,
    /// CPU per grant: the bench's and the store's, run and waited for.
    pub cpu: Option<CpuPerOp>,
    /// With `--repeat`: the rate of every run (this one is the median).
    pub runs: Vec<f64>,
}

/// (d) Many locks held at once.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    /// Locks held at the peak.
    pub locks: u64,
    /// Clients holding the locks between them (each its own session).
    pub clients: usize,
    /// Acquires in flight at once (over all the clients).
    pub concurrency: usize,
    /// Time to hold them all.
    pub hold_secs: f64,
    /// Acquires per second while filling.
    pub holds_per_sec: f64,
    /// Time to release them all.
    pub release_secs: f64,
    /// Server memory before (bytes), when known.
    pub memory_before: Option<u64>,
    /// Server memory with every lock held (bytes), when known.
    pub memory_held: Option<u64>,
    /// `(held - before) / locks`, when known.
    pub bytes_per_lock: Option<f64>,
    /// Holds already lost when the memory was read, half a second after the
    /// last grant (a renewal that could not keep up): those locks were not
    /// all held at once.
    pub lost_at_peak: u64,
    /// Releases that failed (each a hold lost before its release).
    pub release_errors: u64,
}

/// Connects `n` clients at once.
///
/// Cancel safety: safe; the clients connected so far are dropped, ending
/// their sessions.
pub(super) async fn connect_all(
    target: &Target,
    n: usize,
    settings: &Settings,
) -> Result<Vec<Client>, String> {
    futures::future::try_join_all((0..n).map(|_| target.connect(settings.session_ttl, "bench")))
        .await
        .map_err(|e| format!("connect: {e}"))
}

/// Closes every client, all at once.
///
/// Cancel safety: a dropped call cuts the closes short; the holds left end
/// with the sessions, as for `Client::close`.
pub(super) async fn close_all(clients: Vec<Client>) {
    futures::future::join_all(clients.iter().map(Client::close)).await;
}

/// (a) `clients` clients, each looping acquire + release on a lock of its own.
///
/// Cancel safety: dropping it drops the workers' clients; their sessions end.
pub async fn uncontended(
    target: &Target,
    clients: usize,
    settings: &Settings,
) -> Result<(Uncontended, Samples), String> {
    let connected = connect_all(target, clients, settings).await?;
    let barrier = Arc::new(Barrier::new(clients));
    let cpu = CpuWindow::start(target.store_roots());
    let mut workers = tokio::task::JoinSet::new();
    for (i, client) in connected.iter().cloned().enumerate() {
        let lock = client.lock(format!("{}/uncontended-{clients}/{i}", settings.prefix));
        let barrier = barrier.clone();
        let duration = settings.duration;
        workers.spawn(async move {
            for _ in 0..5 {
                lock.acquire().await?.release().await?;
            }
            barrier.wait().await;
            let mut samples = Samples::new();
            let start = Instant::now();
            let mut pairs = 0u64;
            while start.elapsed() < duration {
                let t = Instant::now();
                lock.acquire().await?.release().await?;
                samples.push(t.elapsed());
                pairs += 1;
            }
            locksmith::Result::Ok((pairs, start.elapsed(), samples))
        });
    }
    let mut samples = Samples::new();
    let (mut pairs, mut rate) = (0, 0.0);
    while let Some(joined) = workers.join_next().await {
        let (n, elapsed, s) = joined
            .map_err(|e| format!("worker panicked: {e}"))?
            .map_err(|e: locksmith::Error| e.to_string())?;
        pairs += n;
        rate += n as f64 / elapsed.as_secs_f64();
        samples.extend(s);
    }
    let cpu = cpu.per_op(pairs);
    close_all(connected).await;
    let latency = samples.summary();
    Ok((
        Uncontended {
            clients,
            pairs,
            pairs_per_sec: rate,
            latency,
            cpu,
            runs: Vec::new(),
        },
        samples,
    ))
}

/// What the contending workers share.
struct Turns {
    /// Set just before each release; taken by the next grantee.
    released: Mutex<Option<(Instant, usize)>>,
}

/// (b) and (c): `clients` clients taking turns on one lock, each holding it
/// for `hold`. Returns the summary and the handoff and wait samples.
///
/// Cancel safety: dropping it drops the workers' clients; their sessions end.
pub async fn contended(
    target: &Target,
    clients: usize,
    hold: Duration,
    name: &str,
    settings: &Settings,
) -> Result<(Contended, Samples, Samples), String> {
    let connected = connect_all(target, clients, settings).await?;
    let barrier = Arc::new(Barrier::new(clients));
    let turns = Arc::new(Turns {
        released: Mutex::new(None),
    });
    let self_regrants = Arc::new(AtomicU64::new(0));
    let lock_name = format!("{}/{name}", settings.prefix);
    let mut workers = tokio::task::JoinSet::new();
    let cpu = CpuWindow::start(target.store_roots());
    let started = Instant::now();
    for (i, client) in connected.iter().cloned().enumerate() {
        let lock = client.lock(lock_name.clone());
        let (barrier, turns, self_regrants) =
            (barrier.clone(), turns.clone(), self_regrants.clone());
        let duration = settings.duration;
        workers.spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + duration;
            let (mut handoffs, mut waits, mut grants) = (Samples::new(), Samples::new(), 0u64);
            loop {
                let asked = Instant::now();
                let guard = lock.acquire().await?;
                let granted = Instant::now();
                if let Some((released, by)) = turns.released.lock().expect("turns").take() {
                    handoffs.push(granted - released);
                    if by == i {
                        self_regrants.fetch_add(1, Ordering::Relaxed);
                    }
                }
                waits.push(granted - asked);
                grants += 1;
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                *turns.released.lock().expect("turns") = Some((Instant::now(), i));
                guard.release().await?;
                if granted >= deadline {
                    break;
                }
            }
            locksmith::Result::Ok((grants, handoffs, waits))
        });
    }
    let (mut handoffs, mut waits, mut per_client) = (Samples::new(), Samples::new(), Vec::new());
    while let Some(joined) = workers.join_next().await {
        let (grants, h, w) = joined
            .map_err(|e| format!("worker panicked: {e}"))?
            .map_err(|e: locksmith::Error| e.to_string())?;
        per_client.push(grants);
        handoffs.extend(h);
        waits.extend(w);
    }
    let elapsed = started.elapsed();
    let grants: u64 = per_client.iter().sum();
    let cpu = cpu.per_op(grants);
    close_all(connected).await;
    let summary = Contended {
        clients,
        hold_us: hold.as_micros() as u64,
        grants,
        grants_per_sec: grants as f64 / elapsed.as_secs_f64(),
        handoff: handoffs.summary(),
        wait: waits.summary(),
        self_regrant_ratio: self_regrants.load(Ordering::Relaxed) as f64
            / (handoffs.len().max(1)) as f64,
        jain: jain(&per_client),
        cpu,
        per_client,
        runs: Vec::new(),
    };
    Ok((summary, handoffs, waits))
}

/// The server's memory once it has stopped shrinking: the connections of the
/// scenarios before may still be closing (each PostgreSQL connection is a
/// process that exits after its client has gone), and a baseline taken before
/// they have would make the growth per lock too small, even negative.
///
/// Cancel safety: safe; it only reads /proc and sleeps.
async fn settled_memory(target: &Target) -> Option<u64> {
    let mut last = target.memory()?;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = target.memory()?;
        if now + now / 100 >= last {
            return Some(now);
        }
        last = now;
    }
    Some(last)
}

/// (d) `clients` clients acquiring `locks` distinct locks between them
/// (`concurrency` acquires in flight in all) and holding them all, then
/// releasing them all.
///
/// Several clients, because that is how many locks come to be held at once,
/// and because a store may make one session's locks cost more the more it
/// holds: the end of each PostgreSQL transaction walks its session's local
/// lock table, so one connection holding n advisory locks takes O(n²) to get
/// them (measured: a `pg_advisory_lock` takes 0.46 ms with 5 000 held by its
/// session, 4.0 ms with 40 000).
/// The memory baseline is read with the clients connected and warmed up, so
/// that the growth per lock is the locks' alone.
///
/// Cancel safety: dropping it drops the guards (released in the background)
/// and the clients.
pub async fn scale(
    target: &Target,
    locks: u64,
    clients: usize,
    concurrency: usize,
    settings: &Settings,
    progress: &ProgressBar,
) -> Result<Scale, String> {
    let connected = connect_all(target, clients, settings).await?;
    futures::future::try_join_all(connected.iter().enumerate().map(|(i, client)| async move {
        client
            .lock(format!("{}/scale-warm-up/{i}", settings.prefix))
            .acquire()
            .await?
            .release()
            .await
    }))
    .await
    .map_err(|e| format!("warm-up: {e}"))?;
    let memory_before = settled_memory(target).await;
    let held = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let guards: Vec<locksmith::Guard> = {
        let connected = &connected;
        let held = &held;
        futures::stream::iter(0..locks)
            .map(|i| async move {
                let client = &connected[i as usize % connected.len()];
                let guard = client
                    .lock(format!("{}/scale/{i}", settings.prefix))
                    .acquire()
                    .await;
                let n = held.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 10_000 == 0 {
                    progress.set_message(format!("{}: scale, {n} locks held", target.label));
                }
                guard
            })
            .buffer_unordered(concurrency)
            .try_collect()
            .await
            .map_err(|e| {
                format!(
                    "after {} locks held: {e}",
                    held.load(Ordering::Relaxed).saturating_sub(1)
                )
            })?
    };
    let hold_secs = start.elapsed().as_secs_f64();
    // Let the server settle (a JVM or a group commit may trail the last grant).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let memory_held = target.memory();
    let lost_at_peak = guards.iter().filter(|g| g.is_lost()).count() as u64;
    let start = Instant::now();
    // A hold lost meanwhile fails its release; that is counted, not fatal.
    let release_errors = futures::stream::iter(guards)
        .map(|guard| guard.release())
        .buffer_unordered(concurrency)
        .filter(|released| futures::future::ready(released.is_err()))
        .count()
        .await as u64;
    let release_secs = start.elapsed().as_secs_f64();
    close_all(connected).await;
    let bytes_per_lock = match (memory_before, memory_held) {
        (Some(before), Some(after)) => Some((after as f64 - before as f64) / locks as f64),
        _ => None,
    };
    Ok(Scale {
        locks,
        clients,
        concurrency,
        hold_secs,
        holds_per_sec: locks as f64 / hold_secs,
        release_secs,
        memory_before,
        memory_held,
        bytes_per_lock,
        lost_at_peak,
        release_errors,
    })
}
