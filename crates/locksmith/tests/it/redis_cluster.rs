//! The Redis backend on a Redis Cluster (`redis+cluster://`), against a real
//! cluster of three primaries with a replica each started by
//! locksmith-testkit: the conformance suite (also with the ports and the
//! cluster bus on TLS only), locks in many slots, multi-locks
//! across slots, interoperability with redis-py and Redisson, and a primary's
//! failover.

use crate::redis_support;

use std::collections::HashSet;
use std::time::Duration;

use locksmith::{Error, Mode};
use locksmith_testkit::conformance::run_suite;
use locksmith_testkit::{Redis, RedisCluster, RespValue};
use redis::cluster_routing::Slot;
use redis_support::redisson::Redisson;
use redis_support::{
    backend_and_client, client, eventually, python, refused, suite_url, unique, with_client_cert,
    Harness,
};
use tokio::time::{sleep, timeout};

/// Starts a cluster that fails no primary over by itself (its nodes time
/// out after 5 s), letting the runtime's other tasks run meanwhile.
async fn start() -> RedisCluster {
    tokio::task::block_in_place(RedisCluster::start_steady)
}

/// Subscribers of a sharded channel on the node that serves it.
fn shard_subscribers(node: &Redis, channel: &str) -> Option<i64> {
    match node.query(&["PUBSUB", "SHARDNUMSUB", channel]) {
        Ok(RespValue::Array(Some(reply))) => reply.get(1)?.as_int(),
        _ => None,
    }
}

/// A cluster connection of the test's own (commands routed by key).
async fn cluster_connection(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    let seeds: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port()))
        .collect();
    redis::cluster::ClusterClient::new(seeds)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_cluster() {
    let cluster = start().await;
    run_suite(Harness::new(suite_url(&cluster.url()))).await;
}

/// The suite over TLS: the nodes' ports and the cluster bus speak only TLS,
/// and only clients with a certificate of the cluster's CA are let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_a_cluster_over_tls() {
    let cluster = tokio::task::block_in_place(RedisCluster::start_tls);
    let ca = cluster.certificates().expect("a TLS cluster");
    let url = with_client_cert(&cluster.url(), ca, "suite");
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    // A client makes a TLS handshake with each of the six nodes: beside the
    // rest of the test suite on a busy 2-CPU machine, connects passed the
    // default 2 s connect timeout, even with four behaviours at a time.
    let url = locksmith_testkit::with_query(&suite_url(&url), "connect_timeout=10s");
    run_suite(Harness::new(url).at_most(4)).await;
}

/// A TLS-only cluster refuses a plaintext client and a TLS client without a
/// client certificate; one with a certificate of its CA gets a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_refuses_plaintext_and_certificateless_clients() {
    let cluster = tokio::task::block_in_place(RedisCluster::start_tls);
    let ca = cluster.certificates().expect("a TLS cluster");
    let nodes = cluster
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect::<Vec<_>>()
        .join(",");
    refused(&format!("redis+cluster://{nodes}")).await;
    refused(&cluster.url()).await;
    let url = with_client_cert(&cluster.url(), ca, "client");
    let client = client(&url, Duration::from_secs(10)).await;
    let guard = client.lock(unique("tls").as_str()).acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// Hundreds of locks over hundreds of slots on all three primaries stay held
/// past several leases (the watchdog renews them slot by slot; one script
/// across slots would fail with CROSSSLOT), are listed from every primary, and
/// multi-locks take names in different slots all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_in_many_slots_and_multi_locks_across_slots() {
    let cluster = start().await;
    // Not the suites' short 1 s: the nodes fsync every write, and in a whole
    // run a disk busy with other tests kept one renewal round out past a 1 s
    // lease ("its lease ended before the watchdog could renew it").
    let ttl = Duration::from_secs(3);
    let (backend, holder) = backend_and_client(&cluster.url(), ttl).await;
    let prefix = unique("slots");
    // Names in 300 different slots. Taken as they come, 300 names share
    // slots unevenly: CRC16 is linear, and for about one prefix in 130 they
    // fall in 250 slots or fewer.
    let mut slots = HashSet::new();
    let names: Vec<String> = (0..)
        .map(|i| format!("{prefix}/lock-{i}"))
        .filter(|name| slots.insert(Slot::for_key(name)))
        .take(300)
        .collect();
    let primaries: HashSet<u16> = names
        .iter()
        .take(30)
        .map(|n| cluster.primary_of(n).unwrap().port())
        .collect();
    assert_eq!(primaries.len(), 3, "the locks live on every primary");
    let mut guards = Vec::new();
    for name in &names {
        guards.push(holder.lock(name.as_str()).acquire().await.unwrap());
    }
    // On failure, say which holds were lost and why.
    let lost = || -> Vec<String> {
        guards
            .iter()
            .filter_map(|guard| guard.lost_signal().reason())
            .collect()
    };
    assert_eq!(backend.watched_holds(), names.len(), "lost: {:?}", lost());
    sleep(ttl * 3).await;
    assert_eq!(lost(), Vec::<String>::new());
    let listed = holder.list(&format!("{prefix}/")).await.unwrap();
    let listed_names: HashSet<&str> = listed.iter().map(|info| info.name.as_str()).collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !listed_names.contains(name.as_str()))
        .collect();
    assert!(
        listed.len() == names.len() && missing.is_empty(),
        "every primary is scanned: {} listed, missing {} (the first: {:?})",
        listed.len(),
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );

    let other = client(&cluster.url(), ttl).await;
    let spread: Vec<String> = (0..3).map(|i| format!("{prefix}/multi-{i}")).collect();
    let slots: HashSet<Slot> = spread.iter().map(Slot::for_key).collect();
    assert_eq!(slots.len(), 3);
    let all = other
        .multi_lock(spread.iter().map(String::as_str))
        .acquire()
        .await
        .unwrap();
    for name in &spread {
        let info = other.describe(name).await.unwrap().expect("held");
        assert_eq!(info.holders[0].mode, Mode::Exclusive);
    }
    let overlapping = [spread[2].as_str(), names[0].as_str()];
    assert!(holder
        .multi_lock(overlapping)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(
        holder
            .describe(&spread[2])
            .await
            .unwrap()
            .unwrap()
            .holders
            .len()
            == 1,
        "all or nothing: the failed multi-lock took nothing"
    );
    all.release().await.unwrap();
    for guard in guards {
        guard.release().await.unwrap();
    }

    // A name whose braces would split the lock's keys over slots is refused.
    let error = holder.lock("split{").try_acquire().await.unwrap_err();
    assert!(
        matches!(&error, Error::Unsupported { what, .. } if what.contains("hash slot")),
        "{error:?}"
    );
    let tagged = holder.lock("orders{42}").try_acquire().await.unwrap();
    assert!(tagged.is_some(), "a name with a proper hash tag works");
}

const REDIS_PY_CLUSTER_LOCK: &str = r#"
import sys
from redis.cluster import RedisCluster
port, name = int(sys.argv[1]), sys.argv[2]
lock = RedisCluster(host='127.0.0.1', port=port).lock(name, timeout=30)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == 'acquire':
        print('acquired' if lock.acquire(blocking=False) else 'busy', flush=True)
    elif cmd == 'release':
        lock.release()
        print('released', flush=True)
    else:
        break
"#;

/// redis-py's `Lock` on a `RedisCluster` and locksmith's simple mode exclude
/// each other; Redisson's RLock (publishing with SPUBLISH, as it does on a
/// cluster) and locksmith's default layout exclude each other and wake each
/// other's waiters on the lock's shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_redisson_interoperate_on_a_cluster() {
    let cluster = start().await;
    let wait = Duration::from_secs(20);

    let simple = client(
        &format!("{}?mode=simple", cluster.url()),
        Duration::from_secs(3),
    )
    .await;
    let name = unique("redis-py");
    drop(python("pass"));
    let mut py = redis_support::ChildLines::new(
        std::process::Command::new("python3")
            .args([
                "-u",
                "-c",
                REDIS_PY_CLUSTER_LOCK,
                &cluster.nodes()[0].port().to_string(),
                &name,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn python3"),
    );
    py.send("acquire");
    assert_eq!(py.next(wait).await, "acquired");
    assert!(
        simple
            .lock(name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "redis-py's lock keeps locksmith out"
    );
    py.send("release");
    assert_eq!(py.next(wait).await, "released");
    let guard = simple
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    py.send("acquire");
    assert_eq!(py.next(wait).await, "busy", "locksmith keeps redis-py out");
    guard.release().await.unwrap();
    py.send("acquire");
    assert_eq!(py.next(wait).await, "acquired");
    py.send("release");
    assert_eq!(py.next(wait).await, "released");
    py.send("quit");

    let ours = client(&cluster.url(), Duration::from_secs(30)).await;
    let mut java = Redisson::on(cluster_connection(&cluster).await, "spublish");
    let name = unique("redisson");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let shard = cluster.primary_of(&name).unwrap();
    assert_eq!(
        java.try_lock(&name, 30_000).await,
        None,
        "Redisson takes it"
    );
    assert!(ours
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn({
        let lock = ours.lock(name.as_str());
        async move { lock.acquire().await }
    });
    eventually(
        Duration::from_secs(10),
        "the waiter listens on the lock's shard",
        || shard_subscribers(shard, &channel) == Some(1),
    )
    .await;
    assert_eq!(java.unlock(&name).await, Some(1));
    let guard = timeout(wait, waiter)
        .await
        .expect("woken by Redisson's unlock")
        .unwrap()
        .unwrap();
    assert!(
        java.try_lock(&name, 30_000)
            .await
            .is_some_and(|pttl| pttl > 0),
        "Redisson is refused"
    );

    // locksmith's release reaches a Redisson waiter's sharded subscription.
    let (pushes_to, mut pushes) = tokio::sync::mpsc::unbounded_channel();
    let seeds: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port()))
        .collect();
    let mut listener = redis::cluster::ClusterClientBuilder::new(seeds)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes_to)
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    listener.ssubscribe(&channel).await.unwrap();
    guard.release().await.unwrap();
    let message = timeout(wait, async {
        loop {
            let push = pushes.recv().await.expect("push channel open");
            if push.kind == redis::PushKind::SMessage {
                return push.data;
            }
        }
    })
    .await
    .expect("locksmith's release is published on the shard");
    assert_eq!(
        message,
        [
            redis::Value::BulkString(channel.into_bytes()),
            redis::Value::BulkString(b"0".to_vec())
        ]
    );
    assert_eq!(java.try_lock(&name, 30_000).await, None);
}

/// A primary fails over while a lock is held and another client waits: the
/// hold is on the promoted replica (the grant waited for it) and the holder
/// releases it there; the promoted replica, with no replica of its own, grants
/// nothing until the old primary is back as its replica; then the waiter gets
/// the lock with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_failover_keeps_acknowledged_holds() {
    // Nodes that time out after 1 s, for a quick failover.
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let ttl = Duration::from_secs(30);
    let holder = client(&cluster.url(), ttl).await;
    let waiting = client(&cluster.url(), ttl).await;
    let name = unique("failover");
    let held = holder.lock(name.as_str()).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = waiting.lock(name.as_str());
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    let old = cluster.primary_of(&name).unwrap();
    let channel = format!("redisson_lock__channel:{{{name}}}");
    eventually(
        Duration::from_secs(10),
        "the waiter listens on the shard",
        || shard_subscribers(old, &channel) == Some(1),
    )
    .await;

    old.kill();
    tokio::task::block_in_place(|| cluster.wait_for_failover(old)).unwrap();
    let new = cluster.primary_of(&name).unwrap();
    assert_ne!(new.port(), old.port());
    assert_eq!(
        new.query(&["HGET", &name, "mode"]).unwrap().as_str(),
        Some("write"),
        "the promoted replica has the hold"
    );
    let token = held.fencing_token();
    held.release()
        .await
        .expect("released on the promoted replica");
    let other = client(&cluster.url(), ttl).await;
    let attempt = other.lock(name.as_str()).try_acquire().await;
    assert!(
        !matches!(attempt, Ok(Some(_))),
        "no replica can acknowledge a grant on the promoted replica: {attempt:?}"
    );
    old.restart();
    tokio::task::block_in_place(|| cluster.wait_healthy()).unwrap();
    let next = waiter.await.unwrap().expect("the waiter gets the lock");
    assert!(
        next.fencing_token() > token,
        "tokens go on from the replica's counter"
    );
    next.release().await.unwrap();
}
