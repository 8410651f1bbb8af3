//! The server's clock: Unix-epoch milliseconds that never go backwards.
//!
//! The engine takes "now" with every command and must never see it go back,
//! also not across a restart: logged commands carry their time, and a lease
//! granted before a crash expires at its logged deadline. So the clock starts at
//! `max(wall clock, last logged time)` and then advances with the monotonic
//! clock, immune to wall-clock steps while the server runs.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use locksmith_core::Millis;

/// Milliseconds since the Unix epoch, advancing monotonically from a base.
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    base: Millis,
    started: Instant,
}

impl Clock {
    /// A clock that starts at the wall clock, or at `floor` if that is later.
    pub(crate) fn starting_after(floor: Millis) -> Clock {
        Clock {
            base: wall_clock_ms().max(floor),
            started: Instant::now(),
        }
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

/// The wall clock in Unix-epoch milliseconds (0 if it is before 1970).
fn wall_clock_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_starts_before_the_floor() {
        let far = wall_clock_ms() + 3_600_000;
        let clock = Clock::starting_after(far);
        assert!(clock.now() >= far);
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.now() >= a);
        assert!(clock.instant_of(far).is_some_and(|i| i <= Instant::now()));
    }
}
