//! Lease (TTL) holds: a row in `lease_holds`, no connection held.
//!
//! Acquired by `acquire_lease` (a transaction-level try-lock on the key, then
//! the insert-or-take-expired upsert), kept by a task per hold: with the
//! watchdog (a hold without its own lease: the session TTL, in TTL mode) it
//! renews at a third of the lease and retries failed renewals until the lease
//! runs out; without it, it only watches the expiry. Expiry is judged by the
//! database's clock; locally the hold counts as expired at the time the last
//! successful renewal (or the acquire) was *sent* plus the lease, which is
//! never later than the database's expiry. `lost()` fires when that time
//! passes, or when a renewal finds the row gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tokio_postgres::types::{ToSql, Type};

use super::claim::{conflict, Claim, Target};
use super::config::Pooler;
use super::{detached, one, pg_error, wait, Shared};
use crate::backend::{LostSignal, Wait};
use crate::error::{Error, Result};
use crate::keeper::{renewal_interval, trusted_until};
use crate::lost::LostCause;

/// A live lease hold.
pub(crate) struct LeaseHold {
    shared: Arc<Shared>,
    name: String,
    owner: String,
    pub token: u64,
    pub lost: LostSignal,
    state: watch::Sender<LeaseState>,
    stop: CancellationToken,
    released: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct LeaseState {
    lease: Duration,
    /// Local (conservative) expiry.
    expires: Instant,
    /// When the watchdog renews next.
    renew_at: Instant,
}

/// Acquires a lease hold of `target` (whose lease is set): one
/// `acquire_lease` call on a pooled connection, then, unless `wait` is
/// [`Wait::No`], a wait in PostgreSQL's queue for the key (see `wait.rs`).
///
/// Cancel safety: safe. Attempts run on their own task and a grant nobody
/// receives releases itself; a dropped wait leaves the queue.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    target: &Target,
    wait: Wait,
    deadline: Option<(Instant, Duration)>,
    lease: Duration,
    watchdog: bool,
) -> Result<Option<Arc<LeaseHold>>> {
    let attempt = detached({
        let (shared, target) = (shared.clone(), target.clone());
        async move {
            let sent = Instant::now();
            let row = one(shared
                .query(&shared.sql.acquire_lease, &params(&shared, &target, false))
                .await?)?;
            let claim = Claim::from_row(&row, &target, true)?;
            Ok::<_, Error>(start(&shared, &target, claim, sent, lease, watchdog))
        }
    })
    .await??;
    match attempt {
        Claim::Granted(hold) => return Ok(Some(hold)),
        Claim::Conflict(detail) => return Err(conflict(target, detail)),
        Claim::Busy(_) => {}
    }
    if wait == Wait::No {
        return Ok(None);
    }
    let (conn, hold) = wait::wait(shared, target, deadline, |conn| {
        let (shared, target) = (shared.clone(), target.clone());
        async move {
            detached(async move {
                let sent = Instant::now();
                let row = one(wait::query(
                    &conn,
                    &target,
                    &shared.sql.acquire_lease,
                    &params(&shared, &target, true),
                )
                .await?)?;
                let claim = Claim::from_row(&row, &target, true)?;
                Ok::<_, Error>(start(&shared, &target, claim, sent, lease, watchdog))
            })
            .await?
        }
    })
    .await?;
    // The wait's connection still holds the key, at session level or (behind
    // a transaction pooler) in the wait's transaction, which also holds the
    // new row: unlock, or commit. The connection serves later waits. On a
    // task of its own, with the hold: dropped midway, a caller would drop
    // the hold before the commit lands, and the hold's release would find
    // no row to delete and leave the committed one to its lease.
    let shared = shared.clone();
    let target = target.clone();
    let hold = detached(async move {
        let done = if shared.settings.pooler == Pooler::Transaction {
            // (No cancel request is ever sent behind a pooler: heads poll.)
            conn.simple(&format!("{} COMMIT", wait::GRANTED))
                .await
                .map(drop)
                .map_err(pg_error)
        } else {
            let unlock = if target.shared_key() {
                "pg_advisory_unlock_shared"
            } else {
                "pg_advisory_unlock"
            };
            wait::after_grant(&conn, &format!("SELECT {unlock}({})", target.key)).await
        };
        match done {
            Ok(()) => shared.conns.put(conn),
            Err(error) => {
                conn.kill(&format!("ending a lease grant's wait failed: {error}"));
                if shared.settings.pooler == Pooler::Transaction {
                    // The row was never committed.
                    return Err(error);
                }
            }
        }
        Ok(hold)
    })
    .await??;
    Ok(Some(hold))
}

/// The parameters of one `acquire_lease` call (`held`: the connection holds
/// the key, having waited for it).
fn params<'a>(
    shared: &'a Shared,
    target: &'a Target,
    held: bool,
) -> [(&'a (dyn ToSql + Sync), Type); 9] {
    [
        (&target.name, Type::TEXT),
        (&target.key, Type::INT8),
        (&target.slot_keys, Type::INT8_ARRAY),
        (&target.owner, Type::TEXT),
        (&shared.settings.lock_by, Type::TEXT),
        (&target.mode_name, Type::TEXT),
        (&target.permits, Type::INT4),
        (&target.lease_ms, Type::INT8),
        (if held { &true } else { &false }, Type::BOOL),
    ]
}

/// Turns a granted claim into a hold with its keeper task.
fn start(
    shared: &Arc<Shared>,
    target: &Target,
    claim: Claim,
    sent: Instant,
    lease: Duration,
    watchdog: bool,
) -> Claim<Arc<LeaseHold>> {
    let granted = match claim {
        Claim::Granted(granted) => granted,
        Claim::Busy(retry) => return Claim::Busy(retry),
        Claim::Conflict(detail) => return Claim::Conflict(detail),
    };
    let (state, updates) = watch::channel(LeaseState {
        lease,
        expires: trusted_until(sent, lease, Duration::ZERO),
        renew_at: sent + renewal_interval(lease),
    });
    let hold = Arc::new(LeaseHold {
        shared: shared.clone(),
        name: target.name.clone(),
        owner: target.owner.clone(),
        token: granted.token,
        lost: LostSignal::new(),
        state,
        stop: CancellationToken::new(),
        released: AtomicBool::new(false),
    });
    tokio::spawn(keep(
        Keeper {
            shared: shared.clone(),
            name: hold.name.clone(),
            owner: hold.owner.clone(),
            token: hold.token,
            lost: hold.lost.clone(),
            state: hold.state.clone(),
            stop: hold.stop.clone(),
            watchdog,
        },
        updates,
    ));
    Claim::Granted(hold)
}

/// What the keeper task of one hold needs.
struct Keeper {
    shared: Arc<Shared>,
    name: String,
    owner: String,
    token: u64,
    lost: LostSignal,
    state: watch::Sender<LeaseState>,
    stop: CancellationToken,
    watchdog: bool,
}

/// Renews (with the watchdog) and watches the expiry, see the module docs.
///
/// Cancel safety: runs as the hold's own task until the hold is released,
/// dropped or lost; aborting it stops the renewals (the lease then runs out
/// in the database) and the local expiry check that fires `lost()`.
async fn keep(keeper: Keeper, mut updates: watch::Receiver<LeaseState>) {
    loop {
        let state = *updates.borrow_and_update();
        let wake = if keeper.watchdog {
            state.renew_at.min(state.expires)
        } else {
            state.expires
        };
        tokio::select! {
            _ = keeper.stop.cancelled() => return,
            changed = updates.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= state.expires {
            // With a watchdog, the lease ran out because renewals failed.
            let cause = if keeper.watchdog {
                LostCause::ConnectionLost
            } else {
                LostCause::LeaseExpired
            };
            keeper
                .lost
                .fire_because(cause, format!("lease of {} expired", keeper.name));
            return;
        }
        if !keeper.watchdog || now < state.renew_at {
            continue;
        }
        let sent = Instant::now();
        // A renewal the server never answers (a stopped backend, a partition
        // without resets) must not outlast the lease: at its end the loop
        // reports the hold lost.
        let renewal = renew(
            &keeper.shared,
            &keeper.name,
            keeper.token,
            &keeper.owner,
            state.lease,
        );
        let Ok(renewed) = tokio::time::timeout_at(state.expires, renewal).await else {
            continue;
        };
        match renewed {
            Ok(true) => keeper.state.send_modify(|s| {
                s.expires = trusted_until(sent, s.lease, Duration::ZERO);
                s.renew_at = sent + renewal_interval(s.lease);
            }),
            Ok(false) => {
                keeper.lost.fire_because(
                    LostCause::Gone,
                    format!(
                        "lease of {} is no longer held (expired and taken, or force-released)",
                        keeper.name
                    ),
                );
                return;
            }
            Err(error) => {
                tracing::warn!(%error, name = %keeper.name, "postgres: lease renewal failed, retrying");
                keeper.state.send_modify(|s| {
                    s.renew_at = now
                        + (s.lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                });
            }
        }
    }
}

/// `renew_lease`: true when the lease was still ours and runs `lease` from now.
///
/// Cancel safety: safe; one statement: the renewal happened or it did not.
async fn renew(
    shared: &Shared,
    name: &str,
    token: u64,
    owner: &str,
    lease: Duration,
) -> Result<bool> {
    let rows = shared
        .query(
            &shared.sql.renew_lease,
            &[
                (&name, Type::TEXT),
                (&(token as i64), Type::INT8),
                (&owner, Type::TEXT),
                (&(lease.as_millis() as i64), Type::INT8),
            ],
        )
        .await?;
    Ok(!rows.is_empty())
}

impl LeaseHold {
    /// Sets the lease to `lease` from now.
    ///
    /// Cancel safety: safe; the extension either happened or did not.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        if let Some(reason) = self.lost.reason() {
            return Err(Error::Lost(reason));
        }
        let sent = Instant::now();
        if renew(&self.shared, &self.name, self.token, &self.owner, lease).await? {
            self.state.send_modify(|s| {
                s.lease = lease;
                s.expires = trusted_until(sent, lease, Duration::ZERO);
                s.renew_at = sent + renewal_interval(lease);
            });
            Ok(())
        } else {
            let reason = format!("lease of {} is no longer held", self.name);
            self.lost.fire_because(LostCause::Gone, reason.clone());
            Err(Error::Lost(reason))
        }
    }

    /// Deletes the row if it is still ours.
    ///
    /// Cancel safety: the release runs to completion on its own task.
    pub async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop.cancel();
        let (shared, name, owner, token) = (
            self.shared.clone(),
            self.name.clone(),
            self.owner.clone(),
            self.token,
        );
        let deleted = detached(async move { delete(&shared, &name, token, &owner).await }).await?;
        match (deleted, self.lost.reason()) {
            // The lease ran out by the local (conservative) clock first.
            (Ok(()), Some(reason)) => Err(Error::Lost(reason)),
            (result, _) => result,
        }
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let (shared, name, owner, token) = (
            self.shared.clone(),
            self.name.clone(),
            self.owner.clone(),
            self.token,
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = delete(&shared, &name, token, &owner).await;
            });
        }
    }
}

/// `release_lease`.
///
/// Cancel safety: the delete may or may not have happened; its callers (the
/// release, the hold's drop) run it on a task of its own.
async fn delete(shared: &Shared, name: &str, token: u64, owner: &str) -> Result<()> {
    let outcome: String = one(shared
        .query(
            &shared.sql.release_lease,
            &[
                (&name, Type::TEXT),
                (&(token as i64), Type::INT8),
                (&owner, Type::TEXT),
            ],
        )
        .await?)?
    .get(0);
    match outcome.as_str() {
        "released" => Ok(()),
        "expired" => Err(Error::Lost(format!(
            "lease of {name} expired before release"
        ))),
        _ => Err(Error::Lost(format!(
            "lease of {name} is no longer held (expired and taken, or force-released)"
        ))),
    }
}
