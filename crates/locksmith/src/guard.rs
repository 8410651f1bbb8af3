//! Guards: proof of a hold, with its fencing token and its lost signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Hold, LostSignal};
use crate::error::{Error, Loss, Result};
use crate::lost::LostCause;
use crate::metrics;
use crate::model::{Granted, Share};
use crate::release::release_in_background;

/// A held lock (or several, for a multi-lock).
///
/// Check [`Guard::fencing_token`] at every write to a fenced resource, select on
/// [`Guard::lost`] to stop when the hold can no longer be trusted, and end it with
/// [`Guard::release`], the checked path. Dropping a guard releases it in the
/// background (on the current tokio runtime) and reports nothing.
#[must_use = "dropping a guard releases the lock at once"]
pub struct Guard {
    backend: &'static str,
    granted_at: Instant,
    names: Vec<String>,
    tokens: Vec<u64>,
    leased: bool,
    lost: LostSignal,
    hold: Option<Box<dyn Hold>>,
    share: Arc<Share>,
}

impl Guard {
    /// A guard for a grant on `backend`; its loss, extensions and release
    /// are counted in the client metrics from now on.
    pub(crate) fn new(
        backend: &'static str,
        names: Vec<String>,
        leased: bool,
        granted: Granted,
    ) -> Self {
        granted.lost.count_for(backend);
        Guard {
            backend,
            granted_at: Instant::now(),
            names,
            tokens: granted.tokens,
            leased,
            lost: granted.lost,
            hold: Some(granted.hold),
            share: granted.share,
        }
    }

    /// The fencing token of the (first) lock: strictly greater than that of every
    /// earlier holder. Pass it to the resource you protect and have it reject
    /// anything lower than the highest it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.tokens[0]
    }

    /// Fencing tokens of every lock of a multi-lock, in the order they were named.
    pub fn fencing_tokens(&self) -> &[u64] {
        &self.tokens
    }

    /// The (first) lock's name.
    pub fn name(&self) -> &str {
        &self.names[0]
    }

    /// Every name this guard holds.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Re-entry depth of the (first) lock: how many acquires of this owner
    /// on this client share the hold and are not yet released (Redisson's
    /// `getHoldCount`). A multi-lock taken atomically counts as one.
    pub fn hold_count(&self) -> u32 {
        self.share.count()
    }

    /// What is left of a leased hold's lease (`None` without a lease: the
    /// session keeps the hold), as this client measures it from before the
    /// grant or the last extension, so never more than the store allows
    /// (Redisson's `remainTimeToLive`).
    pub fn remaining_lease(&self) -> Option<Duration> {
        self.share.remaining_lease()
    }

    /// Why the hold was lost, in a word, once it was (see [`LostCause`]).
    pub fn lost_cause(&self) -> Option<LostCause> {
        self.lost.cause()
    }

    /// Completes, with the reason, once the hold can no longer be trusted
    /// (session or lease expired, renewal failed, connection lost for too long).
    ///
    /// Cancel safety: safe; it only observes.
    pub async fn lost(&self) -> String {
        self.lost.fired().await
    }

    /// Whether the hold has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_fired()
    }

    /// The lost signal, to move into another task.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Extends a leased hold to `lease` from now. Holds without a lease live with
    /// the client's session and need no extension.
    ///
    /// Cancel safety: safe; the extension either happened or did not.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        if !self.leased {
            return Err(Error::InvalidArgument(
                "this hold has no lease: it lives as long as the client's session".into(),
            ));
        }
        crate::arguments::check_lease(lease)?;
        let extended = match Loss::of(&self.lost) {
            Some(loss) => Err(Error::Lost(loss)),
            None => {
                let hold = self.hold.as_ref().expect("hold until release");
                let extended = hold.extend(lease).await;
                extended.map_err(|error| error.with_cause_of(&self.lost))
            }
        };
        if extended.is_err() {
            metrics::renewal_failed(self.backend);
        }
        extended
    }

    /// Replaces the value an election's hold publishes (the caller checked
    /// [`crate::Capabilities::proclaim`]).
    ///
    /// Cancel safety: safe; the new value either landed or did not.
    pub(crate) async fn proclaim(&self, value: &str) -> Result<()> {
        if let Some(loss) = Loss::of(&self.lost) {
            return Err(Error::Lost(loss));
        }
        let hold = self.hold.as_ref().expect("hold until release");
        let proclaimed = hold.proclaim(value).await;
        proclaimed.map_err(|error| error.with_cause_of(&self.lost))
    }

    /// Releases the hold and reports whether that worked: an error means the hold
    /// had already been lost or taken away. A hold whose `lost()` had fired is
    /// still given back to the store (a fixed lease ends on this client a
    /// little before the store's), but its release reports the loss.
    ///
    /// Cancel safety: if dropped midway, the release may or may not have
    /// happened; the lease or session ends the hold in any case.
    pub async fn release(mut self) -> Result<()> {
        let hold = self.hold.take().expect("hold until release");
        metrics::released(self.backend, self.granted_at.elapsed());
        let lost = Loss::of(&self.lost);
        let result = hold.release().await;
        match lost {
            Some(loss) => Err(Error::Lost(loss)),
            // A loss the store reported on release: why, if the signal
            // fired meanwhile.
            None => result.map_err(|error| error.with_cause_of(&self.lost)),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            metrics::released(self.backend, self.granted_at.elapsed());
            release_in_background(hold);
        }
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("names", &self.names)
            .field("tokens", &self.tokens)
            .field("lost", &self.lost.reason())
            .finish()
    }
}
