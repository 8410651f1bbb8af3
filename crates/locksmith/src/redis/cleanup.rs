//! Background work that a dropped future leaves behind, tracked per process.
//!
//! A dropped `acquire` cannot talk to Redis from `Drop`; it spawns the undo (leave
//! the fair queue, release a grant that raced the drop) instead. Inspection then
//! waits for the undo work this process started *before* it, so that the
//! process reads its own writes: right after a waiter is cancelled, `describe`
//! no longer lists it. The wait is bounded, so a hung Redis cannot stall
//! inspection for long.
//!
//! The registry is a [`Leaked`] cell that a forked child forgets
//! ([`forget`]): a thread of the parent that was starting, ending or
//! awaiting cleanups at the fork held its lock (or its `Notify`'s), which
//! stays held in the child for ever.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::leaked::Leaked;

#[derive(Default)]
struct Registry {
    /// The last sequence number given, and those of the tasks still running.
    running: Mutex<(u64, BTreeSet<u64>)>,
    done: Notify,
}

/// The registry of this process's cleanups, made on first use and again
/// after [`forget`].
static REGISTRY: Leaked<Registry> = Leaked::new();

/// Makes the cleanups started from now on, and the inspections that wait for
/// them, use a new registry; the current one is forgotten, untouched (no
/// lock, nothing freed). For [`crate::forget_process_state_after_fork`],
/// which says why.
pub(crate) fn forget() {
    REGISTRY.forget();
}

/// Removes a task from the registry it was started in when it ends, even by
/// panic or abort.
struct Tracked {
    registry: &'static Registry,
    seq: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.registry
            .running
            .lock()
            .expect("cleanup registry")
            .1
            .remove(&self.seq);
        self.registry.done.notify_waiters();
    }
}

/// Runs `work` on the current runtime, tracked; outside a runtime it is dropped
/// (the hold or queue entry then ends with its lease).
pub(crate) fn spawn(work: impl Future<Output = ()> + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("redis cleanup outside a tokio runtime: left to the lease");
        return;
    };
    let registry = REGISTRY.get();
    let tracked = {
        let mut running = registry.running.lock().expect("cleanup registry");
        running.0 += 1;
        let seq = running.0;
        running.1.insert(seq);
        Tracked { registry, seq }
    };
    runtime.spawn(async move {
        let _tracked = tracked;
        work.await;
    });
}

/// Waits (at most `limit`) until every task spawned before this call ended
/// (every task of the current registry: not those started before a
/// [`forget`]).
///
/// Cancel safety: safe; it only waits.
pub(crate) async fn settle(limit: Duration) {
    let registry = REGISTRY.get();
    let target = registry.running.lock().expect("cleanup registry").0;
    let wait = async {
        loop {
            let notified = registry.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pending = registry
                .running
                .lock()
                .expect("cleanup registry")
                .1
                .first()
                .is_some_and(|&first| first <= target);
            if !pending {
                return;
            }
            notified.await;
        }
    };
    let _ = tokio::time::timeout(limit, wait).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a forked child sees: the registry's lock stays held (by a thread
    /// it lacks), and after the call a cleanup starts, ends and is waited
    /// for without it.
    #[test]
    fn after_forgetting_the_registry_cleanups_do_not_take_its_lock() {
        let earlier = REGISTRY.get();
        let settled =
            crate::leaked::held_elsewhere::after_forgetting(&earlier.running, forget, || async {
                let (ran, ran_here) = tokio::sync::oneshot::channel();
                spawn(async move {
                    let _ = ran.send(());
                });
                settle(Duration::from_secs(30)).await;
                ran_here.await.is_ok()
            });
        assert_eq!(settled, Some(true), "without the earlier registry's lock");
        assert!(!std::ptr::eq(REGISTRY.get(), earlier), "a new registry");
    }
}
