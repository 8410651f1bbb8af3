//! Deletes of abandoned queue keys that are still in flight, process-wide.
//!
//! A dropped acquire cannot await its cleanup, so it deletes its key in a
//! background task. Inspection in this process waits (briefly) for those
//! deletes under the prefix it reads, so it never reports a waiter that was
//! already cancelled here. Other processes simply see the delete land.
//!
//! The registry is a [`Leaked`] cell that a forked child forgets
//! ([`forget`]): a thread of the parent that was starting, ending or
//! awaiting deletes at the fork held its lock, which stays held in the
//! child for ever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::leaked::Leaked;

/// Longest wait for in-flight deletes before inspecting anyway.
const SETTLE: Duration = Duration::from_secs(2);

/// The deletes in flight: the key of each, and a token cancelled when it
/// lands.
type InFlight = Mutex<HashMap<u64, (String, CancellationToken)>>;

/// The registry of this process's deletes, made on first use and again
/// after [`forget`].
static IN_FLIGHT: Leaked<InFlight> = Leaked::new();
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Makes the deletes started from now on, and the inspections that wait for
/// them, use a new registry; the current one is forgotten, untouched (no
/// lock, nothing freed). For [`crate::forget_process_state_after_fork`],
/// which says why.
pub(crate) fn forget() {
    IN_FLIGHT.forget();
}

/// One in-flight delete; finished when dropped.
pub(crate) struct Cleanup {
    /// The registry it was recorded in.
    in_flight: &'static InFlight,
    id: u64,
    done: CancellationToken,
}

impl Cleanup {
    /// Marks the delete as landed (or given up).
    pub fn finish(self) {}
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.in_flight.lock().expect("cleanups").remove(&self.id);
        self.done.cancel();
    }
}

/// Records a delete of `key` about to start.
pub(crate) fn begin(key: &str) -> Cleanup {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let done = CancellationToken::new();
    let in_flight = IN_FLIGHT.get();
    in_flight
        .lock()
        .expect("cleanups")
        .insert(id, (key.to_owned(), done.clone()));
    Cleanup {
        in_flight,
        id,
        done,
    }
}

/// Waits until the in-flight deletes of keys under `prefix` have landed (at
/// most [`SETTLE`]); those of the current registry, not those started
/// before a [`forget`].
///
/// Cancel safety: safe; it only observes.
pub(crate) async fn settle(prefix: &str) {
    let pending: Vec<CancellationToken> = IN_FLIGHT
        .get()
        .lock()
        .expect("cleanups")
        .values()
        .filter(|(key, _)| key.starts_with(prefix))
        .map(|(_, done)| done.clone())
        .collect();
    if pending.is_empty() {
        return;
    }
    let all = futures::future::join_all(pending.iter().map(|done| done.cancelled()));
    let _ = tokio::time::timeout(SETTLE, all).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a forked child sees: the registry's lock stays held (by a thread
    /// it lacks), and after the call a delete is recorded, waited for and
    /// finished without it.
    #[test]
    fn after_forgetting_the_registry_deletes_do_not_take_its_lock() {
        let earlier = IN_FLIGHT.get();
        let stale = begin("stale/key");
        let settled = crate::leaked::held_elsewhere::after_forgetting(earlier, forget, || async {
            let cleanup = begin("fresh/key");
            let landing = tokio::spawn(async move { cleanup.finish() });
            // Not the delete recorded before the call: it never lands, and
            // this would wait out SETTLE for it.
            let waited = tokio::time::Instant::now();
            settle("").await;
            landing.await.unwrap();
            waited.elapsed() < SETTLE
        });
        assert_eq!(settled, Some(true), "without the earlier registry's lock");
        assert!(!std::ptr::eq(IN_FLIGHT.get(), earlier), "a new registry");
        // The earlier delete ends in the registry it was recorded in.
        stale.finish();
        assert!(earlier.lock().unwrap().is_empty());
    }
}
