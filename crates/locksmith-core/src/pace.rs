//! Pauses in long work on a big table, for the thread that does it.
//!
//! Encoding a frozen engine of a million locks, or checking a snapshot of
//! them as it is read, takes a thread hundreds of milliseconds of CPU
//! without a system call. A server runs that work on a background thread
//! at a lower priority; yet on a machine whose CPUs are all busy, a thread
//! that serves and wakes up may wait for the rest of the background
//! thread's time slice, milliseconds, before the kernel lets it run. So
//! the work calls back now and then ([`pausing`]), and the caller decides
//! what a pause is (a server gives way with `sched_yield`). The engine
//! does no I/O here: without [`pausing`], a pause is nothing.

use std::cell::Cell;

/// Units of work (a lock encoded or checked, or [`COMPARISONS`] comparisons
/// of a sort) between two calls of the pause: a few tens of microseconds.
const STEP: u32 = 64;

/// Comparisons of a sort counted as one unit of work.
pub(crate) const COMPARISONS: u32 = 32;

thread_local! {
    /// The pause of the work running on this thread, if any.
    static PAUSE: Cell<Option<fn()>> = const { Cell::new(None) };
    /// Units of work since the last pause.
    static DONE: Cell<u32> = const { Cell::new(0) };
}

/// Runs `work`, during which this thread's long work on a table calls
/// `pause` every few tens of microseconds of it.
pub fn pausing<R>(pause: fn(), work: impl FnOnce() -> R) -> R {
    /// Puts back the pause there was, even if `work` panics.
    struct Restore(Option<fn()>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PAUSE.set(self.0);
        }
    }
    let _restore = Restore(PAUSE.replace(Some(pause)));
    work()
}

/// One unit of long work done: every [`STEP`] of them, the pause.
#[inline]
pub(crate) fn step() {
    let done = DONE.get() + 1;
    if done < STEP {
        DONE.set(done);
        return;
    }
    DONE.set(0);
    if let Some(pause) = PAUSE.get() {
        pause();
    }
}

/// A comparison for a sort of a big table, counting one unit of work every
/// [`COMPARISONS`] calls (`counted` is the sort's own counter).
#[inline]
pub(crate) fn compared<T>(counted: &mut u32, ordering: T) -> T {
    *counted += 1;
    if *counted == COMPARISONS {
        *counted = 0;
        step();
    }
    ordering
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static PAUSES: Cell<u32> = const { Cell::new(0) };
    }

    fn count() {
        PAUSES.set(PAUSES.get() + 1);
    }

    #[test]
    fn work_pauses_every_step_only_while_pausing_and_the_pause_before_comes_back() {
        for _ in 0..10 * STEP {
            step();
        }
        assert_eq!(PAUSES.get(), 0, "no pause set, none called");
        pausing(count, || {
            DONE.set(0);
            for _ in 0..10 * STEP {
                step();
            }
        });
        assert_eq!(PAUSES.get(), 10);
        assert!(PAUSE.get().is_none());
    }
}
