//! The `locksmith` binary's integration tests: one test binary, `it`, with a
//! module per concern, so the whole set links once. Each test runs the
//! binary Cargo built beside it (`CARGO_BIN_EXE_locksmith`) as a process;
//! `server_support` starts and stops `locksmith serve` for the `server_*`
//! modules. `commands` tests the command's modules themselves (the library
//! `locksmith_cli` the binary runs). The modules that load the machine on purpose run alone under
//! nextest (`.config/nextest.toml`). One module alone:
//! `cargo nextest run -p locksmith-cli -E 'test(/^server_crash::/)'`.

mod commands;
mod elect;
mod observability;
mod server_answers;
mod server_cluster;
mod server_cluster_conformance;
mod server_conformance;
mod server_conformance_secure;
mod server_crash;
mod server_fairness;
mod server_heavy_clients;
mod server_integrity;
mod server_limits;
mod server_malformed;
mod server_members;
mod server_operations;
mod server_security;
mod server_support;
