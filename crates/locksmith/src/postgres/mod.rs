//! `postgres://user:pass@host:port/db`: locks on PostgreSQL advisory locks,
//! with fencing tokens from a sequence and lease (TTL) holds on a table.
//!
//! # URL
//!
//! `postgres://` or `postgresql://`, with everything libpq-style URLs take
//! (`?sslmode=`, `application_name=`, `connect_timeout=`, `options=`,
//! `host=/run/postgresql` for a Unix socket, several hosts with
//! `target_session_attrs=read-write`, …; parsed by tokio-postgres), plus these
//! options of locksmith's own, which are taken out of the URL before it goes
//! to tokio-postgres:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `locksmith_mode` | `session` | `session`: a hold without its own lease is a session-level advisory lock on an open connection. `ttl`: it is a lease row kept by the watchdog (lease = the client's `session_ttl`, renewed at a third), and holds no connection |
//! | `locksmith_pooler` | `none` | `transaction`: a transaction pooler (PgBouncer's transaction mode) sits in front of PostgreSQL; see [PgBouncer](#pgbouncer-and-other-transaction-poolers) |
//! | `locksmith_schema` | `locksmith` | schema of the layout (a lower-case identifier); also the `NOTIFY` channel |
//! | `locksmith_pool_size` | `8` | connections for short statements (inspection, lease operations) |
//! | `locksmith_migrate` | `true` | create the layout on first use; `false`: fail unless it exists (create it with [`schema_sql`]) |
//! | `locksmith_keepalive_ms` | `min(session_ttl/3, 5s)` | keepalive query interval on connections that hold locks |
//!
//! TLS (rustls) as libpq does it: `sslmode=disable`, `prefer` (the default:
//! TLS when the server offers it), `require`, `verify-ca` and `verify-full`,
//! with `sslrootcert=<PEM file>` naming the CA (default for `verify-*`:
//! `~/.postgresql/root.crt`). `prefer` and `require` encrypt without checking
//! the certificate, unless `sslrootcert` is given (then the chain is checked,
//! as libpq does when the root file exists); `verify-ca` checks the chain,
//! `verify-full` also that the certificate names the URL's host.
//! `sslcert=<PEM file>&sslkey=<PEM file>` (together) present a client
//! certificate, for `clientcert=verify-*` or `cert` authentication in
//! `pg_hba.conf` (no default files: libpq's `~/.postgresql/postgresql.crt`
//! is not read). Cancel requests go over TLS too. Not supported:
//! `sslmode=allow`, `sslrootcert=system`, encrypted keys (`sslpassword`),
//! CRLs.
//! `application_name` defaults to `locksmith`. PostgreSQL 12 or newer.
//!
//! # Keys: how other clients find the same lock
//!
//! A lock name maps to one advisory lock key, the first 8 bytes of SHA-256 of
//! the name's UTF-8 bytes read as a big-endian signed 64-bit integer
//! ([`advisory_key`]):
//!
//! ```sql
//! SELECT ('x' || left(encode(sha256(convert_to('orders/42', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
//! -- -4261225075031449721
//! ```
//!
//! ```python
//! int.from_bytes(hashlib.sha256("orders/42".encode()).digest()[:8], "big", signed=True)
//! ```
//!
//! So a service in any language that runs `SELECT pg_advisory_lock(key)`
//! excludes locksmith's exclusive holders and is excluded by them, and
//! `pg_advisory_lock_shared(key)` shares with locksmith's readers. Slot `i`
//! of a semaphore uses the same formula over `name || '\x00' || i`
//! ([`semaphore_slot_key`]).
//!
//! # Layout (schema `locksmith`, created by [`schema_sql`])
//!
//! - `fencing_token`: the sequence every grant takes its token from (`CACHE
//!   1`, so tokens increase across connections; `nextval` WAL-logs ahead and
//!   the commit that hands a token out flushes that record, so tokens never
//!   go backwards, across crashes either).
//! - `session_holds` (UNLOGGED): one row per session hold: name, key, owner,
//!   lock_by, mode, permits, slot, token, hold_count, lock_time, and the `pid`
//!   of the connection holding the advisory lock. A row is live exactly while
//!   that connection holds the key (`session_live()`, from `pg_locks`);
//!   release only drops the advisory lock and the next holder of the key takes
//!   the row over, so an uncontended acquire + release is one row update.
//!   `quick` marks a row an exclusive acquirer may take over without looking
//!   for lease holds or semaphore use first (see below).
//! - `lease_holds`: one row per lease hold (the same columns, `lease_expires`
//!   instead of a pid), judged by the database's clock, logged so it survives
//!   restarts. A unique index allows one exclusive row per name and one row
//!   per semaphore slot; acquiring is an insert-or-take-expired upsert.
//! - `waiters` (UNLOGGED): head waiters (below); a release NOTIFYs only when
//!   its name has one.
//! - `holds`: a view of both hold tables with a `live` column, for people.
//! - functions `acquire_session`, `release_session`, `acquire_lease`,
//!   `renew_lease`, `release_lease`, `acquire_xact`, `mark_slow`, `cleanup`:
//!   one round trip per operation, each documented in `schema.sql`.
//!
//! The migration runs on first use, in one transaction after
//! `pg_advisory_xact_lock(key of "<schema>\0migrate")`, so concurrent first
//! users do not race; `meta.version` says which layout a database has.
//!
//! # Session holds (the default)
//!
//! `pg_advisory_lock(key)` for exclusive holds, `pg_advisory_lock_shared(key)`
//! for readers. A non-waiting attempt runs on the client's *holder
//! connection*, which many holds share (a connection holds a name at most
//! once: PostgreSQL would grant its own session the key again, so a second
//! hold of the same name by this client uses a connection of its own).
//!
//! An exclusive attempt is one plain prepared statement: `pg_try_advisory_lock`
//! and, in the same statement, the takeover of the key's `quick` row with a
//! new token (`UPDATE … SET token = nextval(…)`). A row is `quick` when the
//! last exclusive grant on it found no lease hold and no semaphore use of the
//! name; whoever creates one since (a lease acquire, a semaphore permit) clears
//! `quick` on the name's rows in its own transaction while holding the name's
//! key, so the statement's `UPDATE` either sees that (PostgreSQL re-checks an
//! updated row) or runs after the key was free again. When the statement gets
//! the key but no row (the first hold of a name, a cleared flag), the PL/pgSQL
//! `acquire_session` decides with its full checks on the same connection.
//! Readers and semaphores always go through `acquire_session`.
//! When the lock is busy and the request may wait, the wait gets a connection
//! of its own: it blocks in `pg_advisory_lock(key)` with `lock_timeout` set
//! to the wait, so waiters queue in PostgreSQL's lock manager, which grants in
//! arrival order and makes a new reader queue behind a waiting writer
//! ([`Capabilities::fifo`] and writer fairness hold). A lock_timeout that
//! fires as the lock is granted reports SQLSTATE 55P03 while the lock is
//! held; the waiter then checks `pg_locks` for its own pid holding the key and
//! keeps the grant. A hold that waited keeps its connection until released;
//! then the connection, which no longer holds any advisory lock (checked:
//! `pg_advisory_unlock` must return true, or the connection is closed), goes
//! back to a small idle pool for the next wait.
//!
//! Liveness is the connection's: when it closes (server restart,
//! `pg_terminate_backend`, network), every hold on it fires `lost()` at once;
//! a keepalive query every `locksmith_keepalive_ms` on connections that hold
//! something finds peers that vanish without closing, and a keepalive that
//! gets no answer within the session TTL closes the connection (so the server
//! drops its locks) and fires `lost()`.
//!
//! Semaphores: slot keys, one session-level advisory lock per permit, taken
//! in slot order; the lock's own key is the queue's turnstile (waiters queue
//! on it exclusively, non-waiting attempts take it shared for a moment, so an
//! attempt never passes a waiter). Every holder names the same permit count;
//! a mismatch with a live hold is [`Error::Conflict`], as is using one name
//! both as a semaphore and as a lock.
//!
//! # Lease (TTL) holds
//!
//! A hold with [`crate::Lock::lease`], or any hold in `locksmith_mode=ttl`, is
//! a row in `lease_holds` and holds no connection: for jobs that outlive
//! connections, and for PgBouncer. `acquire_lease` first takes the key with a
//! transaction-level try-lock (so a session holder or a plain
//! `pg_advisory_lock` caller keeps lease holds out, and waiters queued in
//! PostgreSQL are not passed), then upserts the row. Without its own lease,
//! the watchdog renews at a third of the session TTL and retries failed
//! renewals until the lease runs out (renewals resume after a server restart;
//! the row and its token survive it). `lost()` fires when the lease runs out
//! by the local conservative clock (send time of the last renewal + lease)
//! or when a renewal finds the row gone. Release is an owner-checked delete
//! (committed asynchronously: losing one in a crash only keeps the lock until
//! the lease ends). A plain `pg_advisory_lock` caller does not see lease
//! holds: they are rows, and only locksmith reads them.
//!
//! # Waiting behind a lease, or for a semaphore slot
//!
//! A waiter that holds the key but still cannot be granted (a lease row holds
//! the lock, all slots are taken) is the head of the queue: it records itself
//! in `waiters`, LISTENs (one `LISTEN` connection per client), and sleeps in a
//! `pg_sleep` statement bounded by the blocking lease's remaining time (at
//! most 5 s, else a backoff from 50 ms to 1 s). Releases of the name NOTIFY
//! `<schema>` with the name as payload; the client cancels the head's sleep,
//! and the head re-checks. Everyone behind it stays in PostgreSQL's queue, so
//! only the head wakes.
//!
//! # Inspection
//!
//! `describe` and `list` read the hold tables (live rows only), `pg_locks`
//! (holders of the key that are not locksmith holds, as owner `pid:<pid>`)
//! and `pg_stat_activity`: every waiting statement carries a comment
//! `/*locksmith:wait key=… mode=… owner=… name=…*/`, which is how waiters are
//! listed, in queue order. Every other statement locksmith runs on a
//! connection that may hold a key starts with a `/*locksmith:…*/` comment
//! too, so a connection that holds the key for a moment (an attempt's
//! try-lock) is no `pid:` holder; nor is one that moved on to new work while
//! the inspection read (behind a pooler, a server connection serves anyone a
//! moment after a waiter's transaction). Seeing other roles' waiting statements needs
//! `pg_read_all_stats` (or the same role); long names may be cut by
//! `track_activity_query_size`.
//!
//! `force_release` deletes the name's lease rows and terminates the
//! connections holding its key (`pg_terminate_backend`; needs the same role or
//! `pg_signal_backend`), which ends every other hold of those connections too.
//!
//! # PgBouncer and other transaction poolers
//!
//! Behind PgBouncer in transaction mode (`pool_mode = transaction`) the
//! transactions of one client connection may run on different server
//! sessions, so nothing may outlive a transaction: no session-level advisory
//! lock, no named prepared statement (PgBouncer before 1.21 keeps none), no
//! `LISTEN`. Say so in the URL:
//!
//! ```text
//! postgres://app@pgbouncer:6432/db?locksmith_pooler=transaction
//! ```
//!
//! Every hold is then a lease hold (`locksmith_mode=ttl` is implied;
//! `locksmith_mode=session` is refused as an invalid URL), every statement is
//! unnamed, and a wait runs in one transaction: `BEGIN`,
//! `pg_advisory_xact_lock(key)` under `lock_timeout` (queued in PostgreSQL's
//! lock manager as always), `acquire_lease` in a savepoint until it grants,
//! `COMMIT`. A head waiter polls (every 250 ms at most) instead of sleeping
//! until a `NOTIFY`, and has no row in `waiters` (it would only show once the
//! wait is over): inspection and `force_release` know waiters by their
//! statements' comment. Each waiting acquire pins one server connection of the
//! pooler while it waits: size `default_pool_size` for them. The whole
//! conformance suite runs this way against a real PgBouncer in the tests.
//!
//! A client without `locksmith_pooler=transaction` checks at connect that two
//! of its connections do not share one server session (a setting made on one
//! must not show on the other), and refuses to start with
//! [`Error::Unsupported`], naming the option, when they do: a session hold
//! would stay behind on a pooled server session for whoever gets it next. A
//! busy pooler may hand the two connections different sessions, so declare
//! the pooler instead of relying on the check. Behind PgBouncer in session
//! mode everything works as with PostgreSQL itself.
//!
//! [`lock_in_transaction`] (`pg_advisory_xact_lock` in a transaction of your
//! own connection, released by its commit or rollback; unnamed statements
//! only) works through any pooler.
//!
//! # Cancel safety
//!
//! A dropped acquire leaves nothing behind: attempts run on tasks of their own
//! and a grant that nobody receives releases itself. A dropped wait sends a
//! cancel request and closes its connection, and the drop returns once the
//! server has closed its end too, which a backend does only after leaving
//! the lock queue and dropping its locks: by then no trace of the wait is
//! left (this blocks the dropping thread for a few milliseconds, at most 2 s;
//! it needs a single TCP host in the URL, else it happens in the background).
//! Behind a pooler the drop returns once the pooler has passed the cancel on
//! and closed the connection; the backend leaves the queue a moment later.
//!
//! # Not supported
//!
//! Lock-delay ([`Capabilities::lock_delay`] is false; a request with one is
//! [`Error::Unsupported`]). Re-entry is per client (same owner, same client),
//! decided by the model layer; the rows record its depth.

mod claim;
mod config;
mod conn;
mod inspect;
mod key;
mod lease;
mod listen;
mod schema;
mod session;
mod tls;
mod wait;
mod xact;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, Capabilities, Grant, Hold, LockInfo, LostSignal, Wait,
};
use crate::error::{Error, Result};
use crate::lost::LostCause;
use crate::options::ConnectOptions;

pub use config::{HoldMode, Pooler};
pub use key::{advisory_key, semaphore_slot_key};
pub use schema::schema_sql;
pub use xact::{lock_in_transaction, XactGrant, XactOptions};

use claim::Target;
use config::Settings;
use conn::ConnPool;
use lease::LeaseHold;
use listen::Listener;
use session::SessionHold;

const BACKEND: &str = "postgres";

/// Wraps a tokio-postgres error.
pub(crate) fn pg_error(error: tokio_postgres::Error) -> Error {
    Error::backend(BACKEND, PgError(error))
}

/// A tokio-postgres error whose message carries its causes. tokio-postgres
/// says only "db error" or "error connecting to server" and keeps the
/// server's own words (or the I/O error) in `source()`, which most reports,
/// the CLI's and the tests', never print.
#[derive(Debug)]
pub(crate) struct PgError(pub(crate) tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(&self.0);
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// A statement's parameters with their types (unnamed statements need them).
pub(crate) type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// Runs `sql` on `client`: as the named statement `prepared` (prepared once
/// per connection), or, when it is `None` (behind a transaction pooler, which
/// keeps no named statement from one transaction to the next), as an unnamed
/// statement parsed with the call.
///
/// Cancel safety: safe if the statement is (a dropped call may or may not
/// have run it).
pub(crate) async fn run(
    client: &tokio_postgres::Client,
    prepared: Option<&tokio_postgres::Statement>,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>> {
    match prepared {
        Some(statement) => client
            .query_raw(statement, params.iter().map(|(value, _)| *value))
            .await
            .map_err(pg_error)?
            .try_collect()
            .await
            .map_err(pg_error),
        None => client.query_typed(sql, params).await.map_err(pg_error),
    }
}

/// The one row of a statement that returns exactly one.
pub(crate) fn one(rows: Vec<Row>) -> Result<Row> {
    let count = rows.len();
    rows.into_iter()
        .next()
        .filter(|_| count == 1)
        .ok_or_else(|| {
            Error::backend(
                BACKEND,
                format!("expected one row from PostgreSQL, got {count}"),
            )
        })
}

/// Wraps a deadpool error.
fn pool_error(error: deadpool_postgres::PoolError) -> Error {
    match error {
        deadpool_postgres::PoolError::Backend(error) => pg_error(error),
        other => Error::backend(BACKEND, other.to_string()),
    }
}

/// A lock store on PostgreSQL: session holds on advisory locks, lease holds on
/// a table. See the module docs for the layout.
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

/// State shared by the backend and its holds.
pub(crate) struct Shared {
    pub settings: Arc<Settings>,
    pub sql: Sql,
    /// Connections for short statements (no session state survives them).
    pub pool: deadpool_postgres::Pool,
    /// Idle connections for waits (each wait and each hold that waited pins one).
    pub conns: ConnPool,
    /// The connection non-waiting session holds share.
    holder: Mutex<Option<Arc<conn::PgConn>>>,
    holder_connect: tokio::sync::Mutex<()>,
    pub listener: Listener,
    /// Live holds by (name, token), for closing.
    live: Mutex<HashMap<(String, u64), Arc<Inner>>>,
    pub closed: CancellationToken,
    /// Stops background work that serves the backend, not its holds (the
    /// cleanup task) once the backend itself is dropped.
    background: CancellationToken,
}

/// The comment that starts every statement of [`Sql`]: a connection of
/// locksmith's may hold a lock's key while it runs one (an attempt's try-lock,
/// an unlock), and inspection, which sees the key held in `pg_locks`, knows
/// by it that the connection is no holder of the lock.
pub(crate) const OWN: &str = "/*locksmith:own*/";

/// SQL text of the statements, with the schema filled in, each behind [`OWN`].
pub(crate) struct Sql {
    pub acquire_quick: String,
    pub acquire_session: String,
    pub release_session: String,
    pub unlock: String,
    pub unlock_shared: String,
    pub acquire_lease: String,
    pub renew_lease: String,
    pub release_lease: String,
    pub session_count: String,
    pub lease_count: String,
    pub add_waiter: String,
    pub remove_waiter: String,
    pub holds_key: String,
}

impl Sql {
    fn new(schema: &str) -> Sql {
        let own = |sql: String| format!("{OWN} {sql}");
        Sql {
            // An exclusive session acquire in one plain statement: the
            // try-lock, then the takeover of a `quick` row of the key (see
            // schema.sql). `got` without a token: the key is held, but the
            // slow path (acquire_session) must decide.
            acquire_quick: own(format!(
                "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock($2) AS got), \
                 h AS (UPDATE {schema}.session_holds s \
                          SET token = nextval('{schema}.fencing_token'), owner = $3, \
                              lock_by = $4, hold_count = 1, lock_time = clock_timestamp(), \
                              pid = pg_backend_pid(), server_start = pg_postmaster_start_time() \
                         FROM l \
                        WHERE l.got AND s.quick AND s.ctid = ( \
                              SELECT o.ctid FROM {schema}.session_holds o \
                               WHERE o.name = $1 AND o.key = $2 AND o.quick LIMIT 1) \
                       RETURNING s.token) \
                 SELECT l.got, h.token FROM l LEFT JOIN h ON true"
            )),
            acquire_session: own(format!(
                "SELECT status, token, lock_time, slot, retry_ms, detail \
                 FROM {schema}.acquire_session($1, $2, $3, $4, $5, $6, $7, $8)"
            )),
            release_session: own(format!("SELECT {schema}.release_session($1, $2, $3)")),
            unlock: own("SELECT pg_advisory_unlock($1)".to_owned()),
            unlock_shared: own("SELECT pg_advisory_unlock_shared($1)".to_owned()),
            acquire_lease: own(format!(
                "SELECT status, token, lock_time, lease_expires, slot, retry_ms, detail \
                 FROM {schema}.acquire_lease($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            )),
            renew_lease: own(format!(
                "SELECT lease_expires FROM {schema}.renew_lease($1, $2, $3, $4)"
            )),
            release_lease: own(format!("SELECT {schema}.release_lease($1, $2, $3)")),
            session_count: own(format!(
                "UPDATE {schema}.session_holds SET hold_count = $3 WHERE name = $1 AND token = $2"
            )),
            lease_count: own(format!(
                "UPDATE {schema}.lease_holds SET hold_count = $3 WHERE name = $1 AND token = $2"
            )),
            add_waiter: own(format!(
                "INSERT INTO {schema}.waiters (name, owner, mode, permits, pid) \
                 VALUES ($1, $2, $3, $4, pg_backend_pid()) RETURNING id"
            )),
            remove_waiter: own(format!("DELETE FROM {schema}.waiters WHERE id = $1")),
            holds_key: own(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                        AND pid = pg_backend_pid() AND granted \
                        AND classid = (($1::bigint >> 32) & 4294967295)::oid \
                        AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1)"
                    .to_owned(),
            ),
        }
    }
}

impl PostgresBackend {
    /// Connects to the database named by `url` (`postgres://` or
    /// `postgresql://`, libpq parameters and the `locksmith_*` options of the
    /// module docs) and creates the layout on first use.
    ///
    /// Cancel safety: safe; a dropped connect leaves nothing behind (a
    /// migration in flight rolls back).
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let settings = Arc::new(Settings::parse(url, options)?);
        let span = tracing::info_span!("postgres connect", url = %settings.url);
        tracing::Instrument::instrument(Self::open(settings), span).await
    }

    /// Builds the pool, creates (or checks) the layout and starts the
    /// clean-up task.
    ///
    /// Cancel safety: safe, as [`PostgresBackend::connect`]: the pool and its
    /// connections go with the dropped future, a migration in flight rolls
    /// back, and the clean-up task starts only after the last await.
    async fn open(settings: Arc<Settings>) -> Result<Self> {
        let manager = deadpool_postgres::Manager::from_config(
            settings.pg.clone(),
            settings.tls.0.clone(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(settings.pool_size)
            .build()
            .map_err(|e| Error::backend(BACKEND, e.to_string()))?;
        {
            let mut client = pool.get().await.map_err(pool_error)?;
            let client: &mut tokio_postgres::Client = &mut client;
            schema::ensure(client, &settings.schema, settings.migrate).await?;
        }
        if settings.pooler == Pooler::None {
            refuse_shared_sessions(&pool, &settings).await?;
        }
        let shared = Arc::new(Shared {
            sql: Sql::new(&settings.schema_ident()),
            conns: ConnPool::new(settings.clone(), 4),
            listener: Listener::new(settings.clone()),
            settings,
            pool,
            holder: Mutex::new(None),
            holder_connect: tokio::sync::Mutex::new(()),
            live: Mutex::default(),
            closed: CancellationToken::new(),
            background: CancellationToken::new(),
        });
        tokio::spawn(cleanup(Arc::downgrade(&shared)));
        Ok(PostgresBackend { shared })
    }

    /// How holds without an explicit lease are kept (`locksmith_mode`).
    pub fn hold_mode(&self) -> HoldMode {
        self.shared.settings.mode
    }

    /// What the URL said sits between this client and PostgreSQL
    /// (`locksmith_pooler`).
    pub fn pooler(&self) -> Pooler {
        self.shared.settings.pooler
    }

    /// The schema of the layout (`locksmith_schema`).
    pub fn schema(&self) -> &str {
        &self.shared.settings.schema
    }
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        // Holds may outlive the backend (and keep using its pool); only the
        // backend's own background work stops.
        self.shared.background.cancel();
    }
}

/// Fails when two connections of the pool share one server session, as they
/// do behind a transaction pooler that did not say so
/// (`locksmith_pooler=transaction`): a setting made on one connection is seen
/// on the other. Session holds and prepared statements would go wrong there.
/// A busy pooler may hand the second connection another session, so this
/// catches the pooler when it is quiet (at the latest in tests and on first
/// use), not always.
///
/// Cancel safety: safe.
async fn refuse_shared_sessions(pool: &deadpool_postgres::Pool, settings: &Settings) -> Result<()> {
    let first = pool.get().await.map_err(pool_error)?;
    // A connection of its own: the pool may have room for only one.
    let (second, connection) = settings
        .pg
        .connect(settings.tls.0.clone())
        .await
        .map_err(pg_error)?;
    let driver = tokio::spawn(connection);
    let _stop = AbortOnDrop(driver);
    let mark = uuid::Uuid::new_v4().simple().to_string();
    first
        .batch_execute(&format!(
            "SELECT set_config('locksmith.session_mark', '{mark}', false)"
        ))
        .await
        .map_err(pg_error)?;
    let seen = second
        .simple_query("SELECT current_setting('locksmith.session_mark', true)")
        .await
        .map_err(pg_error)?;
    let shared = seen.iter().any(|message| {
        matches!(message, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some(mark.as_str()))
    });
    if shared {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "a transaction pooler that was not declared: two connections of this \
                   client got one server session. Session holds need a session of their \
                   own; add locksmith_pooler=transaction to the URL (lease holds) or use \
                   lock_in_transaction"
                .into(),
        });
    }
    Ok(())
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the layout's `cleanup()` now and then (every 5 minutes), while the
/// backend lives.
///
/// Cancel safety: runs as its own task until the backend is dropped or
/// closed; aborting it only stops the clean-ups (a `cleanup()` in flight
/// commits or rolls back as a whole).
async fn cleanup(shared: Weak<Shared>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let sql = format!("SELECT {}.cleanup()", shared.settings.schema_ident());
        if let Ok(client) = shared.pool.get().await {
            if let Err(error) = client.batch_execute(&sql).await {
                tracing::debug!(%error, "postgres cleanup failed");
            }
        }
        let stop = shared.background.clone();
        drop(shared);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(300)) => {}
        }
    }
}

impl Shared {
    /// The connection non-waiting session holds share, (re)connected as needed.
    ///
    /// Cancel safety: safe.
    pub async fn holder(&self) -> Result<Arc<conn::PgConn>> {
        if let Some(conn) = self.live_holder() {
            return Ok(conn);
        }
        let _connecting = self.holder_connect.lock().await;
        if let Some(conn) = self.live_holder() {
            return Ok(conn);
        }
        let conn = conn::PgConn::connect(&self.settings).await?;
        *self.holder.lock().expect("holder lock") = Some(conn.clone());
        Ok(conn)
    }

    fn live_holder(&self) -> Option<Arc<conn::PgConn>> {
        self.holder
            .lock()
            .expect("holder lock")
            .as_ref()
            .filter(|c| c.usable())
            .cloned()
    }

    /// A pooled connection for a short statement.
    ///
    /// Cancel safety: safe.
    pub async fn client(&self) -> Result<deadpool_postgres::Object> {
        if self.closed.is_cancelled() {
            return Err(Error::Closed);
        }
        self.pool.get().await.map_err(pool_error)
    }

    /// Runs `sql` on a pooled connection (see [`run`]).
    ///
    /// Cancel safety: safe if the statement is (a dropped call may or may not
    /// have run it).
    pub async fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>> {
        let client = self.client().await?;
        self.query_on(&client, sql, params).await
    }

    /// Runs `sql` on `client`, a pooled connection (see [`run`]).
    ///
    /// Cancel safety: as [`Shared::query`].
    pub async fn query_on(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>> {
        let prepared = match self.settings.pooler {
            Pooler::Transaction => None,
            Pooler::None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                Some(
                    client
                        .prepare_typed_cached(sql, &types)
                        .await
                        .map_err(pg_error)?,
                )
            }
        };
        run(client, prepared.as_ref(), sql, params).await
    }

    /// The lease of a hold acquired by `request`: its own, the session TTL in
    /// TTL mode, none for a session hold.
    fn lease_of(&self, request: &AcquireRequest) -> Option<Duration> {
        request.lease.or(match self.settings.mode {
            HoldMode::Ttl => Some(self.settings.session_ttl),
            HoldMode::Session => None,
        })
    }

    /// Acquires one name, no re-entry handling.
    ///
    /// Cancel safety: safe, as `session::acquire` and `lease::acquire`.
    async fn acquire_new(
        self: &Arc<Self>,
        request: &AcquireRequest,
        name: &str,
    ) -> Result<Option<Inner>> {
        let lease = self.lease_of(request);
        let target = Target::new(request, name, lease);
        let deadline = match request.wait {
            Wait::For(limit) => Some((tokio::time::Instant::now() + limit, limit)),
            _ => None,
        };
        match lease {
            None => session::acquire(self, &target, request.wait, deadline)
                .await
                .map(|hold| hold.map(Inner::Session)),
            Some(lease) => {
                let watchdog = request.lease.is_none();
                lease::acquire(self, &target, request.wait, deadline, lease, watchdog)
                    .await
                    .map(|hold| hold.map(Inner::Lease))
            }
        }
    }

    /// Updates the recorded re-entry depth of a grant (best effort: it is for
    /// inspection only).
    ///
    /// Cancel safety: safe; one statement: the depth landed or it did not.
    async fn record_count(&self, name: &str, inner: &Inner, count: u32) {
        let sql = match inner {
            Inner::Session(_) => &self.sql.session_count,
            Inner::Lease(_) => &self.sql.lease_count,
        };
        let result = self
            .query(
                sql,
                &[
                    (&name, Type::TEXT),
                    (&(inner.token() as i64), Type::INT8),
                    (&(count as i32), Type::INT4),
                ],
            )
            .await;
        if let Err(error) = result {
            tracing::debug!(%error, name, "postgres: recording the hold count failed");
        }
    }
}

/// The real hold behind a grant.
enum Inner {
    Session(SessionHold),
    Lease(Arc<LeaseHold>),
}

impl Inner {
    fn token(&self) -> u64 {
        match self {
            Inner::Session(hold) => hold.token,
            Inner::Lease(hold) => hold.token,
        }
    }

    fn lost(&self) -> &LostSignal {
        match self {
            Inner::Session(hold) => &hold.lost,
            Inner::Lease(hold) => &hold.lost,
        }
    }

    /// Cancel safety: the release runs to completion on its own task.
    async fn release(&self) -> Result<()> {
        match self {
            Inner::Session(hold) => hold.release().await,
            Inner::Lease(hold) => hold.release().await,
        }
    }
}

/// The hold a guard owns.
struct Handle {
    shared: Arc<Shared>,
    name: String,
    inner: Arc<Inner>,
}

#[async_trait]
impl Hold for Handle {
    /// Cancel safety: safe once polled: the hold leaves the client's live
    /// holds at the first poll and the release runs to completion on its own
    /// task, even if this future is dropped.
    async fn release(self: Box<Self>) -> Result<()> {
        let token = self.inner.token();
        self.shared
            .live
            .lock()
            .expect("live holds lock")
            .remove(&(self.name.clone(), token));
        let span = tracing::debug_span!("postgres release", name = %self.name, token);
        tracing::Instrument::instrument(self.inner.release(), span).await
    }

    /// Cancel safety: safe; one renewal statement: the extension either
    /// happened or did not.
    async fn extend(&self, lease: Duration) -> Result<()> {
        match self.inner.as_ref() {
            Inner::Lease(hold) => hold.extend(lease).await,
            Inner::Session(_) => Err(Error::InvalidArgument(
                "a session hold has no lease to extend".into(),
            )),
        }
    }

    /// Writes the depth into the hold's row (best effort: it is for
    /// inspection only).
    ///
    /// Cancel safety: safe; the depth either landed or did not.
    async fn record_count(&self, count: u32) -> Result<()> {
        self.shared
            .record_count(&self.name, &self.inner, count)
            .await;
        Ok(())
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo: true,
            lock_delay: false,
            lists_waiters: true,
            shared: true,
            semaphore: true,
            proclaim: false,
            multi_lock: false,
        }
    }

    /// Cancel safety: safe (see the module docs): attempts run on their own
    /// tasks and a grant nobody receives releases itself, a dropped wait
    /// closes its connection, and the hold is registered after the last await.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        if self.shared.closed.is_cancelled() {
            return Err(Error::Closed);
        }
        let shared = &self.shared;
        let name = request.names[0].as_str();
        let Some(inner) = shared.acquire_new(request, name).await? else {
            return Ok(None);
        };
        let inner = Arc::new(inner);
        let token = inner.token();
        shared
            .live
            .lock()
            .expect("live holds lock")
            .insert((name.to_owned(), token), inner.clone());
        Ok(Some(Grant {
            tokens: vec![token],
            lost: inner.lost().clone(),
            hold: Box::new(Handle {
                shared: shared.clone(),
                name: name.to_owned(),
                inner,
            }),
        }))
    }

    /// Cancel safety: safe, read-only.
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let span = tracing::debug_span!("postgres describe", name);
        tracing::Instrument::instrument(inspect::describe(&self.shared, name), span).await
    }

    /// Cancel safety: safe, read-only.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let span = tracing::debug_span!("postgres list", prefix);
        tracing::Instrument::instrument(inspect::list(&self.shared, prefix), span).await
    }

    /// Cancel safety: the release may or may not have happened (the lease rows
    /// may be deleted and some holders' connections terminated).
    async fn force_release(&self, name: &str) -> Result<()> {
        let span = tracing::info_span!("postgres force_release", name);
        tracing::Instrument::instrument(inspect::force_release(&self.shared, name), span).await
    }

    /// Cancel safety: every live hold's `lost()` fires at the first poll, and
    /// each release that started runs to completion on its own task. If
    /// dropped midway, the holds not yet reached are released when their
    /// guards go (or end with their connection or lease), and the client is
    /// not yet closed.
    async fn close(&self) -> Result<()> {
        let shared = &self.shared;
        let live: Vec<Arc<Inner>> = shared
            .live
            .lock()
            .expect("live holds lock")
            .drain()
            .map(|(_, hold)| hold)
            .collect();
        for hold in &live {
            hold.lost()
                .fire_because(LostCause::ClientClosed, "the client was closed");
        }
        for hold in live {
            if let Err(error) = hold.release().await {
                tracing::debug!(%error, "postgres: release on close failed");
            }
        }
        // Only now: the releases need the pool, which refuses a closed client.
        shared.closed.cancel();
        shared.background.cancel();
        shared.holder.lock().expect("holder lock").take();
        shared.conns.clear();
        shared.listener.close().await;
        shared.pool.close();
        Ok(())
    }
}

/// Runs `work` on its own task, so that it completes even if the caller stops
/// waiting for it; an output nobody received is dropped there (holds release
/// themselves when dropped).
///
/// Cancel safety: safe once polled: `work` is spawned at the first poll and
/// runs to completion (its output is dropped there) if this future is dropped.
pub(crate) async fn detached<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T> {
    tokio::spawn(work)
        .await
        .map_err(|e| Error::backend(BACKEND, format!("postgres task failed: {e}")))
}

/// Parses `url` as `connect` does, contacting nothing (the fuzz targets'
/// entry, through `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn parse_url_only(url: &str, options: &ConnectOptions) -> Result<()> {
    Settings::parse(url, options).map(drop)
}
