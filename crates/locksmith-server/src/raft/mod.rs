//! Replication of the lock server through Raft (openraft).
//!
//! docs/architecture.md ("The replicated server") describes the whole flow.
//! openraft's type configuration and what a log entry carries are in the
//! leaf module `entry`; this module holds the rest of what openraft is
//! generic over, and the member's wiring:
//!
//! - `propose`: how the core hands its batches to openraft, and
//!   hears when they are committed; whether this member leads under its
//!   lease (`HeartbeatLease`, for the streams' readers too);
//! - `state_machine`: how openraft hands committed entries back to the core;
//! - `snapshot_policy`: when a member takes a snapshot (by its log's growth
//!   against the last snapshot's size);
//! - `member`: starting the member (log, openraft, role watch);
//! - `admin`: membership changes and status (`locksmith cluster`);
//! - `network`: the members' traffic on the clients' port, over gRPC but
//!   for replication;
//! - `append_stream`: replication framed on connections of its own,
//!   without HTTP/2.

pub(crate) mod admin;
pub(crate) mod append_stream;
mod commit_notices;
pub(crate) mod member;
pub(crate) mod network;
pub(crate) mod propose;
pub(crate) mod snapshot_policy;
pub(crate) mod state_machine;
pub(crate) mod versions;

use crate::entry::{TypeConfig, ENTRIES_PER_APPEND, ENTRY_BYTES};

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

/// This member's handle on openraft.
pub(crate) type Raft = openraft::Raft<TypeConfig, state_machine::CoreMachine>;
