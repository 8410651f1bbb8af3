//! The server's Prometheus metrics: what the core did (grants, releases,
//! expiries, lost holds, waits), how it did it (batch sizes, group-commit
//! latency, request latency by kind) and what the lock table holds now
//! (holds, waiters, sessions, the fencing high-water mark).
//!
//! The core updates these through a [`Metrics`] handle with plain atomic adds
//! (no lock, no I/O, nothing that waits for HTTP); the HTTP listener (module
//! `http`) encodes them on `/metrics` in the OpenMetrics text format with
//! `prometheus-client`. Replayed log records are not counted: the core gets
//! its handle once recovery is done, so the counters say what this process
//! did.
//!
//! Groups register themselves in [`Metrics::new`], one struct per concern.
//! A replicated server adds its own group there the same way: Raft role and
//! term, commit and apply index, and replication lag per member (a
//! `Family` labelled by member id), read from openraft's metrics when they are encoded, not set by the core.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::Duration;

use locksmith_core::{Effect, LostReason};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::op::{Op, StreamOp};

/// One label, `name="value"`.
type Label = [(&'static str, &'static str); 1];

/// The server's metrics. Cheap to update from any thread.
pub(crate) struct Metrics {
    registry: Registry,
    /// What the lock table holds now.
    pub(crate) table: TableMetrics,
    /// What the applied commands did.
    pub(crate) activity: ActivityMetrics,
    /// The core loop: batches, commits, request latency.
    pub(crate) core: CoreMetrics,
    /// This member's place in its Raft group.
    raft: RaftGauges,
}

/// Gauges of the member's Raft state, from openraft's metrics.
struct RaftGauges {
    /// `raft_role{role}`: 1 for the member's role now, 0 for the others.
    role: Family<Label, Gauge>,
    term: Gauge<u64, AtomicU64>,
    last_log_index: Gauge<u64, AtomicU64>,
    commit_index: Gauge<u64, AtomicU64>,
    applied_index: Gauge<u64, AtomicU64>,
    /// The last entry this member's newest snapshot holds.
    snapshot_index: Gauge<u64, AtomicU64>,
    /// The log is durably purged up to here: the entries at and below it
    /// are in the snapshot alone.
    purged_index: Gauge<u64, AtomicU64>,
    /// `raft_replication_lag{member}` on the leader: entries each member is
    /// behind the leader's log.
    lag: Family<Vec<(String, String)>, Gauge<u64, AtomicU64>>,
    /// Where the gauges are read from, once the member runs.
    source: OnceLock<crate::raft::Raft>,
}

const RAFT_ROLES: [&str; 4] = ["leader", "follower", "candidate", "learner"];

/// Gauges of the lock table, set after every batch.
pub(crate) struct TableMetrics {
    holds: Gauge,
    waiters: Gauge,
    sessions: Gauge,
    last_token: Gauge<u64, AtomicU64>,
}

/// Counters of what the applied commands did, from their effects.
pub(crate) struct ActivityMetrics {
    grants: Counter,
    queued: Counter,
    releases: Counter,
    /// `expiries{what}`: sessions, leases, waits.
    expired_sessions: Counter,
    expired_leases: Counter,
    expired_waits: Counter,
    /// `lost{reason}`, in the order of [`LOST_REASONS`].
    lost: [Counter; 4],
    wait: Histogram,
}

const LOST_REASONS: [LostReason; 4] = [
    LostReason::SessionExpired,
    LostReason::SessionClosed,
    LostReason::LeaseExpired,
    LostReason::ForceReleased,
];

/// The core loop: batch sizes, group commits, request latency by kind.
pub(crate) struct CoreMetrics {
    batch_ops: Histogram,
    commit_seconds: Histogram,
    commit_records: Histogram,
    /// One histogram per [`RequestKind`], in its order.
    requests: Vec<Histogram>,
}

/// What the lock table holds, as the core counts it (module `history`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Census {
    /// Holds (a lock held by three readers counts three).
    pub holds: u64,
    /// Queued acquires.
    pub waiters: u64,
    /// Open sessions.
    pub sessions: u64,
}

/// The kinds of request whose latency is measured: one label value each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    Open,
    Resume,
    Heartbeat,
    Acquire,
    Release,
    Renew,
    SetHoldCount,
    Cancel,
    Close,
    LeaseAcquire,
    LeaseCancel,
    LeaseRelease,
    LeaseRenew,
    Describe,
    List,
    ListSessions,
    History,
    ForceRelease,
    CloseSession,
    EndSession,
}

impl RequestKind {
    const ALL: [RequestKind; 20] = [
        RequestKind::Open,
        RequestKind::Resume,
        RequestKind::Heartbeat,
        RequestKind::Acquire,
        RequestKind::Release,
        RequestKind::Renew,
        RequestKind::SetHoldCount,
        RequestKind::Cancel,
        RequestKind::Close,
        RequestKind::LeaseAcquire,
        RequestKind::LeaseCancel,
        RequestKind::LeaseRelease,
        RequestKind::LeaseRenew,
        RequestKind::Describe,
        RequestKind::List,
        RequestKind::ListSessions,
        RequestKind::History,
        RequestKind::ForceRelease,
        RequestKind::CloseSession,
        RequestKind::EndSession,
    ];

    fn label(self) -> &'static str {
        match self {
            RequestKind::Open => "open",
            RequestKind::Resume => "resume",
            RequestKind::Heartbeat => "heartbeat",
            RequestKind::Acquire => "acquire",
            RequestKind::Release => "release",
            RequestKind::Renew => "renew",
            RequestKind::SetHoldCount => "set_hold_count",
            RequestKind::Cancel => "cancel",
            RequestKind::Close => "close",
            RequestKind::LeaseAcquire => "lease_acquire",
            RequestKind::LeaseCancel => "lease_cancel",
            RequestKind::LeaseRelease => "lease_release",
            RequestKind::LeaseRenew => "lease_renew",
            RequestKind::Describe => "describe",
            RequestKind::List => "list",
            RequestKind::ListSessions => "list_sessions",
            RequestKind::History => "history",
            RequestKind::ForceRelease => "force_release",
            RequestKind::CloseSession => "close_session",
            RequestKind::EndSession => "end_session",
        }
    }

    fn of_stream(op: &StreamOp) -> Option<RequestKind> {
        Some(match op {
            StreamOp::Heartbeat => RequestKind::Heartbeat,
            StreamOp::Acquire { .. } => RequestKind::Acquire,
            StreamOp::Release { .. } => RequestKind::Release,
            StreamOp::Renew { .. } => RequestKind::Renew,
            StreamOp::SetHoldCount { .. } => RequestKind::SetHoldCount,
            StreamOp::Cancel { .. } => RequestKind::Cancel,
            StreamOp::Close => RequestKind::Close,
            StreamOp::Invalid { .. } | StreamOp::AckOnly => return None,
        })
    }

    fn of(op: &Op) -> Option<RequestKind> {
        Some(match op {
            Op::Open { .. } => RequestKind::Open,
            Op::Resume { .. } => RequestKind::Resume,
            Op::AcquireLease { .. } => RequestKind::LeaseAcquire,
            Op::CancelLease { .. } => RequestKind::LeaseCancel,
            Op::Release { .. } => RequestKind::LeaseRelease,
            Op::Renew { .. } => RequestKind::LeaseRenew,
            Op::Describe { .. } => RequestKind::Describe,
            Op::List { .. } => RequestKind::List,
            Op::ListSessions { .. } => RequestKind::ListSessions,
            Op::History { .. } => RequestKind::History,
            Op::ForceRelease { .. } => RequestKind::ForceRelease,
            Op::CloseSession { .. } => RequestKind::CloseSession,
            Op::EndSession { .. } => RequestKind::EndSession,
            Op::Stream { .. } | Op::Detach { .. } | Op::RaiseClusterVersion { .. } => return None,
        })
    }
}

/// How many requests of each kind one batch carries, counted before the
/// batch is handled (handling consumes the ops).
#[derive(Debug, Default)]
pub(crate) struct Tally([u32; RequestKind::ALL.len()]);

impl Tally {
    /// Counts the requests of a batch.
    pub(crate) fn of(batch: &[Op]) -> Tally {
        let mut tally = Tally::default();
        for op in batch {
            if let Op::Stream { ops, .. } = op {
                for kind in ops.iter().filter_map(RequestKind::of_stream) {
                    tally.0[kind as usize] += 1;
                }
            } else if let Some(kind) = RequestKind::of(op) {
                tally.0[kind as usize] += 1;
            }
        }
        tally
    }
}

/// A label value for a loss reason, and its index in [`LOST_REASONS`].
fn lost_label(reason: LostReason) -> (&'static str, usize) {
    match reason {
        LostReason::SessionExpired => ("session_expired", 0),
        LostReason::SessionClosed => ("session_closed", 1),
        LostReason::LeaseExpired => ("lease_expired", 2),
        LostReason::ForceReleased => ("force_released", 3),
    }
}

/// What an applied command was, as far as the counters care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    Release,
    ExpireSession,
    ExpireHold,
    Other,
}

impl Applied {
    pub(crate) fn of(command: &locksmith_core::Command) -> Applied {
        use locksmith_core::Command as C;
        match command {
            C::Release { .. } => Applied::Release,
            C::ExpireSession { .. } => Applied::ExpireSession,
            C::ExpireHold { .. } => Applied::ExpireHold,
            _ => Applied::Other,
        }
    }
}

/// Latency buckets from 50 µs to about 3.3 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.00005, 2.0, 17)
}

/// Counts from 1 to 8192.
fn count_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 2.0, 14)
}

impl Metrics {
    /// Every metric, registered and at zero.
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("locksmith");

        let build = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        build
            .get_or_create(&[("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        registry.register("build_info", "The server's version (always 1)", build);

        let table = TableMetrics {
            holds: Gauge::default(),
            waiters: Gauge::default(),
            sessions: Gauge::default(),
            last_token: Gauge::default(),
        };
        registry.register(
            "holds",
            "Holds now (a lock held by three readers counts three)",
            table.holds.clone(),
        );
        registry.register(
            "waiters",
            "Acquires waiting in a queue now",
            table.waiters.clone(),
        );
        registry.register("sessions", "Open sessions now", table.sessions.clone());
        registry.register(
            "fencing_token_high_water",
            "The highest fencing token handed out",
            table.last_token.clone(),
        );

        let expiries = Family::<Label, Counter>::default();
        let expired = |what| expiries.get_or_create(&[("what", what)]).clone();
        let lost = Family::<Label, Counter>::default();
        let activity = ActivityMetrics {
            grants: Counter::default(),
            queued: Counter::default(),
            releases: Counter::default(),
            expired_sessions: expired("session"),
            expired_leases: expired("lease"),
            expired_waits: expired("wait"),
            lost: LOST_REASONS.map(|reason| {
                lost.get_or_create(&[("reason", lost_label(reason).0)])
                    .clone()
            }),
            wait: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
        };
        registry.register(
            "grants",
            "Holds granted (each name of a multi-lock, and each re-entry, counts one)",
            activity.grants.clone(),
        );
        registry.register(
            "queued",
            "Acquires that had to wait in a queue",
            activity.queued.clone(),
        );
        registry.register(
            "releases",
            "Releases by a hold's owner",
            activity.releases.clone(),
        );
        registry.register(
            "expiries",
            "Sessions that expired, leases that ran out, waits that timed out",
            expiries,
        );
        registry.register(
            "lost",
            "Holds that ended without their owner releasing them, by reason",
            lost,
        );
        registry.register_with_unit(
            "wait_duration",
            "Time from queueing to grant of acquires that waited",
            Unit::Seconds,
            activity.wait.clone(),
        );

        let requests_family =
            Family::<Label, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(latency_buckets())
            });
        let core = CoreMetrics {
            batch_ops: Histogram::new(count_buckets()),
            commit_seconds: Histogram::new(latency_buckets()),
            commit_records: Histogram::new(count_buckets()),
            requests: RequestKind::ALL
                .iter()
                .map(|kind| {
                    requests_family
                        .get_or_create(&[("kind", kind.label())])
                        .clone()
                })
                .collect(),
        };
        registry.register(
            "batch_ops",
            "Operations per batch of the core (one wake-up each)",
            core.batch_ops.clone(),
        );
        registry.register_with_unit(
            "commit_duration",
            "Time to write and fdatasync one group commit of the log",
            Unit::Seconds,
            core.commit_seconds.clone(),
        );
        registry.register(
            "commit_records",
            "Log records per group commit",
            core.commit_records.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from the core taking a request's batch to sending its replies \
             (apply and group commit; not the time an acquire waits in a queue)",
            Unit::Seconds,
            requests_family,
        );

        let raft = RaftGauges {
            role: Family::default(),
            term: Gauge::default(),
            last_log_index: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            snapshot_index: Gauge::default(),
            purged_index: Gauge::default(),
            lag: Family::default(),
            source: OnceLock::new(),
        };
        registry.register(
            "raft_role",
            "This member's Raft role now (1 for its role)",
            raft.role.clone(),
        );
        registry.register("raft_term", "This member's Raft term", raft.term.clone());
        registry.register(
            "raft_last_log_index",
            "The index of this member's last log entry",
            raft.last_log_index.clone(),
        );
        registry.register(
            "raft_commit_index",
            "The index of the last entry this member knows is committed",
            raft.commit_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "The index of the last entry this member applied",
            raft.applied_index.clone(),
        );
        registry.register(
            "raft_snapshot_index",
            "The index of the last entry this member's newest snapshot holds",
            raft.snapshot_index.clone(),
        );
        registry.register(
            "raft_purged_index",
            "The log is purged (durably) up to this index: the entries at and below it \
             are in the snapshot alone",
            raft.purged_index.clone(),
        );
        registry.register(
            "raft_replication_lag",
            "On the leader: entries each member's log is behind the leader's",
            raft.lag.clone(),
        );

        Metrics {
            registry,
            table,
            activity,
            core,
            raft,
        }
    }

    /// Reads the Raft gauges from `raft`'s metrics whenever the metrics are
    /// encoded. They are read on a scrape rather than followed: openraft's
    /// metrics change with every entry, and a task woken for each would be
    /// a cost on every commit.
    pub(crate) fn follow_raft(&self, raft: crate::raft::Raft) {
        let _ = self.raft.source.set(raft);
    }

    fn raft_now(&self, m: &openraft::RaftMetrics<crate::entry::TypeConfig>) {
        let raft = &self.raft;
        let learner = !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == m.id);
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Candidate => "candidate",
            _ if learner => "learner",
            _ => "follower",
        };
        for name in RAFT_ROLES {
            raft.role
                .get_or_create(&[("role", name)])
                .set(i64::from(name == role));
        }
        raft.term.set(m.current_term);
        raft.last_log_index.set(m.last_log_index.unwrap_or(0));
        raft.commit_index
            .set(m.cluster_committed.map_or(0, |c| c.index));
        raft.applied_index
            .set(m.last_applied.map_or(0, |a| a.index));
        raft.snapshot_index.set(m.snapshot.map_or(0, |s| s.index));
        raft.purged_index.set(m.purged.map_or(0, |p| p.index));
        raft.lag.clear();
        if let Some(replication) = &m.replication {
            let last = m.last_log_index.unwrap_or(0);
            for (id, matched) in replication {
                let matched = matched.map_or(0, |l| l.index);
                raft.lag
                    .get_or_create(&vec![("member".to_string(), id.to_string())])
                    .set(last.saturating_sub(matched));
            }
        }
    }

    /// The OpenMetrics text of every metric.
    pub(crate) fn encode(&self) -> String {
        if let Some(raft) = self.raft.source.get() {
            use openraft::async_runtime::WatchReceiver;
            // A copy, so that openraft's metrics are not held while the
            // gauges are set.
            let now = raft.metrics().borrow_watched().clone();
            self.raft_now(&now);
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// Counts what one applied command did.
    pub(crate) fn applied(&self, command: Applied, effects: &[Effect]) {
        let activity = &self.activity;
        match command {
            Applied::Release => {
                activity.releases.inc();
            }
            Applied::ExpireSession => {
                activity.expired_sessions.inc();
            }
            Applied::ExpireHold => {
                activity.expired_leases.inc();
            }
            Applied::Other => {}
        }
        for effect in effects {
            match effect {
                Effect::Granted { tokens, .. } => {
                    activity.grants.inc_by(tokens.len() as u64);
                }
                Effect::Queued { .. } => {
                    activity.queued.inc();
                }
                Effect::TimedOut { .. } => {
                    activity.expired_waits.inc();
                }
                Effect::Lost { reason, .. } => {
                    activity.lost[lost_label(*reason).1].inc();
                }
                Effect::WouldBlock { .. } => {}
            }
        }
    }

    /// A queued acquire was granted after waiting this long.
    pub(crate) fn waited(&self, wait: Duration) {
        self.activity.wait.observe(wait.as_secs_f64());
    }

    /// One group commit of `records` log records took `elapsed`.
    pub(crate) fn committed(&self, elapsed: Duration, records: u64) {
        self.core.commit_seconds.observe(elapsed.as_secs_f64());
        self.core.commit_records.observe(records as f64);
    }

    /// A batch of `ops` operations, whose requests `tally` counted, sent its
    /// replies `elapsed` after the core took it.
    pub(crate) fn batch_done(&self, ops: usize, tally: &Tally, elapsed: Duration) {
        self.core.batch_ops.observe(ops as f64);
        let seconds = elapsed.as_secs_f64();
        for (histogram, &count) in self.core.requests.iter().zip(&tally.0) {
            for _ in 0..count {
                histogram.observe(seconds);
            }
        }
    }

    /// The table holds `census` now, and `last_token` is the high-water mark.
    pub(crate) fn table_now(&self, census: Census, last_token: u64) {
        let table = &self.table;
        table.holds.set(census.holds as i64);
        table.waiters.set(census.waiters as i64);
        table.sessions.set(census.sessions as i64);
        table.last_token.set(last_token);
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_present_from_the_start() {
        let text = Metrics::new().encode();
        for expected in [
            "locksmith_holds 0",
            "locksmith_grants_total 0",
            "locksmith_lost_total{reason=\"session_expired\"} 0",
            "locksmith_expiries_total{what=\"wait\"} 0",
            "locksmith_request_duration_seconds_count{kind=\"acquire\"} 0",
            "locksmith_commit_duration_seconds_count 0",
            "locksmith_build_info{version=",
            "# EOF",
        ] {
            assert!(text.contains(expected), "{expected} missing from\n{text}");
        }
    }

    #[test]
    fn effects_move_the_counters() {
        let metrics = Metrics::new();
        let session = locksmith_core::SessionId(1);
        let request = locksmith_core::RequestId(1);
        metrics.applied(
            Applied::Other,
            &[Effect::Granted {
                session,
                request,
                tokens: vec![7, 8],
            }],
        );
        metrics.applied(
            Applied::ExpireSession,
            &[Effect::Lost {
                session,
                owner: "o".into(),
                name: "a".into(),
                token: 7,
                reason: LostReason::SessionExpired,
            }],
        );
        let text = metrics.encode();
        assert!(text.contains("locksmith_grants_total 2"), "{text}");
        assert!(
            text.contains("locksmith_lost_total{reason=\"session_expired\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("locksmith_expiries_total{what=\"session\"} 1"),
            "{text}"
        );
    }
}
