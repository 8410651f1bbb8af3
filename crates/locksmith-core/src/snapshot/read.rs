//! A [`Snapshot`]'s encoding checked as it is read, lock by lock, without
//! building it: a backup of a million locks is checked where its bytes lie
//! (names and owners borrowed), not first decoded into a million owned
//! names, owners and holder lists that are dropped right after.
//!
//! [`Snapshot`]: super::Snapshot

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::check::{Checker, HoldFacts, SnapshotCensus};
use super::{EndingSnapshot, SessionSnapshot, WaiterSnapshot};
use crate::error::SnapshotError;
use crate::pace;
use crate::types::{Millis, Mode, RequestId, SessionId};

/// A [`Snapshot`](super::Snapshot) read from its serde encoding and checked
/// by [`Snapshot::check`](super::Snapshot::check)'s rules as it streams
/// by: what it holds, or why it does not hold together.
///
/// It reads formats that lay a struct out as a sequence of its fields
/// (postcard, bincode), from bytes it can borrow names from
/// (`postcard::from_bytes`). A snapshot that decodes but breaks a rule is
/// still read to its end (so that what follows it decodes), and
/// [`CheckedSnapshot::into_result`] says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSnapshot(Result<SnapshotCensus, SnapshotError>);

impl CheckedSnapshot {
    /// What the snapshot holds, or the first rule it breaks.
    pub fn into_result(self) -> Result<SnapshotCensus, SnapshotError> {
        self.0
    }
}

/// `HoldSnapshot` as it is written, its owner borrowed.
#[derive(Deserialize)]
#[serde(rename = "HoldSnapshot")]
struct HoldRead<'a> {
    session: SessionId,
    owner: &'a str,
    mode: Mode,
    token: u64,
    count: u32,
    _lock_time: Millis,
    lease_until: Option<Millis>,
    _lock_delay: Millis,
}

/// The state of one read: the rules, the first one broken, and buffers
/// reused from lock to lock.
struct Reading<'de> {
    checker: Option<Checker<'de>>,
    failed: Option<SnapshotError>,
    holds: Vec<HoldFacts<'de>>,
    queue: Vec<(SessionId, RequestId)>,
}

impl<'de> Reading<'de> {
    /// Checks the lock just read (its holders and queue in the buffers),
    /// unless a rule was broken already: then reading goes on alone.
    fn check_lock(&mut self, name: &'de str) {
        let Reading {
            checker,
            failed,
            holds,
            queue,
        } = self;
        if let Some(rules) = checker {
            if let Err(e) = rules.lock(name, holds, queue) {
                *failed = Some(e);
                *checker = None;
            }
        }
    }
}

/// Most locks reserved for up front from the length a snapshot announces:
/// more than a million, and not what a damaged length could ask for.
const MAX_RESERVED_LOCKS: usize = 1 << 21;

impl<'de> Deserialize<'de> for CheckedSnapshot {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const FIELDS: &[&str] = &["last_token", "sessions", "locks", "waiters", "ending"];
        deserializer.deserialize_struct("Snapshot", FIELDS, SnapshotVisitor)
    }
}

struct SnapshotVisitor;

impl<'de> Visitor<'de> for SnapshotVisitor {
    type Value = CheckedSnapshot;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a lock engine snapshot")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CheckedSnapshot, A::Error> {
        let last_token: u64 = next(&mut seq, 0, &self)?;
        let sessions: Vec<SessionSnapshot> = next(&mut seq, 1, &self)?;
        let mut reading = Reading {
            checker: None,
            failed: None,
            holds: Vec::new(),
            queue: Vec::new(),
        };
        match Checker::new(last_token, &sessions, 0) {
            Ok(checker) => reading.checker = Some(checker),
            Err(e) => reading.failed = Some(e),
        }
        seq.next_element_seed(Locks(&mut reading))?
            .ok_or_else(|| de::Error::invalid_length(2, &self))?;
        let waiters: Vec<WaiterSnapshot> = next(&mut seq, 3, &self)?;
        let ending: Vec<EndingSnapshot> = next(&mut seq, 4, &self)?;
        let result = match (reading.checker, reading.failed) {
            (_, Some(failed)) => Err(failed),
            (Some(checker), None) => checker.finish(&waiters, &ending),
            (None, None) => unreachable!("a rule broken is kept"),
        };
        Ok(CheckedSnapshot(result))
    }
}

/// The next field of a struct read as a sequence.
fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    index: usize,
    expected: &dyn de::Expected,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::invalid_length(index, expected))
}

/// The locks, checked one by one.
struct Locks<'r, 'de>(&'r mut Reading<'de>);

impl<'de> DeserializeSeed<'de> for Locks<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Locks<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence of locks")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let reading = self.0;
        if let (Some(checker), Some(len)) = (&mut reading.checker, seq.size_hint()) {
            checker.reserve(len.min(MAX_RESERVED_LOCKS));
        }
        while seq.next_element_seed(Lock(&mut *reading))?.is_some() {}
        Ok(())
    }
}

/// One lock, checked.
struct Lock<'r, 'de>(&'r mut Reading<'de>);

impl<'de> DeserializeSeed<'de> for Lock<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        const FIELDS: &[&str] = &["name", "holders", "queue", "delay_until"];
        deserializer.deserialize_struct("LockSnapshot", FIELDS, self)
    }
}

impl<'de> Visitor<'de> for Lock<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a lock")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let reading = self.0;
        let name: &'de str = next(&mut seq, 0, &"a lock's name")?;
        reading.holds.clear();
        seq.next_element_seed(Holds(&mut reading.holds))?
            .ok_or_else(|| de::Error::invalid_length(1, &"a lock's holders"))?;
        reading.queue.clear();
        seq.next_element_seed(Queue(&mut reading.queue))?
            .ok_or_else(|| de::Error::invalid_length(2, &"a lock's queue"))?;
        let _delay_until: Option<Millis> = next(&mut seq, 3, &"a lock's delay")?;
        reading.check_lock(name);
        pace::step();
        Ok(())
    }
}

/// A lock's holders, into a buffer reused from lock to lock.
struct Holds<'r, 'de>(&'r mut Vec<HoldFacts<'de>>);

impl<'de> DeserializeSeed<'de> for Holds<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Holds<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a lock's holders")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(h) = seq.next_element::<HoldRead<'de>>()? {
            self.0.push(HoldFacts {
                session: h.session,
                owner: h.owner,
                mode: h.mode,
                token: h.token,
                count: h.count,
                leased: h.lease_until.is_some(),
            });
        }
        Ok(())
    }
}

/// A lock's queue, into a buffer reused from lock to lock.
struct Queue<'r>(&'r mut Vec<(SessionId, RequestId)>);

impl<'de> DeserializeSeed<'de> for Queue<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Queue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a lock's queue")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(entry) = seq.next_element()? {
            self.0.push(entry);
        }
        Ok(())
    }
}
