//! The one owner of the lock engine: a thread fed by a channel, with group
//! commit.
//!
//! # The loop
//!
//! The core thread sleeps until an [`Op`] arrives or the engine's next deadline
//! ([`Engine::next_deadline`]) passes. Then it takes the ops queued so far, in
//! order and up to `max_batch` messages, as one **batch**, and for that batch:
//!
//! 1. reads the clock once (`now`, see [`Clock`]); when the last fsync was
//!    slow and many requests are busy, it first waits a fraction of that fsync
//!    for more of them (adaptive group commit, see `Core::gather_window`);
//!    it moves everything waiting in the channel to its backlog and applies
//!    the heartbeats found there at once, so that no session expires while
//!    its heartbeat is queued, however long the last batch took;
//! 2. **proposes** (module `handle`): turns each op into log records (what
//!    the client asked, stamped with `now`) and a local [`Route`] for each
//!    (where its result goes), then adds the time-driven commands that are
//!    due ([`Engine::due`]: session expiries, lease expiries, waiter
//!    timeouts, ends of lock-delay), after the client ops so that a renew in
//!    the same batch wins; nothing changes state yet;
//! 3. **commits**: writes the batch's records and makes them durable with
//!    **one `fdatasync`** (the group commit: every request that arrived
//!    meanwhile shares it);
//! 4. **applies** the records in order (module `apply`): the request-id
//!    check, the engine command, its effects (grants, queue positions,
//!    timeouts, lost holds) routed to the batch's output; then answers the
//!    batch's inspection ops from the state this leaves;
//! 5. sends the output: one [`locksmith_proto::v1::ServerBatch`] per session
//!    stream, plus unary replies.
//!
//! So a client never sees a grant, a release or a fencing token that a crash
//! could take back: tokens never go backwards, even after kill -9 mid-load.
//! And since only committed records are ever applied, applying the log again
//! (replay after a restart, or another member of a replicated server) decides
//! everything the same way: whether a lock was free, whether a request id is
//! a retry, whether an expiry is still due (each one names the deadline it was
//! decided from and is void if a renew moved it). While the fsync runs, new
//! requests queue in the channel and form the next batch.
//!
//! Heartbeats are the exception: they only move a session's deadline, are
//! applied when they arrive and are not logged (a restart grants every
//! session a grace period instead).
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
mod request_ids;
mod session;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith_core::{Command, Effect, Engine, Millis, SessionId};
use locksmith_proto::v1 as pb;
use tonic::Status;

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::history::{History, HistoryLimits};
use crate::metrics::{Metrics, Tally};
use crate::op::{NewStream, Op, StreamId, StreamOp, UnaryReply};
use crate::outbox::{LeaseWaiter, Orphan, Output};
use crate::storage::{LogBuffer, Record, ServerSnapshot, SessionRecord, Storage};
use session::{PeerCounts, SessionEntry};

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
    pub fsyncs: AtomicU64,
    pub records: AtomicU64,
    pub commit_nanos: AtomicU64,
}

/// The durable log of a core.
struct Log {
    /// The encoded records of the batch being committed.
    buffer: LogBuffer,
    storage: Storage,
    /// Records since the last snapshot.
    since_snapshot: u64,
}

/// The engine, its log and the session table, owned by one thread.
pub(crate) struct Core {
    engine: Engine,
    clock: Clock,
    /// `None` in memory.
    log: Option<Log>,
    grace: Millis,
    max_sessions: usize,
    max_sessions_per_peer: usize,
    /// Open sessions per client address.
    peers: PeerCounts,
    max_unacked: usize,
    snapshot_every: u64,
    max_batch: usize,
    sessions: HashMap<SessionId, SessionEntry>,
    streams: HashMap<StreamId, SessionId>,
    leases: HashMap<u64, LeaseWaiter>,
    next_session: u64,
    /// Request ids of sessionless acquires, shared with the service that picks them.
    next_unary: Arc<AtomicU64>,
    last_now: Millis,
    /// What the batch sends once its records are durable and applied.
    output: Output,
    /// The records of the batch being built (kept for its allocations).
    proposal: Proposal,
    orphans: Vec<Orphan>,
    effects: Vec<Effect>,
    shutting_down: bool,
    /// Whether the acquire being applied asked for a `queued` reply.
    notify_queued: bool,
    stats: Arc<Stats>,
    /// Operations in the last batch and duration of the last commit, for the
    /// adaptive group commit.
    last_batch: usize,
    last_commit: Duration,
    /// Ops received and not looked at yet (see `take_arrivals`).
    arrived: Vec<Op>,
    /// Ops looked at (their heartbeats applied), waiting for their batch.
    backlog: VecDeque<Op>,
    /// The grant history and the table's counts (module `history`).
    history: History,
    /// Set once recovery is done: replayed records are not counted.
    metrics: Option<Arc<Metrics>>,
}

impl Core {
    /// Builds the core from the data directory (snapshot + log replay, then a
    /// fresh snapshot) or empty for an in-memory server.
    pub(crate) fn recover(config: &ServerConfig) -> Result<Core, ServerError> {
        let mut core = Core {
            engine: Engine::new(config.limits.clone()),
            clock: Clock::starting_after(0),
            log: None,
            grace: config.grace.as_millis() as Millis,
            max_sessions: config.max_sessions,
            max_sessions_per_peer: config.max_sessions_per_peer,
            peers: PeerCounts::default(),
            max_unacked: config.max_unacked_replies.max(1),
            snapshot_every: config.snapshot_every.max(1),
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
            last_batch: 0,
            last_commit: Duration::ZERO,
            arrived: Vec::new(),
            backlog: VecDeque::new(),
            history: History::new(HistoryLimits {
                per_lock: config.history_per_lock,
                total: config.history_total,
                max_age: config.history_max_age.as_millis() as Millis,
            }),
            metrics: None,
        };
        let Some(dir) = &config.data_dir else {
            return Ok(core);
        };
        let started = Instant::now();
        let (mut storage, snapshot) = Storage::open(dir, config)?;
        if let Some(snapshot) = snapshot {
            core.restore(config, snapshot);
        }
        let mut next_unary = core.next_unary.load(Ordering::Relaxed);
        let replayed = storage.replay(|record| {
            if let Record::Command(logged) = &record {
                if let Command::Acquire(a) = &logged.command {
                    if a.session == SessionId::NONE {
                        next_unary = next_unary.max(a.request.0 + 1);
                    }
                }
            }
            core.replay(record);
        })?;
        core.next_unary.store(next_unary, Ordering::Relaxed);
        if let Some(floor) = storage.token_floor() {
            core.engine.raise_token_floor(floor);
        }
        core.clock = Clock::starting_after(core.last_now + 1);
        let now = core.clock.now();
        core.last_now = now;
        // Logged through the snapshot written below, like any command, so a
        // replica replaying it agrees.
        let grace = Command::GrantGrace { grace: core.grace };
        core.engine
            .apply(now, grace, &mut Vec::new())
            .expect("granting grace always applies");
        core.log = Some(Log {
            buffer: LogBuffer::default(),
            storage,
            since_snapshot: 0,
        });
        core.write_snapshot(now).map_err(|e| ServerError::Io {
            context: format!("cannot write a snapshot in {}", dir.display()),
            source: e,
        })?;
        tracing::info!(
            data_dir = %dir.display(),
            replayed,
            sessions = core.sessions.len(),
            last_token = core.engine.last_token(),
            elapsed = ?started.elapsed(),
            "recovered"
        );
        Ok(core)
    }

    /// The loop's counters.
    pub(crate) fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Counts what the core does from now on in `metrics`.
    pub(crate) fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The counter of sessionless request ids, for the service.
    pub(crate) fn unary_ids(&self) -> Arc<AtomicU64> {
        self.next_unary.clone()
    }

    fn restore(&mut self, config: &ServerConfig, snapshot: ServerSnapshot) {
        self.last_now = snapshot.last_now;
        self.next_session = snapshot.next_session;
        self.next_unary = Arc::new(AtomicU64::new(snapshot.next_unary));
        self.history.restore(&snapshot.engine);
        self.engine = Engine::restore(config.limits.clone(), snapshot.engine);
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

    fn replay(&mut self, record: Record) {
        self.apply(record, Route::Nobody);
        self.output = Output::default();
    }

    /// Runs the loop until shutdown or until every sender is gone. Returns an
    /// error when the log could not be written (the server must stop: its state
    /// is ahead of what is durable).
    pub(crate) fn run(mut self, ops: Receiver<Op>) -> Result<(), String> {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            if self.backlog.is_empty() && self.arrived.is_empty() {
                let deadline = self
                    .engine
                    .next_deadline()
                    .and_then(|at| self.clock.instant_of(at));
                let first = match deadline {
                    Some(deadline) => {
                        match ops.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                            Ok(op) => Some(op),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => return self.stop(),
                        }
                    }
                    None => match ops.recv() {
                        Ok(op) => Some(op),
                        Err(_) => return self.stop(),
                    },
                };
                self.arrived.extend(first);
            }
            let taken = Instant::now();
            if let Some(window) = self.gather_window() {
                let until = Instant::now() + window;
                while let Ok(op) = ops.recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    self.arrived.push(op);
                    if self.arrived.len() >= self.max_batch {
                        break;
                    }
                }
            }
            let now = self.clock.now();
            self.last_now = now;
            self.take_arrivals(&ops, now);
            self.next_batch(&mut batch);
            self.last_batch = batch.iter().map(Op::count).sum();
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.stats
                .ops
                .fetch_add(self.last_batch as u64, Ordering::Relaxed);
            let tally = self.metrics.as_ref().map(|_| Tally::of(&batch));
            let mut proposal = std::mem::take(&mut self.proposal);
            self.propose_orphan_releases(now, &mut proposal);
            let mut shutdown = None;
            for op in batch.drain(..) {
                match op {
                    Op::Shutdown { done } => shutdown = Some(done),
                    op => self.propose(now, op, &mut proposal),
                }
            }
            // After the client ops: a heartbeat or renew in this batch wins.
            for command in self.engine.due_at_most(now, self.max_batch) {
                proposal.command(now, command, None, None, Route::Nobody);
            }
            if let Err(error) = self.commit(&proposal.records) {
                return Err(self.fail(format!("cannot write the log: {error}")));
            }
            self.apply_proposal(now, &mut proposal);
            self.proposal = proposal;
            if let Err(error) = self.raise_token_ceiling() {
                return Err(self.fail(format!("cannot write the manifest: {error}")));
            }
            if let Some(metrics) = &self.metrics {
                // Before the replies leave: a client that saw one scrapes
                // gauges at least as new.
                metrics.table_now(self.history.census(), self.engine.last_token());
            }
            std::mem::take(&mut self.output).send(&mut self.orphans);
            if let Some(log) = self.log.as_mut() {
                // Off the path of the replies just sent: zeros ahead of the end.
                if let Err(error) = log.storage.prepare() {
                    return Err(self.fail(format!("cannot write the log: {error}")));
                }
            }
            if let (Some(metrics), Some(tally)) = (&self.metrics, tally) {
                metrics.batch_done(self.last_batch, &tally, taken.elapsed());
            }
            if let Some(done) = shutdown {
                let result = self.shut_down(now);
                let _ = done.send(result.clone());
                return result;
            }
            if self
                .log
                .as_ref()
                .is_some_and(|log| log.since_snapshot >= self.snapshot_every)
            {
                if let Err(error) = self.write_snapshot(now) {
                    return Err(self.fail(format!("cannot write a snapshot: {error}")));
                }
            }
        }
    }

    /// Moves every op waiting in the channel (and those received meanwhile)
    /// to the backlog, applying the heartbeats among them first.
    ///
    /// This is what keeps one client from expiring another: when a batch
    /// kept the engine busy past a session's deadline while that session's
    /// heartbeat waited in the channel, the heartbeat is applied before the
    /// expiry is decided, so a session never expires while its heartbeat is
    /// queued. A heartbeat applied ahead of its turn changes nothing else
    /// (it only moves the session's deadline, and is not logged); its answer
    /// still goes out in order.
    fn take_arrivals(&mut self, ops: &Receiver<Op>, now: Millis) {
        self.arrived.extend(ops.try_iter());
        let mut arrived = std::mem::take(&mut self.arrived);
        for op in arrived.drain(..) {
            if let Some(session) = self.heartbeat_in(&op) {
                let _ = self
                    .engine
                    .apply(now, Command::Heartbeat { session }, &mut self.effects);
                self.effects.clear();
            }
            self.backlog.push_back(op);
        }
        self.arrived = arrived;
    }

    /// The session `op` proves alive: a client batch with a heartbeat, or a
    /// resume with the right secret.
    fn heartbeat_in(&self, op: &Op) -> Option<SessionId> {
        match op {
            Op::Stream { stream, ops, .. }
                if ops.iter().any(|o| matches!(o, StreamOp::Heartbeat)) =>
            {
                self.streams.get(stream).copied()
            }
            Op::Resume {
                session, secret, ..
            } if self
                .sessions
                .get(session)
                .is_some_and(|e| e.secret == *secret) =>
            {
                Some(*session)
            }
            _ => None,
        }
    }

    /// Takes the next batch from the backlog: ops in arrival order, up to
    /// `max_batch` messages (at least one op), so that no batch holds the
    /// engine thread for long however much is queued.
    fn next_batch(&mut self, batch: &mut Vec<Op>) {
        let mut messages = 0;
        while let Some(op) = self.backlog.front() {
            messages += op.count();
            if messages > self.max_batch && !batch.is_empty() {
                break;
            }
            batch.extend(self.backlog.pop_front());
        }
    }

    /// Makes `records` durable: one write and one `fdatasync` for the whole
    /// batch (the group commit). Nothing of the batch is applied before.
    fn commit(&mut self, records: &[Record]) -> std::io::Result<()> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        if records.is_empty() {
            return Ok(());
        }
        for record in records {
            log.buffer.push(record);
        }
        log.since_snapshot += records.len() as u64;
        self.last_commit = commit(
            log,
            &self.stats,
            self.engine.last_token(),
            self.metrics.as_deref(),
        )?;
        Ok(())
    }

    /// Before any reply carries a token the batch handed out: makes the
    /// storage's token ceiling cover it.
    fn raise_token_ceiling(&mut self) -> std::io::Result<()> {
        match self.log.as_mut() {
            Some(log) => log.storage.commit(&mut [], self.engine.last_token()),
            None => Ok(()),
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

    /// Adaptive group commit (PostgreSQL's `commit_delay` with
    /// `commit_siblings`): when the log is slow and several requests are busy,
    /// wait a quarter of the last commit's duration (at most 1 ms) for more
    /// requests before applying the batch. Their clients got their replies at
    /// the end of the last commit; without the wait, their next requests just
    /// miss this batch and wait for a whole extra fsync.
    fn gather_window(&self) -> Option<Duration> {
        const SIBLINGS: usize = 4;
        const SLOW_COMMIT: Duration = Duration::from_micros(400);
        const MAX_WAIT: Duration = Duration::from_millis(1);
        (self.log.is_some() && self.last_batch >= SIBLINGS && self.last_commit >= SLOW_COMMIT)
            .then(|| (self.last_commit / 4).min(MAX_WAIT))
    }

    /// Every sender is gone (the server was dropped without a shutdown).
    fn stop(mut self) -> Result<(), String> {
        let now = self.clock.now();
        self.shut_down(now)
    }

    /// Stops after a storage failure: ends every stream, sends nothing else.
    fn fail(&mut self, message: String) -> String {
        tracing::error!(%message, "stopping: the lock state is ahead of the durable log");
        self.output = Output::default();
        for entry in self.sessions.values_mut() {
            if let Some(a) = entry.attached.take() {
                let _ =
                    a.tx.send(Err(Status::unavailable("lock server storage failure")));
                a.ended.cancel();
            }
        }
        message
    }

    fn shut_down(&mut self, now: Millis) -> Result<(), String> {
        self.shutting_down = true;
        for entry in self.sessions.values_mut() {
            if let Some(a) = entry.attached.take() {
                let _ =
                    a.tx.send(Err(Status::unavailable("lock server is shutting down")));
                a.ended.cancel();
            }
        }
        self.streams.clear();
        for (_, waiter) in self.leases.drain() {
            let _ = waiter
                .reply
                .send(Err(Status::unavailable("lock server is shutting down")));
        }
        self.write_snapshot(now)
            .map_err(|e| format!("cannot write a snapshot: {e}"))?;
        tracing::info!(last_token = self.engine.last_token(), "lock engine stopped");
        Ok(())
    }

    /// Commits what is buffered, then writes a snapshot, which starts a new
    /// log segment.
    fn write_snapshot(&mut self, now: Millis) -> std::io::Result<()> {
        if self.log.is_none() {
            return Ok(());
        }
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
        let mut snapshot = ServerSnapshot {
            first_segment: 0,
            last_now: now,
            next_session: self.next_session,
            next_unary: self.next_unary.load(Ordering::Relaxed),
            engine: self.engine.snapshot(),
            sessions,
        };
        let log = self.log.as_mut().expect("checked above");
        commit(
            log,
            &self.stats,
            self.engine.last_token(),
            self.metrics.as_deref(),
        )?;
        log.storage.write_snapshot(&mut snapshot)?;
        log.since_snapshot = 0;
        tracing::info!(
            locks = snapshot.engine.locks.len(),
            sessions = snapshot.sessions.len(),
            elapsed = ?started.elapsed(),
            "snapshot written"
        );
        Ok(())
    }
}

/// Writes and fsyncs the buffered records (if any), counting it in `stats`
/// and `metrics`; returns how long it took. `last_token` is the engine's (the
/// storage keeps a ceiling above every token made visible).
fn commit(
    log: &mut Log,
    stats: &Stats,
    last_token: u64,
    metrics: Option<&Metrics>,
) -> std::io::Result<Duration> {
    let (mut records, count) = log.buffer.take();
    if records.is_empty() {
        return Ok(Duration::ZERO);
    }
    let started = Instant::now();
    log.storage.commit(&mut records, last_token)?;
    let elapsed = started.elapsed();
    stats
        .commit_nanos
        .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    stats.records.fetch_add(count, Ordering::Relaxed);
    if let Some(metrics) = metrics {
        metrics.committed(elapsed, count);
    }
    log.buffer.give_back(records);
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use locksmith_core::ClientInfo;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::op::{Acks, NewStream};

    fn core(max_batch: usize) -> Core {
        let config = ServerConfig {
            max_batch,
            ..ServerConfig::in_memory()
        };
        Core::recover(&config).unwrap()
    }

    /// Opens a session (TTL 1 s) on stream `stream` at `now`.
    fn open(core: &mut Core, stream: StreamId, now: Millis) -> SessionId {
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let new = NewStream {
            id: stream,
            tx,
            ended: CancellationToken::new(),
            peer: None,
        };
        let mut proposal = Proposal::default();
        let open = Op::Open {
            stream: new,
            info: ClientInfo::default(),
            ttl: 1_000,
        };
        core.propose(now, open, &mut proposal);
        core.commit(&proposal.records).unwrap();
        core.apply_proposal(now, &mut proposal);
        core.streams[&stream]
    }

    /// One batch of `op` through the whole path: propose, commit, apply.
    fn run(core: &mut Core, now: Millis, op: Op) {
        let mut proposal = Proposal::default();
        core.propose(now, op, &mut proposal);
        core.commit(&proposal.records).unwrap();
        core.apply_proposal(now, &mut proposal);
        core.output = Output::default();
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
    fn replay_decides_a_request_id_reused_after_its_ack_as_the_first_run_did() {
        let dir = tempfile::tempdir().unwrap();
        let config = ServerConfig::durable(dir.path());
        let mut core = Core::recover(&config).unwrap();
        let now = core.clock.now();
        let session = open(&mut core, 1, now);
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
        run(&mut core, now, client_batch(1, [acquire]));
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
        run(&mut core, now, release);
        assert_eq!(holders(&core, "reused"), 0);
        drop(core);

        let core = Core::recover(&config).unwrap();
        assert!(core.sessions.contains_key(&session));
        assert_eq!(holders(&core, "reused"), 0, "replay released it too");
    }

    fn client_batch(stream: StreamId, ops: impl IntoIterator<Item = StreamOp>) -> Op {
        Op::Stream {
            stream,
            acks: Acks::default(),
            ops: ops.into_iter().collect(),
        }
    }

    #[test]
    fn a_heartbeat_waiting_in_the_channel_is_applied_before_expiries() {
        let mut core = core(4096);
        let now = core.clock.now();
        let session = open(&mut core, 1, now);
        let (ops, arrivals) = std::sync::mpsc::channel();
        ops.send(client_batch(1, [StreamOp::Heartbeat])).unwrap();
        // The engine was busy past the session's deadline meanwhile.
        let late = now + 1_500;
        core.take_arrivals(&arrivals, late);
        assert_eq!(core.engine.due(late), []);
        assert!(core.engine.has_session(session));
    }

    #[test]
    fn a_batch_ends_at_max_batch_messages() {
        let mut core = core(10);
        let (ops, arrivals) = std::sync::mpsc::channel();
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
}
