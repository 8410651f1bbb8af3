//! [`ServerConfig`]: where to listen, where to keep data, and every limit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use locksmith_core::Limits;

use crate::tls::TlsFiles;

/// The default listen address of `locksmith serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// The default data directory of `locksmith serve`, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "locksmith-data";

/// How the server runs. Start from [`ServerConfig::durable`] or
/// [`ServerConfig::in_memory`] and adjust fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port (see [`crate::Server::local_addr`]).
    pub listen: SocketAddr,
    /// Where the log and snapshots live; `None` runs in memory only (nothing
    /// survives a restart, nothing is fsynced).
    pub data_dir: Option<PathBuf>,
    /// After a restart, how long sessions have to resume before their holds
    /// expire (Chubby's grace period). A session gets at least its own TTL.
    pub grace: Duration,
    /// The engine's limits: waiters per lock, holds per session, names per
    /// acquire, TTL and lease bounds, lock-delay bound.
    pub limits: Limits,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// Most sessions open at once from one client address (IP), attached or
    /// not: one client that opens sessions and abandons them cannot take
    /// them all. Sessions recovered after a restart count once they resume.
    pub max_sessions_per_peer: usize,
    /// Longest session TTL a client may ask for; a longer one is refused. It
    /// bounds how long an abandoned session (and its holds) outlives its
    /// client, before and after a restart.
    pub max_session_ttl: Duration,
    /// Most sessions on one client connection, session streams and the
    /// channels of `Sessions` streams alike (a library client opens one);
    /// more are refused with a "limit reached" error.
    pub max_sessions_per_connection: usize,
    /// Most concurrent HTTP/2 streams (sessions plus unary calls in flight) on
    /// one connection; a client queues streams beyond it.
    pub max_streams_per_connection: u32,
    /// Largest message a client may send, in bytes.
    pub max_message_bytes: usize,
    /// Longest owner id and client name/host, in bytes.
    pub max_label_bytes: usize,
    /// Final replies a session keeps for its client before it acknowledges them;
    /// beyond this the oldest are forgotten.
    pub max_unacked_replies: usize,
    /// Most bytes of replies and notices a session stream may hold for a
    /// client that does not read them; past it the stream is closed with
    /// `RESOURCE_EXHAUSTED` (the session lives on and may resume).
    pub max_stream_backlog_bytes: usize,
    /// Most locks in one page of a listing (`List`): a page is built on the
    /// core, so this bounds how long one listing call can hold it up.
    pub max_list_page: usize,
    /// How long a new stream may take to send its `open`/`resume`.
    pub open_timeout: Duration,
    /// Take a snapshot (and let the Raft log before it go) after this many
    /// log entries (each entry is one batch of requests) at the least, or
    /// `snapshot_log_bytes` of log, whichever comes first.
    pub snapshot_every: u64,
    /// The bytes of log after which a snapshot is due whatever its entry
    /// count (`raft::snapshot_policy`): an entry is a batch, so a bulk load
    /// writes much log in few entries. With `snapshot_log_percent` at 0
    /// only `snapshot_every` counts.
    pub snapshot_log_bytes: u64,
    /// And only once the log written since the last snapshot is this many
    /// percent of that snapshot's size (`raft::snapshot_policy`): a big
    /// state is not written out again every `snapshot_every` entries. 0:
    /// after `snapshot_every` entries alone.
    pub snapshot_log_percent: u32,
    /// A log segment is closed, and the next one started, after the commit
    /// that makes it this long (in bytes).
    pub segment_bytes: u64,
    /// Start even on a damaged data directory (a damaged log frame before
    /// valid ones, a missing snapshot or segment): keep the files as found in
    /// `damaged-<time>/`, recover what comes before the damage, and hand out
    /// fencing tokens above every token the directory may have issued. What
    /// comes after the damage is lost. Without it the server refuses to start
    /// and names what is wrong.
    pub recover_damaged_data: bool,
    /// Most requests applied in one batch (one fsync); a session's end
    /// counts as many as the holds and waits it releases
    /// (`Engine::work_of`). A batch also ends at about 1 MiB of names and
    /// owners, so that its log entry fits in the members' messages.
    pub max_batch: usize,
    /// Most batches the leader has proposed and not applied yet. More lets
    /// the next batch be written and replicated while the last one commits;
    /// fewer makes each batch bigger (one log entry, one `fdatasync` on every
    /// member, many requests).
    pub max_batches_in_flight: usize,
    /// Most client connections open at once (counting those still in their
    /// handshake, and framed session streams, a connection each); one more is
    /// closed as soon as it is accepted, with a warning in the log. Keep it
    /// below the process's open-file limit.
    pub max_connections: usize,
    /// How long a new connection may take to send its HTTP/2 preface (or a
    /// framed session stream's magic, and then its hello) before it is
    /// closed.
    pub handshake_timeout: Duration,
    /// Where the HTTP listener serves `/metrics` (Prometheus), `/healthz`,
    /// `/readyz` and the live web page of the lock table; `None` (the
    /// default) serves no HTTP. Port 0 picks a free port (see
    /// [`crate::Server::http_addr`]).
    pub metrics_listen: Option<SocketAddr>,
    /// Most recent grants the grant history keeps per lock (0 keeps none).
    pub history_per_lock: usize,
    /// Most grants the grant history keeps in all (the oldest go first).
    pub history_total: usize,
    /// Grants older than this leave the grant history.
    pub history_max_age: Duration,
    /// This member's id in its Raft group (a server is always a member of
    /// one, alone by default).
    pub node_id: u64,
    /// The members of a new cluster: id and the address its clients and
    /// peers both use. Empty: a one-member cluster, this server at its
    /// listen address. Only read when the data directory is new.
    pub cluster: Vec<(u64, String)>,
    /// Join the cluster whose members listen here (`host:port[,host:port...]`),
    /// as a learner, instead of starting a new one. Only read when the data
    /// directory is new.
    pub join: Option<String>,
    /// The leader promotes a learner to voter once its log is within this
    /// many entries of the leader's; `None` leaves promotion to an operator.
    pub auto_promote_lag: Option<u64>,
    /// How often the leader sends heartbeats to the other members.
    pub raft_heartbeat: Duration,
    /// TLS on the port, for clients and members (module `tls`); `None`
    /// serves plaintext.
    pub tls: Option<TlsFiles>,
    /// The auth file (identities and their grants by name prefix, module
    /// `auth`); `None` lets every caller do everything.
    pub auth_file: Option<PathBuf>,
    /// Sets how long a member waits for a silent leader before it starts an
    /// election: openraft's leader lease (twice this, the longest election
    /// timeout) plus a timeout between this and twice this, at random.
    pub election_timeout: Duration,
    /// Where the core and the Raft log's writer run (see [`Execution`]).
    pub execution: Execution,
    /// The newest log record version this member reads and announces
    /// (module `core::replicated::versions`): this build's by default. A
    /// lower one makes the member act as an older build in a rolling
    /// upgrade (for tests of the gate); it must be between 1 and this
    /// build's.
    pub record_version: u32,
}

/// Where the server's two loops that never wait on the network run: the
/// core (the one owner of the lock state) and the Raft log's writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Execution {
    /// The core as a task of the runtime the server starts on, beside
    /// openraft's tasks and the gRPC service, so that a request crosses no
    /// thread on its way to and from the log. The log's writer is a task
    /// too where its writes do not block (a memory filesystem, a
    /// current-thread runtime) and a thread of its own on a disk, so that
    /// no worker waits for an `fdatasync`. What else blocks or may take
    /// long (opening the storage, installing a leader's snapshot, applying
    /// a long run of entries) goes through `tokio::task::block_in_place`
    /// on a multi-thread runtime: the worker's other tasks, openraft's
    /// heartbeats among them, move to another thread first, and the
    /// blocking task goes on with no wake-up on its own path. Every other
    /// step of the core is bounded (a batch's work budget, a big session's
    /// end in steps). On a current-thread runtime everything runs in
    /// place: what a deterministic simulation needs (crate
    /// `locksmith-sim`: a whole cluster on one thread, in simulated time).
    /// docs/BENCHMARKS.md, "The core on threads or as tasks" and "The Raft
    /// log's writer on a thread of its own", measures it.
    #[default]
    Tasks,
    /// Each on an OS thread of its own, apart from every task: the layout
    /// before, kept to compare (`cargo bench -p locksmith-server --bench
    /// execution`). Every request then crosses to the core's thread, to the
    /// writer's and back, a wake-up each.
    Threads,
}

impl ServerConfig {
    /// A durable server keeping its data in `data_dir`, on [`DEFAULT_LISTEN`].
    pub fn durable(data_dir: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            data_dir: Some(data_dir.into()),
            ..ServerConfig::in_memory()
        }
    }

    /// A server without persistence, on [`DEFAULT_LISTEN`].
    pub fn in_memory() -> ServerConfig {
        ServerConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            data_dir: None,
            grace: Duration::from_secs(10),
            limits: Limits::default(),
            max_sessions: 100_000,
            max_sessions_per_peer: 10_000,
            max_session_ttl: Duration::from_secs(300),
            max_sessions_per_connection: 256,
            max_streams_per_connection: 1024,
            max_message_bytes: 1 << 20,
            max_label_bytes: 256,
            max_unacked_replies: 100_000,
            max_stream_backlog_bytes: 16 << 20,
            max_list_page: 10_000,
            open_timeout: Duration::from_secs(10),
            snapshot_every: 10_000,
            snapshot_log_percent: 100,
            snapshot_log_bytes: 64 << 20,
            segment_bytes: 64 << 20,
            recover_damaged_data: false,
            max_batch: 4096,
            max_batches_in_flight: 16,
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            metrics_listen: None,
            history_per_lock: 16,
            history_total: 10_000,
            history_max_age: Duration::from_secs(3600),
            node_id: 1,
            cluster: Vec::new(),
            join: None,
            auto_promote_lag: None,
            raft_heartbeat: Duration::from_millis(50),
            tls: None,
            auth_file: None,
            election_timeout: Duration::from_millis(200),
            execution: Execution::Tasks,
            record_version: crate::entry::RECORD_VERSION,
        }
    }

    /// The same config listening on `listen`.
    pub fn listen(mut self, listen: SocketAddr) -> ServerConfig {
        self.listen = listen;
        self
    }
}

impl Default for ServerConfig {
    /// Durable in [`DEFAULT_DATA_DIR`] on [`DEFAULT_LISTEN`]: what `locksmith serve` does.
    fn default() -> Self {
        ServerConfig::durable(DEFAULT_DATA_DIR)
    }
}
