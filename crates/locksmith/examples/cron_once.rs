//! A cron job that must run once, however many machines start it.
//!
//! Every machine's crontab starts this program at the same minute; the one
//! that takes the lock does the work, the others see it taken and exit at
//! once. The work stops the moment the hold can no longer be trusted (its
//! session expired, an operator force-released it), and the fencing token
//! goes with every write so that a late writer is refused by the storage.
//!
//! ```sh
//! cargo run -p locksmith --example cron_once -- locksmith://127.0.0.1:7420
//! ```
//!
//! The URL names any store (`redis://…`, `zk://…`, `etcd://…`,
//! `postgres://…`); without one it runs against `memory://`.

use std::time::Duration;

use locksmith::{Client, ConnectOptions};

#[tokio::main]
async fn main() -> locksmith::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    let options = ConnectOptions::default().client_name("nightly-report");
    let client = Client::connect_with(&url, options).await?;

    // No waiting: if another machine has the job, this run has nothing to do.
    let Some(guard) = client.lock("cron/nightly-report").try_acquire().await? else {
        println!("another machine runs the nightly report; nothing to do");
        return Ok(());
    };
    let token = guard.fencing_token();
    println!("running the nightly report (fencing token {token})");

    tokio::select! {
        reason = guard.lost() => {
            // Stop writing: someone else may hold the lock now.
            eprintln!("lock lost ({reason}); stopping");
            std::process::exit(1);
        }
        () = nightly_report(token) => {}
    }
    // The checked release: an error means the hold had already ended.
    guard.release().await?;
    client.close().await
}

/// The job itself; every write carries `token` (see the `fenced_postgres`
/// example for storage that checks it).
async fn nightly_report(token: u64) {
    for part in 1..=3 {
        println!("  writing part {part} with token {token}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
