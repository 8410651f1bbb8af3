//! A plain-data image of the whole engine, so a durable store can bound its log:
//! write a snapshot, drop the log before it, and on recovery restore the
//! snapshot and replay what follows.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::error::SnapshotError;
use crate::types::{ClientInfo, LostReason, Millis, Mode, RequestId, SessionId};
pub use check::SnapshotCensus;
use check::{Checker, HoldFacts};
#[cfg(feature = "serde")]
pub use read::CheckedSnapshot;

mod check;
#[cfg(feature = "serde")]
mod read;

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
    /// Sessions that have ended but still hold or wait (their holds and
    /// waiters are among the above): the rest of their end is given up by
    /// [`crate::Command::ContinueSessionEnd`] steps.
    pub ending: Vec<EndingSnapshot>,
}

/// A session whose end is still under way.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct EndingSnapshot {
    /// Its id.
    pub session: SessionId,
    /// Why it ended: what its holds are lost for.
    pub reason: LostReason,
    /// When it ended.
    pub since: Millis,
    /// Who the client was.
    pub info: ClientInfo,
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

impl Snapshot {
    /// Checks what the engine relies on and what every sequence of commands
    /// keeps true: sessions and lock names unique (names valid); each hold
    /// and waiter of an open or ending session (or of no session, with a
    /// lease); each
    /// hold's token issued (at most `last_token`) and given once, its count
    /// at least 1; a lock's holders compatible (one exclusive, or shared
    /// ones, or up to `permits` of one semaphore) and each owner there once;
    /// each waiter in the queue of every lock it names, once, and every
    /// queue entry a waiter for that lock.
    pub fn check(&self) -> Result<(), SnapshotError> {
        self.census().map(drop)
    }

    /// Checks it as [`Snapshot::check`] does, and counts what it holds.
    pub fn census(&self) -> Result<SnapshotCensus, SnapshotError> {
        let mut checker = Checker::new(self.last_token, &self.sessions, self.locks.len())?;
        let mut holds = Vec::new();
        for lock in &self.locks {
            holds.clear();
            holds.extend(lock.holders.iter().map(HoldFacts::of));
            checker.lock(&lock.name, &holds, &lock.queue)?;
        }
        checker.finish(&self.waiters, &self.ending)
    }
}
