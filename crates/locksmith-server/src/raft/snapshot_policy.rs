//! When a member takes a snapshot of its own.
//!
//! openraft's own policy counts entries alone: a snapshot every
//! `snapshot_every` entries. But a snapshot costs what the state weighs, not
//! what the entries since the last one weigh: with a million locks held a
//! snapshot is 64 MB, and a busy handoff loop's 10 000 entries had every
//! member encode and write one every few seconds, a core's worth of work
//! that slowed everything else, backups included (docs/BENCHMARKS.md,
//! "Snapshots sized by the log").
//!
//! So by default a member also waits until the log it wrote since its last
//! snapshot is at least `snapshot_log_percent` percent of that snapshot's
//! size (100 by default), as
//! Redis rewrites its append-only file only once it has grown by a share of
//! its last rewrite: snapshotting then costs at most a fixed share of what
//! logging costs, and a start replays a log no longer than that share of
//! the snapshot it loads. Memory holds the same: the entries kept in the
//! log (`RaftLog` keeps them in memory too) stay within that share of the
//! state's encoded size, beyond a floor.
//!
//! The [`Floor`] is `snapshot_every` entries or `snapshot_log_bytes` bytes
//! of log (64 MiB, as Redis's `auto-aof-rewrite-min-size`), whichever comes
//! first: with a small state the share alone would ask for a snapshot every
//! few entries. Entries alone were not enough of a floor, as an entry
//! is a batch: a bulk load of 400 000 locks of 200-byte names writes 80 MB
//! of log in 600 entries, and a member kept all of it, on disk and in
//! memory, and replayed it at every start, until enough more entries came,
//! however long that took. A snapshot due by its bytes alone is followed
//! by a purge of the whole log it covers (see [`run`]).
//!
//! A percentage of 0 leaves the decision to openraft's entry count, exactly as
//! before (the simulator and tests that want a snapshot every few entries).

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::state_machine::CoreMachine;
use super::Raft;
use crate::storage::raft_log::RaftLog;

/// How often the member looks at its log's growth: a snapshot is due at
/// most this late, which next to a snapshot's own cost is nothing.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Longest wait for a snapshot asked for before asking again (a build that
/// failed, or one openraft declined because another was under way).
const BUILD_PATIENCE: Duration = Duration::from_secs(60);

/// How much log since the last snapshot is enough for another, however
/// small the state: whichever of the two comes first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Floor {
    /// `ServerConfig::snapshot_every`.
    pub(crate) entries: u64,
    /// `ServerConfig::snapshot_log_bytes`.
    pub(crate) log_bytes: u64,
}

impl Floor {
    /// Whether `log_bytes` in fewer entries than the floor's reach it.
    fn by_bytes_alone(self, entries: u64, log_bytes: u64) -> bool {
        entries < self.entries.max(1) && log_bytes >= self.log_bytes
    }
}

/// Whether a snapshot is due: `entries` and `log_bytes` written since the
/// last snapshot, which is `snapshot_bytes` long. At a `percent` of 0 the
/// entries alone decide, as openraft's own policy.
pub(crate) fn due(
    entries: u64,
    floor: Floor,
    log_bytes: u64,
    snapshot_bytes: u64,
    percent: u32,
) -> bool {
    let floor_reached = entries >= floor.entries.max(1)
        || (percent > 0 && floor.by_bytes_alone(entries, log_bytes));
    floor_reached && u128::from(log_bytes) * 100 >= u128::from(snapshot_bytes) * u128::from(percent)
}

/// Asks openraft for a snapshot whenever [`due`] says so, until openraft
/// stops. openraft's own policy must be `SnapshotPolicy::Never` beside it.
///
/// The log's growth is counted from when this task first saw the current
/// snapshot (built here or installed from the leader), in bytes as the log
/// encodes entries for the disk; entries written between the snapshot's
/// index and that moment count as not written, which only delays the next
/// snapshot by as much.
///
/// Cancel safety: it holds nothing but handles; aborted, no snapshot is
/// asked for any more (one asked for is still built by openraft).
pub(crate) async fn run(
    raft: Raft,
    log: RaftLog,
    machine: CoreMachine,
    floor: Floor,
    percent: u32,
) {
    let mut metrics = raft.metrics();
    let mut seen = None;
    let mut log_at_snapshot = log.appended_bytes();
    let mut look = tokio::time::interval(LOOK_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        let (applied, snapshot) = {
            let m = metrics.borrow_watched();
            if m.running_state.is_err() {
                return;
            }
            (m.last_applied.map(|id| id.index), m.snapshot)
        };
        if snapshot != seen {
            seen = snapshot;
            log_at_snapshot = log.appended_bytes();
        }
        let Some(applied) = applied else { continue };
        let entries = match seen {
            Some(id) => applied.saturating_sub(id.index),
            None => applied + 1,
        };
        let log_bytes = log.appended_bytes().saturating_sub(log_at_snapshot);
        if !due(entries, floor, log_bytes, machine.snapshot_bytes(), percent) {
            continue;
        }
        tracing::debug!(entries, log_bytes, "a snapshot is due");
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
        let built = raft
            .wait(Some(BUILD_PATIENCE))
            .metrics(|m| m.snapshot != seen, "the snapshot asked for")
            .await;
        // Due by its bytes alone, the log is a few big entries, and openraft
        // keeps up to `max_in_snapshot_log_to_keep` (1 000) entries behind a
        // snapshot for followers a little behind: here that may be all of
        // them. They go; such a follower is sent the snapshot, which this
        // log has outgrown anyway.
        if floor.by_bytes_alone(entries, log_bytes) {
            if let Some(snapshot) = built.ok().and_then(|m| m.snapshot) {
                if raft.trigger().purge_log(snapshot.index).await.is_err() {
                    return;
                }
            }
        }
        // Seen again (and the growth counted from it) at the next look.
        let _ = metrics.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;
    /// The defaults: 10 000 entries or 64 MiB.
    const FLOOR: Floor = Floor {
        entries: 10_000,
        log_bytes: 64 * MB,
    };

    #[test]
    fn a_big_state_waits_for_its_log_to_outgrow_it() {
        // A small state: the entry count decides, as openraft's policy would.
        assert!(!due(9_999, FLOOR, 5 * MB, 4_096, 100));
        assert!(due(10_000, FLOOR, 600_000, 4_096, 100));
        // A 64 MB state: not after 10 000 entries of 1.2 MB in all ...
        assert!(!due(10_000, FLOOR, 12 * MB / 10, 64 * MB, 100));
        assert!(!due(400_000, FLOOR, 64 * MB - 1, 64 * MB, 100));
        // ... but once the log has written as much as the snapshot holds,
        assert!(due(400_000, FLOOR, 64 * MB, 64 * MB, 100));
        // or half as much, at 50 %.
        assert!(due(200_000, FLOOR, 32 * MB, 64 * MB, 50));
        // 0 %: entries alone.
        assert!(due(10_000, FLOOR, 0, 64 * MB, 0));
        // No snapshot yet: the entries decide (it weighs nothing).
        assert!(due(10_000, FLOOR, 0, 0, 100));
    }

    #[test]
    fn a_log_of_few_big_entries_is_due_by_its_bytes() {
        // A bulk load: 100 MB of log in 3 000 entries after a small snapshot.
        assert!(due(3_000, FLOOR, 100 * MB, 4_096, 100));
        assert!(!due(3_000, FLOOR, FLOOR.log_bytes - 1, 4_096, 100));
        assert!(due(1, FLOOR, FLOOR.log_bytes, 0, 100));
        // Its bytes still have to outgrow a bigger snapshot.
        assert!(!due(3_000, FLOOR, 100 * MB, 128 * MB, 100));
        assert!(due(3_000, FLOOR, 128 * MB, 128 * MB, 100));
        // 0 %: entries alone, as openraft counts them.
        assert!(!due(3_000, FLOOR, 100 * MB, 4_096, 0));
    }
}
