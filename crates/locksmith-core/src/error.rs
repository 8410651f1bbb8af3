//! Errors the engine returns. Every error means the command changed nothing.

use crate::types::Mode;

/// Why a lock name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is the empty string.
    #[error("lock name is empty")]
    Empty,
    /// The name is longer than the limit.
    #[error("lock name is {len} bytes, the limit is {max}")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name contains a NUL byte.
    #[error("lock name contains a NUL byte")]
    Nul,
    /// The name has an empty path segment (leading, trailing or doubled `/`).
    #[error("lock name has an empty segment (leading, trailing or doubled '/')")]
    EmptySegment,
}

/// A command the engine refused. The state is exactly as before the command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A lock name is invalid.
    #[error("invalid lock name {name:?}: {error}")]
    InvalidName {
        /// The rejected name (possibly truncated for display by callers).
        name: String,
        /// What is wrong with it.
        error: NameError,
    },
    /// An acquire named no lock at all.
    #[error("acquire names no lock")]
    NoNames,
    /// A multi-acquire named the same lock twice.
    #[error("lock {name:?} appears twice in one acquire")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A time-driven command (expiry, end of lock-delay) whose deadline moved
    /// since it was decided, or has not passed: a renewal won the race.
    #[error("not due: the deadline this expiry was decided from moved or has not passed")]
    NotDue,
    /// The session does not exist (never opened, closed or expired).
    #[error("unknown or expired session {0}")]
    UnknownSession(u64),
    /// A session with this id is already open.
    #[error("session {0} already exists")]
    SessionExists(u64),
    /// The request id is already waiting in this session.
    #[error("request {0} is already pending in this session")]
    DuplicateRequest(u64),
    /// No waiting request has this id (it was granted, timed out or never existed).
    #[error("no pending request {0} in this session")]
    UnknownRequest(u64),
    /// The lock is held, but not by the caller.
    #[error("lock {name:?} is held by another owner")]
    NotOwner {
        /// The lock.
        name: String,
    },
    /// The lock is not held by anyone.
    #[error("lock {name:?} is not held")]
    NotHeld {
        /// The lock.
        name: String,
    },
    /// The owner already holds the lock and asked for a non-reentrant acquire.
    #[error("lock {name:?} is already held by this owner and re-entry was not requested")]
    AlreadyHeld {
        /// The lock.
        name: String,
    },
    /// The owner holds the lock in another mode.
    #[error("lock {name:?} is held by this owner as {held}, cannot re-enter as {requested}")]
    ModeMismatch {
        /// The lock.
        name: String,
        /// Mode of the existing hold.
        held: Mode,
        /// Mode requested now.
        requested: Mode,
    },
    /// A hold's count set to 0: a hold ends by its release, not by its count.
    #[error("a hold count is at least 1 (a release ends the hold)")]
    ZeroHoldCount,
    /// Semaphore holders must all name the same number of permits.
    #[error("semaphore {name:?} has {existing} permits, request says {requested}")]
    PermitMismatch {
        /// The semaphore.
        name: String,
        /// Permits named by current holders or waiters.
        existing: u32,
        /// Permits named by this request.
        requested: u32,
    },
    /// A semaphore needs at least one permit.
    #[error("a semaphore needs at least one permit")]
    ZeroPermits,
    /// A lease, session TTL or lock-delay is outside the allowed range.
    #[error("{what} of {value_ms} ms is outside {min_ms}..={max_ms} ms")]
    OutOfRange {
        /// Which duration.
        what: &'static str,
        /// The value given.
        value_ms: u64,
        /// Smallest allowed.
        min_ms: u64,
        /// Largest allowed.
        max_ms: u64,
    },
    /// A per-lock or per-session limit was reached.
    #[error("limit reached: {what} (at most {limit})")]
    LimitReached {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// Only leased holds can exist without a session.
    #[error("a hold without a session needs a lease")]
    LeaseRequired,
}

/// A snapshot whose parts contradict each other (a hold of a session it does
/// not have, a queue entry no waiter matches, two exclusive holders, ...):
/// restoring it would leave the engine in a state no sequence of commands
/// produces, where later commands could fail on what they rely on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("inconsistent snapshot: {0}")]
pub struct SnapshotError(pub String);
