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
//! The floor is `snapshot_every` entries or [`LOG_BYTES_FLOOR`] bytes of
//! log, whichever comes first (Redis's `auto-aof-rewrite-min-size` is the
//! same 64 MB): with a small state the share alone would ask for a snapshot
//! every few entries. Entries alone were not enough of a floor, as an entry
//! is a batch: a bulk load of a million locks writes about 100 MB of log in
//! a few thousand entries, and a member kept all of it, on disk and in
//! memory, until enough more entries came, however long that took.
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

/// A log this big since the last snapshot is past the floor whatever its
/// number of entries (see the module's docs).
pub(crate) const LOG_BYTES_FLOOR: u64 = 64 << 20;

/// Whether a snapshot is due: `entries` and `log_bytes` written since the
/// last snapshot, which is `snapshot_bytes` long.
pub(crate) fn due(
    entries: u64,
    every: u64,
    log_bytes: u64,
    snapshot_bytes: u64,
    percent: u32,
) -> bool {
    let past_the_floor = entries >= every.max(1) || (percent > 0 && log_bytes >= LOG_BYTES_FLOOR);
    past_the_floor
        && u128::from(log_bytes) * 100 >= u128::from(snapshot_bytes) * u128::from(percent)
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
pub(crate) async fn run(raft: Raft, log: RaftLog, machine: CoreMachine, every: u64, percent: u32) {
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
        if !due(entries, every, log_bytes, machine.snapshot_bytes(), percent) {
            continue;
        }
        tracing::debug!(entries, log_bytes, "a snapshot is due");
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
        let _ = raft
            .wait(Some(BUILD_PATIENCE))
            .metrics(|m| m.snapshot != seen, "the snapshot asked for")
            .await;
        // Seen again (and the growth counted from it) at the next look.
        let _ = metrics.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_state_waits_for_its_log_to_outgrow_it() {
        let mb = 1 << 20;
        // A small state: the entry count decides, as openraft's policy would.
        assert!(!due(9_999, 10_000, 5 * mb, 4_096, 100));
        assert!(due(10_000, 10_000, 600_000, 4_096, 100));
        // A 64 MB state: not after 10 000 entries of 1.2 MB in all ...
        assert!(!due(10_000, 10_000, 12 * mb / 10, 64 * mb, 100));
        assert!(!due(400_000, 10_000, 64 * mb - 1, 64 * mb, 100));
        // ... but once the log has written as much as the snapshot holds,
        assert!(due(400_000, 10_000, 64 * mb, 64 * mb, 100));
        // or half as much, at 50 %.
        assert!(due(200_000, 10_000, 32 * mb, 64 * mb, 50));
        // 0 %: entries alone.
        assert!(due(10_000, 10_000, 0, 64 * mb, 0));
        // No snapshot yet: the entries decide (it weighs nothing).
        assert!(due(10_000, 10_000, 0, 0, 100));
    }

    #[test]
    fn a_log_of_few_big_entries_is_due_by_its_bytes() {
        let mb = 1 << 20;
        // A bulk load: 100 MB of log in 3 000 entries after a small snapshot.
        assert!(due(3_000, 10_000, 100 * mb, 4_096, 100));
        assert!(!due(3_000, 10_000, LOG_BYTES_FLOOR - 1, 4_096, 100));
        assert!(due(1, 10_000, LOG_BYTES_FLOOR, 0, 100));
        // Its bytes still have to outgrow a bigger snapshot.
        assert!(!due(3_000, 10_000, 100 * mb, 128 * mb, 100));
        assert!(due(3_000, 10_000, 128 * mb, 128 * mb, 100));
        // 0 %: entries alone, as openraft counts them.
        assert!(!due(3_000, 10_000, 100 * mb, 4_096, 0));
    }
}
