//! # locksmith-server: the lock server
//!
//! A dedicated lock service in the spirit of Chubby and SharkLock: the
//! deterministic lock engine of `locksmith-core` behind a gRPC API
//! (`locksmith-proto`), made durable by a command log with group commit.
//!
//! ```no_run
//! # async fn run() -> Result<(), locksmith_server::ServerError> {
//! use locksmith_server::{Server, ServerConfig};
//!
//! let config = ServerConfig::durable("./locksmith-data").listen("127.0.0.1:0".parse().unwrap());
//! let server = Server::start(config).await?;      // binds, recovers, serves
//! println!("clients connect to {}", server.url()); // locksmith://127.0.0.1:<port>
//! server.shutdown().await?;                       // ends sessions' streams, snapshots
//! # Ok(()) }
//! ```
//!
//! `locksmith serve` is [`serve`] with the command line's config and
//! SIGINT/SIGTERM as the shutdown signal, on the runtime [`runtime::build`]
//! makes (one worker by default, and no LIFO slot: answers that leave
//! together are written together).
//!
//! ## How a request flows
//!
//! ```text
//! client ──ClientBatch──▶ service (a task per stream) ──Op──▶ core (a task)
//!                                                      │ records, one log entry per batch
//!                                                      ▼
//!                                    openraft: append + fdatasync (group commit,
//!                                    the log's writer), replicate, commit
//!                                    on a quorum
//!                                                      │
//!                          the state machine hands committed entries over
//!                          (RaftEvent::Apply, every member alike)
//!                                                      ▼
//!                                                  core: engine.apply
//! client ◀──ServerBatch── stream / unary reply ◀───────┘ replies and pushes,
//!                                                        one batch per stream
//! ```
//!
//! - **Batches on the wire**: a client sends every request it has ready as
//!   one `ClientBatch` and gets everything one engine batch produced for it as
//!   one `ServerBatch`, so a connection multiplexing many callers pays
//!   framing, encoding, syscalls and wake-ups per batch, not per request (like
//!   a pipelined Redis connection).
//! - **Cheap fsyncs**: the log is written over zeros kept ahead of its end, so
//!   an `fdatasync` flushes data only, not the file's new size (module
//!   `storage`), and a batch that makes nothing visible waits for the next
//!   commit instead of paying one of its own.
//! - **One owner of the engine**: the core (module `core`) is the only
//!   code that touches the lock table. The server never decides lock semantics:
//!   every decision is an engine command, including time-driven ones (expiry,
//!   timeouts), which the core asks the engine for ([`locksmith_core::Engine::due`])
//!   and then applies and logs like any request. Replaying the log therefore
//!   rebuilds exactly the same state, on every member of a replicated server
//!   (module `raft`).
//! - **Durable by default**: a reply or push leaves only after the log records
//!   of its batch (and every earlier one) are fsynced; one fsync covers every
//!   request that arrived meanwhile (group commit), and a batch that makes
//!   nothing visible waits for the next one instead of an fsync of its own.
//!   Snapshots bound the log; recovery is snapshot + replay (module `storage`
//!   describes the files). Fencing tokens therefore never go backwards, even
//!   after kill -9 in the middle of a load.
//! - **Sessions survive restarts**: after recovery every session gets a grace
//!   period ([`ServerConfig::grace`], at least its TTL) to resume with its id
//!   and secret before its holds expire (Chubby's grace period). A resumed
//!   client re-sends unanswered requests with their ids and gets the kept
//!   replies (exactly-once per request id).
//! - **Limits** on everything a client controls, each with its own error:
//!   name length and names per acquire, waiters per lock, holds per session,
//!   TTL/lease/lock-delay bounds ([`locksmith_core::Limits`]); sessions
//!   ([`ServerConfig::max_sessions`]), sessions per connection
//!   ([`ServerConfig::max_sessions_per_connection`]; one session per stream),
//!   streams per connection ([`ServerConfig::max_streams_per_connection`]),
//!   message size ([`ServerConfig::max_message_bytes`]), owner and client label
//!   length ([`ServerConfig::max_label_bytes`]), connections
//!   ([`ServerConfig::max_connections`]) and the time to finish the HTTP/2
//!   handshake or a framed stream's hello ([`ServerConfig::handshake_timeout`]); running out of file
//!   descriptors makes the accept loop back off and say so (module `accept`).
//!   Garbage on the port or a malformed message closes that one connection or
//!   stream, nothing else.
//!
//! The API is usable with `grpcurl` (server reflection is on):
//!
//! ```text
//! grpcurl -plaintext 127.0.0.1:7420 list locksmith.v1.Locksmith
//! grpcurl -plaintext -d '{"acquire": {"names": ["jobs/nightly"], "owner": "cron", "lease_ms": 30000}}' \
//!     127.0.0.1:7420 locksmith.v1.Locksmith/AcquireLease
//! grpcurl -plaintext -d '{"prefix": ""}' 127.0.0.1:7420 locksmith.v1.Locksmith/List
//! ```
#![deny(missing_docs)]

mod accept;
mod auth;
mod blocking;
mod clock;
mod config;
mod convert;
mod core;
mod entry;
mod environment;
mod error;
mod framed_session;
mod framed_write;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod history;
mod http;
mod inbox;
mod metrics;
mod op;
mod outbox;
mod pulse;
mod raft;
mod random;
#[cfg(test)]
mod replay_tests;
mod requests;
pub mod runtime;
mod service;
mod session_channels;
mod session_stream;
mod stats;
mod storage;
mod stream_queue;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use locksmith_proto::v1::locksmith_server::LocksmithServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::auth::token_sha256;
pub use crate::clock::WallClock;
pub use crate::config::{Execution, ServerConfig, DEFAULT_DATA_DIR, DEFAULT_LISTEN};
pub use crate::environment::{Accepting, ApplyPace, Environment, Listener, Syncing, WriteCache};
pub use crate::error::ServerError;
pub use crate::storage::backup;
pub use crate::tls::TlsFiles;
pub use locksmith_core::Limits;

use crate::auth::Auth;
use crate::core::{Core, Replica};
use crate::framed_session::FramedSessions;
use crate::http::Readiness;
use crate::inbox::{CoreSender, Input};
use crate::metrics::Metrics;
use crate::raft::admin::ClusterService;
use crate::raft::member::Storage;
use crate::raft::propose::HeartbeatLease;
use crate::raft::state_machine::CoreMachine;
use crate::service::Service;
use crate::stats::Stats;
use crate::tls::{MemberCheck, Tls};
use locksmith_proto::raft::cluster_server::ClusterServer;

/// How long a graceful shutdown waits for connections to close before it
/// drops them.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Counters of the engine loop since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Batches the engine thread processed (each woke it once).
    pub batches: u64,
    /// Operations (requests, stream messages, unary calls) in those batches.
    pub ops: u64,
    /// `fdatasync` calls of the log (one per batch that changed state).
    pub fsyncs: u64,
    /// Log records written (state-changing commands).
    pub records: u64,
    /// Time spent writing and fsyncing the log.
    pub commit_time: Duration,
    /// Raft snapshots this member built (`--snapshot-every`,
    /// `--snapshot-log-percent`; not backups, nor snapshots installed from a
    /// leader).
    pub snapshots: u64,
}

/// A running server. Dropping it shuts it down in the background; prefer
/// [`Server::shutdown`], which reports how it went.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    stats: Arc<Stats>,
    http_addr: Option<SocketAddr>,
    auth: Option<Arc<Auth>>,
    tls: bool,
}

impl Server {
    /// Binds the listen address, recovers the state from the data directory (if
    /// durable), then listens and starts serving on the current tokio runtime
    /// (until then a connection is refused). Returns once clients can
    /// connect.
    ///
    /// Cancel safety: not cancel safe in a useful way: if dropped after recovery
    /// started, the engine thread may be left running until the process ends.
    /// Await it to completion.
    pub async fn start(config: ServerConfig) -> Result<Server, ServerError> {
        Server::start_in(config, Environment::machine()).await
    }

    /// [`Server::start`] in `environment`: with a wall clock, a listener
    /// and a way to reach the other members of its own (a simulation's).
    ///
    /// Boxed, and not an `async fn`, so that the start (every task it
    /// spawns, and openraft's machinery they instantiate) is compiled once,
    /// in this crate: an `async fn`'s body is compiled in each crate that
    /// awaits it. The command line, the simulator and every test binary did,
    /// twice the server's own code each (`cargo llvm-lines`).
    ///
    /// Cancel safety: as [`Server::start`].
    pub fn start_in(
        config: ServerConfig,
        environment: Environment,
    ) -> Pin<Box<dyn Future<Output = Result<Server, ServerError>> + Send>> {
        Box::pin(Server::start_here(config, environment))
    }

    /// The body of [`Server::start_in`].
    async fn start_here(
        config: ServerConfig,
        environment: Environment,
    ) -> Result<Server, ServerError> {
        let Environment {
            wall_clock,
            listener: given_listener,
            connector,
            write_cache,
            apply_pace,
        } = environment;
        let tls = config.tls.as_ref().map(Tls::load).transpose()?;
        let has_peers = config.cluster.len() > 1 || config.join.is_some();
        if let (Some(files), Some(Tls { peer: None, .. })) = (&config.tls, &tls) {
            if has_peers {
                return Err(ServerError::Security {
                    path: files.cert.clone(),
                    detail: "members of a cluster with TLS need --tls-peer-ca: they \
                             authenticate each other with certificates it signed"
                        .into(),
                });
            }
        }
        let auth = config.auth_file.as_deref().map(Auth::load).transpose()?;
        if auth.is_some() && tls.is_none() {
            tracing::warn!(
                "authentication without TLS: tokens cross the network in the clear, \
                 and members' traffic is not authenticated"
            );
        }
        let peer_tls = tls.as_ref().and_then(|tls| tls.peer.clone());
        let peer_grpc_tls = peer_tls.as_ref().map(|tls| tls.grpc.clone());
        let (listener, addr) = match given_listener {
            Some(_) if tls.is_some() => {
                return Err(ServerError::Config(
                    "TLS needs the server's own TCP listener, not a given one".into(),
                ))
            }
            Some(given) => (BoundTo::Given(given), config.listen),
            None => {
                let socket = bind(config.listen).map_err(|source| ServerError::Bind {
                    addr: config.listen,
                    source,
                })?;
                let addr = socket.local_addr().map_err(|source| ServerError::Bind {
                    addr: config.listen,
                    source,
                })?;
                (BoundTo::Tcp(socket), addr)
            }
        };
        let (ops, receiver) = if config.execution == Execution::Threads {
            let (ops, receiver) = CoreSender::channel();
            (ops, CoreInbox::Thread(receiver))
        } else {
            let (ops, receiver) = CoreSender::task_channel();
            (ops, CoreInbox::Task(receiver))
        };
        let stop = CancellationToken::new();
        // Health and metrics answer while the log replays; the listener
        // stops with the server, or at once if recovery fails.
        let stop_on_error = stop.clone().drop_guard();
        let metrics = Arc::new(Metrics::new());
        let readiness = Arc::new(Readiness::default());
        let member = Arc::new(std::sync::OnceLock::new());
        let http_addr = match config.metrics_listen {
            Some(addr) => Some(
                http::start(
                    addr,
                    ops.clone(),
                    metrics.clone(),
                    readiness.clone(),
                    member.clone(),
                    auth.is_some(),
                    stop.clone(),
                )
                .await?,
            ),
            None => None,
        };
        let storage = blocking::run(|| Storage::open(&config, write_cache))?;
        let Storage {
            log,
            snapshot,
            snapshots,
            tokens,
            token_floor,
            keep,
        } = storage;
        let (proposer, openers) = raft::propose::Proposer::new();
        let (serving_tx, mut serving_rx) = tokio::sync::watch::channel(false);
        let replica = Replica::new(proposer, serving_tx, config.max_batches_in_flight);
        let mut core = Core::new(&config, replica, tokens);
        core.use_wall_clock(wall_clock);
        if let Some(snapshot) = &snapshot {
            core.install_snapshot(snapshot.meta.clone(), snapshot.data.clone())
                .map_err(|detail| ServerError::Corrupt {
                    path: config.data_dir.clone().unwrap_or_default().join("snapshot"),
                    detail,
                })?;
        }
        if let Some(detail) = core.needs_upgrade() {
            return Err(ServerError::Incompatible {
                path: config.data_dir.clone().unwrap_or_default().join("snapshot"),
                detail,
            });
        }
        if let Some(floor) = token_floor {
            core.raise_token_floor(floor);
        }
        core.count_in(metrics.clone());
        let versions = raft::versions::Versions::new(config.record_version);
        core.publish_versions(versions.clone());
        let unary_ids = core.unary_ids();
        let stats = core.stats();
        let machine =
            CoreMachine::new(ops.clone(), snapshots, snapshot, stats.clone()).paced_by(apply_pace);
        let sized = (log.clone(), machine.clone());
        let raft = raft::member::open(&config, log, machine, peer_tls, connector.clone()).await?;
        core.connect_raft(raft.clone(), ops.clone());
        let (exit_tx, exit_rx) = oneshot::channel();
        let serving = readiness.clone();
        // The core runs as a task beside openraft's (or on a thread of its
        // own, `Execution::Threads`). Either way no step of it may hold up
        // Raft's heartbeats for long, or the leader loses its leadership:
        // see `Execution::Tasks`.
        match receiver {
            CoreInbox::Thread(receiver) => {
                std::thread::Builder::new()
                    .name("locksmith-engine".into())
                    .spawn(move || {
                        let _ = exit_tx.send(core.run(receiver));
                        serving.set_serving(false);
                    })
                    .map_err(|source| ServerError::Io {
                        context: "cannot start the engine thread".into(),
                        source,
                    })?;
            }
            CoreInbox::Task(receiver) => {
                tokio::spawn(async move {
                    let _ = exit_tx.send(core.run_as_task(receiver).await);
                    serving.set_serving(false);
                });
            }
        }
        raft::member::start(
            &config,
            addr.to_string(),
            &raft,
            ops.clone(),
            openers,
            sized,
        )
        .await?;
        metrics.follow_raft(raft.clone());
        let _ = member.set(raft.clone());
        let changes = raft::admin::ChangesUnderWay::default();
        // Five election timeouts: far longer than a change under way takes
        // between its two steps.
        raft::admin::spawn_joint_finisher(
            raft.clone(),
            changes.clone(),
            config.election_timeout * 5,
        );
        if let Some(lag) = config.auto_promote_lag {
            raft::admin::spawn_auto_promote(raft.clone(), changes.clone(), lag);
        }
        tokio::spawn(raft::versions::run(
            raft.clone(),
            versions.clone(),
            ops.clone(),
            peer_grpc_tls.clone(),
            connector.clone(),
        ));
        if config.cluster.len() <= 1 && config.join.is_none() {
            // A group of one elects itself at once: serve when it has.
            let _ = serving_rx.wait_for(|serving| *serving).await;
        }

        let lease = HeartbeatLease::new(raft.clone(), core::heartbeat_lease(&config));
        let service = Service::new(ops.clone(), unary_ids, &config, auth.clone(), lease);
        let framed = FramedSessions::new(
            service.clone(),
            config.handshake_timeout,
            config.max_message_bytes,
        );
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(locksmith_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| tracing::warn!(error = %e, "gRPC reflection is off"))
            .ok();
        let stop_accepting = CancellationToken::new();
        let limits = accept::AcceptLimits {
            max_connections: config.max_connections,
            handshake_timeout: config.handshake_timeout,
        };
        let members = tls
            .as_ref()
            .map_or(MemberCheck::Open, |tls| tls.members.clone());
        let appends = raft::append_stream::AppendStreams::new(
            raft.clone(),
            members.clone(),
            raft::peer_message_bytes(config.max_message_bytes),
        );

        let router = tonic::transport::Server::builder()
            .max_concurrent_streams(config.max_streams_per_connection)
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .add_service(
                LocksmithServer::new(service).max_decoding_message_size(config.max_message_bytes),
            )
            .add_service(raft::network::raft_server(
                raft.clone(),
                members.clone(),
                raft::peer_message_bytes(config.max_message_bytes),
            ))
            .add_service(ClusterServer::new(ClusterService::new(
                raft.clone(),
                ops.clone(),
                versions.clone(),
                auth.clone(),
                members,
                changes,
            )))
            .add_optional_service(reflection);
        let stopped_accepting = stop_accepting.clone().cancelled_owned();
        // Recovered: connections are taken from now on.
        let listener = match listener {
            BoundTo::Tcp(socket) => Listening::Tcp(
                socket
                    .listen(LISTEN_BACKLOG)
                    .map_err(|source| ServerError::Bind { addr, source })?,
            ),
            BoundTo::Given(given) => Listening::Given(given),
        };
        let serve: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
            match (listener, &tls) {
                (Listening::Tcp(listener), Some(tls)) => {
                    let acceptor = tls.acceptor.clone();
                    let (incoming, accepting) = accept::incoming(
                        listener,
                        limits,
                        move |tcp| acceptor.accept(tcp),
                        framed_handlers(framed, appends),
                    );
                    Box::pin(serve_until_closed(
                        router.serve_with_incoming_shutdown(incoming, stopped_accepting),
                        accepting,
                    ))
                }
                (Listening::Tcp(listener), None) => {
                    let (incoming, accepting) = accept::incoming(
                        listener,
                        limits,
                        |tcp| async { Ok(tcp) },
                        framed_handlers(framed, appends),
                    );
                    Box::pin(serve_until_closed(
                        router.serve_with_incoming_shutdown(incoming, stopped_accepting),
                        accepting,
                    ))
                }
                (Listening::Given(listener), _) => {
                    let (incoming, accepting) = accept::incoming(
                        listener,
                        limits,
                        |io| async { Ok(io) },
                        framed_handlers(framed, appends),
                    );
                    Box::pin(serve_until_closed(
                        router.serve_with_incoming_shutdown(incoming, stopped_accepting),
                        accepting,
                    ))
                }
            };

        let durable = config.data_dir.is_some();
        let serving_now = readiness.clone();
        let joiner = raft.clone();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                // The directory's lock, or the temporary log, until stopped.
                let _keep = keep;
                tokio::pin!(serve);
                let mut exit_rx = exit_rx;
                let (engine, transport) = tokio::select! {
                    result = &mut serve => {
                        // The transport failed: stop the engine cleanly too.
                        let (done, _) = oneshot::channel();
                        let _ = ops.send(Input::Shutdown { done });
                        (exit_rx.await, Some(result))
                    }
                    _ = stop.cancelled() => {
                        readiness.set_serving(false);
                        raft::member::snapshot_before_stopping(&raft).await;
                        // openraft first: it applies nothing more, then the
                        // core ends its streams.
                        let _ = raft.shutdown().await;
                        let (done, _) = oneshot::channel();
                        let _ = ops.send(Input::Shutdown { done });
                        (exit_rx.await, None)
                    }
                    result = &mut exit_rx => (result, None),
                };
                stop_accepting.cancel();
                let transport = match transport {
                    Some(result) => result,
                    None => tokio::time::timeout(SHUTDOWN_DRAIN, serve)
                        .await
                        .unwrap_or(Ok(())),
                };
                match engine {
                    Ok(Ok(())) => {}
                    Ok(Err(message)) => return Err(ServerError::EngineStopped(message)),
                    Err(_) => {
                        return Err(ServerError::EngineStopped("engine thread panicked".into()))
                    }
                }
                transport.map_err(ServerError::from)?;
                tracing::info!("server stopped");
                Ok(())
            }
        });
        if let Some(through) = config.join.clone() {
            // Once this member's port serves (the leader replicates to it).
            let (id, address) = (config.node_id, addr.to_string());
            let joined = move || raft::admin::applied_member(&joiner, id);
            tokio::spawn(async move {
                match raft::admin::join(&through, id, &address, peer_grpc_tls, connector, joined)
                    .await
                {
                    Ok(()) => tracing::info!(%through, "joined the cluster as a learner"),
                    Err(error) => tracing::error!(%error, "could not join the cluster"),
                }
            });
        }
        stop_on_error.disarm();
        serving_now.set_serving(true);
        tracing::info!(%addr, durable, tls = tls.is_some(), auth = auth.is_some(), "locksmith server listening");
        Ok(Server {
            addr,
            stop,
            task: Some(task),
            stats,
            http_addr,
            tls: tls.is_some(),
            auth,
        })
    }

    /// The address the server listens on (with the real port when the config
    /// asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the HTTP listener (metrics, health, web page), when
    /// [`ServerConfig::metrics_listen`] asked for one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The engine loop's counters so far (average batch size = ops / batches,
    /// group commit = records / fsyncs).
    pub fn stats(&self) -> ServerStats {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        ServerStats {
            batches: load(&self.stats.batches),
            ops: load(&self.stats.ops),
            fsyncs: load(&self.stats.fsyncs),
            records: load(&self.stats.records),
            commit_time: Duration::from_nanos(load(&self.stats.commit_nanos)),
            snapshots: load(&self.stats.snapshots),
        }
    }

    /// The client URL of this server: `locksmith://<addr>`, or
    /// `locksmith+tls://<addr>` with TLS on (a client adds `?ca=FILE`).
    pub fn url(&self) -> String {
        let scheme = if self.tls {
            "locksmith+tls"
        } else {
            "locksmith"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Reads the auth file again ([`ServerConfig::auth_file`]); if it does not
    /// load, the previous one stays in force and the error (also logged) says
    /// why. Does nothing without authentication.
    pub fn reload_auth(&self) -> Result<(), String> {
        match &self.auth {
            Some(auth) => auth.reload(),
            None => Ok(()),
        }
    }

    /// Completes when the server stops by itself (a storage failure), with the
    /// reason. Completes at once if it already stopped and was awaited.
    ///
    /// Cancel safety: safe; awaiting again later still sees the outcome.
    pub async fn stopped(&mut self) -> Result<(), ServerError> {
        match self.task.as_mut() {
            Some(task) => {
                let result = task
                    .await
                    .unwrap_or_else(|e| Err(ServerError::EngineStopped(e.to_string())));
                self.task = None;
                result
            }
            None => Ok(()),
        }
    }

    /// Stops gracefully: ends every session stream (clients will resume after a
    /// restart), writes a snapshot, stops the engine and closes the listener.
    ///
    /// Cancel safety: the shutdown continues in the background if dropped.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop.cancel();
        self.stopped().await
    }
}

/// Where the server will take connections from, while it recovers.
enum BoundTo {
    /// The listen address, bound but not yet listening: see [`bind`].
    Tcp(tokio::net::TcpSocket),
    Given(Box<dyn Listener>),
}

/// Where the server takes connections from, once it has recovered.
enum Listening {
    Tcp(tokio::net::TcpListener),
    Given(Box<dyn Listener>),
}

/// Connections waiting to be accepted, as tokio's `TcpListener::bind` allows.
const LISTEN_BACKLOG: u32 = 1024;

/// Binds `addr` without listening on it yet. A port in use fails the start
/// at once, before a recovery that may take seconds; and until the server
/// listens, once recovered, a connection to it is refused. Listening from the
/// start, the kernel would accept connections nobody reads while the member
/// reads a big snapshot: a client, or a peer, would wait on one until its
/// own timeout and then pass the member over, even once it leads (a cluster
/// restored from a backup of a million locks served its first client after
/// 10 s instead of 4; docs/BENCHMARKS.md, "A member listens once it has
/// recovered"). Refused, the client goes on to the next member at once.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does on Unix: a restarted server can bind its
    // port while connections of its previous run linger in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Serves until `serving` ends, then waits for the accept loop to close the
/// listener (it does once `serving` has dropped the connections' stream):
/// a server that has stopped has freed its address.
///
/// Cancel safety: dropped, the accept loop still ends on its own.
/// The accept loop's handlers of the framed streams, for connections of
/// type `S`.
fn framed_handlers<S>(
    sessions: FramedSessions,
    appends: raft::append_stream::AppendStreams,
) -> accept::FramedHandlers<S>
where
    S: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    accept::FramedHandlers {
        session: sessions.handler(),
        append: appends.handler(),
    }
}

async fn serve_until_closed<E>(
    serving: impl Future<Output = Result<(), E>>,
    accepting: JoinHandle<()>,
) -> Result<(), E> {
    let served = serving.await;
    let _ = accepting.await;
    served
}

/// The receiving end of the core's channel, for its thread or its task.
enum CoreInbox {
    Thread(std::sync::mpsc::Receiver<crate::inbox::Input>),
    Task(crate::inbox::TaskInbox),
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Runs a server until `shutdown` completes (then stops it gracefully) or
/// until it fails.
///
/// Cancel safety: dropping the future shuts the server down in the background.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut server = Server::start(config).await?;
    tokio::select! {
        _ = shutdown => {}
        result = server.stopped() => return result,
    }
    tracing::info!("shutting down");
    server.shutdown().await
}
