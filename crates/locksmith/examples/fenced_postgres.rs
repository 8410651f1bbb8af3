//! Writes to PostgreSQL that a stale lock holder cannot make.
//!
//! A lock alone does not protect storage: a holder can pause (a long GC, a
//! frozen VM) past its session's end, another client takes the lock, and the
//! first one wakes up and writes. So the storage checks the fencing token
//! itself: each row remembers the highest token that wrote it, and a write
//! with a lower one changes nothing (Kleppmann's fencing rule).
//!
//! The lock may live in any store; the guarded data is a PostgreSQL table:
//!
//! ```sh
//! cargo run -p locksmith --features postgres --example fenced_postgres -- \
//!     memory:// "host=127.0.0.1 user=postgres dbname=postgres"
//! ```

use locksmith::Client;
use tokio_postgres::NoTls;

/// Creates the table once; `fence` is the highest token that wrote the row.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS balances (
    account text PRIMARY KEY,
    amount bigint NOT NULL,
    fence bigint NOT NULL
)";

/// Writes only if no later holder wrote the row: the token check and the
/// write are one statement, so nothing can come between them.
const FENCED_WRITE: &str = "INSERT INTO balances (account, amount, fence) VALUES ($1, $2, $3)
    ON CONFLICT (account) DO UPDATE SET amount = EXCLUDED.amount, fence = EXCLUDED.fence
    WHERE balances.fence <= EXCLUDED.fence";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let lock_url = args.next().unwrap_or_else(|| "memory://".into());
    let database = args
        .next()
        .ok_or("usage: fenced_postgres LOCK_URL POSTGRES_CONNINFO")?;

    let (db, connection) = tokio_postgres::connect(&database, NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(SCHEMA).await?;

    let client = Client::connect(&lock_url).await?;
    let account = "accounts/42";
    let guard = client.lock(account).acquire().await?;
    let token = guard.fencing_token() as i64;

    let written = db
        .execute(FENCED_WRITE, &[&account, &100i64, &token])
        .await?;
    println!("write with token {token}: {written} row(s)");

    // A holder from before (a lower token) is refused by the table itself.
    let stale = db
        .execute(FENCED_WRITE, &[&account, &-1i64, &(token - 1)])
        .await?;
    println!("write with stale token {}: {stale} row(s)", token - 1);
    assert_eq!(stale, 0, "the table refuses a lower token");

    guard.release().await?;
    client.close().await?;
    Ok(())
}
