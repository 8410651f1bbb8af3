//! `memory://[table]`: the lock engine in this process.
//!
//! Clients that connect to the same table name share one lock table; `memory://`
//! alone is the process-wide default table. A tokio task per table applies the
//! engine's time-driven commands (expiries, timeouts) when they fall due, on the
//! runtime that created the table, so tests under tokio's paused clock run
//! without real waiting. Each client has one engine session at a time, kept
//! alive by the keeper (module `keeper`), whose renewal is the engine's
//! heartbeat. When the engine ends a session the client did not close (it
//! expired while the process stalled), its holds are lost and the client
//! opens a new session for what it does next, as a client of any store does.
//!
//! # Fork
//!
//! A process forked from one that used `memory://` cannot join its parent's
//! tables: a thread of the parent that was inside a call on a table at the
//! fork held the table's lock, and the child, which has no such thread,
//! would wait for it for ever. [`crate::forget_process_state_after_fork`],
//! called in the child, makes its `memory://` URLs open new, empty tables.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use locksmith_core::{
    Acquire, ClientInfo, Command, Effect, Engine, EngineError, LostReason, Millis, RequestId,
    SessionId,
};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, Capabilities, Grant, Hold, Holder, HolderChanges, LockInfo,
    LostSignal, Wait, Waiter,
};
use crate::error::{Error, Result};
use crate::keeper::{self, Kept, Loss, Renew, Renewed, Term};
use crate::leaked::Leaked;
use crate::lost::LostCause;
use crate::options::ConnectOptions;

const BACKEND: &str = "memory";

/// Tables by name, alive while a client uses them.
type Tables = Mutex<HashMap<String, Weak<TableHandle>>>;

/// The registry of this process's tables ([`Tables`]), made on first use
/// and again after [`forget_tables`]. A [`Leaked`] cell, so that a forked
/// child can start a registry of its own without taking the lock of the
/// parent's, which another thread of the parent may have held at the fork.
static TABLES: Leaked<Tables> = Leaked::new();

/// The registry of tables, made on first use.
fn tables() -> &'static Tables {
    TABLES.get()
}

/// Makes the `memory://` clients connected from now on open new, empty
/// tables, instead of joining the tables of the clients connected before;
/// for [`crate::forget_process_state_after_fork`], which says why. No lock,
/// nothing freed: the earlier tables are forgotten, not dropped.
pub(crate) fn forget_tables() {
    TABLES.forget();
}

/// A backend on an in-process lock table.
pub struct MemoryBackend {
    table: Arc<TableHandle>,
    /// The client's session now (a [`SessionId`]); the keeper moves it on
    /// when the engine ends one the client did not close.
    session: Arc<AtomicU64>,
    /// The keeper of the sessions, one after another.
    heartbeat: tokio::task::JoinHandle<()>,
    /// Set by [`Backend::close`]: later acquires are [`Error::Closed`].
    closed: AtomicBool,
}

/// Keeps a table alive; the last one dropped stops its timer task.
struct TableHandle {
    table: Arc<Table>,
}

impl Drop for TableHandle {
    fn drop(&mut self) {
        self.table.shutdown.cancel();
    }
}

struct Table {
    state: Mutex<State>,
    /// Wakes the timer task when the next deadline moved earlier than the
    /// one it sleeps until.
    changed: Notify,
    /// Wakes election observers after every change of the table.
    observers: tokio::sync::watch::Sender<()>,
    shutdown: CancellationToken,
    origin: Instant,
    system_origin: SystemTime,
}

struct State {
    engine: Engine,
    next_session: u64,
    next_request: u64,
    /// Acquires waiting for their outcome.
    pending: HashMap<(SessionId, RequestId), oneshot::Sender<Outcome>>,
    /// Lost signals of live holds by token (the model layer decides
    /// re-entry: the engine sees one acquire per hold).
    lost: HashMap<u64, Tracked>,
    /// Values published by election holds, by fencing token: the engine
    /// keeps the owner id, and a leader's value can change while it leads.
    published: HashMap<u64, String>,
    /// The deadline the timer task sleeps until (`None`: until woken). A
    /// command that leaves the engine's next deadline at or after it does
    /// not wake the task: most commands (grants and releases without
    /// timers, heartbeats that move an expiry later) would otherwise cost a
    /// runtime worker's wake-up and a turn at the table lock each.
    timers_wake_at: Option<Millis>,
}

/// A live hold's lost signal.
struct Tracked {
    signal: LostSignal,
    session: SessionId,
}

enum Outcome {
    Granted(Vec<u64>, LostSignal),
    WouldBlock,
    TimedOut,
}

impl Table {
    fn now(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }

    /// The engine time `limit` from now, rounded up: [`Table::now`] drops
    /// the fraction of a millisecond, and a wait must never end before
    /// `limit` has passed.
    fn after(&self, limit: Duration) -> Millis {
        let at = self.origin.elapsed() + limit;
        at.as_millis() as Millis + Millis::from(at.subsec_nanos() % 1_000_000 != 0)
    }

    fn wall_clock(&self, at: Millis) -> SystemTime {
        self.system_origin + Duration::from_millis(at)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory table lock poisoned")
    }

    /// Applies a command and delivers its effects, under the table lock.
    fn apply(&self, state: &mut State, command: Command) -> Result<(), EngineError> {
        let mut effects = Vec::new();
        let result = state.engine.apply(self.now(), command, &mut effects);
        for effect in effects {
            state.deliver(effect);
        }
        let next = state.engine.next_deadline();
        if next.is_some_and(|next| state.timers_wake_at.is_none_or(|wake_at| next < wake_at)) {
            // The task records the new deadline when it wakes; a wake-up
            // sent before it waits again is kept by `Notify` as a permit.
            state.timers_wake_at = next;
            self.changed.notify_one();
        }
        self.tell_observers();
        result
    }

    /// Wakes the election observers after a change of the table, if any
    /// observe: an observer subscribes before it reads the table, so one
    /// that subscribed before the change is counted here (the table's lock
    /// orders the two), and one that subscribes after it reads the change.
    /// Nearly every change has nobody observing, and telling a watch costs a
    /// lock and a round of its eight notifiers.
    fn tell_observers(&self) {
        if self.observers.receiver_count() > 0 {
            self.observers.send_replace(());
        }
    }

    /// Opens a new session for a client.
    fn open_session(&self, ttl: Duration, info: ClientInfo) -> Result<SessionId, EngineError> {
        let mut state = self.state();
        let session = SessionId(state.next_session);
        state.next_session += 1;
        let open = Command::OpenSession {
            session,
            ttl: ttl.as_millis() as Millis,
            info,
        };
        self.apply(&mut state, open)?;
        Ok(session)
    }

    /// Keeps the client's sessions, one after another, until aborted (the
    /// client closed or dropped) or the table is gone: when the keeper gives
    /// a session up, the holds it still has are lost with the keeper's
    /// reason, and a new session is opened for the client's next calls.
    ///
    /// Cancel safety: runs as the client's own task; aborting it leaves the
    /// current session to the caller, which closes it.
    async fn keep_sessions(
        table: Weak<Table>,
        current: Arc<AtomicU64>,
        ttl: Duration,
        info: ClientInfo,
    ) {
        let mut opened = Instant::now();
        loop {
            let session = SessionId(current.load(Ordering::Acquire));
            let term = Term::renewed("the memory session", Kept::Session, opened, ttl);
            let renewal = Heartbeat {
                table: table.clone(),
                session,
            };
            let loss = keeper::keep(tokio::sync::watch::Sender::new(term), renewal).await;
            let Some(table) = table.upgrade() else {
                return;
            };
            table.state().session_given_up(session, &loss);
            opened = Instant::now();
            match table.open_session(ttl, info.clone()) {
                Ok(next) => current.store(next.0, Ordering::Release),
                // Session ids are never reused, so this cannot fail; were it
                // to, the client's calls would fail on the ended session.
                Err(error) => {
                    tracing::warn!("memory://: cannot open a new session: {error}");
                    return;
                }
            }
        }
    }

    /// Applies every time-driven command that is due, then sleeps until the next.
    ///
    /// Cancel safety: runs as the table's own task until the table's last
    /// client is gone; aborting it stops expiries and wait timeouts there.
    async fn run_timers(self: Arc<Self>) {
        loop {
            let next = {
                let mut state = self.state();
                for command in state.engine.due(self.now()) {
                    let _ = self.apply(&mut state, command);
                }
                let next = state.engine.next_deadline();
                state.timers_wake_at = next;
                next
            };
            let sleep = async {
                match next {
                    Some(at) => {
                        tokio::time::sleep_until(self.origin + Duration::from_millis(at)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.changed.notified() => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }
}

impl State {
    /// A table nobody has used yet.
    fn empty() -> State {
        State {
            engine: Engine::default(),
            next_session: 1,
            next_request: 1,
            pending: HashMap::new(),
            lost: HashMap::new(),
            published: HashMap::new(),
            timers_wake_at: None,
        }
    }

    fn deliver(&mut self, effect: Effect) {
        let (key, outcome) = match effect {
            Effect::Granted {
                session,
                request,
                tokens,
            } => {
                let signal = LostSignal::new();
                for &token in &tokens {
                    let tracked = Tracked {
                        signal: signal.clone(),
                        session,
                    };
                    self.lost.insert(token, tracked);
                }
                ((session, request), Outcome::Granted(tokens, signal))
            }
            Effect::WouldBlock { session, request } => ((session, request), Outcome::WouldBlock),
            Effect::TimedOut { session, request } => ((session, request), Outcome::TimedOut),
            Effect::Queued { .. } => return,
            Effect::Lost {
                token,
                reason,
                name,
                ..
            } => {
                self.published.remove(&token);
                if let Some(Tracked { signal, .. }) = self.lost.remove(&token) {
                    let cause = match reason {
                        LostReason::SessionExpired => LostCause::SessionExpired,
                        // Only a client closes its own session here (close or
                        // drop), so the session's end is the client's.
                        LostReason::SessionClosed => LostCause::ClientClosed,
                        LostReason::LeaseExpired => LostCause::LeaseExpired,
                        LostReason::ForceReleased => LostCause::ForceReleased,
                    };
                    signal.fire_because(cause, format!("{name}: {reason}"));
                }
                return;
            }
        };
        if let Some(sender) = self.pending.remove(&key) {
            let _ = sender.send(outcome);
        }
    }

    /// Forgets the lost signals of a released hold's `tokens`.
    fn forget(&mut self, tokens: &[u64]) {
        for token in tokens {
            self.lost.remove(token);
        }
    }

    /// The keeper gave `session` up: the holds it still has are lost, for
    /// the keeper's reason. (A session the engine ended has none left: the
    /// engine's own loss effects fired them.) The engine expires it in turn,
    /// as no heartbeat comes any more.
    fn session_given_up(&mut self, session: SessionId, loss: &Loss) {
        self.lost.retain(|_, tracked| {
            if tracked.session != session {
                return true;
            }
            tracked.signal.fire_because(loss.cause, loss.reason.clone());
            false
        });
    }
}

/// The session's renewal, for the keeper: the engine's heartbeat.
struct Heartbeat {
    table: Weak<Table>,
    session: SessionId,
}

#[async_trait]
impl Renew for Heartbeat {
    /// Cancel safety: safe; one step under the table lock, with no await
    /// point.
    async fn renew(&mut self, ttl: Duration) -> std::result::Result<Renewed, String> {
        let Some(table) = self.table.upgrade() else {
            return Ok(Renewed::Gone);
        };
        let mut state = table.state();
        match table.apply(
            &mut state,
            Command::Heartbeat {
                session: self.session,
            },
        ) {
            Ok(()) => Ok(Renewed::For(ttl)),
            // The engine no longer has the session (expired or closed).
            Err(_) => Ok(Renewed::Gone),
        }
    }
}

impl MemoryBackend {
    /// Joins (or creates) the table named by the URL and opens a session on it.
    pub fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let parsed = url::Url::parse(url).map_err(|e| Error::InvalidUrl {
            url: url.into(),
            reason: e.to_string(),
        })?;
        let table_name = format!("{}{}", parsed.host_str().unwrap_or(""), parsed.path());
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument("memory:// needs a tokio runtime for its timers".into())
        })?;
        let table = {
            let mut tables = tables().lock().expect("table registry poisoned");
            tables.retain(|_, weak| weak.strong_count() > 0);
            match tables.get(&table_name).and_then(Weak::upgrade) {
                Some(table) => table,
                None => {
                    let table = Arc::new(Table {
                        state: Mutex::new(State::empty()),
                        changed: Notify::new(),
                        observers: tokio::sync::watch::Sender::new(()),
                        shutdown: CancellationToken::new(),
                        origin: Instant::now(),
                        system_origin: SystemTime::now(),
                    });
                    runtime.spawn(table.clone().run_timers());
                    let handle = Arc::new(TableHandle { table });
                    tables.insert(table_name, Arc::downgrade(&handle));
                    handle
                }
            }
        };
        let info = ClientInfo {
            name: options.client_name.clone(),
            host: options.host.clone(),
        };
        let session = table
            .table
            .open_session(options.session_ttl, info.clone())?;
        let current = Arc::new(AtomicU64::new(session.0));
        let heartbeat = runtime.spawn(Table::keep_sessions(
            Arc::downgrade(&table.table),
            current.clone(),
            options.session_ttl,
            info,
        ));
        Ok(MemoryBackend {
            table,
            session: current,
            heartbeat,
            closed: AtomicBool::new(false),
        })
    }

    /// The client's session now.
    fn session(&self) -> SessionId {
        SessionId(self.session.load(Ordering::Acquire))
    }

    fn table(&self) -> &Arc<Table> {
        &self.table.table
    }

    fn info(&self, info: locksmith_core::LockInfo, state: &State) -> LockInfo {
        let table = self.table();
        let sessions = state.engine.sessions();
        let session_expiry = |id| {
            sessions
                .iter()
                .find(|s| s.session == id)
                .map(|s| s.expires_at)
        };
        LockInfo {
            name: info.name,
            holders: info
                .holders
                .into_iter()
                .map(|h| Holder {
                    owner: state
                        .published
                        .get(&h.fencing_token)
                        .cloned()
                        .unwrap_or(h.owner),
                    lock_by: Some(format!("{}@{}", h.lock_by.name, h.lock_by.host)),
                    lock_time: Some(table.wall_clock(h.lock_time)),
                    fencing_token: Some(h.fencing_token),
                    lease_expires: h
                        .lease_until
                        .or_else(|| session_expiry(h.session))
                        .map(|at| table.wall_clock(at)),
                    mode: h.mode,
                    hold_count: h.hold_count,
                })
                .collect(),
            waiters: info
                .waiters
                .into_iter()
                .map(|w| Waiter {
                    owner: w.owner,
                    mode: w.mode,
                    since: Some(table.wall_clock(w.since)),
                })
                .collect(),
        }
    }
}

impl Drop for MemoryBackend {
    fn drop(&mut self) {
        self.heartbeat.abort();
        let table = self.table();
        let mut state = table.state();
        let session = self.session();
        if state.engine.has_session(session) {
            let _ = table.apply(&mut state, Command::CloseSession { session });
        }
    }
}

/// Cancels a pending acquire when its future is dropped, or releases the grant
/// that raced the drop. Decided under the table lock, so exactly one happens.
struct PendingAcquire<'a> {
    backend: &'a MemoryBackend,
    key: (SessionId, RequestId),
    request: &'a AcquireRequest,
    receiver: Option<oneshot::Receiver<Outcome>>,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        let table = self.backend.table();
        let mut state = table.state();
        if state.pending.remove(&self.key).is_some() {
            let cancel = Command::Cancel {
                session: self.key.0,
                request: self.key.1,
            };
            let _ = table.apply(&mut state, cancel);
        } else if let Ok(Outcome::Granted(tokens, _)) = receiver.try_recv() {
            state.forget(&tokens);
            for (name, token) in self.request.names.iter().zip(tokens) {
                let _ = table.apply(&mut state, release(self.key.0, self.request, name, token));
            }
        }
    }
}

fn release(session: SessionId, request: &AcquireRequest, name: &str, token: u64) -> Command {
    Command::Release {
        session,
        owner: request.owner.clone(),
        name: name.to_owned(),
        token: Some(token),
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo: true,
            lock_delay: true,
            lists_waiters: true,
            shared: true,
            semaphore: true,
            proclaim: true,
            multi_lock: true,
        }
    }

    /// Cancel safety: safe; dropping the future cancels the request in the
    /// engine, or releases a grant that raced the drop, under the table lock
    /// (see `PendingAcquire`); the grant is made after the last await.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let table = self.table();
        let (sender, receiver) = oneshot::channel();
        let key = {
            let mut state = table.state();
            let key = (self.session(), RequestId(state.next_request));
            state.next_request += 1;
            let command = Command::Acquire(Acquire {
                session: key.0,
                request: key.1,
                owner: request.owner.clone(),
                names: request.names.clone(),
                mode: request.mode,
                wait: match request.wait {
                    Wait::No => locksmith_core::Wait::No,
                    Wait::For(limit) => locksmith_core::Wait::Until(table.after(limit)),
                    Wait::Forever => locksmith_core::Wait::Forever,
                },
                lease: request.lease.map(|lease| lease.as_millis() as Millis),
                reentrant: request.reentrant,
                lock_delay: request.lock_delay.as_millis() as Millis,
            });
            state.pending.insert(key, sender);
            if let Err(error) = table.apply(&mut state, command) {
                state.pending.remove(&key);
                return Err(error.into());
            }
            key
        };
        let mut pending = PendingAcquire {
            backend: self,
            key,
            request,
            receiver: Some(receiver),
        };
        let outcome = pending.receiver.as_mut().expect("set above").await;
        pending.receiver = None;
        match outcome.map_err(|_| Error::Closed)? {
            Outcome::Granted(tokens, lost) => {
                if let Some(value) = &request.published {
                    let mut state = table.state();
                    if !lost.is_fired() {
                        state.published.insert(tokens[0], value.clone());
                    }
                }
                Ok(Some(Grant {
                    hold: Box::new(MemoryHold {
                        table: table.clone(),
                        session: key.0,
                        request: request.clone(),
                        tokens: tokens.clone(),
                        recorded: AtomicU32::new(1),
                    }),
                    tokens,
                    lost,
                }))
            }
            Outcome::WouldBlock => Ok(None),
            Outcome::TimedOut => Err(Error::Timeout(match request.wait {
                Wait::For(limit) => limit,
                _ => Duration::ZERO,
            })),
        }
    }

    /// Cancel safety: safe, read-only (no await point).
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let state = self.table().state();
        Ok(state
            .engine
            .describe(name)
            .map(|info| self.info(info, &state)))
    }

    /// Cancel safety: safe, read-only (no await point).
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let state = self.table().state();
        Ok(state
            .engine
            .list(prefix)
            .into_iter()
            .map(|info| self.info(info, &state))
            .collect())
    }

    /// Every change of the table wakes the observers.
    ///
    /// Cancel safety: safe; nothing to undo.
    async fn watch_holders(&self, _name: &str) -> Result<Option<HolderChanges>> {
        let mut changes = self.table().observers.subscribe();
        changes.mark_unchanged();
        let wake_ups = futures::stream::unfold(changes, |mut changes| async move {
            changes.changed().await.ok()?;
            Some((Ok(()), changes))
        });
        Ok(Some(Box::pin(wake_ups)))
    }

    /// Cancel safety: safe; one step under the table lock, with no await
    /// point: it happened or it did not.
    async fn force_release(&self, name: &str) -> Result<()> {
        let table = self.table();
        let mut state = table.state();
        Ok(table.apply(
            &mut state,
            Command::ForceRelease {
                name: name.to_owned(),
            },
        )?)
    }

    /// Cancel safety: safe; one step under the table lock, with no await
    /// point: the session is closed (its holds released) or it is not.
    async fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        self.heartbeat.abort();
        let table = self.table();
        let mut state = table.state();
        let session = self.session();
        if state.engine.has_session(session) {
            table.apply(&mut state, Command::CloseSession { session })?;
        }
        Ok(())
    }
}

struct MemoryHold {
    table: Arc<Table>,
    session: SessionId,
    request: AcquireRequest,
    tokens: Vec<u64>,
    /// The re-entry depth last recorded in the engine.
    recorded: AtomicU32,
}

impl MemoryHold {
    /// Records `count` as the depth of every name of the hold.
    fn set_count(&self, state: &mut State, count: u32) -> Result<()> {
        for (name, &token) in self.request.names.iter().zip(&self.tokens) {
            let set = Command::SetHoldCount {
                session: self.session,
                owner: self.request.owner.clone(),
                name: name.clone(),
                token,
                count,
            };
            self.table.apply(state, set)?;
        }
        self.recorded.store(count, Ordering::Release);
        Ok(())
    }
}

#[async_trait]
impl Hold for MemoryHold {
    /// Ends the hold whatever depth was recorded last: the count goes back
    /// to 1 first, since the engine's release takes off one level.
    ///
    /// Cancel safety: safe; every name is released in one step under the
    /// table lock, with no await point.
    async fn release(self: Box<Self>) -> Result<()> {
        let mut state = self.table.state();
        state.forget(&self.tokens);
        state.published.remove(&self.tokens[0]);
        if self.recorded.load(Ordering::Acquire) != 1 {
            self.set_count(&mut state, 1)?;
        }
        let mut result = Ok(());
        for (name, &token) in self.request.names.iter().zip(&self.tokens) {
            let outcome = self.table.apply(
                &mut state,
                release(self.session, &self.request, name, token),
            );
            if result.is_ok() {
                result = outcome.map_err(Error::from);
            }
        }
        result
    }

    /// Cancel safety: safe; one step under the table lock, with no await
    /// point: the depth was recorded or it was not.
    async fn record_count(&self, count: u32) -> Result<()> {
        let mut state = self.table.state();
        self.set_count(&mut state, count)
    }

    /// Cancel safety: safe; one step under the table lock, with no await
    /// point: the extension happened or it did not.
    async fn extend(&self, lease: Duration) -> Result<()> {
        let mut state = self.table.state();
        for (name, &token) in self.request.names.iter().zip(&self.tokens) {
            let renew = Command::Renew {
                session: self.session,
                owner: self.request.owner.clone(),
                name: name.clone(),
                token: Some(token),
                lease: lease.as_millis() as Millis,
            };
            self.table.apply(&mut state, renew)?;
        }
        Ok(())
    }

    /// Cancel safety: safe; one step under the table lock.
    async fn proclaim(&self, value: &str) -> Result<()> {
        let mut state = self.table.state();
        let published = state
            .published
            .get_mut(&self.tokens[0])
            .ok_or_else(|| Error::NotHeld {
                name: self.request.names[0].clone(),
            })?;
        *published = value.to_owned();
        drop(state);
        self.table.tell_observers();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn connect() -> MemoryBackend {
        let url = format!("memory://{}", uuid::Uuid::new_v4().simple());
        let options = ConnectOptions::default().session_ttl(TTL);
        MemoryBackend::connect(&url, &options).expect("memory backend")
    }

    fn request(name: &str) -> AcquireRequest {
        AcquireRequest {
            wait: Wait::No,
            ..AcquireRequest::new(vec![name.to_owned()], crate::Mode::Exclusive, "owner")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_keeps_an_idle_session_and_its_holds() {
        let backend = connect();
        let grant = backend.acquire(&request("a")).await.unwrap().expect("free");
        tokio::time::sleep(TTL * 20).await;
        assert!(!grant.lost.is_fired(), "{:?}", grant.lost.reason());
        let info = backend.describe("a").await.unwrap().expect("held");
        assert_eq!(info.holders.len(), 1);
        assert!(!backend.heartbeat.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_the_engine_ended_is_followed_by_a_new_one() {
        let backend = connect();
        let grant = backend.acquire(&request("a")).await.unwrap().expect("free");
        let first = backend.session();
        {
            let table = backend.table();
            let mut state = table.state();
            table
                .apply(&mut state, Command::CloseSession { session: first })
                .unwrap();
        }
        // The engine said so itself; the keeper finds it gone at its next
        // renewal, a third of the TTL on, and opens the next session.
        assert_eq!(grant.lost.cause(), Some(LostCause::ClientClosed));
        tokio::time::sleep(TTL / 3).await;
        tokio::task::yield_now().await;
        let second = backend.session();
        assert_ne!(second, first);
        assert!(backend.table().state().engine.has_session(second));
        let again = backend.acquire(&request("a")).await.unwrap().expect("free");
        assert!(again.tokens[0] > grant.tokens[0]);
        // And the new session is kept like the first.
        tokio::time::sleep(TTL * 5).await;
        assert!(!again.lost.is_fired(), "{:?}", again.lost.reason());
        assert!(!backend.heartbeat.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_client_opens_no_new_session() {
        let backend = connect();
        let session = backend.session();
        backend.close().await.unwrap();
        tokio::time::sleep(TTL).await;
        assert_eq!(backend.session(), session);
        assert_eq!(backend.table().state().engine.sessions().len(), 0);
        assert!(matches!(
            backend.acquire(&request("a")).await,
            Err(Error::Closed)
        ));
    }

    /// What a forked child sees: the locks of the registry and of the table
    /// stay held (by threads it lacks), and after the call it connects to a
    /// new, empty table of the same name without touching either lock.
    #[tokio::test(start_paused = true)]
    async fn after_forgetting_the_tables_a_client_opens_a_new_one_without_their_locks() {
        let url = format!("memory://{}", uuid::Uuid::new_v4().simple());
        let options = ConnectOptions::default().session_ttl(TTL);
        let earlier = MemoryBackend::connect(&url, &options).unwrap();
        let held = earlier.acquire(&request("a")).await.unwrap().expect("free");
        let registry = tables().lock().unwrap();
        let table = earlier.table().state();
        forget_tables();
        // On another thread, so that a regression fails the test instead of
        // hanging it: the locks above are held here until the end.
        let (sender, receiver) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            let _entered = runtime.enter();
            let _ = sender.send(MemoryBackend::connect(&url, &options));
        });
        let connected = receiver.recv_timeout(Duration::from_secs(10));
        drop((table, registry));
        let later = connected
            .expect("connected without the earlier tables' locks")
            .unwrap();
        assert!(!Arc::ptr_eq(later.table(), earlier.table()));
        assert!(later.describe("a").await.unwrap().is_none(), "a new table");
        let again = later.acquire(&request("a")).await.unwrap().expect("free");
        // The earlier client keeps its table and its hold.
        let info = earlier.describe("a").await.unwrap().expect("held");
        assert_eq!(info.holders.len(), 1);
        assert_eq!(info.holders[0].fencing_token, Some(held.tokens[0]));
        assert!(!held.lost.is_fired() && !again.lost.is_fired());
    }

    #[test]
    fn the_keepers_loss_fires_the_holds_the_session_still_has() {
        let mut state = State::empty();
        let (mine, theirs) = (LostSignal::new(), LostSignal::new());
        for (token, signal, session) in [(1, &mine, 1), (2, &theirs, 2)] {
            let tracked = Tracked {
                signal: signal.clone(),
                session: SessionId(session),
            };
            state.lost.insert(token, tracked);
        }
        let loss = Loss {
            cause: LostCause::ConnectionLost,
            reason: "the memory session: could not be renewed".into(),
        };
        state.session_given_up(SessionId(1), &loss);
        assert_eq!(mine.cause(), Some(LostCause::ConnectionLost));
        assert!(!theirs.is_fired());
        assert_eq!(state.lost.len(), 1);
    }
}
