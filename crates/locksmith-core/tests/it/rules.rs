//! One test per rule of the lock model (DESIGN.md section 1), each asserting the
//! exact effects the engine produces.
//!
//! Every expected error goes through [`Harness::err`], which also checks that the
//! error appended no effect and left `list("")`, `sessions()`, `last_token()`,
//! `next_deadline()` and `due(..)` exactly as they were.

use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, Engine, EngineError, HolderInfo, Limits, LockInfo,
    LostReason, Millis, Mode, NameError, RequestId, SessionId, SessionInfo, Wait, WaiterInfo,
};

const TTL: Millis = 10_000;
const NONE: SessionId = SessionId::NONE;

fn sid(n: u64) -> SessionId {
    SessionId(n)
}

fn client(n: u64) -> ClientInfo {
    ClientInfo {
        name: format!("client-{n}"),
        host: format!("host-{n}"),
    }
}

/// An exclusive, reentrant, forever-waiting acquire of `names` without lease or
/// lock-delay. Tests adjust the fields they care about.
fn acq(session: u64, request: u64, owner: &str, names: &[&str]) -> Acquire {
    Acquire {
        session: SessionId(session),
        request: RequestId(request),
        owner: owner.to_owned(),
        names: names.iter().map(|n| n.to_string()).collect(),
        mode: Mode::Exclusive,
        wait: Wait::Forever,
        lease: None,
        reentrant: true,
        lock_delay: 0,
    }
}

fn with_mode(mut a: Acquire, mode: Mode) -> Acquire {
    a.mode = mode;
    a
}

fn with_wait(mut a: Acquire, wait: Wait) -> Acquire {
    a.wait = wait;
    a
}

fn granted(session: u64, request: u64, tokens: &[u64]) -> Effect {
    Effect::Granted {
        session: SessionId(session),
        request: RequestId(request),
        tokens: tokens.to_vec(),
    }
}

fn queued(session: u64, request: u64, position: u32) -> Effect {
    Effect::Queued {
        session: SessionId(session),
        request: RequestId(request),
        position,
    }
}

fn would_block(session: u64, request: u64) -> Effect {
    Effect::WouldBlock {
        session: SessionId(session),
        request: RequestId(request),
    }
}

fn timed_out(session: u64, request: u64) -> Effect {
    Effect::TimedOut {
        session: SessionId(session),
        request: RequestId(request),
    }
}

fn lost(session: u64, owner: &str, name: &str, token: u64, reason: LostReason) -> Effect {
    Effect::Lost {
        session: SessionId(session),
        owner: owner.to_owned(),
        name: name.to_owned(),
        token,
        reason,
    }
}

fn release(session: u64, owner: &str, name: &str) -> Command {
    Command::Release {
        session: SessionId(session),
        owner: owner.to_owned(),
        name: name.to_owned(),
        token: None,
    }
}

fn release_token(session: u64, owner: &str, name: &str, token: u64) -> Command {
    Command::Release {
        session: SessionId(session),
        owner: owner.to_owned(),
        name: name.to_owned(),
        token: Some(token),
    }
}

fn renew(session: u64, owner: &str, name: &str, lease: Millis) -> Command {
    Command::Renew {
        session: SessionId(session),
        owner: owner.to_owned(),
        name: name.to_owned(),
        token: None,
        lease,
    }
}

fn es(session: u64, deadline: Millis) -> Command {
    Command::ExpireSession {
        session: SessionId(session),
        deadline,
    }
}

fn cancel(session: u64, request: u64) -> Command {
    Command::Cancel {
        session: SessionId(session),
        request: RequestId(request),
    }
}

/// Everything observable about an engine, for "an error changed nothing".
#[derive(Debug, PartialEq)]
struct Snapshot {
    locks: Vec<LockInfo>,
    sessions: Vec<SessionInfo>,
    last_token: u64,
    next_deadline: Option<Millis>,
    due: Vec<Command>,
}

struct Harness {
    engine: Engine,
}

impl Harness {
    fn new() -> Self {
        Harness {
            engine: Engine::default(),
        }
    }

    fn with_limits(limits: Limits) -> Self {
        Harness {
            engine: Engine::new(limits),
        }
    }

    /// A harness with sessions `1..=n` opened at time 0 with [`TTL`].
    fn with_sessions(n: u64) -> Self {
        let mut h = Harness::new();
        for s in 1..=n {
            h.open(0, s, TTL);
        }
        h
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            locks: self.engine.list(""),
            sessions: self.engine.sessions(),
            last_token: self.engine.last_token(),
            next_deadline: self.engine.next_deadline(),
            due: self.engine.due(Millis::MAX),
        }
    }

    fn open(&mut self, now: Millis, session: u64, ttl: Millis) {
        let effects = self.ok(
            now,
            Command::OpenSession {
                session: SessionId(session),
                ttl,
                info: client(session),
            },
        );
        assert_eq!(effects, []);
    }

    /// Applies a command that must succeed; returns its effects.
    #[track_caller]
    fn ok(&mut self, now: Millis, command: impl Into<Cmd>) -> Vec<Effect> {
        let command = command.into().0;
        let mut effects = Vec::new();
        if let Err(e) = self.engine.apply(now, command.clone(), &mut effects) {
            panic!("{command:?} at {now} failed: {e}");
        }
        effects
    }

    /// Applies a command that must fail with `expected` and change nothing.
    #[track_caller]
    fn err(&mut self, now: Millis, command: impl Into<Cmd>, expected: EngineError) {
        let command = command.into().0;
        let before = self.snapshot();
        let sentinel = would_block(999, 999);
        let mut effects = vec![sentinel.clone()];
        let result = self.engine.apply(now, command.clone(), &mut effects);
        assert_eq!(result, Err(expected), "{command:?}");
        assert_eq!(
            effects,
            [sentinel],
            "an error appended effects: {command:?}"
        );
        assert_eq!(
            self.snapshot(),
            before,
            "an error changed state: {command:?}"
        );
    }

    fn describe(&self, name: &str) -> LockInfo {
        self.engine
            .describe(name)
            .unwrap_or_else(|| panic!("lock {name:?} is not in the table"))
    }

    fn holders(&self, name: &str) -> Vec<(SessionId, String, u64, u32)> {
        self.engine
            .describe(name)
            .map(|l| {
                l.holders
                    .into_iter()
                    .map(|h| (h.session, h.owner, h.fencing_token, h.hold_count))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn waiters(&self, name: &str) -> Vec<(SessionId, RequestId)> {
        self.engine
            .describe(name)
            .map(|l| {
                l.waiters
                    .into_iter()
                    .map(|w| (w.session, w.request))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn session(&self, session: u64) -> SessionInfo {
        self.engine
            .sessions()
            .into_iter()
            .find(|s| s.session == SessionId(session))
            .expect("session open")
    }
}

/// Lets [`Harness::ok`] and [`Harness::err`] take an [`Acquire`] or a [`Command`].
struct Cmd(Command);

impl From<Command> for Cmd {
    fn from(c: Command) -> Self {
        Cmd(c)
    }
}

impl From<Acquire> for Cmd {
    fn from(a: Acquire) -> Self {
        Cmd(Command::Acquire(a))
    }
}

// ----- exclusive, try, timeouts, cancel -----

#[test]
fn exclusive_excludes_a_second_holder() {
    let mut h = Harness::with_sessions(2);
    assert_eq!(h.ok(1, acq(1, 1, "a", &["x"])), [granted(1, 1, &[1])]);
    assert_eq!(h.ok(2, acq(2, 1, "b", &["x"])), [queued(2, 1, 0)]);
    // Same session, another owner: also excluded.
    assert_eq!(h.ok(3, acq(1, 2, "c", &["x"])), [queued(1, 2, 1)]);
    assert_eq!(h.holders("x"), [(sid(1), "a".into(), 1, 1)]);
    assert_eq!(
        h.waiters("x"),
        [(sid(2), RequestId(1)), (sid(1), RequestId(2))]
    );
}

#[test]
fn try_acquire_of_a_held_lock_would_block_and_does_not_queue() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["x"]));
    let before = h.snapshot();
    assert_eq!(
        h.ok(2, with_wait(acq(2, 1, "b", &["x"]), Wait::No)),
        [would_block(2, 1)]
    );
    assert_eq!(h.snapshot(), before);
    // A free lock is granted to a try-acquire.
    assert_eq!(
        h.ok(3, with_wait(acq(2, 2, "b", &["y"]), Wait::No)),
        [granted(2, 2, &[2])]
    );
}

#[test]
fn wait_until_deadline_times_out_through_due() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["x"]));
    assert_eq!(
        h.ok(2, with_wait(acq(2, 7, "b", &["x"]), Wait::Until(100))),
        [queued(2, 7, 0)]
    );
    assert_eq!(h.describe("x").waiters[0].deadline, Some(100));
    assert_eq!(h.engine.next_deadline(), Some(100));
    assert_eq!(h.engine.due(99), []);
    let due = h.engine.due(100);
    assert_eq!(
        due,
        [Command::TimeoutWaiter {
            session: sid(2),
            request: RequestId(7)
        }]
    );
    assert_eq!(h.ok(100, due[0].clone()), [timed_out(2, 7)]);
    assert_eq!(h.waiters("x"), []);
    assert_eq!(h.engine.next_deadline(), Some(TTL)); // only the sessions remain
                                                     // A stale timeout (already gone) is a no-op.
    assert_eq!(h.ok(101, due[0].clone()), []);
    // The request is no longer pending.
    h.err(102, cancel(2, 7), EngineError::UnknownRequest(7));
}

#[test]
fn wait_until_a_deadline_already_passed_times_out_at_once() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["x"]));
    let before = h.snapshot();
    assert_eq!(
        h.ok(50, with_wait(acq(2, 1, "b", &["x"]), Wait::Until(40))),
        [timed_out(2, 1)]
    );
    // A deadline equal to now has passed too.
    assert_eq!(
        h.ok(50, with_wait(acq(2, 2, "b", &["x"]), Wait::Until(50))),
        [timed_out(2, 2)]
    );
    assert_eq!(h.snapshot(), before);
    // On a free lock, the same request is simply granted.
    assert_eq!(
        h.ok(50, with_wait(acq(2, 3, "b", &["y"]), Wait::Until(40))),
        [granted(2, 3, &[2])]
    );
}

#[test]
fn cancel_removes_a_waiter_and_lets_the_next_in() {
    let mut h = Harness::with_sessions(3);
    assert_eq!(
        h.ok(1, with_mode(acq(1, 1, "r1", &["x"]), Mode::Shared)),
        [granted(1, 1, &[1])]
    );
    assert_eq!(h.ok(2, acq(2, 1, "w", &["x"])), [queued(2, 1, 0)]);
    assert_eq!(
        h.ok(3, with_mode(acq(3, 1, "r2", &["x"]), Mode::Shared)),
        [queued(3, 1, 1)]
    );
    // The writer gives up: the reader behind it joins the reader holding.
    assert_eq!(h.ok(4, cancel(2, 1)), [granted(3, 1, &[2])]);
    assert_eq!(h.waiters("x"), []);
    assert_eq!(h.describe("x").holders.len(), 2);
    // Unknown, granted and already cancelled requests cannot be cancelled.
    h.err(5, cancel(2, 1), EngineError::UnknownRequest(1));
    h.err(5, cancel(1, 1), EngineError::UnknownRequest(1));
    h.err(5, cancel(3, 42), EngineError::UnknownRequest(42));
}

#[test]
fn cancel_of_the_only_waiter_of_a_free_multi_lock_drops_the_entries() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["b"]));
    assert_eq!(h.ok(2, acq(2, 1, "w", &["a", "b"])), [queued(2, 1, 0)]);
    assert_eq!(h.waiters("a"), [(sid(2), RequestId(1))]);
    assert_eq!(h.ok(3, cancel(2, 1)), []);
    assert!(h.engine.describe("a").is_none());
    assert_eq!(h.waiters("b"), []);
}

// ----- release -----

#[test]
fn release_by_anyone_but_the_owner_is_an_error() {
    let mut h = Harness::with_sessions(2);
    let name = |n: &str| n.to_owned();
    // Never held.
    h.err(
        1,
        release(1, "a", "x"),
        EngineError::NotHeld { name: name("x") },
    );
    assert_eq!(h.ok(1, acq(1, 1, "a", &["x"])), [granted(1, 1, &[1])]);
    // Another session, another owner in the same session, a wrong token.
    h.err(
        2,
        release(2, "a", "x"),
        EngineError::NotOwner { name: name("x") },
    );
    h.err(
        2,
        release(1, "b", "x"),
        EngineError::NotOwner { name: name("x") },
    );
    h.err(
        2,
        release_token(1, "a", "x", 2),
        EngineError::NotOwner { name: name("x") },
    );
    // The right token releases.
    assert_eq!(h.ok(3, release_token(1, "a", "x", 1)), []);
    assert!(h.engine.describe("x").is_none());
    // Released: free again.
    h.err(
        4,
        release(1, "a", "x"),
        EngineError::NotHeld { name: name("x") },
    );
    // A lock that only has waiters is not held either.
    h.ok(5, acq(1, 2, "a", &["y"]));
    h.ok(5, acq(2, 1, "b", &["x", "y"]));
    assert_eq!(h.waiters("x"), [(sid(2), RequestId(1))]);
    h.err(
        6,
        release(2, "b", "x"),
        EngineError::NotHeld { name: name("x") },
    );
    // Renew follows the same rules.
    h.err(
        6,
        renew(2, "b", "y", 100),
        EngineError::NotOwner { name: name("y") },
    );
    h.err(
        6,
        renew(2, "b", "z", 100),
        EngineError::NotHeld { name: name("z") },
    );
}

#[test]
fn release_of_a_sessionless_hold_needs_its_owner() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(0, 1, "ttl-owner", &["x"]);
    a.lease = Some(1_000);
    assert_eq!(h.ok(1, a), [granted(0, 1, &[1])]);
    h.err(
        2,
        release(0, "someone", "x"),
        EngineError::NotOwner { name: "x".into() },
    );
    h.err(
        2,
        release(1, "ttl-owner", "x"),
        EngineError::NotOwner { name: "x".into() },
    );
    assert_eq!(h.ok(3, release(0, "ttl-owner", "x")), []);
    assert!(h.engine.describe("x").is_none());
    assert_eq!(
        h.engine.next_deadline(),
        Some(TTL),
        "the lease timer is gone"
    );
}

// ----- re-entry -----

#[test]
fn reentry_raises_the_hold_count_keeps_the_token_and_needs_as_many_releases() {
    let mut h = Harness::with_sessions(2);
    assert_eq!(h.ok(1, acq(1, 1, "a", &["x"])), [granted(1, 1, &[1])]);
    h.ok(2, acq(2, 1, "b", &["x"])); // a waiter does not block re-entry
    assert_eq!(h.ok(3, acq(1, 2, "a", &["x"])), [granted(1, 2, &[1])]);
    assert_eq!(h.ok(4, acq(1, 3, "a", &["x"])), [granted(1, 3, &[1])]);
    assert_eq!(h.holders("x"), [(sid(1), "a".into(), 1, 3)]);
    assert_eq!(
        h.describe("x").holders[0].lock_time,
        1,
        "lock_time is the first grant"
    );
    assert_eq!(h.engine.last_token(), 1);
    assert_eq!(h.ok(5, release(1, "a", "x")), []);
    assert_eq!(h.ok(6, release(1, "a", "x")), []);
    assert_eq!(h.holders("x"), [(sid(1), "a".into(), 1, 1)]);
    assert_eq!(h.ok(7, release(1, "a", "x")), [granted(2, 1, &[2])]);
}

fn set_count(session: u64, owner: &str, name: &str, token: u64, count: u32) -> Command {
    Command::SetHoldCount {
        session: SessionId(session),
        owner: owner.to_owned(),
        name: name.to_owned(),
        token,
        count,
    }
}

/// A client that counts re-entry itself holds with one acquire and records
/// its depth: inspection shows it, nothing else changes (token, lease,
/// queue), and a release still takes off one level.
#[test]
fn a_hold_count_set_by_its_client_shows_in_inspection_and_changes_nothing_else() {
    let mut h = Harness::with_sessions(2);
    let mut leased = acq(1, 1, "a", &["x"]);
    leased.lease = Some(5_000);
    assert_eq!(h.ok(1, leased), [granted(1, 1, &[1])]);
    assert_eq!(h.ok(2, acq(2, 1, "b", &["x"])), [queued(2, 1, 0)]);
    assert_eq!(h.ok(3, set_count(1, "a", "x", 1, 3)), []);
    assert_eq!(h.holders("x"), [(sid(1), "a".into(), 1, 3)]);
    let info = h.describe("x");
    assert_eq!(info.holders[0].lease_until, Some(5_001), "lease unchanged");
    assert_eq!(h.waiters("x"), [(sid(2), RequestId(1))]);
    assert_eq!(h.engine.last_token(), 1);
    // Back to one level, then the release ends the hold.
    assert_eq!(h.ok(4, set_count(1, "a", "x", 1, 1)), []);
    assert_eq!(h.ok(5, release(1, "a", "x")), [granted(2, 1, &[2])]);
}

#[test]
fn a_hold_count_is_set_only_by_the_owner_of_that_hold_and_never_to_zero() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["x"]));
    h.err(2, set_count(1, "a", "x", 1, 0), EngineError::ZeroHoldCount);
    let not_owner = EngineError::NotOwner { name: "x".into() };
    h.err(2, set_count(1, "a", "x", 7, 2), not_owner.clone()); // stale token
    h.err(2, set_count(1, "b", "x", 1, 2), not_owner.clone());
    h.err(2, set_count(2, "a", "x", 1, 2), not_owner);
    let not_held = EngineError::NotHeld { name: "y".into() };
    h.err(2, set_count(1, "a", "y", 1, 2), not_held);
    h.err(
        2,
        set_count(9, "a", "x", 1, 2),
        EngineError::NotOwner { name: "x".into() },
    );
}

#[test]
fn shared_reentry_is_granted_even_with_a_writer_waiting() {
    let mut h = Harness::with_sessions(2);
    let read = |s, r| with_mode(acq(s, r, "r", &["x"]), Mode::Shared);
    assert_eq!(h.ok(1, read(1, 1)), [granted(1, 1, &[1])]);
    assert_eq!(h.ok(2, acq(2, 1, "w", &["x"])), [queued(2, 1, 0)]);
    // Queuing the re-entry behind the writer would deadlock the reader.
    assert_eq!(h.ok(3, read(1, 2)), [granted(1, 2, &[1])]);
    assert_eq!(h.holders("x"), [(sid(1), "r".into(), 1, 2)]);
}

#[test]
fn non_reentrant_reacquire_is_already_held() {
    let mut h = Harness::with_sessions(1);
    h.ok(1, acq(1, 1, "a", &["x"]));
    let mut again = acq(1, 2, "a", &["x"]);
    again.reentrant = false;
    h.err(2, again, EngineError::AlreadyHeld { name: "x".into() });
    // Another owner of the same session is not a re-entry: it queues.
    let mut other = acq(1, 3, "b", &["x"]);
    other.reentrant = false;
    assert_eq!(h.ok(3, other), [queued(1, 3, 0)]);
}

#[test]
fn reentry_in_another_mode_is_a_mode_mismatch() {
    let mut h = Harness::with_sessions(1);
    h.ok(1, with_mode(acq(1, 1, "a", &["x"]), Mode::Shared));
    h.err(
        2,
        acq(1, 2, "a", &["x"]),
        EngineError::ModeMismatch {
            name: "x".into(),
            held: Mode::Shared,
            requested: Mode::Exclusive,
        },
    );
    h.ok(
        3,
        with_mode(acq(1, 3, "a", &["y"]), Mode::Semaphore { permits: 2 }),
    );
    h.err(
        4,
        with_mode(acq(1, 4, "a", &["y"]), Mode::Semaphore { permits: 3 }),
        EngineError::ModeMismatch {
            name: "y".into(),
            held: Mode::Semaphore { permits: 2 },
            requested: Mode::Semaphore { permits: 3 },
        },
    );
}

/// Regression: a *queued* request of an owner that meanwhile got the lock in
/// another mode (or asked for no re-entry) was granted as a re-entry of that
/// hold: an exclusive request got the shared hold's token while other readers
/// could still join.
#[test]
fn queued_request_never_reenters_a_hold_in_another_mode() {
    let mut h = Harness::with_sessions(3);
    h.ok(1, acq(1, 1, "h", &["x"]));
    // Session 2, owner "o": a read and then a write, both queued behind "h".
    assert_eq!(
        h.ok(2, with_mode(acq(2, 1, "o", &["x"]), Mode::Shared)),
        [queued(2, 1, 0)]
    );
    assert_eq!(h.ok(3, acq(2, 2, "o", &["x"])), [queued(2, 2, 1)]);
    // The read is granted; the write must keep waiting (it is not a re-entry).
    assert_eq!(h.ok(4, release(1, "h", "x")), [granted(2, 1, &[2])]);
    assert_eq!(h.holders("x"), [(sid(2), "o".into(), 2, 1)]);
    assert_eq!(h.waiters("x"), [(sid(2), RequestId(2))]);
    // And a new reader queues behind the waiting writer.
    assert_eq!(
        h.ok(5, with_mode(acq(3, 1, "r", &["x"]), Mode::Shared)),
        [queued(3, 1, 1)]
    );
    // Once the read is released, the write gets a hold of its own.
    assert_eq!(h.ok(6, release(2, "o", "x")), [granted(2, 2, &[3])]);
    assert_eq!(h.holders("x"), [(sid(2), "o".into(), 3, 1)]);
    assert_eq!(h.describe("x").holders[0].mode, Mode::Exclusive);
}

/// Regression (same cause): a queued non-reentrant request was granted as a
/// re-entry once an earlier request of the same owner got the lock.
#[test]
fn queued_non_reentrant_request_waits_for_the_owners_own_hold() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "h", &["x"]));
    assert_eq!(h.ok(2, acq(2, 1, "o", &["x"])), [queued(2, 1, 0)]);
    let mut again = acq(2, 2, "o", &["x"]);
    again.reentrant = false;
    assert_eq!(h.ok(3, again), [queued(2, 2, 1)]);
    assert_eq!(h.ok(4, release(1, "h", "x")), [granted(2, 1, &[2])]);
    assert_eq!(h.holders("x"), [(sid(2), "o".into(), 2, 1)]);
    assert_eq!(h.waiters("x"), [(sid(2), RequestId(2))]);
    assert_eq!(h.ok(5, release(2, "o", "x")), [granted(2, 2, &[3])]);
    assert_eq!(h.holders("x"), [(sid(2), "o".into(), 3, 1)]);
}

// ----- fencing tokens -----

#[test]
fn tokens_strictly_increase_and_are_never_reused() {
    let mut h = Harness::with_sessions(2);
    let mut last = 0;
    for round in 0..5u64 {
        let effects = h.ok(round * 10, acq(1 + round % 2, round, "o", &["x"]));
        let [Effect::Granted { tokens, .. }] = effects.as_slice() else {
            panic!("{effects:?}")
        };
        assert!(tokens[0] > last, "{tokens:?} after {last}");
        last = tokens[0];
        assert_eq!(h.engine.last_token(), last);
        h.ok(round * 10 + 1, release(1 + round % 2, "o", "x"));
        // The idle lock's entry is dropped...
        assert!(h.engine.describe("x").is_none());
        assert!(h.engine.list("").is_empty());
    }
    // ...and the counter is global: another lock continues from it.
    assert_eq!(h.ok(100, acq(1, 100, "o", &["y"])), [granted(1, 100, &[6])]);
    assert_eq!(
        h.ok(101, acq(2, 101, "o", &["x", "z"])),
        [granted(2, 101, &[7, 8])]
    );
    assert_eq!(h.engine.last_token(), 8);
}

// ----- FIFO -----

#[test]
fn ten_waiters_are_granted_in_arrival_order() {
    let mut h = Harness::with_sessions(4);
    assert_eq!(h.ok(0, acq(1, 0, "holder", &["x"])), [granted(1, 0, &[1])]);
    let waiter = |i: u64| (1 + i % 4, 100 + i, format!("w{i}"));
    for i in 0..10 {
        let (s, r, owner) = waiter(i);
        assert_eq!(
            h.ok(1 + i, acq(s, r, &owner, &["x"])),
            [queued(s, r, i as u32)]
        );
    }
    let order: Vec<_> = (0..10)
        .map(|i| (sid(waiter(i).0), RequestId(waiter(i).1)))
        .collect();
    assert_eq!(h.waiters("x"), order);
    let mut owner = ("holder".to_owned(), 1);
    for i in 0..10 {
        let (s, r, o) = waiter(i);
        assert_eq!(
            h.ok(20 + i, release(owner.1, &owner.0, "x")),
            [granted(s, r, &[2 + i])],
            "waiter {i}"
        );
        owner = (o, s);
    }
    assert_eq!(h.waiters("x"), []);
}

// ----- shared (read-write) -----

#[test]
fn readers_share_and_a_writer_waits_for_them() {
    let mut h = Harness::with_sessions(3);
    let read = |s, r| with_mode(acq(s, r, "r", &["x"]), Mode::Shared);
    assert_eq!(h.ok(1, read(1, 1)), [granted(1, 1, &[1])]);
    assert_eq!(h.ok(2, read(2, 1)), [granted(2, 1, &[2])]);
    assert_eq!(h.ok(3, acq(3, 1, "w", &["x"])), [queued(3, 1, 0)]);
    assert_eq!(h.ok(4, release(1, "r", "x")), []);
    assert_eq!(h.ok(5, release(2, "r", "x")), [granted(3, 1, &[3])]);
    // A writer holding excludes readers.
    assert_eq!(h.ok(6, read(1, 2)), [queued(1, 2, 0)]);
}

#[test]
fn a_reader_arriving_while_a_writer_waits_queues_behind_the_writer() {
    let mut h = Harness::with_sessions(3);
    let read = |s, r| with_mode(acq(s, r, "r", &["x"]), Mode::Shared);
    h.ok(1, read(1, 1));
    assert_eq!(h.ok(2, acq(2, 1, "w", &["x"])), [queued(2, 1, 0)]);
    assert_eq!(h.ok(3, read(3, 1)), [queued(3, 1, 1)]);
    assert_eq!(
        h.ok(3, with_wait(read(3, 2), Wait::No)),
        [would_block(3, 2)]
    );
    assert_eq!(h.ok(4, release(1, "r", "x")), [granted(2, 1, &[2])]);
    assert_eq!(h.ok(5, release(2, "w", "x")), [granted(3, 1, &[3])]);
}

#[test]
fn consecutive_readers_behind_a_released_writer_are_granted_together() {
    let mut h = Harness::with_sessions(4);
    let read = |s, r| with_mode(acq(s, r, "r", &["x"]), Mode::Shared);
    h.ok(1, acq(1, 1, "w", &["x"]));
    assert_eq!(h.ok(2, read(2, 1)), [queued(2, 1, 0)]);
    assert_eq!(h.ok(3, read(3, 1)), [queued(3, 1, 1)]);
    assert_eq!(h.ok(4, read(4, 1)), [queued(4, 1, 2)]);
    assert_eq!(h.ok(5, acq(1, 2, "w2", &["x"])), [queued(1, 2, 3)]);
    assert_eq!(h.ok(6, read(2, 2)), [queued(2, 2, 4)]);
    // One release, three grants; the second writer and the reader behind it wait.
    assert_eq!(
        h.ok(7, release(1, "w", "x")),
        [
            granted(2, 1, &[2]),
            granted(3, 1, &[3]),
            granted(4, 1, &[4])
        ]
    );
    assert_eq!(
        h.waiters("x"),
        [(sid(1), RequestId(2)), (sid(2), RequestId(2))]
    );
}

// ----- semaphore -----

#[test]
fn semaphore_admits_at_most_n_holders() {
    let mut h = Harness::with_sessions(4);
    let sem = |s, r| with_mode(acq(s, r, "p", &["gpu"]), Mode::Semaphore { permits: 2 });
    assert_eq!(h.ok(1, sem(1, 1)), [granted(1, 1, &[1])]);
    assert_eq!(h.ok(2, sem(2, 1)), [granted(2, 1, &[2])]);
    assert_eq!(h.ok(3, sem(3, 1)), [queued(3, 1, 0)]);
    assert_eq!(h.ok(3, with_wait(sem(4, 1), Wait::No)), [would_block(4, 1)]);
    assert_eq!(h.describe("gpu").holders.len(), 2);
    assert_eq!(h.ok(4, release(1, "p", "gpu")), [granted(3, 1, &[3])]);
    // Exclusive does not mix with a semaphore.
    assert_eq!(h.ok(5, acq(4, 2, "x", &["gpu"])), [queued(4, 2, 0)]);
}

#[test]
fn semaphore_permits_must_match_holders_and_waiters() {
    let mut h = Harness::with_sessions(3);
    let sem = |s, r, permits| with_mode(acq(s, r, "p", &["gpu"]), Mode::Semaphore { permits });
    h.ok(1, sem(1, 1, 2));
    h.err(
        2,
        sem(2, 1, 3),
        EngineError::PermitMismatch {
            name: "gpu".into(),
            existing: 2,
            requested: 3,
        },
    );
    // Only a waiter names the permits: the holder is exclusive.
    h.ok(3, acq(1, 2, "x", &["other"]));
    assert_eq!(
        h.ok(4, sem(2, 2, 4).clone_with_name("other")),
        [queued(2, 2, 0)]
    );
    h.err(
        5,
        sem(3, 1, 5).clone_with_name("other"),
        EngineError::PermitMismatch {
            name: "other".into(),
            existing: 4,
            requested: 5,
        },
    );
    h.err(6, sem(3, 2, 0), EngineError::ZeroPermits);
    h.err(
        6,
        sem(3, 2, 0).clone_with_name("new"),
        EngineError::ZeroPermits,
    );
}

trait WithName {
    fn clone_with_name(self, name: &str) -> Acquire;
}

impl WithName for Acquire {
    fn clone_with_name(mut self, name: &str) -> Acquire {
        self.names = vec![name.to_owned()];
        self
    }
}

// ----- sessions -----

#[test]
fn heartbeat_extends_a_session_and_expiry_is_due_exactly_then() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    assert_eq!(h.session(1).expires_at, 1_000);
    assert_eq!(h.engine.next_deadline(), Some(1_000));
    h.ok(600, Command::Heartbeat { session: sid(1) });
    assert_eq!(h.session(1).expires_at, 1_600);
    assert_eq!(h.engine.next_deadline(), Some(1_600));
    assert_eq!(h.engine.due(1_000), []);
    assert_eq!(h.engine.due(1_599), []);
    assert_eq!(
        h.engine.due(1_600),
        [Command::ExpireSession {
            session: sid(1),
            deadline: 1_600
        }]
    );
    h.err(
        1,
        Command::Heartbeat { session: sid(2) },
        EngineError::UnknownSession(2),
    );
    h.ok(
        1_600,
        Command::ExpireSession {
            session: sid(1),
            deadline: 1_600,
        },
    );
    assert!(!h.engine.has_session(sid(1)));
    assert_eq!(h.engine.next_deadline(), None);
    h.err(
        1_601,
        Command::Heartbeat { session: sid(1) },
        EngineError::UnknownSession(1),
    );
}

#[test]
fn session_expiry_releases_every_hold_in_token_order_and_grants_the_next() {
    let mut h = Harness::with_sessions(3);
    // Session 1 holds z (token 1), a (2, re-entered), m (3, another owner).
    h.ok(1, acq(1, 1, "o", &["z"]));
    h.ok(2, acq(1, 2, "o", &["a"]));
    h.ok(3, acq(1, 3, "o", &["a"]));
    h.ok(4, acq(1, 4, "p", &["m"]));
    // Session 2 waits for a; session 1 waits for q, held by session 3.
    assert_eq!(h.ok(5, acq(2, 1, "w", &["a"])), [queued(2, 1, 0)]);
    h.ok(6, acq(3, 1, "h", &["q"]));
    assert_eq!(h.ok(7, acq(1, 5, "o", &["q"])), [queued(1, 5, 0)]);
    assert_eq!(h.session(1).holds, 3);

    assert_eq!(h.engine.due(TTL - 1), []);
    let due = h.engine.due(TTL);
    assert!(
        due.contains(&Command::ExpireSession {
            session: sid(1),
            deadline: TTL
        }),
        "{due:?}"
    );
    assert_eq!(
        h.ok(
            TTL,
            Command::ExpireSession {
                session: sid(1),
                deadline: TTL
            }
        ),
        [
            lost(1, "o", "z", 1, LostReason::SessionExpired),
            lost(1, "o", "a", 2, LostReason::SessionExpired),
            lost(1, "p", "m", 3, LostReason::SessionExpired),
            granted(2, 1, &[5]),
        ]
    );
    assert!(h.engine.describe("z").is_none());
    assert!(h.engine.describe("m").is_none());
    assert_eq!(h.holders("a"), [(sid(2), "w".into(), 5, 1)]);
    assert_eq!(h.waiters("q"), [], "the session's waiters are dropped");
    assert!(h.engine.sessions().iter().all(|s| s.session != sid(1)));
    h.err(
        TTL,
        Command::ExpireSession {
            session: sid(1),
            deadline: TTL,
        },
        EngineError::UnknownSession(1),
    );
    h.err(TTL, acq(1, 9, "o", &["n"]), EngineError::UnknownSession(1));
}

#[test]
fn close_session_releases_without_lock_delay() {
    let mut h = Harness::with_sessions(2);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 5_000;
    h.ok(1, a);
    h.ok(2, acq(2, 1, "w", &["x"]));
    assert_eq!(
        h.ok(3, Command::CloseSession { session: sid(1) }),
        [
            lost(1, "o", "x", 1, LostReason::SessionClosed),
            granted(2, 1, &[2]),
        ]
    );
    assert_eq!(h.describe("x").lock_delay_until, None);
    assert!(!h.engine.has_session(sid(1)));
    h.err(
        4,
        Command::CloseSession { session: sid(1) },
        EngineError::UnknownSession(1),
    );
}

#[test]
fn session_ids_must_be_new_and_not_none() {
    let mut h = Harness::with_sessions(1);
    let open = |s| Command::OpenSession {
        session: sid(s),
        ttl: TTL,
        info: ClientInfo::default(),
    };
    h.err(1, open(1), EngineError::SessionExists(1));
    h.err(1, open(0), EngineError::SessionExists(0));
}

#[test]
fn the_work_of_a_session_end_counts_its_holds_and_queued_names() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(1, 1, "a", &["x", "y", "z"]));
    h.ok(1, acq(2, 1, "b", &["x"]));
    // Session 2 holds nothing and queues for one name; session 1 holds three.
    h.ok(1, acq(2, 2, "b", &["x", "w"]));
    let work = |h: &Harness, command: Command| h.engine.work_of(&command);
    assert_eq!(work(&h, Command::CloseSession { session: sid(1) }), 1 + 3);
    assert_eq!(work(&h, es(1, TTL)), 1 + 3);
    assert_eq!(
        work(&h, Command::CloseSession { session: sid(2) }),
        1 + 1 + 2
    );
    assert_eq!(work(&h, Command::CloseSession { session: sid(9) }), 1);
    assert_eq!(work(&h, release(1, "a", "x")), 1);
    assert_eq!(work(&h, Command::Heartbeat { session: sid(1) }), 1);
}

fn step_limit(session_end_step: usize) -> Limits {
    Limits {
        session_end_step,
        ..Limits::default()
    }
}

/// The first command `due(now)` lists, if it is a step of a session's end.
fn next_step(h: &Harness, now: Millis) -> Option<Command> {
    let first = h.engine.due(now).into_iter().next();
    first.filter(|c| matches!(c, Command::ContinueSessionEnd { .. }))
}

#[test]
fn a_big_session_ends_in_steps_with_other_requests_between_them() {
    let mut h = Harness::with_limits(step_limit(2));
    // Session 1 expires at TTL, the others a little later.
    h.open(0, 1, TTL);
    h.open(1, 2, TTL);
    h.open(1, 3, TTL);
    // Session 1 holds a, b and c and waits for d, held by session 2, with
    // session 3 behind it; session 2 waits for c.
    for (request, name) in [(1, "a"), (2, "b"), (3, "c")] {
        h.ok(1, acq(1, request, "o", &[name]));
    }
    h.ok(1, acq(2, 1, "w", &["d"]));
    h.ok(1, acq(1, 4, "o", &["d"]));
    h.ok(1, acq(3, 1, "x", &["d"]));
    h.ok(1, acq(2, 2, "w", &["c"]));
    assert_eq!(
        h.engine.work_of(&es(1, TTL)),
        1,
        "4 locks: its end takes steps"
    );

    // The expiry ends the session and gives up nothing yet.
    assert_eq!(h.ok(TTL, es(1, TTL)), []);
    assert!(!h.engine.has_session(sid(1)));
    assert_eq!(h.engine.next_deadline(), Some(TTL));
    // The ended session's requests are refused; its id is not free yet.
    h.err(TTL, release(1, "o", "b"), EngineError::UnknownSession(1));
    h.err(
        TTL,
        Command::Heartbeat { session: sid(1) },
        EngineError::UnknownSession(1),
    );
    let reopen = Command::OpenSession {
        session: sid(1),
        ttl: TTL,
        info: ClientInfo::default(),
    };
    h.err(TTL, reopen, EngineError::SessionExists(1));

    // Step by step, with another client's request served between steps.
    let mut lost = Vec::new();
    let mut steps = 0;
    while let Some(step) = next_step(&h, TTL) {
        let Command::ContinueSessionEnd { waits, holds, .. } = &step else {
            unreachable!()
        };
        assert!(waits.len() + holds.len() <= 2, "{step:?}");
        assert_eq!(h.engine.work_of(&step), waits.len() + holds.len());
        for effect in h.ok(TTL, step) {
            if let Effect::Lost { name, reason, .. } = effect {
                assert_eq!(reason, LostReason::SessionExpired);
                lost.push(name);
            }
        }
        steps += 1;
        let free = format!("free-{steps}");
        let granted = h.ok(TTL, acq(3, 10 + steps, "y", &[free.as_str()]));
        assert!(
            matches!(granted[..], [Effect::Granted { .. }]),
            "{granted:?}"
        );
    }
    lost.sort();
    assert_eq!(lost, ["a", "b", "c"]);
    assert_eq!(steps, 2, "the wait and a hold, then two holds");
    h.err(
        TTL,
        Command::ContinueSessionEnd {
            session: sid(1),
            waits: Vec::new(),
            holds: Vec::new(),
        },
        EngineError::NotDue,
    );
    // c went to session 2; d passes from session 2 to session 3, the
    // dropped waiter of session 1 no longer in the way.
    assert_eq!(h.describe("c").holders[0].session, sid(2));
    let effects = h.ok(TTL, release(2, "w", "d"));
    assert!(
        matches!(effects[..], [Effect::Granted { session, request, .. }] if (session, request) == (sid(3), RequestId(1))),
        "{effects:?}"
    );
}

#[test]
fn an_ended_sessions_waiter_is_not_granted_and_not_in_the_way() {
    let mut h = Harness::with_limits(step_limit(1));
    for s in 1..=3 {
        h.open(0, s, TTL);
    }
    h.ok(1, acq(2, 1, "w", &["d"]));
    h.ok(1, acq(1, 1, "o", &["a"]));
    // Session 1 waits for d, session 3 behind it.
    h.ok(1, acq(1, 2, "o", &["d"]));
    h.ok(1, acq(3, 1, "x", &["d"]));
    assert_eq!(h.ok(2, Command::CloseSession { session: sid(1) }), []);
    // Its hold still shows who held it until a step releases it.
    assert_eq!(h.describe("a").holders[0].lock_by, client(1));
    let waiting: Vec<_> = h.describe("d").waiters.iter().map(|w| w.session).collect();
    assert_eq!(waiting, [sid(3)]);
    // It counts for no one's position and is skipped when d is free.
    assert_eq!(h.ok(2, acq(3, 2, "x2", &["d"])), [queued(3, 2, 1)]);
    assert_eq!(h.ok(3, release(2, "w", "d")), [granted(3, 1, &[3])]);

    // A step that names what is gone (a waiter, a hold of another token)
    // skips it; the end goes on until nothing is left.
    let stale = Command::ContinueSessionEnd {
        session: sid(1),
        waits: vec![RequestId(9)],
        holds: vec![("a".into(), 99), ("nowhere".into(), 1)],
    };
    assert_eq!(h.ok(3, stale), []);
    assert_eq!(h.describe("a").holders.len(), 1);
    while let Some(step) = next_step(&h, 3) {
        h.ok(3, step);
    }
    assert_eq!(h.engine.describe("a"), None);
    assert_eq!(h.engine.next_deadline(), Some(TTL), "the sessions left");
}

#[test]
fn grant_grace_moves_session_expiry() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.open(0, 2, 50_000);
    h.ok(100, Command::GrantGrace { grace: 10_000 });
    assert_eq!(
        h.session(1).expires_at,
        10_100,
        "grace when longer than the TTL"
    );
    assert_eq!(
        h.session(2).expires_at,
        50_100,
        "the TTL when longer than grace"
    );
    assert_eq!(h.engine.due(1_000), []);
    assert_eq!(h.engine.next_deadline(), Some(10_100));
    assert_eq!(
        h.engine.due(10_100),
        [Command::ExpireSession {
            session: sid(1),
            deadline: 10_100
        }]
    );
}

// ----- time across leader changes -----

/// The in-flight renew race: an expiry is decided from the deadline the
/// leader saw, and a renew committed before the expiry is applied wins.
#[test]
fn a_renew_applied_after_the_expiry_was_decided_makes_the_expiry_a_no_op() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lease = Some(100);
    h.ok(0, a);
    let due = h.engine.due(100);
    assert_eq!(
        due,
        [Command::ExpireHold {
            name: "x".into(),
            token: 1,
            deadline: 100
        }]
    );
    assert_eq!(h.ok(100, renew(1, "o", "x", 500)), []);
    h.err(101, due[0].clone(), EngineError::NotDue);
    assert_eq!(h.holders("x"), [(sid(1), "o".into(), 1, 1)]);
    assert_eq!(h.describe("x").holders[0].lease_until, Some(600));
}

#[test]
fn a_heartbeat_applied_after_the_expiry_was_decided_keeps_the_session() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.ok(10, acq(1, 1, "o", &["x"]));
    let due = h.engine.due(1_000);
    assert_eq!(due, [es(1, 1_000)]);
    h.ok(1_000, Command::Heartbeat { session: sid(1) });
    h.err(1_001, due[0].clone(), EngineError::NotDue);
    assert!(h.engine.has_session(sid(1)));
    assert_eq!(h.holders("x"), [(sid(1), "o".into(), 1, 1)]);
    assert_eq!(h.engine.due(1_999), []);
    assert_eq!(h.engine.due(2_000), [es(1, 2_000)]);
}

/// Heartbeats are not logged: replaying the log after a restart applies an
/// expiry that was decided from a heartbeat-extended deadline to a session
/// whose deadline never saw the heartbeat. It must apply all the same, with
/// the same effects (a divergence here made the restarted server refuse
/// later releases of the lock's next holder).
#[test]
fn a_replayed_expiry_applies_without_the_heartbeats_it_was_decided_after() {
    let run = |heartbeats: bool| {
        let mut h = Harness::new();
        h.open(0, 1, 1_000);
        h.open(0, 2, 100_000);
        h.ok(10, acq(1, 1, "o", &["x"]));
        h.ok(20, acq(2, 1, "w", &["x"]));
        if heartbeats {
            h.ok(500, Command::Heartbeat { session: sid(1) });
            assert_eq!(h.engine.due(1_500), [es(1, 1_500)]);
        }
        h.ok(1_500, es(1, 1_500))
    };
    assert_eq!(run(true), run(false));
    assert_eq!(
        run(false),
        [
            lost(1, "o", "x", 1, LostReason::SessionExpired),
            granted(2, 1, &[2])
        ]
    );
}

#[test]
fn a_heartbeat_never_shortens_a_grace() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.ok(100, Command::GrantGrace { grace: 10_000 });
    h.ok(200, Command::Heartbeat { session: sid(1) });
    assert_eq!(h.session(1).expires_at, 10_100);
    h.ok(9_500, Command::Heartbeat { session: sid(1) });
    assert_eq!(h.session(1).expires_at, 10_500);
}

/// A caller that times sessions itself (a leader answering heartbeats under
/// its lease) gets no session expiry from `due`, and its own expiry applies
/// at a deadline past the engine's floor, never before the floor.
#[test]
fn sessions_timed_by_the_caller_expire_only_when_the_caller_says() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.engine.time_sessions_by_caller();
    h.open(0, 2, 1_000);
    assert_eq!(h.engine.next_deadline(), None, "no session timer");
    assert_eq!(h.engine.due(5_000), []);
    h.ok(100, Command::GrantGrace { grace: 2_000 });
    assert_eq!(h.session(1).expires_at, 2_100, "the floor still moves");
    assert_eq!(h.engine.next_deadline(), None);
    h.err(2_000, es(1, 2_000), EngineError::NotDue);
    // Heard by the caller until 3 000: it expires the session at 4 000.
    h.ok(4_000, es(1, 4_000));
    assert!(!h.engine.has_session(sid(1)));
    assert!(h.engine.has_session(sid(2)));
}

#[test]
fn an_expiry_applied_before_its_deadline_is_refused() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.err(999, es(1, 1_000), EngineError::NotDue);
    h.err(1_000, es(1, 900), EngineError::NotDue);
    assert!(h.engine.has_session(sid(1)));
}

/// A new leader's grace: every session, lease and lock-delay deadline is
/// pushed to at least `now + grace` (sessions `now + max(ttl, grace)`), none
/// is shortened, and the expiries decided before it are stale.
#[test]
fn grant_grace_extends_sessions_leases_and_lock_delays_and_never_shortens() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.open(0, 2, 100_000);
    h.open(0, 3, 1_000);
    let mut leased = acq(0, 1, "ttl", &["lease"]);
    leased.lease = Some(500);
    h.ok(0, leased);
    let mut long = acq(0, 2, "ttl", &["long"]);
    long.lease = Some(90_000);
    h.ok(0, long);
    let mut delayed = acq(3, 1, "o", &["delay"]);
    delayed.lock_delay = 2_000;
    h.ok(0, delayed);
    h.ok(1_000, es(3, 1_000));
    assert_eq!(h.describe("delay").lock_delay_until, Some(3_000));
    let stale = h.engine.due(1_000);
    assert_eq!(stale.len(), 2, "{stale:?}");

    assert_eq!(h.ok(1_000, Command::GrantGrace { grace: 5_000 }), []);
    assert_eq!(h.session(1).expires_at, 6_000, "grace longer than the TTL");
    assert_eq!(h.session(2).expires_at, 101_000, "the TTL when longer");
    assert_eq!(h.describe("lease").holders[0].lease_until, Some(6_000));
    assert_eq!(
        h.describe("long").holders[0].lease_until,
        Some(90_000),
        "a lease ending after the grace is kept"
    );
    assert_eq!(h.describe("delay").lock_delay_until, Some(6_000));
    for command in stale {
        h.err(1_000, command, EngineError::NotDue);
    }
    assert_eq!(h.engine.due(5_999), []);
    assert_eq!(h.engine.next_deadline(), Some(6_000));
    let due = h.engine.due(6_000);
    assert_eq!(due.len(), 3, "{due:?}");
    for command in due {
        h.ok(6_000, command);
    }
    assert!(!h.engine.has_session(sid(1)));
    assert!(h.engine.describe("lease").is_none());
    assert!(h.engine.describe("delay").is_none());
}

// ----- leases -----

#[test]
fn a_leased_hold_expires_through_due_with_lost_lease_expired() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(0, 1, "ttl", &["x"]);
    a.lease = Some(100);
    assert_eq!(h.ok(10, a), [granted(0, 1, &[1])]);
    assert_eq!(h.describe("x").holders[0].lease_until, Some(110));
    assert_eq!(h.describe("x").holders[0].session, NONE);
    h.ok(20, acq(1, 1, "w", &["x"]));
    assert_eq!(h.engine.next_deadline(), Some(110));
    assert_eq!(h.engine.due(109), []);
    let due = h.engine.due(110);
    assert_eq!(
        due,
        [Command::ExpireHold {
            name: "x".into(),
            token: 1,
            deadline: 110,
        }]
    );
    assert_eq!(
        h.ok(110, due[0].clone()),
        [
            lost(0, "ttl", "x", 1, LostReason::LeaseExpired),
            granted(1, 1, &[2])
        ]
    );
    // A stale expiry of a hold that is gone changes nothing.
    h.err(111, due[0].clone(), EngineError::NotDue);
    assert_eq!(h.holders("x"), [(sid(1), "w".into(), 2, 1)]);
}

#[test]
fn renew_extends_a_lease() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lease = Some(100);
    h.ok(0, a);
    assert_eq!(h.ok(60, renew(1, "o", "x", 100)), []);
    assert_eq!(h.describe("x").holders[0].lease_until, Some(160));
    assert_eq!(h.engine.due(100), []);
    assert_eq!(h.engine.due(159), []);
    assert_eq!(
        h.engine.due(160),
        [Command::ExpireHold {
            name: "x".into(),
            token: 1,
            deadline: 160,
        }]
    );
    // With the right token; a wrong one is refused.
    let renew_token = |token| Command::Renew {
        session: sid(1),
        owner: "o".into(),
        name: "x".into(),
        token: Some(token),
        lease: 500,
    };
    h.err(
        70,
        renew_token(2),
        EngineError::NotOwner { name: "x".into() },
    );
    assert_eq!(h.ok(70, renew_token(1)), []);
    assert_eq!(h.engine.due(569), []);
    // Renewing a session hold gives it a lease.
    h.ok(80, acq(1, 2, "o", &["y"]));
    assert_eq!(h.ok(80, renew(1, "o", "y", 1_000)), []);
    assert_eq!(h.describe("y").holders[0].lease_until, Some(1_080));
}

#[test]
fn a_sessionless_acquire_needs_a_lease() {
    let mut h = Harness::new();
    h.err(0, acq(0, 1, "o", &["x"]), EngineError::LeaseRequired);
    let mut a = acq(0, 1, "o", &["x"]);
    a.lease = Some(1_000);
    assert_eq!(h.ok(0, a), [granted(0, 1, &[1])]);
}

// ----- lock-delay -----

#[test]
fn lock_delay_after_session_expiry_holds_back_grants_until_it_ends() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.open(0, 2, 100_000);
    h.open(0, 3, 100_000);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 3_000;
    h.ok(10, a);
    assert_eq!(h.ok(20, acq(2, 1, "w", &["x"])), [queued(2, 1, 0)]);
    assert_eq!(
        h.ok(
            1_000,
            Command::ExpireSession {
                session: sid(1),
                deadline: 1_000
            }
        ),
        [lost(1, "o", "x", 1, LostReason::SessionExpired)],
        "no grant during the lock-delay"
    );
    assert_eq!(h.describe("x").lock_delay_until, Some(4_000));
    assert_eq!(h.holders("x"), []);
    assert_eq!(h.engine.next_deadline(), Some(4_000));
    assert_eq!(h.engine.due(3_999), []);
    // A try-acquire is refused during the delay, a waiting one queues.
    assert_eq!(
        h.ok(2_000, with_wait(acq(3, 1, "t", &["x"]), Wait::No)),
        [would_block(3, 1)]
    );
    assert_eq!(h.ok(2_000, acq(3, 2, "t", &["x"])), [queued(3, 2, 1)]);
    let due = h.engine.due(4_000);
    assert_eq!(
        due,
        [Command::EndLockDelay {
            name: "x".into(),
            deadline: 4_000
        }]
    );
    assert_eq!(h.ok(4_000, due[0].clone()), [granted(2, 1, &[2])]);
    assert_eq!(h.describe("x").lock_delay_until, None);
}

#[test]
fn lock_delay_after_lease_expiry() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(0, 1, "ttl", &["x"]);
    a.lease = Some(100);
    a.lock_delay = 500;
    h.ok(0, a);
    assert_eq!(
        h.ok(
            100,
            Command::ExpireHold {
                name: "x".into(),
                token: 1,
                deadline: 100,
            }
        ),
        [lost(0, "ttl", "x", 1, LostReason::LeaseExpired)]
    );
    assert_eq!(h.describe("x").lock_delay_until, Some(600));
    assert_eq!(
        h.ok(300, with_wait(acq(1, 1, "o", &["x"]), Wait::No)),
        [would_block(1, 1)]
    );
    assert_eq!(h.ok(300, acq(1, 2, "o", &["x"])), [queued(1, 2, 0)]);
    assert_eq!(h.engine.due(599), []);
    assert_eq!(
        h.engine.due(600),
        [Command::EndLockDelay {
            name: "x".into(),
            deadline: 600
        }]
    );
    assert_eq!(
        h.ok(
            600,
            Command::EndLockDelay {
                name: "x".into(),
                deadline: 600
            }
        ),
        [granted(1, 2, &[2])]
    );
}

#[test]
fn an_idle_lock_in_lock_delay_stays_listed_until_the_delay_ends() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 2_000;
    h.ok(0, a);
    h.ok(
        1_000,
        Command::ExpireSession {
            session: sid(1),
            deadline: 1_000,
        },
    );
    assert_eq!(h.describe("x").lock_delay_until, Some(3_000));
    assert_eq!(
        h.ok(
            3_000,
            Command::EndLockDelay {
                name: "x".into(),
                deadline: 3_000
            }
        ),
        []
    );
    assert!(h.engine.describe("x").is_none());
    assert_eq!(h.engine.next_deadline(), None);
}

/// Regression: `due()` yields `EndLockDelay` for a delay that a command applied
/// earlier in the same batch has just extended (a later abnormal loss on the
/// same lock). Applying it ended the new, longer delay at once.
#[test]
fn a_stale_end_of_lock_delay_does_not_end_a_longer_delay() {
    let mut h = Harness::new();
    h.open(0, 1, 1_000);
    h.open(0, 2, 1_500);
    h.open(0, 3, 100_000);
    let read = |s, delay| {
        let mut a = with_mode(acq(s, 1, "r", &["x"]), Mode::Shared);
        a.lock_delay = delay;
        a
    };
    h.ok(0, read(1, 1_000));
    h.ok(0, read(2, 5_000));
    h.ok(0, acq(3, 1, "w", &["x"]));
    // Session 1 expires on time: lock-delay until 2_000.
    assert_eq!(
        h.engine.due(1_000),
        [Command::ExpireSession {
            session: sid(1),
            deadline: 1_000
        }]
    );
    assert_eq!(
        h.ok(
            1_000,
            Command::ExpireSession {
                session: sid(1),
                deadline: 1_000
            }
        ),
        [lost(1, "r", "x", 1, LostReason::SessionExpired)]
    );
    assert_eq!(h.describe("x").lock_delay_until, Some(2_000));
    // The driver wakes up late, at 2_000, and applies everything due: session 2
    // (due at 1_500) is lost now, which starts a lock-delay until 7_000, and
    // only then comes the end of the first delay.
    let due = h.engine.due(2_000);
    assert_eq!(
        due,
        [
            Command::ExpireSession {
                session: sid(2),
                deadline: 1_500
            },
            Command::EndLockDelay {
                name: "x".into(),
                deadline: 2_000
            },
        ]
    );
    assert_eq!(
        h.ok(2_000, due[0].clone()),
        [lost(2, "r", "x", 2, LostReason::SessionExpired)],
    );
    // The writer must wait for the second lock-delay.
    h.err(2_000, due[1].clone(), EngineError::NotDue);
    assert_eq!(h.describe("x").lock_delay_until, Some(7_000));
    assert_eq!(h.engine.due(6_999), []);
    assert_eq!(
        h.engine.due(7_000),
        [Command::EndLockDelay {
            name: "x".into(),
            deadline: 7_000
        }]
    );
    assert_eq!(
        h.ok(
            7_000,
            Command::EndLockDelay {
                name: "x".into(),
                deadline: 7_000
            }
        ),
        [granted(3, 1, &[3])]
    );
}

#[test]
fn lock_delay_over_a_minute_is_out_of_range() {
    let mut h = Harness::with_sessions(1);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 60_001;
    h.err(
        0,
        a,
        EngineError::OutOfRange {
            what: "lock-delay",
            value_ms: 60_001,
            min_ms: 0,
            max_ms: 60_000,
        },
    );
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 60_000;
    assert_eq!(h.ok(0, a), [granted(1, 1, &[1])]);
}

#[test]
fn a_normal_release_does_not_start_the_lock_delay() {
    let mut h = Harness::with_sessions(2);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 10_000;
    h.ok(0, a);
    h.ok(1, acq(2, 1, "w", &["x"]));
    assert_eq!(h.ok(2, release(1, "o", "x")), [granted(2, 1, &[2])]);
    assert_eq!(h.describe("x").lock_delay_until, None);
}

#[test]
fn force_release_does_not_start_the_lock_delay() {
    let mut h = Harness::with_sessions(2);
    let mut a = acq(1, 1, "o", &["x"]);
    a.lock_delay = 10_000;
    h.ok(0, a);
    h.ok(1, acq(2, 1, "w", &["x"]));
    assert_eq!(
        h.ok(2, Command::ForceRelease { name: "x".into() }),
        [
            lost(1, "o", "x", 1, LostReason::ForceReleased),
            granted(2, 1, &[2])
        ]
    );
    assert_eq!(h.describe("x").lock_delay_until, None);
}

// ----- multi-acquire -----

#[test]
fn multi_acquire_is_all_or_nothing() {
    let mut h = Harness::with_sessions(2);
    h.ok(1, acq(2, 1, "b", &["b"]));
    let before = h.snapshot();
    assert_eq!(
        h.ok(2, with_wait(acq(1, 1, "m", &["a", "b", "c"]), Wait::No)),
        [would_block(1, 1)]
    );
    assert_eq!(h.snapshot(), before, "nothing held, nothing queued");
    assert_eq!(h.ok(3, acq(1, 2, "m", &["a", "b", "c"])), [queued(1, 2, 0)]);
    // Waiting on all three, holding none.
    for name in ["a", "b", "c"] {
        assert_eq!(h.waiters(name), [(sid(1), RequestId(2))], "{name}");
    }
    assert_eq!(h.holders("a"), []);
    assert_eq!(h.session(1).holds, 0);
    // The last blocker goes: granted on all, tokens in the request's name order.
    assert_eq!(h.ok(4, release(2, "b", "b")), [granted(1, 2, &[2, 3, 4])]);
    assert_eq!(h.holders("a"), [(sid(1), "m".into(), 2, 1)]);
    assert_eq!(h.holders("b"), [(sid(1), "m".into(), 3, 1)]);
    assert_eq!(h.holders("c"), [(sid(1), "m".into(), 4, 1)]);
}

#[test]
fn a_multi_waiter_is_granted_when_the_last_blocker_releases() {
    let mut h = Harness::with_sessions(3);
    h.ok(1, acq(1, 1, "x", &["a"]));
    h.ok(1, acq(2, 1, "y", &["b"]));
    assert_eq!(h.ok(2, acq(3, 1, "m", &["a", "b"])), [queued(3, 1, 0)]);
    assert_eq!(h.ok(3, release(1, "x", "a")), []);
    assert_eq!(h.waiters("a"), [(sid(3), RequestId(1))]);
    // Meanwhile a single acquire of a queues behind the multi waiter (FIFO).
    assert_eq!(h.ok(4, acq(1, 2, "x", &["a"])), [queued(1, 2, 1)]);
    assert_eq!(h.ok(5, release(2, "y", "b")), [granted(3, 1, &[3, 4])]);
    assert_eq!(h.ok(6, release(3, "m", "a")), [granted(1, 2, &[5])]);
}

#[test]
fn opposite_orders_never_deadlock() {
    let mut h = Harness::with_sessions(4);
    h.ok(1, acq(3, 1, "x", &["a"]));
    h.ok(1, acq(4, 1, "y", &["b"]));
    assert_eq!(h.ok(2, acq(1, 1, "ab", &["a", "b"])), [queued(1, 1, 0)]);
    assert_eq!(h.ok(3, acq(2, 1, "ba", &["b", "a"])), [queued(2, 1, 1)]);
    assert_eq!(h.ok(4, release(4, "y", "b")), []);
    assert_eq!(h.ok(5, release(3, "x", "a")), [granted(1, 1, &[3, 4])]);
    h.ok(6, release(1, "ab", "a"));
    assert_eq!(h.ok(7, release(1, "ab", "b")), [granted(2, 1, &[5, 6])]);
    // And when both are free, the first takes both and the second waits.
    h.ok(8, release(2, "ba", "a"));
    h.ok(8, release(2, "ba", "b"));
    assert_eq!(
        h.ok(9, acq(1, 2, "ab", &["a", "b"])),
        [granted(1, 2, &[7, 8])]
    );
    assert_eq!(h.ok(9, acq(2, 2, "ba", &["b", "a"])), [queued(2, 2, 0)]);
}

#[test]
fn multi_acquire_argument_errors() {
    let mut h = Harness::with_sessions(1);
    h.err(
        0,
        acq(1, 1, "m", &["a", "b", "a"]),
        EngineError::DuplicateName { name: "a".into() },
    );
    h.err(0, acq(1, 1, "m", &[]), EngineError::NoNames);
}

// ----- names -----

#[test]
fn invalid_names_are_rejected_before_any_state_change() {
    let mut h = Harness::with_sessions(1);
    h.ok(0, acq(1, 1, "o", &["held"]));
    let long = "x".repeat(513);
    let cases: [(&str, NameError); 6] = [
        ("", NameError::Empty),
        ("/a", NameError::EmptySegment),
        ("a/", NameError::EmptySegment),
        ("a//b", NameError::EmptySegment),
        ("a\0b", NameError::Nul),
        (&long, NameError::TooLong { len: 513, max: 512 }),
    ];
    for (bad, error) in cases {
        let invalid = EngineError::InvalidName {
            name: bad.chars().take(64).collect(),
            error,
        };
        // Alone, after a valid free name, after a name the owner holds.
        h.err(1, acq(1, 2, "o", &[bad]), invalid.clone());
        h.err(1, acq(1, 2, "o", &["fresh", bad]), invalid.clone());
        h.err(1, acq(1, 2, "o", &["held", bad]), invalid.clone());
        h.err(
            1,
            release(1, "o", bad),
            EngineError::NotHeld { name: bad.into() },
        );
    }
    assert!(h.engine.describe("fresh").is_none());
    assert_eq!(h.holders("held"), [(sid(1), "o".into(), 1, 1)]);
}

// ----- limits -----

#[test]
fn limits_give_limit_reached_and_out_of_range() {
    let limits = Limits {
        max_waiters_per_lock: 2,
        max_holds_per_session: 2,
        max_names_per_acquire: 3,
        min_ttl: 100,
        max_ttl: 1_000_000,
        max_lock_delay: 60_000,
        ..Limits::default()
    };
    let mut h = Harness::with_limits(limits);
    let out_of_range = |what, value_ms| EngineError::OutOfRange {
        what,
        value_ms,
        min_ms: 100,
        max_ms: 1_000_000,
    };
    let open = |s, ttl| Command::OpenSession {
        session: sid(s),
        ttl,
        info: ClientInfo::default(),
    };
    h.err(0, open(1, 99), out_of_range("session TTL", 99));
    h.err(
        0,
        open(1, 1_000_001),
        out_of_range("session TTL", 1_000_001),
    );
    h.open(0, 1, 100);
    h.open(0, 2, 1_000_000);
    h.open(0, 3, 1_000_000);
    h.open(0, 4, 1_000_000);

    // Holds per session.
    h.ok(1, acq(1, 1, "o", &["a"]));
    h.ok(1, acq(1, 2, "o", &["b"]));
    h.ok(1, acq(1, 3, "o", &["b"])); // re-entry adds no hold
    let holds = EngineError::LimitReached {
        what: "holds per session",
        limit: 2,
    };
    h.err(2, acq(1, 4, "o", &["c"]), holds.clone());
    h.err(2, acq(1, 4, "o", &["b", "c"]), holds.clone());
    // Queued requests count: they become holds when granted.
    h.ok(2, acq(2, 1, "o2", &["q"]));
    assert_eq!(h.ok(2, acq(4, 1, "w", &["q"])), [queued(4, 1, 0)]);
    h.err(2, acq(4, 2, "w", &["r", "s"]), holds.clone());
    h.ok(2, acq(4, 3, "w", &["r"]));
    h.err(2, acq(4, 4, "w", &["s"]), holds.clone());
    h.ok(2, cancel(4, 1));
    h.ok(2, release(4, "w", "r"));
    // Each queued request counts its names, even one the session already
    // queues for (kept as a counter: the check never walks the queue).
    assert_eq!(h.ok(2, acq(4, 5, "w1", &["q"])), [queued(4, 5, 0)]);
    assert_eq!(h.ok(2, acq(4, 6, "w2", &["q"])), [queued(4, 6, 1)]);
    h.err(2, acq(4, 7, "w3", &["q"]), holds.clone());
    // A grant turns a queued name into a hold; a cancel frees its place.
    h.ok(2, cancel(4, 6));
    h.ok(2, release(2, "o2", "q"));
    h.ok(2, acq(4, 8, "w4", &["t"]));
    h.err(2, acq(4, 9, "w5", &["u"]), holds);
    h.ok(2, release(4, "w1", "q"));
    h.ok(2, release(4, "w4", "t"));

    // Waiters per lock.
    assert_eq!(h.ok(3, acq(2, 1, "w", &["a"])), [queued(2, 1, 0)]);
    assert_eq!(h.ok(3, acq(3, 1, "w", &["a"])), [queued(3, 1, 1)]);
    h.err(
        4,
        acq(4, 1, "w", &["a"]),
        EngineError::LimitReached {
            what: "waiters per lock",
            limit: 2,
        },
    );
    // A try-acquire never queues, so the limit does not apply to it.
    assert_eq!(
        h.ok(4, with_wait(acq(4, 1, "w", &["a"]), Wait::No)),
        [would_block(4, 1)]
    );

    // Names per acquire.
    h.err(
        5,
        acq(4, 2, "m", &["p", "q", "r", "s"]),
        EngineError::LimitReached {
            what: "names per acquire",
            limit: 3,
        },
    );

    // Leases.
    let mut a = acq(4, 3, "l", &["l"]);
    a.lease = Some(99);
    h.err(6, a.clone(), out_of_range("lease", 99));
    a.lease = Some(1_000_001);
    h.err(6, a.clone(), out_of_range("lease", 1_000_001));
    a.lease = Some(100);
    h.ok(6, a);
    h.err(7, renew(4, "l", "l", 99), out_of_range("lease", 99));
    h.err(
        7,
        renew(4, "l", "l", 1_000_001),
        out_of_range("lease", 1_000_001),
    );
}

#[test]
fn duplicate_pending_request_ids_are_refused() {
    let mut h = Harness::with_sessions(2);
    h.ok(0, acq(1, 1, "o", &["x"]));
    h.ok(1, acq(2, 7, "w", &["x"]));
    h.err(2, acq(2, 7, "w", &["y"]), EngineError::DuplicateRequest(7));
    // Sessionless waiters are checked too.
    let mut a = acq(0, 9, "t", &["x"]);
    a.lease = Some(100);
    h.ok(3, a.clone());
    h.err(4, a, EngineError::DuplicateRequest(9));
    // A granted request's id may be used again.
    assert_eq!(h.ok(5, acq(1, 1, "o", &["z"])), [granted(1, 1, &[2])]);
}

// ----- errors change nothing -----

#[test]
fn every_error_leaves_the_state_unchanged() {
    let mut h = Harness::with_sessions(3);
    let mut leased = acq(1, 1, "o", &["a"]);
    leased.lease = Some(5_000);
    leased.lock_delay = 1_000;
    h.ok(0, leased);
    h.ok(1, with_mode(acq(2, 1, "r", &["s"]), Mode::Shared));
    h.ok(2, acq(3, 1, "w", &["a", "s"]));
    h.ok(
        3,
        with_mode(acq(1, 2, "p", &["sem"]), Mode::Semaphore { permits: 3 }),
    );
    let before = h.snapshot();

    let mut no_lease = acq(0, 5, "t", &["n"]);
    no_lease.lease = None;
    let mut bad_lease = acq(1, 5, "o", &["n"]);
    bad_lease.lease = Some(1);
    let mut bad_delay = acq(1, 5, "o", &["n"]);
    bad_delay.lock_delay = 60_001;
    let mut not_reentrant = acq(1, 5, "o", &["a"]);
    not_reentrant.reentrant = false;
    let name = |n: &str| n.to_owned();
    let cases: Vec<(Command, EngineError)> = vec![
        (
            acq(9, 5, "o", &["n"]).into_command(),
            EngineError::UnknownSession(9),
        ),
        (acq(1, 5, "o", &[]).into_command(), EngineError::NoNames),
        (
            acq(1, 5, "o", &["n", "a", "n"]).into_command(),
            EngineError::DuplicateName { name: name("n") },
        ),
        (
            acq(3, 1, "w", &["n"]).into_command(),
            EngineError::DuplicateRequest(1),
        ),
        (no_lease.into_command(), EngineError::LeaseRequired),
        (
            bad_lease.into_command(),
            EngineError::OutOfRange {
                what: "lease",
                value_ms: 1,
                min_ms: 10,
                max_ms: 86_400_000,
            },
        ),
        (
            bad_delay.into_command(),
            EngineError::OutOfRange {
                what: "lock-delay",
                value_ms: 60_001,
                min_ms: 0,
                max_ms: 60_000,
            },
        ),
        (
            not_reentrant.into_command(),
            EngineError::AlreadyHeld { name: name("a") },
        ),
        (
            with_mode(acq(1, 5, "o", &["n", "a"]), Mode::Shared).into_command(),
            EngineError::ModeMismatch {
                name: name("a"),
                held: Mode::Exclusive,
                requested: Mode::Shared,
            },
        ),
        (
            with_mode(
                acq(2, 5, "q", &["n", "sem"]),
                Mode::Semaphore { permits: 2 },
            )
            .into_command(),
            EngineError::PermitMismatch {
                name: name("sem"),
                existing: 3,
                requested: 2,
            },
        ),
        (
            with_mode(acq(2, 5, "q", &["n"]), Mode::Semaphore { permits: 0 }).into_command(),
            EngineError::ZeroPermits,
        ),
        (
            release(2, "o", "a"),
            EngineError::NotOwner { name: name("a") },
        ),
        (
            release(1, "o", "n"),
            EngineError::NotHeld { name: name("n") },
        ),
        (
            release_token(1, "o", "a", 99),
            EngineError::NotOwner { name: name("a") },
        ),
        (
            renew(1, "o", "a", 1),
            EngineError::OutOfRange {
                what: "lease",
                value_ms: 1,
                min_ms: 10,
                max_ms: 86_400_000,
            },
        ),
        (
            renew(2, "o", "a", 100),
            EngineError::NotOwner { name: name("a") },
        ),
        (cancel(1, 77), EngineError::UnknownRequest(77)),
        (cancel(9, 1), EngineError::UnknownRequest(1)),
        (
            Command::Heartbeat { session: sid(9) },
            EngineError::UnknownSession(9),
        ),
        (
            Command::CloseSession { session: sid(9) },
            EngineError::UnknownSession(9),
        ),
        (
            Command::ExpireSession {
                session: sid(9),
                deadline: 0,
            },
            EngineError::UnknownSession(9),
        ),
        (
            Command::OpenSession {
                session: sid(1),
                ttl: TTL,
                info: client(1),
            },
            EngineError::SessionExists(1),
        ),
        (
            Command::OpenSession {
                session: sid(8),
                ttl: 1,
                info: client(8),
            },
            EngineError::OutOfRange {
                what: "session TTL",
                value_ms: 1,
                min_ms: 10,
                max_ms: 86_400_000,
            },
        ),
        (
            Command::ForceRelease { name: name("n") },
            EngineError::NotHeld { name: name("n") },
        ),
    ];
    for (command, error) in cases {
        h.err(4, command, error);
    }
    assert_eq!(h.snapshot(), before);
}

trait IntoCommand {
    fn into_command(self) -> Command;
}

impl IntoCommand for Acquire {
    fn into_command(self) -> Command {
        Command::Acquire(self)
    }
}

// ----- force release -----

#[test]
fn force_release_drops_every_holder_and_grants_the_next() {
    let mut h = Harness::with_sessions(3);
    let read = |s| with_mode(acq(s, 1, "r", &["x"]), Mode::Shared);
    h.ok(0, read(1));
    let mut leased = read(2);
    leased.lease = Some(1_000);
    h.ok(1, leased);
    h.ok(2, acq(3, 1, "w", &["x"]));
    assert_eq!(
        h.ok(3, Command::ForceRelease { name: "x".into() }),
        [
            lost(1, "r", "x", 1, LostReason::ForceReleased),
            lost(2, "r", "x", 2, LostReason::ForceReleased),
            granted(3, 1, &[3]),
        ]
    );
    assert_eq!(h.holders("x"), [(sid(3), "w".into(), 3, 1)]);
    assert_eq!(h.session(1).holds, 0);
    assert_eq!(
        h.engine.next_deadline(),
        Some(TTL),
        "the lease timer is gone"
    );
    // Nothing held: an error.
    h.err(
        4,
        Command::ForceRelease { name: "y".into() },
        EngineError::NotHeld { name: "y".into() },
    );
}

// ----- inspection -----

#[test]
fn describe_shows_holders_and_waiters_with_their_metadata() {
    let mut h = Harness::with_sessions(3);
    let mut a = with_mode(acq(1, 1, "reader-1", &["orders/42"]), Mode::Shared);
    a.lease = Some(5_000);
    h.ok(100, a);
    h.ok(
        150,
        with_mode(acq(2, 1, "reader-2", &["orders/42"]), Mode::Shared),
    );
    h.ok(
        160,
        with_mode(acq(2, 2, "reader-2", &["orders/42"]), Mode::Shared),
    );
    h.ok(
        200,
        with_wait(acq(3, 7, "writer", &["orders/42"]), Wait::Until(9_000)),
    );
    h.ok(
        300,
        with_mode(acq(1, 2, "late", &["orders/42"]), Mode::Shared),
    );

    let info = h.describe("orders/42");
    assert_eq!(
        info,
        LockInfo {
            name: "orders/42".into(),
            holders: vec![
                HolderInfo {
                    session: sid(1),
                    owner: "reader-1".into(),
                    lock_by: client(1),
                    lock_time: 100,
                    fencing_token: 1,
                    lease_until: Some(5_100),
                    mode: Mode::Shared,
                    hold_count: 1,
                },
                HolderInfo {
                    session: sid(2),
                    owner: "reader-2".into(),
                    lock_by: client(2),
                    lock_time: 150,
                    fencing_token: 2,
                    lease_until: None,
                    mode: Mode::Shared,
                    hold_count: 2,
                },
            ],
            waiters: vec![
                WaiterInfo {
                    session: sid(3),
                    request: RequestId(7),
                    owner: "writer".into(),
                    mode: Mode::Exclusive,
                    since: 200,
                    deadline: Some(9_000),
                },
                WaiterInfo {
                    session: sid(1),
                    request: RequestId(2),
                    owner: "late".into(),
                    mode: Mode::Shared,
                    since: 300,
                    deadline: None,
                },
            ],
            lock_delay_until: None,
        }
    );
    assert_eq!(h.engine.list(""), [info]);
    assert_eq!(h.session(1).holds, 1);
    assert_eq!(h.session(1).info, client(1));
    assert_eq!(h.session(3).holds, 0);
    assert!(h.engine.describe("orders/43").is_none());
    assert!(h.engine.describe("orders").is_none());
}

#[test]
fn a_sessionless_holder_has_no_lock_by() {
    let mut h = Harness::new();
    let mut a = acq(0, 1, "ttl", &["x"]);
    a.lease = Some(100);
    h.ok(0, a);
    assert_eq!(h.describe("x").holders[0].lock_by, ClientInfo::default());
}

#[test]
fn list_is_sorted_by_name_and_filtered_by_prefix() {
    let mut h = Harness::with_sessions(1);
    for (i, name) in ["b/1", "a/2", "c", "a/1", "ab", "a/10"]
        .into_iter()
        .enumerate()
    {
        h.ok(0, acq(1, i as u64, "o", &[name]));
    }
    let names = |prefix: &str| -> Vec<String> {
        h.engine.list(prefix).into_iter().map(|l| l.name).collect()
    };
    assert_eq!(names(""), ["a/1", "a/10", "a/2", "ab", "b/1", "c"]);
    assert_eq!(names("a/"), ["a/1", "a/10", "a/2"]);
    assert_eq!(names("a"), ["a/1", "a/10", "a/2", "ab"]);
    assert_eq!(names("c"), ["c"]);
    assert_eq!(names("d"), Vec::<String>::new());
    let sessions: Vec<_> = h
        .engine
        .sessions()
        .into_iter()
        .map(|s| (s.session, s.holds))
        .collect();
    assert_eq!(sessions, [(sid(1), 6)]);
}

#[test]
fn sessions_are_listed_sorted_by_id() {
    let mut h = Harness::new();
    for s in [5, 1, 3] {
        h.open(s * 10, s, TTL);
    }
    let listed: Vec<_> = h
        .engine
        .sessions()
        .into_iter()
        .map(|s| (s.session, s.expires_at, s.ttl))
        .collect();
    assert_eq!(
        listed,
        [
            (sid(1), 10 + TTL, TTL),
            (sid(3), 30 + TTL, TTL),
            (sid(5), 50 + TTL, TTL)
        ]
    );
}
