//! Waiting: PostgreSQL's lock queue first, then (rarely) a head waiter's sleep.
//!
//! A waiting acquire takes a connection of its own and blocks in
//! `pg_advisory_lock(key)` (`_shared` for readers), so waiters queue in
//! PostgreSQL's lock manager: granted in arrival order, a new reader queues
//! behind a waiting writer, a release wakes exactly the next waiter. The
//! statement carries a comment, `/*locksmith:wait key=… mode=… owner=…
//! name=…*/`, which is how inspection lists waiters (`pg_stat_activity`), and
//! a `lock_timeout` for `Wait::For`. Every later statement of the wait carries
//! it too (as unnamed statements), so inspection never takes a waiter that
//! holds the key for a holder of the lock. When the timeout and the grant race,
//! PostgreSQL may grant the lock while reporting SQLSTATE 55P03; the wait
//! then looks in `pg_locks` for its own pid holding the key, and takes it.
//!
//! Holding the key, the waiter claims the lock (`acquire_session` or
//! `acquire_lease` on its connection). Usually that grants. When a lease holds
//! the lock, or every semaphore slot is taken, the waiter is the head of the
//! queue: it registers in `waiters` (so releases of the name NOTIFY), listens,
//! and sleeps in a `pg_sleep` statement with the same comment, bounded by the
//! blocking lease's remaining time (at most 5 s, then re-checks anyway); a
//! NOTIFY for the name cancels the sleep. Everyone behind it stays queued in
//! PostgreSQL.
//!
//! Dropping a wait cancels its statement, closes the connection and, before
//! the drop returns, waits for the server to close its end (see
//! [`PgConn::cancel_blocking`]): the backend has left the queue, and any lock
//! it got in the meantime ended with its session.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use tokio_postgres::types::Type;

use super::claim::{conflict, Claim, Target};
use super::config::Pooler;
use super::conn::PgConn;
use super::{one, pg_error, Params, Shared};
use crate::backend::Mode;
use crate::error::{Error, Result};

/// Longest sleep of a head between two checks.
const MAX_SLEEP: Duration = Duration::from_secs(5);
/// Longest pause of a head behind a transaction pooler, which polls.
const POLL: Duration = Duration::from_millis(250);
/// First and longest pause when no lease says how long to wait.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// Closes a waiting connection unless disarmed: see the module docs.
struct WaitGuard(Option<Arc<PgConn>>);

impl WaitGuard {
    fn disarm(&mut self) -> Arc<PgConn> {
        self.0.take().expect("armed")
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            conn.cancel_blocking();
        }
    }
}

/// Waits for `target` on a connection of its own until `claim` (one attempt
/// on that connection, which holds the key) grants; returns the connection,
/// which still holds the key, and the grant.
///
/// Cancel safety: safe, see the module docs. `claim` must itself be cancel
/// safe (it runs the attempt on its own task).
pub(crate) async fn wait<H, F, Fut>(
    shared: &Arc<Shared>,
    target: &Target,
    deadline: Option<(Instant, Duration)>,
    claim: F,
) -> Result<(Arc<PgConn>, H)>
where
    F: Fn(Arc<PgConn>) -> Fut,
    Fut: Future<Output = Result<Claim<H>>>,
{
    let conn = shared.conns.get().await?;
    let mut guard = WaitGuard(Some(conn.clone()));
    let timed_out = || match deadline {
        Some((_, limit)) => Error::Timeout(limit),
        None => Error::backend("postgres", "wait ended without a deadline"),
    };
    let comment = comment(target);
    tracing::debug!(name = %target.name, "postgres: queueing for the lock");
    queue(shared, &conn, target, &comment, deadline.map(|(at, _)| at))
        .await?
        .then_some(())
        .ok_or_else(timed_out)?;

    // Behind a transaction pooler a head polls: LISTEN needs a session.
    let pooled = shared.settings.pooler == Pooler::Transaction;
    let mut subscription = None;
    let mut head = false;
    let mut waiter_row: Option<i64> = None;
    let mut backoff = BACKOFF.0;
    loop {
        if let Some(sub) = &subscription {
            let sub: &super::listen::Subscription = sub;
            sub.head.woken.store(false, Ordering::SeqCst);
        }
        if pooled {
            // A busy attempt may have locked the blocking lease's row (the
            // upsert's ON CONFLICT does): rolling back to here lets it go, so
            // its holder can renew while we wait.
            conn.simple(&format!("{comment} SAVEPOINT locksmith_claim"))
                .await
                .map_err(pg_error)?;
        }
        let retry = match claim(conn.clone()).await {
            Ok(Claim::Granted(hold)) => {
                if let Some(id) = waiter_row {
                    remove_waiter(shared, &conn, target, id).await?;
                }
                guard.disarm();
                return Ok((conn, hold));
            }
            Ok(Claim::Conflict(detail)) => {
                guard.disarm().kill("conflicting acquire");
                return Err(conflict(target, detail));
            }
            Ok(Claim::Busy(retry)) => {
                if pooled {
                    conn.simple(&format!("{comment} ROLLBACK TO SAVEPOINT locksmith_claim"))
                        .await
                        .map_err(pg_error)?;
                }
                retry
            }
            Err(error) if is_cancel(&error) => {
                // A wake-up meant for our sleep hit the attempt instead.
                if matches!(target.mode, Mode::Semaphore { .. }) && target.lease.is_none() {
                    release_slots(&conn, target).await?;
                }
                continue;
            }
            Err(error) => return Err(error),
        };
        if !head {
            // Head of the queue: from now on releases of the name wake us.
            // Behind a pooler nothing wakes a head (it polls), and it is not
            // registered either: a row written in the wait's transaction
            // would only show once the wait is over. Inspection and
            // force_release know it by its statements' comment.
            head = true;
            if !pooled {
                let cancel = conn.cancel_handle();
                subscription = Some(shared.listener.subscribe(&target.name, cancel).await?);
                waiter_row = Some(add_waiter(shared, &conn, target).await?);
            }
            tracing::debug!(name = %target.name, "postgres: head waiter, sleeping until woken");
            continue;
        }
        let mut pause = match retry {
            Some(lease_left) => lease_left + Duration::from_millis(5),
            None => {
                let pause = backoff;
                backoff = (backoff * 2).min(BACKOFF.1);
                pause
            }
        }
        .min(if pooled { POLL } else { MAX_SLEEP });
        if let Some((at, _)) = deadline {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            pause = pause.min(left);
        }
        let sleep = format!("{comment} SELECT pg_sleep({:.3})", pause.as_secs_f64());
        let Some(sub) = &subscription else {
            conn.simple(&sleep).await.map_err(pg_error)?;
            continue;
        };
        // A LISTEN connection that died is back before the head sleeps on it
        // (the sleep is bounded either way).
        if let Err(error) = shared.listener.ensure().await {
            tracing::debug!(%error, "postgres: LISTEN connection unavailable, polling");
        }
        let head = &sub.head;
        head.in_sleep.store(true, Ordering::SeqCst);
        if head.woken.load(Ordering::SeqCst) {
            head.in_sleep.store(false, Ordering::SeqCst);
            continue;
        }
        let slept = conn.simple(&sleep).await;
        head.in_sleep.store(false, Ordering::SeqCst);
        match slept {
            Ok(_) => {}
            Err(error) if error.code() == Some(&SqlState::QUERY_CANCELED) => {}
            Err(error) => return Err(pg_error(error)),
        }
    }
}

/// Blocks in PostgreSQL's queue for the key; false when the deadline passed
/// first. Handles the grant that races `lock_timeout`.
///
/// Cancel safety: only under the guard of [`wait`]: dropped midway, the
/// connection may still be queued for the key or hold it (behind a pooler,
/// in an open transaction); the guard closes the connection, which ends both.
async fn queue(
    shared: &Shared,
    conn: &PgConn,
    target: &Target,
    comment: &str,
    deadline: Option<Instant>,
) -> Result<bool> {
    let timeout_ms = match deadline {
        None => 0,
        Some(at) => {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            left.as_millis().max(1)
        }
    };
    if shared.settings.pooler == Pooler::Transaction {
        // The wait, and the claim after it, run in one transaction, which the
        // pooler keeps on one server session; the lock is the transaction's.
        let function = if target.shared_key() {
            "pg_advisory_xact_lock_shared"
        } else {
            "pg_advisory_xact_lock"
        };
        let sql = format!(
            "{comment} BEGIN; \
             WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', '{timeout_ms}', true)) \
             SELECT {function}({key}) FROM t",
            key = target.key
        );
        return match conn.simple(&sql).await {
            Ok(_) => Ok(true),
            Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                // A grant that raced the timeout goes with the transaction
                // (the comment: the key is held until the rollback ends).
                conn.simple(&format!("{comment} ROLLBACK"))
                    .await
                    .map_err(pg_error)?;
                Ok(false)
            }
            Err(error) => Err(pg_error(error)),
        };
    }
    let function = if target.shared_key() {
        "pg_advisory_lock_shared"
    } else {
        "pg_advisory_lock"
    };
    let sql = format!(
        "{comment} WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', '{timeout_ms}', true)) \
         SELECT {function}({key}) FROM t",
        key = target.key
    );
    match conn.simple(&sql).await {
        Ok(_) => Ok(true),
        Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            // lock_timeout fired; PostgreSQL may have granted the lock in the
            // same instant (it then keeps the grant and still reports 55P03).
            let held: bool = one(query(
                conn,
                target,
                &shared.sql.holds_key,
                &[(&target.key, Type::INT8)],
            )
            .await?)?
            .get(0);
            if held {
                tracing::debug!(name = %target.name, "postgres: granted as lock_timeout fired");
            }
            Ok(held)
        }
        Err(error) => Err(pg_error(error)),
    }
}

/// Runs `sql` on the waiting connection `conn` as an unnamed statement that
/// carries the wait's comment, so that inspection, which sees the connection
/// hold the key, knows it for a waiter and not a holder.
///
/// Cancel safety: as the statement's.
pub(crate) async fn query(
    conn: &PgConn,
    target: &Target,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    conn.query_unnamed(&format!("{} {sql}", comment(target)), params)
        .await
}

/// Like [`query`], for the head's statements besides its claims: they run
/// again when a cancel request meant for the head's sleep arrives late and
/// hits them (each is a transaction of its own, which the cancel rolls back,
/// or idempotent).
///
/// Cancel safety: as the statement's.
async fn query_again_if_cancelled(
    conn: &PgConn,
    target: &Target,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    let mut cancelled = 0;
    loop {
        match query(conn, target, sql, params).await {
            Err(error) if is_cancel(&error) && cancelled < 3 => cancelled += 1,
            other => return other,
        }
    }
}

/// The comment of the statements that end a granted wait (dropping the key a
/// waiter took for a lease or a semaphore turnstile): inspection shows them as
/// neither holder nor waiter.
pub(crate) const GRANTED: &str = "/*locksmith:granted*/";

/// Runs `sql` (simple protocol, behind [`GRANTED`]) on the connection of a
/// granted wait. A cancel request meant for the head's sleep may still arrive
/// and hit it; it runs again then (the statements are idempotent: unlocking a
/// key no longer held only returns false).
///
/// Cancel safety: as the statement's.
pub(crate) async fn after_grant(conn: &PgConn, sql: &str) -> Result<()> {
    let sql = format!("{GRANTED} {sql}");
    let mut cancelled = 0;
    loop {
        match conn.simple(&sql).await.map(drop) {
            Err(error) if error.code() == Some(&SqlState::QUERY_CANCELED) && cancelled < 3 => {
                cancelled += 1;
            }
            other => return other.map_err(pg_error),
        }
    }
}

/// The comment that marks a waiting statement (see the module docs).
pub(crate) fn comment(target: &Target) -> String {
    let mode = match target.mode {
        Mode::Semaphore { permits } => format!("semaphore:{permits}"),
        mode => super::claim::mode_name(mode).to_owned(),
    };
    format!(
        "/*locksmith:wait key={} mode={mode} owner={} name={}*/",
        target.key,
        encode(&target.owner),
        encode(&target.name)
    )
}

/// Percent-encoding that never leaves `/` (so never `*/` or `/*`) in a comment.
fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A waiting statement's comment, parsed: (key, mode, owner, name).
pub(crate) fn parse_comment(query: &str) -> Option<(i64, Mode, String, String)> {
    let body = query.strip_prefix("/*locksmith:wait ")?;
    let body = &body[..body.find("*/")?];
    let mut key = None;
    let mut mode = None;
    let mut owner = String::new();
    let mut name = String::new();
    for field in body.split(' ') {
        let (k, v) = field.split_once('=')?;
        let decoded = || {
            url::form_urlencoded::parse(format!("x={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        match k {
            "key" => key = v.parse().ok(),
            "mode" => {
                mode = Some(match v.split_once(':') {
                    Some((_, permits)) => Mode::Semaphore {
                        permits: permits.parse().ok()?,
                    },
                    None => super::claim::parse_mode(v, None),
                })
            }
            "owner" => owner = decoded(),
            "name" => name = decoded(),
            _ => {}
        }
    }
    Some((key?, mode?, owner, name))
}

fn is_cancel(error: &Error) -> bool {
    match error {
        Error::Backend { source, .. } => source
            .downcast_ref::<super::PgError>()
            .is_some_and(|e| e.0.code() == Some(&SqlState::QUERY_CANCELED)),
        _ => false,
    }
}

/// Registers a head in `waiters`. Behind a transaction pooler the row goes in
/// through the pool (a row written in the wait's transaction would show only
/// once the wait is over), naming the wait's backend.
///
/// Cancel safety: only under the guard of [`wait`]: a dropped call may still
/// add the row, and the guard closes the connection. A row of an ended
/// connection is ignored by inspection and deleted by `cleanup()`; until
/// then, releases of the name send a NOTIFY nobody needs.
async fn add_waiter(shared: &Shared, conn: &PgConn, target: &Target) -> Result<i64> {
    let params: Params = &[
        (&target.name, Type::TEXT),
        (&target.owner, Type::TEXT),
        (&target.mode_name, Type::TEXT),
        (&target.permits, Type::INT4),
    ];
    let rows = query_again_if_cancelled(conn, target, &shared.sql.add_waiter, params).await?;
    Ok(one(rows)?.get(0))
}

/// Removes a head's row from `waiters`.
///
/// Cancel safety: only under the guard of [`wait`]: a dropped call may leave
/// the row, as for [`add_waiter`].
async fn remove_waiter(shared: &Shared, conn: &PgConn, target: &Target, id: i64) -> Result<()> {
    let params: Params = &[(&id, Type::INT8)];
    query_again_if_cancelled(conn, target, &shared.sql.remove_waiter, params).await?;
    Ok(())
}

/// Drops any semaphore slot lock an interrupted attempt left on `conn`.
///
/// Cancel safety: only under the guard of [`wait`]: dropped midway, slot
/// locks may stay on the connection, which the guard closes.
async fn release_slots(conn: &PgConn, target: &Target) -> Result<()> {
    query_again_if_cancelled(
        conn,
        target,
        "SELECT pg_advisory_unlock(k) FROM unnest($1::bigint[]) AS k \
          WHERE EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
            AND pid = pg_backend_pid() AND granted \
            AND classid = ((k >> 32) & 4294967295)::oid \
            AND objid = (k & 4294967295)::oid AND objsubid = 1)",
        &[(&target.slot_keys, Type::INT8_ARRAY)],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_round_trip_and_stay_closed() {
        let target = Target {
            name: "a/*b*/c d".into(),
            key: -42,
            slot_keys: vec![],
            mode: Mode::Semaphore { permits: 3 },
            owner: "o*/wn er+%".into(),
            lease: None,
            mode_name: "semaphore",
            permits: Some(3),
            lease_ms: 0,
        };
        let comment = comment(&target);
        assert_eq!(comment.matches("*/").count(), 1, "{comment}");
        assert!(!comment[2..].contains("/*"), "{comment}");
        let (key, mode, owner, name) = parse_comment(&format!("{comment} SELECT 1")).unwrap();
        assert_eq!(key, -42);
        assert_eq!(mode, Mode::Semaphore { permits: 3 });
        assert_eq!(owner, "o*/wn er+%");
        assert_eq!(name, "a/*b*/c d");
    }
}
