//! A plain-data image of the whole engine, so a durable store can bound its log:
//! write a snapshot, drop the log before it, and on recovery restore the
//! snapshot and replay what follows.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::types::{ClientInfo, Millis, Mode, RequestId, SessionId};

/// Everything the engine knows, in a deterministic order (sessions by id, locks
/// by name, waiters by session and request).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Snapshot {
    /// The fencing high-water mark.
    pub last_token: u64,
    /// Open sessions.
    pub sessions: Vec<SessionSnapshot>,
    /// Locks that are held, awaited or in lock-delay.
    pub locks: Vec<LockSnapshot>,
    /// Pending acquires.
    pub waiters: Vec<WaiterSnapshot>,
}

/// One session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct SessionSnapshot {
    /// Its id.
    pub session: SessionId,
    /// Its TTL.
    pub ttl: Millis,
    /// Who the client is.
    pub info: ClientInfo,
    /// When it expires unless heartbeated (volatile; a restore usually follows
    /// with [`crate::Command::GrantGrace`]).
    pub expires_at: Millis,
}

/// One lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LockSnapshot {
    /// Its name.
    pub name: String,
    /// Holds, oldest first.
    pub holders: Vec<HoldSnapshot>,
    /// Waiters in queue order.
    pub queue: Vec<(SessionId, RequestId)>,
    /// End of a running lock-delay.
    pub delay_until: Option<Millis>,
}

/// One hold.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct HoldSnapshot {
    /// Owning session.
    pub session: SessionId,
    /// Owner within it.
    pub owner: String,
    /// Mode.
    pub mode: Mode,
    /// Fencing token.
    pub token: u64,
    /// Re-entry depth.
    pub count: u32,
    /// When granted.
    pub lock_time: Millis,
    /// End of its lease, if any.
    pub lease_until: Option<Millis>,
    /// Lock-delay on abnormal loss.
    pub lock_delay: Millis,
}

/// One pending acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct WaiterSnapshot {
    /// Session.
    pub session: SessionId,
    /// Request id.
    pub request: RequestId,
    /// Locks it waits for, in request order.
    pub names: Vec<String>,
    /// Owner.
    pub owner: String,
    /// Mode.
    pub mode: Mode,
    /// Whether it may re-enter a hold its owner has when it is granted.
    pub reentrant: bool,
    /// Lease to give the hold.
    pub lease: Option<Millis>,
    /// Lock-delay to give the hold.
    pub lock_delay: Millis,
    /// When it started waiting.
    pub since: Millis,
    /// When it gives up.
    pub deadline: Option<Millis>,
}
