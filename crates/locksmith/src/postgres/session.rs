//! Session holds: a session-level advisory lock held by a connection.
//!
//! An acquire first tries on the client's shared holder connection (one
//! `acquire_session` call, which never waits); many holds share that
//! connection. When the lock is busy and the request may wait, the wait goes
//! to a connection of its own, queued in PostgreSQL's lock manager (see
//! `wait.rs`), and the hold keeps that connection until it is released, then
//! returns it for the next wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::claim::{conflict, Claim, Granted, Target};
use super::conn::{hold_id, PgConn};
use tokio_postgres::types::Type;

use super::{detached, one, pg_error, wait, Params, Shared};
use crate::backend::{LostSignal, Mode, Wait};
use crate::error::{Error, Loss, Result};

/// A live session hold.
pub(crate) struct SessionHold {
    shared: Arc<Shared>,
    conn: Arc<PgConn>,
    /// The connection was the hold's own (it goes back to the idle pool).
    dedicated: bool,
    name: String,
    /// The advisory key held: the lock's, or a semaphore slot's.
    key: i64,
    shared_mode: bool,
    /// The key is a semaphore slot's.
    slot: bool,
    id: u64,
    pub token: u64,
    pub lost: LostSignal,
    released: AtomicBool,
}

/// Acquires a session hold of `target`: a try on the shared holder
/// connection, then (unless `wait` is [`Wait::No`]) a wait on a connection of
/// its own.
///
/// Cancel safety: safe. The try runs on its own task and a grant nobody
/// receives releases itself; a dropped wait cancels its statement and closes
/// its connection, which leaves PostgreSQL's queue and drops any lock.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    target: &Target,
    wait: Wait,
    deadline: Option<(tokio::time::Instant, std::time::Duration)>,
) -> Result<Option<SessionHold>> {
    let holder = shared.holder().await?;
    let attempt = if holder.claim_name(&target.name) {
        detached({
            let (shared, target, holder) = (shared.clone(), target.clone(), holder.clone());
            async move { try_on(&shared, &holder, &target, false).await }
        })
        .await??
    } else {
        // The holder connection already holds this name for another owner of
        // this client, and PostgreSQL would grant its session the key again:
        // try on a connection of its own.
        let conn = shared.conns.get().await?;
        conn.claim_name(&target.name);
        detached({
            let (shared, target) = (shared.clone(), target.clone());
            async move {
                let attempt = try_on(&shared, &conn, &target, true).await;
                if !matches!(attempt, Ok(Claim::Granted(_))) {
                    shared.conns.put(conn);
                }
                attempt
            }
        })
        .await??
    };
    match attempt {
        Claim::Granted(hold) => return Ok(Some(hold)),
        Claim::Conflict(detail) => return Err(conflict(target, detail)),
        Claim::Busy(_) => {}
    }
    if wait == Wait::No {
        return Ok(None);
    }
    // A dropped wait closes its connection, which ends whatever the attempt
    // in flight got: the attempt needs no task of its own.
    let (conn, granted) = wait::wait(shared, target, deadline, |conn| async move {
        call(shared, &conn, target, Key::Waited).await
    })
    .await?;
    if matches!(target.mode, Mode::Semaphore { .. }) {
        // The wait queued on the semaphore's turnstile, which it drops only
        // now that the grant is committed (see acquire_session).
        let unlock = format!("SELECT pg_advisory_unlock({})", target.key);
        if let Err(error) = wait::after_grant(&conn, &unlock).await {
            // The grant's slot lock goes with the connection.
            conn.kill(&format!("dropping the turnstile failed: {error}"));
            return Err(error);
        }
    }
    let hold = SessionHold::new(shared, conn, true, target, granted.held_key, granted.token);
    if !hold.conn.pin(hold.id, &hold.lost) {
        let loss = Loss::of(&hold.lost).unwrap_or_else(|| Loss::new(""));
        return Err(Error::Lost(loss));
    }
    Ok(Some(hold))
}

/// One attempt on `conn`, which has `name` claimed; gives the claim back
/// unless granted.
///
/// Cancel safety: not cancel safe: dropped midway, `conn` may hold the key,
/// and keeps the name claimed, with no hold to release them. It runs only
/// inside `detached`, which never drops it.
async fn try_on(
    shared: &Arc<Shared>,
    conn: &Arc<PgConn>,
    target: &Target,
    dedicated: bool,
) -> Result<Claim<SessionHold>> {
    let result = attempt(shared, conn, target).await;
    match result {
        Ok(Claim::Granted(granted)) => {
            let hold = SessionHold::new(
                shared,
                conn.clone(),
                dedicated,
                target,
                granted.held_key,
                granted.token,
            );
            if !conn.pin(hold.id, &hold.lost) {
                // The connection died under the grant: nothing is held.
                hold.released.store(true, Ordering::Release);
                conn.release_name(&target.name);
                return Ok(Claim::Busy(None));
            }
            Ok(Claim::Granted(hold))
        }
        Ok(Claim::Busy(retry)) => {
            conn.release_name(&target.name);
            Ok(Claim::Busy(retry))
        }
        Ok(Claim::Conflict(detail)) => {
            conn.release_name(&target.name);
            Ok(Claim::Conflict(detail))
        }
        Err(error) => {
            // The call may have taken the advisory lock before it failed; a
            // connection that might hold a lock nobody tracks must not live on.
            conn.kill(&format!("acquire failed: {error}"));
            Err(error)
        }
    }
}

/// A non-waiting attempt on `conn`. An exclusive lock first tries the quick
/// statement (the try-lock and the takeover of its `quick` row); when that
/// gets the key but may not take a row, `acquire_session` decides, and the key
/// goes again unless it grants. Other modes go to `acquire_session` at once.
///
/// Cancel safety: not cancel safe: dropped midway, `conn` may hold the key
/// with no hold to release it. Only `try_on` runs it, inside `detached`.
async fn attempt(shared: &Shared, conn: &PgConn, target: &Target) -> Result<Claim> {
    if target.mode != Mode::Exclusive {
        return call(shared, conn, target, Key::Try).await;
    }
    let row = one(conn
        .query(
            &shared.sql.acquire_quick,
            &[
                (&target.name, Type::TEXT),
                (&target.key, Type::INT8),
                (&target.owner, Type::TEXT),
                (&shared.settings.lock_by, Type::TEXT),
            ],
        )
        .await?)?;
    let got: bool = row.try_get(0).map_err(pg_error)?;
    if !got {
        return Ok(Claim::Busy(None));
    }
    if let Some(token) = row.try_get::<_, Option<i64>>(1).map_err(pg_error)? {
        return Ok(Claim::Granted(Granted {
            token: token as u64,
            held_key: target.key,
        }));
    }
    let claim = call(shared, conn, target, Key::Taken).await?;
    if !matches!(claim, Claim::Granted(_)) {
        conn.query(&shared.sql.unlock, &[(&target.key, Type::INT8)])
            .await?;
    }
    Ok(claim)
}

/// Who holds the key when `acquire_session` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    /// Nobody yet: the call tries to take it.
    Try,
    /// This connection, since the quick statement.
    Taken,
    /// This connection, a wait's, since its queue statement.
    Waited,
}

/// Runs `acquire_session` on `conn` (on a wait's connection, with the wait's
/// comment).
///
/// Cancel safety: the call may or may not have run; if it granted, `conn`
/// holds the key (or a slot) with no hold to release it. Callers run it
/// inside `detached`, or on a wait's connection, which a dropped wait closes.
async fn call(shared: &Shared, conn: &PgConn, target: &Target, key: Key) -> Result<Claim<Granted>> {
    let held = key != Key::Try;
    let params: Params = &[
        (&target.name, Type::TEXT),
        (&target.key, Type::INT8),
        (&target.slot_keys, Type::INT8_ARRAY),
        (&target.owner, Type::TEXT),
        (&shared.settings.lock_by, Type::TEXT),
        (&target.mode_name, Type::TEXT),
        (&target.permits, Type::INT4),
        (&held, Type::BOOL),
    ];
    let rows = if key == Key::Waited {
        wait::query(conn, target, &shared.sql.acquire_session, params).await?
    } else {
        conn.query(&shared.sql.acquire_session, params).await?
    };
    Claim::from_row(&one(rows)?, target, false)
}

impl SessionHold {
    fn new(
        shared: &Arc<Shared>,
        conn: Arc<PgConn>,
        dedicated: bool,
        target: &Target,
        key: i64,
        token: u64,
    ) -> SessionHold {
        SessionHold {
            shared: shared.clone(),
            conn,
            dedicated,
            name: target.name.clone(),
            key,
            shared_mode: target.shared_key(),
            slot: key != target.key,
            id: hold_id(),
            token,
            lost: LostSignal::new(),
            released: AtomicBool::new(false),
        }
    }

    /// Drops the advisory lock. Fails with [`Error::Lost`] when the connection
    /// (and with it the lock) is gone.
    ///
    /// Cancel safety: the release runs to completion on its own task.
    pub async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let job = self.unlock_job();
        detached(job.run()).await?
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let job = self.unlock_job();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = job.run().await;
                });
            }
            // Nothing can run: closing the connection ends the lock.
            Err(_) => job.conn.kill("hold dropped outside a runtime"),
        }
    }
}

/// What releasing a session hold needs, owned, to run on a task of its own.
struct UnlockJob {
    shared: Arc<Shared>,
    conn: Arc<PgConn>,
    name: String,
    key: i64,
    shared_mode: bool,
    slot: bool,
    id: u64,
    dedicated: bool,
}

impl SessionHold {
    fn unlock_job(&self) -> UnlockJob {
        UnlockJob {
            shared: self.shared.clone(),
            conn: self.conn.clone(),
            name: self.name.clone(),
            key: self.key,
            shared_mode: self.shared_mode,
            slot: self.slot,
            id: self.id,
            dedicated: self.dedicated,
        }
    }
}

impl UnlockJob {
    /// Drops the advisory lock on the hold's connection, then the bookkeeping.
    ///
    /// Cancel safety: runs on a task of its own (the release, the hold's
    /// drop), which nothing drops. Dropped midway, the unlock may or may not
    /// have happened, and the connection keeps the name claimed.
    async fn run(self) -> Result<()> {
        let UnlockJob {
            shared,
            conn,
            name,
            key,
            shared_mode,
            slot,
            id,
            dedicated,
        } = self;
        let name = name.as_str();
        conn.unpin(id);
        if let Some(reason) = conn.broken() {
            return Err(Error::Lost(reason.into()));
        }
        let result = async {
            // A lock's release never has a head waiter to wake: a head holds the
            // key itself (see wait.rs), so the next holder is PostgreSQL's next
            // waiter. Only semaphore slots, whose waiters sleep, go through
            // release_session for its NOTIFY.
            let row = if slot {
                let statement = conn.prepare(&shared.sql.release_session).await?;
                conn.client()
                    .query_one(&statement, &[&name, &key, &shared_mode])
                    .await
            } else {
                let sql = if shared_mode {
                    &shared.sql.unlock_shared
                } else {
                    &shared.sql.unlock
                };
                let statement = conn.prepare(sql).await?;
                conn.client().query_one(&statement, &[&key]).await
            }
            .map_err(pg_error)?;
            Ok::<bool, Error>(row.get(0))
        }
        .await;
        match result {
            Ok(true) => {
                conn.release_name(name);
                if dedicated {
                    shared.conns.put(conn);
                }
                Ok(())
            }
            Ok(false) => {
                conn.release_name(name);
                Err(Error::Lost(
                    format!("{name}: the connection no longer held its advisory lock").into(),
                ))
            }
            Err(error) => {
                // Whether the unlock happened is unknown: end the session so it
                // certainly did.
                conn.kill(&format!("release failed: {error}"));
                match conn.broken() {
                    Some(reason) if !matches!(error, Error::Backend { .. }) => {
                        Err(Error::Lost(reason.into()))
                    }
                    _ => Err(error),
                }
            }
        }
    }
}
