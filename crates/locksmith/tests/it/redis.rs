//! The conformance suite and the Redis-specific tests, against real
//! `redis-server` processes started by locksmith-testkit.
//!
//! The suite runs four times: on the default Redisson RLock layout, on the fair
//! (FIFO) layout, on the redis-py compatible simple layout, and on Redlock over
//! five servers; its harness lets a client's keys lapse (expired session) and
//! cuts its connection (its own fault proxies). Fault tests that stop or flush
//! a server get servers of their own.

use crate::redis_support;

use std::time::Duration;

use redis_support::{shared_redis, shared_redlock, Harness};

async fn harness(query: &str) -> Harness {
    let redis = shared_redis();
    Harness::on(format!("{}{query}", redis.url()), vec![redis])
}

async fn redlock_harness() -> Harness {
    let nodes = shared_redlock();
    Harness::on(redlock_url(nodes), nodes.iter().collect())
}

/// Default mode: Redisson's RLock layout.
mod rlock {
    use super::*;
    locksmith_testkit::conformance_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("")
    );
}

/// `mode=fair`: FIFO, so the suite's ordering tests run too.
mod fair {
    use super::*;
    locksmith_testkit::conformance_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("?mode=fair")
    );
}

/// `mode=simple`: redis-py's `SET NX PX` layout for exclusive locks.
mod simple {
    use super::*;
    locksmith_testkit::conformance_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("?mode=simple")
    );
}

/// Redlock over five independent servers.
mod redlock {
    use super::*;
    locksmith_testkit::conformance_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        redlock_harness()
    );
}

// ---------------------------------------------------------------------------
// Redis-specific behaviour.
// ---------------------------------------------------------------------------

use futures::StreamExt;
use locksmith::{Client, Error, Mode, Undo};
use locksmith_testkit::proxy::{self, Route};
use locksmith_testkit::Redis;
use redis::AsyncCommands;
use redis_support::redisson::Redisson;
use redis_support::{
    backend_and_client, client, eventually, python, raw, redlock_url, unique, ChildLines,
};
use tokio::time::{sleep, timeout, Instant};

/// A resource that refuses writes with a token lower than the highest it saw.
async fn fenced_write(url: &str, name: &str, token: u64, value: &str) -> bool {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let accepted: i64 = redis::Script::new(
        "local cur = tonumber(redis.call('GET', KEYS[1]) or '0') \
         if tonumber(ARGV[1]) < cur then return 0 end \
         redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[2]) return 1",
    )
    .key(format!("fence-test:{name}:token"))
    .key(format!("fence-test:{name}:value"))
    .arg(token)
    .arg(value)
    .invoke_async(&mut conn)
    .await
    .unwrap();
    accepted == 1
}

fn backend_message(error: &Error) -> String {
    match error {
        Error::Backend { source, .. } => source.to_string(),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_redissons() {
    let redis = shared_redis();
    let (backend, client) = backend_and_client(&redis.url(), Duration::from_secs(30)).await;
    let mut conn = raw(redis).await;
    let name = unique("layout");
    let mut pubsub = redis::Client::open(redis.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    let lock_channel = format!("redisson_lock__channel:{{{name}}}");
    let rw_channel = format!("redisson_rwlock:{{{name}}}");
    pubsub.subscribe(&lock_channel).await.unwrap();
    pubsub.subscribe(&rw_channel).await.unwrap();

    let guard = client
        .lock(name.as_str())
        .owner("worker")
        .acquire()
        .await
        .unwrap();
    let field = format!("{}:worker", backend.client_id());
    let count: Option<String> = conn.hget(&name, &field).await.unwrap();
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "RLock field <client uuid>:<owner>"
    );
    let mode: Option<String> = conn.hget(&name, "mode").await.unwrap();
    assert_eq!(mode.as_deref(), Some("write"));
    let pttl: i64 = conn.pttl(&name).await.unwrap();
    assert!(
        (20_000..=30_000).contains(&pttl),
        "watchdog lease, got {pttl}"
    );
    let token: u64 = conn
        .get(format!("redisson_lock_token:{{{name}}}"))
        .await
        .unwrap();
    assert_eq!(token, guard.fencing_token(), "RFencedLock token key");
    let meta: String = conn
        .hget(format!("locksmith_meta:{{{name}}}"), &field)
        .await
        .unwrap();
    assert!(meta.starts_with(&format!("{token} ")), "metadata {meta:?}");

    // Re-entry keeps the token and counts in the hash.
    let again = client
        .lock(name.as_str())
        .owner("worker")
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.fencing_token(), token);
    let count: String = conn.hget(&name, &field).await.unwrap();
    assert_eq!(count, "2");
    again.release().await.unwrap();

    guard.release().await.unwrap();
    let mut got = Vec::new();
    let mut messages = pubsub.on_message();
    for _ in 0..2 {
        let message = timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("release message")
            .unwrap();
        got.push((
            message.get_channel_name().to_owned(),
            message.get_payload::<String>().unwrap(),
        ));
    }
    got.sort();
    let mut expected = vec![(lock_channel, "0".to_owned()), (rw_channel, "1".to_owned())];
    expected.sort();
    assert_eq!(
        got, expected,
        "Redisson's channels and UNLOCK/READ_UNLOCK messages"
    );
    let left: i64 = conn
        .exists(&[name.clone(), format!("locksmith_meta:{{{name}}}")])
        .await
        .unwrap();
    assert_eq!(left, 0, "release leaves no hold and no metadata behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_rlock_and_locksmith_exclude_each_other() {
    let redis = shared_redis();
    let ours = client(&redis.url(), Duration::from_secs(30)).await;
    let mut java = Redisson::new(raw(redis).await);
    let name = unique("redisson");

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
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert_eq!(java.unlock(&name).await, Some(1));
    let guard = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by Redisson's unlock message")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by pub/sub, not by the 30 s lease"
    );

    let pttl = java.try_lock(&name, 30_000).await;
    assert!(pttl.is_some_and(|t| t > 0), "Redisson is refused: {pttl:?}");
    let mut pubsub = redis::Client::open(redis.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub
        .subscribe(format!("redisson_lock__channel:{{{name}}}"))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let message = timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .expect("Redisson's waiters are told")
        .unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
    assert_eq!(java.try_lock(&name, 30_000).await, None);
    assert_eq!(java.unlock(&name).await, Some(1));
}

/// Re-entry is counted by the client and written where Redisson keeps it:
/// a read hold re-entered once has the hash field 2 and the timeout keys of
/// levels 1 and 2 (Redisson's read unlock and renewal walk them), and each
/// release takes one level off the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentered_read_hold_keeps_redissons_levels() {
    let redis = shared_redis();
    let (backend, client) = backend_and_client(&redis.url(), Duration::from_secs(30)).await;
    let mut conn = raw(redis).await;
    let name = unique("read-levels");
    let lock = client.rw_lock(name.as_str()).read().owner("reader");
    let first = lock.acquire().await.unwrap();
    let second = lock.acquire().await.unwrap();
    assert_eq!(first.fencing_token(), second.fencing_token());
    let field = format!("{}:reader", backend.client_id());
    let level = |n: u32| format!("{{{name}}}:{field}:rwlock_timeout:{n}");
    let count: String = conn.hget(&name, &field).await.unwrap();
    assert_eq!(count, "2", "the hash field is the depth");
    for n in 1..=2 {
        let pttl: i64 = conn.pttl(level(n)).await.unwrap();
        assert!(pttl > 0, "level {n}'s timeout key: {pttl}");
    }
    second.release().await.unwrap();
    let count: String = conn.hget(&name, &field).await.unwrap();
    assert_eq!(count, "1");
    let levels: i64 = conn.exists(&[level(1), level(2)]).await.unwrap();
    assert_eq!(levels, 1, "level 2's key went with its level");
    first.release().await.unwrap();
    let left: i64 = conn.exists(&[name.clone(), level(1)]).await.unwrap();
    assert_eq!(left, 0, "the last release ends the hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_read_write_lock_interop() {
    let redis = shared_redis();
    let ours = client(&redis.url(), Duration::from_secs(30)).await;
    let mut java = Redisson::new(raw(redis).await);
    let name = unique("redisson-rw");

    assert_eq!(java.try_read_lock(&name, 30_000).await, None);
    assert!(
        ours.rw_lock(name.as_str())
            .write()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a Redisson reader keeps locksmith writers out"
    );
    let reader = ours
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("readers share with Redisson readers");
    reader.release().await.unwrap();
    assert!(
        ours.rw_lock(name.as_str())
            .write()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "Redisson's read hold survives a locksmith reader's release"
    );
    let info = ours.describe(&name).await.unwrap().expect("held");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].mode, Mode::Shared);

    // A locksmith reader survives a Redisson reader's release (its timeout key
    // keeps the hash alive, Redisson's own rule).
    let reader = ours
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("reader");
    assert_eq!(java.read_unlock(&name).await, Some(0));
    let info = ours.describe(&name).await.unwrap().expect("still held");
    assert_eq!(info.holders.len(), 1);
    reader.release().await.unwrap();
    assert!(ours.describe(&name).await.unwrap().is_none());

    let writer = ours
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(
        java.try_read_lock(&name, 30_000).await.is_some(),
        "Redisson readers see a locksmith writer"
    );
    assert!(
        java.try_lock(&name, 30_000).await.is_some(),
        "Redisson RLock users see it too"
    );
    writer.release().await.unwrap();
}

const REDIS_PY_LOCK: &str = r#"
import sys, redis
port, name = int(sys.argv[1]), sys.argv[2]
lock = redis.Redis(host='127.0.0.1', port=port).lock(name, timeout=30)
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

fn redis_py_lock(port: u16, name: &str) -> ChildLines {
    let mut child = std::process::Command::new("python3");
    child
        .args(["-u", "-c", REDIS_PY_LOCK, &port.to_string(), name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    // `python` checks that redis-py is installed first.
    drop(python("pass"));
    ChildLines::new(child.spawn().expect("spawn python3"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_and_simple_mode_exclude_each_other() {
    let redis = shared_redis();
    let simple = client(
        &format!("{}?mode=simple", redis.url()),
        Duration::from_secs(3),
    )
    .await;
    let default = client(&redis.url(), Duration::from_secs(3)).await;
    let name = unique("redis-py");
    let mut py = redis_py_lock(redis.port(), &name);
    let wait = Duration::from_secs(20);

    py.send("acquire");
    assert_eq!(py.next(wait).await, "acquired");
    assert!(
        simple
            .lock(name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "redis-py's lock keeps simple mode out"
    );
    assert!(
        default
            .lock(name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "and the hash layout"
    );
    let waiter = tokio::spawn({
        let lock = simple.lock(name.as_str());
        async move { lock.acquire_timeout(Duration::from_secs(10)).await }
    });
    sleep(Duration::from_millis(200)).await;
    py.send("release");
    assert_eq!(py.next(wait).await, "released");
    let guard = waiter.await.unwrap().expect("free after redis-py released");

    let mut conn = raw(redis).await;
    let value: String = conn.get(&name).await.unwrap();
    assert!(value.ends_with(":0") || value.contains(':'), "{value}");
    let pttl: i64 = conn.pttl(&name).await.unwrap();
    assert!(pttl > 0, "SET NX PX: the string carries the lease");

    py.send("acquire");
    assert_eq!(py.next(wait).await, "busy", "locksmith keeps redis-py out");
    guard.release().await.unwrap();
    py.send("acquire");
    assert_eq!(py.next(wait).await, "acquired");
    py.send("release");
    assert_eq!(py.next(wait).await, "released");
    py.send("quit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_survive_a_redis_restart() {
    let redis = Redis::start();
    let ttl = Duration::from_secs(2);
    let (a, b) = (
        client(&redis.url(), ttl).await,
        client(&redis.url(), ttl).await,
    );
    let names: Vec<String> = (0..3).map(|i| unique(&format!("restart-{i}"))).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(a.lock(name.as_str()).acquire().await.unwrap());
    }
    let token_before = guards[0].fencing_token();
    let waiter = tokio::spawn({
        let lock = b.lock(names[0].as_str());
        async move { lock.acquire().await }
    });
    sleep(Duration::from_millis(300)).await;

    // kill -9; the append-only file (fsync always) keeps the holds.
    redis.kill();
    redis.restart();
    sleep(ttl * 2).await;
    for guard in &guards {
        assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    }
    for name in &names[1..] {
        assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    }
    let first = guards.remove(0);
    first.release().await.expect("renewed across the restart");
    let next = timeout(ttl * 3, waiter)
        .await
        .expect("the waiter re-subscribed after the restart")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token_before, "tokens never go back");
    next.release().await.unwrap();
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_redis_loses_the_holds() {
    let redis = Redis::start();
    let ttl = Duration::from_secs(1);
    let c = client(&redis.url(), ttl).await;
    let watched = c.lock(unique("flush-a").as_str()).acquire().await.unwrap();
    let leased = c
        .lock(unique("flush-b").as_str())
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let mut conn = raw(&redis).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let reason = timeout(ttl * 3, watched.lost())
        .await
        .expect("renewal finds the hold gone");
    assert!(reason.contains("no longer held"), "{reason}");
    timeout(ttl * 3, leased.lost())
        .await
        .expect("the check of a leased hold finds it gone");
    assert!(matches!(watched.release().await, Err(Error::Lost(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_works_with_two_of_five_nodes_down() {
    let nodes: Vec<Redis> = (0..5).map(|_| Redis::start()).collect();
    let url = redlock_url(&nodes);
    let ttl = Duration::from_secs(1);
    let (a, b) = (client(&url, ttl).await, client(&url, ttl).await);
    nodes[0].kill();
    nodes[3].kill();
    let late = client(&url, ttl).await;
    let name = unique("redlock-2-down");
    let mut last = 0;
    for round in 0..6 {
        let (c, other) = if round % 2 == 0 {
            (&a, &late)
        } else {
            (&late, &b)
        };
        let guard = c
            .lock(name.as_str())
            .acquire_timeout(Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            guard.fencing_token() > last,
            "token {} after {last}",
            guard.fencing_token()
        );
        last = guard.fencing_token();
        assert!(other
            .lock(name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        guard.release().await.unwrap();
    }
    let guard = a.lock(name.as_str()).acquire().await.unwrap();
    sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    guard.release().await.unwrap();

    // A waiter listens for releases on every node at once and goes on once a
    // majority confirmed. It used to wait for each node's confirmation in
    // turn, two seconds for each node that was down, before its next
    // attempt: here 4 s before it saw that a lease of 300 ms had ended.
    let waited = wait_behind_a_short_lease(&a, &b, &name).await;
    assert!(
        waited < Duration::from_secs(2),
        "the waiter was granted {waited:?} after it asked, for a lease of 300 ms"
    );
}

/// `b` acquires `name` while `a` holds it with a lease of 300 ms, and is
/// granted after it with a larger token; returns how long `b` waited.
async fn wait_behind_a_short_lease(a: &Client, b: &Client, name: &str) -> Duration {
    let leased = a
        .lock(name)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let asked = Instant::now();
    let waiter = b
        .lock(name)
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert!(waiter.fencing_token() > leased.fencing_token());
    waiter.release().await.unwrap();
    waited
}

/// Two masters of five cut off without an answer (a partition drops the
/// packets; a refusal would be told at once): every call goes on at the
/// pace of the three that answer, each node's share bounded by the node
/// timeout. A release, a waiter's busy attempt (which gives back what it
/// may have taken) and an extension waited for every node's answer, so for
/// the connection's response timeout (5 s), before. A hold the watchdog
/// renews outlives the silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_goes_on_with_two_masters_partitioned_away() {
    let route = Route::start(&redlock_url(shared_redlock())).await.unwrap();
    let ttl = Duration::from_secs(1);
    let (a, b) = (
        client(route.url(), ttl).await,
        client(route.url(), ttl).await,
    );
    for proxy in &route.proxies()[3..] {
        proxy.set(proxy::Mode::Blackhole);
    }
    let name = unique("redlock-partitioned");
    let started = Instant::now();
    let guard = a
        .lock(name.as_str())
        .lease(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    guard.extend(Duration::from_secs(2)).await.unwrap();
    guard.release().await.unwrap();
    wait_behind_a_short_lease(&a, &b, &name).await;
    let took = started.elapsed();
    // A hold the watchdog renews, granted by the three that answer,
    // outlives the silence: they renew it.
    let kept = a.lock(name.as_str()).acquire().await.unwrap();
    // Listing asks every master, the silent ones each for a node timeout
    // at most, at once: not one after the other for a response timeout.
    let listing = Instant::now();
    let listed = a.list(&name).await.unwrap();
    let listing = listing.elapsed();
    assert_eq!(
        listed
            .iter()
            .map(|info| info.name.as_str())
            .collect::<Vec<_>>(),
        [name.as_str()]
    );
    sleep(ttl * 3).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_signal().reason());
    kept.release().await.unwrap();
    assert!(
        listing < Duration::from_secs(2),
        "listing took {listing:?} with two masters silent"
    );
    assert!(
        took < Duration::from_secs(4),
        "two grants, an extension, two releases and a wait behind a 300 ms \
         lease took {took:?} with two masters silent"
    );
    for proxy in route.proxies() {
        proxy.set(proxy::Mode::Pass);
    }
}

/// A release that did not reach one master leaves the owner's level there; the
/// owner's next acquire must not take that leftover for a re-entry (with the
/// old token) but clear it and get a fresh grant with a fresh token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_clears_a_level_a_release_did_not_reach() {
    let nodes: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let c = client(&redlock_url(&nodes), Duration::from_secs(30)).await;
    let name = unique("leftover");
    let lock = c.lock(name.as_str()).owner("worker");
    let first = lock.acquire().await.unwrap();
    let token = first.fencing_token();
    nodes[2].kill();
    first.release().await.expect("a majority released it");
    nodes[2].restart();
    assert_eq!(
        nodes[2].query(&["EXISTS", &name]).unwrap().as_int(),
        Some(1),
        "the restarted master kept the level the release missed"
    );
    let second = lock.acquire().await.unwrap();
    assert!(
        second.fencing_token() > token,
        "a fresh grant gets a fresh token, not the leftover's ({} after {token})",
        second.fencing_token()
    );
    second.release().await.unwrap();
    assert_eq!(
        nodes[2].query(&["EXISTS", &name]).unwrap().as_int(),
        Some(0),
        "the leftover level is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_fails_cleanly_with_three_of_five_nodes_down() {
    let nodes: Vec<Redis> = (0..5).map(|_| Redis::start()).collect();
    let url = redlock_url(&nodes);
    let ttl = Duration::from_secs(1);
    let a = client(&url, ttl).await;
    let held = a
        .lock(unique("redlock-held").as_str())
        .acquire()
        .await
        .unwrap();
    for node in &nodes[..3] {
        node.kill();
    }
    let name = unique("redlock-3-down");
    let started = Instant::now();
    let error = a.lock(name.as_str()).try_acquire().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "fails fast");
    let message = backend_message(&error);
    assert!(
        message.contains("needs 3 of 5") && message.contains("only 2 answered"),
        "{message}"
    );
    let error = a
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::Backend { .. }),
        "a waiting acquire gives up with the reason, not a timeout: {error:?}"
    );
    timeout(ttl * 3, held.lost())
        .await
        .expect("no majority renews the hold");
    let error = locksmith::Client::connect(&url).await.unwrap_err();
    assert!(
        backend_message(&error).contains("only 2 answered"),
        "{error}"
    );
}

/// The helper process of `sigstop_holder_past_lease`: holds a lock until told
/// it is lost, then tries a fenced write with its (stale) token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of sigstop_holder_past_lease"]
async fn sigstop_child() {
    let (Ok(url), Ok(name)) = (
        std::env::var("LOCKSMITH_TEST_REDIS_URL"),
        std::env::var("LOCKSMITH_TEST_LOCK"),
    ) else {
        return;
    };
    let c = client(&url, Duration::from_secs(1)).await;
    let guard = c.lock(name.as_str()).acquire().await.unwrap();
    println!("TOKEN {}", guard.fencing_token());
    let reason = guard.lost().await;
    println!("LOST {reason}");
    let accepted = fenced_write(&url, &name, guard.fencing_token(), "stale holder").await;
    println!("WRITE {}", if accepted { "accepted" } else { "rejected" });
}

/// A holder process is frozen (SIGSTOP) past its watchdog lease: the lock
/// passes on with a higher token, and when the holder wakes its lost() fires and
/// the fenced resource rejects its stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_holder_past_lease() {
    let redis = shared_redis();
    let url = redis.url();
    let name = unique("sigstop");
    // The child's name as libtest knows it: its module path without the
    // binary's crate name.
    let child_test = concat!(module_path!(), "::sigstop_child");
    let child_test = child_test.split_once("::").unwrap().1;
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOCKSMITH_TEST_REDIS_URL", &url)
        .env("LOCKSMITH_TEST_LOCK", &name)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildLines::new(child);
    let wait = Duration::from_secs(30);
    let token = loop {
        // libtest prints "test redis::sigstop_child ... " before the child's first line.
        let line = child.next(wait).await;
        if let Some((_, token)) = line.split_once("TOKEN ") {
            break token.trim().parse::<u64>().unwrap();
        }
    };
    assert!(fenced_write(&url, &name, token, "holder").await);
    let pid = child.child.id().to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let successor = client(&url, Duration::from_secs(30)).await;
    let guard = successor
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the frozen holder's lease ends");
    assert!(guard.fencing_token() > token);
    assert!(fenced_write(&url, &name, guard.fencing_token(), "successor").await);
    signal("-CONT");
    let lost = loop {
        let line = child.next(wait).await;
        if line.contains("LOST ") {
            break line;
        }
    };
    assert!(lost.contains("lease"), "{lost}");
    assert_eq!(child.next(wait).await, "WRITE rejected");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_or_fail() {
    let primary = Redis::start();
    let replica = Redis::start_replica_of(&primary);
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", primary.url());
    let c = client(&url, Duration::from_secs(30)).await;
    let name = unique("wait");
    let guard = c.lock(name.as_str()).acquire().await.unwrap();
    let on_replica = replica.query(&["HGET", &name, "mode"]).unwrap();
    assert_eq!(
        on_replica.as_str(),
        Some("write"),
        "WAIT returned: the replica has it"
    );
    guard.release().await.unwrap();

    replica.pause();
    let other = unique("wait-unreplicated");
    let started = Instant::now();
    let error = c.lock(other.as_str()).try_acquire().await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(&error, Error::Unreplicated(report)
            if (report.acknowledged, report.asked) == (0, 1) && report.undo == Undo::GivenBack),
        "{error:?}"
    );
    assert!(error.to_string().contains("0 of 1 replicas"), "{error}");
    let plain = client(&primary.url(), Duration::from_secs(30)).await;
    assert!(
        plain
            .lock(other.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "the unreplicated grant was released"
    );
    replica.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_by_pubsub_and_unsubscribe() {
    let redis = shared_redis();
    let holder = client(&redis.url(), Duration::from_secs(30)).await;
    let (backend, waiting) = backend_and_client(&redis.url(), Duration::from_secs(30)).await;
    let name = unique("pubsub");
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let held = holder.lock(name.as_str()).acquire().await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let lock = waiting.lock(name.as_str());
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            sleep(Duration::from_millis(5)).await;
            guard.release().await.unwrap();
        }));
    }
    let conn = raw(redis).await;
    eventually(
        Duration::from_secs(5),
        "three waiters on one channel",
        || backend.subscribed_channels() == 1,
    )
    .await;
    let numsub = |mut conn: redis::aio::MultiplexedConnection| {
        let channel = channel.clone();
        async move {
            let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .unwrap();
            subscribers
        }
    };
    let started = Instant::now();
    while numsub(conn.clone()).await != 1 {
        assert!(started.elapsed() < Duration::from_secs(5), "not subscribed");
        sleep(Duration::from_millis(10)).await;
    }
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        numsub(conn.clone()).await,
        1,
        "one shared subscription connection per client"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    for waiter in waiters {
        timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by pub/sub")
            .unwrap();
    }
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "three hand-offs by messages, not by the 30 s lease"
    );
    eventually(Duration::from_secs(5), "listeners dropped", || {
        backend.subscribed_channels() == 0
    })
    .await;
    let started = Instant::now();
    while numsub(conn.clone()).await != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still subscribed"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_release_costs_one_bounded_recheck() {
    let redis = shared_redis();
    let mut conn = raw(redis).await;
    let name = unique("missed");
    // Counted from before the hold's expiry is set, so that the bounds hold
    // however long connecting takes on a loaded machine.
    let started = Instant::now();
    // A crashed Redisson holder: its hold just expires, nobody publishes.
    let _: () = redis::pipe()
        .hset(&name, "00000000-0000-0000-0000-000000000000:1", 1)
        .pexpire(&name, 800)
        .query_async(&mut conn)
        .await
        .unwrap();
    let c = client(&redis.url(), Duration::from_secs(30)).await;
    let guard = c
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(20))
        .await
        .unwrap();
    // Not before the hold ran out, and at the re-check its TTL asked for,
    // well before the one a third of the session TTL (10 s) would bring.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(5),
        "re-checked when the holder's TTL ran out, after {waited:?}"
    );
    guard.release().await.unwrap();
}

async fn evalsha_calls(redis: &Redis) -> u64 {
    let mut conn = raw(redis).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renews_in_batches_of_one_hundred() {
    let redis = Redis::start();
    let ttl = Duration::from_millis(1500);
    let (backend, c) = backend_and_client(&redis.url(), ttl).await;
    let mut guards = Vec::new();
    for i in 0..250 {
        guards.push(c.lock(format!("batch/{i}")).acquire().await.unwrap());
    }
    assert_eq!(backend.watched_holds(), 250);
    let before = evalsha_calls(&redis).await;
    sleep(ttl * 2).await; // six renewal periods
    let renewals = evalsha_calls(&redis).await - before;
    assert!(
        (3 * 4..=3 * 8).contains(&renewals),
        "250 holds over ~6 periods should take ~18 script calls, took {renewals}"
    );
    assert!(guards.iter().all(|g| !g.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(backend.watched_holds(), 0, "release stops renewal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_queue_drops_a_crashed_waiter() {
    let redis = shared_redis();
    let url = format!("{}?mode=fair", redis.url());
    let c = client(&url, Duration::from_secs(30)).await;
    let name = unique("ghost");
    let mut conn = raw(redis).await;
    // Counted from before the waiter's deadline is set, so that the lower
    // bound holds however long the calls before the acquire take.
    let started = Instant::now();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now = secs * 1000 + micros / 1000;
    let _: () = redis::pipe()
        .rpush(format!("redisson_lock_queue:{{{name}}}"), "ghost")
        .zadd(
            format!("redisson_lock_timeout:{{{name}}}"),
            "ghost",
            now + 1500,
        )
        .query_async(&mut conn)
        .await
        .unwrap();
    let info = c.describe(&name).await.unwrap().expect("a waiter");
    assert_eq!(info.waiters.len(), 1);
    assert_eq!(info.waiters[0].owner, "ghost");
    let guard = c
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(5),
        "waited for the crashed waiter's deadline only: {waited:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back() {
    let redis = shared_redis();
    let a = client(&redis.url(), Duration::from_secs(30)).await;
    let b = client(&redis.url(), Duration::from_secs(30)).await;
    let name = unique("permit");
    let permit = a
        .semaphore(name.as_str(), 1)
        .lease(Duration::from_millis(800))
        .acquire()
        .await
        .unwrap();
    // The holder "crashes": no release ever comes.
    std::mem::forget(permit);
    let started = Instant::now();
    let next = b
        .semaphore(name.as_str(), 1)
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut conn = raw(redis).await;
    let available: i64 = conn.get(&name).await.unwrap();
    assert_eq!(
        available, 0,
        "Redisson's layout: the name counts available permits"
    );
    let holders: i64 = conn.zcard(format!("{{{name}}}:timeout")).await.unwrap();
    assert_eq!(holders, 1, "one live permit in the expiry zset");
    next.release().await.unwrap();
    let available: i64 = conn.get(&name).await.unwrap();
    assert_eq!(available, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_missing_servers_are_clear_errors() {
    for bad in [
        "redis://127.0.0.1:6379?mode=quick",
        "redis://127.0.0.1:6379?bogus=1",
        "redis+redlock://a:1,b:2,c:3?mode=fair",
        "redis://127.0.0.1:6379?wait_replicas=many",
    ] {
        assert!(
            matches!(
                locksmith::Client::connect(bad).await,
                Err(Error::InvalidUrl { .. })
            ),
            "{bad} accepted"
        );
    }
    let port = locksmith_testkit::free_port();
    let started = Instant::now();
    let error = locksmith::Client::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        backend_message(&error).contains("cannot connect"),
        "{error}"
    );
    let redlock = client(
        &format!("{}?mode=simple", redlock_url(shared_redlock())),
        Duration::from_secs(30),
    )
    .await;
    assert!(matches!(
        redlock
            .semaphore(unique("sem").as_str(), 2)
            .try_acquire()
            .await,
        Err(Error::Unsupported { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca() {
    let server = tokio::task::block_in_place(Redis::start_tls);
    let port = server.port();
    let ca = server.certificates().expect("a TLS Redis");
    let url = redis_support::with_client_cert(&server.url(), ca, "client");
    let (a, b) = (
        client(&url, Duration::from_secs(30)).await,
        client(&url, Duration::from_secs(30)).await,
    );
    let name = unique("tls");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(name.as_str());
        async move { lock.acquire().await }
    });
    sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let next = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken over the TLS subscription")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
    // Without the CA the server's certificate is refused; without a client
    // certificate the client is.
    redis_support::refused(&format!("rediss://127.0.0.1:{port}")).await;
    redis_support::refused(&server.url()).await;
}

/// Acquires dropped at every possible moment (before, during and after the
/// script call, while waiting) never leave a hold or a queue entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_nothing_behind() {
    for query in ["", "?mode=fair"] {
        let url = format!("{}{query}", shared_redis().url());
        let c = client(&url, Duration::from_secs(30)).await;
        let name = unique("drop-anywhere");
        let holder = client(&url, Duration::from_secs(30)).await;
        for i in 0..200u64 {
            // Every other round the lock is held, so the acquire queues and waits.
            let held = if i % 2 == 1 {
                Some(holder.lock(name.as_str()).acquire().await.unwrap())
            } else {
                None
            };
            let lock = c.lock(name.as_str());
            let task = tokio::spawn(async move { lock.acquire().await.map(std::mem::forget) });
            // Spread the aborts over the first milliseconds.
            tokio::time::sleep(Duration::from_micros((i * 37) % 1500)).await;
            task.abort();
            if let Some(held) = held {
                held.release().await.unwrap();
            }
            let completed = matches!(task.await, Ok(Ok(())));
            // Inspection first waits for this process's own background undo
            // work, so what it sees is final.
            let info = c.describe(&name).await.unwrap();
            if let Some(info) = &info {
                assert!(
                    info.waiters.is_empty(),
                    "{query}: queue entry left: {info:?}"
                );
            }
            match (
                completed,
                c.lock(name.as_str()).try_acquire().await.unwrap(),
            ) {
                (_, Some(guard)) => guard.release().await.unwrap(),
                // The acquire finished before the abort: its guard was forgotten.
                (true, None) => c.force_release(&name).await.unwrap(),
                (false, None) => panic!("{query}: cancelled acquire #{i} left a hold: {info:?}"),
            }
        }
        let info = c.describe(&name).await.unwrap();
        assert!(info.is_none(), "{query}: left behind {info:?}");
    }
}

/// A multi-lock on a store without atomic multi-locks takes its names one
/// at a time and gives back what it took when one is busy. Dropped while
/// it gives them back (here: while the answer to the first release is on
/// its way, delayed by a slow link), it leaves none of them held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_dropped_while_giving_parts_back_leaves_none_held() {
    let url = shared_redis().url();
    let base = unique("multi-give-back");
    let [first, second, busy] = ["a", "b", "c"].map(|part| format!("{base}/{part}"));
    let holder = client(&url, Duration::from_secs(30)).await;
    let _busy = holder.lock(busy.as_str()).acquire().await.unwrap();

    let route = Route::start(&url).await.unwrap();
    let slow = client(route.url(), Duration::from_secs(30)).await;
    route.set(proxy::Mode::Delay(Duration::from_millis(500)));
    let names = [first.clone(), second.clone(), busy.clone()];
    let task = tokio::spawn(async move { slow.multi_lock(names).try_acquire().await });
    let mut taken = false;
    until_given_back(&holder, &first, &mut taken).await;
    drop_midway(task).await;

    given_back(&holder, &first).await;
    given_back(&holder, &second).await;
    let info = holder.describe(&busy).await.unwrap().expect("still held");
    assert_eq!(info.holders.len(), 1);
}

/// The release of a multi-lock, dropped midway (here: while the answer to
/// one part's release is on a slow link), leaves no part held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_release_dropped_midway_leaves_no_part_held() {
    let url = shared_redis().url();
    let base = unique("multi-release-dropped");
    let names = ["a", "b", "c"].map(|part| format!("{base}/{part}"));
    let observer = client(&url, Duration::from_secs(30)).await;
    let route = Route::start(&url).await.unwrap();
    let slow = client(route.url(), Duration::from_secs(30)).await;
    let guard = slow.multi_lock(names.clone()).acquire().await.unwrap();
    route.set(proxy::Mode::Delay(Duration::from_millis(500)));
    let task = tokio::spawn(guard.release());
    let mut taken = true;
    until_given_back(&observer, &names[0], &mut taken).await;
    drop_midway(task).await;
    for name in &names {
        given_back(&observer, name).await;
    }
}

/// Waits until `name` is seen held (unless `taken` says it was) and then
/// free.
async fn until_given_back(observer: &locksmith::Client, name: &str, taken: &mut bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = observer.describe(name).await.unwrap();
        let held = info.is_some_and(|i| !i.holders.is_empty());
        match (*taken, held) {
            (false, true) => *taken = true,
            (true, false) => return,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never taken and given back"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// Drops the call of `task` (it waits for an answer on the slow link).
/// On a machine so loaded that a look at the lock took longer than the
/// link's delay, the call may have had its answer already: then nothing is
/// dropped, and what follows must hold all the same.
async fn drop_midway<T: std::fmt::Debug>(task: tokio::task::JoinHandle<T>) {
    task.abort();
    match task.await {
        Err(ended) => assert!(ended.is_cancelled(), "{ended}"),
        Ok(answered) => eprintln!("answered before the drop: {answered:?}"),
    }
}

/// `name` can be taken within 10 s.
async fn given_back(observer: &locksmith::Client, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(guard) = observer.lock(name).try_acquire().await.unwrap() {
            guard.release().await.unwrap();
            return;
        }
        assert!(Instant::now() < deadline, "{name} is still held");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_namespaces_every_key() {
    let redis = shared_redis();
    let space = format!("ns-{}/", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let c = client(
        &format!("{}?prefix={space}", redis.url()),
        Duration::from_secs(30),
    )
    .await;
    let guard = c.lock("orders/1").acquire().await.unwrap();
    let mut conn = raw(redis).await;
    let exists: bool = conn.exists(format!("{space}orders/1")).await.unwrap();
    assert!(exists, "the key is <prefix><name>");
    let token: u64 = conn
        .get(format!("redisson_lock_token:{{{space}orders/1}}"))
        .await
        .unwrap();
    assert_eq!(token, guard.fencing_token());
    let listed = c.list("").await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        ["orders/1"],
        "list sees only its namespace, names without the prefix"
    );
    guard.release().await.unwrap();
    assert!(c.list("").await.unwrap().is_empty());
}

/// A server that takes connections and never answers is given up after the
/// URL's `connect_timeout`, 2 s without one. The clock is paused, so the
/// times are the client's own count, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_silent_server_is_given_up_after_the_connect_timeout() {
    // Never accepted: the kernel completes the handshake, nobody answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for (query, limit) in [
        ("?connect_timeout=300ms", Duration::from_millis(300)),
        ("", Duration::from_secs(2)),
    ] {
        let url = format!("redis+cluster://127.0.0.1:{port}{query}");
        let started = tokio::time::Instant::now();
        let Err(error) = locksmith::Client::connect(&url).await else {
            panic!("{url}: a silent server is no cluster");
        };
        assert!(error.to_string().contains("timed out"), "{url}: {error}");
        assert_eq!(started.elapsed(), limit, "{url}: {error}");
    }
}
