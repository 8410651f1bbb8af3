//! Plain values shared by commands, effects and inspection.

use std::fmt;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// A point in time or a duration, in milliseconds. The engine never reads a clock:
/// the caller passes "now" with every command and must never let it go backwards.
pub type Millis = u64;

/// Identifies a session: a client kept alive by heartbeats.
///
/// [`SessionId::NONE`] owns holds that live by their lease alone (TTL locks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct SessionId(pub u64);

impl SessionId {
    /// The "no session" owner of pure TTL holds.
    pub const NONE: SessionId = SessionId(0);
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Identifies an acquire request within its session, chosen by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct RequestId(pub u64);

/// How a lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum Mode {
    /// One holder at a time.
    Exclusive,
    /// The reader side of a read-write lock: many shared holders, no exclusive one.
    Shared,
    /// Up to `permits` holders at once; every holder names the same number.
    Semaphore {
        /// How many holders may hold at once.
        permits: u32,
    },
}

impl Mode {
    /// Whether two waiters in one queue may be granted out of order: only readers
    /// may pass each other, everything else is strict FIFO.
    pub(crate) fn conflicts_in_queue(self, other: Mode) -> bool {
        !(self == Mode::Shared && other == Mode::Shared)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Shared => f.write_str("shared"),
            Mode::Semaphore { permits } => write!(f, "semaphore({permits})"),
        }
    }
}

/// How long an acquire may wait in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum Wait {
    /// Grant now or answer [`crate::Effect::WouldBlock`]; never queue.
    No,
    /// Queue until granted or until this instant, then [`crate::Effect::TimedOut`].
    Until(Millis),
    /// Queue until granted or cancelled.
    Forever,
}

/// Who a session is, for inspection (`lock_by`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct ClientInfo {
    /// Name the client gave itself (service name, pid, ...).
    pub name: String,
    /// Host the client runs on.
    pub host: String,
}

/// Why a hold ended without its owner releasing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum LostReason {
    /// The owning session stopped heartbeating and expired.
    SessionExpired,
    /// The owning session was closed while the hold was still held.
    SessionClosed,
    /// The hold's own lease ran out without renewal.
    LeaseExpired,
    /// An administrator force-released the lock.
    ForceReleased,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::SessionExpired => "session expired",
            LostReason::SessionClosed => "session closed",
            LostReason::LeaseExpired => "lease expired",
            LostReason::ForceReleased => "force-released",
        })
    }
}

/// Bounds on everything a client controls. Exceeding one is a specific error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Limits {
    /// Most waiters queued on one lock.
    pub max_waiters_per_lock: usize,
    /// Most locks one session may hold at once.
    pub max_holds_per_session: usize,
    /// Most names in one multi-acquire.
    pub max_names_per_acquire: usize,
    /// Shortest session TTL or lease.
    pub min_ttl: Millis,
    /// Longest session TTL or lease.
    pub max_ttl: Millis,
    /// Longest lock-delay (Chubby's rule: at most a minute).
    pub max_lock_delay: Millis,
    /// Most holds and waits one step of a session's end gives up. A session
    /// with more ends over several steps ([`crate::Command::ContinueSessionEnd`]),
    /// so that one big session's end never holds up everyone else's requests
    /// for long, however many locks it held.
    pub session_end_step: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_waiters_per_lock: 10_000,
            max_holds_per_session: 100_000,
            max_names_per_acquire: 64,
            min_ttl: 10,
            max_ttl: 24 * 3600 * 1000,
            max_lock_delay: 60_000,
            session_end_step: 1024,
        }
    }
}
