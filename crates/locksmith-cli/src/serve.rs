//! `locksmith serve`: the lock server.
//!
//! Every server is a member of a Raft group: alone by default, or one of
//! `--cluster`. Durable by default: the lock state lives in `--data-dir` (the
//! Raft log and snapshots), and a restart recovers it; clients resume their
//! sessions within the `--grace` period. `--in-memory` keeps nothing.
//! SIGINT/SIGTERM stop it gracefully (a final snapshot); kill -9 loses
//! nothing that was acknowledged.
//! Logs go to stderr; `RUST_LOG` filters them (default `info,openraft=error`).
//!
//! `--tls-cert`/`--tls-key` put the port (clients and members) under TLS,
//! `--tls-client-ca` accepts client certificates, `--tls-peer-ca` certifies
//! members;
//! `--auth-file` turns authentication and per-prefix permissions on (SIGHUP
//! reloads it). README "Security" shows the auth file.
//!
//! `--metrics-listen` serves Prometheus metrics, health, readiness and a live
//! web page of the lock table over HTTP. `--config FILE` reads the same
//! settings from a TOML file (see [`expand_config`]).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use locksmith_server::{Server, ServerConfig, TlsFiles, DEFAULT_DATA_DIR, DEFAULT_LISTEN};

use crate::common::{parse_duration, Termination};

/// Options of `locksmith serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, env = "LOCKSMITH_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Directory of the command log and snapshots (created if missing).
    #[arg(long, env = "LOCKSMITH_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Keep everything in memory: nothing survives a restart. The Raft log
    /// goes to a directory in /dev/shm (or the temporary directory), removed
    /// when the server stops, or by the next start after a crash.
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
    /// Most locks one session may hold (and queue for). A session's end
    /// gives them up in steps of 1 024, with other requests served between
    /// the steps.
    #[arg(long, default_value_t = 100_000)]
    pub max_holds_per_session: usize,
    /// Most sessions on one client connection (session streams and the
    /// channels of `Sessions` streams alike).
    #[arg(long, default_value_t = 256)]
    pub max_sessions_per_connection: usize,
    /// Most concurrent streams (sessions and calls) on one client connection.
    #[arg(long, default_value_t = 1024)]
    pub max_streams_per_connection: u32,
    /// Largest message a client may send, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_message_bytes: usize,
    /// Most bytes of replies a session stream holds for a client that does
    /// not read them; past it the stream is closed (the session may resume).
    #[arg(long, default_value_t = 16 << 20)]
    pub max_stream_backlog_bytes: usize,
    /// Most locks in one page of a listing (`List`); the library and the CLI
    /// page through longer ones.
    #[arg(long, default_value_t = 10_000)]
    pub max_list_page: usize,
    /// Most batches the leader has proposed and not applied yet (1–64): more
    /// overlaps writing and replicating one batch with committing the last,
    /// fewer makes each batch bigger.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub max_batches_in_flight: u16,
    /// Most client connections open at once; more are closed when accepted.
    /// Keep it below the open-file limit (`ulimit -n`).
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// How long a new connection may take to finish its HTTP/2 handshake (or,
    /// for a framed session stream, to send its magic and hello).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub handshake_timeout: Duration,
    /// Take a snapshot (and let the Raft log before it go) after this many log
    /// entries (each entry is one batch of requests) at the least, or
    /// `--snapshot-log-bytes` of log, whichever comes first.
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_every: u64,
    /// And only once the log written since the last snapshot is this many
    /// percent of that snapshot's size, so that a big lock table is not
    /// written out again every `--snapshot-every` entries (the log kept, on
    /// disk and in memory, stays within this share of the snapshot's size).
    /// 0: after `--snapshot-every` entries alone.
    #[arg(long, default_value_t = 100)]
    pub snapshot_log_percent: u32,
    /// The bytes of log after which a snapshot is due however few entries
    /// they are (a bulk load writes much log in few entries), as Redis's
    /// `auto-aof-rewrite-min-size`; the log must still have outgrown the last
    /// snapshot by `--snapshot-log-percent`. Unused at a percent of 0.
    #[arg(long, default_value_t = 64 << 20)]
    pub snapshot_log_bytes: u64,
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
    /// Serve Prometheus metrics (/metrics), /healthz, /readyz and the live web
    /// page of the lock table over HTTP on this address, e.g. 127.0.0.1:7421
    /// (off by default; the page shows lock names and owners, so keep it on a
    /// trusted network).
    #[arg(long, env = "LOCKSMITH_METRICS_LISTEN", value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// Grant history: most recent grants kept per lock (0 keeps none).
    #[arg(long, default_value_t = 16)]
    pub history_per_lock: usize,
    /// Grant history: most grants kept in all (the oldest go first).
    #[arg(long, default_value_t = 10_000)]
    pub history_total: usize,
    /// Grant history: forget grants older than this, e.g. `1h`.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    pub history_max_age: Duration,
    /// This member's id in its Raft group (every server is a member of one;
    /// alone by default).
    #[arg(long, env = "LOCKSMITH_NODE_ID", default_value_t = 1)]
    pub node_id: u64,
    /// Start a member of a new cluster of these members, each an id and the
    /// address its clients and peers both use, e.g.
    /// `1=10.0.0.1:7420,2=10.0.0.2:7420,3=10.0.0.3:7420` (this member's id
    /// among them). Read only when the data directory is new; without it a
    /// new server is a cluster of one at its `--listen` address.
    #[arg(long, env = "LOCKSMITH_CLUSTER", value_name = "ID=HOST:PORT,...", value_parser = parse_members)]
    pub cluster: Option<Members>,
    /// Join a running cluster as a learner through its members
    /// (HOST:PORT[,HOST:PORT...]: the first that answers names the leader;
    /// list several so that one member down does not stop the join); promote
    /// it with `locksmith cluster promote ID` once it has caught up. Needs a
    /// new data directory, and a `--listen` address the members can reach
    /// (they use it for this member).
    #[arg(
        long,
        env = "LOCKSMITH_JOIN",
        value_name = "HOST:PORT[,HOST:PORT...]",
        conflicts_with = "cluster"
    )]
    pub join: Option<String>,
    /// Promote a learner to voter as soon as its log is within N entries of
    /// the leader's (set it on every member: whichever leads does it).
    #[arg(long, value_name = "N")]
    pub auto_promote_lag: Option<u64>,
    /// Act as a build that reads log records up to version N only (it
    /// announces N, and stops if the cluster agrees on a newer one): for
    /// tests of a rolling upgrade.
    #[arg(long, value_name = "N", hide = true)]
    pub record_version: Option<u32>,
    /// Threads that run the server's tasks. One by default: a request
    /// passes through several tasks (its connection, its stream, the core,
    /// Raft's, the log's), and on one thread each hand-off is a queue push
    /// where on two it is often a wake-up of the other thread, which costs
    /// more than the lock work (docs/BENCHMARKS.md, "One worker").
    /// Blocking steps (the log's `fdatasync`, a snapshot's install) hand
    /// the thread's other tasks to another thread while they block. Raise it
    /// when one core's worth of request work is not enough (`top -H` shows
    /// the `locksmith-serve` thread near 100 %).
    #[arg(long, env = "LOCKSMITH_WORKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: u16,
    /// How often the leader sends heartbeats to the other members, e.g. `50ms`.
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub raft_heartbeat: Duration,
    /// Sets how long a member waits for a silent leader before it starts an
    /// election: the leader's lease (twice this) plus this to twice this, at
    /// random; so 600–800 ms with the default. E.g. `500ms`.
    #[arg(long, value_parser = parse_duration, default_value = "200ms")]
    pub election_timeout: Duration,
    /// TLS on the port, for clients and members: the server's certificate
    /// chain (PEM). A plaintext client gets its connection closed.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) whose client certificates clients may present
    /// (one identifies a client to `--auth-file`).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// CA certificates (PEM) that sign the members' certificates: members
    /// present their `--tls-cert` to each other and check each other's
    /// against it, and only their Raft traffic is heard. Needed for a
    /// cluster with TLS; keep it apart from `--tls-client-ca`, or a client's
    /// certificate passes as a member's.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_peer_ca: Option<PathBuf>,
    /// Authentication and per-prefix permissions: a TOML file of identities
    /// (a bearer token's SHA-256 or a client certificate's subject) and their
    /// grants (README "Security"). SIGHUP reloads it; a bad file keeps the
    /// previous one.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Read settings from a TOML file: each key is a long flag of this command
    /// without its dashes (`listen = "0.0.0.0:7420"`, `in-memory = true`,
    /// `grace = "30s"`). Flags on the command line win over the file, and
    /// the file over environment variables.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The members of `--cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members(pub Vec<(u64, String)>);

/// Parses `1=host:port,2=host:port,...`: ids unique, addresses `host:port`.
pub(crate) fn parse_members(text: &str) -> Result<Members, String> {
    let mut members: Vec<(u64, String)> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("`{id}` in `{part}` is not a member id (a number)"))?;
        let addr = addr.trim();
        let port = addr
            .rsplit_once(':')
            .and_then(|(host, port)| (!host.is_empty()).then_some(port))
            .ok_or_else(|| format!("`{addr}` in `{part}` is not HOST:PORT"))?;
        port.parse::<u16>()
            .map_err(|_| format!("`{port}` in `{part}` is not a port"))?;
        if members.iter().any(|(known, _)| *known == id) {
            return Err(format!("member id {id} appears twice"));
        }
        members.push((id, addr.to_owned()));
    }
    if members.is_empty() {
        return Err("no members: expected ID=HOST:PORT,...".into());
    }
    Ok(Members(members))
}

impl ServeArgs {
    fn config(&self) -> Result<ServerConfig, String> {
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
        config.max_stream_backlog_bytes = self.max_stream_backlog_bytes;
        config.max_list_page = self.max_list_page;
        config.max_batches_in_flight = usize::from(self.max_batches_in_flight);
        config.snapshot_every = self.snapshot_every;
        config.snapshot_log_percent = self.snapshot_log_percent;
        config.snapshot_log_bytes = self.snapshot_log_bytes;
        config.max_connections = self.max_connections;
        config.handshake_timeout = self.handshake_timeout;
        config.segment_bytes = self.segment_bytes;
        config.recover_damaged_data = self.recover_damaged_data;
        config.metrics_listen = self.metrics_listen;
        config.history_per_lock = self.history_per_lock;
        config.history_total = self.history_total;
        config.history_max_age = self.history_max_age;
        config.node_id = self.node_id;
        config.join = self.join.clone();
        config.auto_promote_lag = self.auto_promote_lag;
        if let Some(version) = self.record_version {
            if version == 0 || version > config.record_version {
                return Err(format!(
                    "--record-version must be between 1 and {} (this build's)",
                    config.record_version
                ));
            }
            config.record_version = version;
        }
        config.raft_heartbeat = self.raft_heartbeat;
        config.election_timeout = self.election_timeout;
        config.tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
                peer_ca: self.tls_peer_ca.clone(),
            }),
            _ => None,
        };
        config.auth_file = self.auth_file.clone();
        if let Some(Members(members)) = &self.cluster {
            if !members.iter().any(|(id, _)| *id == self.node_id) {
                return Err(format!(
                    "--cluster does not list this member (--node-id {})",
                    self.node_id
                ));
            }
            if self.recover_damaged_data && members.len() > 1 {
                return Err(
                    "--recover-damaged-data is for a one-member cluster: a damaged member \
                     of several is replaced (wipe its directory, add it back under a new node \
                     id), since one that forgot entries could break the others' guarantees"
                        .into(),
                );
            }
            config.cluster = members.clone();
        }
        if self.election_timeout <= self.raft_heartbeat * 2 {
            return Err(format!(
                "--election-timeout ({:?}) must be more than twice --raft-heartbeat ({:?})",
                self.election_timeout, self.raft_heartbeat
            ));
        }
        Ok(config)
    }
}

/// `locksmith serve --config FILE`: the file's settings become flags placed
/// before those of the command line (which `serve` lets override earlier
/// ones), so every flag has its setting, with the same name, parser and
/// checks, and the command line wins. Any other command line is returned
/// as it is. `serve` is the command whose long flags name the settings.
pub fn expand_config(args: Vec<OsString>, serve: &clap::Command) -> Result<Vec<OsString>, String> {
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok(args);
    }
    let mut path = None;
    let mut rest = args[2..].iter();
    while let Some(arg) = rest.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            path = rest.next().cloned();
        } else if let Some(value) = arg.strip_prefix("--config=") {
            path = Some(value.into());
        }
    }
    let Some(path) = path else {
        return Ok(args);
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{shown} is not valid TOML: {e}"))?;
    let mut flags: Vec<OsString> = Vec::new();
    for (key, value) in table {
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config")
            .ok_or_else(|| {
                format!(
                    "{shown}: unknown setting `{key}` (settings are the long flags of \
                     `locksmith serve` without their dashes, see `locksmith serve --help`)"
                )
            })?;
        let flag = OsString::from(format!("--{key}"));
        let text = match value {
            toml::Value::Boolean(on) if !arg.get_action().takes_values() => {
                if on {
                    flags.push(flag);
                }
                continue;
            }
            toml::Value::String(text) => text,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(format!(
                    "{shown}: setting `{key}` takes a single value, not {}",
                    other.type_str()
                ))
            }
        };
        flags.push(flag);
        flags.push(text.into());
    }
    Ok(args[..2]
        .iter()
        .cloned()
        .chain(flags)
        .chain(args[2..].iter().cloned())
        .collect())
}

/// Runs the lock server until SIGINT/SIGTERM.
///
/// Cancel safety: dropped during `Server::start`, the engine thread may run
/// on until the process ends; once started, dropping it shuts the server
/// down in the background (SIGINT/SIGTERM are the graceful stop, not a drop).
pub async fn serve(args: ServeArgs) -> ExitCode {
    // Listening before the server starts: a signal sent as soon as it says
    // "listening" is then a graceful stop (once the start is complete), and
    // an early SIGHUP does not end it.
    let signals = Signals::listen();
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("locksmith serve: {error}");
            return ExitCode::from(2);
        }
    };
    match &config.data_dir {
        Some(dir) => {
            tracing::info!(data_dir = %dir.display(), grace = ?config.grace, "durable mode")
        }
        None => tracing::warn!("in-memory mode: locks do not survive a restart"),
    }
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    if locksmith_server::runtime::LIFO_SLOT_OFF {
        tracing::info!(worker_threads, lifo_slot = "off", "runtime");
    } else {
        tracing::warn!(
            worker_threads,
            lifo_slot = "on",
            "runtime: built without `--cfg tokio_unstable` (the workspace's \
             .cargo/config.toml sets it), so answers that could go out together \
             are written one by one (locksmith_server::runtime)"
        );
    }
    let outcome = match Server::start(config).await {
        Ok(server) => run_until_stopped(server, signals).await,
        Err(error) => Err(error),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "lock server failed");
            eprintln!("locksmith serve: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The signals `serve` answers.
struct Signals {
    termination: Termination,
    /// Reloads the auth file; `None` if its handler could not be installed.
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            termination: Termination::listen(),
            hangup: signal(SignalKind::hangup()).ok(),
        }
    }
}

/// Serves until SIGINT/SIGTERM (then stops gracefully) or a failure;
/// SIGHUP reloads the auth file meanwhile.
///
/// Cancel safety: dropping it shuts the server down in the background.
async fn run_until_stopped(
    mut server: Server,
    mut signals: Signals,
) -> Result<(), locksmith_server::ServerError> {
    let hangups = async |hangup: &mut Option<tokio::signal::unix::Signal>| match hangup {
        Some(hangup) => hangup.recv().await,
        None => std::future::pending().await,
    };
    loop {
        tokio::select! {
            signal = signals.termination.recv() => {
                tracing::info!(%signal, "stopping");
                return server.shutdown().await;
            }
            _ = hangups(&mut signals.hangup) => {
                tracing::info!("SIGHUP: reloading the auth file");
                // A bad file is logged and the old one kept.
                let _ = server.reload_auth();
            }
            result = server.stopped() => return result,
        }
    }
}
