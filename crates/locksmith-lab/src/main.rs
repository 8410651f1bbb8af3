//! `locksmith-lab`: the benchmark and the torture of locksmith, apart from the
//! `locksmith` binary operators run (as `redis-benchmark` is apart from
//! `redis-server`).
//!
//! - `bench`: the same scenarios against every backend side by side
//!   (docs/BENCHMARKS.md);
//! - `torture`: the fault-injecting safety check (docs/RELIABILITY.md).
//!
//! Both start real stores with `locksmith-testkit`, and the locksmith server
//! as the `locksmith` executable's `serve` ([`server_executable`] says where
//! it is found); their module docs say how each run is built.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The allocator of the clients the bench and the torture run: the same as
/// the `locksmith` binary's, so that a client measured here allocates as one
/// linked into an application that chose mimalloc would.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod scheduling;
mod server_executable;
mod torture;

/// The benchmark and the torture of locksmith.
#[derive(Debug, Parser)]
#[command(
    name = "locksmith-lab",
    version,
    about = "Measure locksmith's backends side by side, and check their safety under injected faults"
)]
struct Cli {
    /// The `locksmith` executable to run as the lock server (`--spawn server`,
    /// `server-cluster`, `server-cluster-tls`) [default: the one beside this
    /// executable, else the first on PATH].
    #[arg(long, global = true, env = "LOCKSMITH_BIN", value_name = "PATH")]
    locksmith: Option<PathBuf>,
    /// An argument added to every `locksmith serve` this run starts, after
    /// its own (repeat it, e.g. `--serve-arg=--max-sessions=200000`).
    #[arg(long, global = true, value_name = "ARG", allow_hyphen_values = true)]
    serve_arg: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure every backend side by side.
    Bench(bench::BenchArgs),
    /// Check safety under injected faults (kill, pause, restart, partition).
    Torture(torture::TortureArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(path) = cli.locksmith {
        server_executable::choose(path);
    }
    server_executable::add_serve_args(cli.serve_arg);
    tracing_subscriber::fmt()
        .with_env_filter(
            // ZooKeeper's client logs every session it opens at `info`:
            // thousands of lines in the sessions scenario.
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,zookeeper_client=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let client_slice = match &cli.command {
        Command::Bench(args) => args.client_slice,
        Command::Torture(_) => None,
    };
    if let Some(slice) = client_slice {
        if let Err(error) = scheduling::set_own_slice(slice) {
            eprintln!("locksmith-lab: cannot set the scheduler slice (--client-slice): {error}");
            return ExitCode::FAILURE;
        }
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(slice) = client_slice {
        // Every thread asks for itself: the slice is not inherited (see
        // `scheduling`), and a thread that could not get it runs as before.
        builder.on_thread_start(move || {
            let _ = scheduling::set_own_slice(slice);
        });
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("locksmith-lab: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Bench(args) => bench::bench(args).await,
            Command::Torture(args) => torture::torture(args).await,
        }
    })
}

/// Parses `500ms`, `30s`, `5m`, `1h30m`, as the `locksmith` command does.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 5m)"))
}
