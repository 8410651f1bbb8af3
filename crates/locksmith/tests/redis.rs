//! The conformance suite and the Redis-specific tests, against real
//! `redis-server` processes started by locksmith-testkit.
//!
//! The suite runs four times: on the default Redisson RLock layout, on the fair
//! (FIFO) layout, on the redis-py compatible simple layout, and on Redlock over
//! five servers. Fault tests get servers of their own.

mod conformance;
mod redis_support;

use std::time::Duration;

use locksmith::{Client, ConnectOptions};

use redis_support::{shared_redis, shared_redlock};

/// Connects clients to one URL.
struct Harness {
    url: String,
}

impl conformance::Harness for Harness {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions {
            session_ttl,
            ..ConnectOptions::default()
        };
        Client::connect_with(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.url))
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}

async fn harness(query: &str) -> Harness {
    Harness {
        url: format!("{}{query}", shared_redis().url()),
    }
}

async fn redlock_harness() -> Harness {
    Harness {
        url: shared_redlock(),
    }
}

/// Default mode: Redisson's RLock layout.
mod rlock {
    use super::*;
    crate::conformance::suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("")
    );
}

/// `mode=fair`: FIFO, so the suite's ordering tests run too.
mod fair {
    use super::*;
    crate::conformance::suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("?mode=fair")
    );
}

/// `mode=simple`: redis-py's `SET NX PX` layout for exclusive locks.
mod simple {
    use super::*;
    crate::conformance::suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness("?mode=simple")
    );
}

/// Redlock over five independent servers.
mod redlock {
    use super::*;
    crate::conformance::suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        redlock_harness()
    );
}
