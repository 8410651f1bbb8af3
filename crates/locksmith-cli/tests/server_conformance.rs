//! The conformance suite, unchanged, against a real `locksmith serve` process
//! (durable, fsync on, in a temporary data directory), shared by every test of
//! this binary: each test uses its own lock names.

#[path = "../../locksmith/tests/conformance/mod.rs"]
mod conformance;
mod server_support;

use std::sync::OnceLock;
use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use server_support::ServerProcess;

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
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// One server process for the whole test binary.
async fn server() -> Harness {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    Harness { url: server.url() }
}

conformance::suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    server()
);
