//! The conformance suite against a server started inside the test process
//! (durable, in a temporary directory): a fast check of the
//! service and the `locksmith://` backend. The real-process tests (durable server, crashes,
//! restarts) live in `crates/locksmith-cli/tests/it/server_*.rs`.

use std::time::Duration;

use locksmith::Client;
use locksmith_server::{Server, ServerConfig};
use locksmith_testkit::conformance::{Fault, Harness, ServerHarness};

/// The server harness, and the server and directory it lives on.
struct InProcess {
    clients: ServerHarness,
    server: Option<Server>,
    _dir: tempfile::TempDir,
}

impl Drop for InProcess {
    /// Stops the server before its directory goes: a dropped server stops in
    /// the background and writes a last snapshot, which would keep the
    /// directory from being removed.
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let stopped = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(server.shutdown())
            });
            if let Err(e) = stopped {
                eprintln!("the test server stopped with an error: {e}");
            }
        }
    }
}

impl Harness for InProcess {
    async fn connect(&self, session_ttl: Duration) -> Client {
        self.clients.connect(session_ttl).await
    }

    fn short_ttl(&self) -> Duration {
        self.clients.short_ttl()
    }

    async fn expire_session(&self, client: &Client) -> Fault {
        self.clients.expire_session(client).await
    }
}

async fn in_process() -> InProcess {
    in_process_with("").await
}

/// A server as [`in_process`], its clients' URLs ending in `query`.
async fn in_process_with(query: &str) -> InProcess {
    let dir = tempfile::tempdir().expect("temporary data directory");
    let config = ServerConfig::durable(dir.path()).listen("127.0.0.1:0".parse().unwrap());
    let server = Server::start(config).await.expect("start the server");
    InProcess {
        clients: ServerHarness::new(format!("{}{query}", server.url())),
        server: Some(server),
        _dir: dir,
    }
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    in_process()
);

/// The same suite with the session stream on the gRPC `Session` call (the
/// URL's `session_transport=grpc`) instead of the framed default, which
/// every other server test uses.
mod grpc_session_stream {
    use super::*;

    async fn in_process_grpc() -> InProcess {
        in_process_with("?session_transport=grpc").await
    }

    locksmith_testkit::conformance_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        in_process_grpc()
    );
}
