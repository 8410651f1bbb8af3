//! A worker that does its work only while it leads.
//!
//! Several replicas of a service run this; one is elected and works, the
//! others wait in line, and when the leader stops (or dies, or loses its
//! session) the next one takes over. The leader publishes its address as the
//! election's value, which followers (or `locksmith leader NAME`, or
//! `etcdctl elect -l NAME` on etcd) read. The leadership's fencing token goes
//! with every action, so that an old leader's late actions are refused.
//!
//! ```sh
//! cargo run -p locksmith --example leader_worker -- locksmith://127.0.0.1:7420 worker-1
//! ```

use std::time::Duration;

use futures::StreamExt;
use locksmith::Client;

#[tokio::main]
async fn main() -> locksmith::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".into());
    let me = args.next().unwrap_or_else(|| "worker-1".into());
    let client = Client::connect(&url).await?;
    let election = client.election("services/billing-worker");

    // Followers can watch who leads, for instance to forward requests.
    let watcher = tokio::spawn({
        let election = election.clone();
        async move {
            let mut changes = std::pin::pin!(election.observe());
            while let Some(Ok(leader)) = changes.next().await {
                match leader {
                    Some(leader) => println!("leader: {}", leader.value),
                    None => println!("no leader"),
                }
            }
        }
    });

    // Waits in line until this replica leads.
    let leadership = election.campaign(me.clone()).await?;
    let token = leadership.fencing_token();
    println!("{me} leads (fencing token {token})");

    tokio::select! {
        reason = leadership.lost() => {
            eprintln!("{me} lost the leadership ({reason}); stopping work");
        }
        () = work(token) => {
            // Done: let the next replica lead at once.
            leadership.resign().await?;
        }
    }
    watcher.abort();
    client.close().await
}

/// The leader's work; each action carries `token`.
async fn work(token: u64) {
    for round in 1..=3 {
        println!("  round {round}, acting with token {token}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
