//! `locksmith serve`: the lock server.
//!
//! Durable by default: the lock state lives in `--data-dir` (a command log and
//! snapshots), and a restart recovers it; clients resume their sessions within
//! the `--grace` period. `--in-memory` keeps nothing. SIGINT/SIGTERM stop it
//! gracefully (a final snapshot); kill -9 loses nothing that was acknowledged.
//! Logs go to stderr; `RUST_LOG` filters them (default `info`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use locksmith_server::{ServerConfig, DEFAULT_DATA_DIR, DEFAULT_LISTEN};

use crate::common::{parse_duration, termination};

/// Options of `locksmith serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, env = "LOCKSMITH_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Directory of the command log and snapshots (created if missing).
    #[arg(long, env = "LOCKSMITH_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Keep everything in memory: nothing survives a restart, nothing is fsynced.
    #[arg(long)]
    pub in_memory: bool,
    /// After a restart, how long sessions have to resume before their holds
    /// expire (at least each session's own TTL), e.g. `10s`.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// Most sessions open at once.
    #[arg(long, default_value_t = 100_000)]
    pub max_sessions: usize,
    /// Most sessions open at once from one client address.
    #[arg(long, default_value_t = 10_000)]
    pub max_sessions_per_peer: usize,
    /// Longest session TTL a client may ask for, e.g. `5m`.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub max_session_ttl: Duration,
    /// Most waiters queued on one lock.
    #[arg(long, default_value_t = 10_000)]
    pub max_waiters_per_lock: usize,
    /// Most locks one session may hold.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_holds_per_session: usize,
    /// Most session streams on one client connection.
    #[arg(long, default_value_t = 256)]
    pub max_sessions_per_connection: usize,
    /// Most concurrent streams (sessions and calls) on one client connection.
    #[arg(long, default_value_t = 1024)]
    pub max_streams_per_connection: u32,
    /// Largest message a client may send, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_message_bytes: usize,
    /// Most client connections open at once; more are closed when accepted.
    /// Keep it below the open-file limit (`ulimit -n`).
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// How long a new connection may take to finish its HTTP/2 handshake.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub handshake_timeout: Duration,
    /// Write a snapshot (and start a new log segment) after this many log records.
    #[arg(long, default_value_t = 100_000)]
    pub snapshot_every: u64,
    /// Start a new log segment once one holds this many bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub segment_bytes: u64,
    /// Start even on a damaged data directory (a damaged log record before
    /// valid ones, a missing snapshot or log segment): keep the files as found
    /// in `damaged-<time>/`, recover what comes before the damage, and hand
    /// out fencing tokens above every token the directory may have issued.
    /// What comes after the damage is lost. Without this flag the server
    /// refuses to start and says what is wrong.
    #[arg(long)]
    pub recover_damaged_data: bool,
}

impl ServeArgs {
    fn config(&self) -> ServerConfig {
        let mut config = if self.in_memory {
            ServerConfig::in_memory()
        } else {
            ServerConfig::durable(&self.data_dir)
        };
        config.listen = self.listen;
        config.grace = self.grace;
        config.max_sessions = self.max_sessions;
        config.max_sessions_per_peer = self.max_sessions_per_peer;
        config.max_session_ttl = self.max_session_ttl;
        config.limits.max_waiters_per_lock = self.max_waiters_per_lock;
        config.limits.max_holds_per_session = self.max_holds_per_session;
        config.max_sessions_per_connection = self.max_sessions_per_connection;
        config.max_streams_per_connection = self.max_streams_per_connection;
        config.max_message_bytes = self.max_message_bytes;
        config.snapshot_every = self.snapshot_every;
        config.max_connections = self.max_connections;
        config.handshake_timeout = self.handshake_timeout;
        config.segment_bytes = self.segment_bytes;
        config.recover_damaged_data = self.recover_damaged_data;
        config
    }
}

/// Runs the lock server until SIGINT/SIGTERM.
pub async fn serve(args: ServeArgs) -> ExitCode {
    let config = args.config();
    match &config.data_dir {
        Some(dir) => {
            tracing::info!(data_dir = %dir.display(), grace = ?config.grace, "durable mode")
        }
        None => tracing::warn!("in-memory mode: locks do not survive a restart"),
    }
    let shutdown = async {
        let signal = termination().await;
        tracing::info!(%signal, "stopping");
    };
    match locksmith_server::serve(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "lock server failed");
            eprintln!("locksmith serve: {error}");
            ExitCode::FAILURE
        }
    }
}
