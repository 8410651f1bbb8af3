//! The one owner of the lock state on a member: a loop fed by a channel,
//! with group commit, holding two parts that meet in one narrow place.
//!
//! - [`Replicated`] (module `replicated`): the replicated state machine.
//!   The engine, the session table with secrets and kept replies, and the
//!   counters, changed only by [`Replicated::apply`], one committed record
//!   at a time, in log order, on every member alike and on replay; it
//!   returns what clients are to hear as [`Notice`]s.
//! - [`FrontEnd`] (module `front`): what only this member knows. Session
//!   streams, waiting unary calls, the backlog, the batch being built, the
//!   routes of the batches in flight, the clock, the role. It reads the
//!   state to decide what to propose and sends the notices of what was
//!   applied where its routes say; it never changes the state.
//!
//! Module `member_data` replays a stopped member's data directory through
//! the same replicated state, offline, for a backup made from it.
//!
//! # The loop
//!
//! The core sleeps until an [`Input`] arrives or the next deadline
//! passes (the engine's, [`locksmith_core::Engine::next_deadline`], or a
//! session's check on the leader). Then:
//!
//! 1. it takes everything waiting in the channel: Raft's events at once
//!    (committed entries to apply, snapshots, role changes), client ops
//!    into the front end's backlog. The heartbeats among them are answered
//!    at once under the leader's lease, without a log write (module
//!    `front::liveness`), or else go into the next batch at once, so that
//!    no session expires while its heartbeat is queued, however long the
//!    backlog;
//! 2. while fewer than `max_batches_in_flight` batches are in flight, the
//!    front end reads the clock once (`now`, see [`crate::clock::Clock`]) and
//!    **proposes** the next batch (module `front::propose`): the backlog's
//!    ops in order, up to `max_batch` units of work (a message, or a
//!    session's end by the holds and waits it releases:
//!    [`locksmith_core::Engine::work_of`]), each turned into log records
//!    (what the client asked, stamped with `now`) and a local [`Route`]
//!    (where its result goes), then the time-driven commands that are due
//!    (session expiries the front end decides, and
//!    [`locksmith_core::Engine::due`]: lease expiries, waiter timeouts,
//!    ends of lock-delay), up to `max_batch` units of work
//!    too, after the client ops so that a renew in the same batch wins.
//!    Nothing changes state yet. The records go to openraft as **one log
//!    entry**, one append and one `fdatasync` on a quorum (module
//!    `front::replica`): the group commit, since every request that arrived
//!    meanwhile shares it. A big expiry (a session of many holds) goes in an
//!    entry of its own after the client ops', so that their replies do not
//!    wait for it;
//! 3. when openraft has committed an entry, its state machine hands it to
//!    the core ([`RaftEvent::Apply`], on every member alike), and the core
//!    **applies** its records in order, each through [`Replicated::apply`]:
//!    the request-id check, the engine command, what the state keeps beside
//!    the engine (kept replies, lost notices, the session table). The
//!    notices go to the front end with the record's route: the routes the
//!    leader kept for its own batch (matched by the stint and sequence
//!    number the entry carries), [`Route::Nobody`] for any other. Then the
//!    batch's inspection ops are answered from the state this leaves;
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
//! The core runs as a task beside openraft's ([`crate::Execution`]), so
//! that a request crosses no thread between them. No step of it may hold
//! up Raft's heartbeats for long: a batch has a work budget, a big
//! session's end goes in steps, and the steps that cannot be bounded
//! (installing a leader's snapshot, applying a long run of entries at
//! once) run through `blocking::run`, which first hands the worker's other
//! tasks to another thread.
//!
//! # Sessions and their secrets
//!
//! The engine knows sessions (TTL, holds, waiters); the replicated state
//! keeps the rest, rebuilt from the same log: the **secret** a client needs
//! to resume a session (random, generated at open and logged in the
//! `OpenSession` record, so it survives restarts), and the **final replies
//! and lost notices not yet acknowledged** by the client. The front end
//! keeps which stream a session is attached to. A client that reconnects
//! resumes its session with id + secret and sends its unanswered requests
//! again with the same ids; a request that already ran is answered from the
//! kept reply (the Raft dissertation's client-session rule, §6.3), so
//! nothing runs twice and no grant is lost in a dropped connection. Replay
//! rebuilds the kept replies too: grants and timeouts come out of the
//! replayed effects, and release/renew/cancel records carry the request id.
mod front;
mod member_data;
mod replicated;

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith_core::Millis;
use openraft::type_config::alias::{EntryOf, SnapshotMetaOf, StoredMembershipOf};
use openraft::EntryPayload;
use tokio::sync::oneshot;
use tonic::Status;

use crate::clock::WallClock;
use crate::config::ServerConfig;
use crate::entry::{Applied, Batch, Record, TypeConfig};
use crate::history::{History, HistoryLimits};
use crate::inbox::{CoreSender, Inbox, Input, RaftEvent, TaskInbox};
use crate::metrics::Metrics;
use crate::op::Op;
use crate::raft::versions::Versions;
use crate::raft::Raft;
use crate::stats::Stats;
use crate::storage::member::TokenCeiling;
use crate::storage::{FrozenState, ServerSnapshot};
pub(crate) use front::{heartbeat_lease, Replica};
use front::{FrontEnd, Proposal, Route};
use replicated::{Notice, Replicated};

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Why the loop stops.
enum Stop {
    /// Asked to: the answer goes here.
    Shutdown(oneshot::Sender<Result<(), String>>),
    /// Storage failed: the member must not go on.
    Failed(String),
}

/// The replicated state and the front end, owned by one thread.
pub(crate) struct Core {
    /// What every member agrees on.
    state: Replicated,
    /// What only this member knows of its clients.
    front: FrontEnd,
    /// The notices of the record being applied (a buffer reused).
    notices: Vec<Notice>,
    /// Inputs received and not looked at yet (see `take_arrivals`).
    arrived: Vec<Input>,
    stats: Arc<Stats>,
    metrics: Option<Arc<Metrics>>,
    /// The durable token ceiling, raised before a reply carries a token
    /// above it.
    tokens: Option<TokenCeiling>,
    /// Where the cluster's record version is published for the leader's
    /// gate and `cluster status`.
    versions: Option<Arc<Versions>>,
}

/// Entries handed over at once are applied through `blocking::run` when
/// there are more than this many (a member catching up, or replaying its
/// log after a restart); a leader's pipeline hands over a few at a time
/// (`ServerConfig::max_batches_in_flight`).
const LONG_APPLY_ENTRIES: usize = 64;

/// Entries are applied through `blocking::run` as well when their engine
/// commands are more than this much work (`Engine::work_of`: a big
/// session's end, or its steps of 1 024 holds each), which takes from
/// milliseconds to a few hundred on a busy machine; handing the worker's
/// tasks over costs one thread's wake-up, off the request's path.
const LONG_APPLY_WORK: usize = 1024;

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
        let stats = Arc::<Stats>::default();
        Core {
            state: replicated_state(config),
            front: FrontEnd::new(config, replica, stats.clone()),
            notices: Vec::new(),
            arrived: Vec::new(),
            stats,
            metrics: None,
            tokens,
            versions: None,
        }
    }

    /// The loop's counters.
    pub(crate) fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Reads the wall clock from `wall` from now on (a simulation's).
    pub(crate) fn use_wall_clock(&mut self, wall: WallClock) {
        self.front.use_wall_clock(wall);
    }

    /// Counts what the core does from now on in `metrics`.
    pub(crate) fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.state.count_in(metrics.clone());
        self.front.count_in(metrics.clone());
        self.metrics = Some(metrics);
    }

    /// Why this member cannot follow its cluster: the cluster agreed on log
    /// records newer than it reads (module `replicated::versions`).
    pub(crate) fn needs_upgrade(&self) -> Option<String> {
        let version = self.state.needs_upgrade()?;
        Some(format!(
            "every member of the cluster read log records of version {version}, and they may \
             be written now, but this member reads versions up to {}: upgrade this member",
            self.state.reads_up_to()
        ))
    }

    /// Publishes the cluster's record version in `versions` from now on.
    pub(crate) fn publish_versions(&mut self, versions: Arc<Versions>) {
        versions.set_cluster(self.state.cluster_version());
        self.versions = Some(versions);
    }

    /// After a forced recovery: every fencing token from now on is above
    /// `floor`.
    pub(crate) fn raise_token_floor(&mut self, floor: u64) {
        self.state.raise_token_floor(floor);
    }

    /// The counter of sessionless request ids, for the service.
    pub(crate) fn unary_ids(&self) -> Arc<AtomicU64> {
        self.front.unary_ids()
    }

    /// Connects the core to openraft, once started, before its thread runs;
    /// `ops` is the core's own channel, for batches openraft refuses.
    pub(crate) fn connect_raft(&mut self, raft: Raft, ops: CoreSender) {
        self.front.connect_raft(raft, ops);
    }

    /// Runs the loop until shutdown or until every sender is gone, on the
    /// calling thread (the core's own, [`crate::Execution::Threads`]).
    pub(crate) fn run(mut self, ops: Receiver<Input>) -> Result<(), String> {
        let mut batch = Vec::new();
        loop {
            if self.is_idle() {
                let first = match self.front.next_deadline(&self.state) {
                    Some(deadline) => {
                        let wait = deadline
                            .into_std()
                            .saturating_duration_since(std::time::Instant::now());
                        match ops.recv_timeout(wait) {
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
            if let Some(stopped) = self.step(&ops, &mut batch) {
                return stopped;
            }
        }
    }

    /// The same loop as [`Core::run`], as a task of the runtime it is
    /// spawned on (the default, [`crate::Execution::Tasks`]): it waits on
    /// the runtime's clock and
    /// yields after every step.
    ///
    /// Cancel safety: dropped, the core stops where it is, as if its
    /// process died: its streams and waiting callers see their channels
    /// close, nothing is half-applied (each step runs without an await).
    pub(crate) async fn run_as_task(mut self, mut ops: TaskInbox) -> Result<(), String> {
        let mut batch = Vec::new();
        loop {
            if self.is_idle() {
                let deadline = self.front.next_deadline(&self.state);
                let first = tokio::select! {
                    biased;
                    input = ops.recv() => match input {
                        Some(input) => Some(input),
                        None => return self.shut_down(),
                    },
                    () = sleep_until(deadline) => None,
                };
                self.arrived.extend(first);
            }
            if let Some(stopped) = self.step(&mut ops, &mut batch) {
                return stopped;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Nothing arrived and nothing to propose: the loop may wait.
    fn is_idle(&self) -> bool {
        self.arrived.is_empty() && !self.front.has_work()
    }

    /// One turn of the loop, once something arrived or a deadline passed:
    /// takes what waits, proposes the next batch if it may, sends the
    /// output. Returns the loop's result once it must stop.
    fn step(&mut self, ops: impl Inbox, batch: &mut Vec<Op>) -> Option<Result<(), String>> {
        let batch_started = Instant::now();
        let now = self.front.now();
        self.front.resume_after_refusal(now);
        match self.take_arrivals(ops, now) {
            None => {}
            Some(Stop::Shutdown(done)) => {
                let result = self.shut_down();
                let _ = done.send(result.clone());
                return Some(result);
            }
            Some(Stop::Failed(message)) => {
                let _ = self.shut_down();
                return Some(Err(message));
            }
        }
        if self.front.replica.can_propose() {
            self.front
                .propose_next(&self.state, now, batch, batch_started);
            self.front.send_output();
        }
        None
    }

    /// Takes everything waiting in the channel: Raft's events (entries to
    /// apply, snapshots, role changes) are handled at once, client ops go to
    /// the front end ([`FrontEnd::arrive`]). Returns why the loop must stop,
    /// if it must.
    fn take_arrivals(&mut self, mut ops: impl Inbox, now: Millis) -> Option<Stop> {
        ops.take_waiting(&mut self.arrived);
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
                Input::Client(op) => self.front.arrive(&self.state, now, op),
            }
        }
        self.arrived = arrived;
        self.front.send_output();
        shutdown
    }

    /// Handles what Raft tells the core, as it arrives, whatever the role.
    fn handle_raft_event(&mut self, event: RaftEvent) -> Result<(), Stop> {
        match event {
            RaftEvent::Apply {
                entries,
                responders,
            } => {
                if entries.len() > LONG_APPLY_ENTRIES || self.work_of(&entries) > LONG_APPLY_WORK {
                    crate::blocking::run(|| self.apply_entries(entries));
                } else {
                    self.apply_entries(entries);
                }
                self.finish_apply()?;
                for responder in responders {
                    responder.send(());
                }
            }
            RaftEvent::Snapshot { reply } => {
                let _ = reply.send(self.freeze());
            }
            RaftEvent::Install { meta, data, done } => {
                let _ = done.send(crate::blocking::run(|| self.install_snapshot(meta, data)));
            }
            RaftEvent::Role(role) => self.front.change_role(&self.state, role),
            RaftEvent::Refused {
                origin,
                seq,
                reason,
            } => self.front.refused(origin, seq, &reason),
        }
        Ok(())
    }

    /// How much work applying `entries`' engine commands is
    /// (`Engine::work_of`, summed).
    fn work_of(&self, entries: &[EntryOf<TypeConfig>]) -> usize {
        let engine = self.state.engine();
        let commands = entries.iter().flat_map(|entry| match &entry.payload {
            EntryPayload::Normal(batch) => batch.records.as_slice(),
            _ => &[],
        });
        commands
            .filter_map(|record| match record {
                Record::Command(record) => Some(engine.work_of(&record.command)),
                _ => None,
            })
            .sum()
    }

    /// Applies committed entries, in log order (openraft's state machine
    /// hands them over).
    pub(crate) fn apply_entries(&mut self, entries: Vec<EntryOf<TypeConfig>>) {
        for entry in entries {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => self.apply_batch(batch),
                EntryPayload::Membership(membership) => {
                    let stored =
                        StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), membership);
                    self.state.set_membership(stored);
                }
            }
            self.state.applied_through(entry.log_id);
        }
    }

    /// Applies a committed batch: this member's own with the routes it kept
    /// for it, any other with nobody to tell.
    fn apply_batch(&mut self, batch: Batch) {
        let started = Instant::now();
        let count = batch.records.len();
        let first = batch.records.first().map(Record::kind);
        match self.front.take_own(batch.origin, batch.seq) {
            Some(mut in_flight) => {
                self.front.committed(&in_flight);
                let now = self.front.now();
                self.apply_proposal(now, &mut in_flight.proposal, &batch.records);
                self.front.own_applied(&self.state, in_flight);
            }
            None => {
                for record in batch.records.iter() {
                    self.apply_record(record, Route::Nobody);
                }
            }
        }
        warn_if_slow(started, count, first);
    }

    /// Applies `records`, the committed records of `proposal`, in order,
    /// each with its route, then answers its inspection ops from the state
    /// they leave.
    fn apply_proposal(&mut self, now: Millis, proposal: &mut Proposal, records: &[Record]) {
        let mut refused = proposal.refused.drain(..).peekable();
        let mut routes = proposal.routes.drain(..);
        for (at, record) in records.iter().enumerate() {
            while let Some((_, session, id, error)) = refused.next_if(|r| r.0 == at) {
                self.front.send_error(session, id, error);
            }
            let route = routes.next().unwrap_or(Route::Nobody);
            self.apply_record(record, route);
        }
        for (_, session, id, error) in refused {
            self.front.send_error(session, id, error);
        }
        for read in proposal.reads.drain(..) {
            self.front.read(&self.state, now, read);
        }
        proposal.opens = 0;
    }

    /// The one apply path of a record: the state applies it, the front end
    /// sends what it says where `route` goes.
    fn apply_record(&mut self, record: &Record, route: Route) {
        self.front.before_apply(&self.state, &route);
        let result = self.state.apply(record, &mut self.notices);
        self.front
            .deliver(&self.state, route, result, &mut self.notices);
    }

    /// After applying entries: the token ceiling, the gauges, then the
    /// replies. If the ceiling cannot be written, nothing of the entries is
    /// told to anyone and the core must stop.
    fn finish_apply(&mut self) -> Result<(), Stop> {
        if let Some(message) = self.needs_upgrade() {
            self.front.drop_output();
            tracing::error!(%message, "stopping");
            return Err(Stop::Failed(message));
        }
        if let Some(versions) = &self.versions {
            versions.set_cluster(self.state.cluster_version());
        }
        let last_token = self.state.engine().last_token();
        if let Some(tokens) = &mut self.tokens {
            if let Err(error) = tokens.cover(last_token) {
                self.front.drop_output();
                let message = format!("cannot write the token ceiling: {error}");
                tracing::error!(%message, "stopping");
                return Err(Stop::Failed(message));
            }
        }
        if let Some(metrics) = &self.metrics {
            // Before the replies leave: a client that saw one scrapes
            // gauges at least as new.
            metrics.table_now(self.state.history().census(), last_token);
        }
        self.front.send_output();
        Ok(())
    }

    /// The applied state, frozen for a snapshot built off this thread (the
    /// engine's locks are shared copy-on-write; see [`FrozenState`]).
    pub(crate) fn freeze(&self) -> FrozenState {
        let started = Instant::now();
        let mut frozen = self.state.freeze();
        if let Some(tokens) = &self.tokens {
            frozen.token_ceiling = frozen.token_ceiling.max(tokens.ceiling());
        }
        tracing::debug!(
            sessions = frozen.sessions.len(),
            elapsed = ?started.elapsed(),
            "state frozen for a snapshot"
        );
        frozen
    }

    /// Replaces the state with a snapshot (the leader's, or the member's own
    /// at start); the streams attached here end (their clients resume).
    pub(crate) fn install_snapshot(
        &mut self,
        meta: SnapshotMetaOf<TypeConfig>,
        data: Vec<u8>,
    ) -> Result<(), String> {
        let snapshot = ServerSnapshot::decode(&data)?;
        let applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership,
        };
        // Refused before anything changes.
        self.state.install(snapshot, applied)?;
        self.front.forget_links();
        Ok(())
    }

    /// Ends every stream and every wait: nothing in flight will be applied.
    fn shut_down(&mut self) -> Result<(), String> {
        self.front.shutting_down = true;
        let status = Status::unavailable("lock server is shutting down");
        self.front.abandon_all(&status);
        self.front.send_output();
        tracing::info!(
            last_token = self.state.engine().last_token(),
            "lock engine stopped"
        );
        Ok(())
    }
}

/// An empty replicated state as `config` bounds it.
pub(crate) fn replicated_state(config: &ServerConfig) -> Replicated {
    let history = History::new(HistoryLimits {
        per_lock: config.history_per_lock,
        total: config.history_total,
        max_age: config.history_max_age.as_millis() as Millis,
    });
    Replicated::new(
        config.limits.clone(),
        config.max_unacked_replies,
        history,
        config.record_version,
    )
}

/// How long applying one log entry may take before the log says so.
const SLOW_APPLY: Duration = Duration::from_millis(100);

/// Applying an entry holds up every request on this member, so one that took
/// long is worth a warning (as etcd's "apply request took too long"): it
/// is most often a big session ending (`Engine::work_of`).
/// `first` names the entry's first record, which tells what it was.
fn warn_if_slow(started: Instant, records: usize, first: Option<&'static str>) {
    let took = started.elapsed();
    if took >= SLOW_APPLY {
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            records,
            first = first.unwrap_or("none"),
            "applying one log entry took long: every request on this member waited for it"
        );
    }
}

#[cfg(test)]
impl crate::raft::state_machine::CoreMachine {
    /// A machine over a core of its own, on its own thread, that proposes
    /// nothing (for tests of the storage and the Raft layer).
    pub(crate) fn for_tests() -> Self {
        let (ops, receiver) = CoreSender::channel();
        let (proposer, _) = crate::raft::propose::Proposer::new();
        let (serving, _) = tokio::sync::watch::channel(false);
        let replica = Replica::new(proposer, serving, 1);
        let core = Core::new(&ServerConfig::in_memory(), replica, None);
        std::thread::spawn(move || core.run(receiver));
        Self::new(ops, None, None, Default::default())
    }
}

#[cfg(test)]
mod tests {
    use locksmith_core::{ClientInfo, Command, SessionId};

    use locksmith_proto::v1 as pb;

    use std::sync::Arc;
    use std::time::Duration;

    use super::front::WORK_THAT_RIDES_ALONG;
    use super::*;
    use crate::entry::ENTRY_BYTES;
    use crate::inbox::CoreSender;
    use crate::op::{Acks, AcquireArgs, NewStream, Op, StreamId, StreamOp, WaitArg};
    use crate::pulse::Pulse;

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
        let mut proposal = std::mem::take(&mut core.front.proposal);
        core.front.propose(&core.state, now, op, &mut proposal);
        let records = std::mem::take(&mut proposal.records);
        core.apply_proposal(now, &mut proposal, &records);
        core.front.drop_output();
        records
    }

    /// A new stream `stream`, whose client reads nothing.
    fn new_stream(stream: StreamId) -> NewStream {
        let (tx, _) = crate::stream_queue::stream_queue(usize::MAX);
        NewStream {
            id: stream,
            tx,
            peer: None,
            pulse: Default::default(),
        }
    }

    /// Opens a session (TTL 1 s) on stream `stream` at `now`.
    fn open(core: &mut Core, stream: StreamId, now: Millis) -> (SessionId, Vec<Record>) {
        let open = Op::Open {
            stream: new_stream(stream),
            info: ClientInfo::default(),
            ttl: 1_000,
        };
        let records = run(core, now, open);
        (core.front.session_of(stream).expect("opened"), records)
    }

    /// Makes `core` a leader that serves (stint 1), as if its grace entry
    /// had been applied.
    fn lead(core: &mut Core) {
        core.front.replica.role = front::Leadership::Leader {
            stint: 1,
            ready: true,
        };
        core.front.time_sessions(&core.state);
    }

    /// A core that leads (stint 1) with a session open on stream 1.
    fn leading_with_a_session() -> (Core, Millis, SessionId) {
        let mut core = core(4096);
        let now = core.front.now();
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
        core.state
            .engine()
            .describe(name)
            .map_or(0, |l| l.holders.len())
    }

    #[test]
    fn applying_the_log_again_decides_a_request_id_reused_after_its_ack_as_the_first_run_did() {
        let mut core = core(4096);
        let now = core.front.now();
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
            replica.apply_record(&record, Route::Nobody);
        }
        assert!(replica.state.session(session).is_some());
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
        let mut proposal = std::mem::take(&mut core.front.proposal);
        for command in core.front.due(&core.state, late) {
            proposal.command(late, command, None, None, Route::Nobody);
        }
        let first = proposal.records.first().cloned();
        assert!(
            matches!(&first, Some(Record::Command(r)) if r.command == Command::Heartbeat { session }),
            "{first:?}"
        );
        let records = std::mem::take(&mut proposal.records);
        core.apply_proposal(late, &mut proposal, &records);
        assert!(
            core.state.engine().has_session(session),
            "the expiry is void"
        );
    }

    #[test]
    fn a_heartbeat_that_arrives_while_a_batch_is_in_flight_is_proposed_next() {
        let (mut core, now, session) = leading_with_a_session();
        // A batch goes out (proposed, not applied yet)...
        let mut proposal = std::mem::take(&mut core.front.proposal);
        let release = client_batch(
            1,
            [StreamOp::Release {
                id: 1,
                hold: hold_args("in-flight"),
            }],
        );
        core.front.propose(&core.state, now, release, &mut proposal);
        let records = proposal.records.clone();
        core.front.propose_batch(proposal, false);
        // ...a heartbeat arrives meanwhile...
        let (ops, arrivals) = CoreSender::channel();
        ops.send(client_batch(1, [StreamOp::Heartbeat])).unwrap();
        assert!(core.take_arrivals(&arrivals, now + 10).is_none());
        // ...and the batch is applied: the heartbeat waits for the next one.
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 0,
            records: records.into(),
        });
        let next = core.front.proposal.records.first().cloned();
        assert!(
            matches!(&next, Some(Record::Command(r)) if r.command == Command::Heartbeat { session }),
            "the heartbeat was dropped: {next:?}"
        );
    }

    /// Heartbeats answered on stream 1 so far.
    fn heartbeat_answers(core: &Core) -> usize {
        core.front
            .output
            .streams
            .messages(1)
            .iter()
            .filter(|m| matches!(m.kind, Some(pb::server_message::Kind::Heartbeat(_))))
            .count()
    }

    #[test]
    fn under_the_lease_a_live_session_is_answered_at_once_without_a_record() {
        let (mut core, now, session) = leading_with_a_session();
        core.front.replica.lease_in_tests(true);
        let heartbeats = client_batch(1, [StreamOp::Heartbeat, StreamOp::Heartbeat]);
        core.front.arrive(&core.state, now + 900, heartbeats);
        assert!(core.front.proposal.records.is_empty(), "nothing to log");
        assert_eq!(heartbeat_answers(&core), 2, "answered at once, each");
        // Heard at 900 with a TTL of 1 s: not due at 1 500, due at 1 900.
        let late = now + 1_500;
        assert!(core.front.due(&core.state, late).is_empty());
        assert_eq!(
            core.front.due(&core.state, now + 1_900),
            [Command::ExpireSession {
                session,
                deadline: now + 1_900
            }]
        );
    }

    /// A core that leads under its lease with a session open on stream 1,
    /// whose reader answers with the pulse returned; the core has answered
    /// one heartbeat of it at the time returned (so the pulse is open).
    fn leading_with_a_pulse() -> (Core, Millis, SessionId, Arc<Pulse>) {
        let mut core = core(4096);
        let now = core.front.now();
        let pulse = Arc::<Pulse>::default();
        let open = Op::Open {
            stream: NewStream {
                pulse: pulse.clone(),
                ..new_stream(1)
            },
            info: ClientInfo::default(),
            ttl: 1_000,
        };
        run(&mut core, now, open);
        let session = core.front.session_of(1).expect("opened");
        lead(&mut core);
        core.front.replica.lease_in_tests(true);
        assert_eq!(pulse.answer(), None, "not before the core has answered");
        core.front
            .arrive(&core.state, now, client_batch(1, [StreamOp::Heartbeat]));
        assert_eq!(heartbeat_answers(&core), 1);
        (core, now, session, pulse)
    }

    #[tokio::test(start_paused = true)]
    async fn the_reader_answers_once_the_core_has_and_no_more_once_an_expiry_is_decided() {
        let (mut core, now, session, pulse) = leading_with_a_pulse();

        // The reader answers at 900: the session lives to 1 900, not 1 000.
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(pulse.answer(), Some(now + 900));
        assert!(core.front.due(&core.state, now + 1_500).is_empty());

        // At 1 500 on the readers' clock, the core (its step started later,
        // say) decides the expiry at 1 900: from then on no reader answers,
        // though the deadline has not passed on its clock.
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(
            core.front.due(&core.state, now + 1_900),
            [Command::ExpireSession {
                session,
                deadline: now + 1_900
            }]
        );
        assert_eq!(pulse.answer(), None, "the core decides from here on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_on_another_stream_keeps_what_the_old_reader_heard_and_silences_it() {
        let (mut core, now, session, old) = leading_with_a_pulse();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(old.answer(), Some(now + 900));

        let new = Arc::<Pulse>::default();
        let secret = core.state.session(session).expect("open").secret;
        let resume = Op::Resume {
            stream: NewStream {
                pulse: new.clone(),
                ..new_stream(2)
            },
            session,
            secret,
        };
        let mut proposal = Proposal::default();
        core.front
            .propose(&core.state, now + 900, resume, &mut proposal);
        assert_eq!(core.front.session_of(2), Some(session));
        assert_eq!(old.answer(), None, "the replaced stream's reader is silent");
        assert_eq!(new.answer(), None, "the new one waits for the core");
        assert!(
            core.front.due(&core.state, now + 1_500).is_empty(),
            "heard at 900 still"
        );
    }

    #[test]
    fn without_the_lease_or_past_its_deadline_a_heartbeat_goes_through_the_log() {
        let (mut core, now, session) = leading_with_a_session();
        let logged = |core: &Core| {
            core.front
                .proposal
                .records
                .iter()
                .filter(|r| matches!(r, Record::Command(r) if r.command == Command::Heartbeat { session }))
                .count()
        };
        // No lease (cut off from the quorum, say): logged, so that only a
        // quorum can answer it.
        let heartbeat = || client_batch(1, [StreamOp::Heartbeat]);
        core.front.arrive(&core.state, now + 100, heartbeat());
        assert_eq!(logged(&core), 1);
        assert_eq!(heartbeat_answers(&core), 0, "not answered before applied");
        // Under the lease, past the session's deadline (its expiry may be
        // on its way): logged too, ordered against the expiry by the log.
        core.front.replica.lease_in_tests(true);
        core.front.arrive(&core.state, now + 1_000, heartbeat());
        assert_eq!(logged(&core), 2);
        assert_eq!(heartbeat_answers(&core), 0);
    }

    #[test]
    fn a_cut_off_leader_sends_a_resume_elsewhere_until_a_quorum_hears_it() {
        let (mut core, now, session) = leading_with_a_session();
        let secret = core.state.session(session).expect("open").secret;
        let resume = |core: &mut Core, stream| {
            let op = Op::Resume {
                stream: new_stream(stream),
                session,
                secret,
            };
            let mut proposal = Proposal::default();
            core.front.propose(&core.state, now, op, &mut proposal);
        };
        // No lease in openraft's metrics (they lag a new leader's), nothing
        // refused: resumed.
        resume(&mut core, 2);
        assert_eq!(core.front.session_of(2), Some(session));

        // openraft refuses a batch: the leader is cut off, and a resume is
        // sent elsewhere, marked for how long an election may take.
        propose_now(&mut core, now, client_batch(2, [acquire(1, "x")]));
        core.front.refused(1, 0, "has to forward request to: None");
        resume(&mut core, 3);
        let status = core.front.output.streams.end_of(3).expect("refused");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let mark = status.metadata().get(locksmith_proto::CUT_OFF_METADATA);
        assert_eq!(
            mark.and_then(|m| m.to_str().ok()),
            Some("400"),
            "marked cut off, for the longest election timeout"
        );
        assert_eq!(core.front.session_of(3), None, "not resumed");

        // Its lease back: resumed.
        core.front.replica.lease_in_tests(true);
        resume(&mut core, 4);
        assert_eq!(core.front.session_of(4), Some(session));

        // A batch of its committed (a quorum heard it), the lease not
        // showing yet: resumed too.
        core.front.replica.lease_in_tests(false);
        core.front
            .resume_after_refusal(core.front.now() + front::REFUSAL_PAUSE);
        propose_now(&mut core, now, client_batch(4, [acquire(2, "y")]));
        let records = core
            .front
            .replica
            .records_in_flight()
            .pop()
            .expect("proposed");
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 1,
            records: records.into(),
        });
        resume(&mut core, 5);
        assert_eq!(core.front.session_of(5), Some(session));
    }

    #[test]
    fn every_heartbeat_read_together_is_answered() {
        let (mut core, now, _) = leading_with_a_session();
        let (ops, arrivals) = CoreSender::channel();
        // The server read the stream late: two heartbeats in one batch.
        ops.send(client_batch(1, [StreamOp::Heartbeat, StreamOp::Heartbeat]))
            .unwrap();
        assert!(core.take_arrivals(&arrivals, now).is_none());
        let mut proposal = std::mem::take(&mut core.front.proposal);
        let records = std::mem::take(&mut proposal.records);
        core.apply_proposal(now, &mut proposal, &records);
        let answers = core
            .front
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
        let mut proposal = std::mem::take(&mut core.front.proposal);
        core.front.propose(&core.state, now, op, &mut proposal);
        let records = proposal.records.clone();
        core.front.propose_batch(proposal, false);
        records
    }

    #[test]
    fn a_refused_grace_is_proposed_again_after_the_pause_and_not_after_stepping_down() {
        let mut core = core(4096);
        let leader = crate::inbox::Role::Leader { address: None };
        core.front.change_role(&core.state, leader);
        let front::Leadership::Leader { stint, .. } = core.front.replica.role else {
            panic!("leads");
        };
        assert_eq!(core.front.replica.records_in_flight().len(), 1, "the grace");
        // openraft refuses while its role changes: proposing again at once
        // would be refused at once, over and over.
        core.front
            .refused(stint, 0, "has to forward request to: None");
        assert!(core.front.replica.records_in_flight().is_empty());
        assert!(
            core.front.next_deadline(&core.state).is_some(),
            "the loop wakes for the retry"
        );
        core.front
            .resume_after_refusal(core.front.now() + front::REFUSAL_PAUSE);
        let again = core.front.replica.records_in_flight();
        assert_eq!(again.len(), 1);
        assert!(matches!(
            &again[0][..],
            [Record::Command(record)] if matches!(record.command, Command::GrantGrace { .. })
        ));
        // Refused again, and meanwhile another member won: no retry.
        core.front
            .refused(stint, 1, "has to forward request to: None");
        let follower = crate::inbox::Role::Follower { leader: None };
        core.front.change_role(&core.state, follower);
        assert!(core.front.next_deadline(&core.state).is_none());
        core.front
            .resume_after_refusal(core.front.now() + front::REFUSAL_PAUSE);
        assert!(core.front.replica.records_in_flight().is_empty());
    }

    #[test]
    fn after_a_refused_batch_a_serving_leader_proposes_nothing_until_the_pause_ends() {
        let (mut core, now, _) = leading_with_a_session();
        propose_now(&mut core, now, client_batch(1, [acquire(1, "x")]));
        // Refused while the election that openraft has started goes on:
        // the expiries and ops that come next would be refused at once too.
        core.front.refused(1, 0, "has to forward request to: None");
        assert!(!core.front.replica.can_propose());
        assert!(!core.front.has_work());
        assert!(core.front.next_deadline(&core.state).is_some());
        core.front
            .resume_after_refusal(core.front.now() + front::REFUSAL_PAUSE);
        assert!(core.front.replica.can_propose());
        assert!(
            core.front.replica.records_in_flight().is_empty(),
            "a serving leader proposes no grace again"
        );
    }

    #[test]
    fn batches_in_flight_are_applied_in_order_and_bounded() {
        let (mut core, now, _) = leading_with_a_session();
        // The second acquire of "x" is proposed while the first is in flight:
        // it queues behind it, as if the first had been applied already.
        let first = propose_now(&mut core, now, client_batch(1, [acquire(1, "x")]));
        assert!(
            core.front.replica.can_propose(),
            "a second batch may go out"
        );
        let second = propose_now(&mut core, now, client_batch(1, [acquire(2, "x")]));
        for seq in 2..core.front.replica.max_in_flight() as u64 {
            propose_now(&mut core, now, client_batch(1, [acquire(seq + 1, "y")]));
        }
        assert!(
            !core.front.replica.can_propose(),
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
            records: first.into(),
        });
        assert!(core.front.replica.can_propose());
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 1,
            records: second.into(),
        });
        let x = core.state.engine().describe("x").expect("x is held");
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
                records: records.into(),
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
        assert!(core.front.replica.records_in_flight().is_empty(), "matched");
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
        assert!(core.front.replica.can_expire());
        let mut proposal = std::mem::take(&mut core.front.proposal);
        for command in core.front.due(&core.state, late) {
            proposal.command(late, command, None, None, Route::Nobody);
        }
        let records = proposal.records.clone();
        assert!(!records.is_empty(), "the session is due");
        core.front.propose_batch(proposal, true);
        assert!(
            core.front.replica.can_propose(),
            "client ops may still go out"
        );
        assert!(!core.front.replica.can_expire(), "its expiry is in flight");
        core.apply_batch(crate::entry::Batch {
            origin: 1,
            seq: 0,
            records: records.into(),
        });
        assert!(!core.state.engine().has_session(session), "expired");
        assert!(core.front.replica.can_expire());
        assert!(core.front.due(&core.state, late).is_empty());
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
        let now = core.front.now();
        let sessions: Vec<SessionId> = (1..=3)
            .map(|stream| session_holding(&mut core, stream, now, 6))
            .collect();
        lead(&mut core);
        let late = now + 1_500;
        let mut open_after_each = Vec::new();
        for seq in 0..3 {
            core.front
                .propose_next(&core.state, late, &mut Vec::new(), Instant::now());
            let in_flight = core.front.replica.records_in_flight();
            assert_eq!(in_flight.len(), 1, "one batch of expiries at a time");
            assert_eq!(
                in_flight[0].len(),
                1,
                "one session's end (7 units of work) per batch of 10"
            );
            core.apply_batch(crate::entry::Batch {
                origin: 1,
                seq,
                records: in_flight[0].clone().into(),
            });
            let open = sessions
                .iter()
                .filter(|&&s| core.state.engine().has_session(s));
            open_after_each.push(open.count());
        }
        assert_eq!(open_after_each, [2, 1, 0]);
    }

    #[test]
    fn a_big_expiry_goes_in_an_entry_after_the_client_ops_and_a_small_one_rides_along() {
        for (holds, entries) in [(WORK_THAT_RIDES_ALONG - 1, 1), (WORK_THAT_RIDES_ALONG, 2)] {
            let mut core = core(4096);
            let now = core.front.now();
            let expiring = session_holding(&mut core, 1, now, holds as u64);
            let late = now + 1_500;
            open(&mut core, 2, late);
            lead(&mut core);
            core.front
                .backlog
                .push_back(client_batch(2, [acquire(1, "client")]));
            core.front
                .propose_next(&core.state, late, &mut Vec::new(), Instant::now());
            let in_flight = core.front.replica.records_in_flight();
            assert_eq!(in_flight.len(), entries, "{holds} holds");
            for (seq, records) in in_flight.into_iter().enumerate() {
                core.apply_batch(crate::entry::Batch {
                    origin: 1,
                    seq: seq as u64,
                    records: records.into(),
                });
                if seq == 0 {
                    assert_eq!(holders(&core, "client"), 1, "the client's op first");
                }
            }
            assert!(!core.state.engine().has_session(expiring));
        }
    }

    #[test]
    fn a_big_session_ends_over_several_entries_with_client_ops_between_them() {
        let mut config = ServerConfig::in_memory();
        config.limits.session_end_step = 4;
        let mut core = core_with(config);
        let now = core.front.now();
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
            core.front
                .backlog
                .push_back(client_batch(2, [acquire(seq + 1, &name)]));
            core.front
                .propose_next(&core.state, late, &mut Vec::new(), Instant::now());
            let in_flight = core.front.replica.records_in_flight();
            assert_eq!(in_flight.len(), 1, "a step of 4 rides along");
            core.apply_batch(crate::entry::Batch {
                origin: 1,
                seq,
                records: in_flight[0].clone().into(),
            });
            assert_eq!(holders(&core, &name), 1, "the client's op, every entry");
            after_each.push(held(&core));
        }
        assert!(!core.state.engine().has_session(expiring));
        // The expiry gives up nothing itself (10 holds > 4); then 4 an entry.
        assert_eq!(after_each, [10, 6, 2, 0]);
        assert!(core.front.due(&core.state, late).is_empty());
    }

    #[test]
    fn a_batch_counts_a_session_end_by_its_holds() {
        let mut core = core(10);
        let now = core.front.now();
        for stream in 1..=2 {
            session_holding(&mut core, stream, now, 6);
        }
        lead(&mut core);
        core.front
            .backlog
            .push_back(client_batch(1, [StreamOp::Close]));
        core.front
            .backlog
            .push_back(client_batch(2, [StreamOp::Close]));
        core.front
            .backlog
            .push_back(client_batch(2, [StreamOp::AckOnly, StreamOp::AckOnly]));
        let mut batch = Vec::new();
        let mut sizes = Vec::new();
        while !core.front.backlog.is_empty() {
            core.front.next_batch(&core.state, &mut batch);
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
        while !core.front.backlog.is_empty() {
            core.front.next_batch(&core.state, &mut batch);
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
            core.front.backlog.push_back(client_batch(1, [acquire(id)]));
        }
        let mut batch = Vec::new();
        let mut sizes = Vec::new();
        while !core.front.backlog.is_empty() {
            core.front.next_batch(&core.state, &mut batch);
            let bytes: usize = batch.iter().map(Op::entry_bytes).sum();
            assert!(bytes < ENTRY_BYTES + 33_000, "{bytes} bytes in one batch");
            sizes.push(batch.drain(..).count());
        }
        // 1 MiB is reached with the 33rd acquire, which still goes in.
        assert_eq!(sizes, [33, 33, 33, 1]);
    }
}
