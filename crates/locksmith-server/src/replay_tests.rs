//! A member that replays the log from its first entry reaches exactly the
//! state the leader had: what makes followers, restarts and snapshots agree.
//!
//! A real server (a group of one, durable) serves a workload through the
//! client library, with contention, a lease and a waiter that run out, and
//! sessionless acquires over the raw gRPC API, and stops gracefully, which
//! leaves a snapshot of everything it applied. A fresh core then applies the
//! entries of the server's own log, up to the snapshot's last log id,
//! through the one apply path every member uses; its state, frozen and
//! encoded as a snapshot, must be the server's, byte for byte.

use std::time::Duration;

use locksmith::{Client, ConnectOptions, Guard};
use openraft::storage::RaftLogReader;

use crate::core::{Core, Replica};
use crate::storage::member::MemberDir;
use crate::storage::ServerSnapshot;
use crate::{Server, ServerConfig};

/// Sessionless acquires and releases over the raw gRPC API (their request
/// ids are the service's, not a session's).
async fn sessionless(addr: std::net::SocketAddr) {
    use locksmith_proto::v1 as pb;
    let mut client = pb::locksmith_client::LocksmithClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    for i in 0..3 {
        let name = format!("unary-{i}");
        let acquire = pb::AcquireLeaseRequest {
            acquire: Some(pb::Acquire {
                names: vec![name.clone()],
                owner: "unary".into(),
                lease_ms: Some(60_000),
                ..pb::Acquire::default()
            }),
        };
        let granted = client.acquire_lease(acquire).await.expect("acquire");
        assert!(granted.into_inner().granted, "{name} is free");
        if i > 0 {
            let release = pb::ReleaseRequest {
                release: Some(pb::Release {
                    name,
                    owner: "unary".into(),
                    token: None,
                }),
            };
            client.release(release).await.expect("release");
        }
    }
}

/// The workload: holds kept and released, a waiter granted on a release, a
/// waiter that times out, a lease that runs out, and enough pairs for many
/// entries. Returns the clients and the holds they keep.
async fn workload(url: &str) -> (Vec<Client>, Vec<Guard>) {
    let connect = |name: &str| {
        let options = ConnectOptions::default()
            .session_ttl(Duration::from_secs(10))
            .client_name(name.to_owned());
        Client::connect_with(url, options)
    };
    let first = connect("first").await.expect("connect");
    let second = connect("second").await.expect("connect");
    let kept = first.lock("kept").acquire().await.expect("kept");
    let contended = first.lock("contended").acquire().await.expect("contended");
    let waiter = tokio::spawn({
        let second = second.clone();
        async move { second.lock("contended").acquire().await }
    });
    let timed_out = first
        .lock("kept")
        .owner("another")
        .acquire_timeout(Duration::from_millis(50))
        .await;
    assert!(timed_out.is_err(), "held by the same client's other owner");
    contended.release().await.expect("release");
    let granted = waiter.await.expect("waiter").expect("granted on release");
    assert!(granted.fencing_token() > kept.fencing_token());
    let leased = second
        .lock("leased")
        .lease(Duration::from_millis(100))
        .acquire()
        .await
        .expect("leased");
    for i in 0..200 {
        let guard = first.lock(format!("pair-{}", i % 7)).acquire().await;
        guard.expect("pair").release().await.expect("release");
    }
    // The lease ran out meanwhile (an expiry the leader decided and logged).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(leased.is_lost(), "the lease ran out");
    (vec![first, second], vec![kept, granted])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_replaying_the_log_from_scratch_reaches_the_leaders_state() {
    let dir = tempfile::tempdir().expect("temporary data directory");
    let mut config =
        ServerConfig::durable(dir.path().join("data")).listen("127.0.0.1:0".parse().unwrap());
    // No snapshot before the end, so that the log holds every entry.
    config.snapshot_every = 1_000_000;
    let server = Server::start(config.clone()).await.expect("start");
    let (clients, holds) = workload(&server.url()).await;
    sessionless(server.local_addr()).await;
    // A graceful stop leaves a snapshot of everything applied.
    server.shutdown().await.expect("stop");
    drop((holds, clients));

    let opened = MemberDir::open(&dir.path().join("data"), &config, None).expect("reopen");
    let leaders = opened.snapshot.expect("the final snapshot");
    let last = leaders.meta.last_log_id.expect("entries applied").index;
    let mut log = opened.log;
    let entries = log.try_get_log_entries(..=last).await.expect("read");
    assert_eq!(
        entries.first().map(|e| e.log_id.index),
        Some(0),
        "from the first"
    );
    assert_eq!(
        entries.len() as u64,
        last + 1,
        "every entry up to the snapshot's"
    );

    let (proposer, _) = crate::raft::propose::Proposer::new();
    let (serving, _) = tokio::sync::watch::channel(false);
    let mut member = Core::new(&config, Replica::new(proposer, serving, 1), None);
    member.apply_entries(entries);
    let replayed = member.freeze().encode();
    assert_eq!(replayed.meta, leaders.meta);
    let ours = ServerSnapshot::decode(replayed.snapshot.get_ref()).expect("decode");
    let theirs = ServerSnapshot::decode(&leaders.data).expect("decode");
    assert!(
        theirs.engine.locks.iter().any(|l| l.name == "kept"),
        "the workload left holds"
    );
    assert!(
        theirs.next_unary > 1,
        "sessionless request ids were used: {}",
        theirs.next_unary
    );
    assert_eq!(ours, theirs, "the replayed state is the leader's");
    assert_eq!(
        replayed.snapshot.get_ref(),
        &leaders.data,
        "byte for byte, as encoded"
    );
}
