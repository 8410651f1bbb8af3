//! The front end's side of Raft (openraft): the role, and the batches in
//! flight.
//!
//! Only the leader proposes: each batch of client ops becomes one log entry
//! ([`Batch`]), handed to openraft by this thread (module `raft::propose`),
//! replicated and committed on a quorum. Every member, the leader included,
//! applies committed entries in one place: when openraft's state machine
//! hands them to the core ([`crate::inbox::RaftEvent::Apply`]), in log
//! order, the same on replay (module `replicated`). The leader knows its own
//! batches among them by what each entry carries: its origin (a random
//! number per leadership stint) and sequence number, the same on every
//! member, known before openraft gives the entry its log id (learning that
//! would cost a message back per batch). It sends their results where the
//! routes it kept for them say; other members apply the same records with
//! nobody to tell. Several batches may
//! be in flight at a time (`max_batches_in_flight`), so that the next batch
//! is written and replicated while the last one commits; past that, new ops
//! gather in the backlog and form a bigger next batch (the group commit).
//! Nothing of a batch is decided before it is applied, in log order, so
//! batches in flight never see each other's effects early. The one
//! exception is time: an expiry is decided from the applied state, so while
//! a batch carrying expiries is in flight no other is decided (it would
//! repeat them).
//!
//! A member that becomes leader first proposes `GrantGrace` (every session,
//! lease and lock-delay deadline pushed past the failover), and serves
//! nothing before that entry is applied: by then it has applied everything
//! committed before its term.
//!
//! A member that stops being leader drops what it was doing for clients,
//! tells them where the leader is, and ends their streams; they resume their
//! sessions there and send again what was not answered. A leader whose
//! batch openraft refuses (cut off from a quorum) ends them too, marked
//! [`locksmith_proto::CUT_OFF_METADATA`]: its followers may still name it
//! for a moment, and the mark tells clients not to come straight back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use locksmith_core::{Command, Millis};
use tokio::sync::watch;
use tonic::Status;

use super::{FrontEnd, Proposal, Route};
use crate::core::replicated::Replicated;
use crate::entry::Batch;
#[cfg(test)]
use crate::entry::Record;
use crate::inbox::{CoreSender, Role};
use crate::op::Op;
use crate::raft::propose::Proposer;
use crate::raft::Raft;

/// How long a leader proposes nothing after openraft refused one of its
/// batches: long enough not to spin while an election settles, short beside
/// the election timeout, so a leader that keeps its role carries on soon.
pub(in crate::core) const REFUSAL_PAUSE: Millis = 20;

/// The front end's side of replication: the role, and the batches in
/// flight.
pub(crate) struct Replica {
    /// Hands batches to openraft, in order.
    proposer: Proposer,
    pub(in crate::core) role: Leadership,
    /// This member's address as the members know it (learnt when it
    /// leads): sessions opened or resumed here are told it, so that a
    /// client that reached it under another name knows the leader hints
    /// that name it.
    pub(in crate::core) address: Option<String>,
    next_seq: u64,
    /// The batches this leader proposed and has not applied yet, oldest
    /// first (they are applied in this order).
    in_flight: VecDeque<InFlight>,
    /// How many batches may be in flight at once.
    max_in_flight: usize,
    /// Whether this member serves clients (leads, ready).
    pub(in crate::core) serving: watch::Sender<bool>,
    /// openraft refused a batch: nothing is proposed until the front end
    /// resumes (see `FrontEnd::refused`).
    paused: bool,
}

/// What the front end knows of its role.
pub(in crate::core) enum Leadership {
    /// Another member leads (its address when known), or nobody yet.
    Follower { leader: Option<String> },
    /// This member leads; `stint` marks the batches it proposes, and it
    /// serves once its first entry (`GrantGrace`) is applied.
    Leader { stint: u64, ready: bool },
}

/// A proposed batch: where its results go once it is applied.
pub(in crate::core) struct InFlight {
    seq: u64,
    /// Its routes, reads and refusals (its records went to openraft).
    pub(in crate::core) proposal: Proposal,
    /// The first entry of a leadership stint.
    pub(in crate::core) grace: bool,
    /// It carries expiries decided from the state before it.
    expiries: bool,
    /// When it was proposed, for the commit latency.
    pub(in crate::core) proposed_at: Instant,
}

impl Replica {
    pub(crate) fn new(
        proposer: Proposer,
        serving: watch::Sender<bool>,
        max_in_flight: usize,
    ) -> Replica {
        Replica {
            proposer,
            role: Leadership::Follower { leader: None },
            address: None,
            next_seq: 0,
            in_flight: VecDeque::new(),
            max_in_flight: max_in_flight.max(1),
            serving,
            paused: false,
        }
    }

    /// Whether this member leads and has applied its first entry.
    pub(in crate::core) fn serving(&self) -> bool {
        matches!(self.role, Leadership::Leader { ready: true, .. })
    }

    /// Whether this member leads (ready or not).
    pub(in crate::core) fn leading(&self) -> bool {
        matches!(self.role, Leadership::Leader { .. })
    }

    /// Whether this member leads under a lease that `lease` of a quorum's
    /// acknowledgement gives it (see [`Proposer::lease_holds`]).
    pub(in crate::core) fn lease_holds(&self, lease: std::time::Duration) -> bool {
        self.leading() && self.proposer.lease_holds(lease)
    }

    /// Makes [`Replica::lease_holds`] say `holds` (no openraft here).
    #[cfg(test)]
    pub(in crate::core) fn lease_in_tests(&mut self, holds: bool) {
        self.proposer.lease_in_tests = holds;
    }

    /// Whether a new batch may be proposed now.
    pub(in crate::core) fn can_propose(&self) -> bool {
        self.serving() && !self.paused && self.in_flight.len() < self.max_in_flight
    }

    /// The records of each batch in flight, oldest first.
    #[cfg(test)]
    pub(in crate::core) fn records_in_flight(&self) -> Vec<Vec<Record>> {
        let held = self.proposer.held();
        self.in_flight
            .iter()
            .filter_map(|f| held.iter().find(|b| b.seq == f.seq))
            .map(|b| b.records.to_vec())
            .collect()
    }

    /// How many batches may be in flight at once.
    #[cfg(test)]
    pub(in crate::core) fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Whether time-driven changes may be decided now: not while expiries
    /// decided earlier are in flight, which would be decided again.
    pub(in crate::core) fn can_expire(&self) -> bool {
        self.can_propose() && !self.in_flight.iter().any(|f| f.expiries)
    }

    /// Sessions opened by batches in flight, not applied yet.
    pub(in crate::core) fn opening(&self) -> usize {
        self.in_flight.iter().map(|f| f.proposal.opens).sum()
    }

    /// The answer of a member that cannot serve a request: where the leader
    /// is, if it knows.
    pub(in crate::core) fn redirect(&self) -> Status {
        match &self.role {
            Leadership::Follower {
                leader: Some(leader),
            } => {
                let mut status =
                    Status::unavailable(format!("not the leader: the leader is {leader}"));
                if let Ok(value) = leader.parse() {
                    status
                        .metadata_mut()
                        .insert(locksmith_proto::LEADER_METADATA, value);
                }
                status
            }
            Leadership::Follower { leader: None } => {
                Status::unavailable("no leader yet: an election is under way")
            }
            Leadership::Leader { .. } => {
                Status::unavailable("this member has just become leader and is catching up")
            }
        }
    }

    /// Hands `proposal`'s records to openraft as one entry and keeps the rest
    /// until it is applied.
    fn propose(&mut self, mut proposal: Proposal, grace: bool, expiries: bool) {
        let Leadership::Leader { stint, .. } = self.role else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let records = std::mem::take(&mut proposal.records);
        let batch = Batch {
            origin: stint,
            seq,
            records: Arc::new(records),
        };
        // In flight before openraft may refuse it (and say so).
        self.in_flight.push_back(InFlight {
            seq,
            proposal,
            grace,
            expiries,
            proposed_at: Instant::now(),
        });
        self.proposer.propose(batch, grace);
    }

    /// The routes of the batch `origin`/`seq`, if this member proposed it in
    /// its current stint.
    pub(in crate::core) fn take_own(&mut self, origin: u64, seq: u64) -> Option<InFlight> {
        match self.role {
            Leadership::Leader { stint, .. } if stint == origin => {}
            _ => return None,
        }
        // Applied in the order proposed: the oldest, unless an older one was
        // refused and abandoned meanwhile.
        let at = self.in_flight.iter().position(|f| f.seq == seq)?;
        self.in_flight.remove(at)
    }
}

impl FrontEnd {
    /// Connects the front end to openraft, once started, before the core's
    /// thread runs; `ops` is the core's own channel, for batches openraft
    /// refuses.
    pub(in crate::core) fn connect_raft(&mut self, raft: Raft, ops: CoreSender) {
        self.replica.proposer.attach(raft, ops);
    }

    /// Proposes the batch being built, if it holds anything; `expiries`:
    /// it carries time-driven changes.
    pub(in crate::core) fn propose_batch(&mut self, proposal: Proposal, expiries: bool) {
        if proposal.is_empty() {
            self.proposal = proposal;
            return;
        }
        self.replica.propose(proposal, false, expiries);
    }

    /// The routes of this member's batch `origin`/`seq`, once it is
    /// committed; none for a batch of another stint or member.
    pub(in crate::core) fn take_own(&mut self, origin: u64, seq: u64) -> Option<InFlight> {
        let own = self.replica.take_own(origin, seq);
        if own.is_some() && self.cut_off {
            // Committed: a quorum heard this member.
            tracing::info!("a quorum hears this member again: committing");
            self.cut_off = false;
        }
        own
    }

    /// The member's role changed (openraft's metrics said so).
    pub(in crate::core) fn change_role(&mut self, state: &Replicated, role: Role) {
        match role {
            Role::Leader { address } => {
                if address.is_some() {
                    self.replica.address = address;
                }
                if self.replica.leading() {
                    return;
                }
                let stint = crate::random::u64();
                self.replica.role = Leadership::Leader {
                    stint,
                    ready: false,
                };
                self.cut_off = false;
                // Time never goes backwards from what the last leader stamped.
                self.clock.restart_after(state.last_now() + 1);
                self.end_pause(false);
                self.propose_grace();
                tracing::info!("elected leader: serving once the grace period is committed");
            }
            Role::Follower { leader } => {
                let was_leading = self.replica.leading();
                self.replica.role = Leadership::Follower { leader };
                self.end_pause(false);
                self.replica.serving.send_replace(false);
                if was_leading {
                    self.stop_leading();
                    self.liveness.forget_all();
                }
            }
        }
    }

    /// Ends the pause after a refusal once it is due (see
    /// [`FrontEnd::refused`]): a leader that has not served yet proposes
    /// its grace entry again.
    pub(in crate::core) fn resume_after_refusal(&mut self, now: Millis) {
        if self.resume_at.is_some_and(|at| at <= now) {
            self.end_pause(true);
        }
    }

    /// Proposing may go on (again), and a leader that has not served yet
    /// proposes its grace entry again if `grace_again`.
    fn end_pause(&mut self, grace_again: bool) {
        let paused = std::mem::replace(&mut self.replica.paused, false);
        self.resume_at = None;
        if paused && grace_again && self.replica.leading() && !self.replica.serving() {
            self.propose_grace();
        }
    }

    /// Proposes a stint's first entry: every deadline pushed past the
    /// failover; the leader serves once it is applied.
    fn propose_grace(&mut self) {
        let now = self.clock.now();
        let mut proposal = Proposal::default();
        let grace = Command::GrantGrace { grace: self.grace };
        proposal.command(now, grace, None, None, Route::Nobody);
        self.replica.propose(proposal, true, false);
    }

    /// No longer the leader: everyone waiting here is told where the leader
    /// is; what this member proposed may still commit (the new leader then
    /// applies it), but nobody here will hear of it.
    fn stop_leading(&mut self) {
        let status = self.replica.redirect();
        tracing::info!(%status, "no longer the leader");
        self.abandon_all(&status);
        self.send_output();
    }

    /// Answers everyone waiting here with `status` and ends every stream.
    pub(in crate::core) fn abandon_all(&mut self, status: &Status) {
        while let Some(in_flight) = self.replica.in_flight.pop_front() {
            self.abandon(in_flight.proposal, status);
        }
        let ops: Vec<Op> = self.backlog.drain(..).collect();
        for op in ops {
            self.refuse(op, status.clone());
        }
        for (_, waiter) in self.leases.drain() {
            let _ = waiter.reply.send(Err(status.clone()));
        }
        self.end_streams(status);
        self.proposal = Proposal::default();
    }

    /// openraft refused this leader's batch `origin`/`seq` (never appended):
    /// this member cannot reach a quorum. Everyone waiting here is told to
    /// try another member, and the streams end so that their clients do.
    /// The member proposes nothing for [`REFUSAL_PAUSE`], then goes on
    /// proposing what comes, in case the quorum returns: openraft refuses
    /// while its role changes (an election under way, which the core hears
    /// of after openraft), and what was refused would be proposed again at
    /// once (the expiries it carried are due still, a grace entry is needed
    /// still) and refused at once, over and over, until the election ends.
    pub(in crate::core) fn refused(&mut self, origin: u64, seq: u64, reason: &str) {
        let Some(in_flight) = self.replica.take_own(origin, seq) else {
            return;
        };
        // Refused again every pause while cut off: said once, until a batch
        // commits again.
        if self.cut_off {
            tracing::debug!(%reason, "cannot commit still");
        } else {
            tracing::warn!(%reason, "cannot commit: no quorum reachable; sending clients elsewhere");
        }
        self.cut_off = true;
        let status = self.cut_off_status(reason);
        self.abandon(in_flight.proposal, &status);
        for (_, waiter) in self.leases.drain() {
            let _ = waiter.reply.send(Err(status.clone()));
        }
        self.end_streams(&status);
        // A refused grace entry is proposed again when the pause ends (the
        // member does not serve before it is committed).
        self.replica.paused = true;
        self.resume_at = Some(self.clock.now() + REFUSAL_PAUSE);
        self.send_output();
    }

    /// The refusal of a leader that cannot reach a quorum, for `reason`.
    /// Its mark says for how many milliseconds its followers may still name
    /// it (until they elect another): the client passes it over that long.
    pub(in crate::core) fn cut_off_status(&self, reason: &str) -> Status {
        let mut status = Status::unavailable(format!(
            "this member cannot reach a quorum of the cluster ({reason}): try another member"
        ));
        let millis = u64::try_from(self.elects_within.as_millis()).unwrap_or(u64::MAX);
        status.metadata_mut().insert(
            locksmith_proto::CUT_OFF_METADATA,
            tonic::metadata::MetadataValue::from(millis),
        );
        status
    }

    /// Answers everyone a proposal would have answered with `status`.
    fn abandon(&mut self, proposal: Proposal, status: &Status) {
        for route in proposal.routes {
            match route {
                Route::Unary(answer) | Route::EndSession { answer, .. } => {
                    let status = status.clone();
                    self.output
                        .unary
                        .push(Box::new(move || answer(Err(status))));
                }
                Route::Open { stream, .. } => {
                    self.output
                        .streams
                        .end(stream.id, &stream.tx, status.clone());
                    stream.pulse.end();
                }
                Route::Nobody
                | Route::Stream { .. }
                | Route::Heartbeat { .. }
                | Route::Lease { .. } => {}
            }
        }
        for read in proposal.reads {
            self.refuse(read, status.clone());
        }
    }

    /// Answers `op` with `status` and runs nothing.
    pub(in crate::core) fn refuse(&mut self, op: Op, status: Status) {
        fn answer<T: Send + 'static>(
            front: &mut FrontEnd,
            reply: crate::op::UnaryReply<T>,
            status: Status,
        ) {
            front.defer(reply, Err(status));
        }
        match op {
            Op::Open { stream, .. } | Op::Resume { stream, .. } => {
                self.output.streams.end(stream.id, &stream.tx, status);
                stream.pulse.end();
            }
            Op::AcquireLease { reply, .. } => answer(self, reply, status),
            Op::Release { reply, .. } => answer(self, reply, status),
            Op::Renew { reply, .. } => answer(self, reply, status),
            Op::Describe { reply, .. } => answer(self, reply, status),
            Op::List { reply, .. } => answer(self, reply, status),
            Op::ListSessions { reply } => answer(self, reply, status),
            Op::History { reply, .. } => answer(self, reply, status),
            Op::ForceRelease { reply, .. } => answer(self, reply, status),
            Op::CloseSession { reply, .. } => answer(self, reply, status),
            Op::EndSession { reply, .. } => answer(self, reply, status),
            // Nothing waits for these.
            Op::Stream { .. }
            | Op::Detach { .. }
            | Op::CancelLease { .. }
            | Op::RaiseClusterVersion { .. } => {}
        }
    }
}
