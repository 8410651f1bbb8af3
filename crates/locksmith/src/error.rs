//! The one error type of the client library.

use std::time::Duration;

use locksmith_core::{EngineError, Mode, NameError};

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
    Lost(String),
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
            EngineError::UnknownSession(_) => Error::Lost(error.to_string()),
            EngineError::NoNames
            | EngineError::DuplicateName { .. }
            | EngineError::ZeroPermits
            | EngineError::OutOfRange { .. }
            | EngineError::LeaseRequired
            | EngineError::SessionExists(_)
            | EngineError::DuplicateRequest(_)
            | EngineError::UnknownRequest(_)
            | EngineError::NotDue => Error::InvalidArgument(error.to_string()),
        }
    }
}
