//! Session liveness on the leader: heartbeats answered under the leader's
//! lease, without a log write, and the expiries decided from them.
//!
//! A heartbeat changes nothing any other member needs to know while this
//! member leads: only the leader decides expiries. So the leader answers it
//! at once from memory, as long as it knows that no other member can be
//! leader (openraft's leader lease: a quorum acknowledged it within the
//! lease, and each of those members refuses to vote for anyone else until
//! the lease has passed on its own clock), and notes when it heard the
//! session. When it cannot be sure (no lease, or the session is already
//! past its deadline here and may be expiring), the heartbeat goes through
//! the log as a [`Command::Heartbeat`] record instead, ordered against any
//! expiry by the log itself. Once the core has answered one, the stream's
//! reader answers the next ones without the core, through the session's
//! [`Pulse`] (module [`crate::pulse`]), which the core closes before it
//! decides the session's expiry.
//!
//! Each session's deadline here is the later of the replicated floor
//! ([`locksmith_core::Engine::session_expires_at`]: moved by its open, a
//! resume and a new leader's grace) and the last heartbeat heard here plus
//! its TTL. The engine keeps no timer per session
//! ([`locksmith_core::Engine::time_sessions_by_caller`]); this module keeps
//! one check per session, at the deadline the session had when last looked
//! at. A heartbeat only writes the time it was heard; a check that finds the
//! deadline moved puts itself off to the new one, so a session costs one
//! reordering per TTL, not one per heartbeat, and nothing is scanned per
//! tick. An expiry names the deadline it was decided from
//! ([`Command::ExpireSession`]): applied, it ends the session unless a
//! logged heartbeat or grace moved the floor past it meanwhile.
//!
//! docs/architecture.md ("Sessions under the leader's lease") gives the
//! argument why no hold is lost early or kept too long.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::{Command, Millis, SessionId};

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::core::replicated::Replicated;
use crate::pulse::Pulse;

/// How much of openraft's leader lease a leader counts on: the members'
/// clocks may run at rates apart by up to 1 % (a follower whose clock runs
/// fast ends its side of the lease early, in real time), and 2 ms more for
/// reading the time on two threads. Redlock's drift rule, applied to the
/// lease.
pub(crate) fn usable_lease(lease: Duration) -> Duration {
    lease.saturating_sub(lease / 100 + Duration::from_millis(2))
}

/// How much of openraft's leader lease (its longest election timeout) a
/// leader of `config` counts on to answer heartbeats.
pub(crate) fn heartbeat_lease(config: &ServerConfig) -> Duration {
    usable_lease(config.election_timeout * 2)
}

/// When each session was last heard here, and when to look at it next.
#[derive(Default)]
pub(super) struct Liveness {
    /// The pulse of each session heard since this member leads (module
    /// [`crate::pulse`]): the time of the last heartbeat answered here under
    /// the lease (this member's clock), by the core or by the reader of the
    /// stream the session is attached to.
    heard: HashMap<SessionId, Arc<Pulse>>,
    /// One check per session this member times, at the deadline the
    /// session had when last looked at, soonest first.
    checks: BTreeSet<(Millis, SessionId)>,
}

impl Liveness {
    /// Times every open session of `state` from its replicated floor (a new
    /// leader, once its grace is applied: nobody was heard here yet).
    pub(super) fn time_all(&mut self, state: &Replicated) {
        for pulse in self.heard.values() {
            pulse.reset();
        }
        self.checks = state
            .sessions()
            .filter_map(|session| Some((state.engine().session_expires_at(session)?, session)))
            .collect();
    }

    /// Times `session`, just opened, from its replicated floor.
    pub(super) fn time(&mut self, state: &Replicated, session: SessionId) {
        if let Some(floor) = state.engine().session_expires_at(session) {
            self.checks.insert((floor, session));
        }
    }

    /// Forgets every session (this member no longer leads): no reader
    /// answers any more.
    pub(super) fn forget_all(&mut self) {
        for pulse in self.heard.values() {
            pulse.close();
        }
        self.heard = HashMap::new();
        self.checks = BTreeSet::new();
    }

    /// `session` ended: nothing more is noted of it (its check goes when it
    /// falls due), and its stream's reader answers no more.
    pub(super) fn forget(&mut self, session: SessionId) {
        if let Some(pulse) = self.heard.remove(&session) {
            pulse.close();
        }
    }

    /// A stream with `pulse` was attached to `session`: from now on its
    /// reader may answer once the core has (the pulse is closed until
    /// then). The pulse of the stream it replaces, if any, is closed and
    /// its time carried over.
    pub(super) fn attach(&mut self, session: SessionId, pulse: Arc<Pulse>) {
        if let Some(old) = self.heard.insert(session, pulse.clone()) {
            pulse.carry(old.close());
        }
    }

    /// The deadline of `session` here, if it is open: the later of the
    /// replicated floor and the last heartbeat heard here plus its TTL.
    pub(super) fn deadline(&self, state: &Replicated, session: SessionId) -> Option<Millis> {
        let engine = state.engine();
        let floor = engine.session_expires_at(session)?;
        let heard = self.heard.get(&session).map_or(0, |pulse| {
            pulse
                .heard()
                .saturating_add(engine.session_ttl(session).unwrap_or(0))
        });
        Some(floor.max(heard))
    }

    /// Notes a heartbeat of `session` answered here at `now` under the
    /// lease; its stream's reader may answer the next ones.
    pub(super) fn heard(
        &mut self,
        state: &Replicated,
        session: SessionId,
        now: Millis,
        clock: &Clock,
    ) {
        if let Some(pulse) = self.heard.get(&session) {
            let ttl = state.engine().session_ttl(session).unwrap_or(0);
            pulse.open(now, ttl, clock);
        }
    }

    /// When the next check falls due.
    pub(super) fn next_check(&self) -> Option<Millis> {
        self.checks.first().map(|&(at, _)| at)
    }

    /// The expiries due at `now`, at most `max`, soonest first. A check
    /// whose session lives on is put off to its deadline; one whose session
    /// is gone is dropped; one that is due stays until its session is gone,
    /// so that an expiry voided by a logged heartbeat is looked at again.
    /// (The caller decides no expiry while one it decided is in flight.)
    pub(super) fn due(&mut self, state: &Replicated, now: Millis, max: usize) -> Vec<Command> {
        let mut due = Vec::new();
        let mut moved = Vec::new();
        for &(at, session) in self.checks.range(..=(now, SessionId(u64::MAX))) {
            if due.len() >= max {
                break;
            }
            match self.deadline(state, session) {
                None => moved.push((at, session, None)),
                Some(deadline) if deadline > now => moved.push((at, session, Some(deadline))),
                Some(_) => {
                    // No reader answers from here on: a heartbeat it
                    // answered before shows in the deadline read after.
                    if let Some(pulse) = self.heard.get(&session) {
                        pulse.close();
                    }
                    match self.deadline(state, session) {
                        Some(deadline) if deadline > now => {
                            moved.push((at, session, Some(deadline)))
                        }
                        Some(deadline) => due.push(Command::ExpireSession { session, deadline }),
                        None => moved.push((at, session, None)),
                    }
                }
            }
        }
        for (at, session, deadline) in moved {
            self.checks.remove(&(at, session));
            match deadline {
                Some(deadline) => {
                    self.checks.insert((deadline, session));
                }
                None => self.forget(session),
            }
        }
        due
    }
}
