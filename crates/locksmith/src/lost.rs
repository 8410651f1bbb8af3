//! Why a hold was lost: the one vocabulary every backend reports in, below
//! the backends, the model and the metrics that count it.

/// Why a hold was lost, in a word, on every backend: what
/// [`crate::LostSignal::cause`] (and so a guard's lost signal) reports for
/// callers to match on, and the `reason` label of
/// `locksmith_client_lost_total`. The signal's text says more, for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LostCause {
    /// The session that kept the hold alive expired.
    SessionExpired,
    /// The session was closed while the hold was held.
    SessionClosed,
    /// The hold's own lease ran out.
    LeaseExpired,
    /// An administrator took the lock away.
    ForceReleased,
    /// The client was closed.
    ClientClosed,
    /// The client could not reach the store for longer than the hold can
    /// be trusted (a connection suspended past its grace, renewals that
    /// failed until the lease ran out).
    ConnectionLost,
    /// The store no longer has the hold and cannot say why (its key or node
    /// is gone: expired, deleted by someone else, or lost with the store's
    /// data).
    Gone,
    /// None of the above.
    #[default]
    Other,
}

impl LostCause {
    /// The word for the `reason` label of `locksmith_client_lost_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostCause::SessionExpired => "session_expired",
            LostCause::SessionClosed => "session_closed",
            LostCause::LeaseExpired => "lease_expired",
            LostCause::ForceReleased => "force_released",
            LostCause::ClientClosed => "client_closed",
            LostCause::ConnectionLost => "connection_lost",
            LostCause::Gone => "gone",
            LostCause::Other => "other",
        }
    }
}
