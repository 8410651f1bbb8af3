//! What the clients saw, in the order it happened: the history the checks
//! read (module `check`).

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

/// What an acquire asks for, which decides whom it may hold beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Want {
    /// The lock alone: a plain lock, or a read-write lock's write side.
    Exclusive,
    /// A read-write lock's read side: beside other readers only.
    Shared,
    /// One permit of a semaphore of `of` permits.
    Permit {
        /// The semaphore's permits.
        of: u32,
    },
}

impl Want {
    /// Whether a grant of `self` may stand beside holds of `held`.
    pub fn fits_beside(self, held: &[Want]) -> bool {
        match self {
            Want::Exclusive => held.is_empty(),
            Want::Shared => held.iter().all(|h| *h == Want::Shared),
            Want::Permit { of } => {
                held.iter().all(|h| matches!(h, Want::Permit { .. })) && (held.len() as u32) < of
            }
        }
    }
}

/// An operation on one lock, as a client invoked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `acquire_timeout` (a wait of zero: `try_acquire`).
    Acquire {
        /// What it asks for.
        want: Want,
        /// The hold's own lease in milliseconds, if it has one.
        lease_ms: Option<u64>,
    },
    /// `extend` of the leased hold with this token.
    Extend {
        /// The hold's fencing token.
        token: u64,
        /// The new lease, in milliseconds.
        lease_ms: u64,
    },
    /// `release` of the hold with this token.
    Release {
        /// The hold's fencing token.
        token: u64,
    },
    /// The client dropped the guard of its lost hold with this token, which
    /// releases the hold in the background: invoked, never returned (only
    /// the rule "leases are kept" reads it).
    Drop {
        /// The hold's fencing token.
        token: u64,
    },
    /// The client was told its hold with this token is lost (`guard.lost()`
    /// fired): invoked and returned at the moment it was told.
    Lost {
        /// The hold's fencing token.
        token: u64,
        /// Whether it went with its session (expired, closed, or given up
        /// for want of a connection) rather than with its own lease.
        with_session: bool,
    },
}

/// What an operation returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ret {
    /// The lock was granted.
    Granted {
        /// Its fencing token.
        token: u64,
    },
    /// The wait ran out.
    TimedOut,
    /// The release worked.
    Released,
    /// The extension worked: the lease runs from now.
    Extended,
    /// The release or extension was refused: the hold was gone already.
    NotHeld,
    /// The client took note of its lost hold.
    Noted,
}

/// One invocation or return.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    /// Simulated time since the start of the run.
    pub at: Duration,
    /// The client.
    pub client: u32,
    /// The client's thread of operations: a new one after an operation
    /// whose outcome it could not learn (left pending: it may or may not
    /// have taken effect), since a thread has one operation at a time.
    pub thread: u64,
    /// Which lock (an index into the run's lock names).
    pub lock: usize,
    /// Invoked or returned.
    pub kind: Kind,
}

/// An invocation or a return.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The client started the operation.
    Invoke(Op),
    /// The operation returned to the client.
    Return(Ret),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.kind {
            Kind::Invoke(op) => format!("invoke {op:?}"),
            Kind::Return(ret) => format!("return {ret:?}"),
        };
        write!(
            f,
            "{:>10.3}s client {:>2} (thread {}) lock {}: {what}",
            self.at.as_secs_f64(),
            self.client,
            self.thread,
            self.lock
        )
    }
}

/// The run's history, shared by its clients (all on the simulation's one
/// thread).
#[derive(Debug, Clone, Default)]
pub struct History(Rc<RefCell<Vec<Event>>>);

impl History {
    pub(crate) fn record(&self, event: Event) {
        tracing::debug!(target: "locksmith_sim::history", "{event}");
        self.0.borrow_mut().push(event);
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.0.borrow().clone()
    }
}
