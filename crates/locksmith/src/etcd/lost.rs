//! The lost state of one hold, shared by its re-entries.

use std::sync::Mutex;

use crate::backend::LostSignal;
use crate::metrics::LostCause;

/// Whether (and why) a hold was lost, and the lost signals of its guards.
///
/// Every guard gets a [`LostSignal`] of its own, because the generic layer
/// fires a guard's signal with "released" when that guard is released, which
/// must not mark the other re-entries of the same hold as lost. A loss of the
/// hold fires them all.
#[derive(Default)]
pub(crate) struct HoldLost {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    reason: Option<(LostCause, String)>,
    guards: Vec<LostSignal>,
}

impl HoldLost {
    /// Marks the hold lost (the first reason wins) and fires every guard's signal.
    pub fn fire(&self, cause: LostCause, reason: impl Into<String>) {
        let ((cause, reason), guards) = {
            let mut state = self.state.lock().expect("hold lost state");
            let first = state
                .reason
                .get_or_insert_with(|| (cause, reason.into()))
                .clone();
            (first, state.guards.clone())
        };
        for guard in guards {
            guard.fire_because(cause, reason.clone());
        }
    }

    /// Why it was lost, once it was.
    pub fn reason(&self) -> Option<String> {
        let state = self.state.lock().expect("hold lost state");
        state.reason.as_ref().map(|(_, reason)| reason.clone())
    }

    /// Whether it was lost.
    pub fn is_fired(&self) -> bool {
        self.reason().is_some()
    }

    /// A signal for one more guard; already fired if the hold is lost.
    pub fn subscribe(&self) -> LostSignal {
        let signal = LostSignal::new();
        let mut state = self.state.lock().expect("hold lost state");
        if let Some((cause, reason)) = &state.reason {
            signal.fire_because(*cause, reason.clone());
        }
        // Signals of released guards are dropped lazily, when they fired.
        state.guards.retain(|guard| !guard.is_fired());
        state.guards.push(signal.clone());
        signal
    }
}
