//! The layout's migration: `schema.sql`, run once per database on first use.

use tokio_postgres::types::Type;

use super::key::advisory_key;
use super::pg_error;
use crate::error::{Error, Result};

/// The layout version this client speaks (`<schema>.meta.version`).
pub(crate) const VERSION: i32 = 2;

const SQL: &str = include_str!("schema.sql");

/// The SQL that creates the layout in schema `schema` (a plain lower-case
/// identifier), for administrators who create it by hand and connect with
/// `locksmith_migrate=false`.
///
/// ```
/// let sql = locksmith::postgres::schema_sql("locksmith");
/// assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"locksmith\".lease_holds"));
/// ```
pub fn schema_sql(schema: &str) -> String {
    SQL.replace("__SCHEMA__", &format!("\"{schema}\""))
        .replace("__CHANNEL__", schema)
}

/// The advisory key concurrent migrations serialize on: the key of
/// `<schema>\0migrate` (no lock name contains NUL).
pub(crate) fn migration_key(schema: &str) -> i64 {
    advisory_key(&format!("{schema}\0migrate"))
}

/// Creates (or checks) the layout in `schema`: a no-op when `meta` already
/// says [`VERSION`]; otherwise, with `migrate`, runs [`schema_sql`] in one
/// transaction under `pg_advisory_xact_lock(migration_key)`, so concurrent
/// first users wait for one another instead of racing.
///
/// Cancel safety: safe; a dropped migration rolls back with its transaction.
pub(crate) async fn ensure(
    client: &mut tokio_postgres::Client,
    schema: &str,
    migrate: bool,
) -> Result<()> {
    match version(client, schema).await? {
        Some(VERSION) => return Ok(()),
        Some(newer) if newer > VERSION => return Err(too_new(schema, newer)),
        _ if !migrate => {
            return Err(Error::backend(
                "postgres",
                format!(
                    "schema {schema:?} has no locksmith layout (version {VERSION}) and \
                     locksmith_migrate=false: create it with locksmith::postgres::schema_sql"
                ),
            ))
        }
        _ => {}
    }
    let span = tracing::info_span!("postgres migrate", schema, version = VERSION);
    tracing::Instrument::instrument(run_migration(client, schema), span).await
}

/// The migration transaction of [`ensure`].
///
/// Cancel safety: safe; a dropped migration rolls back with its transaction
/// (dropping a tokio-postgres transaction rolls it back).
async fn run_migration(client: &mut tokio_postgres::Client, schema: &str) -> Result<()> {
    // Unnamed statements only, here and in `version`: they also work behind a
    // transaction pooler.
    let tx = client.transaction().await.map_err(pg_error)?;
    tx.query_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&migration_key(schema), Type::INT8)],
    )
    .await
    .map_err(pg_error)?;
    // Another client may have migrated while we waited for the lock.
    match version(&tx, schema).await? {
        Some(VERSION) => return tx.commit().await.map_err(pg_error),
        Some(newer) if newer > VERSION => return Err(too_new(schema, newer)),
        _ => {}
    }
    tx.batch_execute(&schema_sql(schema))
        .await
        .map_err(pg_error)?;
    tx.batch_execute(&format!(
        "DELETE FROM \"{schema}\".meta; INSERT INTO \"{schema}\".meta (version) VALUES ({VERSION})"
    ))
    .await
    .map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)?;
    tracing::info!("postgres layout created");
    Ok(())
}

/// The layout version recorded in `schema`, `None` when there is none.
///
/// Cancel safety: safe, read-only.
async fn version(client: &impl tokio_postgres::GenericClient, schema: &str) -> Result<Option<i32>> {
    let exists: Option<String> = client
        .query_typed_one(
            "SELECT to_regclass($1)::text",
            &[(&format!("\"{schema}\".meta"), Type::TEXT)],
        )
        .await
        .map_err(pg_error)?
        .get(0);
    if exists.is_none() {
        return Ok(None);
    }
    let row = client
        .query_typed_one(&format!("SELECT max(version) FROM \"{schema}\".meta"), &[])
        .await
        .map_err(pg_error)?;
    Ok(row.get(0))
}

fn too_new(schema: &str, newer: i32) -> Error {
    Error::backend(
        "postgres",
        format!(
            "schema {schema:?} has layout version {newer}, newer than this client's {VERSION}: \
             upgrade locksmith"
        ),
    )
}
