//! The leader's front end: everything about clients that only this member
//! knows, and that no other member needs or could agree on.
//!
//! [`FrontEnd`] holds the session streams and which session each one is
//! attached to, the unary calls and sessionless acquires waiting for an
//! answer, the backlog of client ops, the batch being built, the routes of
//! the batches in flight, the clock that stamps records, the role, and the
//! output of the step under way. It reads the replicated state
//! ([`Replicated`]) to decide what to propose (limits, a resume's secret,
//! the work of a session's end, what is due), and never changes it: it
//! turns ops into log records and keeps, for each, a [`Route`] (where its
//! result goes); once the record is committed and applied, it sends the
//! [`Notice`](crate::core::replicated::Notice)s the state returned where
//! the route says (module `deliver`).
//!
//! - `propose`: what each op becomes (records and routes), and the reads;
//! - `sessions`: streams opening, resuming, attaching and detaching;
//! - `liveness`: heartbeats answered under the leader's lease, and the
//!   session expiries decided from them;
//! - `replica`: the role, and the batches in flight until they are applied;
//! - `deliver`: notices and results to streams and unary calls.

mod deliver;
mod liveness;
mod propose;
mod replica;
mod sessions;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith_core::planted::{self, Defect};
use locksmith_core::{Command, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use super::replicated::Replicated;
use crate::clock::{Clock, WallClock};
use crate::config::ServerConfig;
use crate::entry::{LogRecord, Record, ENTRY_BYTES};
use crate::metrics::{Metrics, Tally};
use crate::op::{NewStream, Op, StreamId, StreamOp, UnaryReply};
use crate::outbox::{LeaseWaiter, Orphan, Output};
use crate::stats::Stats;
pub(crate) use liveness::heartbeat_lease;
use liveness::Liveness;
pub(crate) use replica::Replica;
#[cfg(test)]
pub(super) use replica::REFUSAL_PAUSE;
pub(super) use replica::{InFlight, Leadership};
use sessions::{Link, PeerCounts};

/// Due commands with more work than this (`Engine::work_of`: a session of
/// many holds ending) go in a log entry of their own rather than with client
/// ops, whose replies would wait for them. About 0.3 ms of engine time here.
pub(super) const WORK_THAT_RIDES_ALONG: usize = 256;

/// The records one batch proposes, in order, and where each one's result
/// goes (`routes[i]` is the route of `records[i]`), plus the inspection ops
/// answered once they are applied.
#[derive(Default)]
pub(super) struct Proposal {
    pub(super) records: Vec<Record>,
    pub(super) routes: Vec<Route>,
    pub(super) reads: Vec<Op>,
    /// Requests refused before they became records, answered in their place
    /// among the others: `(records before it, session, request id, error)`.
    pub(super) refused: Vec<(usize, SessionId, u64, pb::Error)>,
    /// `OpenSession` records among them, for the session limit.
    pub(super) opens: usize,
}

impl Proposal {
    /// Whether it holds nothing to propose (no record, read or refusal).
    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.reads.is_empty() && self.refused.is_empty()
    }

    /// Adds an engine command and where its result goes.
    pub(super) fn command(
        &mut self,
        now: Millis,
        command: Command,
        secret: Option<u128>,
        request: Option<u64>,
        route: Route,
    ) {
        self.records.push(Record::Command(LogRecord {
            now,
            command,
            secret,
            request,
        }));
        self.routes.push(route);
    }
}

/// Where the result of a record goes once it is applied. Local to the
/// member that proposed the record: never logged; a record this member did
/// not propose (or replays) has none ([`Route::Nobody`]).
pub(crate) enum Route {
    /// Nobody waits for the result here (the clock, a replay, a close).
    Nobody,
    /// A session's request: replies go to the stream the session is
    /// attached to; an acquire that has to wait says so if asked.
    Stream { notify_queued: bool },
    /// A session's heartbeat: acknowledged on its stream.
    Heartbeat { session: SessionId },
    /// The stream that opens `session`.
    Open {
        stream: NewStream,
        session: SessionId,
    },
    /// A sessionless acquire, whose waiter is in the front end's leases.
    Lease { request: u64 },
    /// A unary call's answer.
    Unary(Answer),
    /// An administrator's end of `session` (the stream is told why first).
    EndSession { session: SessionId, answer: Answer },
}

impl Route {
    /// A session's request answered on its stream, with no `queued` notice.
    pub(crate) const ON_STREAM: Route = Route::Stream {
        notify_queued: false,
    };
}

/// Sends a unary call's answer (its response has no fields).
pub(crate) type Answer = Box<dyn FnOnce(Result<(), Status>) + Send>;

/// The [`Answer`] of a unary call whose response has no fields.
pub(super) fn answer<T: Default + Send + 'static>(reply: UnaryReply<T>) -> Answer {
    Box::new(move |result| {
        let _ = reply.send(result.map(|()| T::default()));
    })
}

impl Route {
    pub(super) fn unary<T: Default + Send + 'static>(reply: UnaryReply<T>) -> Route {
        Route::Unary(answer(reply))
    }
}

/// The leader's front end (see the module docs).
pub(crate) struct FrontEnd {
    /// Stamps the records this member proposes.
    clock: Clock,
    pub(super) replica: Replica,
    grace: Millis,
    max_sessions: usize,
    max_sessions_per_peer: usize,
    /// Open sessions per client address.
    peers: PeerCounts,
    max_batch: usize,
    /// The session each stream speaks for.
    streams: HashMap<StreamId, SessionId>,
    /// Each session's stream and client address, while it has them.
    links: HashMap<SessionId, Link>,
    /// Sessionless acquires waiting for their outcome.
    leases: HashMap<u64, LeaseWaiter>,
    /// The next session id to hand out, unless the applied state is past it.
    next_session: u64,
    /// Request ids of sessionless acquires, shared with the service that
    /// picks them.
    next_unary: Arc<AtomicU64>,
    /// What is sent once the records it answers are applied.
    pub(super) output: Output,
    /// The records of the batch being built.
    pub(super) proposal: Proposal,
    orphans: Vec<Orphan>,
    pub(super) shutting_down: bool,
    stats: Arc<Stats>,
    /// Client ops looked at (their heartbeats taken out), waiting for their
    /// batch.
    pub(super) backlog: VecDeque<Op>,
    metrics: Option<Arc<Metrics>>,
    /// When each session was heard here, and its expiry checks.
    liveness: Liveness,
    /// How long a quorum's acknowledgement keeps this member sure that it
    /// leads (see [`liveness::usable_lease`]).
    lease: Duration,
    /// How long followers that stopped hearing from their leader may take
    /// to elect another: openraft's longest election timeout.
    elects_within: Duration,
    /// When proposing resumes after openraft refused a batch (see
    /// [`FrontEnd::refused`]).
    resume_at: Option<Millis>,
    /// openraft refused a batch of this stint (no quorum heard for its
    /// lease), and none has committed since: the member may be cut off.
    pub(in crate::core) cut_off: bool,
}

impl FrontEnd {
    pub(crate) fn new(config: &ServerConfig, replica: Replica, stats: Arc<Stats>) -> FrontEnd {
        FrontEnd {
            clock: Clock::new(std::time::SystemTime::now),
            replica,
            grace: config.grace.as_millis() as Millis,
            max_sessions: config.max_sessions,
            max_sessions_per_peer: config.max_sessions_per_peer,
            peers: PeerCounts::default(),
            max_batch: config.max_batch.max(1),
            streams: HashMap::new(),
            links: HashMap::new(),
            leases: HashMap::new(),
            next_session: 1,
            next_unary: Arc::new(AtomicU64::new(1)),
            output: Output::default(),
            proposal: Proposal::default(),
            orphans: Vec::new(),
            shutting_down: false,
            stats,
            backlog: VecDeque::new(),
            metrics: None,
            liveness: Liveness::default(),
            resume_at: None,
            cut_off: false,
            lease: liveness::heartbeat_lease(config),
            elects_within: config.election_timeout * 2,
        }
    }

    /// Counts what the front end does from now on in `metrics`.
    pub(super) fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The counter of sessionless request ids, for the service.
    pub(super) fn unary_ids(&self) -> Arc<AtomicU64> {
        self.next_unary.clone()
    }

    /// Reads the wall clock from `wall` from now on (a simulation's).
    pub(super) fn use_wall_clock(&mut self, wall: WallClock) {
        self.clock = Clock::new(wall);
    }

    /// The time on this member's clock.
    pub(super) fn now(&self) -> Millis {
        self.clock.now()
    }

    /// When the engine's next deadline is due, on this member's clock, if
    /// this member decides deadlines now.
    /// And when proposing resumes after a refusal.
    pub(super) fn next_deadline(&self, state: &Replicated) -> Option<tokio::time::Instant> {
        let at = if self.replica.can_expire() {
            let engine = state.engine().next_deadline();
            engine
                .into_iter()
                .chain(self.liveness.next_check())
                .chain(self.resume_at)
                .min()
        } else {
            self.resume_at
        };
        self.clock.instant_of(at?)
    }

    /// Takes a client op that arrived: the leader's backlog takes it (its
    /// heartbeats are answered or proposed at once, see
    /// [`FrontEnd::take_heartbeats`]);
    /// any other member tells its client where the leader is.
    pub(super) fn arrive(&mut self, state: &Replicated, now: Millis, mut op: Op) {
        if let Op::Detach { stream, error } = op {
            return self.detach(stream, error);
        }
        if !self.replica.leading() {
            let status = self.replica.redirect();
            return self.refuse(op, status);
        }
        if self.replica.serving() && self.take_heartbeats(state, now, &mut op) {
            return;
        }
        self.backlog.push_back(op);
    }

    /// Proposes the next batch: the backlog's next ops (`next_batch`), then
    /// the time-driven commands that are due.
    pub(super) fn propose_next(
        &mut self,
        state: &Replicated,
        now: Millis,
        batch: &mut Vec<Op>,
        started: Instant,
    ) {
        self.next_batch(state, batch);
        let count: usize = batch.iter().map(Op::count).sum();
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.ops.fetch_add(count as u64, Ordering::Relaxed);
        let tally = self.metrics.as_ref().map(|_| Tally::of(batch));
        let mut proposal = std::mem::take(&mut self.proposal);
        self.propose_orphan_releases(now, &mut proposal);
        for op in batch.drain(..) {
            self.propose(state, now, op, &mut proposal);
        }
        // After the client ops: a heartbeat or renew in this batch wins.
        let (due, work) = match self.replica.can_expire() {
            true => self.due_within_budget(state, now),
            false => (Vec::new(), 0),
        };
        let expiries = !due.is_empty();
        if work > WORK_THAT_RIDES_ALONG && !proposal.is_empty() {
            // A big expiry (a session of many holds) gets an entry of its
            // own, after the client ops': their replies leave as soon as
            // their entry is applied instead of waiting for it too.
            self.count_entry(&proposal);
            self.propose_batch(std::mem::take(&mut proposal), false);
        }
        for command in due {
            proposal.command(now, command, None, None, Route::Nobody);
        }
        self.count_entry(&proposal);
        if let (Some(metrics), Some(tally)) = (&self.metrics, tally) {
            metrics.batch_done(count, &tally, Instant::now() - started);
        }
        self.propose_batch(proposal, expiries);
    }

    /// Counts a log entry about to be proposed, for the stats.
    fn count_entry(&self, proposal: &Proposal) {
        if !proposal.records.is_empty() {
            self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.stats
                .records
                .fetch_add(proposal.records.len() as u64, Ordering::Relaxed);
        }
    }

    /// Whether there is something to propose without waiting for an op.
    pub(super) fn has_work(&self) -> bool {
        self.replica.can_propose()
            && (!self.backlog.is_empty()
                || !self.proposal.records.is_empty()
                || !self.orphans.is_empty())
    }

    /// Takes the heartbeats out of `op`, as they arrive, ahead of its other
    /// ops and of any expiry, so that one client cannot expire another by
    /// keeping the core busy, however long the backlog. Each is answered at
    /// once under the leader's lease, without a log write, if the session
    /// is alive here (module `liveness`); else it goes into the batch being
    /// built as a record, answered once applied. One answer each: the
    /// client pairs every answer with the oldest heartbeat it has not seen
    /// answered, so two heartbeats read together and answered once would
    /// leave it a heartbeat behind for the rest of the stream, until it gave
    /// its session up while the server still answered.
    ///
    /// True when nothing is left of `op` (heartbeats only, no
    /// acknowledgements): an idle session's message then ends here, and
    /// costs the backlog and the next batch nothing.
    fn take_heartbeats(&mut self, state: &Replicated, now: Millis, op: &mut Op) -> bool {
        let Op::Stream { stream, acks, ops } = op else {
            return false;
        };
        let Some(&session) = self.streams.get(stream) else {
            return false;
        };
        let before = ops.len();
        ops.retain(|o| !matches!(o, StreamOp::Heartbeat));
        let heartbeats = before - ops.len();
        // With the dropped heartbeats or the missing deadline check put
        // back, every heartbeat is a record, as when those defects shipped
        // (answers under the lease came later).
        let alive = heartbeats > 0
            && !planted::active(Defect::HeartbeatsDropped)
            && !planted::active(Defect::NoDeadlineCheck)
            && self
                .liveness
                .deadline(state, session)
                .is_some_and(|deadline| deadline > now)
            && self.replica.lease_holds(self.lease);
        for _ in 0..heartbeats {
            if alive {
                self.liveness.heard(state, session, now, &self.clock);
                self.send_to(session, crate::convert::heartbeat_ack(now));
            } else {
                let heartbeat = Command::Heartbeat { session };
                self.proposal
                    .command(now, heartbeat, None, None, Route::Heartbeat { session });
            }
        }
        if ops.len() < before && ops.is_empty() {
            if acks.replies.is_empty() && acks.lost.is_empty() {
                return true;
            }
            ops.push(StreamOp::AckOnly);
        }
        false
    }

    /// Takes the next batch from the backlog: ops in arrival order, up to
    /// `max_batch` units of work, so that no batch holds the engine thread
    /// for long however much is queued, and up to about
    /// [`ENTRY_BYTES`], so that its log entry fits in the members'
    /// messages (at least one op either way).
    pub(super) fn next_batch(&mut self, state: &Replicated, batch: &mut Vec<Op>) {
        let (mut work, mut bytes) = (0, 0);
        while let Some(op) = self.backlog.front() {
            if !batch.is_empty() && bytes >= ENTRY_BYTES {
                break;
            }
            work += self.work_of(state, op);
            bytes += op.entry_bytes();
            if work > self.max_batch && !batch.is_empty() {
                break;
            }
            batch.extend(self.backlog.pop_front());
        }
    }

    /// The work `op` brings into a batch: a unit per message, and a
    /// session's end by the holds and waits it releases
    /// ([`locksmith_core::Engine::work_of`]).
    fn work_of(&self, state: &Replicated, op: &Op) -> usize {
        let end = |session| state.engine().work_of(&Command::CloseSession { session });
        match op {
            Op::CloseSession { session, .. } | Op::EndSession { session, .. } => end(*session),
            Op::Stream { stream, ops, .. } if ops.iter().any(|o| matches!(o, StreamOp::Close)) => {
                op.count() + self.streams.get(stream).map_or(0, |&session| end(session))
            }
            _ => op.count(),
        }
    }

    /// The time-driven commands that are due, up to `max_batch` units of
    /// work as for client ops (at least one), and their work: when many big
    /// sessions expire at once, their ends go out over several batches, with
    /// other clients' requests between them. The rest stays due.
    fn due_within_budget(&mut self, state: &Replicated, now: Millis) -> (Vec<Command>, usize) {
        let mut due = self.due(state, now);
        let engine = state.engine();
        let (mut work, mut within) = (0, 0);
        for command in &due {
            let more = engine.work_of(command);
            if within > 0 && work + more > self.max_batch {
                break;
            }
            work += more;
            within += 1;
        }
        due.truncate(within);
        (due, work)
    }

    /// The time-driven commands due at `now`, at most `max_batch` of each
    /// source: the session expiries decided here (module `liveness`), then
    /// the engine's (steps of sessions ending, leases, waits, lock-delays).
    pub(super) fn due(&mut self, state: &Replicated, now: Millis) -> Vec<Command> {
        let mut due = self.liveness.due(state, now, self.max_batch);
        due.extend(state.engine().due_at_most(now, self.max_batch));
        due
    }

    /// Times every open session from its replicated floor, as a leader
    /// does once its grace is applied.
    #[cfg(test)]
    pub(in crate::core) fn time_sessions(&mut self, state: &Replicated) {
        self.liveness.time_all(state);
    }

    /// Forgets what was waiting to be sent (the step failed: nobody may
    /// hear of it).
    pub(super) fn drop_output(&mut self) {
        self.output = Output::default();
    }

    /// Sends what the step so far produced, and detaches the streams whose
    /// clients do not read what they are sent.
    pub(super) fn send_output(&mut self) {
        let too_slow = std::mem::take(&mut self.output).send(&mut self.orphans);
        for (stream, slow) in too_slow {
            if let Some(session) = self.streams.get(&stream) {
                tracing::warn!(
                    %session,
                    unread_bytes = slow.backlog,
                    limit = slow.limit,
                    "session stream closed: its client does not read its replies \
                     (the session lives on and may resume)"
                );
            }
            self.detach(stream, None);
        }
    }

    /// A batch this member proposed was committed: counts how long that
    /// took.
    pub(super) fn committed(&self, in_flight: &InFlight) {
        let elapsed = in_flight.proposed_at.elapsed();
        self.stats
            .commit_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.committed(elapsed, 1);
        }
    }

    /// This member's own batch was applied and answered: a stint's first
    /// batch makes it serve; the proposal's buffers serve the next batch.
    pub(super) fn own_applied(&mut self, state: &Replicated, in_flight: InFlight) {
        // Reuse the applied proposal's buffers for the next batch only if
        // nothing was gathered for it meanwhile: heartbeats are proposed as
        // they arrive, while this batch was in flight.
        if self.proposal.is_empty() || planted::active(Defect::HeartbeatsDropped) {
            self.proposal = in_flight.proposal;
        }
        if in_flight.grace {
            if let Leadership::Leader { ready, .. } = &mut self.replica.role {
                *ready = true;
            }
            // Sessionless request ids go on above every one applied, whoever
            // proposed it.
            self.next_unary
                .fetch_max(state.next_unary(), Ordering::Relaxed);
            // Every session gets its full TTL from the grace before any
            // expiry: nobody was heard here yet.
            self.liveness.time_all(state);
            self.replica.serving.send_replace(true);
            tracing::info!(
                last_token = state.engine().last_token(),
                sessions = state.session_count(),
                "leading: serving"
            );
        }
    }

    /// Forgets every stream and client address (the state was replaced by a
    /// snapshot: the sessions they belonged to may be gone).
    pub(super) fn forget_links(&mut self) {
        for link in self.links.drain().map(|(_, link)| link) {
            if let Some(a) = link.attached {
                a.pulse.end();
            }
        }
        self.streams.clear();
        self.peers = PeerCounts::default();
        self.liveness.forget_all();
    }
}
