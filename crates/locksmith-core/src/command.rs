//! What goes into the engine ([`Command`]) and what comes out ([`Effect`]).

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::types::{ClientInfo, LostReason, Millis, Mode, RequestId, SessionId, Wait};

/// One acquire: of one lock, or of several at once (all or nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Acquire {
    /// The requesting session ([`SessionId::NONE`] for a pure TTL hold).
    pub session: SessionId,
    /// Client-chosen id, unique among this session's pending requests.
    pub request: RequestId,
    /// Owner within the session; the same owner acquiring again is a re-entry.
    pub owner: String,
    /// Lock names; more than one makes an atomic multi-acquire.
    pub names: Vec<String>,
    /// Mode for every name.
    pub mode: Mode,
    /// How long to queue.
    pub wait: Wait,
    /// A lease on the hold itself; `None` ties the hold to the session.
    pub lease: Option<Millis>,
    /// Whether the same owner may acquire again (raising the hold count).
    pub reentrant: bool,
    /// After an abnormal loss of this hold, refuse new grants for this long.
    pub lock_delay: Millis,
}

/// A state change, applied with [`crate::Engine::apply`] at a given time.
///
/// A durable store logs the commands that change state: replaying the log
/// with the same times rebuilds the same state. Time-driven changes (expiry,
/// timeouts, end of lock-delay) are commands too, produced by
/// [`crate::Engine::due`], so a replica never decides them on its own.
/// [`Command::Heartbeat`] is the one a store may leave out of its log: see
/// its own docs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum Command {
    /// Open a session that lives while heartbeats arrive within `ttl`.
    OpenSession {
        /// Id chosen by the caller; must be new and not [`SessionId::NONE`].
        session: SessionId,
        /// Session time-to-live.
        ttl: Millis,
        /// Who the client is.
        info: ClientInfo,
    },
    /// Keep a session alive. A store may answer it without logging it as
    /// long as it alone decides expiries and times sessions itself
    /// ([`crate::Engine::time_sessions_by_caller`]): the replicated server's
    /// leader does so under its lease. Logged, it moves the session's
    /// replicated floor ([`crate::Engine::session_expires_at`]) and so wins
    /// over an [`Command::ExpireSession`] decided before it.
    Heartbeat {
        /// The session.
        session: SessionId,
    },
    /// Close a session on purpose: its holds are released (no lock-delay) and its
    /// waiters dropped. The session is gone at once; a session with more holds
    /// and waits than [`crate::Limits::session_end_step`] gives up the rest in
    /// later [`Command::ContinueSessionEnd`] steps.
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// The session missed its heartbeats: its holds are lost (lock-delay applies).
    /// Like [`Command::CloseSession`], a big session ends over several steps.
    ExpireSession {
        /// The session.
        session: SessionId,
        /// The expiry this was decided from ([`crate::Engine::due`]). If a
        /// heartbeat or a grace applied since moved it, the command fails with
        /// [`crate::EngineError::NotDue`] and changes nothing: under
        /// replication an expiry is decided before it is applied, and a renewal
        /// committed in between must win (the in-flight renew race).
        deadline: Millis,
    },
    /// Acquire one or more locks.
    Acquire(Acquire),
    /// Stop waiting. Granted requests cannot be cancelled: release them instead.
    Cancel {
        /// The session.
        session: SessionId,
        /// The pending request.
        request: RequestId,
    },
    /// A waiter's deadline passed.
    TimeoutWaiter {
        /// The session.
        session: SessionId,
        /// The pending request.
        request: RequestId,
    },
    /// Release one hold (one level of re-entry).
    Release {
        /// The owning session.
        session: SessionId,
        /// The owner.
        owner: String,
        /// The lock.
        name: String,
        /// When given, the hold must carry this token (guards a stale handle from
        /// releasing a newer hold of the same owner).
        token: Option<u64>,
    },
    /// Set a hold's re-entry depth to what its client counts.
    ///
    /// A client that decides re-entry itself (the locksmith library does,
    /// for every store) sends one acquire per hold and records the depth
    /// here, so that inspection shows it; the engine only stores it.
    /// [`Command::Release`] still takes off one level, so such a client
    /// sets the count back to 1 before its last release. Re-entry by a
    /// second [`Command::Acquire`] of the same owner remains the wire
    /// protocol's own feature, for callers that count nothing.
    SetHoldCount {
        /// The owning session.
        session: SessionId,
        /// The owner.
        owner: String,
        /// The lock.
        name: String,
        /// The hold must carry this token (a stale handle sets nothing).
        token: u64,
        /// The depth, at least 1.
        count: u32,
    },
    /// Extend a hold's lease to `now + lease`.
    Renew {
        /// The owning session.
        session: SessionId,
        /// The owner.
        owner: String,
        /// The lock.
        name: String,
        /// When given, the hold must carry this token.
        token: Option<u64>,
        /// New lease from now.
        lease: Millis,
    },
    /// A hold's lease ran out.
    ExpireHold {
        /// The lock.
        name: String,
        /// The hold's token (tokens are unique).
        token: u64,
        /// The lease end this was decided from; like
        /// [`Command::ExpireSession::deadline`], a renew or grace that moved it
        /// makes the command fail with [`crate::EngineError::NotDue`].
        deadline: Millis,
    },
    /// A lock-delay ended: waiters may be granted again.
    EndLockDelay {
        /// The lock.
        name: String,
        /// The end of the delay this was decided from; a delay extended since
        /// (a later abnormal loss, a grace) makes the command fail with
        /// [`crate::EngineError::NotDue`].
        deadline: Millis,
    },
    /// A new leader (or a restarted server) takes over: every session, lease and
    /// lock-delay deadline is pushed to at least `now + grace` (sessions: `now +
    /// max(ttl, grace)`), so that no healthy holder loses its lock to the time
    /// its clients spent finding the new leader (Chubby's grace period, etcd's
    /// lease promotion). Logged like any command, so every replica agrees.
    /// Deadlines are never shortened.
    GrantGrace {
        /// How long the takeover may take.
        grace: Millis,
    },
    /// Administrator: drop every hold of a lock.
    ForceRelease {
        /// The lock.
        name: String,
    },
    /// The next step of a big session's end: these of its waits dropped and
    /// holds released, as its close or expiry would have. Time-driven:
    /// [`crate::Engine::due`] lists one, of up to
    /// [`crate::Limits::session_end_step`] waits and holds, while an ended
    /// session still waits or holds; which ones is the decision it logs, so
    /// that every replica gives up the same ones. A wait or hold that is gone
    /// meanwhile is skipped; fails with [`crate::EngineError::NotDue`] if the
    /// session's end is over.
    ContinueSessionEnd {
        /// The ended session.
        session: SessionId,
        /// Its waits to drop (request ids).
        waits: Vec<RequestId>,
        /// Its holds to release: lock name and token.
        holds: Vec<(String, u64)>,
    },
}

impl Command {
    /// The command's name, for logs (its fields may be long).
    pub fn kind(&self) -> &'static str {
        match self {
            Command::OpenSession { .. } => "OpenSession",
            Command::Heartbeat { .. } => "Heartbeat",
            Command::CloseSession { .. } => "CloseSession",
            Command::ExpireSession { .. } => "ExpireSession",
            Command::Acquire(_) => "Acquire",
            Command::Cancel { .. } => "Cancel",
            Command::TimeoutWaiter { .. } => "TimeoutWaiter",
            Command::Release { .. } => "Release",
            Command::SetHoldCount { .. } => "SetHoldCount",
            Command::Renew { .. } => "Renew",
            Command::ExpireHold { .. } => "ExpireHold",
            Command::EndLockDelay { .. } => "EndLockDelay",
            Command::GrantGrace { .. } => "GrantGrace",
            Command::ForceRelease { .. } => "ForceRelease",
            Command::ContinueSessionEnd { .. } => "ContinueSessionEnd",
        }
    }
}

/// Something the caller must act on, produced by [`crate::Engine::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub enum Effect {
    /// The request holds all its locks; `tokens[i]` is the fencing token of
    /// `names[i]` of the request.
    Granted {
        /// The requesting session.
        session: SessionId,
        /// The request.
        request: RequestId,
        /// Fencing tokens, in the order of the request's names.
        tokens: Vec<u64>,
    },
    /// The request waits; `position` is how many waiters are ahead of it on its
    /// first lock.
    Queued {
        /// The requesting session.
        session: SessionId,
        /// The request.
        request: RequestId,
        /// Waiters ahead of it.
        position: u32,
    },
    /// A [`Wait::No`] request could not be granted now.
    WouldBlock {
        /// The requesting session.
        session: SessionId,
        /// The request.
        request: RequestId,
    },
    /// The request's deadline passed before a grant.
    TimedOut {
        /// The requesting session.
        session: SessionId,
        /// The request.
        request: RequestId,
    },
    /// A hold ended without its owner releasing it.
    Lost {
        /// The owning session.
        session: SessionId,
        /// The owner.
        owner: String,
        /// The lock.
        name: String,
        /// The hold's token.
        token: u64,
        /// Why.
        reason: LostReason,
    },
}
