//! Renewals at each session's own instant (`--spread-renewals`).
//!
//! tokio's timer turns its wheel once a millisecond, so the keepers of every
//! session due within a millisecond wake together and their renewals leave
//! together: at 100 000 sessions and a 10 s TTL, about 30 at once, mostly on
//! one connection (a connection's sessions have neighbouring phases). That is
//! how one client process's sessions arrive, and a server reads and answers
//! them in one go. Sessions of independent clients arrive one by one. The
//! pacer wakes each keeper at its own instant instead, to within the
//! system's timer slack (about 50 µs), from one thread that sleeps until the
//! next instant due: a timer of its own, because tokio's is the thing
//! replaced and no crate offers a finer one for async tasks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Wakes keepers at their instants; cloned into every keeper. Its thread
/// ends once every clone is gone.
#[derive(Clone)]
pub(super) struct Pacer(mpsc::Sender<Due>);

impl Pacer {
    pub(super) fn start() -> Result<Pacer, String> {
        let (schedule, scheduled) = mpsc::channel();
        std::thread::Builder::new()
            .name("renewal-pacer".into())
            .spawn(move || wake_when_due(scheduled))
            .map_err(|e| format!("cannot start the renewal pacer: {e}"))?;
        Ok(Pacer(schedule))
    }

    /// Notifies `wake` at `at` (at once if it has passed).
    pub(super) fn wake_at(&self, at: Instant, wake: &Arc<Notify>) {
        // The thread stops only once every pacer is gone, this one included.
        let _ = self.0.send(Due {
            at,
            wake: wake.clone(),
        });
    }
}

/// One keeper's next instant.
struct Due {
    at: Instant,
    wake: Arc<Notify>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Due) -> bool {
        self.at == other.at
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Due) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// Reversed, so that the heap's top is the soonest.
    fn cmp(&self, other: &Due) -> Ordering {
        other.at.cmp(&self.at)
    }
}

/// The pacer's thread: wakes what is due, then sleeps until the soonest
/// instant or a new one arrives.
fn wake_when_due(scheduled: mpsc::Receiver<Due>) {
    let mut pending = BinaryHeap::new();
    loop {
        let now = Instant::now();
        while pending.peek().is_some_and(|due: &Due| due.at <= now) {
            if let Some(due) = pending.pop() {
                due.wake.notify_one();
            }
        }
        let sleep = pending
            .peek()
            .map_or(Duration::from_secs(1), |due| due.at - now);
        match scheduled.recv_timeout(sleep) {
            Ok(due) => {
                pending.push(due);
                pending.extend(scheduled.try_iter());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each keeper is woken, and none before its instant, whatever the
    /// order the instants were given in.
    #[tokio::test]
    async fn each_keeper_wakes_at_its_instant_and_not_before() {
        let pacer = Pacer::start().expect("pacer");
        let start = Instant::now();
        let mut keepers: Vec<(Instant, Arc<Notify>)> = [3, 1, 2, 0]
            .into_iter()
            .map(|ms| (start + Duration::from_millis(ms), Arc::new(Notify::new())))
            .collect();
        for (at, wake) in &keepers {
            pacer.wake_at(*at, wake);
        }
        keepers.sort_by_key(|(at, _)| *at);
        for (at, wake) in keepers {
            tokio::time::timeout(Duration::from_secs(10), wake.notified())
                .await
                .expect("woken");
            assert!(Instant::now() >= at, "woken before its instant");
        }
    }
}
