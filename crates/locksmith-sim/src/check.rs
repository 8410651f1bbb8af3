//! The checks every run's history must pass, per lock:
//!
//! - **linearizability** against [`LockSpec`], a sequential exclusive lock,
//!   with stateright's `LinearizabilityTester` (a well-kept checker, the
//!   one the Stateright model checker uses for its own actor systems);
//!   operations whose outcome the client never learned stay pending: they
//!   may or may not have taken effect;
//! - **fencing tokens strictly rise** in the order grants were seen;
//! - **no two holders at once**: from the moment a client sees its grant
//!   until it starts to release or is told the hold is lost, nobody else
//!   sees a grant of the same lock. Being told is what makes a lost hold
//!   safe, so a hold taken away without its holder told breaks this too.

use std::collections::BTreeMap;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::history::{Event, Kind, Op, Ret};

/// One exclusive lock, as one process would keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LockSpec {
    /// The holder and its token.
    holder: Option<(u32, u64)>,
    /// The last token granted.
    last_token: u64,
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
    /// work if its client held the lock.
    fn invoke(&mut self, op: &ClientOp) -> Ret {
        match op.op {
            Op::Acquire => Ret::TimedOut,
            Op::Release { token } | Op::Lost { token } => {
                if self.holder == Some((op.client, token)) {
                    self.holder = None;
                }
                Ret::NotHeld
            }
        }
    }

    fn is_valid_step(&mut self, op: &ClientOp, ret: &Ret) -> bool {
        if !within_budget() {
            return false;
        }
        match (op.op, *ret) {
            (Op::Acquire, Ret::Granted { token }) => {
                if self.holder.is_some() || token <= self.last_token {
                    return false;
                }
                self.holder = Some((op.client, token));
                self.last_token = token;
                true
            }
            // A wait may run out while the lock is free for a moment (the
            // grant in flight to someone else): liveness, not safety.
            (Op::Acquire, Ret::TimedOut) => true,
            (Op::Release { token }, Ret::Released) => {
                if self.holder != Some((op.client, token)) {
                    return false;
                }
                self.holder = None;
                true
            }
            // Refused because the hold was gone: its session or lease may
            // have ended just now, and the client is told so by this
            // answer.
            (Op::Release { token }, Ret::NotHeld) => {
                if self.holder == Some((op.client, token)) {
                    self.holder = None;
                }
                true
            }
            (Op::Lost { token }, Ret::Noted) => {
                if self.holder == Some((op.client, token)) {
                    self.holder = None;
                }
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
pub fn check(events: &[Event]) -> Vec<Violation> {
    let mut by_lock: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_lock.entry(event.lock).or_default().push(event);
    }
    let mut violations = Vec::new();
    for (&lock, events) in &by_lock {
        violations.extend(linearizable(lock, events));
        violations.extend(tokens_rise(lock, events));
        violations.extend(one_holder_at_a_time(lock, events));
    }
    violations
}

fn linearizable(lock: usize, events: &[&Event]) -> Option<Violation> {
    // An acquire whose outcome is unknown changes nothing the checker can
    // see (granted, its cancellation released it): left out, it does not
    // multiply the orders the tester tries.
    // A thread's last event is the only one that can be pending.
    let mut last_of_thread = BTreeMap::new();
    for (index, event) in events.iter().enumerate() {
        last_of_thread.insert(event.thread, index);
    }
    STEPS_LEFT.with(|left| left.set(STEP_BUDGET));
    let mut tester = LinearizabilityTester::new(LockSpec::default());
    for (index, event) in events.iter().enumerate() {
        let pending = last_of_thread.get(&event.thread) == Some(&index);
        let recorded = match &event.kind {
            Kind::Invoke(Op::Acquire) if pending => continue,
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
    let mut last: Option<(u64, &Event)> = None;
    for event in events {
        if let Kind::Return(Ret::Granted { token }) = event.kind {
            if let Some((before, earlier)) = last {
                if token <= before {
                    return Some(Violation {
                        rule: "tokens strictly rise",
                        lock,
                        detail: format!("token {token} after {before}:\n  {earlier}\n  {event}"),
                    });
                }
            }
            last = Some((token, event));
        }
    }
    None
}

fn one_holder_at_a_time(lock: usize, events: &[&Event]) -> Option<Violation> {
    // The holder the clients believe in: from its grant until its release
    // starts or it is told of the loss.
    let mut holder: Option<(u32, u64, &Event)> = None;
    for event in events {
        match event.kind {
            Kind::Return(Ret::Granted { token }) => {
                if let Some((client, held, since)) = holder {
                    return Some(Violation {
                        rule: "one holder at a time",
                        lock,
                        detail: format!(
                            "client {} was granted token {token} while client {client} still \
                             held token {held}, untold of any loss:\n  {since}\n  {event}",
                            event.client
                        ),
                    });
                }
                holder = Some((event.client, token, event));
            }
            Kind::Invoke(Op::Release { token }) | Kind::Invoke(Op::Lost { token })
                if holder
                    .is_some_and(|(client, held, _)| client == event.client && held == token) =>
            {
                holder = None;
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    fn granted(token: u64) -> Kind {
        Kind::Return(Ret::Granted { token })
    }

    #[test]
    fn a_clean_handover_passes() {
        let events = [
            event(0, 1, Kind::Invoke(Op::Acquire)),
            event(1, 1, granted(1)),
            event(2, 2, Kind::Invoke(Op::Acquire)),
            event(3, 1, Kind::Invoke(Op::Release { token: 1 })),
            event(4, 2, granted(2)),
            event(5, 1, Kind::Return(Ret::Released)),
        ];
        assert!(check(&events).is_empty(), "{:?}", check(&events));
    }

    #[test]
    fn a_second_holder_before_the_first_is_told_is_caught_by_every_rule_that_sees_it() {
        let events = [
            event(0, 1, Kind::Invoke(Op::Acquire)),
            event(1, 1, granted(1)),
            event(2, 2, Kind::Invoke(Op::Acquire)),
            event(3, 2, granted(2)),
            event(4, 1, Kind::Invoke(Op::Lost { token: 1 })),
            event(4, 1, Kind::Return(Ret::Noted)),
        ];
        let rules: Vec<_> = check(&events).iter().map(|v| v.rule).collect();
        assert_eq!(rules, ["linearizable", "one holder at a time"]);
    }

    #[test]
    fn a_token_that_does_not_rise_is_caught() {
        let events = [
            event(0, 1, Kind::Invoke(Op::Acquire)),
            event(1, 1, granted(5)),
            event(2, 1, Kind::Invoke(Op::Release { token: 5 })),
            event(3, 1, Kind::Return(Ret::Released)),
            event(4, 2, Kind::Invoke(Op::Acquire)),
            event(5, 2, granted(5)),
        ];
        let rules: Vec<_> = check(&events).iter().map(|v| v.rule).collect();
        assert_eq!(rules, ["linearizable", "tokens strictly rise"]);
    }

    #[test]
    fn a_release_refused_because_the_hold_ended_meanwhile_passes() {
        let events = [
            event(0, 1, Kind::Invoke(Op::Acquire)),
            event(1, 1, granted(1)),
            event(2, 1, Kind::Invoke(Op::Release { token: 1 })),
            event(3, 2, Kind::Invoke(Op::Acquire)),
            event(4, 2, granted(2)),
            event(5, 1, Kind::Return(Ret::NotHeld)),
        ];
        assert!(check(&events).is_empty(), "{:?}", check(&events));
    }

    #[test]
    fn a_pending_release_may_have_freed_the_lock() {
        let events = [
            event(0, 1, Kind::Invoke(Op::Acquire)),
            event(1, 1, granted(1)),
            event(2, 1, Kind::Invoke(Op::Release { token: 1 })),
            // client 1 never learns the outcome
            event(4, 2, Kind::Invoke(Op::Acquire)),
            event(5, 2, granted(2)),
        ];
        assert!(check(&events).is_empty(), "{:?}", check(&events));
    }
}
