//! Replication of the lock server through Raft (openraft).
//!
//! docs/architecture.md ("The replicated server") describes the whole flow.
//! This module holds the pieces openraft is generic over:
//!
//! - [`TypeConfig`]: what a log entry carries ([`Batch`]: the records of one
//!   core batch, so group commit stays one entry, one fsync, many requests),
//!   node ids and addresses, and the responder of a batch
//!   ([`propose::Outcome`]);
//! - `propose`: how the core thread hands its batches to openraft, and
//!   hears when they are committed;
//! - `state_machine`: how openraft hands committed entries back to the core;
//! - `member`: starting the member (log, openraft, role watch);
//! - `admin`: membership changes and status (`locksmith cluster`);
//! - `network`: the members' traffic over gRPC on the clients' port.

pub(crate) mod admin;
pub(crate) mod member;
pub(crate) mod network;
pub(crate) mod propose;
pub(crate) mod state_machine;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::storage::Record;

/// The records of one core batch: one Raft log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Batch {
    /// The leadership stint that proposed it (a random number each time a
    /// member becomes leader): the proposer knows its own entries by it, and
    /// where their results go.
    pub origin: u64,
    /// The proposer's sequence number of the batch within its stint.
    pub seq: u64,
    /// The records, applied in order.
    pub records: Vec<Record>,
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

/// Largest message a member takes from a peer: [`ENTRIES_PER_APPEND`]
/// entries of [`ENTRY_BYTES`] and a client message of `max_message_bytes`
/// each, twice over for what the estimate of an entry's bytes leaves out.
/// Below it, a follower would refuse the leader's big entries, and nothing
/// would commit.
pub(crate) fn peer_message_bytes(max_message_bytes: usize) -> usize {
    (ENTRIES_PER_APPEND as usize)
        .saturating_mul(ENTRY_BYTES.saturating_add(max_message_bytes))
        .saturating_mul(2)
}

/// What a member has applied, as its state machine reports it to openraft.
#[derive(Debug, Default, Clone)]
pub(crate) struct Applied {
    pub last_applied: Option<openraft::type_config::alias::LogIdOf<TypeConfig>>,
    pub membership: openraft::type_config::alias::StoredMembershipOf<TypeConfig>,
}

/// The openraft types of a locksmith cluster: a member is a `u64` id and
/// the address its clients and peers both use. Written out rather than
/// declared with `declare_raft_types!`, which cannot set the responder: a
/// batch's is a callback ([`propose::Outcome`]). The rest are openraft's
/// defaults.
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
        = propose::Outcome<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = openraft::impls::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// This member's handle on openraft.
pub(crate) type Raft = openraft::Raft<TypeConfig, state_machine::CoreMachine>;
