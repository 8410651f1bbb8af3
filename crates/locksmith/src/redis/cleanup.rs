//! Background work that a dropped future leaves behind, tracked per process.
//!
//! A dropped `acquire` cannot talk to Redis from `Drop`; it spawns the undo (leave
//! the fair queue, release a grant that raced the drop) instead. Inspection then
//! waits for the undo work this process started *before* it, so that the
//! process reads its own writes: right after a waiter is cancelled, `describe`
//! no longer lists it. The wait is bounded, so a hung Redis cannot stall
//! inspection for long.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

struct Registry {
    /// Sequence numbers of the tasks still running.
    running: Mutex<(u64, BTreeSet<u64>)>,
    done: Notify,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    running: Mutex::new((0, BTreeSet::new())),
    done: Notify::new(),
});

/// Removes a task from the registry when it ends, even by panic or abort.
struct Tracked(u64);

impl Drop for Tracked {
    fn drop(&mut self) {
        REGISTRY
            .running
            .lock()
            .expect("cleanup registry")
            .1
            .remove(&self.0);
        REGISTRY.done.notify_waiters();
    }
}

/// Runs `work` on the current runtime, tracked; outside a runtime it is dropped
/// (the hold or queue entry then ends with its lease).
pub(crate) fn spawn(work: impl Future<Output = ()> + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("redis cleanup outside a tokio runtime: left to the lease");
        return;
    };
    let tracked = {
        let mut running = REGISTRY.running.lock().expect("cleanup registry");
        running.0 += 1;
        let seq = running.0;
        running.1.insert(seq);
        Tracked(seq)
    };
    runtime.spawn(async move {
        let _tracked = tracked;
        work.await;
    });
}

/// Waits (at most `limit`) until every task spawned before this call ended.
///
/// Cancel safety: safe; it only waits.
pub(crate) async fn settle(limit: Duration) {
    let target = REGISTRY.running.lock().expect("cleanup registry").0;
    let wait = async {
        loop {
            let notified = REGISTRY.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pending = REGISTRY
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
