//! The conformance suite against a server started inside the test process
//! (durable, in a temporary directory, one per test): a fast check of the
//! service and the `locksmith://` backend. The real-process tests (durable server, crashes,
//! restarts) live in `crates/locksmith-cli/tests/server_*.rs`.

use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_server::{Server, ServerConfig};

struct InProcess {
    server: Server,
    _dir: tempfile::TempDir,
}

impl locksmith_testkit::conformance::Harness for InProcess {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions::default().session_ttl(session_ttl);
        Client::connect_with(&self.server.url(), options)
            .await
            .expect("connect to the in-process server")
    }

    /// As the other server harnesses: a session of 500 ms lost its holds
    /// when the test process (server and client in one) stalled for half a
    /// second, which a busy 2-core machine does.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}

async fn in_process() -> InProcess {
    let dir = tempfile::tempdir().expect("temporary data directory");
    let config = ServerConfig::durable(dir.path()).listen("127.0.0.1:0".parse().unwrap());
    InProcess {
        server: Server::start(config).await.expect("start the server"),
        _dir: dir,
    }
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    in_process()
);
