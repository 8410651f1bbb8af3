//! The replicated state machine: everything the members of a cluster agree
//! on, changed only by applying committed log records, in log order.
//!
//! [`Replicated`] holds the engine and what the server keeps beside it for
//! each session (the secret a client resumes with, the final replies and
//! lost notices its client has not acknowledged yet), the counters that must
//! never go backwards (session ids, sessionless request ids, engine time),
//! the grant history, and the last log entry applied with the membership as
//! of it. Nothing else changes it: [`Replicated::apply`] is the one path of
//! every record, on the leader, on every other member and on replay, and
//! whatever it has to tell clients it returns as [`Notice`]s, which the
//! leader's front end (module `front`) sends where its routes say and every
//! other member drops. So it knows no stream, no reply slot, no clock and no
//! role, and two members that applied the same entries hold the same state,
//! byte for byte in their snapshots.

mod apply;
mod request_ids;
pub(crate) mod versions;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use locksmith_core::{Effect, Engine, Limits, Millis, SessionId};
use openraft::type_config::alias::{EntryOf, LogIdOf, StoredMembershipOf};
use openraft::EntryPayload;

use crate::entry::{Applied, TypeConfig, FIRST_RECORD_VERSION};
use crate::history::History;
use crate::metrics::Metrics;
use crate::storage::{FrozenState, LostNotice, Outcome, ServerSnapshot, SessionRecord};
pub(crate) use apply::{Notice, Refusal};

/// The state every member agrees on (see the module docs).
pub(crate) struct Replicated {
    engine: Engine,
    limits: Limits,
    /// The server's part of each open session.
    sessions: HashMap<SessionId, SessionState>,
    /// Above every session id opened so far.
    next_session: u64,
    /// Above every sessionless request id applied so far.
    next_unary: u64,
    /// The time of the last record applied: engine time never goes below it.
    last_now: Millis,
    /// Most final replies kept per session: past it the oldest is forgotten.
    max_unacked: usize,
    /// The grant history and the table's counts, kept from what is applied.
    history: History,
    /// The last entry applied, and the membership as of it.
    applied: Applied,
    /// The newest record version every member reads, agreed in the log
    /// (module `versions`).
    cluster_version: u32,
    /// The newest record version this member reads.
    reads_up_to: u32,
    /// The engine's effects of the command being applied (a buffer reused).
    effects: Vec<Effect>,
    metrics: Option<Arc<Metrics>>,
}

/// The server's part of one session, beside the engine's.
pub(crate) struct SessionState {
    /// What a client needs to resume the session (logged at its open).
    pub(crate) secret: u128,
    pub(crate) ttl: Millis,
    /// What the session keeps for its client; none while it keeps nothing,
    /// so that an idle session keeps a word for it instead of three maps.
    kept: Option<Box<Kept>>,
}

/// What a session keeps for its client until the client acknowledges it.
#[derive(Default)]
pub(crate) struct Kept {
    /// Final replies not acknowledged yet, by request id.
    pub(crate) replies: BTreeMap<u64, Outcome>,
    /// Fingerprints of the requests whose ids are in use (waiting, or with a
    /// kept reply): module `request_ids`. Rebuilt by replay, not in
    /// snapshots.
    fingerprints: BTreeMap<u64, u64>,
    /// Lost notices not acknowledged yet, by token.
    pub(crate) lost: BTreeMap<u64, LostNotice>,
}

impl SessionState {
    fn new(secret: u128, ttl: Millis, kept: Kept) -> SessionState {
        SessionState {
            secret,
            ttl,
            kept: (!kept.is_empty()).then(|| Box::new(kept)),
        }
    }

    /// What the session keeps, if anything.
    pub(crate) fn kept(&self) -> Option<&Kept> {
        self.kept.as_deref()
    }

    /// What the session keeps, to change; [`SessionState::tidy`] after.
    fn kept_mut(&mut self) -> &mut Kept {
        self.kept.get_or_insert_with(Box::default)
    }

    /// Lets go of what the session keeps once it is all acknowledged.
    fn tidy(&mut self) {
        if self.kept.as_ref().is_some_and(|kept| kept.is_empty()) {
            self.kept = None;
        }
    }
}

impl Kept {
    fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.fingerprints.is_empty() && self.lost.is_empty()
    }
}

impl Replicated {
    /// An empty state (a member's snapshot, if it has one, is installed next).
    pub(crate) fn new(
        limits: Limits,
        max_unacked: usize,
        history: History,
        reads_up_to: u32,
    ) -> Replicated {
        Replicated {
            engine: engine(limits.clone()),
            limits,
            sessions: HashMap::new(),
            next_session: 1,
            next_unary: 1,
            last_now: 0,
            max_unacked: max_unacked.max(1),
            history,
            applied: Applied::default(),
            cluster_version: FIRST_RECORD_VERSION,
            reads_up_to,
            effects: Vec::new(),
            metrics: None,
        }
    }

    /// Counts what is applied from now on in `metrics`.
    pub(crate) fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The lock table, to read.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The grant history, to read.
    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    /// The server's part of `session`, if it is open.
    pub(crate) fn session(&self, session: SessionId) -> Option<&SessionState> {
        self.sessions.get(&session)
    }

    /// The ids of the open sessions, in no order.
    pub(crate) fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.sessions.keys().copied()
    }

    /// Open sessions.
    pub(crate) fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Above every session id opened so far: where a leader numbers new ones
    /// from.
    pub(crate) fn next_session(&self) -> u64 {
        self.next_session
    }

    /// Above every sessionless request id applied so far.
    pub(crate) fn next_unary(&self) -> u64 {
        self.next_unary
    }

    /// The time of the last record applied: a new leader's clock starts
    /// after it.
    pub(crate) fn last_now(&self) -> Millis {
        self.last_now
    }

    /// Entry `log_id` is applied.
    pub(crate) fn applied_through(&mut self, log_id: LogIdOf<TypeConfig>) {
        self.applied.last_applied = Some(log_id);
    }

    /// The membership changed with entry `membership`'s log id.
    pub(crate) fn set_membership(&mut self, membership: StoredMembershipOf<TypeConfig>) {
        self.applied.membership = membership;
    }

    /// Applies a committed entry with nobody to tell (a member's log read
    /// offline: module `storage::backup`); the core applies its own with
    /// their routes.
    pub(crate) fn apply_unrouted(&mut self, entry: EntryOf<TypeConfig>) {
        let mut notices = Vec::new();
        match entry.payload {
            EntryPayload::Blank => {}
            EntryPayload::Normal(batch) => {
                for record in batch.records.iter() {
                    // A refusal changes nothing, as on every member.
                    let _ = self.apply(record, &mut notices);
                    notices.clear();
                }
            }
            EntryPayload::Membership(membership) => {
                let stored = StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), membership);
                self.set_membership(stored);
            }
        }
        self.applied_through(entry.log_id);
    }

    /// After a forced recovery: every fencing token from now on is above
    /// `floor`.
    pub(crate) fn raise_token_floor(&mut self, floor: u64) {
        self.engine.raise_token_floor(floor);
    }

    /// Replaces the state with a snapshot's (the leader's, or the member's
    /// own at start), as of `applied`. Refused, changing nothing, if its
    /// engine state does not hold together.
    pub(crate) fn install(
        &mut self,
        snapshot: ServerSnapshot,
        applied: Applied,
    ) -> Result<(), String> {
        // Both built before anything changes; the engine's restore checks
        // the snapshot (once: a million locks take a tenth of a start).
        let history = self.history.restored(&snapshot.engine);
        self.engine =
            Engine::restore(self.limits.clone(), snapshot.engine).map_err(|e| e.to_string())?;
        self.history = history;
        self.last_now = snapshot.last_now;
        self.cluster_version = snapshot.cluster_version;
        self.next_session = snapshot.next_session;
        self.next_unary = snapshot.next_unary;
        self.engine.time_sessions_by_caller();
        self.sessions = snapshot
            .sessions
            .into_iter()
            .map(|s| {
                let kept = Kept {
                    replies: s.replies.into_iter().collect(),
                    fingerprints: BTreeMap::new(),
                    lost: s.lost.into_iter().map(|n| (n.token, n)).collect(),
                };
                (
                    SessionId(s.session),
                    SessionState::new(s.secret, s.ttl, kept),
                )
            })
            .collect();
        self.applied = applied;
        Ok(())
    }

    /// The state, frozen for a snapshot built off this thread (the engine's
    /// locks are shared copy-on-write; see [`FrozenState`]). The sessions
    /// are copied in the table's order: encoding sorts them, off this
    /// thread, which a hundred thousand idle clients would otherwise stall
    /// for milliseconds.
    pub(crate) fn freeze(&self) -> FrozenState {
        let sessions: Vec<SessionRecord> = self
            .sessions
            .iter()
            .map(|(id, s)| SessionRecord {
                session: id.0,
                secret: s.secret,
                ttl: s.ttl,
                replies: s.kept().map_or_else(Vec::new, |kept| {
                    kept.replies.iter().map(|(k, v)| (*k, v.clone())).collect()
                }),
                lost: s
                    .kept()
                    .map_or_else(Vec::new, |kept| kept.lost.values().cloned().collect()),
            })
            .collect();
        FrozenState {
            meta: openraft::type_config::alias::SnapshotMetaOf::<TypeConfig> {
                last_log_id: self.applied.last_applied,
                last_membership: self.applied.membership.clone(),
            },
            last_now: self.last_now,
            cluster_version: self.cluster_version,
            next_session: self.next_session,
            next_unary: self.next_unary,
            engine: self.engine.freeze(),
            sessions,
            // Replies carry a token only once it is applied: none above
            // the last one is visible yet. The core raises it to its
            // durable ceiling.
            token_ceiling: self.engine.last_token(),
        }
    }
}

/// An empty engine whose sessions the leader times: heartbeats answered
/// under its lease are not logged, so only the leader knows when each
/// session was last heard, and it logs the expiries it decides.
fn engine(limits: Limits) -> Engine {
    let mut engine = Engine::new(limits);
    engine.time_sessions_by_caller();
    engine
}

#[cfg(test)]
mod tests {
    use locksmith_core::{Acquire, ClientInfo, Command, Mode, RequestId, Wait};

    use super::*;
    use crate::config::ServerConfig;
    use crate::entry::{LogRecord, Record};

    fn record(now: Millis, command: Command, secret: Option<u128>) -> Record {
        Record::Command(LogRecord {
            now,
            command,
            secret,
            request: None,
        })
    }

    fn sessionless_acquire(request: u64, name: &str) -> Command {
        Command::Acquire(Acquire {
            session: SessionId::NONE,
            request: RequestId(request),
            owner: "o".into(),
            names: vec![name.into()],
            mode: Mode::Exclusive,
            wait: Wait::No,
            lease: Some(10_000),
            reentrant: false,
            lock_delay: 0,
        })
    }

    #[test]
    fn sessionless_request_ids_go_on_above_every_one_applied() {
        let mut state = crate::core::replicated_state(&ServerConfig::in_memory());
        let mut notices = Vec::new();
        let acquire = sessionless_acquire(41, "x");
        state
            .apply(&record(5, acquire, None), &mut notices)
            .unwrap();
        assert!(
            matches!(
                &notices[..],
                [Notice::Lease {
                    request: 41,
                    outcome: Outcome::Granted(_)
                }]
            ),
            "{notices:?}"
        );
        assert_eq!(state.next_unary(), 42, "a new leader numbers above it");
        assert_eq!(state.freeze().next_unary, 42, "and so does its snapshot");
    }

    #[test]
    fn a_close_with_another_secret_is_refused_and_changes_nothing() {
        let mut state = crate::core::replicated_state(&ServerConfig::in_memory());
        let mut notices = Vec::new();
        let session = SessionId(1);
        let open = Command::OpenSession {
            session,
            ttl: 5_000,
            info: ClientInfo::default(),
        };
        state
            .apply(&record(5, open, Some(7)), &mut notices)
            .unwrap();
        let close = Command::CloseSession { session };
        let refused = state.apply(&record(6, close.clone(), Some(8)), &mut notices);
        assert!(matches!(refused, Err(Refusal::UnknownSession(s)) if s == session));
        assert!(state.session(session).is_some(), "still open");
        state
            .apply(&record(7, close, Some(7)), &mut notices)
            .unwrap();
        assert!(state.session(session).is_none(), "closed with its secret");
        assert_eq!(
            notices,
            [Notice::Ended {
                session,
                reason: "closed"
            }]
        );
    }
}
