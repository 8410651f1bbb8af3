//! The one owner of the lock engine: a thread fed by a channel, with group
//! commit.
//!
//! # The loop
//!
//! The core thread sleeps until an [`Op`] arrives or the engine's next deadline
//! ([`Engine::next_deadline`]) passes. Then it takes every op already queued
//! (up to `max_batch`) as one **batch**, and for that batch:
//!
//! 1. reads the clock once (`now`, see [`Clock`]); when the last fsync was
//!    slow and many requests are busy, it first waits a fraction of that fsync
//!    for more of them (adaptive group commit, see `Core::gather_window`);
//! 2. applies the time-driven commands that are due ([`Engine::due`]: session
//!    expiries, lease expiries, waiter timeouts, ends of lock-delay), each logged
//!    like any other command, so replay never re-decides time;
//! 3. handles each op: turns it into engine commands, applies them, appends
//!    every command that changed state (all but heartbeats, failed commands and
//!    no-wait acquires that found the lock busy) to the log buffer, and routes
//!    the effects (grants, queue positions, timeouts, lost holds) to the
//!    batch's output (module `outbox`), **without sending anything yet**;
//! 4. writes the log buffer and makes it durable with **one `fdatasync`** (the
//!    group commit: every request that arrived meanwhile shares it);
//! 5. only then sends the output: one [`pb::ServerBatch`] per session stream,
//!    plus unary replies.
//!
//! So a client never sees a grant, a release or a fencing token that a crash
//! could take back: tokens never go backwards, even after kill -9 mid-load.
//! While the fsync runs, new requests queue in the channel and form the next
//! batch.
//!
//! The rule is *durable before visible*, and the log is written in order, so
//! a commit covers every record before it. A batch that makes nothing visible
//! (say, an acquire that queues, whose client waits for the grant) skips step
//! 4: its records wait in the buffer for the next batch that sends something.
//! If the server crashes first, nobody saw them, and the client sends the
//! request again when it resumes its session. In a busy queue this halves the
//! fsyncs: a handoff (release + grant) pays one, the new waiter's acquire none.
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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, Engine, EngineError, Millis, Mode, RequestId, SessionId,
    Wait,
};
use locksmith_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::convert::{self, engine_error_to_status};
use crate::error::ServerError;
use crate::outbox::{LeaseWaiter, Orphan, Output};
use crate::storage::{
    LogBuffer, LogRecord, LogRecordRef, LostNotice, Outcome, ServerSnapshot, SessionRecord, Storage,
};

/// Log bytes a batch with nothing to send may leave unsynced for the next
/// commit.
const MAX_UNSYNCED_BYTES: usize = 64 << 10;

/// Where a session stream's messages go.
pub(crate) type StreamTx = mpsc::UnboundedSender<Result<pb::ServerBatch, Status>>;
/// Identifies one session stream (one gRPC call) for the life of the process.
pub(crate) type StreamId = u64;
/// The reply slot of a unary call.
pub(crate) type UnaryReply<T> = oneshot::Sender<Result<T, Status>>;

/// How long an acquire may wait, relative to when the core applies it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WaitArg {
    /// Never queue.
    No,
    /// Queue at most this long.
    For(Millis),
    /// Queue until granted or cancelled.
    Forever,
}

/// A validated acquire, before it gets a session, request id and time.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub names: Vec<String>,
    pub mode: Mode,
    pub owner: String,
    pub wait: WaitArg,
    pub lease: Option<Millis>,
    pub reentrant: bool,
    pub lock_delay: Millis,
    /// Reply `queued` when it has to wait (session streams only).
    pub notify_queued: bool,
}

impl AcquireArgs {
    fn into_command(self, session: SessionId, request: u64, now: Millis) -> Command {
        Command::Acquire(Acquire {
            session,
            request: RequestId(request),
            owner: self.owner,
            names: self.names,
            mode: self.mode,
            wait: match self.wait {
                WaitArg::No => Wait::No,
                WaitArg::For(ms) => Wait::Until(now.saturating_add(ms)),
                WaitArg::Forever => Wait::Forever,
            },
            lease: self.lease,
            reentrant: self.reentrant,
            lock_delay: self.lock_delay,
        })
    }
}

/// Release or renew of one hold.
#[derive(Debug, Clone)]
pub(crate) struct HoldArgs {
    pub name: String,
    pub owner: String,
    pub token: Option<u64>,
}

/// What a session stream asks for.
#[derive(Debug)]
pub(crate) enum StreamOp {
    /// Keep the session alive.
    Heartbeat,
    /// Acquire.
    Acquire { id: u64, args: AcquireArgs },
    /// Release a hold.
    Release { id: u64, hold: HoldArgs },
    /// Extend a leased hold.
    Renew {
        id: u64,
        hold: HoldArgs,
        lease: Millis,
    },
    /// Stop waiting for request `id`.
    Cancel { id: u64 },
    /// Close the session.
    Close,
    /// A request the stream handler refused; answered in order with the error.
    Invalid { id: u64, error: pb::Error },
    /// Only acknowledgements.
    AckOnly,
}

/// Ids the client acknowledges.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    pub replies: Vec<u64>,
    pub lost: Vec<u64>,
}

/// A message to the core thread.
pub(crate) enum Op {
    /// A new stream opens a session.
    Open {
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        info: ClientInfo,
        ttl: Millis,
    },
    /// A new stream resumes a session.
    Resume {
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        session: SessionId,
        secret: u128,
    },
    /// One client batch on an attached stream: its acknowledgements, then its
    /// messages in order.
    Stream {
        stream: StreamId,
        acks: Acks,
        ops: Vec<StreamOp>,
    },
    /// A stream ended (its session lives on until its TTL); `error` is sent to
    /// it first if it is still attached.
    Detach {
        stream: StreamId,
        error: Option<Status>,
    },
    /// A sessionless acquire (unary).
    AcquireLease {
        request: u64,
        args: AcquireArgs,
        reply: UnaryReply<pb::AcquireLeaseResponse>,
    },
    /// The caller of a sessionless acquire went away.
    CancelLease { request: u64 },
    /// Release a sessionless hold.
    Release {
        hold: HoldArgs,
        reply: UnaryReply<pb::ReleaseResponse>,
    },
    /// Renew a sessionless hold.
    Renew {
        hold: HoldArgs,
        lease: Millis,
        reply: UnaryReply<pb::RenewResponse>,
    },
    /// Describe one lock.
    Describe {
        name: String,
        reply: UnaryReply<pb::DescribeResponse>,
    },
    /// List locks by prefix.
    List {
        prefix: String,
        reply: UnaryReply<pb::ListResponse>,
    },
    /// List sessions.
    ListSessions {
        reply: UnaryReply<pb::ListSessionsResponse>,
    },
    /// Administrator release.
    ForceRelease {
        name: String,
        reply: UnaryReply<pb::ForceReleaseResponse>,
    },
    /// Close a session from outside.
    CloseSession {
        session: SessionId,
        secret: u128,
        reply: UnaryReply<pb::CloseSessionResponse>,
    },
    /// End every stream, write a snapshot and stop.
    Shutdown {
        done: oneshot::Sender<Result<(), String>>,
    },
}

impl Op {
    /// How many operations it carries (the messages of a client batch, one
    /// for anything else).
    fn count(&self) -> usize {
        match self {
            Op::Stream { ops, .. } => ops.len().max(1),
            _ => 1,
        }
    }
}

/// The server's part of one session.
struct SessionEntry {
    secret: u128,
    ttl: Millis,
    attached: Option<Attached>,
    replies: BTreeMap<u64, Outcome>,
    lost: BTreeMap<u64, LostNotice>,
}

struct Attached {
    stream: StreamId,
    tx: StreamTx,
    ended: CancellationToken,
}

/// What the core does after a command succeeded, besides routing its effects.
enum After {
    Nothing,
    Acquire,
    Open {
        session: SessionId,
        secret: u128,
        ttl: Millis,
    },
    End {
        session: SessionId,
        reason: &'static str,
    },
    Reply {
        session: SessionId,
        request: u64,
        outcome: Outcome,
    },
    CancelLease {
        request: u64,
    },
}

impl After {
    fn of(command: &Command, secret: Option<u128>, request: Option<u64>) -> After {
        match command {
            Command::OpenSession { session, ttl, .. } => After::Open {
                session: *session,
                secret: secret.unwrap_or_default(),
                ttl: *ttl,
            },
            Command::CloseSession { session } => After::End {
                session: *session,
                reason: "closed",
            },
            Command::ExpireSession { session } => After::End {
                session: *session,
                reason: "expired",
            },
            Command::Acquire(_) => After::Acquire,
            Command::Cancel { session, request } if *session == SessionId::NONE => {
                After::CancelLease { request: request.0 }
            }
            Command::Cancel { session, request } => After::Reply {
                session: *session,
                request: request.0,
                outcome: Outcome::Cancelled,
            },
            Command::Release { session, .. } | Command::Renew { session, .. } => match request {
                Some(request) => After::Reply {
                    session: *session,
                    request,
                    outcome: Outcome::Done,
                },
                None => After::Nothing,
            },
            _ => After::Nothing,
        }
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
    /// Records of the batches since the last commit.
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
    /// What the batch sends once its records are durable.
    output: Output,
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
            orphans: Vec::new(),
            effects: Vec::new(),
            shutting_down: false,
            notify_queued: false,
            stats: Arc::default(),
            last_batch: 0,
            last_commit: Duration::ZERO,
        };
        let Some(dir) = &config.data_dir else {
            return Ok(core);
        };
        let started = Instant::now();
        let (mut storage, snapshot) = Storage::open(dir)?;
        if let Some(snapshot) = snapshot {
            core.restore(config, snapshot);
        }
        let mut next_unary = core.next_unary.load(Ordering::Relaxed);
        let replayed = storage.replay(|record| {
            if let Command::Acquire(a) = &record.command {
                if a.session == SessionId::NONE {
                    next_unary = next_unary.max(a.request.0 + 1);
                }
            }
            core.replay(record);
        })?;
        core.next_unary.store(next_unary, Ordering::Relaxed);
        core.clock = Clock::starting_after(core.last_now + 1);
        let now = core.clock.now();
        core.last_now = now;
        core.engine.grant_grace(now, core.grace);
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

    /// The counter of sessionless request ids, for the service.
    pub(crate) fn unary_ids(&self) -> Arc<AtomicU64> {
        self.next_unary.clone()
    }

    fn restore(&mut self, config: &ServerConfig, snapshot: ServerSnapshot) {
        self.last_now = snapshot.last_now;
        self.next_session = snapshot.next_session;
        self.next_unary = Arc::new(AtomicU64::new(snapshot.next_unary));
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
                        lost: s.lost.into_iter().map(|n| (n.token, n)).collect(),
                    },
                )
            })
            .collect();
    }

    fn replay(&mut self, record: LogRecord) {
        self.last_now = self.last_now.max(record.now);
        let command = format!("{:?}", record.command);
        if let Err(error) = self.execute(record.now, record.command, record.secret, record.request)
        {
            // Replay applies exactly what succeeded before, so this means the log
            // and this engine disagree; carry on with what does apply.
            tracing::error!(%error, %command, "a logged command fails on replay");
        }
        self.output = Output::default();
    }

    /// Runs the loop until shutdown or until every sender is gone. Returns an
    /// error when the log could not be written (the server must stop: its state
    /// is ahead of what is durable).
    pub(crate) fn run(mut self, ops: Receiver<Op>) -> Result<(), String> {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
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
            batch.extend(first);
            self.drain(&ops, &mut batch);
            if let Some(window) = self.gather_window() {
                let until = Instant::now() + window;
                while batch.len() < self.max_batch {
                    match ops.recv_timeout(until.saturating_duration_since(Instant::now())) {
                        Ok(op) => {
                            batch.push(op);
                            self.drain(&ops, &mut batch);
                        }
                        Err(_) => break,
                    }
                }
            }
            self.last_batch = batch.iter().map(Op::count).sum();
            let now = self.clock.now();
            self.last_now = now;
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.stats
                .ops
                .fetch_add(self.last_batch as u64, Ordering::Relaxed);
            self.release_orphans(now);
            for command in self.engine.due(now) {
                if let Err(error) = self.execute(now, command, None, None) {
                    tracing::debug!(%error, "time-driven command no longer applies");
                }
            }
            let mut shutdown = None;
            for op in batch.drain(..) {
                match op {
                    Op::Shutdown { done } => shutdown = Some(done),
                    op => self.handle(now, op),
                }
                self.release_orphans(now);
            }
            if let Err(error) = self.finish_batch() {
                return Err(self.fail(format!("cannot write the log: {error}")));
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

    /// Sends the batch's output once its records (and every earlier one) are
    /// durable.
    ///
    /// Durable before visible: the log is written in order, so a commit
    /// covers every record before it. A batch that makes nothing visible (a
    /// queued acquire, a cancel nobody waits for) needs no commit of its own:
    /// its records wait in the buffer for the next one.
    fn finish_batch(&mut self) -> std::io::Result<()> {
        let output = std::mem::take(&mut self.output);
        if let Some(log) = self.log.as_mut() {
            if output.is_empty() && log.buffer.len() < MAX_UNSYNCED_BYTES {
                return Ok(());
            }
            self.last_commit = commit(log, &self.stats)?;
            output.send(&mut self.orphans);
            // Off the path of the replies just sent: zeros ahead of the end.
            return log.storage.prepare();
        }
        output.send(&mut self.orphans);
        Ok(())
    }

    /// Takes what is queued, up to the batch limit.
    fn drain(&self, ops: &Receiver<Op>, batch: &mut Vec<Op>) {
        while batch.len() < self.max_batch {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
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
        commit(log, &self.stats)?;
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

    /// Applies one command: logs it if it changes state, routes its effects and
    /// does what the server keeps beside the engine.
    fn execute(
        &mut self,
        now: Millis,
        command: Command,
        secret: Option<u128>,
        request: Option<u64>,
    ) -> Result<(), EngineError> {
        let after = After::of(&command, secret, request);
        let mark = self.log.as_mut().map(|log| {
            log.buffer.begin(&LogRecordRef {
                now,
                command: &command,
                secret,
                request,
            })
        });
        let mut effects = std::mem::take(&mut self.effects);
        let result = self.engine.apply(now, command, &mut effects);
        if let (Some(mark), Some(log)) = (mark, self.log.as_mut()) {
            let no_op = matches!(after, After::Acquire)
                && matches!(
                    effects.as_slice(),
                    [Effect::WouldBlock { .. }] | [Effect::TimedOut { .. }]
                );
            if result.is_ok() && !no_op {
                log.buffer.finish(mark);
                log.since_snapshot += 1;
            } else {
                log.buffer.rollback(mark);
            }
        }
        if result.is_ok() {
            if let After::Open {
                session,
                secret,
                ttl,
            } = after
            {
                self.next_session = self.next_session.max(session.0 + 1);
                self.sessions.insert(
                    session,
                    SessionEntry {
                        secret,
                        ttl,
                        attached: None,
                        replies: BTreeMap::new(),
                        lost: BTreeMap::new(),
                    },
                );
            }
            for effect in effects.drain(..) {
                self.route(effect);
            }
            match after {
                After::End { session, reason } => self.end_session(session, reason),
                After::Reply {
                    session,
                    request,
                    outcome,
                } => self.reply(session, request, outcome),
                After::CancelLease { request } => {
                    self.leases.remove(&request);
                }
                After::Nothing | After::Acquire | After::Open { .. } => {}
            }
        }
        effects.clear();
        self.effects = effects;
        result
    }

    fn route(&mut self, effect: Effect) {
        match effect {
            Effect::Granted {
                session,
                request,
                tokens,
            } => {
                if session == SessionId::NONE {
                    if let Some(waiter) = self.leases.remove(&request.0) {
                        self.output.lease_grants.push((waiter, tokens));
                    }
                } else {
                    self.reply(session, request.0, Outcome::Granted(tokens));
                }
            }
            Effect::Queued {
                session,
                request,
                position,
            } => {
                if !self.notify_queued {
                    return;
                }
                let message = convert::reply(
                    request.0,
                    pb::reply::Result::Queued(pb::Queued { position }),
                );
                self.send_to(session, message);
            }
            Effect::WouldBlock { session, request } => {
                self.lease_or_reply(session, request, Outcome::WouldBlock)
            }
            Effect::TimedOut { session, request } => {
                self.lease_or_reply(session, request, Outcome::TimedOut)
            }
            Effect::Lost {
                session,
                owner,
                name,
                token,
                reason,
            } => {
                let Some(entry) = self.sessions.get_mut(&session) else {
                    return;
                };
                let notice = LostNotice {
                    name,
                    owner,
                    token,
                    reason,
                };
                if let Some(a) = &entry.attached {
                    self.output
                        .streams
                        .push(a.stream, &a.tx, convert::lost_to_proto(&notice));
                }
                entry.lost.insert(token, notice);
            }
        }
    }

    fn lease_or_reply(&mut self, session: SessionId, request: RequestId, outcome: Outcome) {
        if session != SessionId::NONE {
            return self.reply(session, request.0, outcome);
        }
        if let Some(waiter) = self.leases.remove(&request.0) {
            let response = pb::AcquireLeaseResponse {
                granted: false,
                tokens: Vec::new(),
                timed_out: outcome == Outcome::TimedOut,
            };
            self.output.unary.push(Box::new(move || {
                let _ = waiter.reply.send(Ok(response));
            }));
        }
    }

    /// Keeps a final reply for the session and sends it if a stream is attached.
    fn reply(&mut self, session: SessionId, request: u64, outcome: Outcome) {
        let Some(entry) = self.sessions.get_mut(&session) else {
            return;
        };
        if let Some(a) = &entry.attached {
            let message = convert::reply(request, convert::outcome_to_proto(&outcome));
            self.output.streams.push(a.stream, &a.tx, message);
        }
        entry.replies.insert(request, outcome);
        if entry.replies.len() > self.max_unacked {
            entry.replies.pop_first();
        }
    }

    fn send_to(&mut self, session: SessionId, message: pb::ServerMessage) {
        if let Some(a) = self
            .sessions
            .get(&session)
            .and_then(|e| e.attached.as_ref())
        {
            self.output.streams.push(a.stream, &a.tx, message);
        }
    }

    fn send_error(&mut self, session: SessionId, request: u64, error: pb::Error) {
        self.send_to(
            session,
            convert::reply(request, pb::reply::Result::Error(error)),
        );
    }

    fn end_session(&mut self, session: SessionId, reason: &'static str) {
        let Some(entry) = self.sessions.remove(&session) else {
            return;
        };
        if let Some(a) = entry.attached {
            self.streams.remove(&a.stream);
            let ended = pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                    reason: reason.into(),
                })),
            };
            self.output.streams.push(a.stream, &a.tx, ended);
            a.ended.cancel();
        }
        tracing::debug!(%session, reason, "session ended");
    }

    fn release_orphans(&mut self, now: Millis) {
        for orphan in std::mem::take(&mut self.orphans) {
            for (name, token) in orphan.names.into_iter().zip(orphan.tokens) {
                let release = Command::Release {
                    session: SessionId::NONE,
                    owner: orphan.owner.clone(),
                    name,
                    token: Some(token),
                };
                let _ = self.execute(now, release, None, None);
            }
        }
    }

    fn defer<T: Send + 'static>(&mut self, reply: UnaryReply<T>, value: Result<T, Status>) {
        self.output.unary.push(Box::new(move || {
            let _ = reply.send(value);
        }));
    }

    fn handle(&mut self, now: Millis, op: Op) {
        match op {
            Op::Open {
                stream,
                tx,
                ended,
                info,
                ttl,
            } => self.open(now, stream, tx, ended, info, ttl),
            Op::Resume {
                stream,
                tx,
                ended,
                session,
                secret,
            } => self.resume(now, stream, tx, ended, session, secret),
            Op::Stream { stream, acks, ops } => {
                let Some(&session) = self.streams.get(&stream) else {
                    return; // a stream that was detached or resumed elsewhere
                };
                if let Some(entry) = self.sessions.get_mut(&session) {
                    for id in acks.replies {
                        entry.replies.remove(&id);
                    }
                    for token in acks.lost {
                        entry.lost.remove(&token);
                    }
                }
                for op in ops {
                    // A close (or an expiry) ends the session midway: the rest
                    // of the batch has no session to run in.
                    if self.streams.get(&stream) != Some(&session) {
                        break;
                    }
                    self.stream_op(now, session, op);
                }
            }
            Op::Detach { stream, error } => {
                let Some(session) = self.streams.remove(&stream) else {
                    return;
                };
                let Some(entry) = self.sessions.get_mut(&session) else {
                    return;
                };
                if entry.attached.as_ref().is_some_and(|a| a.stream == stream) {
                    let a = entry.attached.take().expect("checked");
                    if let Some(status) = error {
                        self.output.streams.end(a.stream, &a.tx, status);
                    }
                    a.ended.cancel();
                    tracing::debug!(%session, "session detached; it lives until its TTL");
                }
            }
            Op::AcquireLease {
                request,
                args,
                reply,
            } => {
                if self.shutting_down {
                    return self.defer(reply, Err(Status::unavailable("shutting down")));
                }
                self.leases.insert(
                    request,
                    LeaseWaiter {
                        reply,
                        names: args.names.clone(),
                        owner: args.owner.clone(),
                    },
                );
                let command = args.into_command(SessionId::NONE, request, now);
                if let Err(error) = self.execute(now, command, None, None) {
                    if let Some(waiter) = self.leases.remove(&request) {
                        self.defer(waiter.reply, Err(engine_error_to_status(&error)));
                    }
                }
            }
            Op::CancelLease { request } => {
                if self.leases.remove(&request).is_some() {
                    let cancel = Command::Cancel {
                        session: SessionId::NONE,
                        request: RequestId(request),
                    };
                    let _ = self.execute(now, cancel, None, None);
                }
            }
            Op::Release { hold, reply } => {
                let command = Command::Release {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                let result = self
                    .execute(now, command, None, None)
                    .map(|()| pb::ReleaseResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::Renew { hold, lease, reply } => {
                let command = Command::Renew {
                    session: SessionId::NONE,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                let result = self
                    .execute(now, command, None, None)
                    .map(|()| pb::RenewResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::Describe { name, reply } => {
                let lock = self.engine.describe(&name).map(|info| {
                    let expiry = self.session_expiry(&[&info]);
                    convert::lock_info_to_proto(info, &expiry)
                });
                self.defer(reply, Ok(pb::DescribeResponse { lock, now_ms: now }));
            }
            Op::List { prefix, reply } => {
                let infos = self.engine.list(&prefix);
                let expiry = self.session_expiry(&infos.iter().collect::<Vec<_>>());
                let locks = infos
                    .into_iter()
                    .map(|info| convert::lock_info_to_proto(info, &expiry))
                    .collect();
                self.defer(reply, Ok(pb::ListResponse { locks, now_ms: now }));
            }
            Op::ListSessions { reply } => {
                let sessions = self
                    .engine
                    .sessions()
                    .into_iter()
                    .map(|s| pb::SessionInfo {
                        session_id: s.session.0,
                        client_name: s.info.name,
                        host: s.info.host,
                        ttl_ms: s.ttl,
                        expires_at_ms: s.expires_at,
                        holds: s.holds as u64,
                        connected: self
                            .sessions
                            .get(&s.session)
                            .is_some_and(|e| e.attached.is_some()),
                    })
                    .collect();
                self.defer(
                    reply,
                    Ok(pb::ListSessionsResponse {
                        sessions,
                        now_ms: now,
                    }),
                );
            }
            Op::ForceRelease { name, reply } => {
                let result = self
                    .execute(now, Command::ForceRelease { name }, None, None)
                    .map(|()| pb::ForceReleaseResponse {})
                    .map_err(|e| engine_error_to_status(&e));
                self.defer(reply, result);
            }
            Op::CloseSession {
                session,
                secret,
                reply,
            } => {
                let result = if self
                    .sessions
                    .get(&session)
                    .is_some_and(|e| e.secret == secret)
                {
                    self.execute(now, Command::CloseSession { session }, None, None)
                        .map(|()| pb::CloseSessionResponse {})
                        .map_err(|e| engine_error_to_status(&e))
                } else {
                    Err(unknown_session(session))
                };
                self.defer(reply, result);
            }
            Op::Shutdown { done } => {
                let _ = done.send(Ok(()));
            }
        }
    }

    /// Expiry of every session holding one of `locks` without a lease.
    fn session_expiry(&self, locks: &[&locksmith_core::LockInfo]) -> HashMap<SessionId, Millis> {
        let needed = locks
            .iter()
            .flat_map(|l| &l.holders)
            .any(|h| h.session != SessionId::NONE);
        if !needed {
            return HashMap::new();
        }
        self.engine
            .sessions()
            .into_iter()
            .map(|s| (s.session, s.expires_at))
            .collect()
    }

    fn open(
        &mut self,
        now: Millis,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        info: ClientInfo,
        ttl: Millis,
    ) {
        if self.shutting_down {
            let status = Status::unavailable("lock server is shutting down");
            self.output.streams.end(stream, &tx, status);
            return ended.cancel();
        }
        if self.sessions.len() >= self.max_sessions {
            let status = Status::resource_exhausted(format!(
                "limit reached: sessions (at most {})",
                self.max_sessions
            ));
            self.output.streams.end(stream, &tx, status);
            return ended.cancel();
        }
        let session = SessionId(self.next_session);
        let secret: u128 = rand::random();
        let command = Command::OpenSession {
            session,
            ttl,
            info: info.clone(),
        };
        if let Err(error) = self.execute(now, command, Some(secret), None) {
            self.output
                .streams
                .end(stream, &tx, engine_error_to_status(&error));
            return ended.cancel();
        }
        let opened = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Opened(pb::SessionOpened {
                session_id: session.0,
                secret: secret.to_be_bytes().to_vec(),
                ttl_ms: ttl,
            })),
        };
        self.output.streams.push(stream, &tx, opened);
        self.attach(session, stream, tx, ended);
        tracing::debug!(%session, client = %info.name, host = %info.host, ttl, "session opened");
    }

    fn resume(
        &mut self,
        now: Millis,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
        session: SessionId,
        secret: u128,
    ) {
        let valid = !self.shutting_down
            && self
                .sessions
                .get(&session)
                .is_some_and(|e| e.secret == secret);
        if !valid {
            self.output
                .streams
                .end(stream, &tx, unknown_session(session));
            return ended.cancel();
        }
        let entry = self.sessions.get_mut(&session).expect("checked");
        if let Some(old) = entry.attached.take() {
            self.streams.remove(&old.stream);
            let status = Status::aborted("session resumed on another stream");
            self.output.streams.end(old.stream, &old.tx, status);
            old.ended.cancel();
        }
        let resumed = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Resumed(pb::SessionResumed {
                session_id: session.0,
                ttl_ms: entry.ttl,
            })),
        };
        self.output.streams.push(stream, &tx, resumed);
        for notice in entry.lost.values() {
            self.output
                .streams
                .push(stream, &tx, convert::lost_to_proto(notice));
        }
        let mut effects = Vec::new();
        let _ = self
            .engine
            .apply(now, Command::Heartbeat { session }, &mut effects);
        self.attach(session, stream, tx, ended);
        tracing::debug!(%session, "session resumed");
    }

    fn attach(
        &mut self,
        session: SessionId,
        stream: StreamId,
        tx: StreamTx,
        ended: CancellationToken,
    ) {
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.attached = Some(Attached { stream, tx, ended });
            self.streams.insert(stream, session);
        }
    }

    fn stream_op(&mut self, now: Millis, session: SessionId, op: StreamOp) {
        let cached = |core: &Core, id: u64| {
            core.sessions
                .get(&session)
                .and_then(|e| e.replies.get(&id))
                .cloned()
        };
        match op {
            StreamOp::AckOnly => {}
            StreamOp::Heartbeat => {
                let mut effects = Vec::new();
                match self
                    .engine
                    .apply(now, Command::Heartbeat { session }, &mut effects)
                {
                    Ok(()) => self.send_to(
                        session,
                        pb::ServerMessage {
                            kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
                                now_ms: now,
                            })),
                        },
                    ),
                    Err(_) => self.end_session(session, "expired"),
                }
            }
            StreamOp::Acquire { id, args } => {
                if let Some(outcome) = cached(self, id) {
                    return self.resend(session, id, &outcome);
                }
                self.notify_queued = args.notify_queued;
                let command = args.into_command(session, id, now);
                let result = self.execute(now, command, None, None);
                self.notify_queued = false;
                match result {
                    Ok(()) => {}
                    // The same request is still queued: a retry after a resume.
                    Err(EngineError::DuplicateRequest(_)) => {}
                    Err(error) => {
                        self.send_error(session, id, convert::engine_error_to_proto(&error))
                    }
                }
            }
            StreamOp::Release { id, hold } => {
                if let Some(outcome) = cached(self, id) {
                    return self.resend(session, id, &outcome);
                }
                let command = Command::Release {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                };
                if let Err(error) = self.execute(now, command, None, Some(id)) {
                    self.send_error(session, id, convert::engine_error_to_proto(&error));
                }
            }
            StreamOp::Renew { id, hold, lease } => {
                if let Some(outcome) = cached(self, id) {
                    return self.resend(session, id, &outcome);
                }
                let command = Command::Renew {
                    session,
                    owner: hold.owner,
                    name: hold.name,
                    token: hold.token,
                    lease,
                };
                if let Err(error) = self.execute(now, command, None, Some(id)) {
                    self.send_error(session, id, convert::engine_error_to_proto(&error));
                }
            }
            StreamOp::Cancel { id } => {
                if let Some(outcome) = cached(self, id) {
                    return self.resend(session, id, &outcome);
                }
                let cancel = Command::Cancel {
                    session,
                    request: RequestId(id),
                };
                if self.execute(now, cancel, None, Some(id)).is_err() {
                    // Nothing waits under that id (the acquire never arrived):
                    // cancelled all the same.
                    self.reply(session, id, Outcome::Cancelled);
                }
            }
            StreamOp::Close => {
                let _ = self.execute(now, Command::CloseSession { session }, None, None);
            }
            StreamOp::Invalid { id, error } => self.send_error(session, id, error),
        }
    }

    fn resend(&mut self, session: SessionId, id: u64, outcome: &Outcome) {
        let message = convert::reply(id, convert::outcome_to_proto(outcome));
        self.send_to(session, message);
    }
}

/// Writes and fsyncs the buffered records (if any), counting it in `stats`;
/// returns how long it took.
fn commit(log: &mut Log, stats: &Stats) -> std::io::Result<Duration> {
    let (records, count) = log.buffer.take();
    if records.is_empty() {
        return Ok(Duration::ZERO);
    }
    let started = Instant::now();
    log.storage.commit(&records)?;
    let elapsed = started.elapsed();
    stats
        .commit_nanos
        .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    stats.records.fetch_add(count, Ordering::Relaxed);
    log.buffer.give_back(records);
    Ok(elapsed)
}

fn unknown_session(session: SessionId) -> Status {
    Status::not_found(format!(
        "unknown session {}: it expired, was closed, or never existed",
        session.0
    ))
}
