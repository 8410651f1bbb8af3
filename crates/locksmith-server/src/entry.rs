//! What one Raft log entry carries, and openraft's type configuration: the
//! vocabulary that the core, the log's storage and the Raft layer share.
//!
//! A leaf: it depends on no other module of the server, so that none of them
//! reaches another through it.
//!
//! - [`Record`]: one state change as the log keeps it (what a client or the
//!   clock asked, and the leader's time), decided only when it is applied;
//! - [`Batch`]: the records of one batch of the leader, one log entry, so
//!   that group commit stays one entry, one fsync, many requests;
//! - [`TypeConfig`]: node ids and addresses, the entry, and the responder of
//!   a batch ([`Outcome`]);
//! - [`Applied`]: what a member's state machine reports as applied.

use std::fmt;
use std::sync::Arc;

use locksmith_core::{Command, Millis, SessionId};
use openraft::raft::responder::Responder;
use openraft::type_config::alias::{LogIdOf, StoredMembershipOf};
use openraft::OptionalSend;
use serde::{Deserialize, Serialize};

/// One logged state change: an engine command and the time it was applied at,
/// plus what the server needs to rebuild its own session table on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    /// The engine time the command was applied at.
    pub now: Millis,
    /// The command.
    pub command: Command,
    /// For `OpenSession`: the secret a client needs to resume the session.
    pub secret: Option<u128>,
    /// For a release, renew or cancel sent on a session stream: the client's
    /// request id, so that replay rebuilds the reply a retry gets.
    pub request: Option<u64>,
}

/// One logged record: what a client (or the clock) asked of the server, in
/// the order the server decided it. Applying the records in order rebuilds
/// the engine and the session table exactly, on replay as when they were
/// first applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    /// An engine command, with what the server keeps beside it.
    Command(LogRecord),
    /// A session's client acknowledged these replies (request ids) and lost
    /// notices (tokens): they are no longer kept, and the ids are free again.
    Acks {
        session: SessionId,
        replies: Vec<u64>,
        lost: Vec<u64>,
    },
    /// Every member said it reads the records of this version: from here
    /// on the cluster may write them (module `core::replicated::versions`).
    /// Added in record version 2; new kinds go after it, never between.
    ClusterVersion(u32),
}

impl Record {
    /// What the record is, for logs: its command's name, or `Acks`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Record::Command(record) => record.command.kind(),
            Record::Acks { .. } => "Acks",
            Record::ClusterVersion(_) => "ClusterVersion",
        }
    }
}

/// The records of one leader batch: one Raft log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Batch {
    /// The leadership stint that proposed it (a random number each time a
    /// member becomes leader): the proposer knows its own entries by it, and
    /// where their results go.
    pub origin: u64,
    /// The proposer's sequence number of the batch within its stint.
    pub seq: u64,
    /// The records, applied in order. Shared: openraft clones an entry for
    /// every follower's AppendEntries and again for the state machine, and
    /// the apply reads the records where they lie. Encoded as a plain
    /// sequence (serde's `rc`), the same bytes a `Vec` makes on the disk and
    /// the wire.
    pub records: Arc<Vec<Record>>,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch of {} records", self.records.len())
    }
}

/// About the most bytes of client data (names, owners) the core puts in one
/// entry: a batch stops growing past it. The op that crosses it still goes
/// in, so an entry holds at most this plus one client message.
pub(crate) const ENTRY_BYTES: usize = 1 << 20;

/// Most entries openraft puts in one AppendEntries (its default is 300).
/// With [`ENTRY_BYTES`] it bounds the messages members send each other.
pub(crate) const ENTRIES_PER_APPEND: u64 = 32;

/// What a member has applied, as its state machine reports it to openraft.
#[derive(Debug, Default, Clone)]
pub(crate) struct Applied {
    pub last_applied: Option<LogIdOf<TypeConfig>>,
    pub membership: StoredMembershipOf<TypeConfig>,
}

/// The openraft types of a locksmith cluster: a member is a `u64` id and
/// the address its clients and peers both use. Written out rather than
/// declared with `declare_raft_types!`, which cannot set the responder: a
/// batch's is a callback ([`Outcome`]). The rest are openraft's defaults.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub(crate) struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Batch;
    type R = ();
    type NodeId = u64;
    type Node = openraft::BasicNode;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Batch, u64, openraft::BasicNode>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = Outcome<T>
    where
        T: OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: OptionalSend + 'static;
    type AsyncRuntime = openraft::impls::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// A batch's [`Responder`]: a callback openraft calls once the batch is
/// applied (in the core, right after it applied it) or refused
/// (wherever openraft refuses it). A callback rather than a channel: nothing
/// has to wait on one per batch. (openraft's own responders are channels.)
pub(crate) struct Outcome<T> {
    completed: Box<dyn FnOnce(T) + Send>,
}

impl<T> Outcome<T> {
    pub(crate) fn new(completed: impl FnOnce(T) + Send + 'static) -> Outcome<T> {
        Outcome {
            completed: Box::new(completed),
        }
    }
}

impl<T: OptionalSend + 'static> Responder<TypeConfig, T> for Outcome<T> {
    fn on_complete(self, result: T) {
        (self.completed)(result)
    }
}

/// The newest record version this build reads and may write (module
/// `core::replicated::versions`: the table of versions, and the gate that
/// keeps a new kind out of the log until every member reads it).
pub(crate) const RECORD_VERSION: u32 = 3;

/// The record version of a cluster that never agreed on one: what every
/// build reads.
pub(crate) const FIRST_RECORD_VERSION: u32 = 1;

impl Record {
    /// The record version that introduced this kind.
    pub(crate) fn version(&self) -> u32 {
        match self {
            Record::Command(record) => Record::version_of(&record.command),
            Record::Acks { .. } => 1,
            Record::ClusterVersion(_) => 2,
        }
    }

    /// The record version that introduced the engine command `command`.
    pub(crate) fn version_of(command: &Command) -> u32 {
        match command {
            Command::SetHoldCount { .. } => 3,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch as it was encoded before its records were shared.
    #[derive(Serialize)]
    struct BatchOfAVec {
        origin: u64,
        seq: u64,
        records: Vec<Record>,
    }

    #[test]
    fn shared_records_encode_as_the_vec_they_were() {
        let records = vec![
            Record::Acks {
                session: SessionId(9),
                replies: vec![1, 2],
                lost: vec![3],
            },
            Record::ClusterVersion(2),
        ];
        let shared = Batch {
            origin: 7,
            seq: 3,
            records: Arc::new(records.clone()),
        };
        let before = BatchOfAVec {
            origin: 7,
            seq: 3,
            records,
        };
        let bytes = postcard::to_allocvec(&shared).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&before).unwrap());
        assert_eq!(postcard::from_bytes::<Batch>(&bytes).unwrap(), shared);
    }
}
