//! The conformance suite, unchanged, against a real `locksmith serve` process
//! (durable, fsync on, in a temporary data directory), shared by every
//! behaviour: each uses its own lock names.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::sync::OnceLock;

use locksmith_testkit::conformance::ServerHarness;
use server_support::ServerProcess;

/// One server process for the whole test process.
async fn server() -> ServerHarness {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    ServerHarness::new(server.url())
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    server()
);
