//! The grant history per lock, and the counts of holds, waiters and sessions
//! that the metrics report. Both are kept from the commands the core applies
//! and the effects those produce, so neither ever asks the engine to walk its
//! table (which would stall every client for the length of the walk).
//!
//! An effect does not carry all a history entry needs: a grant names its
//! session, request and tokens, but not the locks, the owner or the client.
//! So [`History`] keeps what the commands said and their effects leave out:
//!
//! - the **pending acquires**: names, owner and mode of each queued request,
//!   until it is granted, times out, is cancelled or its session ends;
//! - the **client label** of each open session;
//! - the **extra levels of re-entered holds** (re-entered by a second
//!   acquire, or counted by the client: `SetHoldCount`), so that a release
//!   which only takes off a level does not count as the end of the hold.
//!
//! Each follows a part of the engine's state (its waiters, its sessions, its
//! re-entered holds), so each is bounded by the engine's own limits. They are
//! rebuilt from the snapshot on recovery, and the replay of the log after it
//! keeps them the way a running server does. A new hold is told from a
//! re-entry by its token: a new hold always gets a token above every earlier
//! one (the fencing rule), a re-entry keeps its hold's.
//!
//! The history itself is a ring of the most recent grants per lock,
//! bounded three ways ([`HistoryLimits`]): grants per lock, grants in all
//! (the oldest anywhere is forgotten first), and age (counted from the
//! grant). It lives in memory only: after a restart it starts again from the
//! holds in the snapshot and the grants replayed from the log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::{
    ClientInfo, Command, Effect, LostReason, Millis, Mode, RequestId, SessionId, Snapshot,
};
use locksmith_proto::v1 as pb;

use crate::convert;
use crate::metrics::{Census, Metrics};

/// How much history the server keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryLimits {
    /// Most recent grants kept per lock (0 keeps no history).
    pub per_lock: usize,
    /// Most grants kept in all.
    pub total: usize,
    /// Grants older than this are forgotten.
    pub max_age: Millis,
}

type WaiterKey = (SessionId, RequestId);

/// An acquire as the history needs it when it is granted.
pub(crate) struct Acquire {
    names: Vec<Arc<str>>,
    owner: Arc<str>,
    mode: Mode,
    since: Millis,
}

/// What a command says that its effects leave out, taken before the engine
/// consumes the command.
pub(crate) enum Seen {
    Open(SessionId, Arc<ClientInfo>),
    End(SessionId),
    Acquire(WaiterKey, Acquire),
    Cancel(WaiterKey),
    Release {
        session: SessionId,
        name: String,
        owner: String,
    },
    /// A hold's count set by its client.
    Count {
        key: (SessionId, String, String),
        count: u32,
    },
    Other,
}

/// How a recorded hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Released,
    Lost(LostReason),
}

/// One grant of one lock.
struct Record {
    token: u64,
    session: SessionId,
    owner: Arc<str>,
    client: Option<Arc<ClientInfo>>,
    mode: Mode,
    granted_at: Millis,
    waited: Millis,
    end: Option<(Millis, End)>,
}

/// The grant history and the table counts (see the module docs).
pub(crate) struct History {
    limits: HistoryLimits,
    /// Recent grants per lock, oldest first (so in token order).
    locks: HashMap<Arc<str>, VecDeque<Record>>,
    /// Every kept grant in grant order, for the total and age bounds; an
    /// entry whose grant the per-lock bound dropped already is skipped.
    order: VecDeque<(Millis, Arc<str>, u64)>,
    pending: BTreeMap<WaiterKey, Acquire>,
    clients: HashMap<SessionId, Arc<ClientInfo>>,
    /// Extra levels of re-entered holds, by (session, lock, owner).
    reentered: HashMap<(SessionId, String, String), u32>,
    holds: u64,
}

impl History {
    pub(crate) fn new(limits: HistoryLimits) -> History {
        History {
            limits,
            locks: HashMap::new(),
            order: VecDeque::new(),
            pending: BTreeMap::new(),
            clients: HashMap::new(),
            reentered: HashMap::new(),
            holds: 0,
        }
    }

    /// A history of the same limits started from an engine snapshot: its
    /// sessions, waiters and holds (the holds become the first entries of
    /// the history, in token order). Of a table bigger than the history's
    /// total bound only the newest holds are built, the ones pushing them
    /// all would keep: a million held locks were a million records made and
    /// forgotten at every start, a third of a member's start.
    pub(crate) fn restored(&self, snapshot: &Snapshot) -> History {
        let mut history = History::new(self.limits);
        history.start_from(snapshot);
        history
    }

    fn start_from(&mut self, snapshot: &Snapshot) {
        for s in &snapshot.sessions {
            self.clients.insert(s.session, Arc::new(s.info.clone()));
        }
        for w in &snapshot.waiters {
            let acquire = Acquire {
                names: w.names.iter().map(|n| Arc::from(n.as_str())).collect(),
                owner: w.owner.as_str().into(),
                mode: w.mode,
                since: w.since,
            };
            self.pending.insert((w.session, w.request), acquire);
        }
        // Every hold by token (unique: a new hold gets a token above all
        // others), with where it is in the snapshot.
        let mut held: Vec<(u64, usize, usize)> = Vec::new();
        for (l, lock) in snapshot.locks.iter().enumerate() {
            for (h, hold) in lock.holders.iter().enumerate() {
                self.holds += 1;
                if hold.count > 1 {
                    let key = (hold.session, lock.name.clone(), hold.owner.clone());
                    self.reentered.insert(key, hold.count - 1);
                }
                held.push((hold.token, l, h));
            }
        }
        let HistoryLimits {
            per_lock, total, ..
        } = self.limits;
        let kept = if per_lock == 0 {
            0
        } else {
            total.min(held.len())
        };
        let forgotten = held.len() - kept;
        if kept == 0 {
            held.clear();
        } else if forgotten > 0 {
            held.select_nth_unstable(forgotten);
            held.drain(..forgotten);
        }
        held.sort_unstable();
        for (_, l, h) in held {
            let lock = &snapshot.locks[l];
            let hold = &lock.holders[h];
            let record = Record {
                token: hold.token,
                session: hold.session,
                owner: hold.owner.as_str().into(),
                client: self.clients.get(&hold.session).cloned(),
                mode: hold.mode,
                granted_at: hold.lock_time,
                waited: 0,
                end: None,
            };
            self.push(&lock.name.as_str().into(), record);
        }
    }

    /// What the history needs of `command`, taken before it is applied at `now`.
    pub(crate) fn before(&self, now: Millis, command: &Command) -> Seen {
        match command {
            Command::OpenSession { session, info, .. } => {
                Seen::Open(*session, Arc::new(info.clone()))
            }
            Command::CloseSession { session } | Command::ExpireSession { session, .. } => {
                Seen::End(*session)
            }
            Command::Acquire(a) => Seen::Acquire(
                (a.session, a.request),
                Acquire {
                    names: a.names.iter().map(|n| Arc::from(n.as_str())).collect(),
                    owner: a.owner.as_str().into(),
                    mode: a.mode,
                    since: now,
                },
            ),
            Command::Cancel { session, request } => Seen::Cancel((*session, *request)),
            Command::Release {
                session,
                owner,
                name,
                ..
            } => Seen::Release {
                session: *session,
                name: name.clone(),
                owner: owner.clone(),
            },
            Command::SetHoldCount {
                session,
                owner,
                name,
                count,
                ..
            } => Seen::Count {
                key: (*session, name.clone(), owner.clone()),
                count: *count,
            },
            _ => Seen::Other,
        }
    }

    /// Takes in a command that applied at `now`: what [`History::before`]
    /// saw of it and the effects it had. `mark` is the engine's last token
    /// before it applied. Queued acquires that are granted report their wait
    /// to `metrics`.
    pub(crate) fn after(
        &mut self,
        now: Millis,
        seen: Seen,
        mark: u64,
        effects: &[Effect],
        metrics: Option<&Metrics>,
    ) {
        let mut acquire = None;
        let mut ended = None;
        match seen {
            Seen::Open(session, info) => {
                self.clients.insert(session, info);
            }
            Seen::End(session) => ended = Some(session),
            Seen::Acquire(key, a) => acquire = Some((key, a)),
            Seen::Cancel(key) => {
                self.pending.remove(&key);
            }
            Seen::Release {
                session,
                name,
                owner,
            } => self.released(now, (session, name, owner)),
            Seen::Count { key, count } => {
                if count > 1 {
                    self.reentered.insert(key, count - 1);
                } else {
                    self.reentered.remove(&key);
                }
            }
            Seen::Other => {}
        }
        for effect in effects {
            match effect {
                Effect::Granted {
                    session,
                    request,
                    tokens,
                } => {
                    let key = (*session, *request);
                    let (a, waited) = match acquire.take_if(|(k, _)| *k == key) {
                        Some((_, a)) => (a, 0),
                        None => match self.pending.remove(&key) {
                            Some(a) => {
                                let waited = now.saturating_sub(a.since);
                                if let Some(metrics) = metrics {
                                    metrics.waited(Duration::from_millis(waited));
                                }
                                (a, waited)
                            }
                            None => continue,
                        },
                    };
                    self.granted(now, *session, &a, tokens, mark, waited);
                }
                Effect::Queued {
                    session, request, ..
                } => {
                    if let Some((key, a)) = acquire.take_if(|(k, _)| *k == (*session, *request)) {
                        self.pending.insert(key, a);
                    }
                }
                Effect::TimedOut { session, request } | Effect::WouldBlock { session, request } => {
                    self.pending.remove(&(*session, *request));
                }
                Effect::Lost {
                    session,
                    owner,
                    name,
                    token,
                    reason,
                } => {
                    self.holds = self.holds.saturating_sub(1);
                    if !self.reentered.is_empty() {
                        self.reentered
                            .remove(&(*session, name.clone(), owner.clone()));
                    }
                    self.end(now, name, |r| r.token == *token, End::Lost(*reason));
                }
            }
        }
        if let Some(session) = ended {
            let waiting: Vec<WaiterKey> = self
                .pending
                .range((session, RequestId(0))..=(session, RequestId(u64::MAX)))
                .map(|(key, _)| *key)
                .collect();
            for key in waiting {
                self.pending.remove(&key);
            }
            self.clients.remove(&session);
        }
    }

    /// Holds, waiters and sessions now.
    pub(crate) fn census(&self) -> Census {
        Census {
            holds: self.holds,
            waiters: self.pending.len() as u64,
            sessions: self.clients.len() as u64,
        }
    }

    /// The kept grants of every lock under `prefix`, by name, oldest first
    /// within a lock, leaving out those older than the age bound at `now`.
    /// Read-only: only applying commands changes the history (grants past
    /// the age bound are forgotten as later ones are granted), so that it is
    /// the same on every member that applied the same log.
    pub(crate) fn query(&self, now: Millis, prefix: &str) -> Vec<pb::GrantRecord> {
        let max_age = self.limits.max_age;
        let mut names: Vec<&Arc<str>> = self
            .locks
            .keys()
            .filter(|name| name.starts_with(prefix))
            .collect();
        names.sort_unstable();
        names
            .into_iter()
            .flat_map(|name| {
                self.locks[name]
                    .iter()
                    .filter(move |r| now.saturating_sub(r.granted_at) <= max_age)
                    .map(move |r| record_to_proto(name, r))
            })
            .collect()
    }

    fn granted(
        &mut self,
        now: Millis,
        session: SessionId,
        a: &Acquire,
        tokens: &[u64],
        mark: u64,
        waited: Millis,
    ) {
        for (name, &token) in a.names.iter().zip(tokens) {
            if token <= mark {
                let key = (session, name.to_string(), a.owner.to_string());
                *self.reentered.entry(key).or_default() += 1;
                continue;
            }
            self.holds += 1;
            let record = Record {
                token,
                session,
                owner: a.owner.clone(),
                client: self.clients.get(&session).cloned(),
                mode: a.mode,
                granted_at: now,
                waited,
                end: None,
            };
            self.push(name, record);
        }
        self.expire(now);
    }

    /// A release applied: it undoes one re-entry, or ends the hold.
    fn released(&mut self, now: Millis, key: (SessionId, String, String)) {
        if let Some(extra) = self.reentered.get_mut(&key) {
            *extra -= 1;
            if *extra == 0 {
                self.reentered.remove(&key);
            }
            return;
        }
        self.holds = self.holds.saturating_sub(1);
        let (session, name, owner) = key;
        self.end(
            now,
            &name,
            |r| r.session == session && *r.owner == *owner,
            End::Released,
        );
    }

    /// Marks the newest open record of `name` that `matches` as ended.
    fn end(&mut self, now: Millis, name: &str, matches: impl Fn(&Record) -> bool, how: End) {
        let Some(ring) = self.locks.get_mut(name) else {
            return;
        };
        if let Some(record) = ring
            .iter_mut()
            .rev()
            .find(|r| r.end.is_none() && matches(r))
        {
            record.end = Some((now, how));
        }
    }

    fn push(&mut self, name: &Arc<str>, record: Record) {
        let HistoryLimits {
            per_lock, total, ..
        } = self.limits;
        if per_lock == 0 || total == 0 {
            return;
        }
        self.order
            .push_back((record.granted_at, name.clone(), record.token));
        let ring = self.locks.entry(name.clone()).or_default();
        ring.push_back(record);
        if ring.len() > per_lock {
            ring.pop_front();
        }
        while self.order.len() > total {
            self.forget_oldest();
        }
    }

    /// Forgets grants older than the age bound.
    fn expire(&mut self, now: Millis) {
        while self
            .order
            .front()
            .is_some_and(|(at, ..)| now.saturating_sub(*at) > self.limits.max_age)
        {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        let Some((_, name, token)) = self.order.pop_front() else {
            return;
        };
        if let Some(ring) = self.locks.get_mut(&name) {
            if ring.front().is_some_and(|r| r.token == token) {
                ring.pop_front();
            }
            if ring.is_empty() {
                self.locks.remove(&name);
            }
        }
    }
}

fn record_to_proto(name: &str, r: &Record) -> pb::GrantRecord {
    let (mode, permits) = convert::mode_to_proto(r.mode);
    let (client_name, host) = r
        .client
        .as_deref()
        .map(|c| (c.name.clone(), c.host.clone()))
        .unwrap_or_default();
    let (end, ended_at_ms, lost_reason) = match r.end {
        None => (pb::HoldEnd::Held, None, 0),
        Some((at, End::Released)) => (pb::HoldEnd::Released, Some(at), 0),
        Some((at, End::Lost(reason))) => (
            pb::HoldEnd::Lost,
            Some(at),
            convert::lost_reason_to_proto(reason),
        ),
    };
    pb::GrantRecord {
        name: name.to_owned(),
        fencing_token: r.token,
        session_id: r.session.0,
        owner: r.owner.to_string(),
        client_name,
        host,
        mode,
        permits,
        granted_at_ms: r.granted_at,
        waited_ms: r.waited,
        end: end as i32,
        ended_at_ms,
        lost_reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locksmith_core::{Engine, Limits, Wait};

    /// Drives an engine and a history the way the core does.
    struct Table {
        engine: Engine,
        history: History,
        now: Millis,
    }

    impl Table {
        fn new(per_lock: usize, total: usize) -> Table {
            Table {
                engine: Engine::new(Limits::default()),
                history: History::new(HistoryLimits {
                    per_lock,
                    total,
                    max_age: 60_000,
                }),
                now: 1,
            }
        }

        fn apply(&mut self, command: Command) {
            let seen = self.history.before(self.now, &command);
            let mark = self.engine.last_token();
            let mut effects = Vec::new();
            self.engine
                .apply(self.now, command, &mut effects)
                .expect("applies");
            self.history.after(self.now, seen, mark, &effects, None);
        }

        fn open(&mut self, session: u64, name: &str) {
            self.apply(Command::OpenSession {
                session: SessionId(session),
                ttl: 10_000,
                info: ClientInfo {
                    name: name.into(),
                    host: "h".into(),
                },
            });
        }

        fn acquire(&mut self, session: u64, request: u64, names: &[&str], reentrant: bool) {
            self.apply(Command::Acquire(locksmith_core::Acquire {
                session: SessionId(session),
                request: RequestId(request),
                owner: format!("o{session}"),
                names: names.iter().map(|n| n.to_string()).collect(),
                mode: Mode::Exclusive,
                wait: Wait::Forever,
                lease: None,
                reentrant,
                lock_delay: 0,
            }));
        }

        fn release(&mut self, session: u64, name: &str) {
            self.apply(Command::Release {
                session: SessionId(session),
                owner: format!("o{session}"),
                name: name.into(),
                token: None,
            });
        }

        fn grants(&mut self, prefix: &str) -> Vec<(String, u64, String, i32)> {
            self.history
                .query(self.now, prefix)
                .into_iter()
                .map(|g| (g.name, g.fencing_token, g.client_name, g.end))
                .collect()
        }
    }

    const HELD: i32 = pb::HoldEnd::Held as i32;
    const RELEASED: i32 = pb::HoldEnd::Released as i32;
    const LOST: i32 = pb::HoldEnd::Lost as i32;

    #[test]
    fn records_grants_handoffs_and_ends() {
        let mut t = Table::new(8, 100);
        t.open(1, "alpha");
        t.open(2, "beta");
        t.acquire(1, 1, &["a"], false);
        t.now = 5;
        t.acquire(2, 1, &["a"], false);
        assert_eq!(t.history.census().waiters, 1);
        t.now = 9;
        t.release(1, "a");
        let grants = t.grants("");
        assert_eq!(
            grants,
            [
                ("a".into(), 1, "alpha".into(), RELEASED),
                ("a".into(), 2, "beta".into(), HELD)
            ]
        );
        let second = &t.history.query(t.now, "a")[1];
        assert_eq!((second.granted_at_ms, second.waited_ms), (9, 4));
        assert_eq!(
            t.history.census(),
            Census {
                holds: 1,
                waiters: 0,
                sessions: 2
            }
        );
        t.apply(Command::CloseSession {
            session: SessionId(2),
        });
        assert_eq!(t.grants("")[1].3, LOST);
        assert_eq!(
            t.history.census(),
            Census {
                holds: 0,
                waiters: 0,
                sessions: 1
            }
        );
    }

    #[test]
    fn a_reentry_is_no_new_grant_and_its_release_no_end() {
        let mut t = Table::new(8, 100);
        t.open(1, "alpha");
        t.acquire(1, 1, &["a"], true);
        t.acquire(1, 2, &["a"], true);
        assert_eq!(t.grants("").len(), 1);
        t.release(1, "a");
        assert_eq!(t.grants("")[0].3, HELD);
        assert_eq!(t.history.census().holds, 1);
        t.release(1, "a");
        assert_eq!(t.grants("")[0].3, RELEASED);
        assert_eq!(t.history.census().holds, 0);
    }

    #[test]
    fn a_count_set_by_the_client_is_levels_that_a_release_takes_off() {
        let mut t = Table::new(8, 100);
        t.open(1, "alpha");
        t.acquire(1, 1, &["a"], true);
        let count = |count| Command::SetHoldCount {
            session: SessionId(1),
            owner: "o1".into(),
            name: "a".into(),
            token: 1,
            count,
        };
        t.apply(count(3));
        t.release(1, "a");
        assert_eq!(t.grants("")[0].3, HELD, "one level of three taken off");
        t.apply(count(1));
        t.release(1, "a");
        assert_eq!(t.grants("")[0].3, RELEASED);
        assert_eq!(t.history.census().holds, 0);
    }

    #[test]
    fn multi_locks_and_waiters_of_ended_sessions() {
        let mut t = Table::new(8, 100);
        t.open(1, "alpha");
        t.open(2, "beta");
        t.acquire(1, 1, &["x", "y"], false);
        t.acquire(2, 1, &["y", "x"], false);
        t.apply(Command::CloseSession {
            session: SessionId(2),
        });
        assert_eq!(t.history.census().waiters, 0);
        let grants = t.grants("");
        assert_eq!(grants.len(), 2);
        assert_eq!((grants[0].0.as_str(), grants[0].1), ("x", 1));
        assert_eq!((grants[1].0.as_str(), grants[1].1), ("y", 2));
    }

    #[test]
    fn bounded_per_lock_in_all_and_by_age() {
        let mut t = Table::new(2, 3);
        t.open(1, "alpha");
        for _ in 0..3 {
            t.acquire(1, 1, &["a"], false);
            t.release(1, "a");
        }
        assert_eq!(t.grants("").iter().map(|g| g.1).collect::<Vec<_>>(), [2, 3]);
        t.acquire(1, 1, &["b"], false);
        t.acquire(1, 2, &["c"], false);
        // Three in all: the oldest grants anywhere went first.
        assert_eq!(
            t.grants("").iter().map(|g| g.1).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        t.now += 60_001;
        assert!(t.grants("").is_empty(), "too old to be shown");
        // Forgotten when the next grant is applied: a query changes nothing,
        // so the history is the same on every member.
        t.acquire(1, 3, &["d"], false);
        assert_eq!(t.grants("").iter().map(|g| g.1).collect::<Vec<_>>(), [6]);
        assert_eq!((t.history.locks.len(), t.history.order.len()), (1, 1));
    }

    #[test]
    fn a_restore_builds_only_the_newest_holds_the_bounds_keep() {
        let mut t = Table::new(2, 3);
        t.open(1, "alpha");
        // Names in the opposite order of their tokens (a snapshot lists
        // locks by name), and one hold re-entered.
        for (request, name) in ["e", "d", "c", "b", "a"].into_iter().enumerate() {
            t.acquire(1, request as u64 + 1, &[name], true);
        }
        t.acquire(1, 6, &["d"], true);
        // Listed by name: the three newest grants.
        let running = t.grants("");
        assert_eq!(running.iter().map(|g| g.1).collect::<Vec<_>>(), [5, 4, 3]);
        let restored = t.history.restored(&t.engine.snapshot());
        assert_eq!(restored.census(), t.history.census(), "every hold counted");
        t.history = restored;
        assert_eq!(t.grants(""), running);
        // The re-entered hold outside the kept history still counts its
        // level: one release leaves it held.
        t.release(1, "d");
        t.acquire(1, 7, &["f"], true);
        assert_eq!(
            t.grants("")
                .iter()
                .map(|g| (g.0.as_str(), g.1))
                .collect::<Vec<_>>(),
            [("a", 5), ("b", 4), ("f", 6)]
        );
        assert_eq!(t.history.census().holds, 6);
    }

    #[test]
    fn restores_from_a_snapshot() {
        let mut t = Table::new(8, 100);
        t.open(1, "alpha");
        t.open(2, "beta");
        t.acquire(1, 1, &["a"], true);
        t.acquire(1, 2, &["a"], true);
        t.acquire(2, 1, &["a"], false);
        let restored = t.history.restored(&t.engine.snapshot());
        assert_eq!(restored.census(), t.history.census());
        t.history = restored;
        t.release(1, "a");
        t.release(1, "a");
        let grants = t.grants("a");
        assert_eq!(grants.len(), 2);
        assert_eq!((grants[1].1, grants[1].2.as_str()), (2, "beta"));
    }
}
