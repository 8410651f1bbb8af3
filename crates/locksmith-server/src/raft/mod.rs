//! Replication of the lock server through Raft (openraft).
//!
//! docs/architecture.md ("The replicated server") describes the whole flow.
//! This module holds the pieces openraft is generic over:
//!
//! - [`TypeConfig`]: what a log entry carries ([`Batch`]: the records of one
//!   core batch, so group commit stays one entry, one fsync, many requests),
//!   node ids and addresses;
//! - `network`: the members' traffic over gRPC on the clients' port.

pub(crate) mod admin;
pub(crate) mod member;
pub(crate) mod network;
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

/// A batch on its way from the core to the proposer task.
#[derive(Debug)]
pub(crate) struct Proposed {
    pub batch: Batch,
    /// The first batch of a leadership stint (its grace period): nothing else
    /// is in flight with it, and it is sent again while the new leader's lease
    /// is being confirmed.
    pub first: bool,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch of {} records", self.records.len())
    }
}

/// What a member has applied, as its state machine reports it to openraft.
#[derive(Debug, Default, Clone)]
pub(crate) struct Applied {
    pub last_applied: Option<openraft::type_config::alias::LogIdOf<TypeConfig>>,
    pub membership: openraft::type_config::alias::StoredMembershipOf<TypeConfig>,
}

openraft::declare_raft_types!(
    /// The openraft types of a locksmith cluster: a member is a `u64` id and
    /// the address its clients and peers both use.
    pub(crate) TypeConfig:
        D = Batch,
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
);

/// This member's handle on openraft.
pub(crate) type Raft = openraft::Raft<TypeConfig, state_machine::CoreMachine>;
