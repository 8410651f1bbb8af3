//! The conformance suite, unchanged, against a cluster of three `locksmith
//! serve` processes (durable, each with its own data directory), shared by
//! every behaviour: clients list all three members and follow the leader;
//! each behaviour uses its own lock names.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::sync::OnceLock;

use locksmith_testkit::conformance::ServerHarness;
use server_support::{url_of, ServerProcess};

/// One cluster for the whole test process.
async fn cluster() -> ServerHarness {
    static CLUSTER: OnceLock<Vec<ServerProcess>> = OnceLock::new();
    let members = CLUSTER.get_or_init(|| ServerProcess::start_cluster(&[]));
    for member in members {
        member.assert_running();
    }
    ServerHarness::new(url_of(members))
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    cluster()
);
