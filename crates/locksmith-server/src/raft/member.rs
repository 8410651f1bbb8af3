//! Starting this server's member of its Raft group: the log, openraft, the
//! proposer and the watch on its role.
//!
//! A server is always a member: without cluster flags, of a group of one at
//! its own address, which elects itself at once. The core (the state
//! machine) runs on its own thread and is fed through the op channel; this
//! module wires openraft to it in both directions:
//!
//! - **proposals**: the core sends each batch to the proposer task, which
//!   hands it to openraft and, while this member still leads, retries it
//!   when the leader lease has not been confirmed yet (right after an
//!   election);
//! - **applies**: openraft's state machine ([`CoreMachine`]) passes committed
//!   entries to the core;
//! - **role**: a task watches openraft's metrics and tells the core when this
//!   member becomes or stops being the leader, and where the leader is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, ForwardReason, RaftError};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::sync::mpsc::UnboundedReceiver;

use super::network::PeerNetwork;
use super::state_machine::CoreMachine;
use super::{Batch, Raft};
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::op::{Op, Role};
use crate::storage::raft_log::RaftLog;

/// Bytes per second a snapshot is sent to a member at, at most, so that
/// catching up a member does not starve the group's own traffic.
const SNAPSHOT_RATE: u64 = 64 << 20;

/// Where the member's Raft log lives: `<data dir>/raft`, or a temporary
/// directory (in memory when `/dev/shm` exists) for a server without a data
/// directory, removed when it stops.
pub(crate) enum LogDir {
    Durable(PathBuf),
    Temporary(tempfile::TempDir),
}

impl LogDir {
    pub(crate) fn of(config: &ServerConfig) -> Result<LogDir, ServerError> {
        match &config.data_dir {
            Some(dir) => {
                let raft = dir.join("raft");
                std::fs::create_dir_all(&raft).map_err(|source| ServerError::Io {
                    context: format!("cannot create {}", raft.display()),
                    source,
                })?;
                Ok(LogDir::Durable(raft))
            }
            None => {
                let shm = std::path::Path::new("/dev/shm");
                let builder = tempfile::Builder::new()
                    .prefix("locksmith-raft-")
                    .tempdir_in(if shm.is_dir() {
                        shm.to_path_buf()
                    } else {
                        std::env::temp_dir()
                    });
                builder
                    .map(LogDir::Temporary)
                    .map_err(|source| ServerError::Io {
                        context: "cannot create a temporary directory for the Raft log".into(),
                        source,
                    })
            }
        }
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        match self {
            LogDir::Durable(path) => path,
            LogDir::Temporary(dir) => dir.path(),
        }
    }
}

/// openraft's settings from the server's.
pub(crate) fn raft_config(config: &ServerConfig) -> Result<Config, ServerError> {
    let election = config.election_timeout.as_millis() as u64;
    Config {
        cluster_name: "locksmith".into(),
        heartbeat_interval: config.raft_heartbeat.as_millis() as u64,
        election_timeout_min: election,
        election_timeout_max: election * 2,
        enable_pre_vote: Some(true),
        // Snapshots are not kept on disk yet: the log keeps everything.
        snapshot_policy: SnapshotPolicy::Never,
        ..Config::default()
    }
    .validate()
    .map_err(|e| ServerError::Config(format!("invalid Raft settings: {e}")))
}

/// Starts openraft for this member over `log`, with the core as state
/// machine, initializes a new group, and starts the proposer and the role
/// watch. `address` is where this member's clients and peers reach it.
pub(crate) async fn start(
    config: &ServerConfig,
    address: String,
    log: RaftLog,
    machine: CoreMachine,
    core: Sender<Op>,
    proposals: UnboundedReceiver<Batch>,
) -> Result<Raft, ServerError> {
    let raft_config = Arc::new(raft_config(config)?);
    let network = PeerNetwork {
        snapshot_rate: SNAPSHOT_RATE,
    };
    let raft = Raft::new(config.node_id, raft_config, network, log, machine)
        .await
        .map_err(|e| ServerError::Raft(format!("cannot start: {e}")))?;
    // A leader whose quorum lease is not confirmed refuses proposals: right
    // after its election for a moment, or for as long as it is cut off from
    // a quorum. The lease is the longest election timeout.
    let patience = config.election_timeout * 2;
    tokio::spawn(propose(raft.clone(), proposals, core.clone(), patience));
    tokio::spawn(watch_role(raft.clone(), config.node_id, core));
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    if !initialized {
        let members: BTreeMap<u64, BasicNode> = if config.cluster.is_empty() {
            BTreeMap::from([(config.node_id, BasicNode::new(address))])
        } else {
            config
                .cluster
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect()
        };
        tracing::info!(members = ?members.keys().collect::<Vec<_>>(), "initializing a new cluster");
        if let Err(error) = raft.initialize(members).await {
            // Another member initialized the group first: it replicates the
            // same membership here.
            tracing::info!(%error, "the cluster is initialized already");
        }
    }
    Ok(raft)
}

/// Hands the core's batches to openraft in order, one at a time. A leader
/// whose lease is not confirmed retries for up to `patience` (a new leader's
/// lease is confirmed by its first round of heartbeats); a batch refused in
/// the end was never appended, and the core is told so ([`Op::Refused`]).
async fn propose(
    raft: Raft,
    mut proposals: UnboundedReceiver<Batch>,
    core: Sender<Op>,
    patience: Duration,
) {
    while let Some(batch) = proposals.recv().await {
        let started = tokio::time::Instant::now();
        loop {
            match raft.client_write(batch.clone()).await {
                Ok(_) => break,
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))
                    if forward.reason == ForwardReason::LeaseExpired
                        && raft.is_leader()
                        && started.elapsed() < patience =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "a batch was refused");
                    let refused = Op::Refused {
                        origin: batch.origin,
                        seq: batch.seq,
                        reason: error.to_string(),
                    };
                    if core.send(refused).is_err() {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

/// Tells the core its role whenever openraft's metrics change it.
async fn watch_role(raft: Raft, me: u64, core: Sender<Op>) {
    let mut metrics = raft.metrics();
    let mut last = None;
    loop {
        let role = {
            let m = metrics.borrow_and_update();
            if m.state == ServerState::Leader && m.current_leader == Some(me) {
                Role::Leader
            } else {
                let leader = m.current_leader.filter(|&id| id != me).and_then(|id| {
                    m.membership_config
                        .membership()
                        .get_node(&id)
                        .map(|node| node.addr.clone())
                });
                Role::Follower { leader }
            }
        };
        if last.as_ref() != Some(&role) {
            last = Some(role.clone());
            if core.send(Op::Role(role)).is_err() {
                return;
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
