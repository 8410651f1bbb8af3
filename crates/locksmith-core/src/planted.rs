//! Past defects, put back on demand, so that the deterministic simulator
//! (`locksmith-sim --plant NAME`) can show it finds each one.
//!
//! Each defect is a one-line check at the place its fix went, in the
//! engine, the server or the client library: `if planted::active(...)`.
//! The switches exist only with this crate's `planted` feature, which only
//! `locksmith-sim` turns on; without it [`active`] is a constant `false`
//! and the compiler drops every check, so a production build holds none.

/// A past defect that can be put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Defect {
    /// Heartbeats that arrive while a batch is in flight are dropped when
    /// that batch is applied (its emptied proposal replaces the one being
    /// gathered): healthy sessions expire. As when the defect shipped,
    /// every heartbeat is then a record: the leader answers none under its
    /// lease (`fd9faa4` came later, and made the path rare).
    HeartbeatsDropped = 1,
    /// The client stays with a member that answers no heartbeat (a frozen
    /// leader keeps its connections open) until its whole TTL has passed.
    FrozenLeader,
    /// The client follows a follower's hint back to a leader that answered
    /// nothing a moment ago. As when the defect shipped, a member whose
    /// connection broke gets a whole attempt, not a short one (`6c8135e`
    /// came later, and made following a stale hint cheap).
    StaleHint,
    /// An expiry applies only if the session's deadline equals the one it
    /// was decided from, not if it is no later.
    DeadlineByEquality,
    /// A new leader's grace (`GrantGrace`) pushes no deadline.
    NoGrace,
    /// An expiry applies whatever the current deadline, passed or not. As
    /// when the defect shipped, every heartbeat is then a record (answers
    /// under the leader's lease came later). A client counts its leases
    /// from before its requests, so a lease taken away right after the
    /// extension that moved it shows only to a check that holds the server
    /// to its answer (the simulator's "leases are kept").
    NoDeadlineCheck,
    /// The leader's joint-membership finisher ends a joint membership it
    /// saw twice whether or not it is applied yet and whether or not a
    /// change is under way, so that it can take the second step of a change
    /// still under way, whose own second step is then refused: the operator
    /// is told the change failed.
    JointFinisherRace,
    /// A member that led before a restart leads again at once in the same
    /// term, without an election (openraft's leader restore): after a
    /// power loss took the unsynced tail of its log, entries its followers
    /// committed without it, it writes other entries under their ids.
    LeaderRestore,
}

impl Defect {
    /// Every defect, as `--plant` names them.
    pub const ALL: [(Defect, &'static str); 8] = [
        (Defect::HeartbeatsDropped, "heartbeats-dropped"),
        (Defect::FrozenLeader, "frozen-leader"),
        (Defect::StaleHint, "stale-hint"),
        (Defect::DeadlineByEquality, "deadline-by-equality"),
        (Defect::NoGrace, "no-grace"),
        (Defect::NoDeadlineCheck, "no-deadline-check"),
        (Defect::JointFinisherRace, "joint-finisher-race"),
        (Defect::LeaderRestore, "leader-restore"),
    ];

    /// The defect named `name` (see [`Defect::ALL`]).
    pub fn named(name: &str) -> Option<Defect> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(d, _)| *d)
    }

    /// Its name for `--plant`.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(d, _)| *d == self)
            .map_or("", |(_, n)| n)
    }
}

#[cfg(feature = "planted")]
static PLANTED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Puts `defect` back, for the rest of this process.
#[cfg(feature = "planted")]
pub fn plant(defect: Defect) {
    PLANTED.store(defect as u8, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `defect` is put back in this process.
#[cfg(feature = "planted")]
#[inline]
pub fn active(defect: Defect) -> bool {
    PLANTED.load(std::sync::atomic::Ordering::Relaxed) == defect as u8
}

/// Whether `defect` is put back: never, in a build without the `planted`
/// feature.
#[cfg(not(feature = "planted"))]
#[inline(always)]
pub const fn active(_defect: Defect) -> bool {
    false
}
