//! Lease (TTL) holds: a row in `lease_holds`, no connection held.
//!
//! Acquired by `acquire_lease` (a transaction-level try-lock on the key, then
//! the insert-or-take-expired upsert), kept by the keeper (module `keeper`)
//! on a task per hold: with the watchdog (a hold without its own lease: the
//! session TTL, in TTL mode) it renews through `renew_lease`; without it, it
//! only watches the expiry. Expiry is judged by the database's clock; the
//! keeper's deadline is counted from the send, so never later. `lost()`
//! fires when the keeper ends the hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tokio_postgres::types::{ToSql, Type};

use super::claim::{conflict, Claim, Target};
use super::config::Pooler;
use super::{detached, one, pg_error, wait, Shared};
use crate::backend::{LostSignal, Wait};
use crate::error::{Error, Loss, Result};
use crate::keeper::{self, Kept, Renew, Renewed, Term};
use crate::lost::LostCause;

/// A live lease hold.
pub(crate) struct LeaseHold {
    shared: Arc<Shared>,
    name: String,
    owner: String,
    pub token: u64,
    pub lost: LostSignal,
    /// The keeper's term of the hold, shared with its task.
    term: watch::Sender<Term>,
    stop: CancellationToken,
    released: AtomicBool,
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
    let what = format!("lease of {}", target.name);
    let term = watch::Sender::new(if watchdog {
        Term::renewed(what, Kept::Hold, sent, lease)
    } else {
        Term::fixed(what, Kept::Hold, sent, lease)
    });
    let hold = Arc::new(LeaseHold {
        shared: shared.clone(),
        name: target.name.clone(),
        owner: target.owner.clone(),
        token: granted.token,
        lost: LostSignal::new(),
        term,
        stop: CancellationToken::new(),
        released: AtomicBool::new(false),
    });
    let renewal = Renewal {
        shared: shared.clone(),
        name: hold.name.clone(),
        owner: hold.owner.clone(),
        token: hold.token,
    };
    let (term, lost, stop) = (hold.term.clone(), hold.lost.clone(), hold.stop.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            loss = keeper::keep(term, renewal) => lost.fire_because(loss.cause, loss.reason),
        }
    });
    Claim::Granted(hold)
}

/// What the keeper renews a hold through.
struct Renewal {
    shared: Arc<Shared>,
    name: String,
    owner: String,
    token: u64,
}

#[async_trait]
impl Renew for Renewal {
    /// Cancel safety: safe; one statement: the renewal happened or it did not.
    async fn renew(&mut self, lease: Duration) -> std::result::Result<Renewed, String> {
        match renew(&self.shared, &self.name, self.token, &self.owner, lease).await {
            Ok(true) => Ok(Renewed::For(lease)),
            Ok(false) => Ok(Renewed::Gone),
            Err(error) => {
                tracing::warn!(%error, name = %self.name, "postgres: lease renewal failed, retrying");
                Err(error.to_string())
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
        if let Some(loss) = Loss::of(&self.lost) {
            return Err(Error::Lost(loss));
        }
        let sent = Instant::now();
        if renew(&self.shared, &self.name, self.token, &self.owner, lease).await? {
            self.term.send_modify(|term| term.extended(sent, lease));
            Ok(())
        } else {
            let loss = self.term.borrow().gone(Instant::now());
            self.lost.fire_because(loss.cause, loss.reason.clone());
            Err(Error::Lost(
                Loss::of(&self.lost).unwrap_or_else(|| Loss::because(loss.cause, loss.reason)),
            ))
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
        match (deleted, Loss::of(&self.lost)) {
            // The lease ran out by the local (conservative) clock first.
            (Ok(()), Some(loss)) => Err(Error::Lost(loss)),
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
        "expired" => Err(Error::Lost(Loss::because(
            LostCause::LeaseExpired,
            format!("lease of {name} expired before release"),
        ))),
        _ => Err(Error::Lost(Loss::because(
            LostCause::Gone,
            format!("lease of {name} is no longer held (expired and taken, or force-released)"),
        ))),
    }
}
