//! A backup made from a stopped member's data directory
//! ([`Backup::from_member_data`]; `locksmith snapshot restore
//! --from-member-data`): the member's snapshot installed and every entry of
//! its log applied, as its start would, then frozen and encoded as any
//! backup. The replay is the core's (the replicated state and its one apply
//! path); reading the directory and the backup's format are the storage's.

use std::io;
use std::path::Path;

use openraft::storage::{RaftLogReader, RaftLogStorage};

use crate::config::{Execution, ServerConfig};
use crate::entry::Applied;
use crate::error::ServerError;
use crate::storage::backup::Backup;
use crate::storage::files::io_error;
use crate::storage::member::MemberDir;
use crate::storage::ServerSnapshot;

impl Backup {
    /// The state of a stopped member's data directory: its snapshot and
    /// every entry of its log (module docs of `storage::backup`). Refused
    /// unless `force_new_cluster`, since what the lost members alone held
    /// is lost.
    ///
    /// Cancel safety: safe; the directory is read (a torn last frame cut, as
    /// a start would) and its lock released when it ends or is dropped.
    pub async fn from_member_data(
        data_dir: &Path,
        force_new_cluster: bool,
    ) -> Result<Backup, ServerError> {
        if !force_new_cluster {
            return Err(ServerError::Config(format!(
                "making a new cluster from the data of {} needs --force-new-cluster: entries \
                 the lost members committed without it are lost, and its sessions and holds \
                 are taken as they stand in its log; only do this when a quorum of the old \
                 cluster cannot come back",
                data_dir.display()
            )));
        }
        if !data_dir.join("raft").join("RAFTLOG").is_file() {
            return Err(ServerError::Missing {
                path: data_dir.to_owned(),
                detail: "not the data directory of a member that ever started (no raft/RAFTLOG)"
                    .into(),
            });
        }
        let mut config = ServerConfig::durable(data_dir);
        // The log's writer on a thread of its own, which the log's drop
        // joins: a command that exits right after leaves nothing unwritten.
        config.execution = Execution::Threads;
        let opened = MemberDir::open(data_dir, &config, None)?;
        let mut state = super::replicated_state(&config);
        if let Some(snapshot) = &opened.snapshot {
            let corrupt = |detail| ServerError::Corrupt {
                path: data_dir.join("snapshot"),
                detail,
            };
            let decoded = ServerSnapshot::decode(&snapshot.data).map_err(corrupt)?;
            let applied = Applied {
                last_applied: snapshot.meta.last_log_id,
                membership: snapshot.meta.last_membership.clone(),
            };
            state.install(decoded, applied).map_err(corrupt)?;
        }
        let mut log = opened.log;
        let raft_error = |e: io::Error| io_error("cannot read the Raft log in", data_dir, e);
        let committed = log.read_committed().await.map_err(raft_error)?;
        let entries = log.try_get_log_entries(..).await.map_err(raft_error)?;
        let covered = opened
            .snapshot
            .as_ref()
            .and_then(|s| s.meta.last_log_id)
            .map(|id| id.index);
        for entry in entries {
            if Some(entry.log_id.index) <= covered {
                continue;
            }
            state.apply_unrouted(entry);
        }
        let mut frozen = state.freeze();
        frozen.token_ceiling = frozen.token_ceiling.max(opened.tokens.ceiling());
        drop(log);
        Backup::of_member_data(data_dir, &frozen, committed.map(|id| id.index))
    }
}
