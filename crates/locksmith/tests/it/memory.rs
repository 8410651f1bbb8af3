//! The conformance suite against `memory://`, under tokio's paused clock.

use std::time::Duration;

use locksmith::{Client, ConnectOptions};

/// The suite's in-process table, bound to the test's runtime and paused clock.
struct Memory {
    url: String,
}

impl locksmith_testkit::conformance::Harness for Memory {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions::default().session_ttl(session_ttl);
        Client::connect_with(&self.url, options)
            .await
            .expect("connect memory://")
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(500)
    }
}

async fn memory() -> Memory {
    Memory {
        url: format!("memory://{}", uuid::Uuid::new_v4().simple()),
    }
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(start_paused = true)]
    memory()
);
