//! When a member takes its own Raft snapshots: after `snapshot_every`
//! entries or `snapshot_log_bytes` of log at the least, and with a big
//! table only once the log written since the last snapshot has outgrown it
//! (`snapshot_log_percent`).

use std::time::Duration;

use locksmith::{Client, Guard};
use locksmith_server::{Server, ServerConfig};

/// `count` lock names of 200 bytes from `first` on.
fn long_names(first: usize, count: usize) -> Vec<String> {
    (first..first + count)
        .map(|i| format!("{i:0>200}"))
        .collect()
}

/// Holds every one of `names` through `client`, 64 to an acquire.
async fn hold_all(client: &Client, names: Vec<String>) -> Vec<Guard> {
    let mut guards = Vec::new();
    for chunk in names.chunks(64) {
        let guard = client.multi_lock(chunk.to_vec()).acquire().await;
        guards.push(guard.expect("free names"));
    }
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_table_is_snapshotted_again_only_once_the_log_outgrows_it() {
    let dir = tempfile::tempdir().expect("temporary data directory");
    let mut config = ServerConfig::durable(dir.path()).listen("127.0.0.1:0".parse().unwrap());
    config.snapshot_every = 5;
    assert_eq!(config.snapshot_log_percent, 100, "the default");
    let server = Server::start(config.clone()).await.expect("start");
    let address = server.local_addr();
    let url = server.url();
    // 2 048 locks of 200-byte names: a snapshot of about half a megabyte.
    let holder = Client::connect(&url).await.expect("connect");
    let held = hold_all(&holder, long_names(0, 2_048)).await;
    // A graceful stop leaves a snapshot of everything; the member starts
    // again from it, on the same address (the holder resumes there), with
    // its counters at 0.
    server.shutdown().await.expect("stop");
    let server = Server::start(config.listen(address))
        .await
        .expect("start again");

    // Some 200 small entries: far more than `snapshot_every`, far fewer
    // bytes than the snapshot. The entry count alone would have the member
    // build one every 5 of them.
    let other = Client::connect(&url).await.expect("connect");
    for _ in 0..100 {
        let guard = other.lock("small").acquire().await.expect("free");
        guard.release().await.expect("release");
    }
    assert_eq!(server.stats().snapshots, 0, "no snapshot yet");

    // Twice the table's bytes of log: a snapshot is due.
    let more = hold_all(&other, long_names(2_048, 4_096)).await;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while server.stats().snapshots == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "a snapshot once the log outgrew the last one"
    );
    let built = server.stats().snapshots;
    assert!(built <= 2, "{built} snapshots for a log twice the table");

    drop((held, more));
    holder.close().await.expect("close");
    other.close().await.expect("close");
    server.shutdown().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_few_big_entries_is_snapshotted_by_its_bytes_and_purged() {
    let dir = tempfile::tempdir().expect("temporary data directory");
    let mut config = ServerConfig::durable(dir.path()).listen("127.0.0.1:0".parse().unwrap());
    assert_eq!(config.snapshot_every, 10_000, "the default");
    config.snapshot_log_bytes = 1 << 20;
    config.segment_bytes = 256 << 10;
    let server = Server::start(config.clone()).await.expect("start");
    let address = server.local_addr();
    let holder = Client::connect(&server.url()).await.expect("connect");
    // 8 192 names of 200 bytes, 64 to an acquire: about 2 MB of log in some
    // 130 entries, far fewer than `snapshot_every`.
    let held = hold_all(&holder, long_names(0, 8_192)).await;
    let first_segment = dir.path().join("raft").join(format!("log-{:020}", 1));
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while server.stats().snapshots == 0 || first_segment.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "no snapshot of the log's bytes, or its first segment kept: {} snapshots",
        server.stats().snapshots
    );

    // The member starts again from the snapshot and what is left of the log,
    // every hold in place.
    server.shutdown().await.expect("stop");
    let server = Server::start(config.listen(address))
        .await
        .expect("start again");
    let other = Client::connect(&server.url()).await.expect("connect");
    for name in [long_names(0, 1), long_names(8_191, 1)].concat() {
        let taken = other.lock(name).try_acquire().await.expect("try");
        assert!(taken.is_none(), "a hold was lost with the purged log");
    }
    drop(held);
    holder.close().await.expect("close");
    other.close().await.expect("close");
    server.shutdown().await.expect("stop");
}
