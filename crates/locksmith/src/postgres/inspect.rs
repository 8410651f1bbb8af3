//! Inspection and the administrator's force release.
//!
//! Holders: live rows of `session_holds` (their connection holds the key, per
//! `pg_locks`) and unexpired rows of `lease_holds`, plus connections that hold
//! the lock's key without being a locksmith hold (a plain
//! `pg_advisory_lock(key)` caller), shown with owner `pid:<pid>`. Every
//! statement locksmith runs on a connection that may hold a key carries a
//! `/*locksmith:…*/` comment, so a connection whose statement (running, or
//! its last) has one is never such a holder, nor is one that took up new
//! work while the inspection read `pg_locks`. Waiters:
//! connections whose statement carries a `/*locksmith:wait …*/` comment for
//! the key (in PostgreSQL's queue, a head's sleep, a waiter's claim; running,
//! or the last one of a connection that got no grant from it and whose
//! transaction did not fail, as a cancelled wait's does), and registered heads
//! in a statement, ordered by when they started waiting.

use std::collections::{BTreeSet, HashSet};
use std::time::SystemTime;

use super::claim::parse_mode;
use super::key::advisory_key;
use super::wait::parse_comment;
use tokio_postgres::types::{ToSql, Type};

use super::Shared;
use crate::backend::{Holder, LockInfo, Mode, Waiter};
use crate::error::Result;

/// `pg_locks` rows of advisory key `$1` in this database.
const KEY_LOCKS: &str = "l.locktype = 'advisory' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND l.classid = (($1::bigint >> 32) & 4294967295)::oid \
     AND l.objid = ($1::bigint & 4294967295)::oid AND l.objsubid = 1";

/// SQL: backend `a` (a row of `pg_stat_activity`) waits for the lock. Its
/// statement carries the wait comment for the key (`pattern`, an SQL
/// expression for `LIKE`) and runs, or was the last one of a connection that
/// got no grant from it (`name`: an SQL expression for the lock's name) and
/// whose transaction did not fail, as a cancelled wait's does.
fn waits(schema: &str, pattern: &str, name: &str) -> String {
    format!(
        "(a.query LIKE {pattern} AND a.state IN ('active', 'idle', 'idle in transaction') \
          AND (a.state = 'active' OR NOT EXISTS ( \
               SELECT 1 FROM {schema}.session_holds s \
                WHERE s.pid = a.pid AND s.name = {name} AND s.lock_time >= a.query_start)))"
    )
}

/// Holders and waiters of `name`.
///
/// Cancel safety: safe, read-only.
pub(crate) async fn describe(shared: &Shared, name: &str) -> Result<Option<LockInfo>> {
    let key = advisory_key(name);
    let schema = shared.settings.schema_ident();
    let client = shared.client().await?;
    let sessions = format!(
        "SELECT owner, lock_by, mode, permits, token, hold_count, lock_time \
           FROM {schema}.session_holds s \
          WHERE s.name = $1 AND {schema}.session_live(s.pid, s.key, s.server_start) \
          ORDER BY token"
    );
    let leases = format!(
        "SELECT owner, lock_by, mode, permits, token, hold_count, lock_time, lease_expires \
           FROM {schema}.lease_holds WHERE name = $1 AND lease_expires > clock_timestamp() \
          ORDER BY token"
    );
    // `pg_locks` and `pg_stat_activity` are two reads at two moments, in this
    // order (the lateral subquery runs per lock row, and OFFSET 0 keeps the
    // planner from turning it into a join it could read first). A backend's
    // activity tells what it held its locks for only if it has not moved on
    // since the locks were read: behind a transaction pooler, a server
    // connection that held the key in a waiter's transaction serves anyone's
    // statement a moment later. A backend whose transaction (or idle spell)
    // began after this statement did is left out: it is no holder as of this
    // statement. (Other roles' backends show no times; they are judged by
    // their hidden query, as before.) A backend gone by then held nothing.
    let others = format!(
        "SELECT l.pid, l.mode, a.application_name, host(a.client_addr), a.backend_start \
           FROM pg_locks l \
           CROSS JOIN LATERAL ( \
                SELECT a.query, a.application_name, a.client_addr, a.backend_start, \
                       a.xact_start, a.state_change \
                  FROM pg_stat_activity a WHERE a.pid = l.pid OFFSET 0) a \
          WHERE {KEY_LOCKS} AND l.granted AND l.pid <> pg_backend_pid() \
            AND NOT EXISTS (SELECT 1 FROM {schema}.session_holds s \
                             WHERE s.name = $2 AND s.key = $1 AND s.pid = l.pid \
                               AND s.server_start = pg_postmaster_start_time()) \
            AND NOT EXISTS (SELECT 1 FROM {schema}.waiters w WHERE w.name = $2 AND w.pid = l.pid) \
            AND coalesce(a.query, '') NOT LIKE '/*locksmith:%' \
            AND (coalesce(a.xact_start, a.state_change) >= statement_timestamp()) IS NOT TRUE"
    );
    let waiting = format!(
        "SELECT a.pid, a.query, a.query_start, coalesce(l.granted, false) \
           FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND {KEY_LOCKS} \
          WHERE {waits} \
          ORDER BY 4 DESC, 3",
        waits = waits(&schema, "$2", "$3")
    );
    let heads = format!(
        "SELECT w.pid, w.owner, w.mode, w.permits, w.since FROM {schema}.waiters w \
           JOIN pg_stat_activity a ON a.pid = w.pid AND a.state = 'active' \
                                  AND a.backend_start <= w.since \
          WHERE w.name = $1 ORDER BY w.id"
    );
    let pattern = format!("/*locksmith:wait key={key} %");
    let by_name = [(&name as &(dyn ToSql + Sync), Type::TEXT)];
    let by_key_name = [
        (&key as &(dyn ToSql + Sync), Type::INT8),
        (&name, Type::TEXT),
    ];
    let by_key_pattern_name = [
        (&key as &(dyn ToSql + Sync), Type::INT8),
        (&pattern, Type::TEXT),
        (&name, Type::TEXT),
    ];
    let (sessions, leases, others, waiting, heads) = futures::try_join!(
        shared.query_on(&client, &sessions, &by_name),
        shared.query_on(&client, &leases, &by_name),
        shared.query_on(&client, &others, &by_key_name),
        shared.query_on(&client, &waiting, &by_key_pattern_name),
        shared.query_on(&client, &heads, &by_name),
    )?;

    let mut holders = Vec::new();
    for row in sessions.iter().chain(&leases) {
        let token: i64 = row.get("token");
        let mode = parse_mode(row.get("mode"), row.get("permits"));
        let lease_expires: Option<SystemTime> = if row.columns().len() > 7 {
            row.get("lease_expires")
        } else {
            None
        };
        holders.push(Holder {
            owner: row.get("owner"),
            lock_by: Some(row.get("lock_by")),
            lock_time: Some(row.get("lock_time")),
            fencing_token: Some(token as u64),
            lease_expires,
            mode,
            hold_count: row.get::<_, i32>("hold_count").max(1) as u32,
        });
    }
    holders.sort_by_key(|h| h.fencing_token);
    for row in &others {
        let pid: i32 = row.get(0);
        let lock_mode: String = row.get(1);
        let app: Option<String> = row.get(2);
        let addr: Option<String> = row.get(3);
        holders.push(Holder {
            owner: format!("pid:{pid}"),
            lock_by: Some(format!(
                "{}@{}",
                app.unwrap_or_default(),
                addr.unwrap_or_else(|| "local".into())
            )),
            lock_time: None,
            fencing_token: None,
            lease_expires: None,
            mode: if lock_mode == "ShareLock" {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            hold_count: 1,
        });
    }

    let mut waiters = Vec::new();
    let mut seen = HashSet::new();
    for row in &heads {
        let pid: i32 = row.get(0);
        if seen.insert(pid) {
            waiters.push(Waiter {
                owner: row.get(1),
                mode: parse_mode(row.get(2), row.get(3)),
                since: Some(row.get(4)),
            });
        }
    }
    for row in &waiting {
        let pid: i32 = row.get(0);
        let query: String = row.get(1);
        let Some((_, mode, owner, _)) = parse_comment(&query) else {
            continue;
        };
        if seen.insert(pid) {
            waiters.push(Waiter {
                owner,
                mode,
                since: row.get(2),
            });
        }
    }
    if holders.is_empty() && waiters.is_empty() {
        return Ok(None);
    }
    Ok(Some(LockInfo {
        name: name.to_owned(),
        holders,
        waiters,
    }))
}

/// Every lock under `prefix` with a holder or a waiter, sorted by name.
///
/// Cancel safety: safe, read-only.
pub(crate) async fn list(shared: &Shared, prefix: &str) -> Result<Vec<LockInfo>> {
    let schema = shared.settings.schema_ident();
    let names_sql = format!(
        "SELECT s.name FROM {schema}.session_holds s \
          WHERE starts_with(s.name, $1) AND {schema}.session_live(s.pid, s.key, s.server_start) \
         UNION SELECT name FROM {schema}.lease_holds \
          WHERE starts_with(name, $1) AND lease_expires > clock_timestamp() \
         UNION SELECT w.name FROM {schema}.waiters w JOIN pg_stat_activity a ON a.pid = w.pid \
          WHERE starts_with(w.name, $1)"
    );
    let waiting_sql = "SELECT query FROM pg_stat_activity \
                        WHERE state = 'active' AND query LIKE '/*locksmith:wait %'";
    let client = shared.client().await?;
    let by_prefix = [(&prefix as &(dyn ToSql + Sync), Type::TEXT)];
    let (rows, waiting) = futures::try_join!(
        shared.query_on(&client, &names_sql, &by_prefix),
        shared.query_on(&client, waiting_sql, &[]),
    )?;
    drop(client);
    let mut names: BTreeSet<String> = rows.iter().map(|row| row.get(0)).collect();
    for row in &waiting {
        if let Some((key, _, _, name)) = parse_comment(row.get(0)) {
            // The name may be cut short by track_activity_query_size; the key
            // tells whether it was.
            if name.starts_with(prefix) && advisory_key(&name) == key {
                names.insert(name);
            }
        }
    }
    let mut infos = Vec::new();
    for name in names {
        if let Some(info) = describe(shared, &name).await? {
            infos.push(info);
        }
    }
    Ok(infos)
}

/// How long [`force_release`] waits for the connections it terminated to let
/// go of their locks.
const TERMINATION_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends every hold of `name`: deletes its lease rows and terminates the
/// connections that hold its key (or its semaphore slots) in session mode,
/// which ends every other hold of those connections too. Returns once those
/// connections' locks are gone (or after [`TERMINATION_WAIT`]).
///
/// Cancel safety: the release may or may not have happened.
pub(crate) async fn force_release(shared: &Shared, name: &str) -> Result<()> {
    let key = advisory_key(name);
    let schema = shared.settings.schema_ident();
    let client = shared.client().await?;
    let deleted = shared
        .query_on(
            &client,
            &format!("DELETE FROM {schema}.lease_holds WHERE name = $1 RETURNING 1"),
            &[(&name, Type::TEXT)],
        )
        .await?
        .len();
    let holders = format!(
        "SELECT p.pid, pg_terminate_backend(p.pid) FROM ( \
            SELECT l.pid FROM pg_locks l WHERE {KEY_LOCKS} AND l.granted \
               AND NOT EXISTS (SELECT 1 FROM {schema}.waiters w WHERE w.name = $2 AND w.pid = l.pid) \
               AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid AND {waits}) \
            UNION \
            SELECT s.pid FROM {schema}.session_holds s \
             WHERE s.name = $2 AND s.key <> $1 \
               AND {schema}.session_live(s.pid, s.key, s.server_start)) p \
          WHERE p.pid <> pg_backend_pid()",
        waits = waits(&schema, "'/*locksmith:wait key=' || $1::bigint || ' %'", "$2")
    );
    let terminated: Vec<i32> = shared
        .query_on(
            &client,
            &holders,
            &[(&key, Type::INT8), (&name, Type::TEXT)],
        )
        .await?
        .iter()
        .filter(|row| row.get::<_, bool>(1))
        .map(|row| row.get(0))
        .collect();
    // A terminated backend tells its client first and drops its locks as
    // it exits: wait until they are gone, so that the caller (and whoever
    // it tells) finds every lock of those connections free.
    // (`pg_terminate_backend`'s own timeout argument needs PostgreSQL 14.)
    let deadline = tokio::time::Instant::now() + TERMINATION_WAIT;
    while !terminated.is_empty() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                name,
                ?terminated,
                wait = ?TERMINATION_WAIT,
                "postgres: terminated connections still hold locks; force-release returns anyway"
            );
            break;
        }
        let left: i64 = shared
            .query_on(
                &client,
                "SELECT count(*) FROM pg_locks WHERE pid = ANY($1)",
                &[(&terminated, Type::INT4_ARRAY)],
            )
            .await?
            .first()
            .map_or(0, |row| row.get(0));
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let terminated = terminated.len();
    shared
        .query_on(
            &client,
            &format!("SELECT {schema}.wake($1)"),
            &[(&name, Type::TEXT)],
        )
        .await?;
    tracing::info!(name, deleted, terminated, "postgres: force-released");
    Ok(())
}
