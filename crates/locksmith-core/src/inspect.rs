//! Read-only views of the lock table.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::types::{ClientInfo, Millis, Mode, RequestId, SessionId};

/// One page of a listing ([`crate::Engine::list_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The locks of the page, sorted by name.
    pub locks: Vec<LockInfo>,
    /// Whether more locks match after the page's last one.
    pub more: bool,
}

/// One lock as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Current holders, oldest first.
    pub holders: Vec<HolderInfo>,
    /// Waiters in queue order.
    pub waiters: Vec<WaiterInfo>,
    /// Until when new grants are refused after an abnormal loss.
    pub lock_delay_until: Option<Millis>,
}

/// One hold of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct HolderInfo {
    /// Owning session.
    pub session: SessionId,
    /// Owner within the session.
    pub owner: String,
    /// Who the owning client is.
    pub lock_by: ClientInfo,
    /// When the hold was granted.
    pub lock_time: Millis,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// When the hold's lease runs out, if it has one.
    pub lease_until: Option<Millis>,
    /// How it is held.
    pub mode: Mode,
    /// Re-entry depth (1 for a plain hold).
    pub hold_count: u32,
}

/// One waiter of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct WaiterInfo {
    /// Waiting session.
    pub session: SessionId,
    /// The pending request.
    pub request: RequestId,
    /// Owner within the session.
    pub owner: String,
    /// Requested mode.
    pub mode: Mode,
    /// When it started waiting.
    pub since: Millis,
    /// When it gives up, if ever.
    pub deadline: Option<Millis>,
}

/// One session as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct SessionInfo {
    /// The session.
    pub session: SessionId,
    /// Who the client is.
    pub info: ClientInfo,
    /// Session TTL.
    pub ttl: Millis,
    /// When it expires unless a heartbeat arrives.
    pub expires_at: Millis,
    /// How many locks it holds.
    pub holds: usize,
}
