//! Counters of a member's work ([`Stats`]): the batches it proposed and
//! the snapshots it built, counted where each happens (the core's front
//! end, openraft's state machine) and read by benchmarks
//! (`Server::stats`) and monitoring.

use std::sync::atomic::AtomicU64;

/// Counters of the batches proposed, for benchmarks and monitoring.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub batches: AtomicU64,
    pub ops: AtomicU64,
    /// Log entries proposed (each one append and `fdatasync` on a quorum).
    pub fsyncs: AtomicU64,
    pub records: AtomicU64,
    /// Time from proposing entries to applying them.
    pub commit_nanos: AtomicU64,
    /// Raft snapshots this member built (not those installed from a
    /// leader, nor backups).
    pub snapshots: AtomicU64,
}
