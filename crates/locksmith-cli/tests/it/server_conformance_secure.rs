//! The conformance suite, unchanged, against a `locksmith serve` process with
//! TLS (and a client CA) and authentication on: the client connects with
//! `locksmith+tls://` and a token whose identity may do everything, so every
//! behaviour must come out the same as in plaintext.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::sync::OnceLock;

use locksmith_server::token_sha256;
use locksmith_testkit::conformance::ServerHarness;
use server_support::pki::Pki;
use server_support::ServerProcess;

const TOKEN: &str = "conformance-token-7f3a9c";

/// One server process (and its certificates) for the whole test process.
async fn server() -> ServerHarness {
    static SERVER: OnceLock<(Pki, ServerProcess)> = OnceLock::new();
    let (pki, server) = SERVER.get_or_init(|| {
        let pki = Pki::new();
        pki.issue("ca", "server");
        std::fs::write(pki.path("client.token"), TOKEN).unwrap();
        std::fs::write(
            pki.path("auth.toml"),
            format!(
                "[[identity]]\nname = \"suite\"\ntoken_sha256 = \"{}\"\n\
                 grants = [ {{ prefix = \"*\", permissions = [\"lock\", \"inspect\", \"admin\"] }} ]\n",
                token_sha256(TOKEN)
            ),
        )
        .unwrap();
        let mut args = pki.serve_args("server");
        args.extend(["--auth-file".into(), pki.path_str("auth.toml")]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = ServerProcess::start_with(&args);
        (pki, server)
    });
    server.assert_running();
    ServerHarness::new(format!(
        "locksmith+tls://127.0.0.1:{}?ca={}&token_file={}",
        server.port(),
        pki.path_str("ca.pem"),
        pki.path_str("client.token")
    ))
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    server()
);
