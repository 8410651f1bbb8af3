//! The conformance suite, unchanged, against a real `locksmith serve` process
//! (durable, fsync on, in a temporary data directory), shared by every test of
//! this binary: each test uses its own lock names.

#[path = "../../locksmith/tests/conformance/mod.rs"]
mod conformance;
mod server_support;

use std::sync::OnceLock;

use conformance::UrlHarness;
use server_support::ServerProcess;

/// One server process for the whole test binary.
async fn server() -> UrlHarness {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    UrlHarness { url: server.url() }
}

conformance::suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    server()
);
