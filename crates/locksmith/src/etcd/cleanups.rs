//! Deletes of abandoned queue keys that are still in flight, process-wide.
//!
//! A dropped acquire cannot await its cleanup, so it deletes its key in a
//! background task. Inspection in this process waits (briefly) for those
//! deletes under the prefix it reads, so it never reports a waiter that was
//! already cancelled here. Other processes simply see the delete land.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Longest wait for in-flight deletes before inspecting anyway.
const SETTLE: Duration = Duration::from_secs(2);

static IN_FLIGHT: Mutex<Option<HashMap<u64, (String, CancellationToken)>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// One in-flight delete; finished when dropped.
pub(crate) struct Cleanup {
    id: u64,
    done: CancellationToken,
}

impl Cleanup {
    /// Marks the delete as landed (or given up).
    pub fn finish(self) {}
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(map) = IN_FLIGHT.lock().expect("cleanups").as_mut() {
            map.remove(&self.id);
        }
        self.done.cancel();
    }
}

/// Records a delete of `key` about to start.
pub(crate) fn begin(key: &str) -> Cleanup {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let done = CancellationToken::new();
    IN_FLIGHT
        .lock()
        .expect("cleanups")
        .get_or_insert_with(HashMap::new)
        .insert(id, (key.to_owned(), done.clone()));
    Cleanup { id, done }
}

/// Waits until the in-flight deletes of keys under `prefix` have landed (at
/// most [`SETTLE`]).
///
/// Cancel safety: safe; it only observes.
pub(crate) async fn settle(prefix: &str) {
    let pending: Vec<CancellationToken> = IN_FLIGHT
        .lock()
        .expect("cleanups")
        .iter()
        .flat_map(|map| map.values())
        .filter(|(key, _)| key.starts_with(prefix))
        .map(|(_, done)| done.clone())
        .collect();
    if pending.is_empty() {
        return;
    }
    let all = futures::future::join_all(pending.iter().map(|done| done.cancelled()));
    let _ = tokio::time::timeout(SETTLE, all).await;
}
