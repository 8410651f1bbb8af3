//! The keeper: the one place that decides, for every backend, when a
//! session or hold the client keeps alive is renewed, until when it may be
//! trusted without an answer from the store, and why it ended.
//!
//! A backend supplies only what its store does: "renew this" and "is this
//! still mine" ([`Renew`]), and its own loss events (a watch that fires, a
//! push from a server), which it reports on the hold's lost signal itself.
//! The rules are in [`Term`], one per session or hold, without I/O; [`keep`]
//! drives one term against its store until it ends. The etcd session lease,
//! the memory store's sessions (renewed by the engine's heartbeat) and the
//! holds' own leases on etcd, PostgreSQL and ZooKeeper run [`keep`].
//! Two keep their terms in loops of their own, by the same rules: the Redis
//! watchdog, which renews many holds in one script call, and the locksmith
//! server's session, whose heartbeats travel on the stream that carries the
//! answers to its requests, in order with them (module `server::heartbeats`:
//! the stream's driver sends a renewal when the term says, and hands it the
//! answers). ZooKeeper's session is kept alive by its client library, which
//! pings at a third of the session timeout itself.

// Built without some of the backends that hold leases (`--features redis`
// alone, or only `memory` and `server`), parts of the keeper go unused; a
// build with every backend (`--all-features`, as CI's clippy) still flags
// what none of them uses.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "zookeeper",
        feature = "etcd",
        feature = "postgres"
    )),
    allow(dead_code)
)]

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lost::LostCause;

/// How often a hold, or the session or lease that keeps it, is renewed:
/// every third of its TTL (Redisson's watchdog rule), so that two renewals
/// in a row can fail or be slow before it runs out.
pub(crate) fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// How soon a renewal that got no answer is tried again: a tenth of the
/// lease, so that several tries fit before it runs out, between 10 ms and
/// a second (a store restarting or failing over is often back by then).
pub(crate) fn retry_after(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Until when a hold renewed (or granted) for `lease` by a request sent at
/// `sent` may be trusted without another answer: the lease counted from
/// the send, never from the answer, so never later than the store's own
/// clock says; less `drift` where the store's clocks may run at other rates
/// than ours (Redlock's `lease × 1% + 2 ms`; zero elsewhere).
pub(crate) fn trusted_until(sent: Instant, lease: Duration, drift: Duration) -> Instant {
    sent + lease.saturating_sub(drift)
}

/// What may be taken off a lease of `lease` where the store's clocks may
/// run at other rates than ours, as several independent Redis masters'
/// may: Redlock's `lease × 1% + 2 ms`.
pub(crate) fn clock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// What the keeper takes off a lease before it stops trusting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Margin {
    /// Nothing: the lease counted from the send already ends no later than
    /// the store's own count, which starts when the request arrived.
    None,
    /// Redlock's [`clock_drift`], where the store's clocks may run at other
    /// rates than ours.
    ClockDrift,
    /// A twentieth of the lease, where the store hands a lost hold to its
    /// next waiter the moment it expires the session (the lock server): the
    /// holder hears of the loss first, even when this process is slow to
    /// run its timers.
    HeardFirst,
}

impl Margin {
    fn of(self, lease: Duration) -> Duration {
        match self {
            Margin::None => Duration::ZERO,
            Margin::ClockDrift => clock_drift(lease),
            Margin::HeardFirst => lease / 20,
        }
    }
}

/// What a kept term keeps alive, for the cause it ends with when the store
/// no longer has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// A session (or session lease) that every hold of a client hangs on:
    /// gone, it expired.
    Session,
    /// One hold: gone, it was taken away or lost with the store's data.
    Hold,
}

/// Why a kept session or hold ended, in a word and in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loss {
    pub cause: LostCause,
    pub reason: String,
}

/// The keeper's record of one session or hold: its lease, whether the
/// keeper renews it, and until when it is trusted. Every decision about
/// its time and its end is a method here.
#[derive(Debug, Clone)]
pub(crate) struct Term {
    /// What is kept, in words ("lock \"a\"", "the session lease").
    what: String,
    kept: Kept,
    /// Renewed by the keeper (no fixed lease: Redisson's watchdog), or a
    /// fixed lease that only runs out.
    renewed: bool,
    lease: Duration,
    /// What is taken off every lease.
    margin: Margin,
    /// When the request behind the current trust was sent.
    renewed_at: Instant,
    trusted_until: Instant,
    /// When the keeper renews next (when renewed).
    renew_at: Instant,
    /// Why the last renewal got no answer, for the reason of a loss.
    last_error: Option<String>,
}

impl Term {
    /// A term the keeper renews, granted for `lease` by a request sent at
    /// `sent`.
    pub fn renewed(what: impl Into<String>, kept: Kept, sent: Instant, lease: Duration) -> Term {
        Term {
            what: what.into(),
            kept,
            renewed: true,
            lease,
            margin: Margin::None,
            renewed_at: sent,
            trusted_until: trusted_until(sent, lease, Duration::ZERO),
            renew_at: sent + renewal_interval(lease),
            last_error: None,
        }
    }

    /// A fixed lease granted by a request sent at `sent`: it only runs
    /// out, unless extended.
    pub fn fixed(what: impl Into<String>, kept: Kept, sent: Instant, lease: Duration) -> Term {
        Term {
            renewed: false,
            ..Term::renewed(what, kept, sent, lease)
        }
    }

    /// The same term on a store whose clocks may run at other rates than
    /// ours (Redlock's independent masters): trusted for less.
    pub fn with_clock_drift(self) -> Term {
        self.with_margin(Margin::ClockDrift)
    }

    /// The same term on a store that hands a lost hold to its next waiter
    /// the moment it expires the session (the lock server): trusted a
    /// twentieth of the lease less, so that the holder hears of the loss
    /// before anyone else is granted its locks.
    pub fn heard_before_expiry(self) -> Term {
        self.with_margin(Margin::HeardFirst)
    }

    fn with_margin(mut self, margin: Margin) -> Term {
        self.margin = margin;
        self.trusted_until = trusted_until(self.renewed_at, self.lease, margin.of(self.lease));
        self
    }

    /// Until when it may be trusted.
    pub fn trusted_until(&self) -> Instant {
        self.trusted_until
    }

    /// When the request behind its current trust (the grant, or the last
    /// renewal that counted) was sent.
    pub fn renewed_at(&self) -> Instant {
        self.renewed_at
    }

    /// Whether the keeper renews it.
    pub fn is_renewed(&self) -> bool {
        self.renewed
    }

    /// The next instant the keeper must act: a renewal, or the end of the
    /// trust.
    pub fn wake_at(&self) -> Instant {
        if self.renewed {
            self.renew_at.min(self.trusted_until)
        } else {
            self.trusted_until
        }
    }

    /// Whether a renewal is due at `now`.
    pub fn renewal_due(&self, now: Instant) -> bool {
        self.renewed && now >= self.renew_at && now < self.trusted_until
    }

    /// A renewal was sent at `now` on a stream that carries renewals and
    /// their answers in order (the lock server's heartbeats): the next is
    /// due an interval later, answered or not, as the answer to this one
    /// is still on its way.
    pub fn renewal_sent(&mut self, now: Instant) {
        self.renew_at = now + renewal_interval(self.lease);
    }

    /// The store renewed it for `lease` by a request sent at `sent`,
    /// answered at `now` (or, for a fixed lease, found it still there). An
    /// answer that came after the trust ended counts for nothing: the hold
    /// may have been granted to someone else meanwhile; a fixed lease is
    /// not moved by a check. Answers whether it counted.
    pub fn renewed_for(&mut self, sent: Instant, lease: Duration, now: Instant) -> bool {
        if !self.renewed || now >= self.trusted_until {
            return false;
        }
        self.last_error = None;
        self.renewed_at = sent;
        self.trusted_until = trusted_until(sent, lease, self.margin.of(lease));
        self.renew_at = sent + renewal_interval(lease);
        true
    }

    /// Its owner extended it to `lease` by a request sent at `sent`.
    pub fn extended(&mut self, sent: Instant, lease: Duration) {
        self.lease = lease;
        self.renewed_at = sent;
        self.trusted_until = trusted_until(sent, lease, self.margin.of(lease));
        self.renew_at = sent + renewal_interval(lease);
    }

    /// The next renewal is due at `now`: what the store last answered
    /// renewed nothing (a resumed session), and only a renewal's answer
    /// moves the trust.
    pub fn renew_now(&mut self, now: Instant) {
        self.renew_at = now;
    }

    /// A renewal tried at `now` got no answer: tried again soon.
    pub fn unanswered(&mut self, now: Instant, error: String) {
        self.last_error = Some(error);
        self.renew_at = now + retry_after(self.lease);
    }

    /// Why it ended, if its trust ran out by `now`: a fixed lease
    /// expired; a renewed one could not be renewed in time.
    pub fn ran_out(&self, now: Instant) -> Option<Loss> {
        if now < self.trusted_until {
            return None;
        }
        Some(if self.renewed {
            let why = self
                .last_error
                .as_deref()
                .unwrap_or("the store did not answer in time");
            Loss {
                cause: LostCause::ConnectionLost,
                reason: format!(
                    "{}: could not be renewed before its lease ran out ({why})",
                    self.what
                ),
            }
        } else {
            Loss {
                cause: LostCause::LeaseExpired,
                reason: format!("{}: its lease expired", self.what),
            }
        })
    }

    /// Why it ended when the store says it no longer has it: a session
    /// expired (or was revoked); a hold is gone. A hold found gone after
    /// its trust ran out expired first.
    pub fn gone(&self, now: Instant) -> Loss {
        if let Some(ran_out) = self.ran_out(now) {
            return ran_out;
        }
        match self.kept {
            Kept::Session => Loss {
                cause: LostCause::SessionExpired,
                reason: format!("{} expired or was revoked", self.what),
            },
            Kept::Hold => Loss {
                cause: LostCause::Gone,
                reason: format!(
                    "{} is no longer held (expired and taken, force-released, or lost with the store's data)",
                    self.what
                ),
            },
        }
    }
}

/// What the store answered a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still ours, now for this lease (the store may round what was asked).
    For(Duration),
    /// The store no longer has it.
    Gone,
}

/// What a backend supplies to the keeper: one renewal on its store.
#[async_trait]
pub(crate) trait Renew: Send + 'static {
    /// Renews what is kept for `lease` from now, or finds it gone; `Err`
    /// says why no answer came (it is tried again).
    ///
    /// Cancel safety: must be cancel safe: the keeper drops a renewal still
    /// unanswered when the trust runs out, and then ends the term.
    async fn renew(&mut self, lease: Duration) -> std::result::Result<Renewed, String>;
}

/// Keeps one term: renews it when due, and completes with why it ended: it
/// ran out, or the store no longer has it. `term` is shared with whoever
/// extends it; a change wakes the keeper.
///
/// Cancel safety: safe; dropping it stops the keeping (a renewal in flight
/// is dropped, and the store's lease then runs out by itself).
pub(crate) async fn keep<R: Renew>(term: watch::Sender<Term>, renewer: R) -> Loss {
    run(term, Some(renewer)).await
}

/// Keeps a fixed lease: completes when it runs out.
///
/// Cancel safety: safe; dropping it stops the watching.
pub(crate) async fn keep_fixed(term: watch::Sender<Term>) -> Loss {
    run::<NoRenewal>(term, None).await
}

/// A fixed lease's keeper renews nothing.
enum NoRenewal {}

#[async_trait]
impl Renew for NoRenewal {
    async fn renew(&mut self, _: Duration) -> std::result::Result<Renewed, String> {
        match *self {}
    }
}

/// [`keep`], with no renewer for a fixed lease.
///
/// Cancel safety: as [`keep`].
async fn run<R: Renew>(term: watch::Sender<Term>, mut renewer: Option<R>) -> Loss {
    let mut changes = term.subscribe();
    loop {
        let wake = {
            let current = changes.borrow_and_update();
            match renewer {
                Some(_) => current.wake_at(),
                None => current.trusted_until,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            // The sender is ours: it never closes.
            _ = changes.changed() => continue,
        }
        let sent = Instant::now();
        let current = term.borrow().clone();
        if let Some(loss) = current.ran_out(sent) {
            return loss;
        }
        let Some(renewer) = renewer.as_mut().filter(|_| current.renewal_due(sent)) else {
            continue;
        };
        match tokio::time::timeout_at(current.trusted_until, renewer.renew(current.lease)).await {
            Err(_) => {} // ran out: said at the top of the loop
            Ok(Ok(Renewed::For(lease))) => {
                term.send_modify(|t| {
                    t.renewed_for(sent, lease, Instant::now());
                });
            }
            Ok(Ok(Renewed::Gone)) => return term.borrow().gone(Instant::now()),
            Ok(Err(error)) => {
                tracing::debug!(what = %current.what, %error, "renewal got no answer; trying again");
                term.send_modify(|t| t.unanswered(Instant::now(), error));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_comes_at_a_third_and_trust_ends_with_the_lease_from_the_send() {
        assert_eq!(
            renewal_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        let sent = Instant::now();
        let lease = Duration::from_secs(30);
        assert_eq!(trusted_until(sent, lease, Duration::ZERO), sent + lease);
        assert_eq!(
            trusted_until(sent, lease, Duration::from_millis(302)),
            sent + lease - Duration::from_millis(302)
        );
        assert_eq!(
            trusted_until(sent, lease, lease * 2),
            sent,
            "never before the send"
        );
    }

    /// A renewer that answers from a script, counting its calls.
    struct Scripted {
        answers: std::collections::VecDeque<std::result::Result<Renewed, String>>,
        calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    #[async_trait]
    impl Renew for Scripted {
        async fn renew(&mut self, _: Duration) -> std::result::Result<Renewed, String> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match self.answers.pop_front() {
                Some(answer) => answer,
                // Out of answers: the store stops answering at all.
                None => std::future::pending().await,
            }
        }
    }

    fn scripted(
        answers: Vec<std::result::Result<Renewed, String>>,
    ) -> (Scripted, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let calls = std::sync::Arc::default();
        let renewer = Scripted {
            answers: answers.into(),
            calls: std::sync::Arc::clone(&calls),
        };
        (renewer, calls)
    }

    const LEASE: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn a_renewed_term_lives_while_renewals_answer_then_ends_when_they_stop() {
        let start = Instant::now();
        let ok = Ok(Renewed::For(LEASE));
        let (renewer, calls) = scripted(vec![ok.clone(), ok.clone(), ok]);
        let term = watch::Sender::new(Term::renewed("lock \"a\"", Kept::Hold, start, LEASE));
        let loss = keep(term, renewer).await;
        // Renewed at 10, 20 and 30 s; the fourth renewal, sent at 40 s, is
        // never answered, and the lease from the third runs out at 60 s.
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert_eq!(Instant::now() - start, Duration::from_secs(60));
        assert_eq!(loss.cause, LostCause::ConnectionLost);
        assert!(
            loss.reason.contains("did not answer in time"),
            "{}",
            loss.reason
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_renewals_are_retried_and_named_when_the_lease_runs_out() {
        let start = Instant::now();
        let failures = (0..1000)
            .map(|_| Err("connection refused".to_owned()))
            .collect();
        let (renewer, calls) = scripted(failures);
        let term = watch::Sender::new(Term::renewed("lock \"a\"", Kept::Hold, start, LEASE));
        let loss = keep(term, renewer).await;
        assert_eq!(Instant::now() - start, LEASE);
        // From 10 s to 30 s, every second (a tenth of the lease, at most 1 s).
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 20);
        assert_eq!(loss.cause, LostCause::ConnectionLost);
        assert!(
            loss.reason.contains("connection refused"),
            "{}",
            loss.reason
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gone_ends_a_hold_as_gone_and_a_session_as_expired() {
        for (kept, cause) in [
            (Kept::Hold, LostCause::Gone),
            (Kept::Session, LostCause::SessionExpired),
        ] {
            let start = Instant::now();
            let (renewer, _) = scripted(vec![Ok(Renewed::Gone)]);
            let term = watch::Sender::new(Term::renewed("it", kept, start, LEASE));
            let loss = keep(term, renewer).await;
            assert_eq!(Instant::now() - start, LEASE / 3);
            assert_eq!(loss.cause, cause);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_lease_expires_where_its_last_extension_says() {
        let start = Instant::now();
        let term = watch::Sender::new(Term::fixed("lock \"a\"", Kept::Hold, start, LEASE));
        let kept = tokio::spawn(keep_fixed(term.clone()));
        tokio::time::sleep(Duration::from_secs(20)).await;
        term.send_modify(|t| t.extended(Instant::now(), LEASE));
        let loss = kept.await.unwrap();
        assert_eq!(Instant::now() - start, Duration::from_secs(50));
        assert_eq!(loss.cause, LostCause::LeaseExpired);
    }

    #[test]
    fn an_answer_after_the_trust_ended_counts_for_nothing() {
        let start = Instant::now();
        let mut term = Term::renewed("it", Kept::Hold, start, LEASE);
        assert!(!term.renewed_for(start + LEASE - Duration::from_secs(1), LEASE, start + LEASE));
        assert_eq!(term.trusted_until, start + LEASE);
        assert!(term.renewed_for(
            start + Duration::from_secs(10),
            LEASE,
            start + Duration::from_secs(11)
        ));
        assert_eq!(term.trusted_until, start + Duration::from_secs(40));
    }
}
