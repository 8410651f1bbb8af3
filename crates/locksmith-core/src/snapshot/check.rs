//! The rules a [`Snapshot`] keeps ([`Snapshot::check`]), applied to its
//! parts in the order they are written: sessions, then each lock, then the
//! waiters and the ending sessions. What a lock names that is listed only
//! after the locks (an ending session, a waiter) is kept and matched at the
//! end, so that a snapshot can be checked lock by lock while it is read,
//! without being built (`read.rs`; a backup of a million locks).
//!
//! [`Snapshot`]: super::Snapshot
//! [`Snapshot::check`]: super::Snapshot::check

use rustc_hash::{FxHashMap, FxHashSet};

use super::{EndingSnapshot, HoldSnapshot, SessionSnapshot, WaiterSnapshot};
use crate::error::SnapshotError;
use crate::name::validate_name;
use crate::pace;
use crate::types::{Mode, RequestId, SessionId};

/// What a checked snapshot holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotCensus {
    /// The fencing high-water mark.
    pub last_token: u64,
    /// Open sessions.
    pub sessions: usize,
    /// Sessions whose end is under way.
    pub ending: usize,
    /// Locks listed (held, awaited or in lock-delay).
    pub locks: usize,
    /// Locks held.
    pub held: usize,
    /// Holds (a shared lock or a semaphore has several).
    pub holds: usize,
    /// Pending acquires.
    pub waiters: usize,
}

/// What the rules need of one hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct HoldFacts<'a> {
    pub session: SessionId,
    pub owner: &'a str,
    pub mode: Mode,
    pub token: u64,
    pub count: u32,
    pub leased: bool,
}

impl<'a> HoldFacts<'a> {
    pub fn of(hold: &'a HoldSnapshot) -> Self {
        HoldFacts {
            session: hold.session,
            owner: &hold.owner,
            mode: hold.mode,
            token: hold.token,
            count: hold.count,
            leased: hold.lease_until.is_some(),
        }
    }
}

fn bad<T>(detail: String) -> Result<T, SnapshotError> {
    Err(SnapshotError(detail))
}

/// The rules, fed a snapshot's parts in order; `'a` is where the lock names
/// live (the snapshot, or the bytes it is read from).
///
/// Fx hashing, sized up front: a backup or a start checks a table of a
/// million locks, and SipHash with rehashing as the sets grew was most of
/// `locksmith snapshot save`'s time (docs/BENCHMARKS.md, "Operations:
/// backup and restore"). A snapshot comes from a member or an operator, not
/// from a client.
pub(super) struct Checker<'a> {
    last_token: u64,
    /// Open sessions; the ending ones join them at the end.
    sessions: FxHashSet<SessionId>,
    /// Lock names, in the order listed: strictly ascending, as the engine
    /// writes them, they are distinct without a set of a million names.
    names: Vec<&'a str>,
    ascending: bool,
    /// Every hold's token, sorted at the end to find one given twice: a
    /// million inserts into a hash set missed the cache on each and were a
    /// fifth of `snapshot save`'s CPU; pushing and one sort is a few times
    /// cheaper.
    tokens: Vec<u64>,
    /// Holds of a session that is not open, `(session, token, lock)`: it
    /// must be ending.
    not_open: Vec<(SessionId, u64, &'a str)>,
    /// Every queue entry, with its lock: each must be a waiter naming it.
    queued: Vec<((SessionId, RequestId), &'a str)>,
    census: SnapshotCensus,
}

impl<'a> Checker<'a> {
    /// Starts with the open sessions; `locks` is how many locks follow (a
    /// hint for the sets' sizes).
    pub fn new(
        last_token: u64,
        sessions: &[SessionSnapshot],
        locks: usize,
    ) -> Result<Self, SnapshotError> {
        let mut checker = Checker {
            last_token,
            sessions: FxHashSet::with_capacity_and_hasher(sessions.len(), Default::default()),
            names: Vec::with_capacity(locks),
            ascending: true,
            tokens: Vec::with_capacity(locks),
            not_open: Vec::new(),
            queued: Vec::new(),
            census: SnapshotCensus {
                last_token,
                sessions: sessions.len(),
                ..SnapshotCensus::default()
            },
        };
        for s in sessions {
            checker.add_session(s.session)?;
        }
        Ok(checker)
    }

    /// More room for `locks` more locks (a snapshot read as it streams
    /// announces how many).
    #[cfg(feature = "serde")]
    pub fn reserve(&mut self, locks: usize) {
        self.names.reserve(locks);
        self.tokens.reserve(locks);
    }

    fn add_session(&mut self, session: SessionId) -> Result<(), SnapshotError> {
        if session == SessionId::NONE || !self.sessions.insert(session) {
            return bad(format!("session {} is listed twice or is 0", session.0));
        }
        Ok(())
    }

    /// Checks one lock, the next in the order listed.
    pub fn lock(
        &mut self,
        name: &'a str,
        holders: &[HoldFacts<'_>],
        queue: &[(SessionId, RequestId)],
    ) -> Result<(), SnapshotError> {
        if let Err(e) = validate_name(name) {
            return bad(format!("lock {name:?}: {e}"));
        }
        if self.names.last().is_some_and(|last| *last >= name) {
            self.ascending = false;
        }
        self.names.push(name);
        // Most locks have one holder: no set to allocate for them.
        let several = holders.len() > 1;
        let mut owners = FxHashSet::default();
        for h in holders {
            if h.session == SessionId::NONE && !h.leased {
                return bad(format!(
                    "hold {} of lock {name:?} has neither a session nor a lease",
                    h.token
                ));
            }
            if h.session != SessionId::NONE && !self.sessions.contains(&h.session) {
                self.not_open.push((h.session, h.token, name));
            }
            if h.token == 0 || h.token > self.last_token {
                return bad(format!(
                    "hold {} of lock {name:?} has a token that was never issued (last {})",
                    h.token, self.last_token
                ));
            }
            self.tokens.push(h.token);
            if h.count == 0 {
                return bad(format!("hold {} of lock {name:?} is held 0 times", h.token));
            }
            if several && !owners.insert((h.session, h.owner)) {
                return bad(format!("lock {name:?} lists one owner's hold twice"));
            }
        }
        let compatible = match holders.first().map(|h| h.mode) {
            None => true,
            Some(Mode::Exclusive) => holders.len() == 1,
            Some(mode @ Mode::Shared) => holders.iter().all(|h| h.mode == mode),
            Some(mode @ Mode::Semaphore { permits }) => {
                holders.iter().all(|h| h.mode == mode) && holders.len() <= permits as usize
            }
        };
        if !compatible {
            return bad(format!("lock {name:?} has holders that exclude each other"));
        }
        let mut in_queue = FxHashSet::default();
        for key in queue {
            if queue.len() > 1 && !in_queue.insert(*key) {
                return bad(in_queue_once(name, *key));
            }
            self.queued.push((*key, name));
        }
        self.census.locks += 1;
        self.census.held += usize::from(!holders.is_empty());
        self.census.holds += holders.len();
        Ok(())
    }

    /// Checks what the locks named against the waiters and ending sessions
    /// listed after them.
    pub fn finish(
        mut self,
        waiters: &[WaiterSnapshot],
        ending: &[EndingSnapshot],
    ) -> Result<SnapshotCensus, SnapshotError> {
        for e in ending {
            self.add_session(e.session)?;
        }
        for &(session, token, name) in &self.not_open {
            if !self.sessions.contains(&session) {
                return bad(format!(
                    "hold {token} of lock {name:?} names session {}, which is neither open nor \
                     ending",
                    session.0
                ));
            }
        }
        let mut by_key: FxHashMap<(SessionId, RequestId), &WaiterSnapshot> =
            FxHashMap::with_capacity_and_hasher(waiters.len(), Default::default());
        for w in waiters {
            let what = || format!("waiter {}/{}", w.session.0, w.request.0);
            if w.session == SessionId::NONE && w.lease.is_none() {
                return bad(format!("{} has neither a session nor a lease", what()));
            }
            if w.session != SessionId::NONE && !self.sessions.contains(&w.session) {
                return bad(format!(
                    "{} names session {}, which is neither open nor ending",
                    what(),
                    w.session.0
                ));
            }
            if by_key.insert((w.session, w.request), w).is_some() {
                return bad(format!("{} is listed twice", what()));
            }
            let distinct: FxHashSet<&String> = w.names.iter().collect();
            if w.names.is_empty() || distinct.len() != w.names.len() {
                return bad(format!("{} names no lock or one lock twice", what()));
            }
        }
        radix_sort(&mut self.tokens);
        let mut compared = 0;
        if let Some(twice) = self.tokens.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("token {} is given twice (to two holds)", twice[0]));
        }
        if !self.ascending {
            self.names
                .sort_unstable_by(|a, b| pace::compared(&mut compared, a.cmp(b)));
            if let Some(twice) = self.names.windows(2).find(|w| w[0] == w[1]) {
                return bad(format!("lock {:?} is listed twice", twice[0]));
            }
        }
        for &(key, name) in &self.queued {
            let names_it = by_key
                .get(&key)
                .is_some_and(|w| w.names.iter().any(|n| n == name));
            if !names_it {
                return bad(in_queue_once(name, key));
            }
        }
        // Every queue entry matched a waiter naming that lock, once; so the
        // waiters' names, counted, must all be queue entries.
        let named: usize = waiters.iter().map(|w| w.names.len()).sum();
        if named != self.queued.len() {
            return bad(format!(
                "waiters name {named} locks in all, the queues hold {}",
                self.queued.len()
            ));
        }
        self.census.waiters = waiters.len();
        self.census.ending = ending.len();
        Ok(self.census)
    }
}

/// Sorts `values` a byte at a time (least significant first), a pass over
/// them per byte in which they differ, pausing as it goes ([`pace`]: a
/// unit of work per [`pace::COMPARISONS`] values, as a comparison sort
/// counts its comparisons).
///
/// Written here because the sorts at hand either compare (a million
/// tokens took a comparison sort, through a closure that counts for the
/// pauses, a fifth of `locksmith snapshot save`'s CPU) or cannot pause:
/// the radix sort crates run to the end in one call.
fn radix_sort(values: &mut Vec<u64>) {
    let mut sorted = Vec::new();
    for shift in (0..u64::BITS).step_by(8) {
        let digit = |value: u64| (value >> shift) as u8 as usize;
        let mut counts = [0usize; 256];
        for some in values.chunks(pace::COMPARISONS as usize) {
            for &value in some {
                counts[digit(value)] += 1;
            }
            pace::step();
        }
        if counts.contains(&values.len()) {
            // Every value has the same byte here: this pass would keep them
            // in the order they are in.
            continue;
        }
        let mut next = [0usize; 256];
        let mut start = 0;
        for (next, count) in next.iter_mut().zip(counts) {
            *next = start;
            start += count;
        }
        sorted.resize(values.len(), 0);
        for some in values.chunks(pace::COMPARISONS as usize) {
            for &value in some {
                let at = &mut next[digit(value)];
                sorted[*at] = value;
                *at += 1;
            }
            pace::step();
        }
        std::mem::swap(values, &mut sorted);
    }
}

fn in_queue_once(name: &str, key: (SessionId, RequestId)) -> String {
    format!(
        "the queue of lock {name:?} holds {}/{}, which waits for it once at most",
        key.0 .0, key.1 .0
    )
}

#[cfg(test)]
mod tests {
    use super::radix_sort;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_radix_sort_sorts_as_the_standard_sort_does(
            mut values in prop::collection::vec(any::<u64>(), 0..2_000),
            narrow in any::<bool>(),
        ) {
            if narrow {
                // Values that share their high bytes: passes skipped.
                values.iter_mut().for_each(|v| *v = 1_000_000 + *v % 70_000);
            }
            let mut expected = values.clone();
            expected.sort_unstable();
            radix_sort(&mut values);
            prop_assert_eq!(values, expected);
        }
    }

    #[test]
    fn the_radix_sort_pauses_as_it_goes() {
        use std::cell::Cell;
        thread_local! {
            static PAUSES: Cell<u32> = const { Cell::new(0) };
        }
        let mut values: Vec<u64> = (0..100_000u64).rev().map(|v| v << 20).collect();
        crate::pace::pausing(|| PAUSES.set(PAUSES.get() + 1), || radix_sort(&mut values));
        assert!(values.windows(2).all(|w| w[0] < w[1]));
        assert!(PAUSES.get() > 10, "{} pauses", PAUSES.get());
    }
}
