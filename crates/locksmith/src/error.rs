//! The one error type of the client library.

use std::time::Duration;

use locksmith_core::{EngineError, Mode, NameError};

use crate::lost::LostCause;
use crate::lost_signal::LostSignal;

/// Result alias for the client library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, as variants a caller can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name breaks the naming rules; nothing was sent anywhere.
    #[error("invalid lock name {name:?}: {source}")]
    InvalidName {
        /// The rejected name (truncated to 64 characters).
        name: String,
        /// The rule it breaks.
        source: NameError,
    },
    /// An option is out of range or contradictory (zero TTL, zero permits, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backend URL cannot be used.
    #[error("invalid backend URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The URL names a backend that this build leaves out.
    #[error("backend {scheme:?} needs the cargo feature {feature:?} of the locksmith crate")]
    BackendNotEnabled {
        /// URL scheme.
        scheme: String,
        /// Feature that enables it.
        feature: &'static str,
    },
    /// The acquire did not succeed within its wait time.
    #[error("timed out after {0:?} waiting for the lock")]
    Timeout(Duration),
    /// The lock is held, but not by the caller.
    #[error("lock {name:?} is held by another owner")]
    NotOwner {
        /// The lock.
        name: String,
    },
    /// The lock is not held at all.
    #[error("lock {name:?} is not held")]
    NotHeld {
        /// The lock.
        name: String,
    },
    /// The owner already holds the lock and re-entry is off.
    #[error("lock {name:?} is already held by this owner and re-entry is off")]
    AlreadyHeld {
        /// The lock.
        name: String,
    },
    /// The request conflicts with how the lock is held or defined (re-entry in
    /// another mode, semaphore permit mismatch).
    #[error("lock {name:?} conflicts with mode {mode}: {detail}")]
    Conflict {
        /// The lock.
        name: String,
        /// The requested mode.
        mode: Mode,
        /// What conflicts.
        detail: String,
    },
    /// The hold was lost (expired, revoked, connection gone) before this call.
    #[error("lock was lost: {0}")]
    Lost(Loss),
    /// A limit of the backend was reached.
    #[error("limit reached: {0}")]
    LimitReached(String),
    /// The store refused the caller's credentials, or got none where it
    /// requires them (a lock server with authentication on).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller's identity may not do this to this lock; nothing changed.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The backend cannot do this (for example lock-delay on a store without it).
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The missing capability.
        what: String,
    },
    /// A grant was made, but fewer replicas than asked acknowledged it in
    /// time (Redis `WAIT`), so a failover could hand the lock out again: it
    /// was not handed to the caller. Retrying is right once the replicas
    /// catch up; [`Unreplicated::undo`] says whether the grant is gone.
    #[error("{0}")]
    Unreplicated(Box<Unreplicated>),
    /// The client was closed.
    #[error("client is closed")]
    Closed,
    /// The backend failed (I/O, protocol, server error).
    #[error("{backend} backend: {source}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What [`Error::Lost`] reports: why the hold was lost, in words and, where
/// the client knows it, in a word (as the hold's
/// [`LostSignal::cause`](crate::LostSignal::cause) says).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Loss {
    /// Why, in words.
    pub reason: String,
    /// Why, in a word: known once the hold's lost signal fired, or where
    /// the store said.
    pub cause: Option<LostCause>,
}

impl Loss {
    /// A loss whose cause is not known.
    pub fn new(reason: impl Into<String>) -> Self {
        Loss {
            reason: reason.into(),
            cause: None,
        }
    }

    /// A loss with its cause.
    pub fn because(cause: LostCause, reason: impl Into<String>) -> Self {
        Loss {
            reason: reason.into(),
            cause: Some(cause),
        }
    }

    /// The loss `signal` reports, once it fired.
    pub(crate) fn of(signal: &LostSignal) -> Option<Self> {
        // The first firing wins: once there is a reason, the cause is fixed.
        let reason = signal.reason()?;
        Some(Loss {
            reason,
            cause: signal.cause(),
        })
    }
}

impl From<String> for Loss {
    fn from(reason: String) -> Self {
        Loss::new(reason)
    }
}

impl From<&str> for Loss {
    fn from(reason: &str) -> Self {
        Loss::new(reason)
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What [`Error::Unreplicated`] reports: how the replicas answered, and
/// what became of the grant they did not acknowledge.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unreplicated {
    /// The lock.
    pub name: String,
    /// Where it was granted (the primary, or "the Redis Cluster").
    pub primary: String,
    /// How many replicas acknowledged the grant.
    pub acknowledged: u32,
    /// How many were asked for (`wait_replicas`).
    pub asked: u32,
    /// How long they had (`wait_timeout`).
    pub within: Duration,
    /// How many replicas the primary had connected right after, if it
    /// answered: fewer than `asked` means none can acknowledge until a
    /// replica (re)connects and catches up.
    pub connected: Option<u32>,
    /// What became of the grant.
    pub undo: Undo,
}

/// What became of a grant that was not handed to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Undo {
    /// Given back before the call returned: nothing is held.
    GivenBack,
    /// Giving it back was not confirmed (for this reason): it may still hold
    /// the lock, unrenewed, until its lease (this long from the grant) runs
    /// out.
    Unconfirmed {
        /// The grant's lease.
        lease: Duration,
        /// Why the undo was not confirmed.
        reason: String,
    },
}

impl std::fmt::Display for Unreplicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lock {:?} was granted on {} but only {} of {} replicas acknowledged it within {:?}",
            self.name, self.primary, self.acknowledged, self.asked, self.within
        )?;
        match self.connected {
            Some(connected) => write!(f, " ({connected} connected to the primary)")?,
            None => f.write_str(" (the primary did not say how many are connected)")?,
        }
        match &self.undo {
            Undo::GivenBack => f.write_str("; the grant was given back"),
            Undo::Unconfirmed { lease, reason } => write!(
                f,
                "; giving the grant back failed ({reason}), so it may hold the lock until its \
                 {lease:?} lease runs out"
            ),
        }
    }
}

impl Error {
    /// Wraps a backend's own error.
    pub fn backend(
        backend: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// This error, an [`Error::Lost`] without a cause taking that of
    /// `signal` if it fired (a store that reports the loss itself, before or
    /// without the signal's reason, mostly cannot say why).
    pub(crate) fn with_cause_of(self, signal: &LostSignal) -> Self {
        match self {
            Error::Lost(Loss {
                reason,
                cause: None,
            }) => Error::Lost(Loss {
                reason,
                cause: signal.cause(),
            }),
            error => error,
        }
    }

    /// Builds [`Error::InvalidName`] from a name and the rule it breaks.
    pub fn invalid_name(name: &str, source: NameError) -> Self {
        Error::InvalidName {
            name: name.chars().take(64).collect(),
            source,
        }
    }
}

impl From<EngineError> for Error {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::InvalidName { name, error } => Error::InvalidName {
                name,
                source: error,
            },
            EngineError::NotOwner { name } => Error::NotOwner { name },
            EngineError::NotHeld { name } => Error::NotHeld { name },
            EngineError::AlreadyHeld { name } => Error::AlreadyHeld { name },
            EngineError::ModeMismatch {
                ref name,
                requested,
                ..
            } => Error::Conflict {
                name: name.clone(),
                mode: requested,
                detail: error.to_string(),
            },
            EngineError::PermitMismatch {
                ref name,
                requested,
                ..
            } => Error::Conflict {
                name: name.clone(),
                mode: Mode::Semaphore { permits: requested },
                detail: error.to_string(),
            },
            EngineError::LimitReached { .. } => Error::LimitReached(error.to_string()),
            EngineError::UnknownSession(_) => Error::Lost(error.to_string().into()),
            EngineError::NoNames
            | EngineError::DuplicateName { .. }
            | EngineError::ZeroPermits
            | EngineError::ZeroHoldCount
            | EngineError::OutOfRange { .. }
            | EngineError::LeaseRequired
            | EngineError::SessionExists(_)
            | EngineError::DuplicateRequest(_)
            | EngineError::UnknownRequest(_)
            | EngineError::NotDue => Error::InvalidArgument(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_reads_as_its_reason() {
        let lost = Error::Lost(Loss::because(LostCause::ForceReleased, "a: force-released"));
        assert_eq!(lost.to_string(), "lock was lost: a: force-released");
        assert_eq!(Loss::from("gone").cause, None);
    }

    #[test]
    fn a_loss_without_a_cause_takes_the_signals() {
        let signal = LostSignal::new();
        assert_eq!(Loss::of(&signal), None);
        let before = Error::Lost("released too late".into()).with_cause_of(&signal);
        assert!(matches!(before, Error::Lost(Loss { cause: None, .. })));

        signal.fire_because(LostCause::ForceReleased, "a: force-released");
        assert_eq!(
            Loss::of(&signal),
            Some(Loss::because(LostCause::ForceReleased, "a: force-released"))
        );
        let after = Error::Lost("released too late".into()).with_cause_of(&signal);
        assert!(matches!(
            after,
            Error::Lost(Loss { cause: Some(LostCause::ForceReleased), ref reason }) if reason == "released too late"
        ));
        // A cause the store gave stays; other errors stay as they are.
        let known = Error::Lost(Loss::because(LostCause::LeaseExpired, "expired"));
        assert!(matches!(
            known.with_cause_of(&signal),
            Error::Lost(Loss {
                cause: Some(LostCause::LeaseExpired),
                ..
            })
        ));
        assert!(matches!(
            Error::Closed.with_cause_of(&signal),
            Error::Closed
        ));
    }
}
