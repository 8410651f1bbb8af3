//! Starting this server's member of its Raft group: the log, openraft, the
//! proposer and the watch on its role.
//!
//! A server is always a member: without cluster flags, of a group of one at
//! its own address, which elects itself at once. The core (the state
//! machine) runs on its own thread and is fed through the op channel; this
//! module wires openraft to it in both directions:
//!
//! - **proposals**: the core hands each batch to openraft itself
//!   (module `propose`); a task sends a new leader's first batch again
//!   while its lease is not confirmed yet (right after an election);
//! - **applies**: openraft's state machine ([`CoreMachine`]) passes committed
//!   entries to the core;
//! - **role**: a task watches openraft's metrics and tells the core when this
//!   member becomes or stops being the leader, and where the leader is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::planted::{self, Defect};
use openraft::async_runtime::WatchReceiver;
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::sync::mpsc::UnboundedReceiver;

use super::network::PeerNetwork;
use super::propose::run_openers;
use super::state_machine::CoreMachine;
use super::Raft;
use crate::config::ServerConfig;
use crate::entry::Batch;
use crate::environment::WriteCache;
use crate::error::ServerError;
use crate::inbox::{CoreSender, RaftEvent, Role};
use crate::storage::files::TemporaryDir;
use crate::storage::member::{MemberDir, SnapshotFile, StoredSnapshot, TokenCeiling};
use crate::storage::raft_log::RaftLog;

/// Bytes per second a snapshot is sent to a member at, at most, so that
/// catching up a member does not starve the group's own traffic.
const SNAPSHOT_RATE: u64 = 64 << 20;

/// What a member keeps on disk, opened: its data directory, or for a server
/// without one, a Raft log in a temporary directory (in memory when
/// `/dev/shm` exists) that is removed when the server stops.
pub(crate) struct Storage {
    pub log: RaftLog,
    /// The newest snapshot kept, and where snapshots go (durable only).
    pub snapshot: Option<StoredSnapshot>,
    pub snapshots: Option<SnapshotFile>,
    pub tokens: Option<TokenCeiling>,
    /// After a forced recovery: every token from now on is above it.
    pub token_floor: Option<u64>,
    /// Held while the server runs (the directory's lock, or the temporary
    /// directory).
    pub keep: Keep,
}

/// What the running server holds on to (dropped when it stops: the
/// directory's lock is released, a temporary directory removed).
#[allow(dead_code)] // held for its drop
pub(crate) enum Keep {
    Directory(MemberDir),
    Temporary(TemporaryDir),
}

impl Storage {
    /// Opens the member's storage (blocking: it reads the log).
    pub(crate) fn open(
        config: &ServerConfig,
        write_cache: Option<Arc<dyn WriteCache>>,
    ) -> Result<Storage, ServerError> {
        if let Some(dir) = &config.data_dir {
            let opened = MemberDir::open(dir, config, write_cache)?;
            return Ok(Storage {
                log: opened.log,
                snapshot: opened.snapshot,
                snapshots: Some(opened.snapshots),
                tokens: Some(opened.tokens),
                token_floor: opened.token_floor,
                keep: Keep::Directory(opened.dir),
            });
        }
        let shm = std::path::Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let temporary = TemporaryDir::create(&parent, "locksmith-raft-")?;
        Ok(Storage {
            log: RaftLog::open_on(
                temporary.path(),
                config.segment_bytes,
                config.execution,
                write_cache,
            )?,
            snapshot: None,
            snapshots: None,
            tokens: None,
            token_floor: None,
            keep: Keep::Temporary(temporary),
        })
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
        // A restarted leader wins an election before it leads again, as in
        // standard Raft. openraft would otherwise restore its leadership of
        // the same term at once; but a leader's entries may be committed by
        // its followers before its own write is synced, so after a power
        // loss it can come back without them and append other entries at
        // their indexes under the same ids, which the followers take for
        // the ones they have (found by the simulator, seed 272 with
        // `--mixed --membership --slow-disks`; `--plant leader-restore`).
        enable_leader_restore: Some(planted::active(Defect::LeaderRestore)),
        max_payload_entries: super::ENTRIES_PER_APPEND,
        // By the log's growth against the snapshot's size
        // (`snapshot_policy`), or by openraft's entry count alone.
        snapshot_policy: if config.snapshot_log_percent > 0 {
            SnapshotPolicy::Never
        } else {
            SnapshotPolicy::LogsSinceLast(config.snapshot_every.max(1))
        },
        // Entries kept after a snapshot, for a member a little behind (more
        // than that and it gets the snapshot).
        max_in_snapshot_log_to_keep: config.snapshot_every.clamp(1, 1000),
        ..Config::default()
    }
    .validate()
    .map_err(|e| ServerError::Config(format!("invalid Raft settings: {e}")))
}

/// Starts openraft for this member over `log`, with the core as state
/// machine (entries it applies wait in the core's channel until the core's
/// thread runs).
///
/// Cancel safety: nothing keeps running if it is dropped (openraft starts its
/// tasks only as it returns), and the log and machine go with it; committed
/// entries it replayed may wait in the core's channel, and a purge of entries
/// the kept snapshot covers may have been written: harmless to a later start.
pub(crate) async fn open(
    config: &ServerConfig,
    log: RaftLog,
    machine: CoreMachine,
    tls: Option<crate::tls::PeerTls>,
    connector: Option<locksmith_proto::transport::Connector>,
) -> Result<Raft, ServerError> {
    let raft_config = Arc::new(raft_config(config)?);
    let max_frame = super::peer_message_bytes(config.max_message_bytes);
    let network = PeerNetwork::new(SNAPSHOT_RATE, tls, max_frame).connecting_with(connector);
    Raft::new(config.node_id, raft_config, network, log, machine)
        .await
        .map_err(|e| ServerError::Raft(format!("cannot start: {e}")))
}

/// Starts the tasks that write new leaders' first batches, watch the
/// member's role and (with a snapshot log percentage) ask for snapshots over
/// `sized`, the log and the machine openraft runs on, then initializes a
/// new group. `address` is where this member's clients and peers reach it.
///
/// Cancel safety: the openers' and role tasks are spawned before the first
/// await and keep running if it is dropped; a dropped initialization may or
/// may not have been made (once asked, openraft makes it), and a delayed one
/// (`--cluster`) may not have been started.
pub(crate) async fn start(
    config: &ServerConfig,
    address: String,
    raft: &Raft,
    core: CoreSender,
    openers: UnboundedReceiver<Batch>,
    sized: (RaftLog, CoreMachine),
) -> Result<(), ServerError> {
    // A leader whose quorum lease is not confirmed refuses proposals: right
    // after its election for a moment, or for as long as it is cut off from
    // a quorum. The lease is the longest election timeout.
    let patience = config.election_timeout * 2;
    tokio::spawn(run_openers(raft.clone(), openers, core.clone(), patience));
    tokio::spawn(watch_role(raft.clone(), config.node_id, core));
    if config.snapshot_log_percent > 0 {
        let (log, machine) = sized;
        tokio::spawn(super::snapshot_policy::run(
            raft.clone(),
            log,
            machine,
            super::snapshot_policy::Floor {
                entries: config.snapshot_every,
                log_bytes: config.snapshot_log_bytes,
            },
            config.snapshot_log_percent,
        ));
    }
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    if !initialized && config.join.is_none() {
        if config.cluster.len() <= 1 {
            let members = BTreeMap::from([(config.node_id, BasicNode::new(address))]);
            initialize(raft, members).await;
        } else {
            let members = config
                .cluster
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect();
            let patience = config.election_timeout * 5;
            tokio::spawn(initialize_unless_reached(raft.clone(), members, patience));
        }
    }
    Ok(())
}

/// Initializes a new member of `--cluster` unless a peer reaches it within
/// `patience`. openraft's `initialize` starts an election at once, in term
/// 1; our leader ids order leaders of one term by node id, so a member that
/// starts after the others elected a leader in term 1, and has a higher id,
/// would outrank that leader with its vote and unseat it. A member that
/// starts with the others hears no one and initializes, as before; one that
/// starts late hears the leader's heartbeat first and simply follows.
///
/// Cancel safety: dropping it before the wait ends initializes nothing.
async fn initialize_unless_reached(
    raft: Raft,
    members: BTreeMap<u64, BasicNode>,
    patience: Duration,
) {
    let reached = raft
        .wait(Some(patience))
        .metrics(
            |m| m.current_term > 0 || m.last_log_index.is_some(),
            "a peer reaching this member",
        )
        .await;
    // Reached, or stopping: nothing to initialize.
    if let Err(openraft::metrics::WaitError::Timeout(..)) = reached {
        initialize(&raft, members).await;
    }
}

/// Initializes a new group of `members`; a group initialized already (by
/// another member) is fine.
///
/// Cancel safety: once the request is in openraft's queue, the group is
/// initialized whether or not the answer is awaited; dropped before, nothing.
async fn initialize(raft: &Raft, members: BTreeMap<u64, BasicNode>) {
    tracing::info!(members = ?members.keys().collect::<Vec<_>>(), "initializing a new cluster");
    if let Err(error) = raft.initialize(members).await {
        // Another member initialized the group first: it replicates the
        // same membership here.
        tracing::info!(%error, "the cluster is initialized already");
    }
}

/// Tells the core its role whenever openraft's metrics change it. It
/// watches the server metrics (role, leader, membership), which change only
/// when those do: the full metrics change with every entry, and a wake-up
/// per entry is a cost on a commit's path.
///
/// Cancel safety: runs as its own task until openraft or the core stops;
/// aborted, it changes nothing, but the core keeps the last role it was told.
async fn watch_role(raft: Raft, me: u64, core: CoreSender) {
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        let role = {
            let m = metrics.borrow_and_update();
            let address_of = |id| {
                m.membership_config
                    .membership()
                    .get_node(&id)
                    .map(|node| node.addr.clone())
            };
            if m.state == ServerState::Leader && m.current_leader == Some(me) {
                Role::Leader {
                    address: address_of(me),
                }
            } else {
                let leader = m.current_leader.filter(|&id| id != me).and_then(address_of);
                Role::Follower { leader }
            }
        };
        if last.as_ref() != Some(&role) {
            last = Some(role.clone());
            if core.send(RaftEvent::Role(role)).is_err() {
                return;
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// A graceful stop leaves a snapshot of everything applied, so that the next
/// start replays nothing (it waits up to 10 s for it).
///
/// Cancel safety: safe; dropped once the snapshot was asked for, openraft
/// still builds and writes it (in a task of its own), unwaited.
pub(crate) async fn snapshot_before_stopping(raft: &Raft) {
    let applied = raft.metrics().borrow_watched().last_applied;
    if applied.is_none() || raft.trigger().snapshot().await.is_err() {
        return;
    }
    let taken = raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.snapshot >= applied,
            "a snapshot of everything applied",
        )
        .await;
    if let Err(error) = taken {
        tracing::warn!(%error, "stopping without a final snapshot");
    }
}
