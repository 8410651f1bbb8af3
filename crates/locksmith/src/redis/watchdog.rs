//! The watchdog: one background task per client that keeps every hold without a
//! fixed lease alive and notices holds that are gone.
//!
//! Redisson's rule: a hold without a lease gets the watchdog lease (here the
//! client's `session_ttl`) and is renewed every third of it. Unlike Redisson,
//! which runs a timer per lock, one task renews all of a client's holds, up to
//! 100 per script call (Redisson's batch size), so ten thousand holds cost a
//! hundred calls per period, not ten thousand timers.
//!
//! On a Redis Cluster a batch holds locks of one hash slot only (one script
//! runs on one primary), so renewals cost one call per slot in use.
//!
//! Holds with a fixed lease are not renewed, but they are checked in the same
//! batches, and their guard is marked lost when the lease runs out.
//!
//! Each hold's `Term` decides, as for every backend (module `keeper`),
//! until when it is trusted and why it was lost:
//!
//! * a renewal (or check) finds it gone: expired, force-released, or the data
//!   was lost in a Redis restart or failover;
//! * its lease ends before a renewal got through: trust is counted from the
//!   moment the last successful renewal was *sent*, so it never outlasts
//!   Redis's own;
//! * for Redlock, a majority of nodes no longer holds it, or no majority renewed
//!   it within its validity (lease − drift).
//!
//! Releasing a hold removes it from the watchdog before the release is sent, so
//! renewal stops at once. After a reconnect the hubs poke the watchdog, which
//! then re-checks every hold immediately.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ::redis::cluster_routing::Slot;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ops::Target;
use super::Shared;
use crate::backend::LostSignal;
use crate::keeper::{renewal_interval, retry_after, Term};
use crate::lost::LostCause;

/// Most holds renewed by one script call (Redisson's batch size).
pub(crate) const BATCH: usize = 100;

/// One hold (of one owner on one lock: re-entry is the model layer's, so
/// the store sees one hold however deep) under watch.
struct Entry {
    target: Target,
    /// The keeper's term: renewed unless the hold has a fixed lease.
    term: Term,
    lost: LostSignal,
}

#[derive(Default)]
struct State {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// Every entry by expiry, so that finding the due ones and the next one
    /// costs a lookup, not a walk over every hold (a client may hold 100 k).
    by_expiry: BTreeSet<(Instant, u64)>,
    /// When the task will look next (so registering only wakes it if needed).
    wake_at: Option<Instant>,
}

impl State {
    /// Takes an entry out of the registry and the expiry index.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.by_expiry.remove(&(entry.term.trusted_until(), id));
        Some(entry)
    }

    /// Changes an entry's term, keeping the expiry index in step.
    fn update<T>(&mut self, id: u64, change: impl FnOnce(&mut Term) -> T) -> Option<T> {
        let entry = self.entries.get_mut(&id)?;
        self.by_expiry.remove(&(entry.term.trusted_until(), id));
        let answer = change(&mut entry.term);
        self.by_expiry.insert((entry.term.trusted_until(), id));
        Some(answer)
    }
}

/// The watchdog's registry of holds.
#[derive(Default)]
pub(crate) struct Watchdog {
    state: Mutex<State>,
    /// An entry was added or its expiry moved.
    changed: Notify,
    /// Re-check everything now (after a reconnect).
    pub recheck: Arc<Notify>,
}

/// One renewal batch to send.
pub(crate) struct Batch {
    /// Entry ids, in the order of the script's entries.
    pub ids: Vec<u64>,
    /// The holds.
    pub targets: Vec<Target>,
    /// Per hold: the lease to renew to (ms), 0 to only check.
    pub leases: Vec<u64>,
}

/// What a batch found.
pub(crate) struct BatchResult {
    /// When the batch was sent.
    pub sent: Instant,
    /// The batch's entry ids.
    pub ids: Vec<u64>,
    /// Per node: the per-entry answers (1 held, 0 gone), or why none came.
    pub replies: Vec<Result<Vec<i64>, String>>,
}

impl Watchdog {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("watchdog state")
    }

    /// Adds a hold, granted for `term`.
    pub fn register(&self, target: &Target, term: Term) -> (u64, LostSignal) {
        let expires = term.trusted_until();
        let mut state = self.state();
        state.next_id += 1;
        let id = state.next_id;
        let lost = LostSignal::new();
        state.entries.insert(
            id,
            Entry {
                target: target.clone(),
                term,
                lost: lost.clone(),
            },
        );
        state.by_expiry.insert((expires, id));
        let wake = state.wake_at.is_none_or(|at| expires < at);
        drop(state);
        if wake {
            self.changed.notify_one();
        }
        (id, lost)
    }

    /// Takes a hold off the watchdog (it is being released). Answers false
    /// if it was not watched any more (it was lost).
    pub fn release(&self, id: u64) -> bool {
        self.state().remove(id).is_some()
    }

    /// A hold was extended to `lease` by a request sent at `sent`.
    pub fn extended(&self, id: u64, sent: Instant, lease: Duration) {
        self.state().update(id, |t| t.extended(sent, lease));
        self.changed.notify_one();
    }

    /// Until when a hold is trusted, if it is still watched.
    pub fn trusted_until(&self, id: u64) -> Option<Instant> {
        self.state()
            .entries
            .get(&id)
            .map(|e| e.term.trusted_until())
    }

    /// Marks every hold of a lock lost (it was force-released).
    pub fn lose_lock(&self, lock_key: &str, reason: &str) {
        let mut state = self.state();
        let ids: Vec<u64> = state
            .entries
            .iter()
            .filter(|(_, e)| e.target.keys.lock == lock_key)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            lose(&mut state, id, LostCause::ForceReleased, reason.to_owned());
        }
    }

    /// Takes every hold out (client closing), marking them lost.
    pub fn drain(&self, reason: &str) -> Vec<Target> {
        let mut state = self.state();
        state.by_expiry.clear();
        state
            .entries
            .drain()
            .map(|(_, entry)| {
                entry.lost.fire_because(LostCause::ClientClosed, reason);
                entry.target
            })
            .collect()
    }

    /// Number of holds watched.
    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    /// The next time the task must look: the next tick or an earlier expiry.
    fn next_wake(&self, tick: Instant) -> Instant {
        let mut state = self.state();
        let at = state
            .by_expiry
            .first()
            .map_or(tick, |&(expiry, _)| expiry.min(tick));
        state.wake_at = Some(at);
        at
    }

    /// Marks holds whose lease has run out lost.
    fn expire(&self, now: Instant) {
        let mut state = self.state();
        let due: Vec<u64> = state
            .by_expiry
            .iter()
            .take_while(|&&(expires, _)| expires <= now)
            .map(|&(_, id)| id)
            .collect();
        for id in due {
            if let Some(loss) = state.entries[&id].term.ran_out(now) {
                lose(&mut state, id, loss.cause, loss.reason);
            }
        }
    }

    /// Every hold, in batches of at most [`BATCH`]; `by_slot`: each batch
    /// within one Redis Cluster hash slot, so that one primary runs it.
    fn batches(&self, renew_lease: Duration, by_slot: bool) -> Vec<Batch> {
        let state = self.state();
        let mut groups: HashMap<Option<Slot>, Vec<u64>> = HashMap::new();
        for (&id, entry) in &state.entries {
            let slot = by_slot.then(|| super::cluster::slot_of(&entry.target.keys));
            groups.entry(slot).or_default().push(id);
        }
        let lease = |entry: &Entry| {
            if entry.term.is_renewed() {
                renew_lease.as_millis() as u64
            } else {
                0
            }
        };
        groups
            .into_values()
            .flat_map(|ids| {
                ids.chunks(BATCH)
                    .map(|chunk| Batch {
                        ids: chunk.to_vec(),
                        targets: chunk
                            .iter()
                            .map(|id| state.entries[id].target.clone())
                            .collect(),
                        leases: chunk.iter().map(|id| lease(&state.entries[id])).collect(),
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Applies what a batch found; answers whether some hold was neither
    /// renewed nor found gone (too few nodes answered).
    fn apply(&self, result: BatchResult, quorum: usize, renew_lease: Duration) -> bool {
        let nodes = result.replies.len();
        let first_error = result
            .replies
            .iter()
            .find_map(|r| r.as_ref().err())
            .cloned();
        let mut unsettled = false;
        let now = Instant::now();
        // What has run out by now is expired first, as the timer would have
        // done: a lease the batch finds gone because it ended is reported as
        // expired, not as gone.
        self.expire(now);
        let mut state = self.state();
        for (index, id) in result.ids.iter().enumerate() {
            let (mut held, mut gone) = (0, 0);
            for reply in result.replies.iter().flatten() {
                match reply.get(index) {
                    Some(1) => held += 1,
                    Some(_) => gone += 1,
                    None => {}
                }
            }
            let Some(entry) = state.entries.get(id) else {
                continue;
            };
            if held >= quorum {
                state.update(*id, |t| t.renewed_for(result.sent, renew_lease, now));
            } else if gone > nodes - quorum {
                let loss = entry.term.gone(now);
                lose(&mut state, *id, loss.cause, loss.reason);
            } else {
                let error = first_error.clone().unwrap_or_default();
                state.update(*id, |t| t.unanswered(now, error));
                unsettled = true;
            }
        }
        unsettled
    }
}

fn lose(state: &mut State, id: u64, cause: LostCause, reason: String) {
    if let Some(entry) = state.remove(id) {
        tracing::warn!(lock = %entry.target.name, %reason, "redis hold lost");
        entry.lost.fire_because(cause, reason);
    }
}

type Pending = Pin<Box<dyn Future<Output = BatchResult> + Send>>;

/// The watchdog task of one client. Ends when the client is gone.
///
/// Cancel safety: stopping it stops renewal; holds then end with their lease.
pub(crate) async fn run(
    shared: Weak<Shared>,
    dog: Arc<Watchdog>,
    shutdown: CancellationToken,
    renew_lease: Duration,
    quorum: usize,
    by_slot: bool,
) {
    let interval = renewal_interval(renew_lease);
    let mut inflight: FuturesUnordered<Pending> = FuturesUnordered::new();
    let mut next_tick = Instant::now() + interval;
    let mut recheck = false;
    loop {
        let now = Instant::now();
        dog.expire(now);
        if (now >= next_tick || recheck) && inflight.is_empty() {
            if now >= next_tick {
                next_tick = now + interval;
            }
            recheck = false;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for batch in dog.batches(renew_lease, by_slot) {
                inflight.push(Box::pin(shared.clone().renew_batch(batch, interval)));
            }
        }
        let wake_at = dog.next_wake(next_tick);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(wake_at) => {}
            Some(result) = inflight.next(), if !inflight.is_empty() => {
                if dog.apply(result, quorum, renew_lease) {
                    // Try again soon: a restart or failover may be over before
                    // the leases run out.
                    next_tick = next_tick.min(Instant::now() + retry_after(renew_lease));
                }
            }
            _ = dog.changed.notified() => {}
            _ = dog.recheck.notified() => {
                tracing::debug!("re-checking held redis locks after a reconnect");
                recheck = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keeper::Kept;

    fn target(name: &str) -> Target {
        Target {
            name: name.to_owned(),
            keys: Arc::new(super::super::keys::Keys::new(name.to_owned())),
            field: format!("client:{name}"),
            kind: super::super::ops::Kind::Simple,
        }
    }

    /// A check that finds a leased hold gone: expired if its lease has run
    /// out here, gone (taken from outside) if it has not.
    #[test]
    fn a_lease_found_gone_after_it_ran_out_is_expired_not_gone() {
        let dog = Watchdog::default();
        let now = Instant::now();
        let lease = Duration::from_secs(60);
        let (ran_out, lost_ran_out) = dog.register(
            &target("a"),
            Term::fixed("a", Kept::Hold, now - lease, lease),
        );
        let (running, lost_running) =
            dog.register(&target("b"), Term::fixed("b", Kept::Hold, now, lease));
        let result = BatchResult {
            sent: now,
            ids: vec![ran_out, running],
            replies: vec![Ok(vec![0, 0])],
        };
        dog.apply(result, 1, Duration::from_secs(30));
        assert_eq!(lost_ran_out.cause(), Some(LostCause::LeaseExpired));
        assert_eq!(lost_running.cause(), Some(LostCause::Gone));
        assert_eq!(dog.len(), 0);
    }
}
