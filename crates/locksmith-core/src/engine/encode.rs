//! A [`FrozenEngine`] serialized exactly as the [`Snapshot`] that
//! [`FrozenEngine::into_snapshot`] would build (same fields, same order,
//! same values), without building it: a table of a million locks is
//! written straight from the engine's entries, not first copied into a
//! million owned names and owners that are dropped right after.
//!
//! Every struct here mirrors one of `crate::snapshot`'s, borrowed, under
//! its name; a test in the server compares the bytes of both ways.
//!
//! [`Snapshot`]: crate::Snapshot

use std::collections::VecDeque;

use serde::{Serialize, Serializer};

use super::{FrozenEngine, FrozenSession, Hold, LockEntry};
use crate::pace;
use crate::snapshot::{EndingSnapshot, WaiterSnapshot};
use crate::types::{Millis, Mode, RequestId, SessionId};

/// `Snapshot`, borrowed and sorted as `into_snapshot` sorts it.
#[derive(Serialize)]
#[serde(rename = "Snapshot")]
struct SnapshotRef<'a> {
    last_token: u64,
    sessions: Vec<&'a FrozenSession>,
    locks: Locks<'a>,
    waiters: Vec<&'a WaiterSnapshot>,
    ending: &'a [EndingSnapshot],
}

/// The locks, by name (each beside its entry: the sort compares names
/// without going through the entry, a memory access fewer per comparison
/// in a table of a million).
struct Locks<'a>(Vec<(&'a str, &'a LockEntry)>);

/// The locks `entries` yields (each time it is called), sorted by name as
/// [`FrozenEngine::into_snapshot`] sorts them.
///
/// A comparison of two names reads both from wherever the table put them:
/// in a million locks taken by many clients, two cache misses, and then
/// the prefix most names share (`orders/`, `jobs/nightly/`) compared
/// again each time. So each name's first eight bytes after the prefix
/// all of them share go beside it as a number, compared first; the names
/// themselves only when those are equal. A number is a name's next eight
/// bytes padded with zeros, so a smaller one is a name that sorts first,
/// whatever the bytes are.
fn sorted_by_name<'a, I>(entries: impl Fn() -> I) -> Locks<'a>
where
    I: Iterator<Item = &'a LockEntry>,
{
    let shared = entries()
        .map(|lock| lock.name.as_bytes())
        .reduce(|prefix, name| {
            pace::step();
            let same = prefix.iter().zip(name).take_while(|(a, b)| a == b).count();
            &prefix[..same]
        })
        .map_or(0, <[u8]>::len);
    let mut keyed: Vec<(u64, &str, &LockEntry)> = entries()
        .map(|lock| {
            pace::step();
            let rest = &lock.name.as_bytes()[shared..];
            let mut key = [0u8; 8];
            let taken = rest.len().min(8);
            key[..taken].copy_from_slice(&rest[..taken]);
            (u64::from_be_bytes(key), &*lock.name, lock)
        })
        .collect();
    let mut compared = 0;
    keyed.sort_unstable_by(|a, b| {
        pace::compared(&mut compared, a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
    });
    Locks(
        keyed
            .into_iter()
            .map(|(_, name, lock)| (name, lock))
            .collect(),
    )
}

/// `LockSnapshot`, borrowed.
#[derive(Serialize)]
#[serde(rename = "LockSnapshot")]
struct LockRef<'a> {
    name: &'a str,
    holders: Holds<'a>,
    queue: &'a VecDeque<(SessionId, RequestId)>,
    delay_until: Option<Millis>,
}

/// A lock's holders, oldest first.
struct Holds<'a>(&'a [Hold]);

/// `HoldSnapshot`, borrowed.
#[derive(Serialize)]
#[serde(rename = "HoldSnapshot")]
struct HoldRef<'a> {
    session: SessionId,
    owner: &'a str,
    mode: Mode,
    token: u64,
    count: u32,
    lock_time: Millis,
    lease_until: Option<Millis>,
    lock_delay: Millis,
}

impl Serialize for FrozenEngine {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut sessions: Vec<&FrozenSession> = self.sessions.iter().collect();
        sessions.sort_unstable_by_key(|s| s.session);
        let locks = sorted_by_name(|| self.locks.entries().map(|lock| &**lock));
        let mut waiters: Vec<&WaiterSnapshot> = self.waiters.iter().collect();
        waiters.sort_unstable_by_key(|w| (w.session, w.request));
        SnapshotRef {
            last_token: self.last_token,
            sessions,
            locks,
            waiters,
            ending: &self.ending,
        }
        .serialize(serializer)
    }
}

impl Serialize for Locks<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|&(name, lock)| {
            pace::step();
            LockRef {
                name,
                holders: Holds(&lock.holders),
                queue: &lock.queue,
                delay_until: lock.delay_until,
            }
        }))
    }
}

impl Serialize for Holds<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|h| HoldRef {
            session: h.session,
            owner: &h.owner,
            mode: h.mode,
            token: h.token,
            count: h.count,
            lock_time: h.lock_time,
            lease_until: h.lease_until,
            lock_delay: h.lock_delay.into(),
        }))
    }
}

/// The most bytes a varint (postcard's integers) of a `u64` takes.
const VARINT: usize = 10;

impl FrozenEngine {
    /// About as many bytes as its encoding takes, at least that for the
    /// locks (names and owners counted, every number at its longest): room
    /// to encode it into without growing the buffer. Room never written
    /// costs no memory (its pages are never touched); a buffer grown as it
    /// fills copies what it holds and touches twice the pages.
    pub fn encoded_len_hint(&self) -> usize {
        // A hold's numbers: session, mode (a tag and a permit count),
        // token, count, lock time, lease, lock-delay.
        const HOLD: usize = 8 * VARINT;
        let locks: usize = self
            .locks
            .entries()
            .map(|lock| {
                pace::step();
                let holders: usize = lock
                    .holders
                    .iter()
                    .map(|h| VARINT + h.owner.len() + HOLD)
                    .sum();
                3 * VARINT + lock.name.len() + holders + lock.queue.len() * 2 * VARINT + VARINT + 1
            })
            .sum();
        // The rest is small beside a big table: each at a generous guess.
        let sessions = (self.sessions.len() + self.ending.len()) * 256;
        let waiters: usize = self
            .waiters
            .iter()
            .map(|w| 256 + w.owner.len() + w.names.iter().map(|n| VARINT + n.len()).sum::<usize>())
            .sum();
        5 * VARINT + locks + sessions + waiters
    }
}
