//! The server's clock: Unix-epoch milliseconds that never go backwards.
//!
//! The engine takes "now" with every command and must never see it go back,
//! also not across a restart: logged commands carry their time, and a lease
//! granted before a crash expires at its logged deadline. So the clock starts at
//! `max(wall clock, last logged time)` and then advances with the monotonic
//! clock, immune to wall-clock steps while the server runs.
//!
//! The monotonic clock is tokio's ([`tokio::time::Instant`]: the system's,
//! unless the runtime's clock is paused), and the wall clock is the one the
//! server is given ([`WallClock`]: the system's, unless a simulation gives
//! its own), so that under a simulator the server's time is the simulated
//! time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith_core::Millis;
use tokio::time::Instant;

/// Where the server reads the wall clock: `SystemTime::now` unless a
/// simulation gives its own (see [`crate::Environment::wall_clock`]).
pub type WallClock = fn() -> SystemTime;

/// Milliseconds since the Unix epoch, advancing monotonically from a base.
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    wall: WallClock,
    base: Millis,
    started: Instant,
}

impl Clock {
    /// A clock that starts at the wall clock `wall`.
    pub(crate) fn new(wall: WallClock) -> Clock {
        let mut clock = Clock {
            wall,
            base: 0,
            started: Instant::now(),
        };
        clock.restart_after(0);
        clock
    }

    /// The system's clock.
    #[cfg(test)]
    pub(crate) fn system() -> Clock {
        Clock::new(SystemTime::now)
    }

    /// Starts again at the wall clock, or at `floor` if that is later.
    pub(crate) fn restart_after(&mut self, floor: Millis) {
        self.base = epoch_ms((self.wall)()).max(floor);
        self.started = Instant::now();
    }

    /// Now, in server milliseconds.
    pub(crate) fn now(&self) -> Millis {
        self.base + self.started.elapsed().as_millis() as Millis
    }

    /// The instant at which [`Clock::now`] reaches `at`, if representable.
    pub(crate) fn instant_of(&self, at: Millis) -> Option<Instant> {
        let offset = at.saturating_sub(self.base);
        self.started.checked_add(Duration::from_millis(offset))
    }
}

/// `time` in Unix-epoch milliseconds (0 if it is before 1970).
fn epoch_ms(time: SystemTime) -> Millis {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_starts_before_the_floor() {
        let far = epoch_ms(SystemTime::now()) + 3_600_000;
        let mut clock = Clock::system();
        clock.restart_after(far);
        assert!(clock.now() >= far);
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.now() >= a);
        assert!(clock.instant_of(far).is_some_and(|i| i <= Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_given_wall_clock_and_the_runtime_clock() {
        fn at_2030() -> SystemTime {
            UNIX_EPOCH + Duration::from_secs(1_893_456_000)
        }
        let clock = Clock::new(at_2030);
        assert_eq!(clock.now(), 1_893_456_000_000);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now(), 1_893_456_005_000);
    }
}
