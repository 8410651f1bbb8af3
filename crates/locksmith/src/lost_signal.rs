//! The signal a hold carries: fired once, by its backend, when the hold can
//! no longer be trusted. Below the backends and the errors, which both
//! speak of it.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::lost::LostCause;
use crate::metrics;

/// Fires once when a hold can no longer be trusted, with the reason.
///
/// Cloning shares the signal. Backends fire it; guards expose it.
#[derive(Debug, Clone, Default)]
pub struct LostSignal {
    /// One `Arc` for both: a clone is one count, where a token's clone
    /// takes its tree's lock (every acquire clones the signal).
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    token: CancellationToken,
    state: Mutex<LostState>,
}

#[derive(Debug, Default)]
struct LostState {
    reason: Option<String>,
    cause: LostCause,
    /// The backend whose client metrics count the loss, once a guard holds
    /// the signal.
    counted_for: Option<&'static str>,
}

impl LostSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal with why, in a word (what callers match on and the
    /// client metrics count) and in words; the first reason wins. A store
    /// that cannot say why fires it with [`LostCause::Other`].
    pub fn fire_because(&self, cause: LostCause, reason: impl Into<String>) {
        let mut state = self.shared.state.lock().expect("lost signal lock");
        if state.reason.is_none() {
            state.reason = Some(reason.into());
            state.cause = cause;
            if let Some(backend) = state.counted_for {
                metrics::lost(backend, cause);
            }
        }
        drop(state);
        self.shared.token.cancel();
    }

    /// Why it fired in a word, once it has.
    pub fn cause(&self) -> Option<LostCause> {
        let state = self.shared.state.lock().expect("lost signal lock");
        state.reason.as_ref().map(|_| state.cause)
    }

    /// Counts the loss in the client metrics of `backend` when it fires (at
    /// once if it has): the first call decides, so a loss counts once.
    pub(crate) fn count_for(&self, backend: &'static str) {
        let mut state = self.shared.state.lock().expect("lost signal lock");
        if state.counted_for.is_none() {
            state.counted_for = Some(backend);
            if state.reason.is_some() {
                metrics::lost(backend, state.cause);
            }
        }
    }

    /// Whether it has fired.
    pub fn is_fired(&self) -> bool {
        self.shared.token.is_cancelled()
    }

    /// Why it fired, once it has.
    pub fn reason(&self) -> Option<String> {
        self.shared
            .state
            .lock()
            .expect("lost signal lock")
            .reason
            .clone()
    }

    /// Completes when the signal fires, with the reason.
    ///
    /// Cancel safety: safe; it only observes.
    pub async fn fired(&self) -> String {
        self.shared.token.cancelled().await;
        self.reason().unwrap_or_default()
    }

    /// The underlying cancellation token, to hand to code that stops on it.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.token.clone()
    }
}
