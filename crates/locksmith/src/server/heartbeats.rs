//! The session's heartbeats under the keeper's rules (module `keeper`).
//!
//! A heartbeat travels on the session stream, in order with the requests,
//! and each is answered once; an answer is paired with the oldest heartbeat
//! still unanswered, which is safe even when a server answers some out of
//! order (the leader's core and the stream's reader answer apart): after k
//! answers the session is trusted from the k-th oldest heartbeat's sending,
//! and the latest sent of the k actually answered went no earlier. So the
//! renewals of a session are not calls the keeper makes and awaits (as
//! [`crate::keeper::keep`] does elsewhere) but messages the stream's driver
//! sends when told, and answers it routes here as they arrive. What to send
//! when, until when the session may be trusted, when the member is suspect
//! and why the session ended are decided here, from one [`Term`], without
//! I/O; the driver (module `session`) only acts on it.

use std::collections::VecDeque;
use std::time::Duration;

use locksmith_core::planted::{self, Defect};
use tokio::time::Instant;

use crate::keeper::{Kept, Loss, Term};

/// What a session is called in the reasons of its loss.
const SESSION: &str = "the lock server session";

/// The heartbeats of one session, across the streams that carry it.
pub(super) struct Heartbeats {
    term: Term,
    ttl: Duration,
    /// Send times of the heartbeats on the current stream still unanswered,
    /// oldest first.
    unanswered: VecDeque<Instant>,
}

/// What the driver does when woken at [`Heartbeats::wake_at`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// The session can no longer be trusted: it is lost.
    Lost(Loss),
    /// The member answered no heartbeat for half a TTL: try another.
    Suspect,
    /// Send a heartbeat (it is counted as sent).
    Send,
    /// Nothing yet.
    Nothing,
}

impl Heartbeats {
    /// A session of `ttl` opened by a message sent at `sent`: it lives at
    /// least one TTL from then.
    pub fn opened(sent: Instant, ttl: Duration) -> Heartbeats {
        Heartbeats {
            term: Term::renewed(SESSION, Kept::Session, sent, ttl).heard_before_expiry(),
            ttl,
            unanswered: VecDeque::new(),
        }
    }

    /// The session was resumed on a new stream, answered at `now`. Answers
    /// whether it still stands: a resume answered after the trust ran out
    /// does not (the holds were given up already). A resume renews
    /// nothing: a member answers it as soon as it has attached the stream,
    /// before the heartbeat the resume stands for is committed (which a
    /// member that cannot reach a quorum never does, while the session's
    /// deadline runs on). So the trust stays where the last answered
    /// heartbeat put it, and a heartbeat is due at once.
    pub fn resumed(&mut self, now: Instant) -> bool {
        self.unanswered.clear();
        if self.term.ran_out(now).is_some() {
            return false;
        }
        self.term.renew_now(now);
        true
    }

    /// The stream broke at `now`: its heartbeats will never be answered.
    pub fn broken(&mut self, now: Instant, reason: String) {
        self.unanswered.clear();
        self.term.unanswered(now, reason);
    }

    /// A heartbeat was answered at `now` (the oldest unanswered one).
    pub fn answered(&mut self, now: Instant) {
        if let Some(sent) = self.unanswered.pop_front() {
            self.term.renewed_for(sent, self.ttl, now);
        }
    }

    /// Whether a heartbeat sent after `at` was answered.
    pub fn answered_since(&self, at: Instant) -> bool {
        self.term.renewed_at() > at
    }

    /// Until when the session may be trusted without another answer.
    pub fn trusted_until(&self) -> Instant {
        self.term.trusted_until()
    }

    /// Why the session ended, if its trust ran out by `now`.
    pub fn ran_out(&self, now: Instant) -> Option<Loss> {
        self.term.ran_out(now)
    }

    /// Why the session ended when the server said it no longer has it (in
    /// words of its own, `said`).
    pub fn gone(&self, now: Instant, said: &str) -> Loss {
        let mut loss = self.term.gone(now);
        loss.reason = format!("{} ({said})", loss.reason);
        loss
    }

    /// When the member it is connected to becomes suspect: half a TTL after
    /// the last heartbeat it answered was sent, once a heartbeat has waited
    /// a sixth of the TTL for its answer (after a pause of this process,
    /// none was sent, and the member gets that long to answer the one sent
    /// on waking). Never while no heartbeat waits.
    fn suspect_at(&self) -> Option<Instant> {
        let oldest = *self.unanswered.front()?;
        if planted::active(Defect::FrozenLeader) {
            return None;
        }
        Some((self.term.renewed_at() + self.ttl / 2).max(oldest + self.ttl / 6))
    }

    /// The next instant [`Heartbeats::poll`] has something to do; `others`:
    /// whether there are other members to try.
    pub fn wake_at(&self, others: bool) -> Instant {
        let wake = self.term.wake_at();
        match self.suspect_at().filter(|_| others) {
            Some(suspect) => wake.min(suspect),
            None => wake,
        }
    }

    /// What is due at `now`; `others` as for [`Heartbeats::wake_at`].
    pub fn poll(&mut self, now: Instant, others: bool) -> Due {
        if let Some(loss) = self.term.ran_out(now) {
            return Due::Lost(loss);
        }
        if others && self.suspect_at().is_some_and(|at| now >= at) {
            return Due::Suspect;
        }
        if self.term.renewal_due(now) {
            self.term.renewal_sent(now);
            self.unanswered.push_back(now);
            return Due::Send;
        }
        Due::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lost::LostCause;

    const TTL: Duration = Duration::from_secs(30);

    /// Runs the driver's side: sleeps to each wake-up and records what was
    /// due, until `until`, answering every heartbeat sent before `answer_until`
    /// after `delay`.
    async fn drive(
        heartbeats: &mut Heartbeats,
        others: bool,
        until: Instant,
        answer_until: Instant,
        delay: Duration,
    ) -> Vec<(Duration, Due)> {
        let start = Instant::now();
        let mut seen = Vec::new();
        let mut answers: VecDeque<Instant> = VecDeque::new();
        loop {
            let mut wake = heartbeats.wake_at(others);
            if let Some(&answer) = answers.front() {
                wake = wake.min(answer);
            }
            if wake > until {
                return seen;
            }
            tokio::time::sleep_until(wake).await;
            let now = Instant::now();
            if answers.front().is_some_and(|&at| at <= now) {
                answers.pop_front();
                heartbeats.answered(now);
                continue;
            }
            let due = heartbeats.poll(now, others);
            if due == Due::Send && now < answer_until {
                answers.push_back(now + delay);
            }
            let end = matches!(due, Due::Lost(_) | Due::Suspect);
            seen.push((now - start, due));
            if end {
                return seen;
            }
        }
    }

    fn at(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_go_every_third_of_the_ttl_while_answered() {
        let start = Instant::now();
        let mut heartbeats = Heartbeats::opened(start, TTL);
        let far = start + at(1000);
        let seen = drive(&mut heartbeats, true, start + at(95), far, at(1)).await;
        let sends: Vec<_> = seen.iter().map(|(t, _)| *t).collect();
        assert_eq!(sends, [10, 20, 30, 40, 50, 60, 70, 80, 90].map(at));
        assert!(seen.iter().all(|(_, due)| *due == Due::Send));
        assert_eq!(heartbeats.trusted_until(), start + at(90) + TTL - TTL / 20);
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_heartbeats_lose_the_session_a_twentieth_of_the_ttl_early() {
        let start = Instant::now();
        let mut heartbeats = Heartbeats::opened(start, TTL);
        // Answered until 20 s, then never: trusted until 20 s + 28.5 s.
        let seen = drive(
            &mut heartbeats,
            false,
            start + at(100),
            start + at(21),
            at(1),
        )
        .await;
        let (when, Due::Lost(loss)) = seen.last().expect("lost") else {
            panic!("not lost: {seen:?}");
        };
        assert_eq!(*when, at(20) + TTL - TTL / 20);
        assert_eq!(loss.cause, LostCause::ConnectionLost);
        // Heartbeats went on while unanswered, one every third of the TTL.
        assert_eq!(seen.len(), 5, "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_member_is_suspect_after_half_a_ttl_when_there_are_others() {
        let start = Instant::now();
        let mut heartbeats = Heartbeats::opened(start, TTL);
        let seen = drive(&mut heartbeats, true, start + at(100), start, at(1)).await;
        // The first heartbeat (10 s) goes unanswered; half a TTL from the
        // open is 15 s, and it has then waited 5 s, a sixth of the TTL.
        assert_eq!(seen, [(at(10), Due::Send), (at(15), Due::Suspect)]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_pause_the_member_gets_a_sixth_of_the_ttl_to_answer() {
        let start = Instant::now();
        let mut heartbeats = Heartbeats::opened(start, TTL);
        // This process was paused until 20 s: nothing was sent meanwhile.
        tokio::time::sleep(at(20)).await;
        let now = Instant::now();
        assert_eq!(heartbeats.poll(now, true), Due::Send);
        assert_eq!(heartbeats.wake_at(true), now + TTL / 6);
        tokio::time::sleep(TTL / 6).await;
        assert_eq!(heartbeats.poll(Instant::now(), true), Due::Suspect);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_renews_nothing_and_sends_a_heartbeat_at_once() {
        let start = Instant::now();
        let mut heartbeats = Heartbeats::opened(start, TTL);
        heartbeats.broken(start + at(5), "connection reset".into());
        let trusted = heartbeats.trusted_until();
        let resumed_at = start + at(7);
        assert!(heartbeats.resumed(resumed_at));
        assert_eq!(
            heartbeats.trusted_until(),
            trusted,
            "the resume renewed the session"
        );
        assert!(!heartbeats.answered_since(start));
        assert_eq!(heartbeats.poll(resumed_at, true), Due::Send);
        heartbeats.answered(resumed_at + at(1));
        assert_eq!(heartbeats.trusted_until(), trusted + at(7));

        heartbeats.broken(start + at(8), "connection reset".into());
        let late = heartbeats.trusted_until();
        assert!(!heartbeats.resumed(late));
        let loss = heartbeats.ran_out(late).expect("ran out");
        assert_eq!(loss.cause, LostCause::ConnectionLost);
        assert!(loss.reason.contains("connection reset"), "{}", loss.reason);
    }

    #[test]
    fn the_server_ending_the_session_is_an_expiry_in_its_words() {
        let start = Instant::now();
        let heartbeats = Heartbeats::opened(start, TTL);
        let loss = heartbeats.gone(start + at(1), "session ended by an operator");
        assert_eq!(loss.cause, LostCause::SessionExpired);
        assert!(
            loss.reason.contains("ended by an operator"),
            "{}",
            loss.reason
        );
        // Found gone after its trust ran out, it was lost to the silence first.
        let loss = heartbeats.gone(start + TTL, "unknown session");
        assert_eq!(loss.cause, LostCause::ConnectionLost);
    }
}
