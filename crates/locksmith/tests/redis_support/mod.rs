//! Servers and helpers shared by the Redis tests.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::Redis;

/// One Redis for every test that does not inject faults.
pub fn shared_redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(Redis::start)
}

/// Five Redis masters for the Redlock suite.
pub fn shared_redlock() -> String {
    static NODES: OnceLock<Vec<Redis>> = OnceLock::new();
    redlock_url(NODES.get_or_init(|| (0..5).map(|_| Redis::start()).collect()))
}

/// `redis+redlock://127.0.0.1:p1,…` for these servers.
pub fn redlock_url(nodes: &[Redis]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    format!("redis+redlock://{}", hosts.join(","))
}

/// A client with the given session TTL.
pub async fn client(url: &str, session_ttl: Duration) -> Client {
    let options = ConnectOptions {
        session_ttl,
        ..ConnectOptions::default()
    };
    Client::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// A lock name no other test uses.
pub fn unique(test: &str) -> String {
    format!(
        "redis-test/{test}/{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Polls `check` every 10 ms until it holds, or panics after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A raw connection for looking at keys directly.
pub async fn raw(redis: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
