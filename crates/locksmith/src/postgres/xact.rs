//! Transaction-scoped locks, for PgBouncer in transaction mode.
//!
//! Behind a transaction-pooling PgBouncer, consecutive transactions of one
//! client connection may run on different server connections, so a
//! session-level advisory lock would stay behind on a server connection that
//! someone else gets next. [`lock_in_transaction`] takes
//! `pg_advisory_xact_lock` inside a transaction of the caller's own
//! connection instead: the lock lives exactly as long as that transaction,
//! which PgBouncer keeps on one server connection. It uses only unnamed
//! statements (`query_typed`), so it also works with PgBouncer versions that
//! do not track prepared statements.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::key::advisory_key;
use super::pg_error;
use crate::backend::{Mode, Wait};
use crate::error::{Error, Result};

/// How [`lock_in_transaction`] takes the lock: the defaults, changed through
/// the builder methods (new options can be added without breaking callers).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct XactOptions {
    /// [`Mode::Exclusive`] (default) or [`Mode::Shared`]; semaphores need
    /// session or lease holds.
    pub mode: Mode,
    /// How long to wait (default: until granted).
    pub wait: Wait,
    /// Schema of the layout (default `locksmith`; create it once with
    /// `PostgresBackend::connect` or [`super::schema_sql`]).
    pub schema: String,
}

impl Default for XactOptions {
    fn default() -> Self {
        XactOptions {
            mode: Mode::Exclusive,
            wait: Wait::Forever,
            schema: "locksmith".into(),
        }
    }
}

impl XactOptions {
    /// Sets [`XactOptions::mode`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets [`XactOptions::wait`].
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Sets [`XactOptions::schema`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
}

/// A lock held until the end of the caller's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XactGrant {
    /// Fencing token, from the same sequence as every other hold.
    pub fencing_token: u64,
    /// The advisory key held (see [`super::advisory_key`]).
    pub key: i64,
}

/// Takes the lock `name` for the rest of the transaction `tx`: a
/// transaction-level advisory lock on the name's key (the same key session
/// holds and plain `pg_advisory_lock` callers use, so they all exclude one
/// another), checked against lease holds, with a fencing token from the same
/// sequence. Commit or roll back `tx` to release it. Nothing is recorded in
/// the holds tables (a row written in `tx` would only become visible once the
/// lock is gone): inspection shows the holder as `pid:<backend pid>`.
///
/// `Ok(None)` only for [`Wait::No`] when the lock is busy. A wait that times
/// out leaves `tx` usable (the attempt runs in a savepoint), except while a
/// lease hold blocks: then the key stays held until the transaction ends.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> locksmith::Result<()> {
/// use locksmith::postgres::{lock_in_transaction, XactOptions};
///
/// let mut tx = client.transaction().await.expect("begin");
/// let grant = lock_in_transaction(&mut tx, "orders/42", &XactOptions::default())
///     .await?
///     .expect("waits until granted");
/// // ... work, passing grant.fencing_token along ...
/// tx.commit().await.expect("commit"); // releases the lock
/// # Ok(()) }
/// ```
///
/// Cancel safety: not cancel safe on its own: a dropped call leaves `tx` in
/// an unknown state; roll it back (dropping a tokio-postgres transaction does).
pub async fn lock_in_transaction(
    tx: &mut tokio_postgres::Transaction<'_>,
    name: &str,
    options: &XactOptions,
) -> Result<Option<XactGrant>> {
    locksmith_core::validate_name(name).map_err(|source| Error::invalid_name(name, source))?;
    if !matches!(options.mode, Mode::Exclusive | Mode::Shared) {
        return Err(Error::Unsupported {
            backend: "postgres",
            what: "transaction-scoped semaphores".into(),
        });
    }
    let schema = &options.schema;
    if schema.is_empty()
        || schema.len() > 63
        || !schema
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
    {
        return Err(Error::InvalidArgument(format!(
            "schema {schema:?} is not a plain lower-case identifier"
        )));
    }
    let span = tracing::debug_span!("postgres lock_in_transaction", name, mode = %options.mode);
    tracing::Instrument::instrument(lock(tx, name, options), span).await
}

/// The body of [`lock_in_transaction`], after the checks.
///
/// Cancel safety: as [`lock_in_transaction`]: a dropped call may leave the
/// key held in `tx`, or its wait still running there; roll `tx` back.
async fn lock(
    tx: &mut tokio_postgres::Transaction<'_>,
    name: &str,
    options: &XactOptions,
) -> Result<Option<XactGrant>> {
    let schema = &options.schema;
    let key = advisory_key(name);
    let mode = super::claim::mode_name(options.mode);
    let claim = Claim {
        sql: format!(
            "SELECT status, token, retry_ms FROM \"{schema}\".acquire_xact($1, $2, $3, $4)"
        ),
        name,
        key,
        mode,
    };
    let granted = |token: Option<i64>| {
        Ok(Some(XactGrant {
            fencing_token: token.unwrap_or_default() as u64,
            key,
        }))
    };
    let deadline = match options.wait {
        Wait::No => {
            let (status, token, _) = claim.run(tx, true).await?;
            return if status == "granted" {
                granted(token)
            } else {
                Ok(None)
            };
        }
        Wait::For(limit) => Some((Instant::now() + limit, limit)),
        Wait::Forever => None,
    };
    let function = if options.mode == Mode::Shared {
        "pg_advisory_xact_lock_shared"
    } else {
        "pg_advisory_xact_lock"
    };
    {
        let timeout_ms = deadline.map_or(0, |(at, _)| {
            at.saturating_duration_since(Instant::now())
                .as_millis()
                .max(1) as i64
        });
        let previous: String = tx
            .query_typed_one("SELECT current_setting('lock_timeout')", &[])
            .await
            .map_err(pg_error)?
            .get(0);
        let savepoint = tx.savepoint("locksmith_lock").await.map_err(pg_error)?;
        let locked = savepoint
            .query_typed(
                &format!(
                    "WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', $2::bigint::text, true)) \
                     SELECT {function}($1) FROM t"
                ),
                &[(&key, Type::INT8), (&timeout_ms, Type::INT8)],
            )
            .await;
        match locked {
            Ok(_) => {
                savepoint
                    .query_typed(
                        "SELECT set_config('lock_timeout', $1, true)",
                        &[(&previous, Type::TEXT)],
                    )
                    .await
                    .map_err(pg_error)?;
                savepoint.commit().await.map_err(pg_error)?;
            }
            Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                // Rolling back the savepoint also drops a grant that raced
                // the timeout (it belongs to the savepoint).
                savepoint.rollback().await.map_err(pg_error)?;
                let (_, limit) = deadline.expect("only a timed wait times out");
                return Err(Error::Timeout(limit));
            }
            Err(error) => return Err(pg_error(error)),
        }
    }
    loop {
        let (status, token, retry) = claim.run(tx, false).await?;
        if status == "granted" {
            return granted(token);
        }
        // A lease holds the lock: poll (no LISTEN through PgBouncer).
        let mut pause = Duration::from_millis(retry.unwrap_or(250).clamp(1, 250) as u64);
        if let Some((at, limit)) = deadline {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(limit));
            }
            pause = pause.min(left);
        }
        tokio::time::sleep(pause).await;
    }
}

/// One `acquire_xact` call.
struct Claim<'a> {
    sql: String,
    name: &'a str,
    key: i64,
    mode: &'static str,
}

impl Claim<'_> {
    /// (status, token, retry_ms); `try_lock`: take the key here, without waiting.
    ///
    /// Cancel safety: the call may or may not have run (and taken the key) in
    /// `tx`; rolling `tx` back undoes it.
    async fn run(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        try_lock: bool,
    ) -> Result<(String, Option<i64>, Option<i64>)> {
        let row = tx
            .query_typed_one(
                &self.sql,
                &[
                    (&self.name, Type::TEXT),
                    (&self.key, Type::INT8),
                    (&self.mode, Type::TEXT),
                    (&try_lock, Type::BOOL),
                ],
            )
            .await
            .map_err(pg_error)?;
        Ok((row.get(0), row.get(1), row.get(2)))
    }
}
