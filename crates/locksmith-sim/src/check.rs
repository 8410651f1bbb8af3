//! The checks every run's history must pass, per lock:
//!
//! - **linearizability** against [`LockSpec`], a sequential lock that may
//!   be exclusive, read-write or a semaphore (each acquire says what it
//!   wants: [`Want`]), with stateright's `LinearizabilityTester` (a
//!   well-kept checker, the one the Stateright model checker uses for its
//!   own actor systems); operations whose outcome the client never learned
//!   stay pending: they may or may not have taken effect;
//! - **fencing tokens rise**: a grant's token is above every token whose
//!   grant a client had seen before this acquire began (grants that overlap
//!   in time, as two readers', may be seen in either order);
//! - **only holders that fit together**: from the moment a client sees its
//!   grant until it starts to release or is told the hold is lost, nobody
//!   else sees a grant that may not stand beside it (a second exclusive
//!   holder, a writer beside readers, a permit past the semaphore's count).
//!   Being told is what makes a lost hold safe, so a hold taken away without
//!   its holder told breaks this too;
//! - **leases are kept**: a hold granted or extended with a lease of `L` by
//!   a request sent at `s` is nobody else's before `s + L` (less the drift
//!   the clocks may have), unless its holder gave it up or lost it with its
//!   session. This holds the server to its answer even where the client
//!   has stopped trusting the hold already: a client counts a lease from
//!   before its request and gives the hold up when that runs out, so an
//!   extension answered late changes nothing the client does, and only
//!   this rule sees a server that takes the hold away right after saying
//!   it extended it.

use std::collections::BTreeMap;
use std::time::Duration;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::history::{Event, Kind, Op, Ret, Want};

/// One lock, as one process would keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LockSpec {
    /// The holders: client, token and what each was granted.
    holders: Vec<(u32, u64, Want)>,
    /// The last token granted.
    last_token: u64,
}

impl LockSpec {
    /// Ends the hold `token` of `client`, if it is one.
    fn end(&mut self, client: u32, token: u64) -> bool {
        let before = self.holders.len();
        self.holders
            .retain(|&(holder, held, _)| (holder, held) != (client, token));
        self.holders.len() != before
    }

    fn holds(&self, client: u32, token: u64) -> bool {
        self.holders
            .iter()
            .any(|&(holder, held, _)| (holder, held) == (client, token))
    }
}

/// An operation with the client that invoked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientOp {
    /// Who invoked it.
    pub client: u32,
    /// What it is.
    pub op: Op,
}

impl SequentialSpec for LockSpec {
    type Op = ClientOp;
    type Ret = Ret;

    /// What the operation does when its outcome is unknown (pending at
    /// the end): an acquire may have been granted and then released by its
    /// cancellation, which leaves the lock as it was; a release did its
    /// work if its client held the lock; an extension leaves the holders as
    /// they were.
    fn invoke(&mut self, op: &ClientOp) -> Ret {
        match op.op {
            Op::Acquire { .. } => Ret::TimedOut,
            Op::Extend { token, .. } if self.holds(op.client, token) => Ret::Extended,
            Op::Extend { .. } => Ret::NotHeld,
            Op::Release { token } | Op::Lost { token, .. } | Op::Drop { token } => {
                self.end(op.client, token);
                Ret::NotHeld
            }
        }
    }

    fn is_valid_step(&mut self, op: &ClientOp, ret: &Ret) -> bool {
        if !within_budget() {
            return false;
        }
        match (op.op, *ret) {
            (Op::Acquire { want, .. }, Ret::Granted { token }) => {
                let held: Vec<Want> = self.holders.iter().map(|&(_, _, want)| want).collect();
                if !want.fits_beside(&held) || token <= self.last_token {
                    return false;
                }
                self.holders.push((op.client, token, want));
                self.last_token = token;
                true
            }
            // A wait may run out while the lock is free for a moment (the
            // grant in flight to someone else): liveness, not safety.
            (Op::Acquire { .. }, Ret::TimedOut) => true,
            (Op::Release { token }, Ret::Released) => self.end(op.client, token),
            (Op::Extend { token, .. }, Ret::Extended) => self.holds(op.client, token),
            // Refused because the hold was gone: its session or lease may
            // have ended just now, and the client is told so by this
            // answer.
            (Op::Release { token } | Op::Extend { token, .. }, Ret::NotHeld)
            | (Op::Lost { token, .. }, Ret::Noted) => {
                self.end(op.client, token);
                true
            }
            _ => false,
        }
    }
}

/// Steps the tester may try on one lock's history. Its search tries every
/// order of concurrent operations, which a history that is not
/// linearizable makes exponential: past the budget every step fails, the
/// search unwinds at once, and the check says it could not decide.
const STEP_BUDGET: u64 = 2_000_000;

thread_local! {
    static STEPS_LEFT: std::cell::Cell<u64> = const { std::cell::Cell::new(STEP_BUDGET) };
}

fn within_budget() -> bool {
    STEPS_LEFT.with(|left| match left.get() {
        0 => false,
        n => {
            left.set(n - 1);
            true
        }
    })
}

/// A broken rule, with the events of its lock that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which rule.
    pub rule: &'static str,
    /// Which lock.
    pub lock: usize,
    /// What broke it.
    pub detail: String,
}

/// Checks `events` (the whole run, in order); every violation found.
/// `clock_skew`: how far each member's clock may be off the simulated
/// one, either way.
pub fn check(events: &[Event], clock_skew: Duration) -> Vec<Violation> {
    let mut by_lock: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_lock.entry(event.lock).or_default().push(event);
    }
    let mut violations = Vec::new();
    for (&lock, events) in &by_lock {
        violations.extend(linearizable(lock, events));
        violations.extend(tokens_rise(lock, events));
        violations.extend(holders_fit_together(lock, events));
        violations.extend(leases_kept(lock, events, clock_skew));
    }
    violations
}

fn linearizable(lock: usize, events: &[&Event]) -> Option<Violation> {
    // An acquire whose outcome is unknown changes nothing the checker can
    // see (granted, its cancellation released it): left out, it does not
    // multiply the orders the tester tries.
    // A thread's last event is the only one that can be pending.
    // An acquire that timed out is a step the spec always allows and that
    // changes nothing, so it fits into any order: left out too, or the
    // waits that run out beside readers and permits make the search
    // exponential in them.
    let mut last_of_thread = BTreeMap::new();
    let mut timed_out = std::collections::BTreeSet::new();
    let mut invoked_at = BTreeMap::new();
    for (index, event) in events.iter().enumerate() {
        last_of_thread.insert(event.thread, index);
        match event.kind {
            Kind::Invoke(_) => {
                invoked_at.insert(event.thread, index);
            }
            Kind::Return(Ret::TimedOut) => {
                timed_out.extend(invoked_at.remove(&event.thread));
                timed_out.insert(index);
            }
            Kind::Return(_) => {
                invoked_at.remove(&event.thread);
            }
        }
    }
    STEPS_LEFT.with(|left| left.set(STEP_BUDGET));
    let mut tester = LinearizabilityTester::new(LockSpec::default());
    for (index, event) in events.iter().enumerate() {
        let pending = last_of_thread.get(&event.thread) == Some(&index);
        if timed_out.contains(&index) {
            continue;
        }
        let recorded = match &event.kind {
            Kind::Invoke(Op::Acquire { .. }) if pending => continue,
            // A lost hold's guard dropped: its release in the background
            // changes nothing the spec sees (the loss ended the hold).
            Kind::Invoke(Op::Drop { .. }) => continue,
            Kind::Invoke(op) => tester
                .on_invoke(
                    event.thread,
                    ClientOp {
                        client: event.client,
                        op: *op,
                    },
                )
                .map(|_| ()),
            Kind::Return(ret) => tester.on_return(event.thread, *ret).map(|_| ()),
        };
        if let Err(error) = recorded {
            return Some(Violation {
                rule: "well-formed history",
                lock,
                detail: error,
            });
        }
    }
    if tester.is_consistent() {
        return None;
    }
    let detail = if STEPS_LEFT.with(|left| left.get()) == 0 {
        format!("not decided within {STEP_BUDGET} steps of the search: counted as failed")
    } else {
        "no order of these operations explains what the clients saw".into()
    };
    Some(Violation {
        rule: "linearizable",
        lock,
        detail,
    })
}

fn tokens_rise(lock: usize, events: &[&Event]) -> Option<Violation> {
    // The highest token seen granted so far, and for each acquire in
    // flight the highest seen when it began, with that grant's event.
    let mut highest: Option<(u64, &Event)> = None;
    let mut at_invoke: BTreeMap<u64, Option<(u64, &Event)>> = BTreeMap::new();
    for event in events {
        match event.kind {
            Kind::Invoke(Op::Acquire { .. }) => {
                at_invoke.insert(event.thread, highest);
            }
            Kind::Return(Ret::Granted { token }) => {
                if let Some(Some((before, earlier))) = at_invoke.remove(&event.thread) {
                    if token <= before {
                        return Some(Violation {
                            rule: "tokens rise",
                            lock,
                            detail: format!(
                                "token {token}, asked for after token {before} was seen:\n  \
                                 {earlier}\n  {event}"
                            ),
                        });
                    }
                }
                if highest.is_none_or(|(top, _)| token > top) {
                    highest = Some((token, event));
                }
            }
            _ => {}
        }
    }
    None
}

fn holders_fit_together(lock: usize, events: &[&Event]) -> Option<Violation> {
    // The holders the clients believe in, each from its grant until its
    // release starts or it is told of the loss (or told by a refused
    // extension); and each thread's operation in flight.
    let mut holders: Vec<(u32, u64, Want, &Event)> = Vec::new();
    let mut in_flight: BTreeMap<u64, Op> = BTreeMap::new();
    for event in events {
        let op = match event.kind {
            Kind::Invoke(op) => {
                in_flight.insert(event.thread, op);
                None
            }
            Kind::Return(_) => in_flight.remove(&event.thread),
        };
        match (event.kind.clone(), op) {
            (Kind::Return(Ret::Granted { token }), op) => {
                let want = match op {
                    Some(Op::Acquire { want, .. }) => want,
                    _ => Want::Exclusive,
                };
                let held: Vec<Want> = holders.iter().map(|&(_, _, want, _)| want).collect();
                if !want.fits_beside(&held) {
                    let beside = holders
                        .iter()
                        .map(|(client, held, want, since)| {
                            format!("client {client} holding token {held} ({want:?}):\n    {since}")
                        })
                        .collect::<Vec<_>>()
                        .join("\n  ");
                    return Some(Violation {
                        rule: "only holders that fit together",
                        lock,
                        detail: format!(
                            "client {} was granted token {token} ({want:?}) beside holders untold \
                             of any loss:\n  {beside}\n  {event}",
                            event.client
                        ),
                    });
                }
                holders.push((event.client, token, want, event));
            }
            (Kind::Invoke(Op::Release { token } | Op::Lost { token, .. }), _)
            | (Kind::Return(Ret::NotHeld), Some(Op::Extend { token, .. })) => {
                holders.retain(|&(client, held, _, _)| (client, held) != (event.client, token));
            }
            _ => {}
        }
    }
    None
}

/// How much earlier than `s + lease` a lease may end, in simulated time:
/// the drift the client allows for (Redlock's `lease × 1% + 2 ms`, module
/// `keeper` of the client), the members' clocks apart by up to twice
/// `clock_skew` (one stamps the deadline, another decides the expiry), and
/// the millisecond the server's clock is read in.
fn lease_margin(lease: Duration, clock_skew: Duration) -> Duration {
    lease / 100 + Duration::from_millis(3) + clock_skew * 2
}

fn leases_kept(lock: usize, events: &[&Event], clock_skew: Duration) -> Option<Violation> {
    // Each thread's operation in flight, with the event that invoked it;
    // and each lease the server answered for, until when it must stand.
    struct Promise<'a> {
        client: u32,
        token: u64,
        want: Want,
        until: Duration,
        since: &'a Event,
    }
    let mut in_flight: BTreeMap<u64, (Op, &Event)> = BTreeMap::new();
    let mut promises: Vec<Promise> = Vec::new();
    // What each hold was granted as; the holds given up (released,
    // dropped or lost with their session), which no later answer revives.
    let mut granted: BTreeMap<(u32, u64), Want> = BTreeMap::new();
    let mut given_up = std::collections::BTreeSet::new();
    for &event in events {
        promises.retain(|p| p.until > event.at);
        let op = match event.kind {
            Kind::Invoke(op) => {
                in_flight.insert(event.thread, (op, event));
                None
            }
            Kind::Return(_) => in_flight.remove(&event.thread),
        };
        let lease_from = |invoked: &Event, lease_ms: u64| {
            let lease = Duration::from_millis(lease_ms);
            (invoked.at + lease).saturating_sub(lease_margin(lease, clock_skew))
        };
        match (&event.kind, op) {
            (Kind::Return(Ret::Granted { token }), op) => {
                let want = match op {
                    Some((Op::Acquire { want, .. }, _)) => want,
                    _ => Want::Exclusive,
                };
                if let Some(kept) = promises.iter().find(|p| {
                    (p.client, p.token) != (event.client, *token) && !want.fits_beside(&[p.want])
                }) {
                    return Some(Violation {
                        rule: "leases are kept",
                        lock,
                        detail: format!(
                            "client {} was granted token {token} ({want:?}) while the lease of \
                             client {}'s token {} was to stand until {:.3}s:\n  {}\n  {event}",
                            event.client,
                            kept.client,
                            kept.token,
                            kept.until.as_secs_f64(),
                            kept.since,
                        ),
                    });
                }
                granted.insert((event.client, *token), want);
                if let Some((
                    Op::Acquire {
                        lease_ms: Some(lease_ms),
                        ..
                    },
                    invoked,
                )) = op
                {
                    promises.push(Promise {
                        client: event.client,
                        token: *token,
                        want,
                        until: lease_from(invoked, lease_ms),
                        since: event,
                    });
                }
            }
            (Kind::Return(Ret::Extended), Some((Op::Extend { token, lease_ms }, invoked))) => {
                // The grant's own promise may have run out already: the
                // extension's answer may come after the client stopped
                // trusting the hold.
                let until = lease_from(invoked, lease_ms);
                let held = (event.client, token);
                promises.retain(|p| (p.client, p.token) != held || p.until > until);
                if !given_up.contains(&held)
                    && !promises.iter().any(|p| (p.client, p.token) == held)
                {
                    promises.push(Promise {
                        client: event.client,
                        token,
                        want: granted.get(&held).copied().unwrap_or(Want::Exclusive),
                        until,
                        since: event,
                    });
                }
            }
            (Kind::Invoke(Op::Release { token } | Op::Drop { token }), _)
            | (
                Kind::Invoke(Op::Lost {
                    token,
                    with_session: true,
                }),
                _,
            ) => {
                given_up.insert((event.client, *token));
                promises.retain(|p| (p.client, p.token) != (event.client, *token));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: u64, client: u32, kind: Kind) -> Event {
        Event {
            at: Duration::from_millis(at),
            client,
            thread: u64::from(client),
            lock: 0,
            kind,
        }
    }

    fn acquire() -> Kind {
        acquire_as(Want::Exclusive)
    }

    fn acquire_as(want: Want) -> Kind {
        Kind::Invoke(Op::Acquire {
            want,
            lease_ms: None,
        })
    }

    /// Every check passes on `events`.
    fn assert_passes(events: &[Event]) {
        let violations = check(events, Duration::ZERO);
        assert!(violations.is_empty(), "{violations:?}");
    }

    fn rules(events: &[Event]) -> Vec<&'static str> {
        check(events, Duration::ZERO)
            .iter()
            .map(|v| v.rule)
            .collect()
    }

    fn granted(token: u64) -> Kind {
        Kind::Return(Ret::Granted { token })
    }

    #[test]
    fn a_clean_handover_passes() {
        let events = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(2, 2, acquire()),
            event(3, 1, Kind::Invoke(Op::Release { token: 1 })),
            event(4, 2, granted(2)),
            event(5, 1, Kind::Return(Ret::Released)),
        ];
        assert_passes(&events);
    }

    #[test]
    fn a_second_holder_before_the_first_is_told_is_caught_by_every_rule_that_sees_it() {
        let events = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(2, 2, acquire()),
            event(3, 2, granted(2)),
            event(
                4,
                1,
                Kind::Invoke(Op::Lost {
                    token: 1,
                    with_session: false,
                }),
            ),
            event(4, 1, Kind::Return(Ret::Noted)),
        ];
        let rules: Vec<_> = check(&events, Duration::ZERO)
            .iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(rules, ["linearizable", "only holders that fit together"]);
    }

    #[test]
    fn a_token_that_does_not_rise_is_caught() {
        let events = [
            event(0, 1, acquire()),
            event(1, 1, granted(5)),
            event(2, 1, Kind::Invoke(Op::Release { token: 5 })),
            event(3, 1, Kind::Return(Ret::Released)),
            event(4, 2, acquire()),
            event(5, 2, granted(5)),
        ];
        let rules: Vec<_> = check(&events, Duration::ZERO)
            .iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(rules, ["linearizable", "tokens rise"]);
    }

    #[test]
    fn a_release_refused_because_the_hold_ended_meanwhile_passes() {
        let events = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(2, 1, Kind::Invoke(Op::Release { token: 1 })),
            event(3, 2, acquire()),
            event(4, 2, granted(2)),
            event(5, 1, Kind::Return(Ret::NotHeld)),
        ];
        assert_passes(&events);
    }

    #[test]
    fn a_pending_release_may_have_freed_the_lock() {
        let events = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(2, 1, Kind::Invoke(Op::Release { token: 1 })),
            // client 1 never learns the outcome
            event(4, 2, acquire()),
            event(5, 2, granted(2)),
        ];
        assert_passes(&events);
    }

    #[test]
    fn readers_together_pass_whichever_grant_is_seen_first() {
        let events = [
            event(0, 1, acquire_as(Want::Shared)),
            event(1, 2, acquire_as(Want::Shared)),
            event(2, 2, granted(2)),
            event(3, 1, granted(1)),
            event(4, 1, Kind::Invoke(Op::Release { token: 1 })),
            event(5, 1, Kind::Return(Ret::Released)),
            event(6, 2, Kind::Invoke(Op::Release { token: 2 })),
            event(7, 2, Kind::Return(Ret::Released)),
            event(8, 3, acquire_as(Want::Exclusive)),
            event(9, 3, granted(3)),
        ];
        assert_passes(&events);
    }

    #[test]
    fn a_writer_beside_a_reader_is_caught() {
        let events = [
            event(0, 1, acquire_as(Want::Shared)),
            event(1, 1, granted(1)),
            event(2, 2, acquire_as(Want::Exclusive)),
            event(3, 2, granted(2)),
        ];
        assert_eq!(
            rules(&events),
            ["linearizable", "only holders that fit together"]
        );
    }

    #[test]
    fn a_permit_past_the_semaphores_count_is_caught() {
        let permit = || acquire_as(Want::Permit { of: 2 });
        let events = [
            event(0, 1, permit()),
            event(1, 1, granted(1)),
            event(2, 2, permit()),
            event(3, 2, granted(2)),
            event(4, 3, permit()),
            event(5, 3, granted(3)),
        ];
        assert_eq!(
            rules(&events),
            ["linearizable", "only holders that fit together"]
        );
        assert_passes(&events[..4]);
    }

    #[test]
    fn an_extension_counts_only_while_the_hold_stands() {
        let extend = |token| {
            Kind::Invoke(Op::Extend {
                token,
                lease_ms: 1000,
            })
        };
        let refused = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(2, 1, extend(1)),
            event(3, 1, Kind::Return(Ret::NotHeld)),
            event(4, 2, acquire()),
            event(5, 2, granted(2)),
        ];
        assert_passes(&refused);
        let after_handover = [
            event(0, 1, acquire()),
            event(1, 1, granted(1)),
            event(
                2,
                1,
                Kind::Invoke(Op::Lost {
                    token: 1,
                    with_session: false,
                }),
            ),
            event(2, 1, Kind::Return(Ret::Noted)),
            event(3, 2, acquire()),
            event(4, 2, granted(2)),
            event(5, 1, extend(1)),
            event(6, 1, Kind::Return(Ret::Extended)),
        ];
        assert_eq!(rules(&after_handover), ["linearizable"]);
    }

    #[test]
    fn a_token_below_one_seen_before_the_acquire_is_caught() {
        let events = [
            event(0, 1, acquire_as(Want::Shared)),
            event(1, 1, granted(5)),
            event(2, 2, acquire_as(Want::Shared)),
            event(3, 2, granted(4)),
        ];
        assert_eq!(rules(&events), ["linearizable", "tokens rise"]);
    }

    /// A hold granted with a lease of 500 ms at 0 ms, extended by a request
    /// sent at 300 ms whose answer comes after the client gave the hold up
    /// at the first lease's end.
    fn extended_late(lost_with_session: bool, next_grant_at: u64) -> Vec<Event> {
        let leased = Kind::Invoke(Op::Acquire {
            want: Want::Exclusive,
            lease_ms: Some(500),
        });
        let mut extension = event(
            300,
            1,
            Kind::Invoke(Op::Extend {
                token: 1,
                lease_ms: 500,
            }),
        );
        extension.thread = 10;
        let mut answer = event(520, 1, Kind::Return(Ret::Extended));
        answer.thread = 10;
        vec![
            event(0, 1, leased),
            event(1, 1, granted(1)),
            event(100, 2, acquire()),
            extension,
            event(
                495,
                1,
                Kind::Invoke(Op::Lost {
                    token: 1,
                    with_session: lost_with_session,
                }),
            ),
            event(495, 1, Kind::Return(Ret::Noted)),
            answer,
            event(next_grant_at, 2, granted(2)),
        ]
    }

    #[test]
    fn a_lease_extended_late_is_kept_for_its_whole_term() {
        assert_eq!(rules(&extended_late(false, 530)), ["leases are kept"]);
        let after = extended_late(false, 800);
        assert_passes(&after);
    }

    #[test]
    fn a_lease_lost_with_its_session_is_not_kept() {
        let events = extended_late(true, 530);
        assert_passes(&events);
    }
}
