//! A plain-data image of the whole engine, so a durable store can bound its log:
//! write a snapshot, drop the log before it, and on recovery restore the
//! snapshot and replay what follows.

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::SnapshotError;
use crate::name::validate_name;
use crate::types::{ClientInfo, LostReason, Millis, Mode, RequestId, SessionId};

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
        let bad = |detail: String| Err(SnapshotError(detail));
        // Fx hashing, sized up front: a backup or a start checks a table of
        // a million locks, and SipHash with rehashing as the sets grew was
        // most of `locksmith snapshot save`'s time (docs/BENCHMARKS.md,
        // "Backup and restore"). A snapshot comes from a member or an
        // operator, not from a client.
        let mut sessions =
            FxHashSet::with_capacity_and_hasher(self.sessions.len(), Default::default());
        let ids = self.sessions.iter().map(|s| s.session);
        for session in ids.chain(self.ending.iter().map(|e| e.session)) {
            if session == SessionId::NONE || !sessions.insert(session) {
                return bad(format!("session {} is listed twice or is 0", session.0));
            }
        }
        let owned = |session: SessionId, lease: bool, what: &dyn Fn() -> String| {
            if session == SessionId::NONE && !lease {
                return bad(format!("{} has neither a session nor a lease", what()));
            }
            if session != SessionId::NONE && !sessions.contains(&session) {
                return bad(format!(
                    "{} names session {}, which is neither open nor ending",
                    what(),
                    session.0
                ));
            }
            Ok(())
        };
        let mut waiters: FxHashMap<(SessionId, RequestId), &WaiterSnapshot> =
            FxHashMap::with_capacity_and_hasher(self.waiters.len(), Default::default());
        for w in &self.waiters {
            let what = || format!("waiter {}/{}", w.session.0, w.request.0);
            owned(w.session, w.lease.is_some(), &what)?;
            if waiters.insert((w.session, w.request), w).is_some() {
                return bad(format!("{} is listed twice", what()));
            }
            let distinct: FxHashSet<&String> = w.names.iter().collect();
            if w.names.is_empty() || distinct.len() != w.names.len() {
                return bad(format!("{} names no lock or one lock twice", what()));
            }
        }
        // Locks in strictly increasing names, as every snapshot the engine
        // writes lists them, are distinct without a set of a million names.
        let ascending = self.locks.windows(2).all(|w| w[0].name < w[1].name);
        let mut names: FxHashSet<&str> = FxHashSet::default();
        if !ascending {
            names.reserve(self.locks.len());
        }
        let mut tokens = FxHashSet::with_capacity_and_hasher(self.locks.len(), Default::default());
        let mut queued = 0usize;
        for lock in &self.locks {
            let name = &lock.name;
            if let Err(e) = validate_name(name) {
                return bad(format!("lock {name:?}: {e}"));
            }
            if !ascending && !names.insert(name.as_str()) {
                return bad(format!("lock {name:?} is listed twice"));
            }
            // Most locks have one holder: no set to allocate for them.
            let mut owners = FxHashSet::default();
            let several = lock.holders.len() > 1;
            for h in &lock.holders {
                let what = || format!("hold {} of lock {name:?}", h.token);
                owned(h.session, h.lease_until.is_some(), &what)?;
                if h.token == 0 || h.token > self.last_token || !tokens.insert(h.token) {
                    return bad(format!(
                        "{} has a token that was never issued (last {}) or is given twice",
                        what(),
                        self.last_token
                    ));
                }
                if h.count == 0 {
                    return bad(format!("{} is held 0 times", what()));
                }
                if several && !owners.insert((h.session, &h.owner)) {
                    return bad(format!("lock {name:?} lists one owner's hold twice"));
                }
            }
            let compatible = match lock.holders.first().map(|h| h.mode) {
                None => true,
                Some(Mode::Exclusive) => lock.holders.len() == 1,
                Some(mode @ Mode::Shared) => lock.holders.iter().all(|h| h.mode == mode),
                Some(mode @ Mode::Semaphore { permits }) => {
                    lock.holders.iter().all(|h| h.mode == mode)
                        && lock.holders.len() <= permits as usize
                }
            };
            if !compatible {
                return bad(format!("lock {name:?} has holders that exclude each other"));
            }
            let mut in_queue = FxHashSet::default();
            for key in &lock.queue {
                let names_it = waiters
                    .get(key)
                    .is_some_and(|w| w.names.iter().any(|n| n == name));
                if !names_it || !in_queue.insert(*key) {
                    return bad(format!(
                        "the queue of lock {name:?} holds {}/{}, which waits for it once at most",
                        key.0 .0, key.1 .0
                    ));
                }
            }
            queued += lock.queue.len();
        }
        // Every queue entry matched a waiter naming that lock, once; so the
        // waiters' names, counted, must all be queue entries.
        let named: usize = self.waiters.iter().map(|w| w.names.len()).sum();
        if named != queued {
            return bad(format!(
                "waiters name {named} locks in all, the queues hold {queued}"
            ));
        }
        Ok(())
    }
}
