//! The checker: reads the resource's log of one round and decides what was
//! safe, what was excused by a fault, and what was a violation.
//!
//! # What counts
//!
//! - **Fencing at the resource**: accepted tokens never go down per lock (the
//!   resource enforces it; the checker re-checks the log) and stale writes
//!   rejected are counted.
//! - **Duplicate token**: two grants of one lock with the same token. Every
//!   free→held transition must give a new, higher token.
//! - **Token regression**: grant B's acquire *started* after grant A's acquire
//!   had *returned* (so B was granted after A in real time), yet B's token is
//!   not above A's. Grants whose acquire calls overlap in time are not
//!   compared: their order in the store is unknown, and reports of concurrent
//!   grants may arrive in either order. Restarts in between are included, which
//!   is how "tokens never go backwards across restarts" is checked.
//! - **Accepted stale write**: a write the resource took from a holder whose
//!   lock had already passed to a newer grant (that grant's acquire started
//!   after the writer's returned, and returned before the write arrived) whose
//!   token was not higher, so the resource could not refuse it. This is the
//!   failure fencing exists to prevent.
//! - **Unfenced overlap**: two clients inside the critical section of one lock
//!   at once by the resource's clock (between an accepted `Begin` and the
//!   `End`, an abort, or the writer's death). Expected under pauses and
//!   partitions with any lease-based lock; it is why fencing exists. An
//!   overlap is *excused* when the earlier holder was the target of a fault
//!   during its hold (paused, partitioned, its session expired by the
//!   nemesis), a fault hit every client (backend restart, delay), or the
//!   client library told it the hold was lost (lost signal, an abort before a
//!   write, or a failed release). Otherwise the store gave the lock to a second
//!   client while the first held it healthily: a violation.
//! - **Liveness**: grants per second before, during and after the faults; the
//!   longest gap between grants; waiters still waiting when the round ended
//!   with the lock free ("stuck"); and whether anything was granted after the
//!   faults stopped.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::protocol::{Phase, Request};
use super::resource::{Event, Who};

/// One fault the nemesis injected.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// Which fault.
    pub kind: String,
    /// When it started (`CLOCK_MONOTONIC` ns).
    pub start: u64,
    /// When it was healed (equal to `start` for instantaneous faults).
    pub end: u64,
    /// The clients it hit directly (paused, cut off, killed, their session
    /// taken); `None` for all of them. Faults of the backend or of the whole
    /// network (restart, delay) target nobody: a client they cost its lock
    /// must be told so by its client library to excuse an overlap.
    pub targets: Option<Vec<Who>>,
    /// What exactly was done.
    pub note: String,
}

impl FaultRecord {
    fn hits(&self, who: Who, from: u64, to: u64) -> bool {
        let targeted = self.targets.as_ref().is_none_or(|t| t.contains(&who));
        targeted && self.start <= to && self.end >= from
    }
}

/// Phase boundaries of a round (`CLOCK_MONOTONIC` ns).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Phases {
    /// Faults start here.
    pub faults_from: u64,
    /// Faults stop here.
    pub faults_until: u64,
    /// Measuring starts here (after warm-up).
    pub start: u64,
    /// The round ends here (clients told to stop).
    pub end: u64,
}

/// A grant as the client reported it.
#[derive(Debug, Clone)]
struct Grant {
    who: Who,
    lock: String,
    token: u64,
    asked: u64,
    at: u64,
}

/// A stay inside the critical section.
#[derive(Debug, Clone)]
struct Stay {
    who: Who,
    token: u64,
    from: u64,
    to: u64,
}

/// The verdict of one round.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Grants reported.
    pub grants: u64,
    /// Grants per second before the faults.
    pub rate_before: f64,
    /// Grants per second while faults were injected.
    pub rate_during: f64,
    /// Grants per second after the faults.
    pub rate_after: f64,
    /// Longest time without any grant (ms).
    pub max_gap_ms: f64,
    /// From the end of the faults to the first grant after them (ms).
    pub recovery_ms: Option<f64>,
    /// Writes the resource accepted.
    pub writes_accepted: u64,
    /// Stale writes the resource rejected (fencing at work).
    pub stale_rejected: u64,
    /// Writes skipped because the client saw its hold lost first.
    pub aborted: u64,
    /// Lost signals reported.
    pub lost: u64,
    /// Acquire or connect errors reported.
    pub acquire_errors: u64,
    /// Unfenced overlaps (two clients inside at once), excused or not: the
    /// critical sections another client entered before they ended.
    pub overlaps: u64,
    /// Longest overlap: from another client's entry to the end of the
    /// overlapped section (ms).
    pub max_overlap_ms: f64,
    /// Overlaps with nothing to excuse them: violations.
    pub unexcused_overlaps: Vec<String>,
    /// Two grants with one token: violations.
    pub duplicate_tokens: Vec<String>,
    /// Tokens lower than an earlier grant's: violations.
    pub regressions: Vec<String>,
    /// Stale writes the resource could not refuse: violations.
    pub accepted_stale: Vec<String>,
    /// Accepted tokens going down at the resource (a resource bug).
    pub resource_errors: Vec<String>,
    /// Waiters that never got the lock.
    pub stuck: Vec<String>,
    /// Holds lost in a round without any fault: a healthy holder must keep
    /// its lock.
    pub lost_without_fault: Vec<String>,
    /// Nothing was granted after the faults stopped.
    pub no_progress_after: bool,
}

impl Verdict {
    /// Safety violations.
    pub fn violations(&self) -> usize {
        self.unexcused_overlaps.len()
            + self.duplicate_tokens.len()
            + self.regressions.len()
            + self.accepted_stale.len()
            + self.resource_errors.len()
    }

    /// Liveness failures.
    pub fn liveness_failures(&self) -> usize {
        self.stuck.len() + self.lost_without_fault.len() + usize::from(self.no_progress_after)
    }
}

/// At most this many examples of each violation are kept.
const EXAMPLES: usize = 5;

fn note(list: &mut Vec<String>, count: &mut usize, text: impl FnOnce() -> String) {
    *count += 1;
    if list.len() < EXAMPLES {
        list.push(text());
    }
}

fn ms(ns: u64, origin: u64) -> String {
    format!("{:.0}ms", (ns as f64 - origin as f64) / 1e6)
}

/// Checks one round.
pub fn check(
    events: &[Event],
    faults: &[FaultRecord],
    phases: Phases,
    stuck: Vec<String>,
) -> Verdict {
    let origin = phases.start;
    let mut verdict = Verdict {
        stuck,
        ..Verdict::default()
    };
    let mut grants: Vec<Grant> = Vec::new();
    let mut told_lost: HashMap<(Who, u64), u64> = HashMap::new();
    let mut open: HashMap<Who, (String, Stay)> = HashMap::new();
    let mut stays: BTreeMap<String, Vec<Stay>> = BTreeMap::new();
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut accepted_writes: Vec<(Who, &str, u64, u64)> = Vec::new();
    let mut close = |open: &mut HashMap<Who, (String, Stay)>, who: Who, at: u64| {
        if let Some((lock, mut stay)) = open.remove(&who) {
            stay.to = at;
            stays.entry(lock).or_default().push(stay);
        }
    };
    for event in events {
        let who = event.who;
        match &event.request {
            None => close(&mut open, who, event.at),
            Some(Request::Granted {
                lock,
                token,
                asked,
                at,
            }) => grants.push(Grant {
                who,
                lock: lock.clone(),
                token: *token,
                asked: *asked,
                at: *at,
            }),
            Some(Request::Write {
                lock, token, phase, ..
            }) => {
                if event.accepted {
                    verdict.writes_accepted += 1;
                    let high = highest.entry(lock).or_insert(0);
                    if *token < *high && verdict.resource_errors.len() < EXAMPLES {
                        verdict.resource_errors.push(format!(
                            "{lock}: the resource accepted token {token} after {high}"
                        ));
                    }
                    *high = (*high).max(*token);
                    accepted_writes.push((who, lock, *token, event.at));
                } else {
                    verdict.stale_rejected += 1;
                }
                match phase {
                    Phase::Begin if event.accepted => {
                        close(&mut open, who, event.at);
                        open.insert(
                            who,
                            (
                                lock.clone(),
                                Stay {
                                    who,
                                    token: *token,
                                    from: event.at,
                                    to: u64::MAX,
                                },
                            ),
                        );
                    }
                    Phase::Begin => {}
                    Phase::End => close(&mut open, who, event.at),
                }
            }
            Some(Request::Abort { token, .. }) => {
                verdict.aborted += 1;
                told_lost.entry((who, *token)).or_insert(event.at);
                close(&mut open, who, event.at);
            }
            Some(Request::Lost { token, at, .. }) => {
                verdict.lost += 1;
                told_lost.entry((who, *token)).or_insert(*at);
                if faults.is_empty() && verdict.lost_without_fault.len() < EXAMPLES {
                    verdict.lost_without_fault.push(format!(
                        "client {who:?} lost its hold (token {token}) at {}ms, with no fault injected",
                        at.saturating_sub(origin) / 1_000_000
                    ));
                }
            }
            Some(Request::Released {
                token,
                error: Some(_),
                at,
                ..
            }) => {
                told_lost.entry((who, *token)).or_insert(*at);
            }
            Some(Request::Failed { .. }) => verdict.acquire_errors += 1,
            Some(Request::Hello { .. } | Request::Waiting { .. } | Request::Released { .. }) => {}
        }
    }
    let still_open: Vec<Who> = open.keys().copied().collect();
    for who in still_open {
        close(&mut open, who, phases.end);
    }

    // Tokens: duplicates and regressions, per lock.
    let mut by_lock: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in &grants {
        by_lock.entry(&grant.lock).or_default().push(grant);
    }
    let (mut duplicates, mut regressions, mut stale) = (0, 0, 0);
    let mut grant_of: HashMap<(Who, &str, u64), &Grant> = HashMap::new();
    for (lock, list) in &by_lock {
        let mut seen: HashMap<u64, &Grant> = HashMap::new();
        for grant in list {
            grant_of.insert((grant.who, lock, grant.token), grant);
            if let Some(first) = seen.insert(grant.token, grant) {
                note(&mut verdict.duplicate_tokens, &mut duplicates, || {
                    format!(
                        "{lock}: token {} granted to client {:?} at {} and to client {:?} at {}",
                        grant.token,
                        first.who,
                        ms(first.at, origin),
                        grant.who,
                        ms(grant.at, origin)
                    )
                });
            }
        }
        // Sweep: grants by when they returned, against grants by when they were asked.
        let mut returned: Vec<&Grant> = list.clone();
        returned.sort_by_key(|g| g.at);
        let mut asked: Vec<&Grant> = list.clone();
        asked.sort_by_key(|g| g.asked);
        let mut best: Option<&Grant> = None;
        let mut next = 0;
        for grant in asked {
            while next < returned.len() && returned[next].at < grant.asked {
                if best.is_none_or(|b| returned[next].token > b.token) {
                    best = Some(returned[next]);
                }
                next += 1;
            }
            if let Some(earlier) = best {
                if grant.token <= earlier.token {
                    note(&mut verdict.regressions, &mut regressions, || {
                        format!(
                            "{lock}: client {:?} asked at {} and got token {}, but client {:?} had already got token {} at {}",
                            grant.who,
                            ms(grant.asked, origin),
                            grant.token,
                            earlier.who,
                            earlier.token,
                            ms(earlier.at, origin)
                        )
                    });
                }
            }
        }
    }

    // Accepted stale writes.
    for &(who, lock, token, at) in &accepted_writes {
        let Some(own) = grant_of.get(&(who, lock, token)) else {
            continue;
        };
        let superseded = by_lock
            .get(lock)
            .into_iter()
            .flatten()
            .find(|g| g.who != who && g.asked > own.at && g.at < at && g.token <= token);
        if let Some(newer) = superseded {
            note(&mut verdict.accepted_stale, &mut stale, || {
                format!(
                    "{lock}: write by client {who:?} with token {token} accepted at {} although client {:?} was granted the lock at {} with token {}",
                    ms(at, origin),
                    newer.who,
                    ms(newer.at, origin),
                    newer.token
                )
            });
        }
    }

    // Overlaps: each critical section that another client entered before it
    // ended is one overlap, lasting from the first intruder's entry to the end
    // of the section (or of the last intruder, if sooner).
    let mut unexcused = 0;
    for (lock, list) in &mut stays {
        list.sort_by_key(|s| s.from);
        for (i, earlier) in list.iter().enumerate() {
            let intruders: Vec<&Stay> = list[i + 1..]
                .iter()
                .take_while(|later| later.from < earlier.to)
                .filter(|later| later.who != earlier.who)
                .collect();
            let Some(first) = intruders.first() else {
                continue;
            };
            verdict.overlaps += 1;
            let last_out = intruders.iter().map(|s| s.to).max().unwrap_or(first.to);
            let span = earlier
                .to
                .min(last_out)
                .min(phases.end)
                .saturating_sub(first.from);
            verdict.max_overlap_ms = verdict.max_overlap_ms.max(span as f64 / 1e6);
            let granted = grant_of
                .get(&(earlier.who, lock.as_str(), earlier.token))
                .map_or(earlier.from, |g| g.at);
            let faulted = faults
                .iter()
                .any(|f| f.hits(earlier.who, granted, first.from));
            let told = told_lost.contains_key(&(earlier.who, earlier.token));
            if !faulted && !told {
                note(&mut verdict.unexcused_overlaps, &mut unexcused, || {
                    format!(
                        "{lock}: client {:?} (token {}) inside from {} to {}, client {:?} (token {}) entered at {}; \
                         no fault touched the first and it was never told its hold was lost",
                        earlier.who,
                        earlier.token,
                        ms(earlier.from, origin),
                        ms(earlier.to, origin),
                        first.who,
                        first.token,
                        ms(first.from, origin)
                    )
                });
            }
        }
    }
    for (list, count) in [
        (&mut verdict.duplicate_tokens, duplicates),
        (&mut verdict.regressions, regressions),
        (&mut verdict.accepted_stale, stale),
        (&mut verdict.unexcused_overlaps, unexcused),
    ] {
        if count > list.len() {
            list.push(format!("… {} more", count - list.len()));
        }
    }

    // Liveness.
    let mut times: Vec<u64> = grants
        .iter()
        .map(|g| g.at)
        .filter(|&t| t >= phases.start)
        .collect();
    times.sort_unstable();
    verdict.grants = times.len() as u64;
    let rate = |from: u64, to: u64| {
        let n = times.iter().filter(|&&t| t >= from && t < to).count();
        n as f64 / ((to.saturating_sub(from)) as f64 / 1e9).max(1e-9)
    };
    verdict.rate_before = rate(phases.start, phases.faults_from);
    verdict.rate_during = rate(phases.faults_from, phases.faults_until);
    verdict.rate_after = rate(phases.faults_until, phases.end);
    verdict.recovery_ms = times
        .iter()
        .find(|&&t| t >= phases.faults_until)
        .map(|&t| (t - phases.faults_until) as f64 / 1e6);
    verdict.no_progress_after = !times
        .iter()
        .any(|&t| t >= phases.faults_until && t < phases.end);
    let mut previous = phases.start;
    let mut gap = 0;
    for &t in times.iter().chain(std::iter::once(&phases.end)) {
        gap = gap.max(t.saturating_sub(previous));
        previous = t;
    }
    verdict.max_gap_ms = gap as f64 / 1e6;
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    struct Log(Vec<Event>);

    impl Log {
        fn push(&mut self, at: u64, who: Who, request: Option<Request>, accepted: bool) {
            self.0.push(Event {
                at: at * MS,
                who,
                request,
                accepted,
            });
        }
        fn grant(&mut self, who: Who, token: u64, asked: u64, at: u64) {
            self.push(
                at,
                who,
                Some(Request::Granted {
                    lock: "l".into(),
                    token,
                    asked: asked * MS,
                    at: at * MS,
                }),
                true,
            );
        }
        fn write(&mut self, at: u64, who: Who, token: u64, phase: Phase, accepted: bool) {
            self.push(
                at,
                who,
                Some(Request::Write {
                    lock: "l".into(),
                    token,
                    phase,
                    start: 0,
                    end: 0,
                }),
                accepted,
            );
        }
        /// A whole clean critical section.
        fn section(&mut self, who: Who, token: u64, asked: u64, at: u64, until: u64) {
            self.grant(who, token, asked, at);
            self.write(at + 1, who, token, Phase::Begin, true);
            self.write(until, who, token, Phase::End, true);
        }
    }

    fn phases() -> Phases {
        Phases {
            start: 0,
            faults_from: 100 * MS,
            faults_until: 200 * MS,
            end: 300 * MS,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let mut log = Log(Vec::new());
        log.section((0, 0), 1, 0, 10, 50);
        log.section((1, 0), 2, 5, 60, 150);
        log.section((0, 0), 3, 155, 210, 250);
        let verdict = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(verdict.violations(), 0, "{verdict:?}");
        assert_eq!(verdict.liveness_failures(), 0, "{verdict:?}");
        assert_eq!(verdict.grants, 3);
        assert_eq!(verdict.writes_accepted, 6);
    }

    #[test]
    fn a_lower_token_after_a_completed_grant_is_a_regression() {
        let mut log = Log(Vec::new());
        log.section((0, 0), 5, 0, 10, 50);
        log.section((1, 0), 4, 60, 70, 250);
        let verdict = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(verdict.regressions.len(), 1, "{verdict:?}");
    }

    #[test]
    fn concurrent_acquires_are_not_compared() {
        let mut log = Log(Vec::new());
        // Client 1 asked before client 0's grant returned: order unknown.
        log.grant((0, 0), 5, 0, 10);
        log.grant((1, 0), 4, 5, 12);
        let verdict = check(&log.0, &[], phases(), Vec::new());
        assert!(verdict.regressions.is_empty(), "{verdict:?}");
    }

    #[test]
    fn one_token_twice_is_a_duplicate() {
        let mut log = Log(Vec::new());
        log.grant((0, 0), 5, 0, 10);
        log.grant((1, 0), 5, 0, 11);
        let verdict = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(verdict.duplicate_tokens.len(), 1, "{verdict:?}");
    }

    #[test]
    fn overlaps_are_violations_unless_a_fault_or_a_lost_signal_excuses_them() {
        let mut log = Log(Vec::new());
        log.grant((0, 0), 1, 0, 10);
        log.write(11, (0, 0), 1, Phase::Begin, true);
        log.grant((1, 0), 2, 5, 20);
        log.write(21, (1, 0), 2, Phase::Begin, true);
        log.write(30, (0, 0), 1, Phase::End, false);
        log.write(40, (1, 0), 2, Phase::End, true);
        let unexcused = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(unexcused.overlaps, 1);
        assert_eq!(unexcused.unexcused_overlaps.len(), 1, "{unexcused:?}");
        assert_eq!(unexcused.stale_rejected, 1);

        let pause = FaultRecord {
            kind: "pause-client".into(),
            start: 12 * MS,
            end: 25 * MS,
            targets: Some(vec![(0, 0)]),
            note: String::new(),
        };
        let excused = check(&log.0, std::slice::from_ref(&pause), phases(), Vec::new());
        assert_eq!(excused.overlaps, 1);
        assert!(excused.unexcused_overlaps.is_empty(), "{excused:?}");

        let other = FaultRecord {
            targets: Some(vec![(1, 0)]),
            ..pause
        };
        assert_eq!(
            check(&log.0, &[other], phases(), Vec::new()).violations(),
            1
        );

        log.push(
            15,
            (0, 0),
            Some(Request::Lost {
                lock: "l".into(),
                token: 1,
                reason: "session expired".into(),
                at: 15 * MS,
            }),
            true,
        );
        assert_eq!(check(&log.0, &[], phases(), Vec::new()).violations(), 0);
    }

    #[test]
    fn a_stale_write_the_resource_could_not_refuse_is_caught() {
        let mut log = Log(Vec::new());
        log.grant((0, 0), 7, 0, 10);
        // Client 1 asked after client 0 was granted, yet got a lower token.
        log.grant((1, 0), 6, 20, 30);
        log.write(40, (0, 0), 7, Phase::Begin, true);
        let verdict = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(verdict.accepted_stale.len(), 1, "{verdict:?}");
        assert_eq!(verdict.regressions.len(), 1, "{verdict:?}");
    }

    #[test]
    fn no_grant_after_the_faults_is_a_liveness_failure() {
        let mut log = Log(Vec::new());
        log.section((0, 0), 1, 0, 10, 50);
        let verdict = check(&log.0, &[], phases(), vec!["client 1".into()]);
        assert!(verdict.no_progress_after);
        assert_eq!(verdict.liveness_failures(), 2);
        assert!(
            (verdict.max_gap_ms - 290.0).abs() < 1.0,
            "{}",
            verdict.max_gap_ms
        );
    }

    #[test]
    fn a_hold_lost_in_a_round_without_faults_is_a_liveness_failure() {
        let mut log = Log(Vec::new());
        log.section((0, 0), 1, 0, 10, 50);
        let lost = Request::Lost {
            lock: "l".into(),
            token: 1,
            reason: "no heartbeat answered for a whole session TTL".into(),
            at: 30 * MS,
        };
        log.push(30, (0, 0), Some(lost), true);
        log.section((1, 0), 2, 40, 60, 70);
        log.section((1, 0), 3, 200, 210, 250);
        let healthy = check(&log.0, &[], phases(), Vec::new());
        assert_eq!(healthy.lost_without_fault.len(), 1, "{healthy:?}");
        assert_eq!(healthy.liveness_failures(), 1);

        // The same loss in a round with a fault is what the fault did.
        let pause = FaultRecord {
            kind: "pause-client".into(),
            start: 20 * MS,
            end: 25 * MS,
            targets: Some(vec![(0, 0)]),
            note: String::new(),
        };
        let faulted = check(&log.0, &[pause], phases(), Vec::new());
        assert!(faulted.lost_without_fault.is_empty(), "{faulted:?}");
    }
}
