//! Versions of the log's records, and the gate that keeps a new kind out of
//! the log until every member reads it.
//!
//! Every record kind has the record version that introduced it
//! ([`Record::version`]); a build reads every kind up to its own
//! [`RECORD_VERSION`]. Members of two consecutive builds run side by side
//! during a rolling upgrade, so a build may only *write* a kind once every
//! member of the cluster reads it: the **cluster version**, part of the
//! replicated state, is the newest record version the cluster agreed on,
//! and a feature that writes a newer kind asks [`Replicated::allows`] first
//! and does without it until then.
//!
//! The cluster version rises only through the log, by a
//! [`Record::ClusterVersion`] the leader proposes once every member (voters
//! and learners) has told it the record version it reads (module
//! `raft::versions`: each member announces itself to every new leader);
//! it never goes down. A member applying a cluster version above what it
//! reads stops with a message saying to upgrade it, rather than meet
//! records it cannot decode. The snapshot's own format follows the cluster
//! version too (`storage::snapshot`), since a leader sends snapshots to
//! members of the older build.
//!
//! Version 1 is every kind from before versions were kept (engine commands
//! and acknowledgements); 2 adds `ClusterVersion` itself, which the gate
//! also guards: an older build never sees one; 3 is the engine's
//! `SetHoldCount`, a hold's re-entry depth as its client counts it (a build
//! that reads up to 2 could not decode it).

#[cfg(doc)]
use crate::entry::{Record, RECORD_VERSION};

use super::Replicated;

impl Replicated {
    /// Whether the cluster may write records of `version` (every member
    /// reads them). The one gate of every feature that writes a new kind.
    pub(crate) fn allows(&self, version: u32) -> bool {
        version <= self.cluster_version
    }

    /// The newest record version every member reads, as agreed in the log.
    pub(crate) fn cluster_version(&self) -> u32 {
        self.cluster_version
    }

    /// The newest record version this member reads.
    pub(crate) fn reads_up_to(&self) -> u32 {
        self.reads_up_to
    }

    /// Set when the cluster agreed on a record version this member does not
    /// read: it must stop (and be upgraded).
    pub(crate) fn needs_upgrade(&self) -> Option<u32> {
        (self.cluster_version > self.reads_up_to).then_some(self.cluster_version)
    }

    /// Applies an agreed cluster version; it never goes down.
    pub(super) fn raise_cluster_version(&mut self, version: u32) {
        self.cluster_version = self.cluster_version.max(version);
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ServerConfig;
    use locksmith_core::Command;

    use super::Replicated;
    use crate::entry::{Record, FIRST_RECORD_VERSION, RECORD_VERSION};

    #[test]
    fn the_cluster_version_rises_through_the_log_only_and_never_goes_down() {
        let mut state = crate::core::replicated_state(&ServerConfig::in_memory());
        let mut notices = Vec::new();
        assert_eq!(state.cluster_version(), FIRST_RECORD_VERSION);
        assert!(!state.allows(2), "off until the cluster agrees");
        state
            .apply(&Record::ClusterVersion(2), &mut notices)
            .unwrap();
        assert!(state.allows(2));
        state
            .apply(&Record::ClusterVersion(1), &mut notices)
            .unwrap();
        assert_eq!(state.cluster_version(), 2, "never down");
        assert_eq!(state.needs_upgrade(), None);
        state
            .apply(&Record::ClusterVersion(RECORD_VERSION + 1), &mut notices)
            .unwrap();
        assert_eq!(state.needs_upgrade(), Some(RECORD_VERSION + 1));
    }

    /// Members of the older build (reading up to 2) and of this one apply the
    /// same log alike: a client-counted depth (`SetHoldCount`, version 3)
    /// that a leader logged without the gate is refused on both, and applies
    /// only once the cluster agreed on 3, which the older member cannot join.
    #[test]
    fn a_hold_count_is_refused_alike_until_the_cluster_reads_it() {
        use locksmith_core::{Acquire, ClientInfo, Mode, RequestId, SessionId, Wait};

        use crate::core::replicated::Refusal;
        use crate::entry::LogRecord;

        let record = |now, command, secret, request| {
            Record::Command(LogRecord {
                now,
                command,
                secret,
                request,
            })
        };
        let session = SessionId(1);
        let count = |count| Command::SetHoldCount {
            session,
            owner: "o".into(),
            name: "x".into(),
            token: 1,
            count,
        };
        let log = [
            record(
                1,
                Command::OpenSession {
                    session,
                    ttl: 10_000,
                    info: ClientInfo::default(),
                },
                Some(7),
                None,
            ),
            record(
                2,
                Command::Acquire(Acquire {
                    session,
                    request: RequestId(1),
                    owner: "o".into(),
                    names: vec!["x".into()],
                    mode: Mode::Exclusive,
                    wait: Wait::No,
                    lease: None,
                    reentrant: true,
                    lock_delay: 0,
                }),
                None,
                None,
            ),
            record(3, count(3), None, Some(2)),
        ];
        let mut older = ServerConfig::in_memory();
        older.record_version = 2;
        let mut members = [
            crate::core::replicated_state(&older),
            crate::core::replicated_state(&ServerConfig::in_memory()),
        ];
        let counts = |state: &Replicated| {
            let info = state.engine().describe("x").expect("held");
            info.holders[0].hold_count
        };
        for state in &mut members {
            let mut notices = Vec::new();
            let mut results = Vec::new();
            for record in log.clone() {
                results.push(state.apply(&record, &mut notices));
            }
            assert!(
                matches!(results[2], Err(Refusal::NotAgreed(3))),
                "{results:?}"
            );
            assert_eq!(counts(state), 1, "the refused count changed nothing");
        }
        let [older, newer] = &mut members;
        let mut notices = Vec::new();
        older
            .apply(&Record::ClusterVersion(3), &mut notices)
            .unwrap();
        assert_eq!(older.needs_upgrade(), Some(3), "the older build stops");
        newer
            .apply(&Record::ClusterVersion(3), &mut notices)
            .unwrap();
        newer
            .apply(&record(4, count(3), None, Some(3)), &mut notices)
            .unwrap();
        assert_eq!(counts(newer), 3);
    }

    #[test]
    fn a_member_that_reads_only_older_records_is_told_to_upgrade() {
        let mut config = ServerConfig::in_memory();
        config.record_version = 1;
        let mut state = crate::core::replicated_state(&config);
        let mut notices = Vec::new();
        state
            .apply(&Record::ClusterVersion(2), &mut notices)
            .unwrap();
        assert_eq!(state.needs_upgrade(), Some(2));
    }
}
