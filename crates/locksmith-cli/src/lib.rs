//! `locksmith`: run the lock server, run commands under a lock, inspect locks.
//!
//! Every subcommand that talks to a lock store takes `--backend URL` (or
//! `LOCKSMITH_BACKEND`), default `locksmith://127.0.0.1:7420`, so the same
//! commands work against Redis, ZooKeeper, etcd, PostgreSQL or the server.
//! They print their own output only: the libraries' logs appear with `-v`
//! or `RUST_LOG` (`serve` logs from info up by default).
//!
//! One module per subcommand (`serve`, `run`, `hold`, `elect`, `status`,
//! `session`, `cluster`), each a thin layer over the `locksmith` client
//! library or the `locksmith-server` crate; `common` holds the options they
//! share. The benchmark and the torture are a binary of their own,
//! `locksmith-lab` (crates/locksmith-lab), which runs this one as the server.
//!
//! A library with a thin executable (src/main.rs), and its modules public,
//! for the tests alone (tests/it/commands.rs): compiled once, for the
//! executable and the tests, where unit tests in the executable compiled it
//! twice (36 s of a cold build on 2 CPUs). Not an API: the command line is.

// The doc comments of the command definitions are `--help` text (clap
// derives it from them), written for a terminal: `host[:port]` and
// `locksmith-<subcommand>.1` mean what they say there, not rustdoc links or
// HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

pub mod cluster;
pub mod common;
pub mod elect;
pub mod hold;
pub mod run;
pub mod serve;
pub mod session;
pub mod snapshot;
pub mod status;

/// Distributed locks with fencing tokens.
#[derive(Debug, Parser)]
#[command(
    name = "locksmith",
    version,
    about = "Distributed locks with fencing tokens: a lock server, and commands that hold locks on any store"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Show the logs of the libraries underneath on stderr: -v warnings,
    /// -vv what they do, -vvv debugging detail, -vvvv everything
    /// (`RUST_LOG` overrides it). `serve` logs from info up without it,
    /// from debug up with -v.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the locksmith lock server.
    #[command(args_override_self = true)]
    Serve(Box<serve::ServeArgs>),
    /// Run a command while holding a lock (like flock(1) or `etcdctl lock`).
    Run(run::RunArgs),
    /// Acquire a lock, print its fencing token, hold it until interrupted.
    Hold(hold::HoldArgs),
    /// Run a command while leading an election (like `etcdctl elect`).
    Elect(elect::ElectArgs),
    /// Print an election's leader value, or follow it with --watch.
    Leader(elect::LeaderArgs),
    /// Show locks, holders and waiters.
    Status(status::StatusArgs),
    /// Free a lock whoever holds it (administrators only).
    Release(status::ReleaseArgs),
    /// List a locksmith server's sessions, or end them (administrators only).
    Session(session::SessionArgs),
    /// The members of a replicated lock server: status and changes.
    Cluster(cluster::ClusterArgs),
    /// Backups of a replicated lock server: save, status, restore (also a
    /// new cluster from one surviving member's data).
    Snapshot(snapshot::SnapshotArgs),
    /// Print a shell completion script (e.g. `locksmith completions bash >
    /// /etc/bash_completion.d/locksmith`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one per subcommand into a directory.
    Man {
        /// Write locksmith.1 and locksmith-<subcommand>.1 here instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// `locksmith completions` and `locksmith man`: generated from the same clap
/// definitions as the parser, so they never drift from it.
fn generate(command: &Command) -> ExitCode {
    let mut cli = Cli::command();
    let written = match command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut cli, "locksmith", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir: Some(dir) } => {
            std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cli, dir))
        }
        Command::Man { dir: None } => clap_mangen::Man::new(cli).render(&mut std::io::stdout()),
        _ => unreachable!("only generated output"),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("locksmith: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What a server logs without `RUST_LOG` or `-v`: our own lines from info
/// up, openraft's errors only. openraft logs "election timeout expired" at
/// info on every tick while a member waits for its peers' votes (about 66
/// lines a second), and every failed heartbeat to a member that is down at
/// warn (about 20); the server logs its own role changes, and a member that
/// stops answering and answers again, once each.
const SERVER_LOG_FILTER: &str = "info,openraft=error";

/// What is logged without `RUST_LOG`. A server's log is part of what it
/// does. The commands that use a lock print only their own output and
/// their own messages (a lost lock, why an acquire failed, in the
/// command's words), so the libraries' logs (a ZooKeeper client's session
/// states, a Redis reconnect as the process exits) are off until asked for
/// with `-v`.
fn log_filter(command: &Command, verbose: u8) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    EnvFilter::new(if matches!(command, Command::Serve(_)) {
        match verbose {
            0 => SERVER_LOG_FILTER,
            1 => "debug,openraft=info",
            _ => "trace",
        }
    } else {
        match verbose {
            0 => "off",
            1 => "warn",
            2 => "info,openraft=warn",
            3 => "debug",
            _ => "trace",
        }
    })
}

/// The command: parses the arguments, runs the subcommand, and returns
/// the process's exit code.
pub fn main() -> ExitCode {
    let definitions = Cli::command();
    let serve = definitions
        .find_subcommand("serve")
        .expect("serve is a subcommand");
    let args = match serve::expand_config(std::env::args_os().collect(), serve) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("locksmith serve: {error}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    if matches!(
        cli.command,
        Command::Completions { .. } | Command::Man { .. }
    ) {
        return generate(&cli.command);
    }
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(&cli.command, cli.verbose))
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal; plain text for a file or journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if matches!(&cli.command, Command::Snapshot(args) if args.runs_in_background()) {
        match locksmith_server::backup::lower_priority_for_a_save() {
            Ok(Some(nice)) => tracing::debug!(nice, "this session's group lowered (autogroup)"),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "could not lower this session's CPU share"),
        }
    }
    let runtime = match &cli.command {
        Command::Serve(args) => {
            locksmith_server::runtime::build(args.worker_threads.into(), "locksmith-serve")
        }
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("locksmith: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(*args).await,
            Command::Run(args) => run::run(args).await,
            Command::Hold(args) => hold::hold(args).await,
            Command::Elect(args) => elect::elect(args).await,
            Command::Leader(args) => elect::leader(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Release(args) => status::release(args).await,
            Command::Session(args) => session::session(args).await,
            Command::Cluster(args) => cluster::cluster(args).await,
            Command::Snapshot(args) => snapshot::snapshot(args).await,
            command @ (Command::Completions { .. } | Command::Man { .. }) => generate(&command),
        }
    })
}
