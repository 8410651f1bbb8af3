//! Heartbeats answered by the stream's reader, where they are read, and
//! the end of the core's use of a stream.
//!
//! A heartbeat of a live session changes nothing in the log while this
//! member leads under its lease (module `core::front::liveness` has the
//! rules and docs/architecture.md the argument): the leader only notes when
//! it heard the session. Taking it through the core for that cost the
//! leader about two fifths of its CPU with 100 000 idle sessions (a
//! message to the core, a wake-up of its task, a look-up in each of its
//! maps and a batch to the stream's writer per heartbeat). So each
//! attached stream shares a [`Pulse`] with the core: the time the session
//! was last heard, whether the reader may answer, and whether the core is
//! done with the stream. The reader answers a heartbeat itself
//! when the pulse is open, the session's deadline has not passed and the
//! leader's lease holds (`raft::propose::HeartbeatLease`); anything else goes to the
//! core as before, which answers it under the lease or logs it.
//!
//! Who decides what:
//! - the core opens a pulse when it answers a heartbeat under the lease
//!   (so the reader answers only in a stint in which the core already did,
//!   on the core's own clock), and closes it before it decides the
//!   session's expiry, before it gives up the stream, and when it stops
//!   leading;
//! - the reader moves the heard time forward only with a compare-and-swap
//!   on an open pulse, so a heartbeat is either answered before the close
//!   (and the core, reading the time the close returns, sees the session
//!   alive) or goes to the core after it (and is ordered against the expiry
//!   by the log, as before).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use locksmith_core::Millis;

use crate::clock::Clock;

/// Set in [`Pulse::heard`] while the reader may not answer.
const CLOSED: u64 = 1 << 63;
/// Set in [`Pulse::heard`] once the core is done with the stream.
const ENDED: u64 = 1 << 62;
/// The time in [`Pulse::heard`].
const TIME: u64 = ENDED - 1;

/// What a session stream's reader and the core share: when the session was
/// last heard on this member, whether the reader may answer its heartbeats,
/// and whether the core is done with the stream (then the reader reads no
/// more). One atomic word, so that an idle stream keeps a few bytes for it
/// and the reader reads it without a lock.
#[derive(Debug)]
pub(crate) struct Pulse {
    /// The time of the last heartbeat answered (the leader's clock, 0:
    /// none), with [`CLOSED`] set while the reader may not answer and
    /// [`ENDED`] once the core is done with the stream.
    heard: AtomicU64,
    /// The session's TTL, written by the core before it opens the pulse.
    ttl: AtomicU64,
    /// The core's clock, given with the first opening (the clock is the
    /// same for a whole stint, and a stream does not outlive its stint).
    clock: OnceLock<Clock>,
}

impl Default for Pulse {
    fn default() -> Pulse {
        Pulse {
            heard: AtomicU64::new(CLOSED),
            ttl: AtomicU64::new(0),
            clock: OnceLock::new(),
        }
    }
}

impl Pulse {
    /// The core answered a heartbeat at `now` under the lease: the reader
    /// may answer the next ones itself.
    pub(crate) fn open(&self, now: Millis, ttl: Millis, clock: &Clock) {
        let _ = self.clock.set(clock.clone());
        self.ttl.store(ttl, Ordering::Relaxed);
        let _ = self
            .heard
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |heard| {
                let time = (heard & TIME).max(now);
                Some(match heard & ENDED {
                    0 => time,
                    _ => time | ENDED | CLOSED,
                })
            });
    }

    /// The reader may answer no more; returns the last time heard (0:
    /// never), which no answer of the reader's can move any more.
    pub(crate) fn close(&self) -> Millis {
        self.heard.fetch_or(CLOSED, Ordering::AcqRel) & TIME
    }

    /// The core is done with the stream: its reader answers nothing more
    /// and reads no more.
    pub(crate) fn end(&self) {
        self.heard.fetch_or(ENDED | CLOSED, Ordering::AcqRel);
    }

    /// Whether the core is done with the stream.
    pub(crate) fn is_ended(&self) -> bool {
        self.heard.load(Ordering::Acquire) & ENDED != 0
    }

    /// Carries `heard` over from the pulse of a stream this one replaces
    /// (open or closed, the pulse keeps the later time).
    pub(crate) fn carry(&self, heard: Millis) {
        let _ = self
            .heard
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                Some((current & TIME).max(heard) | (current & !TIME))
            });
    }

    /// Closes the pulse and forgets when it was heard: nobody was heard
    /// here yet (a new leader's grace was applied).
    pub(crate) fn reset(&self) {
        let _ = self
            .heard
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |heard| {
                Some(heard & ENDED | CLOSED)
            });
    }

    /// The last time heard (0: never), open or closed.
    pub(crate) fn heard(&self) -> Millis {
        self.heard.load(Ordering::Acquire) & TIME
    }

    /// The reader's answer to a heartbeat: the time on the core's clock it
    /// is answered at, if the pulse is open and the session's deadline
    /// (the last time heard plus its TTL) has not passed; `None` sends it
    /// to the core. The caller checks the lease first.
    pub(crate) fn answer(&self) -> Option<Millis> {
        let mut heard = self.heard.load(Ordering::Acquire);
        loop {
            if heard & (CLOSED | ENDED) != 0 {
                return None;
            }
            let now = self.clock.get()?.now();
            if now >= heard.saturating_add(self.ttl.load(Ordering::Relaxed)) {
                return None;
            }
            match self.heard.compare_exchange_weak(
                heard,
                now.max(heard),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(now),
                Err(changed) => heard = changed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A pulse the core opened now with a TTL of 1 s, its clock, and now.
    fn opened() -> (Pulse, Clock, Millis) {
        let clock = Clock::system();
        let pulse = Pulse::default();
        assert_eq!(pulse.answer(), None, "closed until the core opens it");
        let now = clock.now();
        pulse.open(now, 1_000, &clock);
        (pulse, clock, now)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pulse_answers_only_while_open_and_within_the_deadline() {
        let (pulse, _, opened) = opened();
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(pulse.answer(), Some(opened + 400));
        assert_eq!(pulse.heard(), opened + 400);
        // 1 000 ms after the last answer, not after the opening.
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(pulse.answer(), Some(opened + 1_399));
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(pulse.answer(), None, "past the deadline: the core decides");
        assert_eq!(pulse.heard(), opened + 1_399);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_pulse_keeps_its_time_and_answers_nothing() {
        let (pulse, clock, opened) = opened();
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(pulse.answer(), Some(opened + 10));
        assert_eq!(pulse.close(), opened + 10);
        assert_eq!(pulse.answer(), None);
        assert_eq!(pulse.heard(), opened + 10);
        // Opened again by an answer of the core's: never back in time.
        pulse.open(opened + 5, 1_000, &clock);
        assert_eq!(pulse.heard(), opened + 10);
        assert!(pulse.answer().is_some());
        pulse.reset();
        assert_eq!((pulse.heard(), pulse.answer()), (0, None));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_pulse_stays_ended_and_answers_nothing() {
        let (pulse, clock, opened) = opened();
        assert!(!pulse.is_ended());
        pulse.end();
        assert!(pulse.is_ended());
        assert_eq!(pulse.answer(), None);
        // Nothing the core does with it after opens it again.
        pulse.open(opened + 1, 1_000, &clock);
        pulse.carry(opened + 2);
        pulse.reset();
        assert!(pulse.is_ended());
        assert_eq!(pulse.answer(), None);
    }
}
