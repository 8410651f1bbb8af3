//! What client processes tell the fenced resource, one JSON object per line.
//!
//! Every request gets exactly one [`Reply`] line, so a client always knows its
//! report arrived before it goes on (a client killed with `kill -9` loses at
//! most the report it was writing). Times are `CLOCK_MONOTONIC` nanoseconds
//! ([`now`]): one clock for every process of the machine, untouched by NTP and
//! by `SIGSTOP`, so client and coordinator timestamps compare directly.

use serde::{Deserialize, Serialize};

/// Nanoseconds of `CLOCK_MONOTONIC`, the same clock in every process.
pub fn now() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Which fenced write of a critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The first write: the client enters the critical section.
    Begin,
    /// The last write, carrying (client, token, start, end): it leaves.
    End,
}

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// First line of every connection.
    Hello {
        /// Client slot (0..K).
        client: u32,
        /// How many times this slot has been (re)spawned before.
        incarnation: u32,
        /// The client's process id.
        pid: u32,
    },
    /// About to call acquire. The reply says whether to stop instead.
    Waiting {
        /// The lock.
        lock: String,
        /// When (client clock).
        at: u64,
    },
    /// Acquire returned a guard.
    Granted {
        /// The lock.
        lock: String,
        /// Its fencing token.
        token: u64,
        /// When acquire was called.
        asked: u64,
        /// When it returned.
        at: u64,
    },
    /// A fenced write to the protected resource.
    Write {
        /// The lock the write is fenced by.
        lock: String,
        /// The writer's fencing token.
        token: u64,
        /// Which write.
        phase: Phase,
        /// When the critical section started (client clock).
        start: u64,
        /// When it ended (for [`Phase::End`]; equal to `start` for `Begin`).
        end: u64,
    },
    /// The client saw its guard lost before a write and skipped it, leaving the
    /// critical section.
    Abort {
        /// The lock.
        lock: String,
        /// The lost hold's token.
        token: u64,
        /// Why the guard was lost.
        reason: String,
    },
    /// The guard's lost signal fired (reported as soon as it fires).
    Lost {
        /// The lock.
        lock: String,
        /// The lost hold's token.
        token: u64,
        /// Why.
        reason: String,
        /// When (client clock).
        at: u64,
    },
    /// Release returned.
    Released {
        /// The lock.
        lock: String,
        /// The released hold's token.
        token: u64,
        /// The release error, if any (a lost hold fails its release).
        error: Option<String>,
        /// When (client clock).
        at: u64,
    },
    /// Acquire (or connecting) failed.
    Failed {
        /// The lock.
        lock: String,
        /// The error.
        error: String,
        /// When (client clock).
        at: u64,
    },
}

/// The resource's answer to every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// For writes: whether the resource took it (the token was not below the
    /// highest it has accepted for the lock). `true` for other requests.
    pub accepted: bool,
    /// The round is over: release and exit.
    pub stop: bool,
    /// For an accepted `Begin`: stay inside this many milliseconds longer than
    /// usual (the nemesis wants a long critical section to fault).
    #[serde(default)]
    pub linger_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_line() {
        let request = Request::Write {
            lock: "a/b".into(),
            token: 7,
            phase: Phase::End,
            start: 1,
            end: 2,
        };
        let line = serde_json::to_string(&request).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request);
        assert!(line.contains(r#""op":"write""#));
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now();
        let b = now();
        assert!(b >= a && a > 0);
    }
}
