//! `locksmith`: run the lock server, run commands under a lock, inspect locks.
//!
//! Every subcommand that talks to a lock store takes `--backend URL` (or
//! `LOCKSMITH_BACKEND`), default `locksmith://127.0.0.1:7420`, so the same
//! commands work against Redis, ZooKeeper, etcd, PostgreSQL or the server.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod common;
mod hold;
mod run;
mod serve;
mod session;
mod status;
mod torture;

/// Distributed locks with fencing tokens.
#[derive(Debug, Parser)]
#[command(
    name = "locksmith",
    version,
    about = "Distributed locks with fencing tokens: a lock server, and commands that hold locks on any store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the locksmith lock server.
    Serve(serve::ServeArgs),
    /// Run a command while holding a lock (like flock(1) or `etcdctl lock`).
    Run(run::RunArgs),
    /// Acquire a lock, print its fencing token, hold it until interrupted.
    Hold(hold::HoldArgs),
    /// Show locks, holders and waiters.
    Status(status::StatusArgs),
    /// Free a lock whoever holds it (administrators only).
    Release(status::ReleaseArgs),
    /// List a locksmith server's sessions, or end them (administrators only).
    Session(session::SessionArgs),
    /// Measure every backend side by side.
    Bench(bench::BenchArgs),
    /// Check safety under injected faults (kill, pause, restart, partition).
    Torture(torture::TortureArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("locksmith: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Hold(args) => hold::hold(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Release(args) => status::release(args).await,
            Command::Session(args) => session::session(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::Torture(args) => torture::torture(args).await,
        }
    })
}
