//! The one owner of the lock engine: a thread fed by a channel, with group
//! commit.
//!
//! # The loop
//!
//! The core thread sleeps until an [`Op`] arrives or the engine's next deadline
//! ([`Engine::next_deadline`]) passes. Then:
//!
//! 1. it takes everything waiting in the channel: its own ops at once
//!    (committed entries to apply, snapshots, role changes), client ops into
//!    the backlog. The heartbeats among them go into the next batch at once,
//!    so that no session expires while its heartbeat is queued, however long
//!    the backlog;
//! 2. while fewer than `max_batches_in_flight` batches are in flight, it
//!    reads the clock once (`now`, see [`Clock`]) and **proposes** the next
//!    batch (module `handle`): the backlog's ops in order, up to `max_batch`
//!    units of work (a message, or a session's end by the holds and waits
//!    it releases: [`Engine::work_of`]), each turned into log records (what
//!    the client asked, stamped with `now`) and a local [`Route`] (where its
//!    result goes), then the time-driven commands that are due
//!    ([`Engine::due`]: session expiries, lease expiries, waiter timeouts,
//!    ends of lock-delay), up to `max_batch` units of work too, after the
//!    client ops so that a renew in the same batch wins. Nothing changes
//!    state yet. The records go to openraft as **one log entry**, one append
//!    and one `fdatasync` on a quorum (module `replica`): the group commit,
//!    since every request that arrived meanwhile shares it. A big expiry
//!    (a session of many holds) goes in an entry of its own after the
//!    client ops', so that their replies do not wait for it;
//! 3. when openraft has committed an entry, its state machine hands it to
//!    the core ([`RaftEvent::Apply`], on every member alike; the leader
//!    knows its own batches and their routes, module `replica`), and the
//!    core **applies** its records in order (module `apply`): the
//!    request-id check, the engine command, its effects (grants, queue
//!    positions, timeouts, lost holds) routed to the batch's output; then
//!    answers the batch's inspection ops from the state this leaves;
//! 4. it sends the output: one [`locksmith_proto::v1::ServerBatch`] per
//!    session stream, plus unary replies.
//!
//! So a client never sees a grant, a release or a fencing token that a crash
//! could take back: tokens never go backwards, even after kill -9 mid-load.
//! And since only committed records are ever applied, applying the log again
//! (replay after a restart, or another member of a replicated server) decides
//! everything the same way: whether a lock was free, whether a request id is
//! a retry, whether an expiry is still due (each one names the deadline it was
//! decided from and is void if a renew moved it). While a batch commits, new
//! requests queue in the backlog and form the next one.
//!
//! # Sessions and their secrets
//!
//! The engine knows sessions (TTL, holds, waiters); the core keeps the rest in
//! its own table, rebuilt from the same log: the **secret** a client needs to
//! resume a session (random, generated at open and logged in the `OpenSession`
//! record, so it survives restarts), the stream the session is attached to, and
//! the **final replies and lost notices not yet acknowledged** by the client.
//! A client that reconnects resumes its session with id + secret and sends its
//! unanswered requests again with the same ids; a request that already ran is
//! answered from the kept reply (the Raft dissertation's client-session rule,
//! §6.3), so nothing runs twice and no grant is lost in a dropped connection.
//! Replay rebuilds the kept replies too: grants and timeouts come out of the
//! replayed effects, and release/renew/cancel records carry the request id.
mod apply;
mod handle;
mod replica;
mod request_ids;
mod session;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use locksmith_core::{Command, Effect, Engine, Millis, SessionId};
use locksmith_proto::v1 as pb;
use openraft::type_config::alias::SnapshotMetaOf;
use tokio::sync::oneshot;
use tonic::Status;

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::entry::{Record, TypeConfig, ENTRY_BYTES};
use crate::history::{History, HistoryLimits};
use crate::inbox::{FrozenState, Input, RaftEvent};
use crate::metrics::{Metrics, Tally};
use crate::op::{NewStream, Op, StreamId, StreamOp, UnaryReply};
use crate::outbox::{LeaseWaiter, Orphan, Output};
use crate::storage::member::TokenCeiling;
use crate::storage::{ServerSnapshot, SessionRecord};
pub(crate) use replica::Replica;
use session::{PeerCounts, SessionEntry};

/// Due commands with more work than this (`Engine::work_of`: a session of
/// many holds ending) go in a log entry of their own rather than with client
/// ops, whose replies would wait for them. About 0.3 ms of engine time here.
const WORK_THAT_RIDES_ALONG: usize = 256;

/// The records one batch proposes, in order, and where each one's result
/// goes (`routes[i]` is the route of `records[i]`), plus the inspection ops
/// answered once they are applied.
#[derive(Default)]
pub(super) struct Proposal {
    records: Vec<Record>,
    routes: Vec<Route>,
    reads: Vec<Op>,
    /// Requests refused before they became records, answered in their place
    /// among the others: `(records before it, session, request id, error)`.
    refused: Vec<(usize, SessionId, u64, pb::Error)>,
    /// `OpenSession` records among them, for the session limit.
    opens: usize,
}

/// Where the result of a record goes once it is applied. Local to the
/// server that proposed the record: never logged, and a replayed record has
/// none ([`Route::Nobody`]).
pub(super) enum Route {
    /// Nobody waits for the result here (the clock, a replay, a close).
    Nobody,
    /// A session's request: replies go to the stream the session is
    /// attached to; an acquire that has to wait says so if asked.
    Stream { notify_queued: bool },
    /// A session's heartbeat: acknowledged on its stream.
    Heartbeat,
    /// The stream that opens the session.
    Open(NewStream),
    /// A sessionless acquire, whose waiter is in `Core::leases`.
    Lease,
    /// A unary call's answer.
    Unary(Answer),
    /// An administrator's end of a session (the stream is told why first).
    EndSession(Answer),
}

/// Sends a unary call's answer (its response has no fields).
pub(super) type Answer = Box<dyn FnOnce(Result<(), Status>) + Send>;

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

/// Counters of the core loop, for benchmarks and monitoring.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub batches: AtomicU64,
    pub ops: AtomicU64,
    /// Log entries proposed (each one append and `fdatasync` on a quorum).
    pub fsyncs: AtomicU64,
    pub records: AtomicU64,
    /// Time from proposing entries to applying them.
    pub commit_nanos: AtomicU64,
}

/// Why the loop stops.
enum Stop {
    /// Asked to: the answer goes here.
    Shutdown(oneshot::Sender<Result<(), String>>),
    /// Storage failed: the member must not go on.
    Failed(String),
}

/// The engine, the session table and the member's replication state, owned
/// by one thread.
pub(crate) struct Core {
    engine: Engine,
    limits: locksmith_core::Limits,
    clock: Clock,
    replica: Replica,
    grace: Millis,
    max_sessions: usize,
    max_sessions_per_peer: usize,
    /// Open sessions per client address.
    peers: PeerCounts,
    max_unacked: usize,
    max_batch: usize,
    sessions: HashMap<SessionId, SessionEntry>,
    streams: HashMap<StreamId, SessionId>,
    leases: HashMap<u64, LeaseWaiter>,
    next_session: u64,
    /// Request ids of sessionless acquires, shared with the service that picks them.
    next_unary: Arc<AtomicU64>,
    /// The time of the last record applied: engine time never goes below it.
    last_now: Millis,
    /// What is sent once the records it answers are applied.
    output: Output,
    /// The records of the batch being built.
    proposal: Proposal,
    orphans: Vec<Orphan>,
    effects: Vec<Effect>,
    shutting_down: bool,
    /// Whether the acquire being applied asked for a `queued` reply.
    notify_queued: bool,
    stats: Arc<Stats>,
    /// Ops received and not looked at yet (see `take_arrivals`).
    arrived: Vec<Input>,
    /// Client ops looked at (their heartbeats proposed), waiting for their
    /// batch.
    backlog: VecDeque<Op>,
    /// The grant history and the table's counts (module `history`).
    history: History,
    metrics: Option<Arc<Metrics>>,
    /// The durable token ceiling, raised before a reply carries a token
    /// above it.
    tokens: Option<TokenCeiling>,
}

impl Core {
    /// A core with an empty state (install the member's snapshot next, if it
    /// has one; openraft then hands it the committed entries after it).
    /// `tokens` is the durable token ceiling (none for a server without a
    /// data directory).
    pub(crate) fn new(
        config: &ServerConfig,
        replica: Replica,
        tokens: Option<TokenCeiling>,
    ) -> Core {
        Core {
            engine: Engine::new(config.limits.clone()),
            limits: config.limits.clone(),
            clock: Clock::starting_after(0),
            replica,
            grace: config.grace.as_millis() as Millis,
            max_sessions: config.max_sessions,
            max_sessions_per_peer: config.max_sessions_per_peer,
            peers: PeerCounts::default(),
            max_unacked: config.max_unacked_replies.max(1),
            max_batch: config.max_batch.max(1),
            sessions: HashMap::new(),
            streams: HashMap::new(),
            leases: HashMap::new(),
            next_session: 1,
            next_unary: Arc::new(AtomicU64::new(1)),
            last_now: 0,
            output: Output::default(),
            proposal: Proposal::default(),
            orphans: Vec::new(),
            effects: Vec::new(),
            shutting_down: false,
            notify_queued: false,
            stats: Arc::default(),
            arrived: Vec::new(),
            backlog: VecDeque::new(),
            history: History::new(HistoryLimits {
                per_lock: config.history_per_lock,
                total: config.history_total,
                max_age: config.history_max_age.as_millis() as Millis,
            }),
            metrics: None,
            tokens,
        }
    }

    /// The loop's counters.
    pub(crate) fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Counts what the core does from now on in `metrics`.
    pub(crate) fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// After a forced recovery: every fencing token from now on is above
    /// `floor`.
    pub(crate) fn raise_token_floor(&mut self, floor: u64) {
        self.engine.raise_token_floor(floor);
    }

    /// The counter of sessionless request ids, for the service.
    pub(crate) fn unary_ids(&self) -> Arc<AtomicU64> {
        self.next_unary.clone()
    }

    fn restore(&mut self, snapshot: ServerSnapshot) {
        self.last_now = snapshot.last_now;
        self.next_session = snapshot.next_session;
        self.next_unary
            .store(snapshot.next_unary, Ordering::Relaxed);
        self.history.restore(&snapshot.engine);
        self.engine = Engine::restore(self.limits.clone(), snapshot.engine)
            .expect("install_snapshot checked the snapshot");
        self.sessions = snapshot
            .sessions
            .into_iter()
            .map(|s| {
                (
                    SessionId(s.session),
                    SessionEntry {
                        secret: s.secret,
                        ttl: s.ttl,
                        attached: None,
                        replies: s.replies.into_iter().collect(),
                        fingerprints: HashMap::new(),
                        lost: s.lost.into_iter().map(|n| (n.token, n)).collect(),
                        peer: None,
                    },
                )
            })
            .collect();
    }

    /// Runs the loop until shutdown or until every sender is gone.
    pub(crate) fn run(mut self, ops: Receiver<Input>) -> Result<(), String> {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            if self.arrived.is_empty() && !self.has_work() {
                let deadline = if self.replica.can_expire() {
                    self.engine
                        .next_deadline()
                        .and_then(|at| self.clock.instant_of(at))
                } else {
                    None
                };
                let first = match deadline {
                    Some(deadline) => {
                        match ops.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                            Ok(op) => Some(op),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => return self.shut_down(),
                        }
                    }
                    None => match ops.recv() {
                        Ok(op) => Some(op),
                        Err(_) => return self.shut_down(),
                    },
                };
                self.arrived.extend(first);
            }
            let batch_started = Instant::now();
            let now = self.clock.now();
            match self.take_arrivals(&ops, now) {
                None => {}
                Some(Stop::Shutdown(done)) => {
                    let result = self.shut_down();
                    let _ = done.send(result.clone());
                    return result;
                }
                Some(Stop::Failed(message)) => {
                    let _ = self.shut_down();
                    return Err(message);
                }
            }
            if !self.replica.can_propose() {
                continue;
            }
            self.propose_next(now, &mut batch, batch_started);
            self.send_output();
        }
    }

    /// Proposes the next batch: the backlog's next ops (`next_batch`), then
    /// the time-driven commands that are due.
    fn propose_next(&mut self, now: Millis, batch: &mut Vec<Op>, started: Instant) {
        self.next_batch(batch);
        let count: usize = batch.iter().map(Op::count).sum();
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.ops.fetch_add(count as u64, Ordering::Relaxed);
        let tally = self.metrics.as_ref().map(|_| Tally::of(batch));
        let mut proposal = std::mem::take(&mut self.proposal);
        self.propose_orphan_releases(now, &mut proposal);
        for op in batch.drain(..) {
            self.propose(now, op, &mut proposal);
        }
        // After the client ops: a heartbeat or renew in this batch wins.
        let (due, work) = match self.replica.can_expire() {
            true => self.due_within_budget(now),
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

    /// Whether the loop has something to do without waiting for an op.
    fn has_work(&self) -> bool {
        self.replica.can_propose()
            && (!self.backlog.is_empty()
                || !self.proposal.records.is_empty()
                || !self.orphans.is_empty())
    }

    /// Takes everything waiting in the channel: Raft's events (entries to
    /// apply, snapshots, role changes) and detaches are handled at once,
    /// client ops go to the backlog (the leader's) or are sent to the leader.
    /// Returns why the loop must stop, if it must.
    ///
    /// The heartbeats among the client ops are proposed at once, in the next
    /// batch, ahead of any expiry it decides: so one client cannot expire
    /// another by keeping the core busy, however long the backlog.
    fn take_arrivals(&mut self, ops: &Receiver<Input>, now: Millis) -> Option<Stop> {
        self.arrived.extend(ops.try_iter());
        let mut arrived = std::mem::take(&mut self.arrived);
        let mut shutdown = None;
        for input in arrived.drain(..) {
            match input {
                Input::Raft(event) => {
                    if let Err(stop) = self.handle_raft_event(event) {
                        return Some(stop);
                    }
                }
                Input::Shutdown { done } => shutdown = Some(Stop::Shutdown(done)),
                Input::Client(Op::Detach { stream, error }) => self.detach(stream, error),
                Input::Client(mut op) if self.replica.leading() => {
                    if self.replica.serving() {
                        self.propose_heartbeats(now, &mut op);
                    }
                    self.backlog.push_back(op);
                }
                Input::Client(op) => {
                    let status = self.replica.redirect();
                    self.refuse(op, status);
                }
            }
        }
        self.arrived = arrived;
        self.send_output();
        shutdown
    }

    /// Handles what Raft tells the core, as it arrives, whatever the role.
    fn handle_raft_event(&mut self, event: RaftEvent) -> Result<(), Stop> {
        match event {
            RaftEvent::Apply {
                entries,
                responders,
            } => {
                self.apply_entries(entries);
                self.finish_apply()?;
                for responder in responders {
                    responder.send(());
                }
            }
            RaftEvent::Snapshot { reply } => {
                let _ = reply.send(self.freeze());
            }
            RaftEvent::Install { meta, data, done } => {
                let _ = done.send(self.install_snapshot(meta, data));
            }
            RaftEvent::Role(role) => self.change_role(role),
            RaftEvent::Refused {
                origin,
                seq,
                reason,
            } => self.refused(origin, seq, &reason),
        }
        Ok(())
    }

    /// Moves the heartbeats of `op` into the batch being built, one command
    /// (and so one answer) each: the client pairs every answer with the
    /// oldest heartbeat it has not seen answered, so two heartbeats read
    /// together and answered once would leave it a heartbeat behind for the
    /// rest of the stream, until it gave its session up while the server
    /// still answered.
    fn propose_heartbeats(&mut self, now: Millis, op: &mut Op) {
        let Op::Stream { stream, ops, .. } = op else {
            return;
        };
        let Some(&session) = self.streams.get(stream) else {
            return;
        };
        let before = ops.len();
        ops.retain(|o| !matches!(o, StreamOp::Heartbeat));
        for _ in ops.len()..before {
            let heartbeat = Command::Heartbeat { session };
            self.proposal
                .command(now, heartbeat, None, None, Route::Heartbeat);
        }
        if ops.len() < before && ops.is_empty() {
            ops.push(StreamOp::AckOnly);
        }
    }

    /// Takes the next batch from the backlog: ops in arrival order, up to
    /// `max_batch` units of work, so that no batch holds the engine thread
    /// for long however much is queued, and up to about
    /// [`ENTRY_BYTES`], so that its log entry fits in the members'
    /// messages (at least one op either way).
    fn next_batch(&mut self, batch: &mut Vec<Op>) {
        let (mut work, mut bytes) = (0, 0);
        while let Some(op) = self.backlog.front() {
            if !batch.is_empty() && bytes >= ENTRY_BYTES {
                break;
            }
            work += self.work_of(op);
            bytes += op.entry_bytes();
            if work > self.max_batch && !batch.is_empty() {
                break;
            }
            batch.extend(self.backlog.pop_front());
        }
    }

    /// The work `op` brings into a batch: a unit per message, and a
    /// session's end by the holds and waits it releases
    /// ([`Engine::work_of`]).
    fn work_of(&self, op: &Op) -> usize {
        let end = |session| self.engine.work_of(&Command::CloseSession { session });
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
    fn due_within_budget(&self, now: Millis) -> (Vec<Command>, usize) {
        let mut due = self.engine.due_at_most(now, self.max_batch);
        let (mut work, mut within) = (0, 0);
        for command in &due {
            let more = self.engine.work_of(command);
            if within > 0 && work + more > self.max_batch {
                break;
            }
            work += more;
            within += 1;
        }
        due.truncate(within);
        (due, work)
    }

    /// After applying entries: the token ceiling, the gauges, then the
    /// replies. If the ceiling cannot be written, nothing of the entries is
    /// told to anyone and the core must stop.
    fn finish_apply(&mut self) -> Result<(), Stop> {
        if let Some(tokens) = &mut self.tokens {
            if let Err(error) = tokens.cover(self.engine.last_token()) {
                self.output = Output::default();
                let message = format!("cannot write the token ceiling: {error}");
                tracing::error!(%message, "stopping");
                return Err(Stop::Failed(message));
            }
        }
        if let Some(metrics) = &self.metrics {
            // Before the replies leave: a client that saw one scrapes
            // gauges at least as new.
            metrics.table_now(self.history.census(), self.engine.last_token());
        }
        self.send_output();
        Ok(())
    }

    /// Sends what the ops handled so far produced, and detaches the streams
    /// whose clients do not read what they are sent.
    fn send_output(&mut self) {
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

    /// Applies the committed records of `proposal` in order, each with its
    /// route, then answers its inspection ops from the state they leave.
    fn apply_proposal(&mut self, now: Millis, proposal: &mut Proposal) {
        let mut refused = proposal.refused.drain(..).peekable();
        let steps = proposal.records.drain(..).zip(proposal.routes.drain(..));
        for (at, (record, route)) in steps.enumerate() {
            while let Some((_, session, id, error)) = refused.next_if(|r| r.0 == at) {
                self.send_error(session, id, error);
            }
            self.apply(record, route);
        }
        for (_, session, id, error) in refused {
            self.send_error(session, id, error);
        }
        for read in proposal.reads.drain(..) {
            self.read(now, read);
        }
        proposal.opens = 0;
    }

    /// The applied state, frozen for a snapshot built off this thread (the
    /// engine's locks are shared copy-on-write; see [`FrozenState`]).
    pub(crate) fn freeze(&self) -> FrozenState {
        let started = Instant::now();
        let mut sessions: Vec<SessionRecord> = self
            .sessions
            .iter()
            .map(|(id, e)| SessionRecord {
                session: id.0,
                secret: e.secret,
                ttl: e.ttl,
                replies: e.replies.iter().map(|(k, v)| (*k, v.clone())).collect(),
                lost: e.lost.values().cloned().collect(),
            })
            .collect();
        sessions.sort_unstable_by_key(|s| s.session);
        let (last_log_id, last_membership) = self.applied_state();
        let frozen = FrozenState {
            meta: SnapshotMetaOf::<TypeConfig> {
                last_log_id,
                last_membership,
            },
            last_now: self.last_now,
            next_session: self.next_session,
            next_unary: self.next_unary.load(Ordering::Relaxed),
            engine: self.engine.freeze(),
            sessions,
        };
        tracing::debug!(
            sessions = frozen.sessions.len(),
            elapsed = ?started.elapsed(),
            "state frozen for a snapshot"
        );
        frozen
    }

    /// Replaces the state with a snapshot (the leader's, or the member's own
    /// at start).
    pub(crate) fn install_snapshot(
        &mut self,
        meta: SnapshotMetaOf<TypeConfig>,
        data: Vec<u8>,
    ) -> Result<(), String> {
        let state = ServerSnapshot::decode(&data)?;
        // Refused before anything changes.
        state.engine.check().map_err(|e| e.to_string())?;
        for entry in self.sessions.values_mut() {
            if let Some(a) = entry.attached.take() {
                a.ended.cancel();
            }
        }
        self.streams.clear();
        self.restore(state);
        self.set_applied(meta.last_log_id, meta.last_membership);
        Ok(())
    }

    /// Ends every stream and every wait: nothing in flight will be applied.
    fn shut_down(&mut self) -> Result<(), String> {
        self.shutting_down = true;
        let status = Status::unavailable("lock server is shutting down");
        self.abandon_all(&status);
        self.send_output();
        tracing::info!(last_token = self.engine.last_token(), "lock engine stopped");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use locksmith_core::ClientInfo;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::inbox::CoreSender;
    use crate::op::{Acks, AcquireArgs, NewStream, WaitArg};

    /// A core on its own (no openraft): the tests propose and apply by hand.
    fn core(max_batch: usize) -> Core {
        core_with(ServerConfig {
            max_batch,
            ..ServerConfig::in_memory()
        })
    }

    fn core_with(config: ServerConfig) -> Core {
        let (proposer, _) = crate::raft::propose::Proposer::new();
        let (serving, _) = tokio::sync::watch::channel(false);
        let replica = Replica::new(proposer, serving, config.max_batches_in_flight);
        Core::new(&config, replica, None)
    }

    /// One batch of `op`: proposed, then applied; returns its records, as a
    /// log would keep them.
    fn run(core: &mut Core, now: Millis, op: Op) -> Vec<Record> {
        let mut proposal = std::mem::take(&mut core.proposal);
        core.propose(now, op, &mut proposal);
        let records = proposal.records.clone();
        core.apply_proposal(now, &mut proposal);
        core.output = Output::default();
        records
    }

    /// Opens a session (TTL 1 s) on stream `stream` at `now`.
    fn open(core: &mut Core, stream: StreamId, now: Millis) -> (SessionId, Vec<Record>) {
        let (tx, _) = crate::stream_queue::stream_queue(usize::MAX);
        let new = NewStream {
            id: stream,
            tx,
            ended: CancellationToken::new(),
            peer: None,
        };
        let open = Op::Open {
            stream: new,
            info: ClientInfo::default(),
            ttl: 1_000,
        };
        let records = run(core, now, open);
        (core.streams[&stream], records)
    }

    /// Makes `core` a leader that serves (stint 1), as if its grace entry
    /// had been applied.
    fn lead(core: &mut Core) {
        core.replica.role = replica::Leadership::Leader {
            stint: 1,
            ready: true,
        };
    }

    /// A core that leads (stint 1) with a session open on stream 1.
    fn leading_with_a_session() -> (Core, Millis, SessionId) {
        let mut core = core(4096);
        let now = core.clock.now();
        let (session, _) = open(&mut core, 1, now);
        lead(&mut core);
        (core, now, session)
    }

    fn hold_args(name: &str) -> crate::op::HoldArgs {
        crate::op::HoldArgs {
            name: name.into(),
            owner: "o".into(),
            token: None,
        }
    }

    fn holders(core: &Core, name: &str) -> usize {
        core.engine.describe(name).map_or(0, |l| l.holders.len())
    }

    #[test]
    fn applying_the_log_again_decides_a_request_id_reused_after_its_ack_as_the_first_run_did() {
        let mut core = core(4096);
        let now = core.clock.now();
        let (session, mut log) = open(&mut core, 1, now);
        let acquire = StreamOp::Acquire {
            id: 1,
            args: crate::op::AcquireArgs {
                names: vec!["reused".into()],
                mode: locksmith_core::Mode::Exclusive,
                owner: "o".into(),
                wait: crate::op::WaitArg::No,
                lease: None,
                reentrant: false,
                lock_delay: 0,
                notify_queued: false,
            },
        };
        log.extend(run(&mut core, now, client_batch(1, [acquire])));
        assert_eq!(holders(&core, "reused"), 1);
        // The client acknowledges the grant, so id 1 is free, and releases
        // under it.
        let release = Op::Stream {
            stream: 1,
            acks: Acks {
                replies: vec![1],
                lost: Vec::new(),
            },
            ops: vec![StreamOp::Release {
                id: 1,
                hold: hold_args("reused"),
            }],
        };
        log.extend(run(&mut core, now, release));
        assert_eq!(holders(&core, "reused"), 0);

        // Another member (or this one after a restart) applies the same log.
        let mut replica = self::core(4096);
        for record in log {
            replica.apply(record, Route::Nobody);
        }
        assert!(replica.sessions.contains_key(&session));
        assert_eq!(holders(&replica, "reused"), 0, "released there too");
    }

    fn client_batch(stream: StreamId, ops: impl IntoIterator<Item = StreamOp>) -> Op {
        Op::Stream {
            stream,
            acks: Acks::default(),
            ops: ops.into_iter().collect(),
        }
    }

    #[test]
    fn a_heartbeat_waiting_in_the_channel_is_proposed_before_expiries() {
        let (mut core, now, session) = leading_with_a_session();
        let (ops, arrivals) = CoreSender::channel();
        ops.send(client_batch(1, [StreamOp::Heartbeat])).unwrap();
        // The engine was busy past the session's deadline meanwhile.
        let late = now + 1_500;
        assert!(core.take_arrivals(&arrivals, late).is_none());
        let mut proposal = std::mem::take(&mut core.proposal);
        for command in core.engine.due_at_most(late, 4096) {
            proposal.command(late, command, None, None, Route::Nobody);
        }
        let first = proposal.records.first().cloned();
        assert!(
            matches!(&first, Some(Record::Command(r)) if r.command == Command::Heartbeat { session }),
            "{first:?}"
        );
        core.apply_proposal(late, &mut proposal);
        assert!(core.engine.has_session(session), "the expiry is void");
    }

    #[test]
    fn a_heartbeat_that_arrives_while_a_batch_is_in_flight_is_proposed_next() {
        let (mut core, now, session) = leading_with_a_session();
        // A batch goes out (proposed, not applied yet)...
        let mut proposal = std::mem::take(&mut core.proposal);
        let release = client_batch(
            1,
            [StreamOp::Release {
                id: 1,
                hold: hold_args("in-flight"),
            }],
        );
        core.propose(now, release, &mut proposal);
        let records = proposal.records.clone();
        core.propose_batch(proposal, false);
        // ...a heartbeat arrives meanwhile...
        let (ops, arrivals) = CoreSender::channel();
        ops.send(client_batch(1, [StreamOp::Heartbeat])).unwrap();
        assert!(core.take_arrivals(&arrivals, now + 10).is_none());
        // ...and the batch is applied: the heartbeat waits for the next one.
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 0,
            records,
        });
        let next = core.proposal.records.first().cloned();
        assert!(
            matches!(&next, Some(Record::Command(r)) if r.command == Command::Heartbeat { session }),
            "the heartbeat was dropped: {next:?}"
        );
    }

    #[test]
    fn every_heartbeat_read_together_is_answered() {
        let (mut core, now, _) = leading_with_a_session();
        let (ops, arrivals) = CoreSender::channel();
        // The server read the stream late: two heartbeats in one batch.
        ops.send(client_batch(1, [StreamOp::Heartbeat, StreamOp::Heartbeat]))
            .unwrap();
        assert!(core.take_arrivals(&arrivals, now).is_none());
        let mut proposal = std::mem::take(&mut core.proposal);
        core.apply_proposal(now, &mut proposal);
        let answers = core
            .output
            .streams
            .messages(1)
            .iter()
            .filter(|m| matches!(m.kind, Some(pb::server_message::Kind::Heartbeat(_))))
            .count();
        assert_eq!(answers, 2, "one answer per heartbeat");
    }

    fn acquire(id: u64, name: &str) -> StreamOp {
        StreamOp::Acquire {
            id,
            args: crate::op::AcquireArgs {
                names: vec![name.into()],
                mode: locksmith_core::Mode::Exclusive,
                owner: format!("owner-{id}"),
                wait: crate::op::WaitArg::Forever,
                lease: None,
                reentrant: false,
                lock_delay: 0,
                notify_queued: false,
            },
        }
    }

    /// Proposes `ops` as one batch, as the loop would; returns its records.
    fn propose_now(core: &mut Core, now: Millis, op: Op) -> Vec<Record> {
        let mut proposal = std::mem::take(&mut core.proposal);
        core.propose(now, op, &mut proposal);
        let records = proposal.records.clone();
        core.propose_batch(proposal, false);
        records
    }

    #[test]
    fn batches_in_flight_are_applied_in_order_and_bounded() {
        let (mut core, now, _) = leading_with_a_session();
        // The second acquire of "x" is proposed while the first is in flight:
        // it queues behind it, as if the first had been applied already.
        let first = propose_now(&mut core, now, client_batch(1, [acquire(1, "x")]));
        assert!(core.replica.can_propose(), "a second batch may go out");
        let second = propose_now(&mut core, now, client_batch(1, [acquire(2, "x")]));
        for seq in 2..core.replica.max_in_flight() as u64 {
            propose_now(&mut core, now, client_batch(1, [acquire(seq + 1, "y")]));
        }
        assert!(
            !core.replica.can_propose(),
            "at most max_batches_in_flight batches"
        );
        assert_eq!(
            holders(&core, "x"),
            0,
            "nothing is visible before it is applied"
        );
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 0,
            records: first,
        });
        assert!(core.replica.can_propose());
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 1,
            records: second,
        });
        let x = core.engine.describe("x").expect("x is held");
        assert_eq!(x.holders.len(), 1);
        assert_eq!(
            x.waiters.len(),
            1,
            "the second acquire waits behind the first"
        );
    }

    /// The entry at `index` holding `records` of this leader's batch `seq`
    /// (stint 1), as openraft's state machine hands it over.
    fn entry(
        index: u64,
        seq: u64,
        records: Vec<Record>,
    ) -> openraft::type_config::alias::EntryOf<TypeConfig> {
        use openraft::type_config::alias::{LeaderIdOf, LogIdOf};
        use openraft::vote::RaftLeaderIdExt;
        openraft::type_config::alias::EntryOf::<TypeConfig> {
            log_id: LogIdOf::<TypeConfig>::new(
                LeaderIdOf::<TypeConfig>::new_committed(1, 1),
                index,
            ),
            payload: openraft::EntryPayload::Normal(crate::entry::Batch {
                origin: 1,
                seq,
                records,
            }),
        }
    }

    #[test]
    fn the_leader_applies_its_batch_when_the_state_machine_hands_it_over_and_answers_its_routes() {
        let (mut core, now, _) = leading_with_a_session();
        let records = propose_now(&mut core, now, client_batch(1, [acquire(1, "x")]));
        assert_eq!(holders(&core, "x"), 0, "nothing before it is committed");
        let (ops, arrivals) = CoreSender::channel();
        ops.send(RaftEvent::Apply {
            entries: vec![entry(7, 0, records.clone())],
            responders: Vec::new(),
        })
        .unwrap();
        let (reply, mut snapshot) = tokio::sync::oneshot::channel();
        ops.send(RaftEvent::Snapshot { reply }).unwrap();
        assert!(core.take_arrivals(&arrivals, now).is_none());
        assert_eq!(holders(&core, "x"), 1, "applied once handed over");
        assert!(core.replica.records_in_flight().is_empty(), "matched");
        let frozen = snapshot.try_recv().expect("a snapshot right away");
        assert_eq!(
            frozen.meta.last_log_id.map(|id| id.index),
            Some(7),
            "the snapshot covers the entry it holds"
        );

        // A batch of another stint (proposed by another leader: a twin
        // here, acquiring "y" for the same session) is applied with nobody
        // to tell.
        let (mut twin, _, _) = leading_with_a_session();
        let theirs = propose_now(&mut twin, now, client_batch(1, [acquire(2, "y")]));
        let mut other = entry(8, 0, theirs);
        if let openraft::EntryPayload::Normal(batch) = &mut other.payload {
            batch.origin = 2;
        }
        ops.send(RaftEvent::Apply {
            entries: vec![other],
            responders: Vec::new(),
        })
        .unwrap();
        assert!(core.take_arrivals(&arrivals, now).is_none());
        assert_eq!(holders(&core, "y"), 1);
    }

    #[test]
    fn expiries_are_not_decided_again_while_a_batch_carrying_them_is_in_flight() {
        let (mut core, now, session) = leading_with_a_session();
        let late = now + 1_500;
        assert!(core.replica.can_expire());
        let mut proposal = std::mem::take(&mut core.proposal);
        for command in core.engine.due_at_most(late, 4096) {
            proposal.command(late, command, None, None, Route::Nobody);
        }
        let records = proposal.records.clone();
        assert!(!records.is_empty(), "the session is due");
        core.propose_batch(proposal, true);
        assert!(core.replica.can_propose(), "client ops may still go out");
        assert!(!core.replica.can_expire(), "its expiry is in flight");
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 0,
            records,
        });
        assert!(!core.engine.has_session(session), "expired");
        assert!(core.replica.can_expire());
        assert!(core.engine.due_at_most(late, 4096).is_empty());
    }

    /// Opens a session on `stream` at `now` that holds `holds` locks.
    fn session_holding(core: &mut Core, stream: StreamId, now: Millis, holds: u64) -> SessionId {
        let (session, _) = open(core, stream, now);
        let acquires = (0..holds).map(|i| acquire(i + 1, &format!("s{stream}-{i}")));
        run(core, now, client_batch(stream, acquires));
        session
    }

    #[test]
    fn sessions_expiring_at_once_end_over_batches_of_bounded_work() {
        let mut core = core(10);
        let now = core.clock.now();
        let sessions: Vec<SessionId> = (1..=3)
            .map(|stream| session_holding(&mut core, stream, now, 6))
            .collect();
        lead(&mut core);
        let late = now + 1_500;
        let mut open_after_each = Vec::new();
        for seq in 0..3 {
            core.propose_next(late, &mut Vec::new(), Instant::now());
            let in_flight = core.replica.records_in_flight();
            assert_eq!(in_flight.len(), 1, "one batch of expiries at a time");
            assert_eq!(
                in_flight[0].len(),
                1,
                "one session's end (7 units of work) per batch of 10"
            );
            core.apply_batch(crate::entry::Batch {
                origin: 1,
                seq,
                records: in_flight[0].clone(),
            });
            let open = sessions.iter().filter(|&&s| core.engine.has_session(s));
            open_after_each.push(open.count());
        }
        assert_eq!(open_after_each, [2, 1, 0]);
    }

    #[test]
    fn a_big_expiry_goes_in_an_entry_after_the_client_ops_and_a_small_one_rides_along() {
        for (holds, entries) in [(WORK_THAT_RIDES_ALONG - 1, 1), (WORK_THAT_RIDES_ALONG, 2)] {
            let mut core = core(4096);
            let now = core.clock.now();
            let expiring = session_holding(&mut core, 1, now, holds as u64);
            let late = now + 1_500;
            open(&mut core, 2, late);
            lead(&mut core);
            core.backlog
                .push_back(client_batch(2, [acquire(1, "client")]));
            core.propose_next(late, &mut Vec::new(), Instant::now());
            let in_flight = core.replica.records_in_flight();
            assert_eq!(in_flight.len(), entries, "{holds} holds");
            for (seq, records) in in_flight.into_iter().enumerate() {
                core.apply_batch(crate::entry::Batch {
                    origin: 1,
                    seq: seq as u64,
                    records,
                });
                if seq == 0 {
                    assert_eq!(holders(&core, "client"), 1, "the client's op first");
                }
            }
            assert!(!core.engine.has_session(expiring));
        }
    }

    #[test]
    fn a_big_session_ends_over_several_entries_with_client_ops_between_them() {
        let mut config = ServerConfig::in_memory();
        config.limits.session_end_step = 4;
        let mut core = core_with(config);
        let now = core.clock.now();
        let expiring = session_holding(&mut core, 1, now, 10);
        let late = now + 1_500;
        open(&mut core, 2, late);
        lead(&mut core);
        let held = |core: &Core| {
            (0..10)
                .filter(|i| holders(core, &format!("s1-{i}")) > 0)
                .count()
        };
        let mut after_each = Vec::new();
        for seq in 0..4 {
            let name = format!("client-{seq}");
            core.backlog
                .push_back(client_batch(2, [acquire(seq + 1, &name)]));
            core.propose_next(late, &mut Vec::new(), Instant::now());
            let in_flight = core.replica.records_in_flight();
            assert_eq!(in_flight.len(), 1, "a step of 4 rides along");
            core.apply_batch(crate::entry::Batch {
                origin: 1,
                seq,
                records: in_flight[0].clone(),
            });
            assert_eq!(holders(&core, &name), 1, "the client's op, every entry");
            after_each.push(held(&core));
        }
        assert!(!core.engine.has_session(expiring));
        // The expiry gives up nothing itself (10 holds > 4); then 4 an entry.
        assert_eq!(after_each, [10, 6, 2, 0]);
        assert!(core.engine.due_at_most(late, 4096).is_empty());
    }

    #[test]
    fn a_batch_counts_a_session_end_by_its_holds() {
        let mut core = core(10);
        let now = core.clock.now();
        for stream in 1..=2 {
            session_holding(&mut core, stream, now, 6);
        }
        lead(&mut core);
        core.backlog.push_back(client_batch(1, [StreamOp::Close]));
        core.backlog.push_back(client_batch(2, [StreamOp::Close]));
        core.backlog
            .push_back(client_batch(2, [StreamOp::AckOnly, StreamOp::AckOnly]));
        let mut batch = Vec::new();
        let mut sizes = Vec::new();
        while !core.backlog.is_empty() {
            core.next_batch(&mut batch);
            sizes.push(batch.drain(..).count());
        }
        assert_eq!(sizes, [1, 2], "7 units, then 7 + 2");
    }

    #[test]
    fn a_batch_ends_at_max_batch_messages() {
        let mut core = core(10);
        lead(&mut core);
        let (ops, arrivals) = CoreSender::channel();
        for _ in 0..3 {
            ops.send(client_batch(1, (0..4).map(|_| StreamOp::AckOnly)))
                .unwrap();
        }
        // One client batch larger than the limit is still taken whole.
        ops.send(client_batch(1, (0..25).map(|_| StreamOp::AckOnly)))
            .unwrap();
        core.take_arrivals(&arrivals, 0);
        let mut batch = Vec::new();
        let mut sizes = Vec::new();
        while !core.backlog.is_empty() {
            core.next_batch(&mut batch);
            sizes.push(batch.drain(..).map(|op| op.count()).sum::<usize>());
        }
        assert_eq!(sizes, [8, 4, 25]);
    }

    #[test]
    fn a_batch_ends_at_about_entry_bytes_of_names() {
        let mut core = core(4096);
        lead(&mut core);
        // Acquires of 64 names of 500 bytes: 32 000 bytes of names each.
        let acquire = |id| StreamOp::Acquire {
            id,
            args: AcquireArgs {
                names: (0..64).map(|i| format!("{i:0>500}")).collect(),
                mode: locksmith_core::Mode::Exclusive,
                owner: String::new(),
                wait: WaitArg::No,
                lease: None,
                reentrant: false,
                lock_delay: 0,
                notify_queued: false,
            },
        };
        for id in 0..100 {
            core.backlog.push_back(client_batch(1, [acquire(id)]));
        }
        let mut batch = Vec::new();
        let mut sizes = Vec::new();
        while !core.backlog.is_empty() {
            core.next_batch(&mut batch);
            let bytes: usize = batch.iter().map(Op::entry_bytes).sum();
            assert!(bytes < ENTRY_BYTES + 33_000, "{bytes} bytes in one batch");
            sizes.push(batch.drain(..).count());
        }
        // 1 MiB is reached with the 33rd acquire, which still goes in.
        assert_eq!(sizes, [33, 33, 33, 1]);
    }
}
