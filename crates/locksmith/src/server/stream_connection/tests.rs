//! The muted waker's protocol under loom: every interleaving of a wake with
//! the driver's rounds, with loom's model of the memory orderings.

use loom::sync::atomic::{AtomicBool, AtomicU8};
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::Ordering::AcqRel;

// The same file as the parent's `wake`, compiled again with loom's atomics.
#[allow(clippy::duplicate_mod)]
#[path = "wake.rs"]
mod model;

use model::WakeState;

/// A task's wake (its slot's flag, then the driver's state) against a
/// driver that polls in rounds until no round was woken: the work is seen
/// by a round, or the driver's task is woken to poll again. Never neither.
#[test]
fn a_wake_is_never_lost() {
    loom::model(|| {
        let state = Arc::new(WakeState::default());
        let ready = Arc::new(AtomicBool::new(false));
        let waker = thread::spawn({
            let (state, ready) = (state.clone(), ready.clone());
            move || !ready.swap(true, AcqRel) && state.wake()
        });
        let mut seen = false;
        loop {
            state.start_polling();
            seen |= ready.swap(false, AcqRel);
            if !state.stop_polling() {
                break;
            }
        }
        let task_woken = waker.join().unwrap();
        assert!(seen || task_woken, "the wake was lost");
    });
}

/// Two tasks waking at once, one of them during a round: neither is lost.
#[test]
fn two_wakes_are_never_lost() {
    loom::model(|| {
        let state = Arc::new(WakeState::default());
        let flags: Vec<_> = (0..2).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let wakers: Vec<_> = flags
            .iter()
            .map(|ready| {
                let (state, ready) = (state.clone(), ready.clone());
                thread::spawn(move || !ready.swap(true, AcqRel) && state.wake())
            })
            .collect();
        let mut seen = [false; 2];
        loop {
            state.start_polling();
            for (seen, ready) in seen.iter_mut().zip(&flags) {
                *seen |= ready.swap(false, AcqRel);
            }
            if !state.stop_polling() {
                break;
            }
        }
        // Every waker joined (loom requires it), then any of them woke.
        let woken: Vec<bool> = wakers.into_iter().map(|w| w.join().unwrap()).collect();
        let task_woken = woken.contains(&true);
        assert!(
            seen.iter().all(|&seen| seen) || task_woken,
            "a wake was lost"
        );
    });
}
