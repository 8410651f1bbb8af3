//! Model-based property tests: random command sequences over a small universe
//! (4 sessions plus sessionless TTL holds, 3 lock names, exclusive / shared /
//! semaphore modes), driven the way a server drives the engine: every time
//! advance applies each command `due(now)` returns.
//!
//! A shadow of who holds what is kept from the effects alone (`Granted`, `Lost`
//! and successful `Release`s) and checked after every step against the engine's
//! own `describe()` / `list()` / `sessions()`, together with the invariants of the
//! lock model (DESIGN.md section 1, section 6).

use std::collections::{BTreeMap, BTreeSet};

use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, Engine, EngineError, Limits, LockInfo, LostReason,
    Millis, Mode, RequestId, SessionId, SessionInfo, Wait,
};
use proptest::prelude::*;

const SESSIONS: u64 = 4;
const NAMES: [&str; 4] = ["a", "b", "q/c", "bad//name"];

// ----- the random program -----

#[derive(Debug, Clone)]
enum WaitSel {
    No,
    /// Deadline `now + d`; `d == 0` is a deadline that has already passed.
    In(Millis),
    Forever,
}

#[derive(Debug, Clone)]
enum Op {
    Open {
        s: u64,
        ttl: Millis,
    },
    Heartbeat {
        s: u64,
    },
    Close {
        s: u64,
    },
    Acquire {
        /// 0 is `SessionId::NONE` (a TTL hold).
        s: u64,
        owner: u8,
        names: Vec<usize>,
        mode: Mode,
        wait: WaitSel,
        lease: Option<Millis>,
        reentrant: bool,
        lock_delay: Millis,
        /// Reuse the id of one of the session's pending requests (an error).
        reuse_request: bool,
    },
    Release {
        s: u64,
        owner: u8,
        name: usize,
        /// 0: no token, 1: the hold's token, 2: a wrong token.
        token: u8,
    },
    Renew {
        s: u64,
        owner: u8,
        name: usize,
        lease: Millis,
    },
    /// A client that counts re-entry itself records its depth.
    SetCount {
        s: u64,
        owner: u8,
        name: usize,
        /// 0 is refused.
        count: u32,
        /// Its hold's token, or a wrong one.
        right_token: bool,
    },
    Cancel {
        s: u64,
        pick: usize,
    },
    Force {
        name: usize,
    },
    Advance {
        dt: Millis,
        /// Wake up at every deadline on the way (a punctual driver) instead of
        /// once at the end (a driver that woke up late and applies everything
        /// due at once).
        punctual: bool,
    },
}

fn name_index() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0..3usize, 1 => Just(3usize)]
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0..=SESSIONS;
    let live_session = 1..=SESSIONS;
    let mode = prop_oneof![
        4 => Just(Mode::Exclusive),
        4 => Just(Mode::Shared),
        3 => Just(Mode::Semaphore { permits: 2 }),
        1 => Just(Mode::Semaphore { permits: 3 }),
    ];
    let wait = prop_oneof![
        2 => Just(WaitSel::No),
        3 => prop::sample::select(vec![0, 30, 300, 3_000]).prop_map(WaitSel::In),
        4 => Just(WaitSel::Forever),
    ];
    let lease = prop_oneof![
        4 => Just(None),
        1 => Just(Some(5)), // below the minimum: an error
        3 => Just(Some(100)),
        3 => Just(Some(1_000)),
    ];
    let lock_delay = prop_oneof![
        5 => Just(0),
        4 => Just(200),
        2 => Just(2_000),
        1 => Just(60_001), // above the maximum: an error
    ];
    let names = prop_oneof![
        3 => name_index().prop_map(|n| vec![n]),
        2 => (name_index(), name_index()).prop_map(|(a, b)| vec![a, b]), // a == b: DuplicateName
        1 => Just(vec![]),
    ];
    let acquire = (
        session.clone(),
        0..2u8,
        names,
        mode,
        wait,
        lease,
        any::<bool>(),
        lock_delay,
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(s, owner, names, mode, wait, lease, reentrant, lock_delay, reuse_request)| {
                Op::Acquire {
                    s,
                    owner,
                    names,
                    mode,
                    wait,
                    lease,
                    reentrant: reentrant || s % 2 == 1, // mostly reentrant
                    lock_delay,
                    reuse_request,
                }
            },
        );
    prop_oneof![
        4 => (live_session.clone(), prop::sample::select(vec![5, 200, 1_000, 5_000]))
            .prop_map(|(s, ttl)| Op::Open { s, ttl }),
        8 => live_session.clone().prop_map(|s| Op::Heartbeat { s }),
        3 => live_session.clone().prop_map(|s| Op::Close { s }),
        35 => acquire,
        20 => (session.clone(), 0..2u8, name_index(), 0..3u8)
            .prop_map(|(s, owner, name, token)| Op::Release { s, owner, name, token }),
        5 => (session.clone(), 0..2u8, name_index(), prop::sample::select(vec![5, 100, 1_000]))
            .prop_map(|(s, owner, name, lease)| Op::Renew { s, owner, name, lease }),
        4 => (session.clone(), 0..2u8, name_index(), 0..4u32, prop::bool::weighted(0.9))
            .prop_map(|(s, owner, name, count, right_token)| {
                Op::SetCount { s, owner, name, count, right_token }
            }),
        7 => (session, any::<usize>()).prop_map(|(s, pick)| Op::Cancel { s, pick }),
        3 => name_index().prop_map(|name| Op::Force { name }),
        15 => (prop::sample::select(vec![1, 50, 150, 400, 1_200, 2_500]), any::<bool>())
            .prop_map(|(dt, punctual)| Op::Advance { dt, punctual }),
    ]
}

// ----- the shadow -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Queued and still waiting.
    Pending,
    Granted,
    TimedOut,
    Cancelled,
    /// Its session ended while it waited.
    Dropped,
    /// Answered at once without queuing (`WouldBlock`, or `TimedOut` of an
    /// already passed deadline).
    Refused,
}

#[derive(Debug, Clone)]
struct Request {
    names: Vec<String>,
    owner: String,
    mode: Mode,
    lock_delay: Millis,
    deadline: Option<Millis>,
    fate: Fate,
    /// Arrival order among queued requests.
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Hold {
    session: SessionId,
    owner: String,
    mode: Mode,
    token: u64,
    count: u32,
    lock_delay: Millis,
}

type Key = (SessionId, RequestId);

/// A grant seen in one step: which request, which lock, and whether it created
/// a new hold (as opposed to a re-entry).
struct GrantSeen {
    key: Key,
    mode: Mode,
    name: String,
    new_hold: bool,
}

fn conflicts(a: Mode, b: Mode) -> bool {
    !(a == Mode::Shared && b == Mode::Shared)
}

/// One applied command and its outcome, for the determinism property.
type LogEntry = (Millis, Command, Result<(), EngineError>, Vec<Effect>);

struct Driver {
    engine: Engine,
    now: Millis,
    next_request: u64,
    next_seq: u64,
    open: BTreeSet<SessionId>,
    /// Why each ended session ended: what the later steps of its end report
    /// its holds lost for.
    ended: BTreeMap<SessionId, LostReason>,
    requests: BTreeMap<Key, Request>,
    holds: BTreeMap<String, Vec<Hold>>,
    /// Earliest time a new hold may be granted, per lock (lock-delay).
    delay_until: BTreeMap<String, Millis>,
    max_token: u64,
    last_token: u64,
    log: Vec<LogEntry>,
    /// Check invariants after each step (off for the determinism property).
    check: bool,
}

impl Driver {
    fn new(check: bool) -> Self {
        Driver::with_limits(check, Limits::default())
    }

    fn with_limits(check: bool, limits: Limits) -> Self {
        let mut driver = Driver {
            engine: Engine::new(limits),
            now: 0,
            next_request: 1,
            next_seq: 0,
            open: BTreeSet::new(),
            ended: BTreeMap::new(),
            requests: BTreeMap::new(),
            holds: BTreeMap::new(),
            delay_until: BTreeMap::new(),
            max_token: 0,
            last_token: 0,
            log: Vec::new(),
            check,
        };
        for s in 1..SESSIONS {
            driver.step(Command::OpenSession {
                session: SessionId(s),
                ttl: 1_000,
                info: ClientInfo {
                    name: format!("client-{s}"),
                    host: "model".into(),
                },
            });
        }
        driver
    }

    fn owner(s: u64, owner: u8) -> String {
        if s == 0 {
            format!("ttl-{owner}")
        } else {
            format!("o{owner}")
        }
    }

    fn pending_of(&self, s: SessionId) -> Vec<RequestId> {
        self.requests
            .iter()
            .filter(|(k, r)| k.0 == s && r.fate == Fate::Pending)
            .map(|(k, _)| k.1)
            .collect()
    }

    fn hold_of(&self, name: &str, session: SessionId, owner: &str) -> Option<&Hold> {
        self.holds
            .get(name)?
            .iter()
            .find(|h| h.session == session && h.owner == owner)
    }

    /// Turns a random op into a command (or a time advance) and applies it.
    fn run(&mut self, op: &Op) {
        let command = match op.clone() {
            Op::Open { s, ttl } => Command::OpenSession {
                session: SessionId(s),
                ttl,
                info: ClientInfo {
                    name: format!("client-{s}"),
                    host: "model".into(),
                },
            },
            Op::Heartbeat { s } => Command::Heartbeat {
                session: SessionId(s),
            },
            Op::Close { s } => Command::CloseSession {
                session: SessionId(s),
            },
            Op::Acquire {
                s,
                owner,
                names,
                mode,
                wait,
                lease,
                reentrant,
                lock_delay,
                reuse_request,
            } => {
                let pending = self.pending_of(SessionId(s));
                let request = match pending.first() {
                    Some(&r) if reuse_request => r,
                    _ => {
                        self.next_request += 1;
                        RequestId(self.next_request)
                    }
                };
                Command::Acquire(Acquire {
                    session: SessionId(s),
                    request,
                    owner: Self::owner(s, owner),
                    names: names.iter().map(|&n| NAMES[n].to_owned()).collect(),
                    mode,
                    wait: match wait {
                        WaitSel::No => Wait::No,
                        WaitSel::In(d) => Wait::Until(self.now + d),
                        WaitSel::Forever => Wait::Forever,
                    },
                    // Sessionless holds mostly come with a lease.
                    lease: if s == 0 { lease.or(Some(300)) } else { lease },
                    reentrant,
                    lock_delay,
                })
            }
            Op::Release {
                s,
                owner,
                name,
                token,
            } => {
                let owner = Self::owner(s, owner);
                let name = NAMES[name].to_owned();
                let right = self.hold_of(&name, SessionId(s), &owner).map(|h| h.token);
                let token = match token {
                    0 => None,
                    1 => right.or(Some(1)),
                    _ => Some(right.unwrap_or(0) + 1_000_000),
                };
                Command::Release {
                    session: SessionId(s),
                    owner,
                    name,
                    token,
                }
            }
            Op::Renew {
                s,
                owner,
                name,
                lease,
            } => Command::Renew {
                session: SessionId(s),
                owner: Self::owner(s, owner),
                name: NAMES[name].to_owned(),
                token: None,
                lease,
            },
            Op::SetCount {
                s,
                owner,
                name,
                count,
                right_token,
            } => {
                let owner = Self::owner(s, owner);
                let name = NAMES[name].to_owned();
                let right = self.hold_of(&name, SessionId(s), &owner).map(|h| h.token);
                let token = match right {
                    Some(token) if right_token => token,
                    _ => right.unwrap_or(0) + 1_000_000,
                };
                Command::SetHoldCount {
                    session: SessionId(s),
                    owner,
                    name,
                    token,
                    count,
                }
            }
            Op::Cancel { s, pick } => {
                let pending = self.pending_of(SessionId(s));
                let request = if pending.is_empty() || pick % 5 == 0 {
                    RequestId(pick as u64 % 1_000 + 1_000_000) // unknown
                } else {
                    pending[pick % pending.len()]
                };
                Command::Cancel {
                    session: SessionId(s),
                    request,
                }
            }
            Op::Force { name } => Command::ForceRelease {
                name: NAMES[name].to_owned(),
            },
            Op::Advance { dt, punctual } => {
                self.advance(self.now + dt, punctual);
                return;
            }
        };
        self.step(command);
    }

    /// Moves time to `to` and applies every command `due(now)` returns, as a
    /// driver does: a punctual one wakes up at each deadline on the way, a late
    /// one only at `to`, and then applies everything due at once.
    fn advance(&mut self, to: Millis, punctual: bool) {
        let mut rounds = 0;
        loop {
            let wake = match self.engine.next_deadline() {
                Some(at) if at <= to => {
                    if punctual {
                        at
                    } else {
                        to
                    }
                }
                _ => break,
            };
            self.now = self.now.max(wake);
            for command in self.engine.due(self.now) {
                if !self.step(command.clone()) {
                    // Only staleness within one batch: a hold the session's
                    // expiry before it dropped, a delay an abnormal loss
                    // before it extended.
                    let stale =
                        matches!(self.log.last(), Some((_, _, Err(EngineError::NotDue), _)))
                            && matches!(
                                command,
                                Command::ExpireHold { .. } | Command::EndLockDelay { .. }
                            );
                    assert!(stale, "a due command failed: {:?}", self.log.last());
                }
            }
            rounds += 1;
            assert!(rounds < 10_000, "time-driven commands never settle");
        }
        self.now = self.now.max(to);
        if self.check {
            for s in self.engine.sessions() {
                assert!(
                    s.expires_at > self.now,
                    "{:?} should have expired",
                    s.session
                );
            }
        }
    }

    /// Applies one command, updates the shadow from its effects and checks
    /// every invariant. Returns whether the command succeeded.
    fn step(&mut self, command: Command) -> bool {
        let now = self.now;
        let before_list = self.engine.list("");
        let before_sessions = self.engine.sessions();
        let mut effects = Vec::new();
        let result = self.engine.apply(now, command.clone(), &mut effects);
        self.log
            .push((now, command.clone(), result.clone(), effects.clone()));
        if !self.check {
            return result.is_ok();
        }
        let after_list = self.engine.list("");

        if let Err(error) = &result {
            assert_eq!(effects, [], "{command:?} failed ({error}) with effects");
            assert_eq!(
                after_list, before_list,
                "{command:?} failed ({error}) but changed locks"
            );
            assert_eq!(
                self.engine.sessions(),
                before_sessions,
                "{command:?} failed ({error}) but changed sessions"
            );
            assert_eq!(self.engine.last_token(), self.last_token);
            return false;
        }

        // What the command itself did, before the grants it caused.
        let fresh: Option<(Key, &Acquire)> = match &command {
            Command::Acquire(a) => Some(((a.session, a.request), a)),
            _ => None,
        };
        let mut ended_session = None;
        match &command {
            Command::OpenSession { session, .. } => {
                assert!(self.open.insert(*session));
                self.ended.remove(session);
            }
            Command::ContinueSessionEnd { session, .. } => {
                assert!(self.ended.contains_key(session), "{session:?} never ended");
                ended_session = Some(*session);
            }
            Command::CloseSession { session } | Command::ExpireSession { session, .. } => {
                assert!(self.open.remove(session));
                let reason = match command {
                    Command::CloseSession { .. } => LostReason::SessionClosed,
                    _ => LostReason::SessionExpired,
                };
                self.ended.insert(*session, reason);
                for r in self.requests.iter_mut() {
                    if r.0 .0 == *session && r.1.fate == Fate::Pending {
                        r.1.fate = Fate::Dropped;
                    }
                }
                ended_session = Some(*session);
            }
            Command::Cancel { session, request } => {
                let r = self
                    .requests
                    .get_mut(&(*session, *request))
                    .expect("cancelled an unknown request");
                assert_eq!(r.fate, Fate::Pending, "cancelled {request:?}");
                r.fate = Fate::Cancelled;
            }
            Command::Release {
                session,
                owner,
                name,
                token,
            } => {
                let holds = self.holds.get_mut(name).expect("released a free lock");
                let i = holds
                    .iter()
                    .position(|h| h.session == *session && h.owner == *owner)
                    .expect("released by a non-owner");
                assert!(token.is_none_or(|t| t == holds[i].token));
                holds[i].count -= 1;
                if holds[i].count == 0 {
                    holds.remove(i);
                }
            }
            Command::Renew {
                session,
                owner,
                name,
                ..
            } => {
                assert!(
                    self.hold_of(name, *session, owner).is_some(),
                    "renewed a non-hold"
                );
            }
            Command::SetHoldCount {
                session,
                owner,
                name,
                token,
                count,
            } => {
                let hold = self
                    .holds
                    .get_mut(name)
                    .and_then(|holds| {
                        holds
                            .iter_mut()
                            .find(|h| h.session == *session && h.owner == *owner)
                    })
                    .expect("counted a non-hold");
                assert_eq!(hold.token, *token, "counted another hold");
                assert!(*count > 0, "counted to zero");
                hold.count = *count;
            }
            _ => {}
        }

        // The effects, in order.
        let mut grants = Vec::new();
        let mut lost_tokens = Vec::new();
        for effect in &effects {
            match effect {
                Effect::Granted {
                    session,
                    request,
                    tokens,
                } => {
                    let key = (*session, *request);
                    let req = match fresh {
                        Some((k, a)) if k == key => {
                            let r = self.new_request(a, Fate::Granted);
                            self.requests.insert(key, r.clone());
                            r
                        }
                        _ => {
                            let r = self
                                .requests
                                .get_mut(&key)
                                .expect("granted an unknown request");
                            assert_eq!(r.fate, Fate::Pending, "granted {key:?} twice");
                            r.fate = Fate::Granted;
                            r.clone()
                        }
                    };
                    assert_eq!(tokens.len(), req.names.len());
                    for (name, &token) in req.names.iter().zip(tokens) {
                        let holds = self.holds.entry(name.clone()).or_default();
                        if let Some(h) = holds
                            .iter_mut()
                            .find(|h| h.session == *session && h.owner == req.owner)
                        {
                            // A re-entry: same token, same mode.
                            assert_eq!(h.token, token, "re-entry of {name} changed the token");
                            assert_eq!(
                                h.mode, req.mode,
                                "{key:?} re-entered a {:?} hold of {name} as {:?}",
                                h.mode, req.mode
                            );
                            h.count += 1;
                            grants.push(GrantSeen {
                                key,
                                mode: req.mode,
                                name: name.clone(),
                                new_hold: false,
                            });
                            continue;
                        }
                        assert!(
                            token > self.max_token,
                            "token {token} of {name} after {}",
                            self.max_token
                        );
                        self.max_token = token;
                        let delay = self.delay_until.get(name).copied().unwrap_or(0);
                        assert!(
                            now >= delay,
                            "{name} granted at {now} during a lock-delay until {delay}"
                        );
                        holds.push(Hold {
                            session: *session,
                            owner: req.owner.clone(),
                            mode: req.mode,
                            token,
                            count: 1,
                            lock_delay: req.lock_delay,
                        });
                        grants.push(GrantSeen {
                            key,
                            mode: req.mode,
                            name: name.clone(),
                            new_hold: true,
                        });
                    }
                }
                Effect::Queued {
                    session,
                    request,
                    position,
                } => {
                    let (key, a) = fresh.expect("Queued from a non-acquire");
                    assert_eq!(key, (*session, *request));
                    assert_ne!(a.wait, Wait::No);
                    let ahead = before_list
                        .iter()
                        .find(|l| l.name == a.names[0])
                        .map_or(0, |l| l.waiters.len());
                    assert_eq!(*position as usize, ahead);
                    let mut r = self.new_request(a, Fate::Pending);
                    r.seq = self.next_seq;
                    self.next_seq += 1;
                    self.requests.insert(key, r);
                }
                Effect::WouldBlock { session, request } => {
                    let (key, a) = fresh.expect("WouldBlock from a non-acquire");
                    assert_eq!(key, (*session, *request));
                    assert_eq!(a.wait, Wait::No);
                    let r = self.new_request(a, Fate::Refused);
                    self.requests.insert(key, r);
                }
                Effect::TimedOut { session, request } => {
                    let key = (*session, *request);
                    match (&command, fresh) {
                        (_, Some((k, a))) if k == key => {
                            assert!(matches!(a.wait, Wait::Until(d) if d <= now));
                            let r = self.new_request(a, Fate::Refused);
                            self.requests.insert(key, r);
                        }
                        (
                            Command::TimeoutWaiter {
                                session: s,
                                request: r,
                            },
                            _,
                        ) if (*s, *r) == key => {
                            let r = self
                                .requests
                                .get_mut(&key)
                                .expect("timed out an unknown request");
                            assert_eq!(r.fate, Fate::Pending);
                            assert!(r.deadline.is_some_and(|d| d <= now), "timed out early");
                            r.fate = Fate::TimedOut;
                        }
                        _ => panic!("unexpected {effect:?} from {command:?}"),
                    }
                }
                Effect::Lost {
                    session,
                    owner,
                    name,
                    token,
                    reason,
                } => {
                    let expected = match &command {
                        Command::ExpireSession { .. } => LostReason::SessionExpired,
                        Command::CloseSession { .. } => LostReason::SessionClosed,
                        Command::ExpireHold { .. } => LostReason::LeaseExpired,
                        Command::ForceRelease { .. } => LostReason::ForceReleased,
                        Command::ContinueSessionEnd { session, .. } => self.ended[session],
                        _ => panic!("{effect:?} from {command:?}"),
                    };
                    assert_eq!(*reason, expected);
                    if let Some(ended) = ended_session {
                        assert_eq!(*session, ended);
                    }
                    let holds = self.holds.get_mut(name).expect("lost a free lock");
                    let i = holds
                        .iter()
                        .position(|h| h.token == *token)
                        .unwrap_or_else(|| panic!("lost unknown token {token} of {name}"));
                    let hold = holds.remove(i);
                    assert_eq!((&hold.session, &hold.owner), (session, owner));
                    let abnormal = matches!(
                        reason,
                        LostReason::SessionExpired | LostReason::LeaseExpired
                    );
                    if abnormal && hold.lock_delay > 0 {
                        let until = self.delay_until.entry(name.clone()).or_default();
                        *until = (*until).max(now + hold.lock_delay);
                    }
                    lost_tokens.push(*token);
                }
            }
        }
        if let Some((key, a)) = fresh {
            assert!(
                self.requests.contains_key(&key),
                "acquire {a:?} had no outcome"
            );
        }
        if ended_session.is_some() {
            assert!(
                lost_tokens.is_sorted(),
                "Lost not in token order: {lost_tokens:?}"
            );
        }
        self.holds.retain(|_, h| !h.is_empty());

        self.check_fifo(&grants, &before_list, &after_list);
        self.check_state(&after_list);
        if let Some(session) = ended_session {
            // What a step of its end leaves, the next step gives up.
            let continues = self.engine.due(now).iter().any(
                |c| matches!(c, Command::ContinueSessionEnd { session: s, .. } if *s == session),
            );
            for lock in &after_list {
                assert!(
                    continues || lock.holders.iter().all(|h| h.session != session),
                    "{session:?} ended but still holds {}",
                    lock.name
                );
                assert!(lock.waiters.iter().all(|w| w.session != session));
            }
        }
        true
    }

    fn new_request(&self, a: &Acquire, fate: Fate) -> Request {
        Request {
            names: a.names.clone(),
            owner: a.owner.clone(),
            mode: a.mode,
            lock_delay: a.lock_delay,
            deadline: match a.wait {
                Wait::Until(d) => Some(d),
                _ => None,
            },
            fate,
            seq: u64::MAX,
        }
    }

    /// No waiter is granted a new hold while an earlier waiter of the same lock
    /// that it conflicts with still waits (a fresh acquire counts as arriving
    /// after every waiter).
    fn check_fifo(&self, grants: &[GrantSeen], before: &[LockInfo], after: &[LockInfo]) {
        let queue = |list: &[LockInfo], name: &str| -> Vec<(Key, Mode)> {
            list.iter()
                .find(|l| l.name == name)
                .map(|l| {
                    l.waiters
                        .iter()
                        .map(|w| ((w.session, w.request), w.mode))
                        .collect()
                })
                .unwrap_or_default()
        };
        for g in grants.iter().filter(|g| g.new_hold) {
            let before = queue(before, &g.name);
            let after = queue(after, &g.name);
            let ahead = match before.iter().position(|(k, _)| *k == g.key) {
                Some(i) => &before[..i],
                None => &before[..],
            };
            for (earlier, mode) in ahead {
                assert!(
                    !(conflicts(*mode, g.mode) && after.iter().any(|(k, _)| k == earlier)),
                    "{:?} ({:?}) was granted {} while {earlier:?} ({mode:?}) waits ahead of it",
                    g.key,
                    g.mode,
                    g.name
                );
            }
        }
    }

    /// The shadow and the engine agree, and the lock model's invariants hold.
    fn check_state(&mut self, list: &[LockInfo]) {
        let ending_steps_due = self
            .engine
            .due(self.now)
            .iter()
            .any(|c| matches!(c, Command::ContinueSessionEnd { .. }));
        // Tokens.
        let last = self.engine.last_token();
        assert!(last >= self.last_token, "last_token went back");
        assert_eq!(
            last, self.max_token,
            "a token was handed out without a grant"
        );
        self.last_token = last;

        // Holders: the engine's and the shadow's, lock by lock.
        let listed: BTreeSet<&str> = list.iter().map(|l| l.name.as_str()).collect();
        for name in self.holds.keys() {
            assert!(
                listed.contains(name.as_str()),
                "{name} is held but not listed"
            );
        }
        for lock in list {
            assert_eq!(self.engine.describe(&lock.name).as_ref(), Some(lock));
            let engine: Vec<_> = lock
                .holders
                .iter()
                .map(|h| {
                    (
                        h.session,
                        h.owner.clone(),
                        h.mode,
                        h.fencing_token,
                        h.hold_count,
                    )
                })
                .collect();
            let shadow: Vec<_> = self
                .holds
                .get(&lock.name)
                .into_iter()
                .flatten()
                .map(|h| (h.session, h.owner.clone(), h.mode, h.token, h.count))
                .collect();
            assert_eq!(engine, shadow, "holders of {}", lock.name);

            // Modes never mix; exclusivity and permits.
            let modes: Vec<Mode> = lock.holders.iter().map(|h| h.mode).collect();
            if let Some(&first) = modes.first() {
                assert!(
                    modes.iter().all(|&m| m == first),
                    "{} mixes modes: {modes:?}",
                    lock.name
                );
                match first {
                    Mode::Exclusive => {
                        assert_eq!(modes.len(), 1, "two exclusive holders of {}", lock.name)
                    }
                    Mode::Shared => {}
                    Mode::Semaphore { permits } => {
                        assert!(
                            modes.len() <= permits as usize,
                            "{} over its permits",
                            lock.name
                        )
                    }
                }
            }
            // Tokens are unique; holders oldest first.
            let tokens: Vec<u64> = lock.holders.iter().map(|h| h.fencing_token).collect();
            assert!(tokens.is_sorted() && tokens.windows(2).all(|w| w[0] < w[1]));

            // Waiters: exactly the pending requests naming this lock, in arrival order.
            let mut pending: Vec<(u64, Key)> = self
                .requests
                .iter()
                .filter(|(_, r)| r.fate == Fate::Pending && r.names.contains(&lock.name))
                .map(|(k, r)| (r.seq, *k))
                .collect();
            pending.sort();
            let waiters: Vec<Key> = lock
                .waiters
                .iter()
                .map(|w| (w.session, w.request))
                .collect();
            let pending: Vec<Key> = pending.into_iter().map(|(_, k)| k).collect();
            assert_eq!(waiters, pending, "waiters of {}", lock.name);

            // The lock-delay is the latest one any abnormal loss started; it
            // ends (through EndLockDelay) only once it is over.
            let delay = self.delay_until.get(&lock.name).copied();
            if let Some(until) = lock.lock_delay_until {
                assert_eq!(Some(until), delay, "lock-delay of {}", lock.name);
            }
            if let Some(until) = delay.filter(|&until| until > self.now) {
                assert_eq!(
                    lock.lock_delay_until,
                    Some(until),
                    "lock-delay of {} ended early",
                    lock.name
                );
            }

            // An entry exists only while something holds, waits or delays
            // (or an ended session's waiter, not listed, waits for the next
            // step of its session's end to drop it).
            assert!(
                !lock.holders.is_empty()
                    || !lock.waiters.is_empty()
                    || lock.lock_delay_until.is_some()
                    || ending_steps_due,
                "idle lock {} kept",
                lock.name
            );
        }
        for (key, r) in &self.requests {
            if r.fate == Fate::Pending {
                for name in &r.names {
                    assert!(
                        listed.contains(name.as_str()),
                        "{key:?} waits on unlisted {name}"
                    );
                }
            }
        }

        // Sessions.
        let sessions: Vec<SessionInfo> = self.engine.sessions();
        let ids: BTreeSet<SessionId> = sessions.iter().map(|s| s.session).collect();
        assert_eq!(ids, self.open);
        for s in &sessions {
            let holds = self
                .holds
                .values()
                .filter(|hs| hs.iter().any(|h| h.session == s.session))
                .count();
            assert_eq!(s.holds, holds, "holds of {:?}", s.session);
        }
    }

    /// Runs time forward until nothing is left to happen, cancels whatever still
    /// waits, and checks that every queued request got exactly one outcome.
    fn finish(&mut self) {
        let mut rounds = 0;
        while let Some(at) = self.engine.next_deadline() {
            self.advance(at, true);
            rounds += 1;
            assert!(rounds < 10_000, "time-driven commands never settle");
        }
        let leftover: Vec<Key> = self
            .requests
            .iter()
            .filter(|(_, r)| r.fate == Fate::Pending)
            .map(|(k, _)| *k)
            .collect();
        for (session, request) in leftover {
            assert!(self.step(Command::Cancel { session, request }));
        }
        for (key, r) in &self.requests {
            assert_ne!(r.fate, Fate::Pending, "{key:?} never ended");
        }
        // Every session expired, every lease ran out, every delay ended.
        assert_eq!(self.engine.list(""), []);
        assert_eq!(self.engine.sessions(), []);
        assert_eq!(self.engine.next_deadline(), None);
        assert!(self.holds.is_empty());
    }
}

/// Programs aimed at timing: sessions and leases that run out while others hold
/// the same lock (shared and semaphore), lock-delays, waiters, and drivers that
/// wake up on time or late, so that expiries, ends of lock-delay and timeouts
/// fall in one batch of `due()` often.
fn timing_op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![
        2 => Just(Mode::Exclusive),
        4 => Just(Mode::Shared),
        2 => Just(Mode::Semaphore { permits: 2 }),
    ];
    let wait = prop_oneof![
        1 => Just(WaitSel::No),
        1 => prop::sample::select(vec![100, 300]).prop_map(WaitSel::In),
        3 => Just(WaitSel::Forever),
    ];
    let lease = prop::sample::select(vec![None, Some(100), Some(200), Some(300)]);
    let lock_delay = prop::sample::select(vec![0, 100, 200, 200, 500]);
    let acquire = (
        0..=SESSIONS,
        0..2u8,
        prop_oneof![3 => (0..2usize).prop_map(|n| vec![n]), 1 => Just(vec![0, 1]), 1 => Just(vec![1, 0])],
        mode,
        wait,
        lease,
        lock_delay,
    )
        .prop_map(|(s, owner, names, mode, wait, lease, lock_delay)| Op::Acquire {
            s,
            owner,
            names,
            mode,
            wait,
            lease,
            reentrant: true,
            lock_delay,
            reuse_request: false,
        });
    prop_oneof![
        2 => (1..=SESSIONS, prop::sample::select(vec![200, 300, 1_000]))
            .prop_map(|(s, ttl)| Op::Open { s, ttl }),
        3 => (1..=SESSIONS).prop_map(|s| Op::Heartbeat { s }),
        10 => acquire,
        3 => (0..=SESSIONS, 0..2u8, 0..2usize)
            .prop_map(|(s, owner, name)| Op::Release { s, owner, name, token: 0 }),
        2 => (0..=SESSIONS, 0..2u8, 0..2usize, prop::sample::select(vec![100, 200]))
            .prop_map(|(s, owner, name, lease)| Op::Renew { s, owner, name, lease }),
        6 => (prop::sample::select(vec![50, 100, 200, 300, 700]), any::<bool>())
            .prop_map(|(dt, punctual)| Op::Advance { dt, punctual }),
    ]
}

/// `cases` random programs (`PROPTEST_CASES` overrides it, for long runs).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        max_shrink_iters: 4_000,
        // Integration tests have no lib.rs next to them to keep a regressions
        // file by; failures print their minimal input instead.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// The shadow and the engine agree and every invariant holds after every
    /// step of a random program; at the end every request has one outcome.
    #[test]
    fn invariants_hold_for_random_programs(ops in prop::collection::vec(op(), 1..120)) {
        let mut driver = Driver::new(true);
        for op in &ops {
            driver.run(op);
        }
        driver.finish();
    }
}

proptest! {
    #![proptest_config(config(384))]

    /// The same checks on programs where time-driven commands collide.
    #[test]
    fn invariants_hold_when_deadlines_collide(ops in prop::collection::vec(timing_op(), 1..80)) {
        let mut driver = Driver::new(true);
        for op in &ops {
            driver.run(op);
        }
        driver.finish();
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// The same commands at the same times give the same effects and state.
    #[test]
    fn engine_is_deterministic(ops in prop::collection::vec(op(), 1..120)) {
        let run = || {
            let mut driver = Driver::new(false);
            for op in &ops {
                driver.run(op);
            }
            let list = driver.engine.list("");
            let sessions = driver.engine.sessions();
            (driver.log, list, sessions, driver.engine.last_token())
        };
        let (log, list, sessions, last) = run();
        let (log2, list2, sessions2, last2) = run();

        // Listing in pages of any size gives the same locks, in order.
        let mut driver = Driver::new(false);
        for op in &ops {
            driver.run(op);
        }
        for limit in 1..4 {
            let mut paged = Vec::new();
            let mut after = String::new();
            loop {
                let page = driver.engine.list_page("", &after, limit);
                prop_assert!(page.locks.len() <= limit);
                paged.extend(page.locks);
                if !page.more {
                    break;
                }
                after = paged.last().expect("a page before more").name.clone();
            }
            prop_assert_eq!(&paged, &list);
        }

        // A frozen state is the state when it was frozen, whatever the
        // engine does afterwards (its locks are copied on write).
        let frozen = driver.engine.freeze();
        let then = driver.engine.snapshot();
        for op in &ops {
            driver.run(op);
        }
        prop_assert_eq!(frozen.into_snapshot(), then);
        prop_assert_eq!(&log, &log2);
        prop_assert_eq!(&list, &list2);
        prop_assert_eq!(sessions, sessions2);
        prop_assert_eq!(last, last2);

        // Replaying the recorded log (commands and times only) into a fresh
        // engine gives the same effects too: nothing depends on the driver.
        // So does a replay that lends each command, as a replicated log that
        // keeps its records does, and it ends in the same state.
        let mut replay = Engine::default();
        let mut lent = Engine::default();
        for (now, command, result, effects) in log {
            let mut got = Vec::new();
            prop_assert_eq!(&lent.apply_borrowed(now, &command, &mut got), &result);
            prop_assert_eq!(&got, &effects);
            got.clear();
            prop_assert_eq!(replay.apply(now, command, &mut got), result);
            prop_assert_eq!(got, effects);
        }
        prop_assert_eq!(replay.list(""), list);
        prop_assert_eq!(lent.snapshot(), replay.snapshot());
    }
}

/// Limits under which every session's end takes a step per hold or wait.
fn one_per_step() -> Limits {
    Limits {
        session_end_step: 1,
        ..Limits::default()
    }
}

proptest! {
    #![proptest_config(config(384))]

    /// The same checks when a session's end gives up one hold or wait per
    /// step: others' requests run between the steps, an ended session's
    /// waiters are never granted and hold no one up, and its holds are lost
    /// for the reason it ended.
    #[test]
    fn invariants_hold_when_sessions_end_in_steps(ops in prop::collection::vec(op(), 1..120)) {
        let mut driver = Driver::with_limits(true, one_per_step());
        for op in &ops {
            driver.run(op);
        }
        driver.finish();
    }

    /// An engine restored from a snapshot taken anywhere, in the middle of a
    /// session's end too, takes the same steps as the one it was taken from:
    /// a member that installs a snapshot agrees with the leader.
    #[test]
    fn a_restored_engine_continues_a_session_end_identically(
        ops in prop::collection::vec(timing_op(), 1..80),
        cut in 0.0..1.0f64,
    ) {
        let mut driver = Driver::with_limits(false, one_per_step());
        for op in &ops {
            driver.run(op);
        }
        driver.finish();
        let log = driver.log;
        let cut = (log.len() as f64 * cut) as usize;
        let mut original = Engine::new(one_per_step());
        for (now, command, _, _) in &log[..cut] {
            let _ = original.apply(*now, command.clone(), &mut Vec::new());
        }
        let snapshot = original.snapshot();
        let mut restored = Engine::restore(one_per_step(), snapshot.clone()).unwrap();
        prop_assert_eq!(restored.snapshot(), snapshot);
        for (now, command, result, effects) in &log[cut..] {
            prop_assert_eq!(restored.next_deadline(), original.next_deadline());
            let mut got = Vec::new();
            prop_assert_eq!(&restored.apply(*now, command.clone(), &mut got), result);
            prop_assert_eq!(&got, effects);
            let _ = original.apply(*now, command.clone(), &mut Vec::new());
        }
        prop_assert_eq!(restored.snapshot(), original.snapshot());
    }
}

/// A hand-written program through the same checks, so a broken checker cannot
/// hide behind random inputs that never reach the interesting cases.
#[test]
fn checker_sees_the_interesting_cases() {
    let mut d = Driver::new(true);
    let acquire = |s, owner, names: Vec<usize>, mode, wait, lease, lock_delay| Op::Acquire {
        s,
        owner,
        names,
        mode,
        wait,
        lease,
        reentrant: true,
        lock_delay,
        reuse_request: false,
    };
    let program = [
        acquire(
            1,
            0,
            vec![0],
            Mode::Exclusive,
            WaitSel::Forever,
            None,
            2_000,
        ),
        acquire(2, 0, vec![0, 1], Mode::Exclusive, WaitSel::Forever, None, 0),
        acquire(3, 0, vec![1], Mode::Shared, WaitSel::In(300), None, 0),
        acquire(
            0,
            0,
            vec![2],
            Mode::Semaphore { permits: 2 },
            WaitSel::No,
            Some(100),
            200,
        ),
        acquire(
            3,
            1,
            vec![2],
            Mode::Semaphore { permits: 2 },
            WaitSel::No,
            None,
            0,
        ),
        acquire(
            1,
            1,
            vec![2],
            Mode::Semaphore { permits: 2 },
            WaitSel::Forever,
            None,
            0,
        ),
        acquire(3, 1, vec![0], Mode::Exclusive, WaitSel::Forever, None, 0),
        Op::Advance {
            dt: 400,
            punctual: true,
        }, // lease of q/c expires, lock-delay, then a grant
        Op::Heartbeat { s: 2 },
        Op::Advance {
            dt: 800,
            punctual: false,
        }, // sessions 1 and 3 expire: lock-delay on a
        Op::Heartbeat { s: 2 },
        Op::Advance {
            dt: 900,
            punctual: true,
        },
        Op::Heartbeat { s: 2 },
        Op::Advance {
            dt: 900,
            punctual: true,
        },
        Op::Heartbeat { s: 2 },
        Op::Advance {
            dt: 300,
            punctual: true,
        }, // the delay ends: session 2 gets a and b
        Op::Release {
            s: 2,
            owner: 0,
            name: 0,
            token: 2,
        }, // wrong token
        Op::Release {
            s: 2,
            owner: 0,
            name: 0,
            token: 1,
        },
        Op::Release {
            s: 2,
            owner: 0,
            name: 1,
            token: 0,
        },
    ];
    for op in &program {
        d.run(op);
    }
    let fates: Vec<Fate> = d.requests.values().map(|r| r.fate).collect();
    assert!(fates.contains(&Fate::Granted));
    assert!(fates.contains(&Fate::Dropped));
    assert!(fates.contains(&Fate::TimedOut));
    assert_eq!(d.delay_until.get("a"), Some(&3_200));
    assert_eq!(d.delay_until.get("q/c"), Some(&300));
    assert!(d.holds.is_empty());
    d.finish();
}
