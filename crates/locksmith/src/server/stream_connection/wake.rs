//! When the driver's waker must wake its task: not while the driver polls,
//! which then polls again instead (module docs, above).
//!
//! `AtomicU8` comes from the parent module, so that the loom model in
//! `tests` checks this very code with loom's atomics.

use std::sync::atomic::Ordering::SeqCst;

use super::AtomicU8;

/// Not polling: a wake wakes the task.
const IDLE: u8 = 0;
/// Polling: a wake is noted, and the poll goes round again.
const POLLING: u8 = 1;
/// Polling, and woken since the round began.
const WOKEN: u8 = 2;

/// One atomic for both sides, so that a wake and the end of a poll cannot
/// miss each other. (Two flags, each side writing its own and reading the
/// other's, lost a wake now and then: a store and a later load of another
/// location may pass each other.)
#[derive(Default)]
pub(super) struct WakeState(AtomicU8);

impl WakeState {
    /// A round of polling begins: wakes from now on are only noted.
    pub(super) fn start_polling(&self) {
        self.0.store(POLLING, SeqCst);
    }

    /// The round ended; whether something woke during it (then another
    /// round is due, as the task itself was not woken).
    pub(super) fn stop_polling(&self) -> bool {
        self.0.swap(IDLE, SeqCst) == WOKEN
    }

    /// A wake: whether the task must be woken (the driver is not polling).
    pub(super) fn wake(&self) -> bool {
        match self.0.compare_exchange(POLLING, WOKEN, SeqCst, SeqCst) {
            Ok(_) => false,
            Err(state) => state == IDLE,
        }
    }
}
